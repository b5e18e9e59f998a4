"""The Study 1 figure (GA, EA, Delta and the verdict split), drawn from ``metrics.json``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from interp.analysis.stats import degenerate_note
from interp.plots.common import COLORS, ci_bars, dataset_groups, passage_footnote, plt, save

_VERDICT_COLORS = {"accept": "#55A868", "reject": "#C44E52", "none": "0.75"}


def _verdict_split_panel(ax: Any, groups: list[tuple[str, Any]], labels: list[str]) -> None:
    """Stacked shares accept / reject / none of generated verdicts per group and y*."""
    x, w = np.arange(len(groups)), 0.38
    for j, (lab, short) in enumerate((("correct", "y*=C"), ("incorrect", "y*=I"))):
        counts = [m["verdicts_by_label"][lab] for _, m in groups]
        tot = np.array([sum(c.values()) for c in counts], float)
        bottom = np.zeros(len(groups))
        for cls in ("accept", "reject", "none"):
            share = np.array([c[cls] for c in counts]) / np.maximum(tot, 1)
            ax.bar(x + (j - 0.5) * w, share, w, bottom=bottom, color=_VERDICT_COLORS[cls],
                   edgecolor="white", label=f"generated: {cls}" if j == 0 else None)
            bottom += share
        forced = [m.get(f"acceptance_rate_{lab}_forced") for _, m in groups]
        ax.plot(x + (j - 0.5) * w, [np.nan if f is None else f for f in forced], "kD", ms=5,
                label="forced choice: accept" if j == 0 else None)
        for xi, t in zip(x + (j - 0.5) * w, tot):
            ax.text(xi, 1.02, f"{short}\n{int(t)}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, labels)
    ax.set_ylim(0, 1.25)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel("share of answers")
    ax.set_title("Generated verdicts by oracle label", fontsize=10)
    ax.legend(frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.17),
              ncol=2)


def plot_asymmetry(metrics: Mapping[str, Any], out_dir: str | Path,
                   name: str = "asymmetry") -> Path:
    """GA, EA, EA_forced; Delta and Delta_forced; the 3-way split of generated verdicts.

    Panel 1: GA, EA (generated verdict, no verdict = wrong) and EA_forced (p_correct > 0.5)
    with 95% CIs (bootstrap over passages), and beside them the judge's base-rate-free
    numbers, whose chance level (0.5) is dotted: balanced accuracy and the AUC of
    ``logit_diff`` on its own answers, and, when the run holds the balanced judge set
    (``metrics["balanced"]``, :mod:`interp.methods.balanced`), the same on the gold answers
    against wrong ones. Panel 2: Delta = EA - GA and Delta_forced, on an
    axis fitted to the values and CIs. Panel 3: per group, answers with y* Correct and y*
    Incorrect, stacked shares of generated verdicts accept / reject / none, and the
    forced-choice acceptance as a diamond. Panel 1 spans the top row, panels 2 and 3 share
    the bottom one. Each bar is marked at its value and labelled beside its whisker
    (:func:`interp.plots.common.ci_bars`; a zero-width interval is marked and explained under
    the figure). Tick labels give n and the passages; groups on fewer than 10 passages are
    starred and explained under the figure.

    Args:
        metrics: the content of ``metrics.json`` (:func:`interp.methods.asymmetry.compute_metrics`).
        out_dir: output folder.
        name: file stem.
    """
    groups, labels = dataset_groups(metrics)
    x = np.arange(len(groups))
    bal = (metrics.get("balanced") or {})
    sets = {**(bal.get("per_dataset") or {}), "overall": bal.get("overall") or {}}
    free = [{**m, **{f"set_{k}": v for k, v in (sets.get(d) or {}).items()}} for d, m in groups]
    free_keys = ("balanced_accuracy", "auc_logit_diff") + (
        ("set_balanced_accuracy", "set_auc_logit_diff") if bal else ())
    fig = plt.figure(figsize=(max(10.0, 1.7 * len(groups) + 3.5), 11.6))
    grid = fig.add_gridspec(3, 2, height_ratios=[1, 1, 1.1])
    axes = [fig.add_subplot(grid[0, :]), fig.add_subplot(grid[2, 0]),
            fig.add_subplot(grid[2, 1]), fig.add_subplot(grid[1, :])]
    degenerate = False
    for ax, keys, rows in ((axes[0], ("GA", "EA", "EA_forced"), [m for _, m in groups]),
                           (axes[1], ("delta", "delta_forced"), [m for _, m in groups]),
                           (axes[3], free_keys, free)):
        w = 0.8 / len(keys) if len(keys) > 2 else 0.38
        for j, key in enumerate(keys):
            degenerate |= ci_bars(
                ax, x + (j - (len(keys) - 1) / 2) * w, [m.get(key) for m in rows],
                [m.get(f"{key}_ci") for m in rows], w,
                color=COLORS.get(key, _BASE_RATE_FREE.get(key, "#8172B3")),
                label=_ASYM_LABELS[key], alpha=0.6 if key == "delta_forced" else 1.0)
        ax.set_xticks(x, labels, fontsize=8)
    axes[0].legend(frameon=False, fontsize=8, ncol=3, loc="upper center")
    axes[0].set_ylim(-0.03, 1.15)
    axes[0].set_ylabel("accuracy")
    axes[0].set_title("Generation (GA) vs self-evaluation (EA); number: the bar's value",
                      fontsize=10)
    axes[3].axhline(0.5, color="0.3", lw=0.8, ls=":")
    axes[3].legend(frameon=False, fontsize=7, ncol=2, loc="upper center")
    axes[3].set_ylim(-0.03, 1.3)
    axes[3].set_ylabel("0.5: chance")
    axes[3].set_title("Does the judge tell right from wrong? Balanced accuracy and AUC, free of "
                      "the base rate (dotted: a judge that ignores correctness)", fontsize=10)
    for i, m in enumerate(free):   # a group of one label: no ranking to measure, said so
        if all(m.get(k) is None for k in free_keys):
            axes[3].text(x[i], 0.75, "undefined:\nright and wrong\nanswers needed", ha="center",
                         va="center", fontsize=7, color="0.35")
    ends = [abs(v) for _, m in groups for k in ("delta", "delta_forced")
            for v in [m[k], *(m.get(f"{k}_ci") or [])] if v is not None]
    lim = max(0.1, 1.15 * max(ends, default=0.0))
    axes[1].set_ylim(-lim, 1.25 * lim)
    axes[1].axhline(0, color="black", lw=0.8)
    axes[1].set_ylabel("EA − GA")
    axes[1].set_title("Asymmetry Δ", fontsize=10)
    axes[1].legend(frameon=False, fontsize=7, ncol=2, loc="upper center")
    _verdict_split_panel(axes[2], groups, labels)
    axes[2].tick_params(axis="x", labelsize=7)
    fig.suptitle(f"Task asymmetry — {', '.join(metrics.get('models', []))} (CIs: bootstrap "
                 f"over passages)", fontsize=10)
    fig.tight_layout()
    passage_footnote(fig, groups, [degenerate_note()] if degenerate else [])
    return save(fig, out_dir, name)


_BASE_RATE_FREE = {"balanced_accuracy": "#937860", "auc_logit_diff": "#DA8BC3",
                   "set_balanced_accuracy": "#8C8C8C", "set_auc_logit_diff": "#CCB974"}
_ASYM_LABELS = {"GA": "GA", "EA": "EA (generated verdict)", "EA_forced": "EA forced choice",
                "balanced_accuracy": "balanced accuracy, own answers",
                "auc_logit_diff": "AUC of logit_diff, own answers",
                "set_balanced_accuracy": "balanced accuracy, gold vs wrong set",
                "set_auc_logit_diff": "AUC, gold vs wrong set",
                "delta": "Δ = EA − GA", "delta_forced": "Δ forced = EA_forced − GA"}

