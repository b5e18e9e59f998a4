"""The pairwise-judge figures, drawn from ``DIR/pairwise/summary.json`` (never live models)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from interp.analysis.stats import degenerate_note
from interp.methods.pairwise import MIN_SWAP_NATS
from interp.plots.common import COLORS, ci_bars, footnote, plt, save

__all__ = ["plot_pairwise"]

_BARS = (("accurate", "accuracy (both orders right)", COLORS["correct"]),
         ("consistent", "position consistency", "#4C72B0"),
         ("flip_first", "flips to first (A, A)", "#DD8452"),
         ("flip_second", "flips to second (B, B)", "#8172B3"))


def _curve(ax: Any, stats: list[Mapping[str, Any]], color: str, label: str,
           style: str = "-") -> None:
    x = np.arange(len(stats))
    y = np.array([s["mean"] if s.get("mean") is not None else np.nan for s in stats])
    lo = np.array([(s.get("ci") or [np.nan, np.nan])[0] for s in stats], dtype=float)
    hi = np.array([(s.get("ci") or [np.nan, np.nan])[1] for s in stats], dtype=float)
    ax.plot(x, y, style, marker="o", markersize=3, color=color, label=label)
    ax.fill_between(x, lo, hi, color=color, alpha=0.15, linewidth=0)


def _heat(ax: Any, m: np.ndarray, band: list[int], title: str, label: str, fig: Any,
          mlp: bool = False) -> None:
    """A band x head heat map; with ``mlp`` its last column is each layer's MLP."""
    lim = float(max(np.nanmax(np.abs(m)), 1e-9))
    im = ax.imshow(m, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_yticks(range(len(band)))
    ax.set_yticklabels([str(b) for b in band])
    ax.set_xticks(range(m.shape[1]))
    if mlp:
        ax.set_xticklabels([str(j) for j in range(m.shape[1] - 1)] + ["MLP"])
        ax.axvline(m.shape[1] - 1.5, color="black", linewidth=0.8)
    ax.set_xlabel("head" + (" (last column: the layer's MLP)" if mlp else ""))
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=8.5)
    fig.colorbar(im, ax=ax, shrink=0.8, label=label)


def plot_pairwise(summary: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """``pairwise_orders.png`` and ``pairwise_heads.png``.

    ``pairwise_orders``: left, per dataset and over all, accuracy (an inconsistent pair a
    miss), position consistency and the flips towards each position, with 95% passage-cluster
    intervals; right, the logit lens of the content and position terms per layer (nats).
    ``pairwise_heads``: over the band, each head's share of the swap's change in the letter
    score when its verdict-position output alone is patched from the swapped order (left), and
    each head's mean position term by direct logit attribution (right).

    Returns:
        The PNG paths written.
    """
    out = summary.get("outcomes") or {}
    keys = [k for k in out if not k.startswith("source:") and k != "all"] + ["all"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8 + 1.3 * len(keys), 4.4),
                                 gridspec_kw={"width_ratios": [0.6 * len(keys), 2.6]})
    w = 0.8 / len(_BARS)
    degenerate = False
    for j, (k, label, color) in enumerate(_BARS):
        xs = np.arange(len(keys)) + (j - (len(_BARS) - 1) / 2) * w
        degenerate |= ci_bars(a1, xs, [out[d][k]["mean"] for d in keys],
                              [out[d][k]["ci"] for d in keys], w, color=color, label=label,
                              upright=True)
    a1.set_xticks(np.arange(len(keys)))
    a1.set_xticklabels([f"{d}\nn={out[d]['n']}\n{out[d]['n_passages']} passages"
                        for d in keys], fontsize=7.5)
    a1.set_ylim(0, 1.62)   # the legend sits above the highest bar (1.0) and its label
    a1.set_yticks(np.linspace(0, 1, 6))
    a1.set_ylabel("share of pairs")
    a1.legend(fontsize=7, loc="upper center", ncol=2, frameon=False, borderaxespad=0.2)
    a1.set_title(f"{summary.get('model')}: pairwise judge, each pair in both orders",
                 fontsize=9)
    lens = summary.get("lens") or {}
    if lens:
        _curve(a2, lens["content"], COLORS["correct"], "content (s1 - s2)/2")
        _curve(a2, lens["position"], "#DD8452", "position (s1 + s2)/2")
        a2.axhline(0, color="grey", linewidth=0.6)
        n = len(lens["content"]) - 1
        step = max(1, n // 6)
        ticks = sorted(set(range(0, n + 1, step)) | {n})
        a2.set_xticks(ticks)
        a2.set_xticklabels(["emb" if t == 0 else str(t - 1) for t in ticks])
        a2.set_xlabel("layer read by the logit lens")
        a2.set_ylabel("nats")
        a2.legend(fontsize=7)
        a2.set_title("letter score log P(A) - log P(B), split into two terms", fontsize=9)
    notes = [degenerate_note()] if degenerate else []
    if ol := summary.get("one_letter"):
        notes.append(f"a one-letter judge: it answers {ol['letter']} in both orders on "
                     f"{ol['share']:.0%} of pairs, so consistency and accuracy count the other "
                     f"pairs, not how well it reads the answers")
    if summary.get("note"):
        notes.append(summary["note"])
    footnote(fig, notes)
    paths = [save(fig, out_dir, "pairwise_orders")]
    band = list(summary["band"])
    patch = np.array(summary["patching"]["heads"], dtype=float)   # already the band's layers
    pos = np.array(summary["position"]["heads_mean"], dtype=float)[band]
    mlp = summary["position"].get("mlp_mean")
    if mlp is not None:
        pos = np.concatenate([pos, np.array(mlp, dtype=float)[band][:, None]], axis=1)
    # room between the panels for the first colorbar's label and the second's layer axis
    fig, (b1, b2) = plt.subplots(1, 2, figsize=(12, 4.0), gridspec_kw={"wspace": 0.45})
    _heat(b1, patch, band, "activation patching of the order (verdict position, one head)",
          "share of the swap's change", fig)
    _heat(b2, pos, band, "position term by direct logit attribution", "nats (> 0: towards A)",
          fig, mlp=mlp is not None)
    h = summary.get("held_out") or {}
    heads = ", ".join(f"{u['unit']}" for u in h.get("order_heads") or [])
    pu = (h.get("position_units") or {}).get("units") or []
    fig.suptitle(f"{summary.get('model')}: which heads carry the order ({summary['n_pairs']} "
                 f"pairs, {summary['n_passages']} passages)", fontsize=9)
    notes = [f"chosen on selection passages: order heads {heads or '-'}; position-term units "
             f"{', '.join(pu) or '-'} (tested on the other passages: summary.json held_out)"]
    gap = (summary["patching"].get("gap") or {}).get("mean")
    if gap is not None and abs(gap) < MIN_SWAP_NATS:
        notes.append(f"the swap changes the letter score by {gap:+.2f} nats on average: the "
                     f"patching shares (left) are shares of that small change")
    footnote(fig, notes)
    paths.append(save(fig, out_dir, "pairwise_heads"))
    return paths
