"""One-word judge vs reasoning judge on the same records and answers, for bundled models.

Usage: ``python experiments/reasoning.py OUT_FIGURES RUN_DIR [RUN_DIR ...]`` where each
RUN_DIR is a finished ``interp asymmetry`` run of a one-word judge (with its one-pass
attention recordings). Runs the reasoning stage (:mod:`interp.stages.reasoning`) on each run
and writes, into OUT_FIGURES, ``side_by_side.md`` (every model's table), ``side_by_side.json``
and ``side_by_side.png`` (one row per model). Environment: ``REASONING_LIMIT`` (records per
dataset), ``REASONING_BUDGET`` (max_reasoning_tokens).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from interp.core.io import atomic_write_text, write_json
from interp.judging.reasoning import MAX_REASONING_TOKENS
from interp.methods.reasoning_compare import format_side_by_side
from interp.plots.reasoning import plot_reasoning_side_by_side
from interp.stages import load_run_model
from interp.stages.reasoning import ReasoningConfig, run
from interp.store import RunDir


def main(out: str, runs: list[str]) -> None:
    """Run the stage on each run directory and write the combined table and figure."""
    limit = int(os.environ["REASONING_LIMIT"]) if os.environ.get("REASONING_LIMIT") else None
    budget = int(os.environ.get("REASONING_BUDGET", MAX_REASONING_TOKENS))
    results, tables = {}, []
    for path in runs:
        rd = RunDir(path)
        handle = load_run_model(rd, device="cpu", dtype="float32")
        t0 = time.perf_counter()
        res = run(rd, handle, ReasoningConfig(limit=limit, max_reasoning_tokens=budget,
                                              batch_size=6))
        res["seconds"] = round(time.perf_counter() - t0, 1)
        results[handle.spec] = res
        tables.append(format_side_by_side(res, handle.spec)
                      + f"\n\n(reasoning stage: {res['seconds']} s on this machine's CPU)")
        print(tables[-1], flush=True)
    Path(out).mkdir(parents=True, exist_ok=True)
    write_json(Path(out) / "side_by_side.json", results)
    atomic_write_text(Path(out) / "side_by_side.md", "\n\n".join(tables) + "\n")
    plot_reasoning_side_by_side(results, out, "side_by_side")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
