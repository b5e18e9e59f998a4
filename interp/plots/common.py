"""What every figure shares: the non-interactive backend, colours, saving, error bars, notes.

Every ``plot_*`` function of :mod:`interp.plots` takes a parsed table and an output folder,
writes ``NAME.png`` and ``NAME.pdf`` there (:func:`save`) and returns the PNG path.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from interp.analysis.stats import DEGENERATE_MARK, is_degenerate  # noqa: E402

COLORS = {"GA": "#4C72B0", "EA": "#DD8452", "delta": "#55A868", "gen": "#4C72B0",
          "eval": "#DD8452", "correct": "#55A868", "incorrect": "#C44E52"}


def save(fig: plt.Figure, out_dir: str | Path, name: str) -> Path:
    """Save a figure as PNG (150 dpi) and PDF into ``out_dir``; close it; return the PNG."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / f"{name}.png"
    fig.savefig(png, dpi=150, bbox_inches="tight")
    fig.savefig(out_dir / f"{name}.pdf", bbox_inches="tight")
    plt.close(fig)
    return png


def error_bars(value: float | None, ci: list[float] | None) -> list[float]:
    """``[below, above]``: the distances from ``value`` to the ends of its interval ``ci``.

    For matplotlib's ``yerr`` (each clipped at 0; ``[0, 0]`` without an interval or without
    a value, a metric that was not measured).
    """
    if not ci or value is None:
        return [0.0, 0.0]
    return [max(value - ci[0], 0.0), max(ci[1] - value, 0.0)]


def dataset_groups(table: Mapping[str, Any]) -> tuple[list[tuple[str, Any]], list[str]]:
    r"""Non-empty ``per_dataset`` groups of a table and their x tick labels.

    ``overall`` is added when there are several groups; labels read ``name\n(n=N)``, or
    ``name\nn=N\nP passages`` when the group counts passages, with ``*`` when it has fewer
    than 10 (:func:`passage_footnote` explains the star).
    """
    groups = [(d, g) for d, g in table["per_dataset"].items() if g.get("n")]
    if len(groups) > 1:
        groups.append(("overall", table["overall"]))

    def label(d: str, g: Mapping[str, Any]) -> str:
        if g.get("n_passages") is None:
            return f"{d}\n(n={g['n']})"
        return f"{d}\nn={g['n']}\n{g['n_passages']} passages{'*' * bool(g.get('few_passages'))}"

    return groups, [label(d, g) for d, g in groups]


def ci_bars(ax: Any, xs: Sequence[float], vals: Sequence[float | None],
            cis: Sequence[Sequence[float] | None], width: float, *, color: Any,
            label: str | None = None, alpha: float = 1.0, capsize: float = 3,
            fmt: str = ".2f", upright: bool = False) -> bool:
    """Bars with their 95% intervals, each value marked and written beside its whisker.

    Every drawn bar gets a black line at its value (a bar of height 0 stays visible, and
    differs from a group that was not measured, ``None``, which gets nothing) and its value as
    text to the right of the whisker, at the value's height, so it is not read as a bound of
    the interval. An interval of zero width (:func:`interp.analysis.stats.is_degenerate`) has no
    whisker to show; its label then says :data:`interp.analysis.stats.DEGENERATE_MARK`, and the
    caller writes :func:`interp.analysis.stats.degenerate_note` under the figure.

    Args:
        ax: the axes.
        xs: bar centres (data units), ``[n]``.
        vals: the values, ``[n]`` (None: not measured).
        cis: ``[lower, upper]`` per bar, or None without an interval.
        width: bar width (data units).
        color: bar colour.
        label: legend label.
        alpha: bar opacity.
        capsize: whisker cap half-width (points); the label starts right of it.
        fmt: format spec of the value labels.
        upright: write each label on one line, turned upright, just above the bar's top or its
            whisker, whichever is higher (for bars too narrow for a label beside them; the
            caller leaves room above the highest bar).

    Returns:
        Whether any drawn interval has zero width.
    """
    vals = [np.nan if v is None else float(v) for v in vals]
    errs = np.array([error_bars(None if np.isnan(v) else v, ci)
                     for v, ci in zip(vals, cis)]).reshape(-1, 2).T
    ax.bar(xs, vals, width, yerr=errs, capsize=capsize, color=color, label=label, alpha=alpha)
    degenerate = False
    for x, v, ci in zip(xs, vals, cis):
        if np.isnan(v):
            continue
        ax.hlines(v, x - width / 2, x + width / 2, colors="black", lw=1.0)
        zero = is_degenerate(ci)
        degenerate |= zero
        box = {"fc": "white", "ec": "none", "alpha": 0.7, "pad": 0.2}
        if upright:
            top = max(v, ci[1]) if ci is not None and None not in ci else v
            ax.annotate(f"{v:{fmt}}" + (f" {DEGENERATE_MARK}" if zero else ""), (x, top),
                        xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                        rotation=90, fontsize=6.5, gid="value_label", bbox=box)
            continue
        ax.annotate(f"{v:{fmt}}" + (f"\n{DEGENERATE_MARK}" if zero else ""), (x, v),
                    xytext=(capsize + 2.5, 0), textcoords="offset points", ha="left",
                    va="center", fontsize=6.5, gid="value_label", bbox=box)
    return degenerate


FOOTNOTE_CHARS_PER_INCH = 15
"""Characters of a 7.5-point footnote per inch of figure width (a little under the mean)."""


def footnote(fig: plt.Figure, notes: list[str], wrap: int | None = None) -> None:
    """Write ``notes`` (one per line, red, small) under the figure; nothing when empty.

    The text starts just under the lowest thing drawn (tick labels, legends below the axes),
    so no empty band separates it from the figure; :func:`save` keeps it
    (``bbox_inches="tight"``). ``wrap``: fill each line of a note to that many characters
    (default: about the figure's width at this font size, so a long note never widens the
    saved figure past its axes).
    """
    if notes:
        wrap = wrap or max(60, int(FOOTNOTE_CHARS_PER_INCH * fig.get_figwidth()))
        lines = [textwrap.fill(line, wrap) for n in notes for line in n.split("\n")]
        box = fig.get_tightbbox(fig.canvas.get_renderer())   # inches
        top = box.y0 / fig.get_figheight() - 0.01
        fig.text(0.01, top, "\n".join(lines), ha="left", va="top", fontsize=7.5,
                 color="#C44E52", gid="footnote")


def passage_footnote(fig: plt.Figure, groups: list[tuple[str, Any]],
                     extra: list[str] | None = None) -> None:
    """Write, visibly under the figure, the notes of groups on fewer than 10 passages.

    Also a group's ``forced_choice_note`` (the forced choice is the same for every record),
    then ``extra`` (e.g. :func:`interp.analysis.stats.degenerate_note`).
    """
    notes = [f"* {d}: {g['note']}" for d, g in groups if g.get("few_passages")]
    notes += [f"{d}: {g['forced_choice_note']}" for d, g in groups
              if g.get("forced_choice_note")]
    footnote(fig, notes + (extra or []))

