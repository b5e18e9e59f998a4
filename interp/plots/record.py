"""Figures of ``interp record`` (full patterns), drawn from its stored tables.

Kept apart from :mod:`interp.plots` (near 600 lines); the same conventions: a ``plot_*``
function takes the parsed table and an output folder, writes ``NAME.png`` and ``NAME.pdf``
(:func:`interp.plots.common.save`) and returns the PNG path.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from interp.plots.common import plt, save

__all__ = ["plot_span_to_span"]


def plot_span_to_span(summary: Mapping[str, Any], out_dir: str | Path,
                      name: str = "record_span_to_span", dataset: str | None = None) -> Path:
    """Gen and eval span-to-span block matrices of the band, side by side, one colour scale.

    Cell (i, j) is the mean attention mass query span i puts on key span j
    (:func:`interp.analysis.span_mass.summarize_span_to_span`); rows sum to 1; a span no
    prompt has (``candidate`` in gen: its row and its column) is grey and marked ``n/a``,
    told apart from a measured 0.00.

    Args:
        summary: ``record/span_to_span.json``.
        out_dir: output folder.
        name: file stem.
        dataset: one dataset (default: all records).
    """
    g = summary["overall"] if dataset is None else summary["per_dataset"][dataset]
    qs, ks, band = summary["query_spans"], summary["key_spans"], summary["band"]
    mats = {t: np.array([[np.nan if v is None else v for v in row] for row in g[t]["mean"]],
                        dtype=float) for t in ("gen", "eval")}
    for m in mats.values():   # summaries written before the column was stored as None
        for j, k in enumerate(ks):
            if k in qs and np.isnan(m[qs.index(k)]).all() and not np.nansum(m[:, j]):
                m[:, j] = np.nan
    fig, axes = plt.subplots(1, 2, figsize=(3.2 + 1.5 * len(ks) * 2, 1.6 + 0.55 * len(qs)),
                             sharey=True)
    cmap = plt.get_cmap("viridis").with_extremes(bad="#dddddd")
    im = None
    for ax, (task, m) in zip(axes, mats.items()):
        im = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, vmin=0, vmax=1, aspect="auto")
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                v = m[i, j]
                ax.text(j, i, "n/a" if np.isnan(v) else f"{v:.2f}", ha="center", va="center",
                        fontsize=8, color="black" if np.isnan(v) or v > 0.6 else "white")
        ax.set_xticks(range(len(ks)), ks, rotation=30, ha="right")
        ax.set_yticks(range(len(qs)), qs)
        ax.set_xlabel("key span (attended to)")
        ax.set_title(f"{task} prompt", fontsize=10)
    axes[0].set_ylabel("query span (attending)")
    cb = fig.colorbar(im, ax=list(axes), fraction=0.035, pad=0.02)
    cb.set_label("attention mass (mean over band layers, heads, records)")
    lo, hi = band[0], band[-1]
    fig.suptitle(f"Span-to-span attention, layers {lo}-{hi}, all heads "
                 f"({dataset or 'all datasets'}: n={g['n']} records, {g['n_passages']} "
                 f"passages; 'last' = the last position)", fontsize=10)
    return save(fig, out_dir, name)
