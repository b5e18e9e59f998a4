"""Two shards of one thread against one process of two threads, on the same records.

Measured in one run, one after the other, on the bundled SmolLM2 (float32, CPU):

1. ``interp asymmetry`` on ``--records`` SQuAD 2.0 validation records as ONE process with
   ``OMP_NUM_THREADS=2`` (wall time);
2. the same command as TWO processes started together, ``--shard 0/2`` and ``--shard 1/2``,
   each with ``OMP_NUM_THREADS=1`` (wall time until both finished);
3. ``interp merge`` of the two shards (its own wall time, and in-process seconds of
   :func:`interp.stages.merge.merge_shards` as it logs them).

Each timing includes its process's start and model load (as a user would run it). The merged
records must equal the single process's (same ids, answers and verdicts). Results go to
``OUT/shards_bench.json``::

    python benchmarks/shards.py --records 32 --out /tmp/shards_bench
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.shard_compare import ROOT, one_vs_shards  # noqa: E402


def _env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=32)
    ap.add_argument("--out", default="/tmp/shards_bench")
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    base = [sys.executable, "-m", "interp", "asymmetry", "--dataset", "squad_v2", "--limit",
            str(args.records)]
    got = one_vs_shards(base, out, env_one=_env(2), env_split=_env(1))
    t_one, t_split = got["one_s"], got["shards_s"]
    print(f"1 process x 2 threads: {t_one:.1f} s", flush=True)
    print(f"2 shards x 1 thread:   {t_split:.1f} s", flush=True)
    print(f"interp merge:          {got['merge_s']:.1f} s ({got['merge_log']})", flush=True)
    same = got["same_answers_and_verdicts"]
    report = {"records": args.records, "one_process_2_threads_s": t_one,
              "two_shards_1_thread_s": t_split, "speedup": t_one / t_split,
              "merge_command_s": got["merge_s"], "merge_log": got["merge_log"],
              "records_equal": same, "cpu_count": os.cpu_count(),
              "load_average": os.getloadavg()}
    (out / "shards_bench.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    if not same:
        raise SystemExit("the merged records differ from the single process's")


if __name__ == "__main__":
    main()
