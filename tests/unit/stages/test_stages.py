"""The stage list, the one model reload of a run, the pipeline and the command line."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from interp import cli, stages
from interp.core.errors import RunDirError
from interp.core.io import read_json, write_json
from interp.run import pipeline
from interp.stages import check_run_model, load_run_model
from interp.store.rundir import RunDir


def test_stage_list_is_explicit_and_complete():
    assert list(stages.STAGES)[:11] == [  # a new stage is appended, in the contract alone
        "attention", "probe", "transfer", "patching", "steering", "lens", "calibration",
        "pairwise", "record", "audit", "reasoning"]
    for name, stage in stages.STAGES.items():
        assert stage.SPEC.name == name
        assert callable(stage.run) and callable(stage.format_summary)
        assert hasattr(stage.SPEC.config_class, "from_mapping")
    assert list(stages.STAGES)[:2] == ["attention", "probe"]


@pytest.fixture()
def tiny_run(tiny, tmp_path):
    """A manifest whose model is the tiny Llama saved as a local checkpoint."""
    from interp.models.loading import load_model

    model_dir = tmp_path / "tiny-model"
    tiny.model.save_pretrained(model_dir)
    tiny.tokenizer.save_pretrained(model_dir)
    handle = load_model(str(model_dir), device="cpu")
    run = RunDir(tmp_path / "run")
    run.init_manifest({"model": str(model_dir), "device": "cpu"}, model_info=handle.info)
    return run, handle


def test_load_run_model_reloads_and_checks_the_sha256(tiny_run):
    run, handle = tiny_run
    again = load_run_model(run)
    assert again.spec == handle.spec and again.info["sha256"] == handle.info["sha256"]
    m = read_json(run.manifest_path)
    m["model"]["sha256"] = "0" * 64
    write_json(run.manifest_path, m)
    with pytest.raises(RunDirError, match=r"sha256 000000000000\), not .*use the run's model"):
        load_run_model(run)
    with pytest.raises(RunDirError, match="sha256"):
        check_run_model(run, handle)
    m["model"].pop("spec"), m["config"].pop("model")
    write_json(run.manifest_path, m)
    with pytest.raises(RunDirError, match="names no model"):
        load_run_model(run)


@pytest.mark.parametrize("name", ["attention", "probe", "patching", "steering", "record",
                                  "reasoning"])
def test_every_stage_refuses_another_models_run(tiny_run, name):
    """A stage run with a model other than the run's is refused before any work."""
    run, handle = tiny_run
    m = read_json(run.manifest_path)
    m["model"]["sha256"] = "0" * 64
    write_json(run.manifest_path, m)
    stage = stages.STAGES[name]
    table = {"layers": "all", "band": "all"} if name == "patching" else {}  # a 2-layer model
    with pytest.raises(RunDirError, match=r"sha256 000000000000\), not .*use the run's model"):
        stage.run(run, handle, stage.SPEC.config_class.from_mapping(table), log=lambda s: None)


def test_cli_prints_one_line_errors_and_exit_2(tmp_path):
    """InterpError -> `error: <msg>` and exit status 2; --debug keeps the traceback."""
    runner = CliRunner()
    res = runner.invoke(cli.app, ["heads", "--run", str(tmp_path)])
    assert res.exit_code == 2
    assert res.output.startswith("error: ") and "interp attention --run" in res.output
    assert "Traceback" not in res.output
    res = runner.invoke(cli.app, ["--debug", "heads", "--run", str(tmp_path)])
    assert res.exit_code == 1 and isinstance(res.exception, RunDirError)
    res = runner.invoke(cli.app, ["probe", "--run", str(tmp_path), "--layers", "last0"])
    assert res.exit_code == 2 and "cannot take the last 0" in res.output
    res = runner.invoke(cli.app, ["attention", "--run", str(tmp_path), "--backend", "tl"])
    assert res.exit_code == 2 and "unknown backend 'tl'" in res.output
    res = runner.invoke(cli.app, ["attention", "--run", str(tmp_path), "--backend", "tlens"])
    assert res.exit_code == 2 and "has no manifest.json" in res.output  # alias accepted


def test_run_config_refuses_unknown_only(tmp_path):
    from interp.core.errors import ConfigError

    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "x"\n[asymmetry]\nmodels = ["m"]\n[probe]\nfolds = 3\n')
    with pytest.raises(ConfigError, match=r"^--only: unknown: probes \(did you mean 'probe'\?\); "
                                          r"valid stages here: "
                                          r"asymmetry, probe$"):
        pipeline.run_config(cfg, only=["probes"])
    with pytest.raises(ConfigError, match=r"^--only: not configured in this file: attention; "
                                          r"valid stages here: asymmetry, probe$"):
        pipeline.run_config(cfg, only=["attention"])


def test_cli_steer_and_patch(tiny_run, tmp_path):
    """`interp steer` writes DIR/steering/ and the figure; bad values are one-line errors."""
    from interp.testing import synthetic_probe_run

    run, handle = tiny_run
    manifest = read_json(run.manifest_path)
    synth = synthetic_probe_run(tmp_path / "synth", handle, n_good=2, n_bad=2)
    write_json(synth.manifest_path, {**read_json(synth.manifest_path),
                                     "config": manifest["config"], "model": manifest["model"]})
    runner = CliRunner()
    res = runner.invoke(cli.app, ["steer", "--run", str(synth.path), "--alphas", "0.5,1",
                                  "--band", "0-1", "--limit", "1", "--tasks", "eval",
                                  "--n-boot", "10"])
    assert res.exit_code == 0, res.output
    assert "judge alpha   0.5" in res.output and "judge alpha   1.0" in res.output
    assert (synth.path / "steering/summary.json").exists()
    assert (synth.path / "figures/steering.png").exists()
    res = runner.invoke(cli.app, ["steer", "--run", str(synth.path), "--alphas", "0,1"])
    assert res.exit_code == 2 and "alphas must be finite numbers > 0" in res.output
    res = runner.invoke(cli.app, ["patch", "--run", str(synth.path), "--pairs", "task-swap"])
    assert res.exit_code == 2 and "unknown pair kind 'task-swap'" in res.output
    res = runner.invoke(cli.app, ["patch", "--run", str(synth.path), "--pairs", "gen-to-eval",
                                  "--kind", "heads", "--limit", "1", "--layers", "1",
                                  "--top-k", "2", "--band", "0-1"])
    assert res.exit_code == 0, res.output
    assert "gen-to-eval/heads: 2 pairs" in res.output
