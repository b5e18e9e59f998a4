"""The Study 2 attention figures, drawn from ``DIR/attention/summary.json``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from interp.analysis.stats import degenerate_note
from interp.core.names import in_dataset_order
from interp.plots.common import COLORS, ci_bars, dataset_groups, passage_footnote, plt, save

_SPAN_TITLES = {"context": "context c", "question": "question q", "candidate": "candidate a",
                "template": "template (rest)", "reference": "reference"}


def plot_span_mass_layerwise(summary: Mapping[str, Any], out_dir: str | Path,
                             name: str = "attention_layerwise") -> Path:
    """Layerwise last-token span mass, gen vs eval, one panel per span, one row per dataset.

    Lines are means over heads and records; bands are bootstrap 95% CIs over passages; the
    grey area is the summary's layer band (paper: the last eight layers).

    Args:
        summary: ``attention/summary.json`` (:func:`interp.analysis.span_mass.summarize`).
        out_dir: output folder.
        name: file stem.
    """
    groups = [(d, g) for d, g in in_dataset_order(summary["per_dataset"]) if g.get("layerwise")]
    if len(groups) > 1:
        groups.append(("overall", summary["overall"]))
    spans = [s for s in summary["spans"] if s != "reference"] + (
        ["reference"] if "reference" in summary["spans"] else [])
    band = summary["band"]
    fig, axes = plt.subplots(len(groups), len(spans), figsize=(3.1 * len(spans),
                                                                2.3 * len(groups) + 0.6),
                             squeeze=False, sharex=True)
    for i, (ds, g) in enumerate(groups):
        for j, s in enumerate(spans):
            ax = axes[i, j]
            ax.axvspan(band[0] - 0.5, band[-1] + 0.5, color="0.9", zorder=0)
            for t in ("gen", "eval"):
                lw = g["layerwise"][t].get(s)
                if lw is None or (t == "gen" and s == "candidate"):
                    continue
                x = np.arange(len(lw["mean"]))
                ax.plot(x, lw["mean"], color=COLORS[t], lw=1.4, label=t)
                ax.fill_between(x, lw["lo"], lw["hi"], color=COLORS[t], alpha=0.25, lw=0)
            ax.set_ylim(0, None)
            if i == 0:
                ax.set_title(_SPAN_TITLES.get(s, s), fontsize=10)
            if j == 0:
                ax.set_ylabel(f"{ds} (n={g['n']}, {g.get('n_passages', '?')} passages"
                              f"{'*' * bool(g.get('few_passages'))})\nmass", fontsize=9)
            if i == len(groups) - 1:
                ax.set_xlabel("layer")
    axes[0, 0].legend(frameon=False, fontsize=8)
    fig.suptitle(f"Last-token attention mass per span ({summary.get('model') or ''}; shaded: "
                 f"band {band[0]}-{band[-1]}; bands: bootstrap over passages)", fontsize=11)
    fig.tight_layout()
    passage_footnote(fig, groups)
    return save(fig, out_dir, name)


def plot_head_context_heatmaps(summary: Mapping[str, Any], out_dir: str | Path,
                               name: str = "attention_heads_context",
                               dataset: str | None = None) -> Path:
    """Layer x head heatmaps of last-token context mass: gen, eval and gen minus eval.

    Args:
        summary: ``attention/summary.json``.
        out_dir: output folder.
        name: file stem.
        dataset: one dataset (default: all records).
    """
    g = summary["overall"] if dataset is None else summary["per_dataset"][dataset]
    gen = np.asarray(g["head_context"]["gen"])
    ev = np.asarray(g["head_context"]["eval"])
    diff = gen - ev
    band = summary["band"]
    fig, axes = plt.subplots(1, 3, figsize=(4 + 0.45 * gen.shape[1] * 3,
                                            max(3.2, 1.2 + 0.2 * gen.shape[0])))
    vmax = float(max(gen.max(), ev.max()))
    lim = float(np.abs(diff).max()) or 1.0
    for ax, arr, title, kw in ((axes[0], gen, "gen", {"cmap": "viridis", "vmin": 0,
                                                      "vmax": vmax}),
                               (axes[1], ev, "eval", {"cmap": "viridis", "vmin": 0,
                                                      "vmax": vmax}),
                               (axes[2], diff, "gen − eval", {"cmap": "RdBu_r", "vmin": -lim,
                                                             "vmax": lim})):
        im = ax.imshow(arr, aspect="auto", origin="lower", interpolation="nearest", **kw)
        ax.axhline(band[0] - 0.5, color="white" if title != "gen − eval" else "black",
                   lw=0.8, ls="--")
        ax.set_title(f"context mass, {title}", fontsize=10)
        ax.set_xlabel("head")
        ax.set_xticks(range(arr.shape[1]))
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03,
                     label="gen − eval" if title == "gen − eval" else "mean context mass")
    axes[0].set_ylabel("layer")
    fig.suptitle(f"Per-head last-token context mass ({dataset or 'all datasets'}, "
                 f"n={g['n']}, {g.get('n_passages', '?')} passages; dashed: band start)",
                 fontsize=11)
    fig.tight_layout()
    passage_footnote(fig, [(dataset or "all datasets", g)])
    return save(fig, out_dir, name)


def plot_context_ratio(summary: Mapping[str, Any], out_dir: str | Path,
                       name: str = "attention_context_ratio") -> Path:
    """Per dataset: band context mass gen vs eval, candidate mass (eval), and three ratios.

    Right panel, gen/eval with cluster-bootstrap CIs, beside the paper's 3-5x band: the ratio
    of band means, the geometric mean of per-record ratios, the ratio of the context shares of
    the content spans (context / (context + question + candidate)), which discounts mass
    moved onto the template, and of context / (context + question), the spans both prompts
    have (a summary made before it existed draws the first three).

    Args:
        summary: ``attention/summary.json``.
        out_dir: output folder.
        name: file stem.
    """
    groups, labels = dataset_groups(summary)
    x = np.arange(len(groups))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8, 2.4 * len(groups) + 3), 4))
    w = 0.27
    bars = (("gen", "context", "context, gen"), ("eval", "context", "context, eval"),
            ("eval", "candidate", "candidate, eval"))
    degenerate = False
    for j, (t, s, lab) in enumerate(bars):
        degenerate |= ci_bars(ax1, x + (j - 1) * w, [g[t][s]["mean"] for _, g in groups],
                              [g[t][s]["ci"] for _, g in groups], w, label=lab,
                              color=COLORS[t] if s == "context" else "#8172B3")
    ax1.set_xticks(x, labels)
    ax1.set_ylabel("band-mean attention mass")
    band = summary["band"]
    ax1.set_title(f"Last-token mass, layers {band[0]}-{band[-1]}, all heads", fontsize=10)
    ax1.set_ylim(0, 1.3 * ax1.get_ylim()[1])
    ax1.legend(frameon=True, fontsize=8, ncol=3, loc="upper center")
    ratios = [(k, lab) for k, lab in (
        ("context_ratio", "context mass (ratio of means)"),
        ("context_ratio_geometric", "context mass (geometric mean of ratios)"),
        ("content_context_share_ratio", "share of context+question+candidate"),
        ("context_question_share_ratio", "share of context+question"))
        if any(g.get(k) is not None for _, g in groups)]
    w2 = 0.8 / len(ratios)
    for j, (key, lab) in enumerate(ratios):
        degenerate |= ci_bars(ax2, x + (j - (len(ratios) - 1) / 2) * w2,
                              [g.get(key) for _, g in groups],
                              [g.get(f"{key}_ci") for _, g in groups], w2, label=lab,
                              color=("#55A868", "#8172B3", "#937860", "#DA8BC3")[j])
    ax2.axhspan(3, 5, color="0.9", zorder=0, label="the paper's 3-5x")
    ax2.axhline(1, color="black", lw=0.8)
    ax2.set_xticks(x, labels)
    ax2.set_ylabel("gen / eval")
    ax2.set_title("Context ratio gen/eval (paper: 3-5x)", fontsize=10)
    fig.tight_layout()
    # the legend goes under the tick labels, so it covers neither the bars, the frame nor
    # the paper's band
    below = ax2.transAxes.inverted().transform(
        (0, ax2.get_tightbbox(fig.canvas.get_renderer()).y0))[1]
    ax2.legend(frameon=False, fontsize=7, ncol=2, loc="upper center",
               bbox_to_anchor=(0.5, below - 0.02))
    passage_footnote(fig, groups, [degenerate_note()] if degenerate else [])
    return save(fig, out_dir, name)
