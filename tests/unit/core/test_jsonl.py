"""JSONL that survives a kill and any text: every JSONL reader and writer of the package."""

from __future__ import annotations

import json
import warnings

import pytest

from interp.core.io import read_jsonl, write_jsonl, write_jsonl_once
from interp.core.jsonl import json_line, parse_jsonl
from interp.store.rundir import RunDir

ODD = "line\u2028sep para\u2029sep next\x85line form\x0cfeed vt\x0b gs\x1d 東京 🗼"


def _rec(i, text=ODD):
    return {"id": f"q{i}", "dataset": "squad_v2", "status": "ok", "context": text}


def test_line_separators_inside_strings_read_back_unchanged(tmp_path):
    run = RunDir(tmp_path / "run")
    run.append_records([_rec(1), _rec(2)])
    raw = run.records_path.read_bytes()
    assert raw.count(b"\n") == 2 and "\u2028".encode() not in raw      # written escaped
    assert [r["context"] for r in run.read_records()] == [ODD, ODD]
    assert len(ODD.splitlines()) > 1                                     # the fault's cause
    write_jsonl(tmp_path / "t.jsonl", [_rec(3)])
    assert read_jsonl(tmp_path / "t.jsonl") == [_rec(3)]
    # a file written by another tool with the raw characters reads back too
    (tmp_path / "raw.jsonl").write_text(json.dumps(_rec(4), ensure_ascii=False) + "\n",
                                        encoding="utf-8")
    assert read_jsonl(tmp_path / "raw.jsonl") == [_rec(4)]


def test_user_data_file_with_line_separators_loads(tmp_path):
    from interp.data import load_examples

    p = tmp_path / "my_qa.jsonl"
    rows = [{"id": f"u{i}", "question": "Where is it?", "context": f"It is in Paris.{ODD}",
             "answers": ["Paris"]} for i in range(2)]
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                 encoding="utf-8")
    exs = load_examples(str(p))
    assert [e.id for e in exs] == ["u0", "u1"] and exs[0].context.endswith(ODD)


def test_last_line_that_lost_only_its_newline_is_kept(tmp_path):
    run = RunDir(tmp_path / "run")
    run.append_records([_rec(1), _rec(2)])
    run.records_path.write_bytes(run.records_path.read_bytes()[:-1])   # killed before "\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                   # nothing torn
        assert [r["id"] for r in run.read_records()] == ["q1", "q2"]
    run.append_records([_rec(3)])
    assert [r["id"] for r in run.read_records()] == ["q1", "q2", "q3"]


@pytest.mark.parametrize("cut", ["inside_utf8", "inside_json"])
def test_torn_tail_is_reported_and_repaired_with_nothing_finished_lost(tmp_path, cut):
    run = RunDir(tmp_path / "run")
    run.append_records([_rec(1), _rec(2, "東京")])
    data = run.records_path.read_bytes()
    start = data.rindex("東".encode())
    end = start + 1 if cut == "inside_utf8" else start + 3              # mid-character / after
    run.records_path.write_bytes(data[:end])
    with pytest.warns(UserWarning, match=r"records.jsonl:2: incomplete last line dropped"):
        assert [r["id"] for r in run.read_records()] == ["q1"]
    run.append_records([_rec(2, "東京")])                               # redone
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r["context"] for r in run.read_records()] == [ODD, "東京"]


def test_a_damaged_middle_line_is_an_error_naming_it(tmp_path):
    from interp.core.errors import RunDirError

    run = RunDir(tmp_path / "run")
    run.append_records([_rec(1), _rec(2)])
    lines = run.records_path.read_bytes().split(b"\n")
    run.records_path.write_bytes(b"\n".join([lines[0][:-3], *lines[1:]]))
    with pytest.raises(RunDirError, match=r"records.jsonl:1: (malformed JSON|not UTF-8)"):
        run.read_records()


def test_parse_jsonl_contract():
    got = parse_jsonl(json_line({"a": ODD}).encode() + b'{"b": 1}')
    assert got.rows == [(1, {"a": ODD}), (2, {"b": 1})] and got.ends_without_newline
    torn = parse_jsonl(b'{"a": 1}\n{"b": "\xe6\x9d')
    assert torn.rows == [(1, {"a": 1})] and torn.torn == 2 and torn.torn_offset == 9
    assert "not UTF-8" in torn.torn_reason


