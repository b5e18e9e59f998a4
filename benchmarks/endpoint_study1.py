"""Benchmark: Study 1 of the loopback-served SmolLM2 next to the in-process run, same records.

1. The in-process harness (:func:`interp.stages.asymmetry.run`, rule oracle, float32 on CPU,
   the model loaded before the clock starts) on the first ``--n`` bundled records of
   ``--dataset`` into ``OUT/inprocess``.
2. The same config with ``model = "openai:smollm2"``: the bundled GGUF served by llama.cpp
   (:class:`interp.endpoints.local.LocalServer`, ``--threads`` threads) on 127.0.0.1, one
   slot and one request at a time, into ``OUT/served`` (its request cache
   ``OUT/served/requests.jsonl``).
3. The same again with ``--parallel`` slots and as many examples in flight
   (``concurrency``), into ``OUT/served_parallel``.
4. Steps 2 and 3 with ``cache_prompt = false`` in the endpoint table (every prompt evaluated
   whole, none reusing a prefix a slot holds from an earlier request), into
   ``OUT/served_nocache`` and ``OUT/served_parallel_nocache``.
5. Side by side: the share of records with the identical extracted answer, the identical
   parsed verdict, the identical forced choice (p_correct > 0.5); the mean and max
   |logit_diff| difference (nats); GA / EA / EA_forced / delta of each; wall time and
   records/s of each run; and each parallel run against its one-slot run: the records
   identical field for field, in the same order, the fields that differ, and the largest
   |logit_diff| difference (llama.cpp does not promise bit-identical logits when a prompt is
   split differently between batches or batched with other sequences,
   ggml-org/llama.cpp#6950 and #7052).

Every run resumes: a second call makes no request and no forward (it reads the cache and the
records), so its times are not throughput; time a fresh ``--out``. Written to
``OUT/study1_side_by_side.json``.

    OMP_NUM_THREADS=1 python benchmarks/endpoint_study1.py [--n 30] [--parallel 4] [--reverse]
        [--out DIR]
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


def served_run(a, name: str, parallel: int, cache_prompt: bool | None = None
               ) -> tuple[dict, float]:
    """Study 1 of the served GGUF into ``OUT/name``: (metrics, seconds of the run alone)."""
    extra = {} if cache_prompt is None else {"cache_prompt": cache_prompt}
    with serve(SMOLLM2, "smollm2", a, parallel=parallel) as srv:
        t0 = time.perf_counter()
        metrics = run(Path(a.out) / name, None,
                      AsymmetryConfig(model="openai:smollm2", **base_config(a),
                                      model_endpoint={**endpoint_table(srv), **extra}),
                      log=print)
        dt = time.perf_counter() - t0
    print(f"{name} ({parallel} slots): {dt:.1f} s", flush=True)
    return metrics, dt


def against(out: Path, one: str, par: str) -> dict:
    """The parallel run ``par`` against the one-slot run ``one``, record for record."""
    seq = RunDir(out / one).read_records(status=None)
    conc = RunDir(out / par).read_records(status=None)
    pairs = list(zip(seq, conc))
    differ = sorted({f for x, y in pairs for f in set(x) | set(y) if x.get(f) != y.get(f)})
    diffs = [abs(x["logit_diff"] - y["logit_diff"]) for x, y in pairs
             if "logit_diff" in x and "logit_diff" in y]
    return {"records": len(pairs), "same_order": [qa_key(r) for r in seq] == [
                qa_key(r) for r in conc],
            "identical_records": sum(x == y for x, y in pairs),
            "same_answer": sum(x.get("answer") == y.get("answer") for x, y in pairs),
            "same_verdict": sum(x.get("verdict") == y.get("verdict") for x, y in pairs),
            "fields_that_differ": differ, "logit_diff_max_abs_diff": max(diffs, default=None)}


def main() -> None:
    a = parse_args(__doc__)
    out = Path(a.out)
    runs = {"served": (1, None), "served_parallel": (a.parallel, None),
            "served_nocache": (1, False), "served_parallel_nocache": (a.parallel, False)}
    metrics, secs = {}, {}
    for name in (["inprocess", *runs][::-1] if a.reverse else ["inprocess", *runs]):
        if name == "inprocess":
            _, local, secs[name] = inprocess_run(a)
            print(f"in process: {secs[name]:.1f} s", flush=True)
        else:
            metrics[name], secs[name] = served_run(a, name, *runs[name])
    served = metrics["served"]
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
    n_rec = {"inprocess": len(a_recs), **{k: len(RunDir(out / k).read_records(status=None))
                                          for k in runs}}
    rate = {k: n_rec[k] / secs[k] for k in secs}
    res = {"n": len(keys), "dataset": a.dataset, "same_share": same,
           "logit_diff_abs_diff": {"mean": sum(diffs) / max(len(diffs), 1),
                                   "max": max(diffs, default=None), "n": len(diffs)},
           "inprocess": {k: local["overall"].get(k) for k in pick},
           "served": {k: served["overall"].get(k) for k in pick},
           **{f"{k}_metrics": {m: metrics[k]["overall"].get(m) for m in pick}
              for k in runs if k != "served"},
           "parallel_vs_one_slot": against(out, "served", "served_parallel"),
           "parallel_vs_one_slot_nocache": against(out, "served_nocache",
                                                   "served_parallel_nocache"),
           "nocache_vs_cache_one_slot": against(out, "served", "served_nocache"),
           "seconds": {k: round(v, 1) for k, v in secs.items()},
           "records_per_s": {k: round(v, 4) for k, v in rate.items()},
           "vs_inprocess": {k: round(rate[k] / rate["inprocess"], 2) for k in runs},
           "order": list(secs), "server_threads": a.threads, "parallel": a.parallel}
    (out / "study1_side_by_side.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
