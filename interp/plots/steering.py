"""The steering figure, drawn from ``DIR/steering/summary.json`` (never live models)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from interp.analysis.stats import DEGENERATE_MARK, degenerate_note, is_degenerate, passage_note
from interp.plots.common import COLORS, footnote, plt, save

__all__ = ["JUDGE_SERIES", "judge_panel", "plot_steering"]

JUDGE_SERIES = (
    ("ea_forced", "EA (forced choice)", COLORS["EA"], "o", "-", 8, None),
    ("accept_correct", "acceptance | oracle Correct", COLORS["correct"], "s", "--", 6,
     "no oracle-correct record"),
    ("accept_incorrect", "acceptance | oracle Incorrect", COLORS["incorrect"], "^", ":", 5,
     "no oracle-incorrect record"),
)
"""The judge panel's lines: ``(key, label, colour, marker, linestyle, marker size, what an
empty group lacks)``. Each line has its own marker, line style and size (largest drawn
first) and a small shift on the alpha axis, so two lines with the same values both show."""


def _series(summary: Mapping[str, Any], task: str, key: str
            ) -> tuple[list[float], np.ndarray, np.ndarray, list[float]]:
    """Alphas, means and ``[2, n]`` error bars (overall) of one statistic.

    Also the alphas whose interval has zero width or is missing (a point without a whisker).
    """
    xs, ys, lo, hi, bare = [], [], [], [], []
    for a, groups in (summary.get(task) or {}).items():
        st = groups.get("overall", {}).get(key) or {}
        if st.get("mean") is None:
            continue
        xs.append(float(a))
        ys.append(st["mean"])
        ci = st.get("ci") or [st["mean"], st["mean"]]
        lo.append(max(st["mean"] - ci[0], 0.0))
        hi.append(max(ci[1] - st["mean"], 0.0))
        if is_degenerate(ci):
            bare.append(float(a))
    return xs, np.array(ys), np.array([lo, hi]), bare


def _bare_label(label: str, bare: list[float], xs: list[float]) -> str:
    """``label``, with which alphas have a zero-width (or no) interval, if any."""
    if not bare:
        return label
    where = "every alpha" if len(bare) == len(xs) else "alpha " + ", ".join(
        f"{a:g}" for a in bare)
    return f"{label} — CI {DEGENERATE_MARK} at {where}"


def judge_panel(ax: Any, summary: Mapping[str, Any],
                title: str = "judge (verdict position steered)") -> list[str]:
    """Draw the judge's lines (:data:`JUDGE_SERIES`) on ``ax``; return the legend labels.

    A line whose group is empty at every alpha (e.g. acceptance on oracle-correct answers
    when no steered record is oracle-correct) is not drawn; its legend entry says why
    (``acceptance | oracle Correct: no oracle-correct record``). A line with points whose
    interval has zero width (or none: one record) says at which alphas
    (``... — CI (zero width) at alpha 0.5, 2``): those points have no whisker. ``summary``
    is a steering summary (its ``eval`` part is drawn) or its ``control`` part.
    """
    labels = []
    for i, (key, lab, col, marker, ls, ms, empty) in enumerate(JUDGE_SERIES):
        xs, ys, err, bare = _series(summary, "eval", key)
        if xs:
            lab = _bare_label(lab, bare, xs)
            shift = 2.0 ** (0.04 * (i - 1))   # a small dodge on the log2 alpha axis
            ax.errorbar(np.asarray(xs) * shift, ys, yerr=err, marker=marker, ms=ms, ls=ls,
                        capsize=3, color=col, mfc="none" if i else col, label=lab,
                        zorder=3 + i)
            labels.append(lab)
        else:
            lab = f"{lab}: {empty or 'no record'} (not drawn)"
            ax.plot([], [], marker=marker, ls=ls, color=col, alpha=0.4, label=lab)
            labels.append(lab)
    ax.set_title(title, fontsize=9)
    ax.set_ylim(-0.04, 1.04)
    return labels


def _context_and_control(ax: Any, summary: Mapping[str, Any], control: Mapping[str, Any],
                         key: str, marker: str) -> None:
    """One judge statistic by alpha: the context keys' line, the control's dashed."""
    for part, lab, ls, mfc in ((summary, "context keys steered", "-", None),
                               (control, "control: non-context keys", "--", "none")):
        xs, ys, err, bare = _series(part, "eval", key)
        if xs:
            ax.errorbar(xs, ys, yerr=err, marker=marker, ms=5, capsize=3, ls=ls, mfc=mfc,
                        color=COLORS["eval"], label=_bare_label(lab, bare, xs))


def plot_steering(summary: Mapping[str, Any], out_dir: str | Path,
                  name: str = "steering") -> Path:
    """EA and acceptance of the judge, GA of the generator, and context mass vs alpha.

    Panels (overall, with passage-cluster 95% CIs; alpha on a log axis, 1 = unsteered):
    judge: forced-choice EA, acceptance on oracle-correct and on oracle-incorrect answers;
    generator: GA; both: the context mass actually reached; the judge's mean whole-reply
    ``logit_diff`` (nats), which moves where no verdict flips; where the summary has it, the
    judge's AUC (``logit_diff`` against y*, within each dataset): a steering that only moves
    the threshold leaves it flat. With the non-context control
    (``control`` in the summary) a panel draws the judge under the control, the generator
    panel its GA dashed, and the ``logit_diff`` panel the control's line dashed. Two rows
    (judge, generator, mass; control, ``logit_diff``). The
    title gives the records and passages (n) and the steered heads and band; under
    :data:`interp.analysis.stats.MIN_PASSAGES` passages the count is starred and the note written
    under the figure. Lines of the judge panel: :func:`judge_panel`.

    Returns:
        The PNG path.
    """
    control = summary.get("control") or {}
    ranked = bool(_series(summary, "eval", "auc")[0])
    cols = 3 if control.get("eval") or ranked else 2
    fig, grid = plt.subplots(2, cols, figsize=(5.2 * cols, 8.4))
    cells = list(grid.flat)
    axes = cells[:3] + ([cells[3]] if control.get("eval") else []) + [cells[4 if cols == 3
                                                                            else 3]]
    if ranked:   # the judge's ranking: what decides whether it is right more often
        ax = cells[5]
        _context_and_control(ax, summary, control, "auc", "D")
        ax.axhline(0.5, color="0.5", lw=0.6)
        ax.set_ylim(-0.04, 1.04)
        ax.set_title("judge: AUC of logit_diff against y* (0.5: chance)", fontsize=9)
        ax.set_ylabel("AUC (right above wrong answers)")
    for ax in cells:
        if ax not in axes and not (ranked and ax is cells[5]):
            ax.axis("off")
    judge_panel(axes[0], summary)
    if control.get("eval"):
        judge_panel(axes[3], control, "control: the judge, NON-context keys steered")
    ax = axes[-1]
    _context_and_control(ax, summary, control, "logit_diff", "o")
    ax.axhline(0.0, color="0.5", lw=0.6)
    ax.set_title("judge: mean logit_diff (> 0: 'Correct' more likely)", fontsize=9)
    ax = axes[1]
    xs, ys, err, bare = _series(summary, "gen", "ga")
    cx, cy, cerr, cbare = _series(control, "gen", "ga")
    if cx:
        ax.errorbar(np.asarray(cx) * 2 ** 0.04, cy, yerr=cerr, marker="s", ms=4, capsize=3,
                    ls="--", mfc="none", color=COLORS["GA"], alpha=0.7,
                    label=_bare_label("GA, control (non-context keys)", cbare, cx))
    if xs:
        ax.errorbar(xs, ys, yerr=err, marker="o", ms=5, capsize=3, color=COLORS["GA"],
                    label=_bare_label("GA (steered answers)", bare, xs))
    else:
        ax.text(0.5, 0.5, "generator not steered in this run\n(steering tasks without 'gen')",
                ha="center", va="center", transform=ax.transAxes, fontsize=9, color="0.4")
    ax.set_title("generator (every answer token steered)", fontsize=9)
    ax.set_ylim(-0.04, 1.04)
    ax = axes[2]
    for task, col in (("eval", COLORS["eval"]), ("gen", COLORS["gen"])):
        xs, ys, err, bare = _series(summary, task, "context_mass")
        if xs:
            ax.errorbar(xs, ys, yerr=err, marker="o", ms=4, capsize=3, color=col,
                        label=_bare_label(f"{task} context mass", bare, xs))
    ax.set_title("context mass reached (band, all heads)", fontsize=9)
    for ax, label in zip(axes, ("share of answers", "GA (share of answers right)",
                                "last-token attention mass on the context")):
        ax.set_ylabel(label)
    axes[-1].set_ylabel("log P('Correct') - log P('Incorrect') (nats)")
    for ax in axes + ([cells[5]] if ranked else []):
        if ax.get_legend_handles_labels()[0]:  # under the axis: lines cross every height
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                      frameon=False)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("alpha (attention factor on the steered keys)")
        ax.axvline(1.0, color="black", lw=0.6, ls=":")
    n_p = summary.get("n_passages") or 0
    note = summary.get("note") or (passage_note(n_p) if "few_passages" not in summary else None)
    fig.suptitle(f"Attention steering: {summary.get('n_records')} records, "
                 f"{n_p} passages{'*' * bool(note)}; heads {summary.get('heads')}, band "
                 f"{summary.get('band', [None])[0]}-{summary.get('band', [None])[-1]}",
                 fontsize=10)
    fig.tight_layout()
    bare = any(f"CI {DEGENERATE_MARK}" in t for ax in axes
               for t in ax.get_legend_handles_labels()[1])
    footnote(fig, ([f"* {note}; the CIs rest on these few passages"] if note else [])
             + ([f"{degenerate_note(n_p)} (a point without a whisker; one record has no "
                 f"interval at all)"] if bare else []))
    return save(fig, out_dir, name)
