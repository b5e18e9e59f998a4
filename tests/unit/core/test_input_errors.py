"""Input errors a new-user review found, each now a one-line error before slow work.

Duplicate ids, dtype/device, numeric lists, later-stage configs, a run's model, messages.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from interp import cli
from interp.core.contract import spec
from interp.core.errors import ConfigError, DataError, InterpError, ModelSpecError
from interp.core.inputs import check_device, check_dtype
from interp.data import load_examples
from interp.models.loading import load_model


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
                                       "--model", "no-such/model", "--out", str(tmp_path / "r")])
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
        spec("steering").config_class.from_mapping({"alphas": alphas})


def test_numeric_fields_of_every_stage_are_checked():
    assert spec("steering").config_class.from_mapping({"alphas": ["0.5", "1"]}).alphas == [0.5, 1.0]
    # a float field holds floats (summaries key results by str(alpha): "1.0", never "1")
    alphas = spec("steering").config_class.from_mapping({"alphas": [1, 2]}).alphas
    assert alphas == [1.0, 2.0] and all(type(a) is float for a in alphas)
    with pytest.raises(InterpError, match=r"--lr \(\[transfer\] lr\) must be a number"):
        spec("transfer").config_class.from_mapping({"lr": "fast"})
    with pytest.raises(InterpError, match=r"--min-gap \(\[patching\] min_gap\) must be a number"):
        spec("patching").config_class.from_mapping({"min_gap": [1]})
    with pytest.raises(InterpError, match=r"\[transfer\] lora_layers\) must be a list of whole"):
        spec("transfer").config_class.from_mapping({"lora_layers": [1, 2.5]})
    with pytest.raises(InterpError, match=r"\[probe\] C\) must be a number"):
        spec("probe").config_class.from_mapping({"C": "1"})


def test_cli_steer_alphas_abc_is_one_line(tmp_path):
    res = CliRunner().invoke(cli.app, ["steer", "--run", str(tmp_path), "--alphas", "abc"])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == ("error: --alphas ([steering] alphas) must be a list of "
                                  "numbers, not ['abc'] ('abc' is not a number)")


def _manifest_run(path, *, model="no-such-model", n_layers=2, n_heads=4, config=None):
    """A run dir whose manifest names a model that cannot load.

    An error other than the model's own was raised before the model was looked up.
    """
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"model": model, **(config or {})}
    (path / "manifest.json").write_text(json.dumps({
        "config": cfg, "model": {"spec": model, "n_layers": n_layers, "n_heads": n_heads}}))
    return path


@pytest.mark.parametrize("args,match", [
    (["attention", "--band", "30-35"], r"--band \(\[attention\] band\): layers '30-35': "
                                         r"layer 30 is out of range; valid layers are 0-1"),
    (["probe", "--layers", "last3"], r"--layers \(\[probe\] layers\)"),
    (["record", "--band", "5"], r"--band \(\[record\] band\)"),
    (["patch", "--layers", "7"], r"--layers \(\[patching\] layers\)"),
    (["steer", "--band", "last9"], r"--band \(\[steering\] band\)"),
    (["steer", "--band", "all", "--heads", "1.7"], 
     r"\[steering\] heads '1.7': empty, or a head outside 0..3"),
    (["steer", "--band", "all", "--heads", "top-diff:x"], 
     r"K of top-diff:K must be a whole number"),
])
def test_stage_layers_are_checked_from_the_manifest_before_the_model_loads(tmp_path, args,
                                                                              match):
    run = _manifest_run(tmp_path / "run")
    res = CliRunner().invoke(cli.app, [*args, "--run", str(run)])
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1
    assert "no-such-model" not in res.output  # refused before the model was looked up
    import re
    assert re.search(match, res.output), res.output


def test_asymmetry_into_another_models_run_is_refused_before_loading(tmp_path):
    run = _manifest_run(tmp_path / "smol", model="smollm2-135m-instruct")
    res = CliRunner().invoke(cli.app, ["asymmetry", "--model", "no-such/qwen", "--limit", "1",
                                       "--out", str(run)])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"error: {run} was made with another config (model: "
                                 f"'smollm2-135m-instruct' -> 'no-such/qwen'")
    assert "--overwrite" in res.output


def test_run_config_checks_every_stage_against_the_model_before_any_stage_runs(tiny, tmp_path):
    from interp.core.errors import LayerSpecError, StageError
    from interp.run.pipeline import run_config

    model_dir = tmp_path / "tiny-model"
    tiny.model.save_pretrained(model_dir)
    tiny.tokenizer.save_pretrained(model_dir)
    base = {"out": str(tmp_path / "runs"),
            "asymmetry": {"models": [str(model_dir)], "datasets": ["squad_v2"], "limit": 1,
                          "max_new_tokens": 2, "n_boot": 10}}
    with pytest.raises(LayerSpecError, match=r"^--band \(\[attention\] band\) for .*"
                                             r"tiny-model: layers 'last80': cannot take the "
                                             r"last 80"):
        run_config({**base, "attention": {"band": "last80"}}, log=lambda s: None)
    assert not (tmp_path / "runs").exists()  # no run dir left behind, the harness never ran
    with pytest.raises(StageError, match=r"^\[steering\] for .*tiny-model: heads '0.9'"):
        run_config({**base, "steering": {"heads": "0.9", "band": "all"}}, log=lambda s: None)
    assert not (tmp_path / "runs").exists()


def test_run_config_checks_every_models_shape_before_the_first_model_runs(tiny, tiny_tokenizer,
                                                                           tmp_path):
    """A layer the second model lacks fails before the first model's harness runs."""
    from interp.core.errors import LayerSpecError
    from interp.models.loading import model_shape
    from interp.run.pipeline import run_config
    from interp.testing import tiny_llama

    deep, shallow = tmp_path / "deep", tmp_path / "shallow"
    for handle, where in ((tiny_llama(tiny_tokenizer, n_layers=4), deep), (tiny, shallow)):
        handle.model.save_pretrained(where)
        handle.tokenizer.save_pretrained(where)
    assert model_shape(str(deep)) == (4, 4) and model_shape(str(shallow)) == (2, 4)
    cfg = {"out": str(tmp_path / "runs"),
           "asymmetry": {"models": [str(deep), str(shallow)], "datasets": ["squad_v2"],
                         "limit": 1, "max_new_tokens": 2, "n_boot": 10},
           "attention": {"band": "3"}}
    with pytest.raises(LayerSpecError, match=rf"^--band \(\[attention\] band\) for "
                                             rf"{shallow}: layers '3'"):
        run_config(cfg, log=lambda s: None)
    assert not (tmp_path / "runs").exists()  # the deep model never ran either


