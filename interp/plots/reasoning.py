"""Figure of the one-word judge vs the reasoning judge (:mod:`interp.methods.reasoning_compare`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from interp.analysis.stats import degenerate_note
from interp.judging.reasoning import REASONING_SPANS
from interp.plots.common import ci_bars, footnote, plt, save

__all__ = ["plot_reasoning_side_by_side"]

_JUDGE_STATS = (("EA", "EA"), ("EA_forced", "EA forced"),
                ("acceptance_rate_correct", "acc | y*=C"),
                ("acceptance_rate_incorrect", "acc | y*=I"),
                ("no_verdict_share", "no verdict"))
_MASS_STATS = (("verdict_context_mass", "context"), ("verdict_question_mass", "question"),
               ("verdict_candidate_mass", "candidate"))
_COLORS = {"word": "#4C72B0", "reasoning": "#DD8452"}


def _paired_bars(ax: Any, g: Mapping[str, Any], stats: tuple[tuple[str, str], ...],
                 title: str, top: float = 1.0) -> bool:
    """Word vs reasoning judge bars per statistic, Δ above them; whether a CI has zero width."""
    x, w = np.arange(len(stats)), 0.38
    degenerate = False
    for j, judge in enumerate(("word", "reasoning")):
        degenerate |= ci_bars(ax, x + (j - 0.5) * w, [g[k][judge] for k, _ in stats],
                [g[k][f"{judge}_ci"] for k, _ in stats], w, color=_COLORS[judge], capsize=2,
                label="one-word judge" if judge == "word" else "reasoning judge")
    for i, (k, _) in enumerate(stats):
        d, ci = g[k]["delta"], g[k]["delta_ci"]
        if d is not None:
            ax.annotate(f"Δ {d:+.2f}" + (f"\n[{ci[0]:+.2f},{ci[1]:+.2f}]" if ci else ""),
                        (i, top * 1.05), ha="center", va="bottom", fontsize=6.5)
    ax.set_xticks(x, [lab for _, lab in stats], fontsize=7.5)
    ax.set_xlim(-0.6, len(stats) - 0.15)  # room for the value label beside the last whisker
    ax.set_ylim(0, top * 1.24)
    ax.set_title(title, fontsize=9)
    return degenerate


def plot_reasoning_side_by_side(results: Mapping[str, Mapping[str, Any]] | Mapping[str, Any],
                                out_dir: str | Path, name: str = "reasoning_side_by_side"
                                ) -> Path:
    """One row per model: judge accuracy and acceptance, verdict-position mass, reasoning mass.

    Args:
        results: one :func:`interp.methods.reasoning_compare.side_by_side` result (with ``model``)
        or
            ``{model: result}``.
        out_dir: where the PNG/PDF go.
        name: file stem.

    Returns:
        The PNG path.
    """
    if "overall" in results:
        results = {str(results.get("model", "")): results}
    fig, axes = plt.subplots(len(results), 3, figsize=(15, 3.6 * len(results)), squeeze=False)
    notes = []
    for row, (model, res) in zip(axes, results.items()):
        g = res["overall"]
        if not g.get("n"):
            row[0].set_title(f"{model}: no paired records")
            continue
        rj = g["reasoning_judge"]
        degenerate = _paired_bars(row[0], g, _JUDGE_STATS, f"{model}: judge on the same answers "
                                              f"(GA {g['GA']:.2f})")
        row[0].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=2,
                      frameon=False)  # under the axis: the bars reach 1 and the Δs sit above
        hi = max((g[k][f"{j}_ci"] or [0, g[k][j] or 0])[1] for k, _ in _MASS_STATS
                 for j in ("word", "reasoning"))
        degenerate |= _paired_bars(row[1], g, _MASS_STATS, "attention mass at the verdict position "
                                             f"(band {res['band'][0]}-{res['band'][-1]})",
                     top=max(0.05, 1.3 * hi))
        x, w = np.arange(len(REASONING_SPANS)), 0.38
        for j, (key, lab, col) in enumerate((("reasoning_mass", "while reasoning", "#8172B3"),
                                             ("verdict_mass", "at its verdict", "#DD8452"))):
            degenerate |= ci_bars(row[2], x + (j - 0.5) * w,
                                  [rj[key][s]["mean"] for s in REASONING_SPANS],
                                  [rj[key][s]["ci"] for s in REASONING_SPANS], w, color=col,
                                  label=lab, capsize=2)
        row[2].set_xticks(x, list(REASONING_SPANS), fontsize=7.5)
        row[2].set_ylim(0, 1.0)
        row[2].legend(fontsize=7)
        row[2].set_title("reasoning judge: span mass while reasoning vs at its verdict",
                         fontsize=9)
        notes.append(f"{model}: {g['n']} records, {g['n_passages']} passages"
                     f"{' (< 10: few independent units)' if g['few_passages'] else ''}; "
                     f"reasoning replies with a verdict {rj['n_reached_verdict']}/{g['n']}, "
                     f"hit the {res.get('max_reasoning_tokens')}-token budget "
                     f"{rj['n_hit_budget']}/{g['n']}; bars: 95% passage-cluster CIs, Δ = "
                     f"reasoning - word on the same resamples")
        if degenerate:
            notes.append(f"{model}: {degenerate_note(g['n_passages'])}")
    fig.tight_layout()
    footnote(fig, notes, wrap=180)
    return save(fig, out_dir, name)
