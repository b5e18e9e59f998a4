"""Shard identity and record assignment (interp.launch), and merging shards (interp.stages.merge).

The merges here join hand-made shard directories (manifests, records, per-record parts and a
rows-keyed feature cache), so no model runs; the bundled-model runs are in
``tests/integration/test_shards_bundled.py``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from interp.core.errors import ShardError
from interp.core.io import read_json, save_tensors, write_json, write_jsonl
from interp.data import QAExample, passage_key
from interp.launch import Shard, assign, check_count, current_shard, parse_shard
from interp.stages.common import own_share, share_of_records
from interp.stages.merge import merge_shards


def test_shard_from_the_launchers():
    assert current_shard(env={}) is None
    assert current_shard(env={"WORLD_SIZE": "1", "RANK": "0"}) is None
    rdv = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    s = current_shard(env={"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "0", **rdv})
    assert (s.index, s.count, s.launcher, s.local_rank, s.joined) == (2, 4, "torchrun", 0, True)
    s = current_shard(env={"SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_ID": "11",
                           "SLURM_ARRAY_TASK_MIN": "10"})
    assert (s.index, s.count, s.launcher, s.joined) == (1, 3, "slurm", False)
    s = current_shard("1/2", env={"WORLD_SIZE": "4", "RANK": "3"})  # --shard wins
    assert (s.index, s.count, s.launcher, s.name) == (1, 2, "--shard", "1-of-2")
    assert s.dir("runs/x") == Path("runs/x/shards/1-of-2")
    assert current_shard("0/1") is None
    for bad in ("2/2", "1", "a/b", "0/0", "-1/2"):
        with pytest.raises(ShardError, match="--shard"):
            parse_shard(bad)
    with pytest.raises(ShardError, match="outside"):
        current_shard(env={"WORLD_SIZE": "2", "RANK": "5", **rdv})
    for env, named in (({"WORLD_SIZE": "2", **rdv}, "RANK is not"),
                       ({"WORLD_SIZE": "2", "RANK": "1"}, "MASTER_ADDR and MASTER_PORT are not"),
                       ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "h"}, "MASTER_PORT is"),
                       ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a whole number")):
        with pytest.raises(ShardError, match=named):
            current_shard(env=env)


def test_device_follows_the_local_rank():
    s = Shard(3, 4, "torchrun", local_rank=1)
    if torch.cuda.is_available():
        assert s.device() == f"cuda:{1 % torch.cuda.device_count()}"
    else:
        assert s.device() is None and s.device("cpu") == "cpu"
    assert s.device("cuda:0") == "cuda:0"  # an explicit index is kept


def _examples(n: int, per_passage: int = 2, dataset: str = "squad_v2") -> list[QAExample]:
    return [QAExample(id=f"{dataset}{i}", dataset=dataset, context=f"passage {i // per_passage}",
                      question=f"q{i}", answers=("a",), answerable=True, split="validation")
            for i in range(n)]


def test_assignment_keeps_passages_together_and_covers_every_record_once():
    loaded = {"squad_v2": _examples(9, 3), "drop": _examples(4, 1, "drop")}
    parts = [assign(loaded, Shard(i, 3)) for i in range(3)]
    positions = sorted(p for _, pos, _ in parts for p in pos)
    assert positions == list(range(13)) and all(t == 13 for *_, t in parts)
    for owned, pos, _ in parts:
        flat = [ex for exs in owned.values() for ex in exs]
        everything = [ex for exs in loaded.values() for ex in exs]
        assert [everything[p] for p in pos] == flat  # global order kept
    passages = [{passage_key(ex) for exs in o.values() for ex in exs} for o, _, _ in parts]
    assert not (passages[0] & passages[1]) and not (passages[1] & passages[2])
    # 3 squad passages then 4 drop passages, dealt round-robin: 3 + 2 + 2 passages
    assert [len(p) for p in passages] == [3, 2, 2]
    # a larger limit keeps every earlier record in its shard
    more = {"squad_v2": _examples(12, 3), "drop": _examples(4, 1, "drop")}
    for i, (owned, _, _) in enumerate(parts):
        now = assign(more, Shard(i, 3))[0]
        assert {e.id for e in now["squad_v2"]} >= {e.id for e in owned["squad_v2"]}


def _record(i: int) -> dict:
    return {"id": f"r{i}", "dataset": "squad_v2", "status": "ok", "model": "m",
            "template": "default", "context": f"passage {i // 2}", "question": f"q{i}",
            "answers": ["a"], "answer": "a", "oracle_label": i % 2 == 0,
            "verdict": i % 3 == 0, "verdict_source": "word", "logit_diff": 0.1 * i - 0.3,
            "p_correct": 0.4 + 0.02 * i, "verdict_coverage": 0.3,
            "logprob_correct": -1.0, "logprob_incorrect": -1.2}


def _make_shards(root: Path, n: int = 2, total: int = 6) -> list[Path]:
    """Shards of ``total`` records over ``n`` shards, as asymmetry writes them."""
    records = [_record(i) for i in range(total)]
    config = {"model": "m", "datasets": ["squad_v2"], "limit": total, "template": "default",
              "seed": 0, "n_boot": 50, "device": None}
    dirs = []
    for s in range(n):
        mine = [i for i in range(total) if (i // 2) % n == s]
        d = root / "shards" / f"{s}-of-{n}"
        manifest = {"config": {**config, "device": f"cuda:{s}"},
                    "model": {"spec": "m", "sha256": "ab" * 32},
                    "result_facts": {"dtype": "float32", "device": "cpu"},
                    "stages": {"attention": {"result_facts": {"dtype": "float32"}}},
                    "shard": Shard(s, n, "--shard").provenance(
                        [f"squad_v2/r{i}" for i in mine], mine, total)}
        write_json(d / "manifest.json", manifest)
        write_jsonl(d / "records.jsonl", [records[i] for i in mine])
        for i in mine:  # a per-record part
            save_tensors(d / "attention/records/squad_v2" / f"r{i}.safetensors",
                         {"mass.eval": torch.full((2, 3), float(i))}, {"signature": "s"})
        keys = [f"squad_v2/r{i}" for i in reversed(mine)]  # rows in any order
        save_tensors(d / "probes/features_eval.safetensors",
                     {"mean": torch.tensor([[float(k[-1])] for k in keys])},
                     {"signature": "feat", "keys": json.dumps(keys),
                      "prompt_sigs": json.dumps([f"p{k[-1]}" for k in keys]),
                      "candidate_fallback": json.dumps(keys[:1]), "pools": '["mean"]'})
        dirs.append(d)
    return dirs


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_merge_joins_shards_in_the_unsharded_order(tmp_path):
    dirs = _make_shards(tmp_path)
    out = tmp_path / "merged"
    metrics = merge_shards(dirs, out, log=lambda s: None)
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert [r["id"] for r in recs] == [f"r{i}" for i in range(6)]
    assert metrics["overall"]["n"] == 6 and (out / "metrics.json").exists()
    assert sorted(p.name for p in (out / "attention/records/squad_v2").iterdir()) == [
        f"r{i}.safetensors" for i in range(6)]
    from safetensors import safe_open

    with safe_open(str(out / "probes/features_eval.safetensors"), "pt") as f:
        meta, mean = f.metadata(), f.get_tensor("mean")
    assert json.loads(meta["keys"]) == [f"squad_v2/r{i}" for i in range(6)]
    assert json.loads(meta["prompt_sigs"]) == [f"p{i}" for i in range(6)]
    assert mean[:, 0].tolist() == [float(i) for i in range(6)]  # rows follow their keys
    assert sorted(json.loads(meta["candidate_fallback"])) == ["squad_v2/r3", "squad_v2/r5"]
    assert meta["signature"] == "feat"
    m = read_json(out / "manifest.json")
    assert "shard" not in m and [s["name"] for s in m["shards"]] == ["0-of-2", "1-of-2"]
    assert [s["records"] for s in m["shards"]] == [4, 2] and m["merged"]["records"] == 6


def _edit(d: Path, fn) -> None:
    m = read_json(d / "manifest.json")
    fn(m)
    write_json(d / "manifest.json", m)


@pytest.mark.parametrize("case, message", [
    ("config", "another config than 0-of-2 (template: 'default' vs 'matched')"),
    ("model", "another model than 0-of-2 (model sha256"),
    ("facts", "other settings than 0-of-2 (run: dtype 'float32' vs 'bfloat16')"),
    ("stage_facts", "(attention stage: dtype"),
    ("missing", "shard 1-of-2 is missing"),
    ("twice", "given twice"),
    ("unfinished", "shard 1-of-2 is unfinished: 1 of its 2 records (first missing: "
                   "squad_v2/r3)"),
    ("duplicate", "record squad_v2/r0 is in shards 0-of-2 and 1-of-2"),
    ("lost", "2 of 8 records are in no shard"),
    ("not_a_shard", "is not a shard"),
    ("counts", "shards of different counts [2, 3]"),
])
def test_refused_merges_change_nothing(tmp_path, case, message):
    dirs = _make_shards(tmp_path)
    if case == "config":
        _edit(dirs[1], lambda m: m["config"].update(template="matched"))
    elif case == "model":
        _edit(dirs[1], lambda m: m["model"].update(sha256="cd" * 32))
    elif case == "facts":
        _edit(dirs[1], lambda m: m["result_facts"].update(dtype="bfloat16"))
    elif case == "stage_facts":
        _edit(dirs[1], lambda m: m["stages"]["attention"]["result_facts"].update(
            dtype="bfloat16"))
    elif case == "missing":
        dirs = dirs[:1]
    elif case == "twice":
        dirs = [dirs[0], dirs[0], dirs[1]]
    elif case == "unfinished":
        lines = (dirs[1] / "records.jsonl").read_text().splitlines()
        (dirs[1] / "records.jsonl").write_text(lines[0] + "\n")
    elif case == "duplicate":
        with open(dirs[1] / "records.jsonl", "a") as f:
            f.write(json.dumps(_record(0)) + "\n")
        _edit(dirs[1], lambda m: m["shard"].update(keys=[*m["shard"]["keys"], "squad_v2/r0"],
                                                   positions=[*m["shard"]["positions"], 0]))
    elif case == "lost":
        for d in dirs:
            _edit(d, lambda m: m["shard"].update(total=8))
    elif case == "not_a_shard":
        _edit(dirs[1], lambda m: m.pop("shard"))
    elif case == "counts":
        _edit(dirs[1], lambda m: m["shard"].update(count=3))
    before = _digest(tmp_path)
    with pytest.raises(ShardError, match="^merge refused: ") as err:
        merge_shards(dirs, tmp_path / "merged", log=lambda s: None)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert _digest(tmp_path) == before and not (tmp_path / "merged").exists()


def test_merge_refuses_an_output_run_of_another_config(tmp_path):
    dirs = _make_shards(tmp_path)
    out = tmp_path / "merged"
    write_json(out / "manifest.json", {"config": {"model": "other"}})
    with pytest.raises(ShardError, match="holds a run made with another config"):
        merge_shards(dirs, out, log=lambda s: None)
    merge_shards(dirs, out, overwrite=True, log=lambda s: None)
    assert read_json(out / "manifest.json")["config"]["model"] == "m"


def test_sharding_with_another_count_is_refused(tmp_path):
    _make_shards(tmp_path)
    check_count(tmp_path, Shard(1, 2))
    with pytest.raises(ShardError, match="holds shards of 2 \\(not 3\\): rerun with --shard I/2"):
        check_count(tmp_path, replace(Shard(0, 3)))


def test_merge_copies_every_per_record_part_the_contract_declares(tmp_path):
    """The parts come from the stage contract: a new stage's parts merge without a new table."""
    import re

    from interp.core.contract import SPECS

    dirs = _make_shards(tmp_path)
    parts = [p for s in SPECS for p in s.parts if p.keyed == "record"]
    assert {p.pattern.split("/")[0] for p in parts} >= {"attention", "patching", "steering",
                                                        "record"}
    expected = []
    for d in dirs:
        for i in read_json(d / "manifest.json")["shard"]["positions"]:
            for p in parts:
                coords = {c: "c" for c in re.findall(r"\{([a-z_]+)\}", p.pattern)
                          if c not in ("dataset", "id")}
                f = p.path(d, "squad_v2", f"r{i}", **coords)
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text(f"{p.label} {i}")
                if "{id}/" in p.pattern:  # a record's folder: what lies beside its index too
                    (f.parent / "shard_000.safetensors").write_text(f"tensors {i}")
                    expected.append((f.parent.relative_to(d) / "shard_000.safetensors",
                                     f"tensors {i}"))
                expected.append((f.relative_to(d), f"{p.label} {i}"))
    out = tmp_path / "merged"
    merge_shards(dirs, out, log=lambda s: None)
    assert len(expected) == 6 * (len(parts) + 1)
    for rel, text in expected:
        assert (out / rel).read_text() == text, rel