def test_a_grid_folder_names_its_runs(tmp_path):
    from interp.core.errors import RunDirError
    from interp.store.rundir import RunDir

    grid = tmp_path / "demo"
    for name in ("b", "a"):
        _manifest_run(grid / name)
    with pytest.raises(RunDirError, match=rf"^{grid} is a grid of runs: pass one of {grid / 'a'}, "
                                          rf"{grid / 'b'}$"):
        RunDir(grid).manifest()
    res = CliRunner().invoke(cli.app, ["metrics", "--run", str(grid)])
    assert res.exit_code == 2 and "is a grid of runs" in res.output
    with pytest.raises(RunDirError, match="has no manifest.json: run `interp asymmetry"):
        RunDir(tmp_path / "empty").manifest()


def test_messages_name_the_cli_option():
    from interp.analysis.stats import make_folds
    from interp.core.errors import StageError

    with pytest.raises(DataError, match=r"--from-hub; config key from_hub = true"):
        load_examples("drop", split="train")
    with pytest.raises(StageError, match=r"\(each needs >= 2, and 2 is the fewest folds\); add "
                                         r"records"):
        make_folds([True, False, False], 2, 0)
    with pytest.raises(StageError, match=r"use fewer --folds \(2 is the fewest\) or add"):
        make_folds([True, True, False, False], 3, 0)
    res = CliRunner().invoke(cli.app, ["transfer", "--help"])
    assert "a [transfer] table" in " ".join(res.output.replace("│", " ").split())


def test_load_activations_says_a_record_lies_outside_the_limit(tmp_path):
    from interp.core.errors import RunDirError
    from interp.store.recordings import load_activations

    run = _manifest_run(tmp_path / "run")
    (run / "records.jsonl").write_text("\n".join(json.dumps(
        {"id": i, "dataset": "squad_v2", "status": "ok"}) for i in ("a", "b")) + "\n")
    with pytest.raises(RunDirError, match="run `interp record --run .*` first"):
        load_activations(run, "b", "eval", "hook_resid_post")
    (run / "record" / "squad_v2" / "a").mkdir(parents=True)
    (run / "record" / "squad_v2" / "a" / "index.json").write_text("{}")
    with pytest.raises(RunDirError, match=r"^record 'b' was not recorded: .* 1 records \(the "
                                          r"first --limit N ok records per dataset\) .*larger "
                                          r"--limit, or none"):
        load_activations(run, "b", "eval", "hook_resid_post")
    with pytest.raises(RunDirError, match="has no ok record 'zz'"):
        load_activations(run, "zz", "eval", "hook_resid_post")


@pytest.mark.parametrize("args", [["view", "--id", "q1"], ["heads"], ["metrics"]])
def test_commands_on_a_grid_folder_name_its_runs_and_never_advise_writing_into_it(tmp_path,
                                                                                   args):
    grid = tmp_path / "demo"
    for name in ("smollm2", "qwen"):
        _manifest_run(grid / name)
    res = CliRunner().invoke(cli.app, [args[0], "--run", str(grid), *args[1:]])
    assert res.exit_code == 2, res.output
    assert f"is a grid of runs: pass one of {grid / 'qwen'}, {grid / 'smollm2'}" in res.output
    assert "--out" not in res.output and "interp asymmetry" not in res.output


def test_kept_work_of_a_grid_counts_its_model_folders(tmp_path):
    """Ctrl-C under ``interp run``: the work kept under out/<model>/ is reported, not nothing.

    A model whose run directory keeps nothing yet is named with its 0 records.
    """
    from interp.core.inputs import kept_work

    grid = tmp_path / "demo"
    run = _manifest_run(grid / "smollm2")
    (run / "records.jsonl").write_text("".join(f'{{"id": "q{i}"}}\n' for i in range(4)))
    _manifest_run(grid / "qwen")
    assert kept_work([grid]) == f"0 records in {grid / 'qwen'}; 4 records in {grid / 'smollm2'}"
    assert kept_work([tmp_path / "empty"]) == "nothing"
