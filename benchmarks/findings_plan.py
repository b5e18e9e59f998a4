"""The findings study's plan: every part timed on a slice, scaled to the study's limits.

``experiments/findings.toml`` (and its ``matched`` control) sized for the CPU: before the long
run, each part (Study 1, each stage, cross-judging) runs on a slice of ``1/--fraction`` of the
study's records and stage limits (at least one record per dataset), both bundled models, in one
process. Per part it records the wall and CPU seconds (``time.process_time``: every thread of
the process) and scales them by the ratio of the study's records (or pairs, steered records,
permutations) to the slice's. The estimate is rough: the slice's first records are not the
study's mix of lengths, and fixed costs (model load, the first forward) are scaled too, so it
overestimates; so does a busy machine (the 5-minute load average at the start and end of
each config is recorded: above the core count, the CPU seconds are inflated too). Output:
``benchmarks/findings_plan.json`` (committed; the config's description points at it)::

    python benchmarks/findings_plan.py --fraction 30 --out /tmp/findings_plan
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("experiments/findings.toml", "experiments/findings_matched.toml")
SCALED = {"steering": "limit", "patching": "limit", "reasoning": "limit",
          "probe": "permutations"}
"""The count of each stage the slice divides (and the estimate multiplies back)."""


def slice_config(cfg: dict[str, Any], fraction: int) -> tuple[dict[str, Any], dict[str, float]]:
    """The config on ``1/fraction`` of its records and stage counts; and each part's scale."""
    out = copy.deepcopy(cfg)
    out["publish"] = False  # a slice never replaces the committed figures
    lim = out["asymmetry"]["limit"]
    small = {d: max(1, math.ceil(n / fraction)) for d, n in lim.items()}
    out["asymmetry"]["limit"] = small
    scale = {"asymmetry": sum(lim.values()) / sum(small.values())}
    scale["attention"] = scale["cross_judge"] = scale["audit"] = scale["asymmetry"]
    for stage, key in SCALED.items():
        if stage in out and key in out[stage]:
            n = out[stage][key]
            out[stage][key] = max(1, math.ceil(n / fraction))
            scale[stage] = n / out[stage][key]
    return out, scale


def main() -> None:
    """Time each part on the slice; write the plan (module docstring)."""
    from interp.run.pipeline import load_config, run_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=int, default=30)
    ap.add_argument("--out", default="/tmp/findings_plan")
    ap.add_argument("--write", default=str(ROOT / "benchmarks/findings_plan.json"))
    args = ap.parse_args()
    plan: dict[str, Any] = {"fraction": args.fraction, "machine": platform.processor() or
                            platform.machine(), "configs": {}}
    for path in CONFIGS:
        cfg, scale = slice_config(load_config(ROOT / path), args.fraction)
        marks: list[tuple[str, float, float]] = []

        def log(msg: str, marks: list = marks) -> None:
            m = re.match(r"== (?:stage (\w+) on|(\S+) -> |(\S+) judges )", msg)
            if m:
                part = m.group(1) or ("asymmetry" if m.group(2) else "cross_judge")
                marks.append((part, time.perf_counter(), time.process_time()))
            if msg.startswith("== done"):
                marks.append(("end", time.perf_counter(), time.process_time()))
            print(msg, flush=True)

        load0 = os.getloadavg()[1]
        run_config(cfg, out=Path(args.out) / Path(path).stem, overwrite=True, log=log)
        parts: dict[str, dict[str, float]] = {}
        for (part, w0, c0), (_, w1, c1) in zip(marks, marks[1:]):
            p = parts.setdefault(part, {"wall_s": 0.0, "cpu_s": 0.0})
            p["wall_s"] += w1 - w0
            p["cpu_s"] += c1 - c0
        for part, p in parts.items():
            p["scale"] = scale.get(part, scale["asymmetry"])
            p["planned_cpu_h"] = p["cpu_s"] * p["scale"] / 3600
            p["planned_wall_h"] = p["wall_s"] * p["scale"] / 3600
        plan["configs"][path] = {"slice_limits": cfg["asymmetry"]["limit"], "parts": parts,
                                 "load_average_5min": [load0, os.getloadavg()[1]],
                                 "planned_cpu_h": sum(p["planned_cpu_h"] for p in parts.values()),
                                 "planned_wall_h": sum(p["planned_wall_h"]
                                                       for p in parts.values())}
    plan["planned_cpu_h"] = sum(c["planned_cpu_h"] for c in plan["configs"].values())
    plan["planned_wall_h"] = sum(c["planned_wall_h"] for c in plan["configs"].values())
    Path(args.write).write_text(json.dumps(plan, indent=1) + "\n")
    print(json.dumps(plan, indent=1))


if __name__ == "__main__":
    main()
