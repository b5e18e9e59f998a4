"""A bad option or config is refused in one line before torch or transformers is imported.

Each case runs the command line in a fresh interpreter and reads which heavy libraries were
imported by the time it exited, so the check is about imports, not about seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "safetensors", "scipy", "sklearn", "pandas", "matplotlib")
PROBE = """
import json, sys
from interp.cli import main
heavy = json.loads(sys.argv[2])
sys.argv = ["interp", *json.loads(sys.argv[1])]
try:
    main()
    code = 0
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else 1
print(json.dumps({"code": code, "heavy": [m for m in heavy if m in sys.modules]}))
"""


def _run(argv, cwd, key="sk-not-a-real-key"):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "INTERP_OPENAI_BASE_URL")}
    env.update({"OPENAI_API_KEY": key} if key else {})
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)],
                         capture_output=True, text=True, cwd=cwd, timeout=120, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.parametrize(("argv", "said"), [
    (["asymmetry", "--dataset", "squad_v3"], "did you mean 'squad_v2'"),
    (["asymmetry", "--limit", "-3"], "must be a whole number >= 1"),
    (["asymmetry", "--template", "nope"], "unknown template 'nope'"),
    (["asymmetry", "--oracle", "gpt"], "unknown oracle 'gpt'"),
    (["asymmetry", "--oracle", "openai:"], "oracle 'openai:' names no model: write 'openai:SPEC'"),
    (["asymmetry", "--model", "openai:m", "--timeout-s", "0"],
     "--timeout-s ([asymmetry] timeout_s) must be a number of seconds > 0, not 0"),
    (["asymmetry", "--model", "openai:m", "--concurrency", "0"],
     "--concurrency ([asymmetry] concurrency) must be a whole number >= 1, not 0"),
    # docs/endpoints.md's oracle passes the oracle check (made before the template's)
    (["asymmetry", "--oracle", "openai:my-70b", "--template", "nope"], "unknown template 'nope'"),
    (["steer", "--run", "EMPTY"], "has no manifest.json"),
    (["lens", "--run", "EMPTY", "--heldout", "2"], "heldout must lie strictly between"),
    (["attention", "--run", "EMPTY", "--backend", "hff"], "unknown backend 'hff'"),
    (["transfer", "--rank", "0"], "transfer config rank must be >= 1, got 0"),
    (["transfer", "--patch-positions", "middle"], "patch_positions must be 'all' or 'last'"),
    (["transfer", "--adapters", "lora_evl"], "unknown adapter 'lora_evl' (did you mean "
                                             "'lora_eval'?)"),
    (["transfer", "--adapters", "lora_eval", "--adapters", "lora_eval"],
     "adapters lists lora_eval more than once"),
    (["run", "TYPO"], "did you mean 'limit'"),
    (["run", "BAD_STAGE_VALUE"], "heldout must lie strictly between"),
    # a model spec that is no alias, path nor owner/name: before the plan line and torch
    (["asymmetry", "--model", "smollm2-135m-instrct"],
     "unknown model spec 'smollm2-135m-instrct' (did you mean 'smollm2-135m-instruct'?)"),
    (["asymmetry", "--model", "./no-such-dir"], "./no-such-dir does not exist"),
    (["asymmetry", "--model", "gone.gguf"], "GGUF file gone.gguf does not exist"),
    (["asymmetry", "--oracle", "model:smolm2-135m-instruct"],
     "(did you mean 'smollm2-135m-instruct'?)"),
    (["oracle-agreement", "--run", "EMPTY", "--oracle", "model:smolm2-135m-instruct"],
     "(did you mean 'smollm2-135m-instruct'?)"),
    (["asymmetry", "--answers-from", "EMPTY"], "--answers-from EMPTY: not a finished run"),
    (["run", "MODEL_TYPO"], "unknown model spec 'qwen2.5-coder-0.5b-instrct' (did you mean "
                            "'qwen2.5-coder-0.5b-instruct'?)"),
    # a hub id passes the model check offline: the template's error comes next
    (["asymmetry", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--template", "nope"],
     "unknown template 'nope'"),
    (["asymmetry", "--device-map", "everywhere"], "--device-map 'everywhere': use one of auto"),
    # a layer option's grammar needs no model: before the run is read
    (["run", "BAD_BAND"], "--band ([steering] band): layers 'lats8': cannot parse 'lats8'"),
    (["lens", "--run", "EMPTY", "--band", "last0"], "--band ([lens] band): layers 'last0'"),
    (["patch", "--run", "EMPTY", "--layers", "3-x"], "cannot parse '3-x'"),
])
def test_a_bad_input_is_one_line_before_any_heavy_import(argv, said, tmp_path):
    (tmp_path / "EMPTY").mkdir()
    (tmp_path / "TYPO").write_text('[asymmetry]\ndatasets = ["squad_v2"]\nlimt = 3\n')
    (tmp_path / "BAD_STAGE_VALUE").write_text('[asymmetry]\ndatasets = ["squad_v2"]\n'
                                              '[lens]\nheldout = 3\n')
    (tmp_path / "MODEL_TYPO").write_text('[asymmetry]\ndatasets = ["squad_v2"]\n'
                                         'models = ["smollm2-135m-instruct", '
                                         '"qwen2.5-coder-0.5b-instrct"]\n')
    (tmp_path / "BAD_BAND").write_text('[asymmetry]\ndatasets = ["squad_v2"]\n'
                                       '[steering]\nband = "lats8"\n')
    res, err = _run(argv, tmp_path)
    assert res["code"] == 2, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and said in lines[0], err
    assert res["heavy"] == [], f"{argv}: imported {res['heavy']} before refusing"


@pytest.mark.parametrize("argv", [["--help"], ["steer", "--help"], ["lens", "--help"],
                                  ["asymmetry", "--help"], ["transfer", "--help"],
                                  ["run", "--help"]])
def test_help_imports_no_heavy_library(argv, tmp_path):
    res, err = _run(argv, tmp_path)
    assert res["code"] == 0, err
    assert res["heavy"] == []


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["steer", "--help"]])
def test_help_shows_flags_without_a_type_and_each_command_whole(argv):
    """A flag is ``--debug`` or ``--figures / --no-figures``, never ``--debug <bool>``."""
    from typer.testing import CliRunner

    from interp import cli

    res = CliRunner().invoke(cli.app, argv, terminal_width=80)
    assert res.exit_code == 0, res.output
    assert "<bool>" not in res.output and "--help " in res.output
    if argv == ["--help"]:
        assert "  --debug  show the traceback of an error instead of one line" in res.output
        # each command's first sentence whole, wrapped at the width (click would cut it)
        assert "run               Run a configured grid (models x datasets) and its stages." \
            in res.output
        assert not [x for x in res.output.splitlines()[1:] if x.endswith("...")]


def test_study_1_says_what_it_is_about_to_do_before_the_model_loads(tmp_path):
    """Study 1's first line says which model, how many records of which datasets, and where.

    A bare ``interp asymmetry`` starts a long run; it says so once the inputs are checked,
    before any model work.
    """
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(
        ["asymmetry", "--limit", "2", "--dataset", "drop", "--model", "no-such/model"]),
        json.dumps(HEAVY)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    first = out.stdout.splitlines()[0]
    assert first == ("Study 1: no-such/model answers and judges 2 drop records into "
                     "runs/asymmetry (if interrupted, the same command resumes)"), out.stdout
    assert json.loads(out.stdout.strip().splitlines()[-1])["code"] == 2   # then refused
    assert not (tmp_path / "runs" / "asymmetry" / "records.jsonl").exists()


def _finished_run(root, damaged: bool = False, records: bool = True):
    """A run directory as Study 1 leaves it (a 30-layer model), no model needed to read it."""
    run = root / "RUN"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({
        "config": {"model": "smollm2-135m-instruct", "datasets": ["squad_v2"]},
        "model": {"spec": "smollm2-135m-instruct", "n_layers": 30, "n_heads": 9}}))
    if not records:
        return run
    rows = [json.dumps({"id": i, "dataset": "squad_v2", "status": "ok"}) for i in "abc"]
    if damaged:
        rows[1] = rows[1][:-1]  # a lost brace: the file is damaged, not torn
    (run / "records.jsonl").write_text("\n".join(rows) + "\n")
    return run


@pytest.mark.parametrize(("argv", "said"), [
    (["attention", "--run", "RUN", "--band", "0-40"],
     "--band ([attention] band): layers '0-40': layer 40 is out of range; valid layers are 0-29"),
    (["steer", "--run", "RUN", "--band", "last40"], "--band ([steering] band)"),
    (["probe", "--run", "RUN", "--layers", "31"], "layer 31 is out of range"),
    (["view", "--run", "RUN", "--id", "a", "--band", "29-35"],
     "--band: layers '29-35': layer 35 is out of range; valid layers are 0-29"),
    (["heads", "--run", "RUN", "--layers", "40"], "--layers: layers '40': layer 40 is out"),
])
def test_a_run_reading_error_is_one_line_before_any_heavy_import(argv, said, tmp_path):
    _finished_run(tmp_path)
    res, err = _run(argv, tmp_path)
    lines = [x for x in err.splitlines() if x.strip()]
    assert res["code"] == 2 and len(lines) == 1 and said in lines[0], err
    assert res["heavy"] == [], f"{argv}: imported {res['heavy']} before refusing"


@pytest.mark.parametrize(("argv", "said"), [
    (["steer", "--run", "RUN"], "records.jsonl"),
    (["steer", "--run", "RUN", "--heads", "2.x"], "heads '2.x': use 'all', 'top-diff:K' or"),
    (["steer", "--run", "RUN", "--heads", "top-diff:0"], "K of top-diff:K must be a whole"),
    (["attention", "--run", "RUN"], "records.jsonl"),
    (["probe", "--run", "RUN"], "records.jsonl"),
])
def test_a_run_without_records_or_a_bad_head_spec_is_one_line_before_any_heavy_import(
        argv, said, tmp_path):
    """The config's check against the run's model (steering's head spec) imports no torch."""
    _finished_run(tmp_path, records=False)
    res, err = _run(argv, tmp_path)
    lines = [x for x in err.splitlines() if x.strip()]
    assert res["code"] == 2 and len(lines) == 1 and said in lines[0], err
    assert res["heavy"] == [], f"{argv}: imported {res['heavy']} before refusing"


@pytest.mark.parametrize("argv", [
    ["attention", "--run", "RUN"], ["lens", "--run", "RUN"], ["metrics", "--run", "RUN"],
    ["oracle-agreement", "--run", "RUN", "--oracle", "model:org/x"],
    ["view", "--run", "RUN", "--id", "a"]])
def test_a_damaged_records_line_is_named_with_how_to_recover_before_heavy_imports(argv,
                                                                                    tmp_path):
    run = _finished_run(tmp_path, damaged=True)
    before = (run / "records.jsonl").read_bytes()
    res, err = _run(argv, tmp_path)
    lines = [x for x in err.splitlines() if x.strip()]
    assert res["code"] == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: RUN/records.jsonl:2: malformed JSON"), err
    assert ("line 2 is damaged (not a cut last line): delete it (sed -i '2d' "
            "RUN/records.jsonl) and run the same `interp asymmetry --out RUN` command again: "
            "it redoes that record and keeps every other") in lines[0]
    assert res["heavy"] == [], f"{argv}: imported {res['heavy']} before refusing"
    assert (run / "records.jsonl").read_bytes() == before      # nothing rewritten


def _tiny_gguf(path):
    """A small valid GGUF file (llama.cpp's own writer): metadata and two tensors."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.name", "tiny")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    w.add_tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("b", np.ones(5, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_check_gguf_reads_the_structure_and_finds_the_last_missing_byte(tmp_path):
    from interp.core.errors import ModelSpecError
    from interp.models.gguf import check_gguf

    good = _tiny_gguf(tmp_path / "tiny.gguf")
    got = check_gguf(good)
    assert got["n_tensors"] == 2 and got["version"] == 3
    data = good.read_bytes()
    # 3 x 4 float32 and 5 float16 after the aligned table: the last tensor ends 32 + 10 bytes on
    end = got["data_end"]
    assert len(data) - 32 < end <= len(data) and end % 32 == 10
    (tmp_path / "end.gguf").write_bytes(data[:end])     # the padding after it is not needed
    assert check_gguf(tmp_path / "end.gguf") == got
    (tmp_path / "cut.gguf").write_bytes(data[:end - 1])  # one byte short of its last tensor
    with pytest.raises(ModelSpecError, match=rf"cut.gguf is not a usable GGUF file: "
                                             rf"{end - 1} bytes, but its 2 tensors end at "
                                             rf"byte {end} \(truncated"):
        check_gguf(tmp_path / "cut.gguf")
    (tmp_path / "head.gguf").write_bytes(data[:60])    # cut inside its metadata
    with pytest.raises(ModelSpecError, match="ends at byte 60 inside its header or tables"):
        check_gguf(tmp_path / "head.gguf")
    (tmp_path / "other.gguf").write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(ModelSpecError, match=r"starts with b'PK\\x03\\x04', not the magic"):
        check_gguf(tmp_path / "other.gguf")


def test_serve_on_a_port_in_use_or_a_broken_gguf_is_one_line_at_once(tmp_path):
    """``interp serve`` as a user calls it: exit 2, one line naming the port or the file.

    Both come before any server starts (it took about 25 s and ended in a traceback).
    """
    import socket

    pytest.importorskip("xllamacpp")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        res, err = _run(["serve", "smollm2-135m-instruct", "--port", str(port)], tmp_path)
        lines = [x for x in err.splitlines() if x.strip()]
        assert res["code"] == 2 and len(lines) == 1, err
        assert lines[0].startswith(f"error: port {port} on 127.0.0.1 is not free"), err
    # slots that leave each a context too small for any prompt: said before the port check
    res, err = _run(["serve", "smollm2-135m-instruct", "--port", str(port), "--parallel", "4",
                     "--n-ctx", "32"], tmp_path)
    lines = [x for x in err.splitlines() if x.strip()]
    assert res["code"] == 2 and len(lines) == 1, err
    assert lines[0] == ("error: --n-ctx 32 over --parallel 4 slots leaves each slot 8 tokens "
                        "(at least 16): raise --n-ctx to 64 or more, or lower --parallel"), err
    data = _tiny_gguf(tmp_path / "m.gguf").read_bytes()
    (tmp_path / "m.gguf").write_bytes(data[: len(data) // 2])
    res, err = _run(["serve", "m.gguf", "--port", str(port)], tmp_path)
    lines = [x for x in err.splitlines() if x.strip()]
    assert res["code"] == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: m.gguf is not a usable GGUF file: "), err
    assert res["heavy"] == []


def test_openais_own_endpoint_without_a_key_is_refused_before_any_heavy_import(tmp_path):
    res, err = _run(["asymmetry", "--oracle", "openai:gpt-4o-mini"], tmp_path, key=None)
    assert res["code"] == 2, err
    assert err.strip() == ("error: OPENAI_API_KEY is not set, and https://api.openai.com/v1 "
                           "needs a key: export OPENAI_API_KEY, or set base_url (or "
                           "$INTERP_OPENAI_BASE_URL) to a local server")
    assert res["heavy"] == []