def test_placement_and_shard_options_come_from_the_config_fields(tmp_path):
    from interp.core.errors import ConfigError
    from interp.core.options import cli_options
    from interp.stages.asymmetry import AsymmetryConfig

    decls = {o.name: o.decls for o in cli_options(AsymmetryConfig)}
    assert decls["device_map"] == ("--device-map",) and decls["shard"] == ("--shard",)
    assert decls["max_memory"] == ("--max-memory",) and "offload_folder" in decls
    table = tmp_path / "map.json"
    table.write_text('{"model.layers.0": "cpu"}')
    for text in ('{"model.layers.0": "cpu"}', str(table)):
        cfg = AsymmetryConfig.from_mapping({"device_map": text, "max_memory": "0=1GiB,cpu=2GiB",
                                            "offload_folder": str(tmp_path)})
        assert cfg.device_map == {"model.layers.0": "cpu"}
        assert cfg.max_memory == {"0": "1GiB", "cpu": "2GiB"}
    assert AsymmetryConfig.from_mapping({"device_map": "auto"}).device_map == "auto"
    with pytest.raises(ConfigError, match="--max-memory '0:1GiB': use DEVICE=SIZE"):
        AsymmetryConfig.from_mapping({"device_map": "auto", "max_memory": "0:1GiB"})
    with pytest.raises(ConfigError, match="not a JSON object"):
        AsymmetryConfig.from_mapping({"device_map": "{model: cpu}"})
    with pytest.raises(ConfigError, match="no such file"):
        AsymmetryConfig.from_mapping({"device_map": str(tmp_path / "none.json")})
    with pytest.raises(ShardError, match="--shard 2/2: I must be in 0..N-1"):
        AsymmetryConfig.from_mapping({"shard": "2/2"})


