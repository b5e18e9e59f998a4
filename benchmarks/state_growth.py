"""How much a clone grows when the findings study's saved state is saved again.

The saved state (``experiments/findings/state.parts``) is committed after each
``make findings-state``. This measures, on the real state, what two consecutive saves add to
a git repository's pack (what a clone downloads), for two layouts:

- ``one archive``: the whole state as ONE deterministic xz-compressed tar (the layout before
  the parts: every save that changes any file writes a new archive of the whole state);
- ``parts``: :func:`experiments.findings.state.pack_state` (one archive per stage and model;
  a save rewrites only the parts whose files changed).

The state is unpacked into a temporary folder; the baseline holds it without the last
``--hold`` files of two stages' folders; save 1 adds those of the first stage back and save 2
those of the second (:data:`STAGES`: one early and one late in the sorted order; real files: a
stage that goes on, as a resumed study does). Each layout is committed to its own fresh
repository after the baseline and after each save, and ``git gc`` packs it; the result is
``size-pack`` of ``git count-objects -v`` after each commit. Results go to
``OUT/state_growth.json``::

    python benchmarks/state_growth.py --out /tmp/state_growth
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.findings.state import _tar_xz, pack_state, unpack_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("findings/qwen2.5-coder-0.5b-instruct/patching",
          "findings_views/qwen2.5-coder-0.5b-instruct/pairwise")
"""The two stages that go on: one early in the archive's sorted order, one late (a single
xz stream keeps its bytes up to the first change, which git's deltas can reuse, so a change
late in one archive costs less than one early)."""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def _pack_kib(repo: Path) -> int:
    _git(repo, "gc", "-q")
    stats = dict(line.split(": ") for line in _git(repo, "count-objects", "-v").splitlines())
    return int(stats["size-pack"]) + int(stats["size"])


def _commit(repo: Path, message: str) -> int:
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-q",
         "--allow-empty", "-m", message)
    return _pack_kib(repo)


def main() -> None:
    """Measure both layouts (module docstring) and write ``OUT/state_growth.json``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", default=str(ROOT / "experiments/findings/state.parts"))
    ap.add_argument("--hold", type=int, default=12, help="files held back per stage")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="state-growth-"))
    try:
        full = work / "full"
        print(f"unpacking {args.state}", flush=True)
        unpack_state(args.state, full)
        (full / ".sha256").unlink()
        held = {}
        for stage in STAGES:
            files = sorted(p for p in (full / stage).rglob("*") if p.is_file())
            if len(files) <= args.hold:
                raise SystemExit(f"{stage} has {len(files)} files, not more than --hold")
            held[stage] = files[-args.hold:]
        state = work / "state"
        shutil.copytree(full, state)
        for files in held.values():
            for p in files:
                (state / p.relative_to(full)).unlink()
        repos = {"one archive": work / "one", "parts": work / "parts"}
        for repo in repos.values():
            repo.mkdir()
            _git(repo, "init", "-q")
        sizes: dict[str, list[int]] = {k: [] for k in repos}
        steps = ["baseline", *(f"save {i + 1}: {s}" for i, s in enumerate(STAGES))]
        for i, step in enumerate(steps):
            if i:
                for p in held[STAGES[i - 1]]:
                    dst = state / p.relative_to(full)
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(p, dst)
            files = sorted(p for p in state.rglob("*") if p.is_file())
            (repos["one archive"] / "state.tar.xz").write_bytes(_tar_xz(state, files))
            pack_state(state, repos["parts"] / "state.parts")
            for name, repo in repos.items():
                sizes[name].append(_commit(repo, step))
            print(f"{step}: " + ", ".join(f"{k} {v[-1]} KiB" for k, v in sizes.items()),
                  flush=True)
        result = {"state": args.state, "held_per_stage": args.hold, "steps": steps,
                  "pack_kib": sizes,
                  "growth_kib": {k: [b - a for a, b in zip(v, v[1:])] for k, v in sizes.items()}}
        (out / "state_growth.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result["growth_kib"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
