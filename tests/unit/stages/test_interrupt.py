"""An interrupt keeps every record that finished before it, and says what each run kept.

* Ctrl-C in the second judge batch of a chunk: the chunk's first batch is appended (records,
  attention recordings, probe features), equal to an uninterrupted run's; the same call again
  finishes the rest, each record once.
* Ctrl-C in the probe stage's feature extraction: the finished batches' rows are cached.
* The message names each run directory of a grid with what it kept (0 records too), then the
  command that resumes; a SIGTERM is turned into the same interrupt.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from safetensors import safe_open

from interp.cli import _catch_sigterm, _restore_sigterm, interrupted_message
from interp.core.errors import Interrupted
from interp.core.io import read_jsonl
from interp.judging import prefill
from interp.judging import residual_features as rf
from interp.stages import probe as probe_stage
from interp.stages.asymmetry import AsymmetryConfig
from interp.stages.asymmetry import run as run_asymmetry
from interp.store.rundir import RunDir

QUIET = {"log": lambda s: None}


def _cfg(**kw) -> AsymmetryConfig:
    return AsymmetryConfig(model="tiny-llama", datasets=["squad_v2"], limit=6, batch_size=2,
                           max_new_tokens=4, verdict_max_new_tokens=3, n_boot=20, **kw)


def _stop_at(monkeypatch, module, name: str, call: int) -> list[int]:
    """Raise KeyboardInterrupt at the ``call``-th call of ``module.name`` (1-based)."""
    real, calls = getattr(module, name), [0]

    def wrapped(*a, **kw):
        calls[0] += 1
        if calls[0] == call:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(module, name, wrapped)
    return calls


def _feature_keys(run, task: str) -> list[str]:
    with safe_open(str(run / "probes" / f"features_{task}.safetensors"), "pt") as f:
        return json.loads(f.metadata()["keys"])


def test_ctrl_c_in_a_judge_batch_keeps_the_chunks_finished_records(tiny, tmp_path, monkeypatch):
    want = tmp_path / "whole"
    run_asymmetry(want, tiny, _cfg(), chunk=6, **QUIET)  # the same batches
    ref = {r["id"]: r for r in read_jsonl(want / "records.jsonl")}

    out = tmp_path / "cut"
    # one chunk of 3 batches: the generator's 3 batches run first, then the judge's; the
    # verdict-reply scoring runs once per judge batch: stop in the second one
    with monkeypatch.context() as m:
        calls = _stop_at(m, prefill, "continuation_logprobs", 2)
        with pytest.raises(Interrupted) as got:
            run_asymmetry(out, tiny, _cfg(), chunk=6, **QUIET)
    assert calls[0] == 2
    kept = read_jsonl(out / "records.jsonl")
    assert len(kept) == 2 and len([r for r in got.value.done if r is not None]) == 2
    for r in kept:  # the same records an uninterrupted run makes
        assert r["status"] == "ok"
        for k in ("answer", "generation", "verdict", "verdict_text", "oracle_label",
                  "logprob_correct", "logprob_incorrect", "prompts"):
            assert r[k] == ref[r["id"]][k], k
    keys = sorted(f"squad_v2/{r['id']}" for r in kept)
    assert sorted(_feature_keys(out, "eval")) == sorted(_feature_keys(out, "gen")) == keys
    assert len(list((out / "attention" / "records").rglob("*.safetensors"))) == 2

    run_asymmetry(out, tiny, _cfg(), chunk=6, **QUIET)  # the same call finishes the rest
    ids = [r["id"] for r in read_jsonl(out / "records.jsonl")]
    assert sorted(ids) == sorted(ref) and len(ids) == 6
    assert len(_feature_keys(out, "eval")) == 6


def test_ctrl_c_while_generating_keeps_no_half_record(tiny, tmp_path, monkeypatch):
    """Before the judging no record is finished: nothing is appended, nothing is lost."""
    out = tmp_path / "cut"
    with monkeypatch.context() as m:
        _stop_at(m, prefill, "_decode", 2)
        with pytest.raises(Interrupted) as got:
            run_asymmetry(out, tiny, _cfg(), chunk=6, **QUIET)
    assert got.value.done == [None] * 6
    assert read_jsonl(out / "records.jsonl") == []


def test_ctrl_c_in_the_probe_features_keeps_the_finished_batches(tiny, tmp_path, monkeypatch):
    run_asymmetry(tmp_path, tiny, _cfg(one_pass=False), **QUIET)
    run = RunDir(tmp_path)
    recs = run.read_records()
    with monkeypatch.context() as m:
        _stop_at(m, rf, "residual_stream", 3)  # batches of 2: the first 2 finished
        with pytest.raises(Interrupted):
            probe_stage.cached_features(run, tiny, recs, "eval", batch_size=2, **QUIET)
    assert len(_feature_keys(tmp_path, "eval")) == 4
    _, info = probe_stage.cached_features(run, tiny, recs, "eval", batch_size=2, **QUIET)
    assert info["n_computed"] == 2 and len(_feature_keys(tmp_path, "eval")) == 6


def _run_dir(path, n_records: int):
    path.mkdir(parents=True)
    (path / "manifest.json").write_text("{}")
    (path / "records.jsonl").write_text("".join(f'{{"id": "q{i}"}}\n' for i in range(n_records)))
    return path


def test_the_message_names_each_run_of_a_grid_and_the_resume(tmp_path):
    a, b = _run_dir(tmp_path / "smol", 26), _run_dir(tmp_path / "qwen", 0)
    argv = ["interp", "run", "experiments/first.toml"]
    assert interrupted_message([a, b, tmp_path / "third"], argv).splitlines() == [
        "interrupted; finished work kept in each run directory:",
        f"  26 records in {a}",
        f"  0 records in {b}",
        "resume with: interp run experiments/first.toml"]
    # the grid folder itself, watched last: its other run directories (cross-judged) follow
    x = _run_dir(tmp_path / "cross", 5)
    assert interrupted_message([a, b, tmp_path], argv).splitlines()[1:4] == [
        f"  26 records in {a}", f"  0 records in {b}", f"  5 records in {x}"]
    # one run directory: one line
    assert interrupted_message([a], argv) == (f"interrupted: kept 26 records in {a}; resume "
                                              f"with: interp run experiments/first.toml")
    assert interrupted_message([tmp_path / "third"], argv).startswith("interrupted: kept nothing")


def test_sigterm_becomes_an_interrupt_and_its_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    caught = _catch_sigterm()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before the next line
            raise AssertionError("SIGTERM did not interrupt")
        assert caught[0] == signal.SIGTERM
    finally:
        _restore_sigterm(caught)
    assert signal.getsignal(signal.SIGTERM) is before


def test_ctrl_c_while_judging_another_runs_answers_keeps_the_finished_ones(tiny, tmp_path,
                                                                           monkeypatch):
    """A cross-judged run (``answers_from``) keeps its finished records with their source."""
    src = tmp_path / "src"
    run_asymmetry(src, tiny, _cfg(), **QUIET)
    out = tmp_path / "cross"
    with monkeypatch.context() as m:
        _stop_at(m, prefill, "continuation_logprobs", 2)
        with pytest.raises(Interrupted):
            run_asymmetry(out, tiny, _cfg(answers_from=str(src)), chunk=6, **QUIET)
    kept = read_jsonl(out / "records.jsonl")
    assert len(kept) == 2
    assert all(r["answer_source"]["run"] == str(src) for r in kept), kept[0]["answer_source"]
    run_asymmetry(out, tiny, _cfg(answers_from=str(src)), chunk=6, **QUIET)
    assert len(read_jsonl(out / "records.jsonl")) == 6


def test_the_resume_names_the_script_that_ran_when_it_is_not_on_path(tmp_path, monkeypatch):
    from interp.cli import invoked_as

    script = tmp_path / "venv" / "bin" / "interp"   # make demo's .venv/bin/interp, not active
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert invoked_as(str(script)) == ["venv/bin/interp"]
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin")       # the one on PATH
    assert invoked_as(str(script)) == ["interp"]
    assert invoked_as("/x/site-packages/interp/cli.py") == ["interp"]   # python -m interp.cli