def test_shares_of_a_stage_keep_passages_together_and_cover_every_record_once():
    recs = [{"id": f"q{i}", "dataset": "squad_v2", "context": f"passage {i // 3}"}
            for i in range(14)]  # 5 passages of 3, 3, 3, 3, 2 questions
    shares = [own_share(recs, i, 3) for i in range(3)]
    assert [[r["id"] for r in s] for s in shares] == [
        ["q0", "q1", "q2", "q9", "q10", "q11"], ["q3", "q4", "q5", "q12", "q13"],
        ["q6", "q7", "q8"]]
    assert own_share(recs, 0, 1) == recs
    with pytest.raises(ValueError, match="0..1"):
        with share_of_records(2, 2):
            pass


def test_study1_shards_and_stage_shares_deal_passages_by_one_rule():
    from interp.analysis.stats import passage_groups

    loaded = {"squad_v2": _examples(7, 2), "drop": _examples(5, 3, "drop")}
    records = [{"id": ex.id, "dataset": ex.dataset, "context": ex.context}
               for exs in loaded.values() for ex in exs]
    # the bootstrap's cluster is the shards' passage
    assert passage_groups(records) == [passage_key(r) for r in records]
    for n in (1, 2, 3):
        for i in range(n):
            owned = [ex.id for exs in assign(loaded, Shard(i, n))[0].values() for ex in exs]
            assert [r["id"] for r in own_share(records, i, n)] == owned


