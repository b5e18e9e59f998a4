"""Input errors a new-user review found (issue: duplicate ids, dtype/device, numeric lists,
later-stage configs, a run's model, messages): each a one-line error before slow work."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from interp import cli
from interp.data import load_examples
from interp.errors import ConfigError, DataError, InterpError, ModelSpecError
from interp.inputs import check_device, check_dtype
from interp.models import load_model
from interp.stages import STAGES


def _line(i, qid):
    return json.dumps({"id": qid, "question": f"Q{i}?", "context": "C.", "answers": ["1"]})


def test_duplicate_ids_in_a_file_are_refused_naming_both_lines(tmp_path):
    p = tmp_path / "d4.jsonl"
    p.write_text("\n".join([_line(0, "q1"), _line(1, "q2"), "", _line(2, "q1")]) + "\n")
    with pytest.raises(DataError, match=r"d4.jsonl: duplicate id 'q1' \(line 1 and line 4\)"):
        load_examples(p)
    with pytest.raises(DataError, match="duplicate id 'q1'"):
        load_examples(p, limit=1)  # the limit does not hide it
    lst = tmp_path / "l.json"
    lst.write_text(json.dumps([json.loads(_line(0, "a")), json.loads(_line(1, "a"))]))
    with pytest.raises(DataError, match=r"duplicate id 'a' \(record \[0\] and record \[1\]\)"):
        load_examples(lst)
    p.write_text("\n".join([_line(0, "q1"), _line(1, "q2")]) + "\n")
    assert [ex.id for ex in load_examples(p)] == ["q1", "q2"]


def test_cli_refuses_duplicate_ids_before_the_model_loads(tmp_path):
    p = tmp_path / "d4.jsonl"
    p.write_text(_line(0, "q1") + "\n" + _line(1, "q1") + "\n")
    res = CliRunner().invoke(cli.app, ["asymmetry", "--dataset", str(p), "--limit", "2",
                                       "--model", "no-such-model", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines() == [
        f"error: {p}: duplicate id 'q1' (line 1 and line 2): give every record its own id"]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("dtype", ["float64", "int8", "", 3])
def test_bad_dtype_is_refused_listing_the_valid_ones(dtype):
    with pytest.raises(ConfigError, match=r"is not a model precision: use one of auto, float32"):
        check_dtype(dtype)
    with pytest.raises(ModelSpecError, match="not a model precision"):
        load_model("no-such-model", dtype=dtype)  # before the spec is even looked at


def test_bad_device_is_refused():
    with pytest.raises(ConfigError, match=r"--device 'tpu' is not a device torch knows"):
        check_device("tpu")
    with pytest.raises(ConfigError, match="not a device torch knows"):
        check_device("gpu0")
    check_device("cpu")
    check_device(None)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"cuda requested but torch.cuda.is_available\(\) "
                                              r"is False: use --device cpu"):
            check_device("cuda:0")
        with pytest.raises(ModelSpecError, match="use --device cpu"):
            load_model("no-such-model", device="cuda")


@pytest.mark.parametrize("args", [["--dtype", "float64"], ["--device", "tpu"]])
def test_cli_asymmetry_refuses_dtype_and_device_in_one_line(tmp_path, args):
    res = CliRunner().invoke(cli.app, ["asymmetry", *args, "--limit", "1",
                                       "--out", str(tmp_path / "r")])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"error: {args[0]} ") and len(res.output.splitlines()) == 1
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("alphas", [["abc"], [1, "x"], [1, True], 2])
def test_numeric_lists_are_refused_by_one_helper(alphas):
    with pytest.raises(ConfigError, match=r"^--alphas \(\[steering\] alphas\) must be a list "
                                          r"of numbers, not "):
        STAGES["steering"].Config.from_mapping({"alphas": alphas})


def test_numeric_fields_of_every_stage_are_checked():
    assert STAGES["steering"].Config.from_mapping({"alphas": ["0.5", "1"]}).alphas == [0.5, 1.0]
    with pytest.raises(InterpError, match=r"--lr \(\[transfer\] lr\) must be a number"):
        STAGES["transfer"].Config.from_mapping({"lr": "fast"})
    with pytest.raises(InterpError, match=r"--min-gap \(\[patching\] min_gap\) must be a number"):
        STAGES["patching"].Config.from_mapping({"min_gap": [1]})
    with pytest.raises(InterpError, match=r"\[transfer\] lora_layers\) must be a list of whole"):
        STAGES["transfer"].Config.from_mapping({"lora_layers": [1, 2.5]})
    with pytest.raises(InterpError, match=r"\[probe\] C\) must be a number"):
        STAGES["probe"].Config.from_mapping({"C": "1"})


def test_cli_steer_alphas_abc_is_one_line(tmp_path):
    res = CliRunner().invoke(cli.app, ["steer", "--run", str(tmp_path), "--alphas", "abc"])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == ("error: --alphas ([steering] alphas) must be a list of "
                                  "numbers, not ['abc'] ('abc' is not a number)")
