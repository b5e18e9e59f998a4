"""Benchmark: Qwen2.5-Coder-0.5B as a served ``openai:`` oracle and as an in-process oracle.

On the ok records of an asymmetry run (made here if missing: the in-process SmolLM2 harness
on the first ``--n`` bundled records of ``--dataset``, as benchmarks/endpoint_study1.py):

1. ``interp oracle-agreement`` with ``openai:qwen``: the bundled Qwen GGUF served by
   llama.cpp on 127.0.0.1 (``--threads`` threads, one slot) vs the rule oracle: Cohen's
   kappa, agreement, confusion, how the LLM oracle decided (reply / forced choice /
   constrained / none). Its requests are cached in the run directory.
2. The same with ``model:qwen2.5-coder-0.5b-instruct`` (float32 on CPU, in process).
3. The two LLM oracles against each other, from the labels each gave (the served oracle's
   grades come from the request cache, no request is repeated).

Written to ``RUN/oracle_agreement_{served,inprocess,llm_vs_llm}.json``.

    OMP_NUM_THREADS=1 python benchmarks/endpoint_oracle.py [--n 30] [--out DIR]
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.endpoint_setup import endpoint_table, inprocess_run, parse_args, serve  # noqa: E402
from interp.core.io import write_json  # noqa: E402
from interp.judging.grading import make_oracle  # noqa: E402
from interp.methods.agreement import oracle_agreement as grade_agreement  # noqa: E402
from interp.stages.asymmetry import format_oracle_agreement, oracle_agreement  # noqa: E402
from interp.store.rundir import RunDir  # noqa: E402

QWEN = "qwen2.5-coder-0.5b-instruct"


class Memo:
    """An oracle whose grades are remembered (the in-process oracle grades each record once)."""

    def __init__(self, oracle):
        self.oracle, self.name, self.memo = oracle, oracle.name, {}

    def grade(self, prediction, answers, **kw):
        key = (prediction, tuple(answers), kw["extras"].get("question"))
        if key not in self.memo:
            self.memo[key] = self.oracle.grade(prediction, answers, **kw)
        return self.memo[key]


def main() -> None:
    a = parse_args(__doc__)
    rd = RunDir(inprocess_run(a)[0])
    out = {}
    with serve(QWEN, "qwen", a) as srv:
        t0 = time.perf_counter()
        served = make_oracle("openai:qwen", run=rd, endpoint=endpoint_table(srv))
        out["served"] = oracle_agreement(rd, served)
        out["served"]["seconds"] = round(time.perf_counter() - t0, 1)
        shutil.copy(rd.path / "oracle_agreement.json",
                    rd.path / "oracle_agreement_served.json")
        print(format_oracle_agreement(out["served"]))
        t0 = time.perf_counter()
        local = Memo(make_oracle(f"model:{QWEN}", device="cpu", dtype="float32"))
        out["inprocess"] = oracle_agreement(rd, local)
        out["inprocess"]["oracle_b_counts"] = local.oracle.counts
        out["inprocess"]["seconds"] = round(time.perf_counter() - t0, 1)
        shutil.copy(rd.path / "oracle_agreement.json",
                    rd.path / "oracle_agreement_inprocess.json")
        print(format_oracle_agreement(out["inprocess"]))
        both = grade_agreement(rd.read_records()[:a.n], served, local, max_examples=a.n)
        write_json(rd.path / "oracle_agreement_llm_vs_llm.json", both)
        print(f"served vs in-process Qwen: agreement {both['agreement']:.3f}, kappa "
              f"{both['kappa']:.3f}, confusion {both['confusion']}")
    keys = ("n", "agreement", "kappa", "confusion", "oracle_b_counts", "seconds")
    print(json.dumps({k: {x: v.get(x) for x in keys} for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
