"""A rank that dies in a sharded Study 1: the rank that waits for it stops in one line.

Two real ``interp asymmetry`` processes, joined as srun or a shell loop would start them
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; no torchrun agent to stop the
group), on a tiny checkpoint; rank 1 is killed while it works. Rank 0 finishes its share,
names rank 1 in one line at the barrier (exit 2) long before the barrier's timeout, and keeps
every record it finished.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from interp.testing import tiny_checkpoint

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_a_killed_rank_is_named_and_the_others_records_are_kept(tmp_path):
    ck = tiny_checkpoint(tmp_path / "ck", n_layers=2)
    out = tmp_path / "run"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "INTERP_HEARTBEAT_STALE_S": "60", "TOKENIZERS_PARALLELISM": "false"}
    args = [sys.executable, "-m", "interp", "asymmetry", "--model", str(ck), "--out", str(out),
            "--dataset", "squad_v2", "--limit", "4", "--max-new-tokens", "4", "--device",
            "cpu", "--n-boot", "20"]
    procs = [subprocess.Popen(args, env={**env, "RANK": str(r)}, cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in (0, 1)]
    beat = out / "shards" / "heartbeats" / "1-of-2.json"
    deadline = time.monotonic() + 300
    while not beat.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert beat.exists(), procs[1].stderr.read() if procs[1].poll() is not None else ""
    os.kill(procs[1].pid, signal.SIGKILL)
    t_kill = time.monotonic()
    stdout, stderr = procs[0].communicate(timeout=600)
    procs[1].wait()
    assert procs[0].returncode == 2, stderr[-3000:]
    err = [x for x in stderr.splitlines() if x.strip()]
    assert err[-1] == (
        f"error: shard 0-of-2: rank 1-of-2 (its process {procs[1].pid} on "
        f"{socket.gethostname()} is gone) died while this process waited at the barrier; "
        f"kept on disk: its records in {out / 'shards' / '0-of-2'}; rerun the missing shards "
        f"with --shard I/2, then interp merge"), stderr[-2000:]
    assert time.monotonic() - t_kill < 300        # not the barrier's 6 h
    recs = [json.loads(x) for x in (out / "shards" / "0-of-2" / "records.jsonl")
            .read_text().splitlines() if x.strip()]
    manifest = json.loads((out / "shards" / "0-of-2" / "manifest.json").read_text())
    assert len(recs) == len(manifest["shard"]["keys"]) > 0       # its whole share is kept
    assert not (out / "metrics.json").exists()                   # nothing merged half
