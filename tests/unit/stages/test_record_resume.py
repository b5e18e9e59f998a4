"""A killed ``interp record`` resumes with no duplicated or missing shards.

The command runs in a subprocess that SIGKILLs itself in the middle of a shard (the 37th slice
written: two records done, the third half-way through its gen prompt), so nothing of Python's
clean-up runs: exactly what a killed job leaves. The second invocation must record only the
unfinished records, leave every record folder holding exactly the files its index part names,
and give the same tensors as an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from interp.core.io import is_tmp_path, read_json
from interp.models.loading import load_model
from interp.stages import record as stage
from interp.testing import synthetic_probe_run

ROOT = Path(__file__).resolve().parents[3]
KILL_AT = 37
ARGS = ["--dtype", "float32", "--band", "all", "--shard-mb", "0.02", "--layers", "all"]
CHILD = f"""
import os, signal, sys
from interp.store.shards import TensorStreamWriter
calls = [0]
write = TensorStreamWriter.write
def dying_write(self, *a, **k):
    calls[0] += 1
    if calls[0] == {KILL_AT}:
        os.kill(os.getpid(), signal.SIGKILL)
    return write(self, *a, **k)
TensorStreamWriter.write = dying_write
from interp.cli import main
sys.argv = ["interp", "record", "--run", sys.argv[1], *sys.argv[2:]]
main()
"""


def _files(run_path: Path) -> dict[str, list[str]]:
    return {p.parent.name: sorted(f.name for f in p.parent.iterdir())
            for p in (run_path / "record").glob("*/*/index.json")}


def test_killed_record_resumes_without_duplicates_or_gaps(tiny, tmp_path):
    tiny.model.save_pretrained(tmp_path / "model")
    tiny.tokenizer.save_pretrained(tmp_path / "model")
    handle = load_model(str(tmp_path / "model"), device="cpu", dtype="float32")
    run = synthetic_probe_run(tmp_path / "run", handle, n_good=2, n_bad=2)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(run.path), *ARGS], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    parts = sorted((run.path / "record").glob("*/*/index.json"))
    assert len(parts) == 2  # two records finished before the kill
    leftovers = [p for p in (run.path / "record").rglob("*") if is_tmp_path(p)]
    assert leftovers  # the killed writers' temporary shards

    cfg = stage.RecordConfig(dtype="float32", band="all", shard_mb=0.02, figures=False)
    assert stage.record(run, handle, cfg, log=lambda s: None) == 2  # only the unfinished ones
    assert stage.record(run, handle, cfg, log=lambda s: None) == 0
    assert not [p for p in (run.path / "record").rglob("*") if is_tmp_path(p)]
    files = _files(run.path)
    assert len(files) == 4
    for part_path in (run.path / "record").glob("*/*/index.json"):
        part = read_json(part_path)
        named = sorted([*part["shards"], "index.json"])
        assert files[part_path.parent.name] == named  # no duplicated, no missing shard
        n = {t: len(tab) for t, tab in part["tensors"].items()}
        assert n == {"gen": 8, "eval": 8}

    ref = synthetic_probe_run(tmp_path / "ref", handle, n_good=2, n_bad=2)
    stage.record(ref, handle, cfg, log=lambda s: None)
    assert _files(ref.path) == files
    for folder in (run.path / "record").glob("*/*"):
        twin = ref.path / "record" / folder.parent.name / folder.name
        for shard in folder.glob("*.safetensors"):
            got, want = load_file(str(shard)), load_file(str(twin / shard.name))
            assert got.keys() == want.keys()
            for k in got:
                torch.testing.assert_close(got[k], want[k], atol=1e-6, rtol=0, equal_nan=True)
