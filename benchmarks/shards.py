"""Two shards of one thread against one process of two threads, on the same records.

Measured in one run, one after the other, on the bundled SmolLM2 (float32, CPU):

1. ``interp asymmetry`` on ``--records`` SQuAD 2.0 validation records as ONE process with
   ``OMP_NUM_THREADS=2`` (wall time);
2. the same command as TWO processes started together, ``--shard 0/2`` and ``--shard 1/2``,
   each with ``OMP_NUM_THREADS=1`` (wall time until both finished);
3. ``interp merge`` of the two shards (its own wall time, and in-process seconds of
   :func:`interp.merge.merge_shards` as it logs them).

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
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cmd(out: Path, n: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "interp", "asymmetry", "--dataset", "squad_v2", "--limit",
            str(n), "--out", str(out), *extra]


def _env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}


def _run_all(cmds: list[list[str]], threads: int) -> float:
    """Start every command at once; seconds until the last one finished."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, env=_env(threads), cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for c in cmds]
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            raise SystemExit(f"{' '.join(p.args)} failed: {err[-2000:]}")
    return time.perf_counter() - t0


def _records(d: Path) -> list[tuple]:
    return [(r["id"], r.get("answer"), r.get("verdict"))
            for r in map(json.loads, (d / "records.jsonl").read_text().splitlines())]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=32)
    ap.add_argument("--out", default="/tmp/shards_bench")
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    one, split = out / "one", out / "split"
    t_one = _run_all([_cmd(one, args.records)], threads=2)
    print(f"1 process x 2 threads: {t_one:.1f} s", flush=True)
    t_split = _run_all([_cmd(split, args.records, "--shard", f"{i}/2") for i in range(2)],
                       threads=1)
    print(f"2 shards x 1 thread:   {t_split:.1f} s", flush=True)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "interp", "merge",
                          *(str(split / "shards" / f"{i}-of-2") for i in range(2)),
                          "--out", str(split)], env=_env(1), cwd=ROOT, capture_output=True,
                         text=True, check=True)
    t_merge = time.perf_counter() - t0
    inner = next((line for line in res.stdout.splitlines() if line.startswith("[merge]")), "")
    print(f"interp merge:          {t_merge:.1f} s ({inner})", flush=True)
    same = _records(one) == _records(split)
    report = {"records": args.records, "one_process_2_threads_s": t_one,
              "two_shards_1_thread_s": t_split, "speedup": t_one / t_split,
              "merge_command_s": t_merge, "merge_log": inner, "records_equal": same,
              "cpu_count": os.cpu_count(), "load_average": os.getloadavg()}
    (out / "shards_bench.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    if not same:
        raise SystemExit("the merged records differ from the single process's")


if __name__ == "__main__":
    main()
