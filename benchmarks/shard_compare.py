"""One process against shards of the same command, merged: the block both shard benchmarks use.

:func:`one_vs_shards` runs a command once into ``OUT/one`` and as ``n`` shards started together
(``--shard i/n``) into ``OUT/split``, then ``interp merge`` of the shards, and compares the
records (ids, answers, verdicts in order; the largest ``logit_diff`` difference).
``benchmarks/shards.py`` (threads: one process of two against two of one) and
``benchmarks/gpu_check.py`` step 4 (two shards on one device) call it;
``benchmarks/ray_recipe.py`` compares its Ray-run shards with :func:`compare_runs`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from interp.store.rundir import RunDir  # noqa: E402


def run_together(cmds: Sequence[Sequence[str]], env: Mapping[str, str]) -> float:
    """Start every command at once (in the repo root); seconds until the last one finished.

    Raises:
        RuntimeError: a command failed (its arguments and last line of stderr).
    """
    t0 = time.perf_counter()
    procs = [subprocess.Popen(list(c), env=dict(env), cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for c in cmds]
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            last = (err.strip().splitlines() or ["(no stderr)"])[-1]
            raise RuntimeError(f"{' '.join(p.args[3:])} failed: {last}")
    return time.perf_counter() - t0


def one_vs_shards(base: Sequence[str], out: Path, *, env_one: Mapping[str, str],
                  env_split: Mapping[str, str], n: int = 2) -> dict[str, Any]:
    """``base`` (a command without ``--out``) as one process and as ``n`` shards, merged.

    Returns:
        ``one_s`` / ``shards_s`` / ``merge_s`` (wall seconds, process start and model load
        included), ``merge_log`` (the merge's ``[merge]`` line), ``records`` (of the one
        process), ``same_answers_and_verdicts`` (ids, answers and verdicts equal, in order)
        and ``logit_diff_max_abs_diff`` (nats, over records both scored).
    """
    one, split = out / "one", out / "split"
    t_one = run_together([[*base, "--out", str(one)]], env_one)
    t_split = run_together([[*base, "--out", str(split), "--shard", f"{i}/{n}"]
                            for i in range(n)], env_split)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "interp", "merge",
                          *(str(split / "shards" / f"{i}-of-{n}") for i in range(n)),
                          "--out", str(split)], env=dict(env_one), cwd=ROOT,
                         capture_output=True, text=True, check=True)
    t_merge = time.perf_counter() - t0
    return {"one_s": t_one, "shards_s": t_split, "merge_s": t_merge,
            "merge_log": next((x for x in res.stdout.splitlines() if x.startswith("[merge]")),
                              ""), **compare_runs(one, split)}


def compare_runs(one: Path, merged: Path) -> dict[str, Any]:
    """An unsharded run against a merged one.

    Returns:
        ``records`` (of ``one``), ``same_answers_and_verdicts`` (ids, answers and verdicts
        equal, in order) and ``logit_diff_max_abs_diff`` (nats, over records both scored).
    """
    a, b = RunDir(one).read_records(status=None), RunDir(merged).read_records(status=None)
    same = [(r["id"], r.get("answer"), r.get("verdict")) for r in a] == [
        (r["id"], r.get("answer"), r.get("verdict")) for r in b]
    dl = max((abs(x["logit_diff"] - y["logit_diff"]) for x, y in zip(a, b)
              if "logit_diff" in x and "logit_diff" in y), default=0.0)
    return {"records": len(a), "same_answers_and_verdicts": same,
            "logit_diff_max_abs_diff": dl}