HOLDER = """
import sys, time
from interp.store.rundir import RunDir
with RunDir(sys.argv[1]).writer():
    print("holding", flush=True)
    time.sleep(120)
"""


def test_two_processes_one_run_dir_second_writer_refused_then_lock_freed_by_death(
        tiny, tmp_path):
    """Another process holds the run: a second writer is refused naming it, writes nothing.

    Once the holder is killed (no clean release) the lock is free again, not stale.
    """
    import os
    import signal
    import subprocess
    import sys

    from interp.core.errors import RunDirError
    from interp.stages.asymmetry import AsymmetryConfig
    from interp.stages.asymmetry import run as run_asymmetry

    out = tmp_path / "run"
    cfg = AsymmetryConfig(model="tiny-llama", datasets=["squad_v2"], limit=2, batch_size=2,
                          max_new_tokens=3, verdict_max_new_tokens=2, n_boot=20)
    run_asymmetry(out, tiny, cfg, log=lambda s: None)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        before = (out / "records.jsonl").read_bytes()
        cfg.limit = 3
        with pytest.raises(RunDirError, match=rf"^{out} is being written by pid {holder.pid} "
                                              rf"on .*: wait for it to finish, or use another"):
            run_asymmetry(out, tiny, cfg, log=lambda s: None)
        assert (out / "records.jsonl").read_bytes() == before          # nothing written
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    run_asymmetry(out, tiny, cfg, log=lambda s: None)           # the dead holder's lock
    ids = [r["id"] for r in RunDir(out).read_records()]
    assert len(ids) == len(set(ids)) == 3


def test_reading_never_trusts_a_repeated_id(tmp_path):
    run = RunDir(tmp_path / "run")
    run.append_records([_rec(1, "old"), _rec(2), _rec(1, "new"), _rec(3)])
    with pytest.warns(UserWarning, match="1 line.s. repeat a record id"):
        recs = run.read_records()
    assert [(r["id"], r["context"]) for r in recs] == [("q2", ODD), ("q1", "new"), ("q3", ODD)]


def test_second_dataset_into_one_out_is_said_and_user_fields_are_kept(tiny, tmp_path):
    from interp.stages.asymmetry import AsymmetryConfig
    from interp.stages.asymmetry import run as run_asymmetry

    data = tmp_path / "my_qa.jsonl"
    data.write_text("".join(json.dumps(
        {"id": f"u{i}", "question": "Where is it?", "context": "It is in Paris.",
         "answers": ["Paris"], "source_url": f"https://example.org/{i}", "grader": "ann"})
        + "\n" for i in range(2)), encoding="utf-8")
    out, said = tmp_path / "run", []
    kw = dict(model="tiny-llama", limit=2, batch_size=2, max_new_tokens=3,
              verdict_max_new_tokens=2, n_boot=20)
    run_asymmetry(out, tiny, AsymmetryConfig(datasets=[str(data)], **kw), log=said.append)
    recs = RunDir(out).read_records()
    assert [r["extras"]["source_url"] for r in recs] == ["https://example.org/0",
                                                         "https://example.org/1"]
    assert {r["extras"]["grader"] for r in recs} == {"ann"}
    assert not any("adding" in s for s in said)
    run_asymmetry(out, tiny, AsymmetryConfig(datasets=["squad_v2"], **kw),
                  log=said.append)
    assert any(f"{out} holds a run on {data}: adding squad_v2 to it" in s for s in said)
    assert {r["dataset"] for r in RunDir(out).read_records()} == {"my_qa", "squad_v2"}


def test_write_once_keeps_the_first_writers_whole_file(tmp_path):
    """Processes that make the same file at once: the first whole file stays, no temporary left."""
    path = tmp_path / "hard_negatives.jsonl"
    assert write_jsonl_once(path, [{"id": "a", "n": 1}, {"id": "b", "n": 2}]) is True
    assert write_jsonl_once(path, [{"id": "a", "n": 9}]) is False
    assert read_jsonl(path) == [{"id": "a", "n": 1}, {"id": "b", "n": 2}]
    assert [p.name for p in tmp_path.iterdir()] == ["hard_negatives.jsonl"]