@pytest.mark.parametrize("where", ["is", "inside"])
def test_merge_into_one_of_its_own_inputs_is_refused(tmp_path, where):
    """``--out`` naming an input shard (or a folder inside one) is refused before any write.

    It used to copy the other shard's records into the input shard (shutil.SameFileError,
    with shard 0 holding 8 records, 4 not its own). The folder that holds ``shards/`` is the
    usual ``--out`` and merges.
    """
    dirs = _make_shards(tmp_path)
    out = dirs[0] if where == "is" else dirs[0] / "merged"
    before = _digest(tmp_path)
    said = "is" if where == "is" else "lies inside"
    with pytest.raises(ShardError, match=f"^merge refused: --out .* {said} the input shard"
                       ) as err:
        merge_shards(dirs, out, log=lambda s: None)
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)
    assert _digest(tmp_path) == before and (where == "is" or not out.exists())
    metrics = merge_shards(dirs, tmp_path, log=lambda s: None)
    assert metrics["overall"]["n"] == 6
    assert len((dirs[0] / "records.jsonl").read_text().splitlines()) == 4


def test_shards_of_an_edited_data_file_are_refused(tiny, tmp_path):
    """Two real shards of one file whose gold answer was edited between them do not merge.

    Same path, ids and count, so only the content fingerprint of the global selection
    (:func:`interp.launch.selection_sha256`) tells them apart; the finished shards are kept.
    """
    from interp.launch import selection_sha256
    from interp.stages.asymmetry import AsymmetryConfig, check_inputs, run
    from interp.testing import rehearsal_datasets

    path = Path(rehearsal_datasets(tmp_path / "data", n=4, names=("squad_v2",))["squad_v2"])
    cfg = AsymmetryConfig(datasets=[str(path)], limit=4, batch_size=2, max_new_tokens=4,
                          n_boot=20)
    out = tmp_path / "run"
    run(out, tiny, cfg, log=lambda s: None, shard=Shard(0, 2, "--shard"))
    lines = path.read_text().splitlines()
    row = json.loads(lines[1])                       # passage 1: shard 1's record
    row["answers"] = [row["answers"][0] + " (edited)"]
    path.write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
    run(out, tiny, cfg, log=lambda s: None, shard=Shard(1, 2, "--shard"))
    m0, m1 = (read_json(out / "shards" / f"{i}-of-2" / "manifest.json")["shard"]
              for i in (0, 1))
    assert m0["data_sha256"] != m1["data_sha256"] and m0["keys"] != m1["keys"]
    assert m1["data_sha256"] == selection_sha256(check_inputs(cfg))   # the file as it is now
    before = _digest(out)
    with pytest.raises(ShardError, match="^merge refused: shard 1-of-2 was made from other "
                                         "data than 0-of-2") as err:
        merge_shards([out / "shards/0-of-2", out / "shards/1-of-2"], out, log=lambda s: None)
    assert "\n" not in str(err.value)
    assert _digest(out) == before and not (out / "records.jsonl").exists()


