"""Wall time of each test tier (``make check``, ``make test``) from a clean clone.

Clones the repository at ``--rev`` (default ``HEAD``) into a fresh directory and sets up its
virtual environment: ``make venv``, timed and reported apart, or with ``--venv PATH`` a link
to an existing one (its editable install is overridden by ``PYTHONPATH`` so the clone's code
runs; its install stamp is touched so make does not rebuild it). Then times ``make check`` and
``make test`` (which runs ``make check`` again first) as whole processes, one after the other.
Each pytest call prints its 30 slowest tests (``PYTEST_ADDOPTS=--durations=30``); every
tier's log is kept in ``--out``. A revision without a ``check`` target (the suite was one
tier) is timed as ``make test`` alone. Prints a table and writes ``--out/tiers.json``::

    python benchmarks/test_tiers.py --out /tmp/tiers                 # HEAD, fresh venv
    python benchmarks/test_tiers.py --rev 8fb34f8 --venv .venv --out /tmp/tiers_before

The times are the machine's: run it with nothing else running (the 1-minute load average at
the start and end of each tier is recorded; above the core count the times are inflated).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> dict:
    """Run ``cmd`` to completion, its output into ``log``; wall seconds, exit status, loads."""
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with log.open("w") as fh:
        rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    text = log.read_text(errors="replace")
    counts = {k: sum(int(n) for n in re.findall(rf"(\d+) {k}\b", text))
              for k in ("passed", "failed", "skipped", "error")}
    return {"cmd": " ".join(cmd), "rc": rc, "wall_s": round(wall, 1), "load_start": load0,
            "load_end": os.getloadavg()[0], "log": str(log), **counts}


def assertion_census(tests: Path) -> dict[str, int]:
    """Test functions under ``tests`` and how many of them assert something themselves.

    Counted from the source (``ast``): a ``test_*`` function bears assertions when its body
    holds an ``assert`` statement or a ``pytest.raises`` / ``pytest.warns`` block. Parametrised
    cases count once here; ``pytest --collect-only`` gives the collected items.
    """
    import ast

    funcs = bearing = 0
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                    node.name.startswith("test_"):
                funcs += 1
                bearing += any(
                    isinstance(n, ast.Assert) or (
                        isinstance(n, ast.Attribute) and n.attr in ("raises", "warns")
                        and isinstance(n.value, ast.Name) and n.value.id == "pytest")
                    for n in ast.walk(node))
    return {"test_functions": funcs, "assertion_bearing": bearing}


def collected(clone: Path, env: dict[str, str], marker: str) -> int:
    """Number of test items ``pytest -m MARKER --collect-only`` selects (0 when none)."""
    out = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-m", "pytest", "-q",
                          "--collect-only", "-m", marker], cwd=clone, env=env,
                         capture_output=True, text=True).stdout
    m = re.search(r"(\d+)(?:/\d+)? tests? (?:collected|selected)", out)
    return int(m.group(1)) if m else 0


def main(argv: list[str] | None = None) -> int:
    """Clone, set up, time each tier, print the table; 0 when every tier passed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD", help="revision to clone and time (default HEAD)")
    ap.add_argument("--venv", type=Path, help="link this virtual environment instead of "
                    "`make venv` (its editable install is overridden by PYTHONPATH)")
    ap.add_argument("--out", type=Path, required=True, help="directory for tiers.json and logs")
    ap.add_argument("--tiers", default="check,test", help="comma-separated make targets")
    args = ap.parse_args(argv)
    if args.venv is not None and not (args.venv / "bin" / "python").exists():
        print(f"error: --venv {args.venv}: no bin/python there; give a virtual environment")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    clone = Path(tempfile.mkdtemp(prefix="tiers-")) / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", args.rev], cwd=clone, check=True)
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, check=True,
                         capture_output=True, text=True).stdout.strip()
    env = {**os.environ, "PYTEST_ADDOPTS": "--durations=30"}
    result: dict = {"rev": sha, "machine": f"{platform.node()} {os.cpu_count()} cores",
                    "date": time.strftime("%Y-%m-%d"), "tiers": {}}
    if args.venv is not None:
        (clone / ".venv").symlink_to(args.venv.resolve())
        env["PYTHONPATH"] = str(clone)
        (clone / ".venv" / ".installed").touch()        # never rebuild a linked venv
    else:
        result["tiers"]["venv"] = _run(["make", "venv"], clone, env, args.out / "venv.log")
    result["census"] = {**assertion_census(clone / "tests"),
                        "collected": collected(clone, env, "not slow or slow")}
    targets = subprocess.run(["make", "-qp"], cwd=clone, capture_output=True, text=True).stdout
    for tier in args.tiers.split(","):
        if not re.search(rf"^{re.escape(tier)}:", targets, re.M):
            result["tiers"][tier] = {"missing": True}
            continue
        print(f"[{tier}] make {tier} ...", flush=True)
        result["tiers"][tier] = _run(["make", tier], clone, env, args.out / f"{tier}.log")
    (args.out / "tiers.json").write_text(json.dumps(result, indent=1))
    print(f"\nrev {sha} on {result['machine']}, {result['date']}")
    print(f"{'tier':<8} {'wall':>9} {'passed':>7} {'skipped':>8} {'failed':>7} {'load':>10} rc")
    for tier, r in result["tiers"].items():
        if r.get("missing"):
            print(f"{tier:<8} {'(no target)':>9}")
            continue
        m, s = divmod(r["wall_s"], 60)
        print(f"{tier:<8} {int(m):>3}m{s:04.1f}s {r['passed']:>7} {r['skipped']:>8} "
              f"{r['failed'] + r['error']:>7} {r['load_start']:>4.1f}-{r['load_end']:<4.1f} "
              f"{r['rc']}")
    c = result["census"]
    print(f"tests collected {c['collected']}; test functions {c['test_functions']}, "
          f"of which bearing assertions {c['assertion_bearing']}")
    print(f"logs: {args.out}")
    return 0 if all(r.get("rc", 0) == 0 for r in result["tiers"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
