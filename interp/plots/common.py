"""What every figure shares: the non-interactive backend, colours, saving, error bars, notes.

Every ``plot_*`` function of :mod:`interp.plots` takes a parsed table and an output folder,
writes ``NAME.png`` and ``NAME.pdf`` there (:func:`save`) and returns the PNG path.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

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


def footnote(fig: plt.Figure, notes: list[str], wrap: int | None = None) -> None:
    """Write ``notes`` (one per line, red, small) under the figure; nothing when empty.

    The text hangs below the axes; :func:`save` keeps it (``bbox_inches="tight"``). ``wrap``:
    fill each note to that many characters.
    """
    if notes:
        lines = [textwrap.fill(n, wrap) for n in notes] if wrap else notes
        fig.text(0.01, -0.01, "\n".join(lines), ha="left", va="top", fontsize=7.5,
                 color="#C44E52")


def passage_footnote(fig: plt.Figure, groups: list[tuple[str, Any]]) -> None:
    """Write, visibly under the figure, the notes of groups on fewer than 10 passages.

    Also a group's ``forced_choice_note`` (the forced choice is the same for every record).
    """
    notes = [f"* {d}: {g['note']}" for d, g in groups if g.get("few_passages")]
    notes += [f"{d}: {g['forced_choice_note']}" for d, g in groups
              if g.get("forced_choice_note")]
    footnote(fig, notes)

