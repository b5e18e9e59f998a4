"""Runs split over processes leave the run an unsharded run leaves (bundled SmolLM2, 10 records).

The records are the first 10 SQuAD 2.0 validation questions (one per passage) with contexts cut
to their first 300 characters (:func:`interp.testing.rehearsal_datasets`): every run below
reads the same file, and shorter prompts cost every process less.

One unsharded ``interp run`` of a small config (Study 1 with its one pass, attention, probe,
steering) is the reference. Then, each against it: ``torchrun --nproc_per_node 2 -m interp
run`` of the same config (each process steers its share of the steering stage's records);
``torchrun ... -m interp asymmetry`` with the same settings; and
``--shard 0/2`` (killed after its first chunk, then rerun) + ``--shard 1/2`` + ``interp
merge``. Every process runs one torch thread. Answers, verdicts and every record field are
identical; ``logit_diff``, span masses, stage numbers and ``metrics.json`` floats agree within
1e-5 (a shard's batches hold other prompts, so padding moves the last bits, as a change of
``batch_size`` would); counts and strings are identical.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from interp.run.pipeline import run_config
from interp.testing import rehearsal_datasets

pytestmark = pytest.mark.integration

SLUG = "smollm2-135m-instruct"
ASYM = {"limit": 10, "batch_size": 2, "max_new_tokens": 16}
"""The settings of ``interp asymmetry`` in :func:`_asym_args` (the rest are its defaults; the
dataset is the file of the ``squad`` fixture)."""
STAGES = {"attention": {"band": "last8", "n_boot": 100},
          "probe": {"tasks": ["eval"], "folds": 2, "probes": ["logreg"], "top_k": 1,
                    "layers": [10, 20, 29]},
          "steering": {"alphas": [0.5, 1.0, 2.0], "band": "last8", "tasks": ["eval"], "limit": 2,
                       "max_new_tokens": 8, "n_boot": 100}}
REPO = Path(__file__).resolve().parents[2]


def _toml(path: Path, out: Path, data: str) -> Path:
    def val(v):
        return json.dumps(v)
    lines = [f'name = "shards"\nout = "{out}"\n[asymmetry]']
    lines += [f"{k} = {val(v)}" for k, v in {"datasets": [data], **ASYM}.items()]
    for name, table in STAGES.items():
        lines += [f"[{name}]", *(f"{k} = {val(v)}" for k, v in table.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
            "TOKENIZERS_PARALLELISM": "false"}


def _interp(*args: str, torchrun: bool = False, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    exe = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", "2"] if torchrun else [sys.executable]
    res = subprocess.run([*exe, "-m", "interp", *args], env=env or _env(), cwd=REPO,
                         capture_output=True, text=True, timeout=900)
    if check and res.returncode:
        raise AssertionError(f"exit {res.returncode}: {res.stderr[-3000:]}")
    return res


def _asym_args(out: Path, data: str) -> list[str]:
    return ["asymmetry", "--dataset", data, "--limit", "10", "--batch-size", "2",
            "--max-new-tokens", "16", "--out", str(out)]


def _records(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "records.jsonl").read_text().splitlines() if x.strip()]


def _close(a, b, where: str, tol: float = 1e-5) -> None:
    """Equal, floats within ``tol`` (relative for large ones).

    A steering effect ``vs_alpha1`` is the difference of two numbers that each agree within
    ``tol``, so it agrees within ``2 * tol`` (CI's run moved one by 1.7e-5).
    """
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}", 2 * tol if k == "vs_alpha1" else tol)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]", tol)
    elif isinstance(a, float) and not isinstance(b, bool):
        assert isinstance(b, float | int) and b == pytest.approx(a, rel=tol, abs=tol), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_run(ref: Path, got: Path, stages: bool = False) -> None:
    """Records, metrics, one-pass parts (and stage summaries) of two run directories agree."""
    ra, rb = _records(ref), _records(got)
    assert [(r["dataset"], r["id"]) for r in ra] == [(r["dataset"], r["id"]) for r in rb]
    for x, y in zip(ra, rb):
        for k in ("answer", "generation", "verdict", "verdict_text", "oracle_label", "status"):
            assert x.get(k) == y.get(k), (x["id"], k)
        _close(x, y, f"record {x['id']}")
    _close(json.loads((ref / "metrics.json").read_text()),
           json.loads((got / "metrics.json").read_text()), "metrics.json")
    parts = sorted((ref / "attention/records").rglob("*.safetensors"))
    assert len(parts) == len([r for r in ra if r["status"] == "ok"]) > 0
    for p in parts:
        a, b = load_file(p), load_file(got / p.relative_to(ref))
        for k in a:
            np.testing.assert_allclose(b[k].numpy(), a[k].numpy(), atol=1e-5, err_msg=str(p))
    fa = load_file(ref / "probes/features_eval.safetensors")
    fb = load_file(got / "probes/features_eval.safetensors")
    for k in fa:
        # pooled residual streams (not normalised): padding moves them by up to ~3e-5
        np.testing.assert_allclose(fb[k].numpy(), fa[k].numpy(), atol=1e-4, rtol=1e-4)
    if stages:
        for f in ("attention/summary.json", "probes/results.json", "steering/summary.json"):
            a, b = (json.loads((d / f).read_text()) for d in (ref, got))
            for drop in ("elapsed_s", "wall_s", "seconds", "created", "run"):
                a.pop(drop, None)
                b.pop(drop, None)
            _close(a, b, f)


@pytest.fixture(scope="module")
def squad(tmp_path_factory) -> str:
    """The 10 SQuAD 2.0 records (contexts cut to 300 characters) every run here reads."""
    root = tmp_path_factory.mktemp("squad")
    return rehearsal_datasets(root, n=10, max_chars=300, names=("squad_v2",))["squad_v2"]


@pytest.fixture(scope="module")
def reference(squad, tmp_path_factory):
    """The unsharded run of the config: ``out/<model>/``."""
    root = tmp_path_factory.mktemp("unsharded")
    run_config(_toml(root / "cfg.toml", root / "out", squad), log=lambda s: None)
    return root / "out" / SLUG


def test_torchrun_interp_run_equals_unsharded(reference, squad, tmp_path):
    cfg = _toml(tmp_path / "cfg.toml", tmp_path / "out", squad)
    res = _interp("run", str(cfg), torchrun=True)
    for i in (0, 1):  # each process steered its share (a passage) of the 2 steered records
        assert f"== stage steering: 1 parts made by {i}-of-2" in res.stdout, res.stdout[-3000:]
    got = tmp_path / "out" / SLUG
    assert sorted(p.name for p in (got / "shards").iterdir()) == ["0-of-2", "1-of-2",
                                                                  "heartbeats"]
    assert sorted(p.name for p in (got / "shards" / "heartbeats").iterdir()) == [
        "0-of-2.json", "1-of-2.json"]
    m = json.loads((got / "manifest.json").read_text())
    assert [s["name"] for s in m["shards"]] == ["0-of-2", "1-of-2"]
    assert [s["launcher"] for s in m["shards"]] == ["torchrun", "torchrun"]
    assert sum(s["records"] for s in m["shards"]) == 10 and "shard" not in m
    assert_same_run(reference, got, stages=True)
    assert (tmp_path / "out" / "summary.json").exists()


def test_torchrun_asymmetry_equals_unsharded(reference, squad, tmp_path):
    _interp(*_asym_args(tmp_path / "run", squad), torchrun=True)
    assert_same_run(reference, tmp_path / "run")


def test_killed_shard_resumes_and_merge_equals_unsharded(reference, squad, tmp_path):
    out = tmp_path / "run"
    shard0 = out / "shards" / "0-of-2"
    cmd = [sys.executable, "-m", "interp", *_asym_args(out, squad), "--shard", "0/2"]
    proc = subprocess.Popen(cmd, env=_env(), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:  # kill after the first chunk
        if (shard0 / "records.jsonl").exists() and (shard0 / "records.jsonl").read_text():
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.2)
    proc.wait()
    kept = _records(shard0)
    assert 0 < len(kept) < len(json.loads((shard0 / "manifest.json").read_text())
                               ["shard"]["keys"]), "the kill should leave a shard unfinished"
    refused = _interp("merge", str(shard0), str(out / "shards" / "1-of-2"), "--out",
                      str(out), check=False)
    assert refused.returncode == 2  # shard 1 does not exist yet
    _interp(*_asym_args(out, squad), "--shard", "1/2")
    unfinished = _interp("merge", str(shard0), str(out / "shards" / "1-of-2"), "--out",
                         str(out), check=False)
    assert unfinished.returncode == 2 and "0-of-2 is unfinished" in unfinished.stderr
    assert len(unfinished.stderr.strip().splitlines()) == 1
    _interp(*_asym_args(out, squad), "--shard", "0/2")  # the same command resumes
    rec0 = _records(shard0)
    assert [r["id"] for r in rec0[:len(kept)]] == [r["id"] for r in kept]
    assert len({r["id"] for r in rec0}) == len(rec0)  # nothing done twice
    other = _interp(*_asym_args(out, squad), "--shard", "0/3", check=False)
    assert other.returncode == 2 and "holds shards of 2" in other.stderr
    _interp("merge", str(shard0), str(out / "shards" / "1-of-2"), "--out", str(out))
    assert_same_run(reference, out)
    # the merged run is an ordinary run: an unsharded rerun of the same command has nothing
    # left to do and changes no record
    before = (out / "records.jsonl").read_text()
    _interp(*_asym_args(out, squad))
    assert (out / "records.jsonl").read_text() == before
    shutil.rmtree(out / "shards")


def test_an_incomplete_launcher_environment_is_refused_before_any_work(squad, tmp_path):
    """A process started with part of torchrun's variables stops at once, in one line.

    ``WORLD_SIZE=2`` without ``RANK`` made every process claim shard 0; ``RANK`` without the
    rendezvous address did its records, then died at the barrier with a ValueError. Both
    commands that shard (``interp asymmetry``, ``interp run``) are refused before any
    output exists; every combination of the variables is in tests/unit/launch/test_launch.py.
    """
    env = {k: v for k, v in _env().items() if k not in
           ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    cases = [(_asym_args(tmp_path / "run", squad), {"WORLD_SIZE": "2"},
              "RANK, MASTER_ADDR and MASTER_PORT are not"),
             (["run", str(_toml(tmp_path / "c.toml", tmp_path / "out", squad))],
              {"WORLD_SIZE": "2", "RANK": "1"}, "MASTER_ADDR and MASTER_PORT are not")]
    for cmd, have, named in cases:
        res = _interp(*cmd, check=False, env={**env, **have})
        assert res.returncode == 2, res.stderr[-2000:]
        assert named in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()


def test_a_rank_that_never_arrives_ends_the_wait_and_keeps_the_shard(squad, tmp_path):
    """Rank 0 of 2 under torchrun's variables, rank 1 never started (as if killed at once).

    Under a launcher without torchrun's agent (srun, a Kubernetes job, a shell loop) nothing
    stops the group, and the barrier waited a day; now it waits INTERP_BARRIER_TIMEOUT_S
    (here 5 s), then says so in one line, and rank 0's finished records stay on disk.
    """
    import socket

    with socket.socket() as sock:                      # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**_env(), "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "INTERP_BARRIER_TIMEOUT_S": "5"}
    args = [a if a != "10" else "2" for a in _asym_args(tmp_path / "run", squad)]  # --limit 2
    t0 = time.time()
    res = _interp(*args, check=False, env=env)
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()          # progress lines, then the error
    err = [line for line in lines if line.startswith("error:")]
    assert len(err) == 1 and lines[-1] == err[0], lines
    assert "did not reach the barrier within 5 s" in err[0], err
    assert "0-of-2" in err[0] and "--shard I/2" in err[0]
    shard0 = tmp_path / "run" / "shards" / "0-of-2"
    kept, owned = _records(shard0), json.loads((shard0 / "manifest.json").read_text())["shard"]
    assert len(kept) == len(owned["keys"]) > 0 and all(r["status"] == "ok" for r in kept)
    assert time.time() - t0 < 300
