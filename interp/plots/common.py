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

from interp.analysis.stats import DEGENERATE_MARK, is_degenerate, merge_notes  # noqa: E402
from interp.core.names import in_dataset_order  # noqa: E402

COLORS = {"GA": "#4C72B0", "EA": "#DD8452", "delta": "#55A868", "gen": "#4C72B0",
          "eval": "#DD8452", "correct": "#55A868", "incorrect": "#C44E52"}


def save(fig: plt.Figure, out_dir: str | Path, name: str) -> Path:
    """Save a figure as PNG (150 dpi) and PDF into ``out_dir``; close it; return the PNG.

    Value labels are placed clear of every other bar and label first
    (:func:`place_value_labels`).
    """
    place_value_labels(fig)
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
    groups = [(d, g) for d, g in in_dataset_order(table["per_dataset"]) if g.get("n")]
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
        ends = [v, 0.0] + ([float(c) for c in ci] if ci is not None and None not in ci else [])
        column = (x - width / 2, x + width / 2, min(ends), max(ends))
        if upright:
            t = ax.annotate(f"{v:{fmt}}" + (f" {DEGENERATE_MARK}" if zero else ""),
                            (x, column[3]), xytext=(0, 2), textcoords="offset points",
                            ha="center", va="bottom", rotation=90, fontsize=6.5,
                            gid="value_label", bbox=box)
        else:
            t = ax.annotate(f"{v:{fmt}}" + (f"\n{DEGENERATE_MARK}" if zero else ""), (x, v),
                            xytext=(capsize + 2.5, 0), textcoords="offset points", ha="left",
                            va="center", fontsize=6.5, gid="value_label", bbox=box)
        t.value_column = (*column, v, capsize)  # read by place_value_labels
    return degenerate


def _placements(x: float, lo: float, hi: float, v: float, capsize: float
                ) -> list[tuple[tuple[float, float], tuple[float, float], str, str, int]]:
    """Where a value label may go: ``(xy, offset in points, ha, va, rotation)``.

    Preferred first: beside the whisker at the value (right, then left), above the whisker,
    upright above it, under the bar.
    """
    gap = capsize + 2.5
    return [((x, v), (gap, 0), "left", "center", 0), ((x, v), (-gap, 0), "right", "center", 0),
            ((x, hi), (0, 2), "center", "bottom", 0), ((x, hi), (0, 2), "center", "bottom", 90),
            ((x, lo), (0, -2), "center", "top", 0)]


def place_value_labels(fig: plt.Figure) -> int:
    """Move each value label that covers another bar, its whisker or another label.

    A label of :func:`ci_bars` starts where its call put it; when its box overlaps another
    bar's column (the bar and its whisker, at least 2 pixels tall, so a zero-height bar
    counts), a label placed before it, a legend, or leaves its axes, it takes the first of
    :func:`_placements` that does none of these (else the one that overlaps least). So a
    zero-width interval's two-line label no longer lies over the neighbouring bar.

    Args:
        fig: a drawn or undrawn figure.

    Returns:
        How many labels moved.
    """
    r = fig.canvas.get_renderer()
    moved = 0
    for ax in fig.axes:
        labels = [t for t in ax.texts if getattr(t, "value_column", None) is not None]
        if not labels:
            continue
        frame = ax.get_window_extent(r)
        legends = [lg.get_window_extent(r) for lg in [ax.get_legend(), *fig.legends] if lg]

        def column_box(t: Any) -> Any:
            x0, x1, lo, hi = t.value_column[:4]
            (a, b), (c, d) = ax.transData.transform([(x0, lo), (x1, hi)])
            return matplotlib.transforms.Bbox([[min(a, c), min(b, d) - 1],
                                               [max(a, c), max(b, d) + 1]])

        columns = {id(t): column_box(t) for t in labels}
        placed: list[Any] = []

        def cost(t: Any) -> float:
            box = t.get_window_extent(r)
            area = 0.0
            for other in [*(b for k, b in columns.items() if k != id(t)), *placed, *legends]:
                w = min(box.x1, other.x1) - max(box.x0, other.x0)
                h = min(box.y1, other.y1) - max(box.y0, other.y0)
                area += max(w, 0) * max(h, 0)
            outside = (max(frame.x0 - box.x0, 0) + max(box.x1 - frame.x1, 0)
                       + max(frame.y0 - box.y0, 0) + max(box.y1 - frame.y1, 0))
            return area + outside * box.height

        for t in labels:
            if cost(t) > 0:
                x0, x1, lo, hi, v, cap = t.value_column
                start = (t.xy, t.xyann, t.get_ha(), t.get_va(), t.get_rotation())
                tried = []
                for xy, off, ha, va, rot in _placements((x0 + x1) / 2, lo, hi, v, cap):
                    t.xy, t.xyann = xy, off
                    t.set_ha(ha), t.set_va(va), t.set_rotation(rot)
                    tried.append((cost(t), (xy, off, ha, va, rot)))
                    if tried[-1][0] == 0:
                        break
                best = min(tried, key=lambda c: c[0])[1]
                xy, off, ha, va, rot = best
                t.xy, t.xyann = xy, off
                t.set_ha(ha), t.set_va(va), t.set_rotation(rot)
                moved += best != start
            placed.append(t.get_window_extent(r))
    return moved


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
    then ``extra`` (e.g. :func:`interp.analysis.stats.degenerate_note`). One line per fact:
    groups whose notes differ only in their counts share a line
    (:func:`interp.analysis.stats.merge_notes`), and a repeated ``extra`` is written once.
    """
    notes = ["* " + n for n in merge_notes([(d, g["note"]) for d, g in groups
                                            if g.get("few_passages")])]
    notes += merge_notes([(d, g["forced_choice_note"]) for d, g in groups
                          if g.get("forced_choice_note")])
    footnote(fig, notes + list(dict.fromkeys(extra or [])))

