"""A SIGTERM in the second model's first chunk of a two-model grid keeps what finished.

``interp run`` on the two bundled models (SmolLM2, then Qwen), 4 SQuAD 2.0 records each in one
chunk of 4 batches of 1 (Study 1 only: the cheapest grid whose second model has a chunk with
several judge batches). The signal is sent once Qwen's bar shows 3 of 4 examples: its 4
generations and at least its first two judge batches are done (the generation half of each
example counts 1/2 on the bar, its judge half the other 1/2). Before the signal Qwen has no
record on disk (a chunk is appended at its end); after it, every record whose judge batch
finished is kept, with its one-pass recordings, SmolLM2's run is untouched, and the message
names both run directories with their counts and the command that resumes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")
CONFIG = """
name = "grid"
[asymmetry]
models = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]
datasets = ["squad_v2"]
limit = 4
batch_size = 1
chunk_batches = 4
max_new_tokens = 8
n_boot = 20
"""


def _records(path: Path) -> list[str]:
    f = path / "records.jsonl"
    return [x for x in f.read_text().splitlines() if x.strip()] if f.exists() else []


def test_sigterm_in_the_second_models_first_chunk_keeps_its_finished_records(tmp_path):
    cfg = tmp_path / "grid.toml"
    cfg.write_text(CONFIG)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
           "INTERP_PROGRESS": "bar"}  # a bar frame per step, and the log lines between them
    argv = [sys.executable, "-m", "interp.cli", "run", str(cfg), "--out", str(out)]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(iter(lambda: proc.stdout.read(1), "")),
                              daemon=True)
    reader.start()
    smol, qwen = (out / m for m in MODELS)
    deadline = time.monotonic() + 900
    while True:  # Qwen's bar at 3/4: two of its judge batches at least have finished
        text = "".join(err)
        starts = text.split("answers and judges")  # Study 1's first line, once per model
        tail = starts[2] if len(starts) == 3 else ""
        if re.search(r"squad_v2:[^\r\n]*\b3/4\b", tail):
            break
        assert proc.poll() is None and time.monotonic() < deadline, text[-3000:]
        time.sleep(0.05)
    before = {m: len(_records(out / m)) for m in MODELS}
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
    reader.join(timeout=10)
    text = "".join(err)
    assert proc.returncode == 128 + signal.SIGTERM, text[-3000:]
    after = {m: len(_records(out / m)) for m in MODELS}
    print(f"records on disk before the signal {before}, after {after}")
    assert before == {MODELS[0]: 4, MODELS[1]: 0}
    assert after[MODELS[0]] == 4 and 2 <= after[MODELS[1]] <= 4
    assert (smol / "metrics.json").exists() and not (qwen / "metrics.json").exists()
    # the one pass's recordings of each kept record
    assert len(list((qwen / "attention" / "records").rglob("*.safetensors"))) == after[MODELS[1]]
    lines = text.strip().splitlines()[-4:]
    assert lines[0] == "interrupted; finished work kept in each run directory:", lines
    assert lines[1] == f"  4 records, 4 attention recordings, 2 probe feature caches in {smol}"
    n = after[MODELS[1]]
    assert lines[2] == f"  {n} records, {n} attention recordings, 2 probe feature caches in {qwen}"
    assert lines[3] == f"resume with: interp run {cfg} --out {out}"
