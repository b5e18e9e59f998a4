"""The Ray recipe of docs/scale.md, run for real on a local Ray instance on the CPU.

Ray is not a dependency of ``interp``; run this with a Python that has ``ray`` (the shards
are ``interp`` commands, started by each task with ``--interp-python``, default this one):

1. ``ray.init(num_cpus=N)`` on this machine; ``N`` Ray tasks (``num_cpus=1``: the recipe's
   ``num_gpus=1`` on a GPU cluster), each running ``interp asymmetry ... --shard i/N`` on
   ``--records`` bundled SQuAD 2.0 records with SmolLM2 (one torch thread), as the recipe's
   task does, and returning its shard directory;
2. ``interp merge`` of the directories the tasks returned;
3. the same command as one process, and the merged run compared with it
   (:func:`benchmarks.shard_compare.compare_runs`: ids, answers and verdicts in order, the
   largest ``logit_diff`` difference).

Wall seconds of each step go to ``OUT/ray_recipe.json``::

    python benchmarks/ray_recipe.py --records 8 --out /tmp/ray_recipe \
        --interp-python .venv/bin/python
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.shard_compare import ROOT, compare_runs  # noqa: E402


def main() -> None:
    import ray

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=8)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--out", default="/tmp/ray_recipe")
    ap.add_argument("--interp-python", default=sys.executable)
    a = ap.parse_args()
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
           "TOKENIZERS_PARALLELISM": "false"}
    base = [a.interp_python, "-m", "interp", "asymmetry", "--dataset", "squad_v2", "--limit",
            str(a.records), "--batch-size", "2", "--max-new-tokens", "16"]
    n, split = a.shards, str(out / "ray")

    t0 = time.perf_counter()
    ray.init(num_cpus=n, include_dashboard=False)
    t_init = time.perf_counter() - t0

    @ray.remote(num_cpus=1)
    def shard(i: int) -> str:
        subprocess.run([*base, "--out", split, "--shard", f"{i}/{n}"], check=True, env=env,
                       cwd=ROOT, stdout=subprocess.DEVNULL)
        return f"{split}/shards/{i}-of-{n}"

    t0 = time.perf_counter()
    dirs = ray.get([shard.remote(i) for i in range(n)])
    t_shards = time.perf_counter() - t0
    ray.shutdown()
    t0 = time.perf_counter()
    merge = subprocess.run([a.interp_python, "-m", "interp", "merge", *dirs, "--out", split],
                           check=True, env=env, cwd=ROOT, capture_output=True, text=True)
    t_merge = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run([*base, "--out", str(out / "one")], check=True, env=env, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    t_one = time.perf_counter() - t0
    result = {"ray": ray.__version__, "shards": n, "ray_init_s": round(t_init, 1),
              "shards_s": round(t_shards, 1), "merge_s": round(t_merge, 1),
              "one_process_s": round(t_one, 1), "dirs": dirs,
              "merge_log": next((x for x in merge.stdout.splitlines()
                                 if x.startswith("[merge]")), ""),
              **compare_runs(out / "one", Path(split))}
    (out / "ray_recipe.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    if not result["same_answers_and_verdicts"]:
        raise SystemExit("the merged Ray shards differ from the unsharded run")


if __name__ == "__main__":
    main()
