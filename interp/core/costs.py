"""Measured CPU cost per record of each stage and bundled model: what a long command will cost.

:data:`CPU_S_PER_UNIT` is the one table of these costs: CPU-seconds (user + system, every
thread: the figure that does not grow when other processes share the cores) per unit of work
of a stage (a record of Study 1 and of the attention and probe stages, a patching pair, a
steered record), per bundled model, in float32 on a CPU. :func:`estimate` turns the work a
command is about to do into CPU-seconds (``interp run`` and Study 1 print it when they start),
and :func:`wall_prior_s` into the per-record prior that keeps a progress bar's ETA steady
before the first records are timed (:mod:`interp.core.progress`).

Source (:data:`SOURCE`): the ``make demo`` timing of docs/performance.md (2026-11-30, the
2-core machine with nothing else running: 822 CPU-seconds in 437 s of wall time, so 1.88
CPU-seconds per second, and each stage's logged seconds), each stage's seconds times 1.88,
divided by the demo's units (29 records per
model: 12 SQuAD 2.0, 12 DROP, 3 HotpotQA, 2 MuSiQue; 2 patching pairs; 4 steered records).
HotpotQA and MuSiQue prompts (1.4k-3.5k tokens) cost several times a SQuAD 2.0 one (135-470),
so a record of those is dearer than the table says and a SQuAD record cheaper; a model not in
the table has no estimate. Other cores change the CPU-seconds too: read them as an order of
magnitude, and the measured figures in docs/performance.md for anything precise.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["CPU_PER_WALL", "CPU_S_PER_UNIT", "SOURCE", "UNITS", "estimate", "format_cpu",
           "units", "wall_prior_s"]

SOURCE = "docs/performance.md, `make demo` on 2 idle cores (2026-11-30)"
"""Where :data:`CPU_S_PER_UNIT` comes from (module docstring)."""

CPU_PER_WALL = 822 / 437
"""CPU-seconds per wall second of the source run (2 torch threads, idle cores)."""

UNITS = {"asymmetry": "record", "attention": "record", "probe": "record",
         "patching": "pair", "steering": "record"}
"""What one unit of each stage of :data:`CPU_S_PER_UNIT` is (:func:`units` says a count)."""


def units(stage: str, n: int) -> str:
    """``"3 records"``, ``"1 pair"``: ``n`` units of ``stage`` (:data:`UNITS`; else records)."""
    unit = UNITS.get(stage, "record")
    return f"{n} {unit}{'' if n == 1 else 's'}"

_DEMO_S = {  # the source run's seconds per stage, and its units (module docstring)
    "smollm2-135m-instruct": {"asymmetry": 112, "attention": 3, "probe": 8, "patching": 11,
                              "steering": 9},
    "qwen2.5-coder-0.5b-instruct": {"asymmetry": 223, "attention": 4, "probe": 10,
                                    "patching": 24, "steering": 21},
}
_DEMO_UNITS = {"asymmetry": 29, "attention": 29, "probe": 29, "patching": 2, "steering": 4}

CPU_S_PER_UNIT: dict[str, dict[str, float]] = {
    model: {stage: round(s * CPU_PER_WALL / _DEMO_UNITS[stage], 2) for stage, s in row.items()}
    for model, row in _DEMO_S.items()}
"""``{model alias: {stage: CPU-seconds per unit}}`` (:data:`UNITS`; source: :data:`SOURCE`)."""


def estimate(model: str, work: Mapping[str, int]) -> tuple[float, list[str]]:
    """CPU-seconds of ``work`` on ``model``, and the stages with no measured cost.

    Args:
        model: a model spec (a bundled alias has costs; any other has none).
        work: ``{stage: units}`` (:data:`UNITS`), e.g. ``{"asymmetry": 10, "patching": 1}``.

    Returns:
        ``(cpu_seconds, unknown)``: the sum over the stages with a cost, and the names of the
        stages (with units > 0) the table has no cost for.
    """
    row = CPU_S_PER_UNIT.get(model, {})
    total = sum(row[s] * n for s, n in work.items() if s in row)
    return total, [s for s, n in work.items() if n and s not in row]


def format_cpu(seconds: float) -> str:
    """``"about 4 CPU-minutes"`` (``"under 1 CPU-minute"`` below 60 s)."""
    if seconds < 60:
        return "under 1 CPU-minute"
    minutes = round(seconds / 60)
    return f"about {minutes} CPU-minute{'s' if minutes != 1 else ''}"


def wall_prior_s(model: str, stage: str, threads: int) -> float | None:
    """A unit's wall seconds on idle cores with ``threads`` torch threads (None: no cost known).

    The CPU-seconds of :data:`CPU_S_PER_UNIT` spread over the threads: a prior, which the
    progress bar weighs against the units it has timed (:mod:`interp.core.progress`).
    """
    cpu = CPU_S_PER_UNIT.get(model, {}).get(stage)
    return None if cpu is None else cpu / max(1, threads)
