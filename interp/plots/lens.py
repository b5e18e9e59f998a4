"""The verdict-lens figures, drawn from ``DIR/lens/summary.json`` (never live models)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from interp.plots.common import COLORS, footnote, plt, save

__all__ = ["plot_lens"]

_TASKS = (("judge", "judge: log P(Correct) - log P(Incorrect)", COLORS["eval"]),
          ("judge_first", "judge, first tokens: logit(C) - logit(In)", "#8172B3"),
          ("gen", "generator: gold first token - best other", COLORS["gen"]))
_STYLES = {"logit": ("-", "o", "logit lens"), "tuned": ("--", "s", "tuned lens")}


def _line(ax: Any, stats: list[Mapping[str, Any]], color: str, style: str, marker: str,
          label: str) -> None:
    x = np.arange(len(stats))
    y = np.array([s["mean"] if s.get("mean") is not None else np.nan for s in stats])
    lo = np.array([(s.get("ci") or [np.nan, np.nan])[0] for s in stats], dtype=float)
    hi = np.array([(s.get("ci") or [np.nan, np.nan])[1] for s in stats], dtype=float)
    ax.plot(x, y, linestyle=style, marker=marker, markersize=3, color=color, label=label)
    ax.fill_between(x, lo, hi, color=color, alpha=0.15, linewidth=0)


def _layer_ticks(ax: Any, n: int) -> None:
    step = max(1, n // 8)
    ticks = list(range(0, n + 1, step))
    if n not in ticks:
        ticks.append(n)
    ax.set_xticks(ticks)
    ax.set_xticklabels(["emb" if t == 0 else str(t - 1) for t in ticks])
    ax.set_xlabel("layer read (emb = embeddings; L = after block L)")


def plot_lens(summary: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """``lens_layers.png`` (curves per layer) and ``lens_attribution.png`` (heads and MLPs).

    ``lens_layers``: top, the mean lens logit difference per layer (nats; judge whole replies,
    judge first tokens and generator,
    logit lens solid and tuned lens dashed, 95% passage-cluster bands); bottom, the share of
    records whose reading at that layer has the sign of the last layer's (agreement with the
    final verdict). ``lens_attribution``: mean direct logit attribution of the judge's
    first-token logit difference to each head of the band (heat map) and each MLP (column).

    Returns:
        The PNG paths written.
    """
    n = int(summary["n_layers"])
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(11, 6.2), sharex=True)
    notes = []
    for task, label, color in _TASKS:
        for lens, cur in (summary.get(task) or {}).items():
            style, marker, name = _STYLES[lens]
            _line(a1, cur["logit_diff"], color, style, marker, f"{label} ({name})")
            first = cur["first_agreeing_layer"]
            _line(a2, cur["agreement"], color, style, marker,
                  f"{task} {name}: agrees from layer index {first['mean']:.1f} on average")
            share = cur["final_positive_share"]
            who, yes, no = (("the generator's gold token", "beats", "loses to")
                            if task == "gen" else ("the judge's final verdict", "is Correct",
                                                   "is Incorrect"))
            note = (f"{who} {yes if share >= 0.5 else no}"
                    f"{' the best other token' if task == 'gen' else ''} on "
                    f"{max(share, 1 - share):.0%} of {cur['n']} records: agreement with the "
                    f"final sign is about (nearly) one class")
            if task != "judge_first" and max(share, 1 - share) >= 0.95 and note not in notes:
                notes.append(note)
    whole, first = summary.get("judge") or {}, summary.get("judge_first") or {}
    if whole and all(lens in first and [x["mean"] for x in cur["logit_diff"]]
                     == [x["mean"] for x in first[lens]["logit_diff"]]
                     for lens, cur in whole.items()):
        notes.append("the judge's whole-reply curves lie under its first-token ones: both "
                     "replies are one token for this tokenizer")
    a1.axhline(0, color="grey", linewidth=0.6)
    a1.set_ylabel("lens logit difference (nats)")
    a1.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    a1.set_title(f"{summary.get('model')}: where the verdict becomes readable "
                 f"({summary.get('n_records')} records, {summary.get('n_passages')} passages)",
                 fontsize=9)
    a2.set_ylim(-0.02, 1.02)
    a2.set_ylabel("share with the final sign")
    a2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _layer_ticks(a2, n)
    if summary.get("note"):
        notes.append(summary["note"])
    footnote(fig, notes)
    paths = [save(fig, out_dir, "lens_layers")]
    a = summary.get("attribution") or {}
    if a.get("heads_mean"):
        band = list(summary["band"])
        h = np.array(a["heads_mean"], dtype=float)[band]
        m = np.array(a["mlp_mean"], dtype=float)[band]
        lim = float(max(np.abs(h).max(), np.abs(m).max(), 1e-9))
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(7.5, 3.8),
                                     gridspec_kw={"width_ratios": [h.shape[1], 1.6]})
        im = ax.imshow(h, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        ax.set_yticks(range(len(band)))
        ax.set_yticklabels([str(b) for b in band])
        ax.set_xticks(range(h.shape[1]))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title("heads (mean, nats)", fontsize=9)
        bx.imshow(m[:, None], cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        bx.set_yticks([])
        bx.set_xticks([0])
        bx.set_xticklabels(["MLP"])
        fig.colorbar(im, ax=[ax, bx], shrink=0.8, label="attribution to logit(C) - logit(In)")
        tot = a.get("total") or {}
        fig.suptitle(f"{summary.get('model')}: direct logit attribution of the verdict's first "
                     f"token (total {tot.get('mean', float('nan')):+.2f} nats, n "
                     f"{summary.get('n_records')})", fontsize=9)
        paths.append(save(fig, out_dir, "lens_attribution"))
    return paths