def _beat_file(folder, name, **beat):
    import json as _json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(_json.dumps(beat))


def test_a_dead_rank_is_named_from_its_heartbeat(tmp_path, monkeypatch):
    """A real process that dies, a heartbeat gone stale, none at all, and one from before."""
    import os
    import socket
    import subprocess
    import sys
    import time

    from interp.launch import Shard, dead_ranks

    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511",
                 "TORCHELASTIC_RUN_ID": "r"}.items():
        monkeypatch.setenv(k, v)
    launch, host = "r:127.0.0.1:29511", socket.gethostname()
    folder = tmp_path / "heartbeats"
    me = Shard(0, 4, "torchrun")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _beat_file(folder, "1-of-4", pid=child.pid, host=host, launch=launch, passed=0)
        _beat_file(folder, "2-of-4", pid=os.getpid(), host="elsewhere", launch=launch,
                   passed=0)
        old = time.time() - 200
        os.utime(folder / "2-of-4.json", (old, old))           # its last beat: 200 s ago
        assert dead_ranks(folder, me, waited=5, stale=90) == [
            "2-of-4 (its last heartbeat is 200 s old, on elsewhere)"]
    finally:
        child.kill()
        child.wait()
    got = dead_ranks(folder, me, waited=5, stale=90)
    assert got[0] == f"1-of-4 (its process {child.pid} on {host} is gone)" and len(got) == 2
    # rank 3 wrote nothing: dead only once this process waited longer than the stale age
    assert not any(g.startswith("3-of-4") for g in got)
    assert any(g.startswith("3-of-4 (no heartbeat in 95 s")
               for g in dead_ranks(folder, me, waited=95, stale=90))
    # a rank that passed this barrier is not waited for, whatever its process did since
    _beat_file(folder, "1-of-4", pid=child.pid, host=host, launch=launch, passed=1)
    assert not any(g.startswith("1-of-4") for g in dead_ranks(folder, me, waited=5, stale=90))
    # a heartbeat of an earlier launch is no heartbeat of this one
    _beat_file(folder, "1-of-4", pid=child.pid, host=host, launch="old:x:1", passed=0)
    assert not any(g.startswith("1-of-4") for g in dead_ranks(folder, me, waited=5, stale=90))


