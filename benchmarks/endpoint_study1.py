"""Benchmark: Study 1 of the loopback-served SmolLM2 next to the in-process run, same records.

1. The in-process harness (:func:`interp.stages.asymmetry.run`, rule oracle, float32 on CPU)
   on the first ``--n`` bundled records of ``--dataset`` into ``OUT/inprocess``.
2. The same config with ``model = "openai:smollm2"``: the bundled GGUF served by llama.cpp
   (:class:`interp.endpoints.local.LocalServer`, ``--threads`` threads, one slot) on
   127.0.0.1, into ``OUT/served`` (its request cache ``OUT/served/requests.jsonl``).
3. Side by side: the share of records with the identical extracted answer, the identical
   parsed verdict, the identical forced choice (p_correct > 0.5); the mean and max
   |logit_diff| difference (nats); GA / EA / EA_forced / delta of each; wall time of each.

Both runs resume: a second call makes no request and no forward (it reads the cache and the
records). Written to ``OUT/study1_side_by_side.json``.

    OMP_NUM_THREADS=1 python benchmarks/endpoint_study1.py [--n 30] [--out DIR]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.endpoint_setup import (  # noqa: E402
    SMOLLM2,
    base_config,
    endpoint_table,
    inprocess_run,
    parse_args,
    serve,
)
from interp.stages.asymmetry import AsymmetryConfig, run  # noqa: E402
from interp.store.records import qa_key  # noqa: E402
from interp.store.rundir import RunDir  # noqa: E402


def main() -> None:
    a = parse_args(__doc__)
    out = Path(a.out)
    _, local, t_local = inprocess_run(a)
    with serve(SMOLLM2, "smollm2", a) as srv:
        t0 = time.perf_counter()
        served = run(out / "served", None,
                     AsymmetryConfig(model="openai:smollm2", **base_config(a),
                                     model_endpoint=endpoint_table(srv)),
                     log=print)
        t_served = time.perf_counter() - t0
    a_recs = {qa_key(r): r for r in RunDir(out / "inprocess").read_records()}
    b_recs = {qa_key(r): r for r in RunDir(out / "served").read_records()}
    keys = sorted(set(a_recs) & set(b_recs))
    same = {f: sum(a_recs[k][f] == b_recs[k][f] for k in keys) / len(keys)
            for f in ("answer", "verdict", "oracle_label")}
    scored = [k for k in keys if "logit_diff" in b_recs[k]]
    diffs = [abs(a_recs[k]["logit_diff"] - b_recs[k]["logit_diff"]) for k in scored]
    same["forced_choice"] = sum((a_recs[k]["p_correct"] > 0.5) == (b_recs[k]["p_correct"] > 0.5)
                                for k in scored) / max(len(scored), 1)
    pick = ("GA", "EA", "EA_forced", "delta", "delta_forced", "mean_verdict_coverage",
            "auc_logit_diff")
    res = {"n": len(keys), "dataset": a.dataset, "same_share": same,
           "logit_diff_abs_diff": {"mean": sum(diffs) / max(len(diffs), 1),
                                   "max": max(diffs, default=None), "n": len(diffs)},
           "inprocess": {k: local["overall"].get(k) for k in pick},
           "served": {k: served["overall"].get(k) for k in pick},
           "seconds": {"inprocess": round(t_local, 1), "served": round(t_served, 1)},
           "server_threads": a.threads}
    (out / "study1_side_by_side.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