def test_a_waiting_rank_stops_in_one_line_when_another_dies(tmp_path):
    """Two real processes joined by env://; rank 1 is killed before the barrier."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import os, sys, time\n"
            "from interp.launch import current_shard, heartbeat, barrier, finish\n"
            "from interp.core.errors import ShardError\n"
            "shard = current_shard()\n"
            "heartbeat(sys.argv[1], shard)\n"
            "if shard.index == 1:\n"
            "    time.sleep(600)\n"
            "try:\n"
            "    t0 = time.monotonic(); barrier(shard, what='its records')\n"
            "except ShardError as err:\n"
            "    print(f'{time.monotonic() - t0:.1f} s: {err}'); sys.exit(2)\n")
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "INTERP_HEARTBEAT_STALE_S": "30", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)],
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    beat = tmp_path / "shards" / "heartbeats" / "1-of-2.json"
    deadline = time.monotonic() + 120
    while not beat.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert beat.exists()
    os.kill(procs[1].pid, signal.SIGKILL)
    out, err = procs[0].communicate(timeout=120)
    procs[1].wait()
    assert procs[0].returncode == 2, err[-2000:]
    line = out.strip().splitlines()[-1]
    waited, msg = line.split(" s: ", 1)
    assert float(waited) < 30, line  # the process is gone: no need to wait for a stale beat
    assert msg == (f"shard 0-of-2: rank 1-of-2 (its process {procs[1].pid} on "
                   f"{socket.gethostname()} is gone) died while this process waited at the "
                   f"barrier; kept on disk: its records; rerun the missing shards with "
                   f"--shard I/2, then interp merge")


def test_live_ranks_pass_the_watched_barrier_twice(tmp_path):
    """The watch does not stop live ranks.

    Two processes pass two barriers, one arriving later than the stale age (its heartbeat is
    fresh), and leave one after the other. The heartbeat is 1 s instead of
    :data:`interp.launch.HEARTBEAT_S`'s 5 s, so the stale age (5 s, five beats) and the late
    arrival past it (8 s) take a third of the time of the defaults' (15 s and 25 s).
    """
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import sys, time\n"
            "import interp.launch\n"
            "from interp.launch import current_shard, heartbeat, barrier, finish\n"
            "interp.launch.HEARTBEAT_S = 1.0\n"
            "shard = current_shard()\n"
            "heartbeat(sys.argv[1], shard)\n"
            "time.sleep(8 * shard.index)\n"           # rank 1 arrives 8 s later
            "barrier(shard)\n"
            "barrier(shard)\n"
            "finish()\n"
            "print('passed', shard.name)\n")
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "INTERP_HEARTBEAT_STALE_S": "5", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)],
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.strip() for o, _ in outs] == ["passed 0-of-2", "passed 1-of-2"]


def test_a_stale_age_shorter_than_three_beats_is_refused():
    from interp.launch import stale_after

    assert stale_after({}) == 90.0 and stale_after({"INTERP_HEARTBEAT_STALE_S": "20"}) == 20.0
    with pytest.raises(ShardError, match="at least 15 \\(three beats"):
        stale_after({"INTERP_HEARTBEAT_STALE_S": "4"})
