"""The stage contract (interp.core.contract): one declared spec per stage, and its uses."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from interp import cli, stages
from interp.core import contract
from interp.core.contract import SPECS, check_needs, kept_work, spec
from interp.core.errors import ConfigError, RunDirError
from interp.run import pipeline
from interp.store import RunDir
from interp.store.recordings import recording_index_path

ROOT = Path(__file__).resolve().parents[3]


def test_every_stage_has_the_same_run_signature():
    for s in SPECS:
        contract.check_module(s)  # raises on a stage that differs
        params = inspect.signature(s.load().run).parameters
        assert list(params)[:5] == ["run_dir", "handle", "cfg", "overwrite", "log"], s.name
        assert params["overwrite"].kind is inspect.Parameter.KEYWORD_ONLY
        assert s.load().SPEC is s  # the module reads its facts from its entry
        assert s.config_class is getattr(s.load(), s.config)


def test_the_specs_are_the_stage_list():
    assert [s.name for s in SPECS] == ["asymmetry", *stages.STAGES]
    assert {n: spec(n).name for n in ("steer", "steering", "patch", "patching")} == {
        "steer": "steering", "steering": "steering", "patch": "patching",
        "patching": "patching"}
    with pytest.raises(ConfigError, match=r"^unknown stage 'steerin'; stages: asymmetry, "):
        spec("steerin")
    assert pipeline.canonical(["steer", "asymmetry", "nope"]) == ["steering", "asymmetry",
                                                                    "nope"]


def test_no_stage_module_imports_another_stage():
    names = {s.module for s in SPECS}
    for s in SPECS:
        path = ROOT / s.module.replace(".", "/")  # a module, or a package of the stage's roles
        files = [path / "__init__.py", *sorted(path.glob("[!_]*.py"))] if path.is_dir() else [
            path.with_suffix(".py")]
        tree = ast.Module(body=[n for f in files for n in ast.parse(f.read_text()).body],
                          type_ignores=[])
        imported = set()
        for node in ast.walk(tree):  # imports inside functions count too
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
        assert not (imported & names) - {s.module}, s.name


def test_every_need_is_a_file_the_needed_stage_declares():
    for s in SPECS:
        for need in s.needs:
            assert spec(need.stage).table(Path(need.path).name) == need.path
    assert spec("steering").needs[1].when == ("heads", "top-diff:")


def test_the_layout_derives_from_the_parts(tmp_path):
    from interp.stages import attention, patching, probe, steering

    run = RunDir(tmp_path)
    rec = {"dataset": "squad_v2", "id": "a/b c"}
    assert attention.rows_path(run, rec) == tmp_path / "attention/records/squad_v2" / (
        contract.safe_name("a/b c") + ".safetensors")
    assert probe.features_path(run, "eval") == tmp_path / "probes/features_eval.safetensors"
    assert recording_index_path(run, "squad_v2", "a/b c") == (
        tmp_path / "record/squad_v2" / contract.safe_name("a/b c") / "index.json")
    assert steering.SPEC.parts[0].path(tmp_path, "squad_v2", "a/b c") == (
        tmp_path / "steering/parts/squad_v2__a_b_c.json")
    assert patching.SPEC.parts[0].path(tmp_path, "d", "1", pairs="gen-to-eval",
                                       kind="heads") == (
        tmp_path / "patching/gen-to-eval/heads/parts/d__1.json")
    assert patching.SPEC.parts[0].glob == "patching/*/*/parts/*.json"
    for s in SPECS:  # every published table is one the stage declares
        assert set(s.summaries) <= set(s.tables), s.name


def test_kept_work_counts_every_declared_part(tmp_path):
    for s in SPECS:
        for p in s.parts:
            coords = {k: "x" for k in ("pairs", "kind", "task", "adapter", "model", "rate")}
            f = p.path(tmp_path, "d", "1", **coords) if "{id}" in p.pattern else p.path(
                tmp_path, **{**coords, "dataset": "d"})
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text('{"id": "1"}\n{"id": "2"}\n')
    said = kept_work([tmp_path])  # a stage appended to the contract adds its parts after these
    assert said.startswith("2 records, 1 attention recordings, 1 saved activations, 1 probe "
                           "feature caches, 1 trained adapters, 1 learning-rate selection "
                           "files, 1 transfer evaluations, 1 patching parts, 1 steering parts, "
                           "1 lens parts, 1 tuned lens translators, 1 calibration parts, 1 "
                           "direction states, 1 direction steering, 1 pairwise parts, 1 "
                           "recorded prompts, 2 reasoning judgments, 1 reasoning span masses")
    assert said.endswith(f" in {tmp_path}")


def _steer_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({
        "config": {"model": "no-such-model"},
        "model": {"spec": "no-such-model", "n_layers": 2, "n_heads": 4}}))
    (run / "records.jsonl").write_text(json.dumps(
        {"id": "a", "dataset": "squad_v2", "status": "ok"}) + "\n")
    return run


def test_a_missing_need_is_refused_in_one_line_before_the_model_loads(tmp_path):
    run = _steer_run(tmp_path)
    cfg = spec("steering").config_class.from_mapping({"heads": "top-diff:4", "band": "all"})
    with pytest.raises(RunDirError, match=r"^\[steering\] heads = 'top-diff:4' needs .*attention"
                                          r"/summary.json, which the attention stage writes: "
                                          r"run `interp attention --run .*` first$"):
        check_needs(run, [("steering", cfg)])
    check_needs(run, [("attention", None), ("steering", cfg)])  # attention runs first: met
    check_needs(run, [("steering", spec("steering").config_class())])  # heads = all: none
    with pytest.raises(RunDirError, match=r"^\[attention\] needs .*records.jsonl, which the "
                                          r"asymmetry stage writes"):
        check_needs(tmp_path / "empty", [("attention", None)])
    check_needs(tmp_path / "empty", [("attention", None)], before=["asymmetry"])
    res = CliRunner().invoke(cli.app, ["steer", "--run", str(run), "--heads", "top-diff:4",
                                       "--band", "all"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "attention/summary.json, which the attention stage writes" in res.output
    assert "no-such-model" not in res.output  # refused before the model was looked up
    (run / "attention").mkdir()
    (run / "attention/summary.json").write_text("{}")
    check_needs(run, [("steering", cfg)])


def test_run_config_refuses_a_missing_need_before_any_model_runs(tiny, tmp_path):
    model_dir = tmp_path / "tiny-model"
    tiny.model.save_pretrained(model_dir)
    tiny.tokenizer.save_pretrained(model_dir)
    cfg = {"out": str(tmp_path / "runs"),
           "asymmetry": {"models": [str(model_dir)], "datasets": ["squad_v2"], "limit": 1},
           "steering": {"heads": "top-diff:4", "band": "all"}}
    with pytest.raises(RunDirError, match=r"^\[steering\] heads = 'top-diff:4' needs .*"
                                          r"tiny-model/attention/summary.json, which the "
                                          r"attention stage writes: run `interp attention "
                                          r"--run .*` first or add an \[attention\] table$"):
        pipeline.run_config(cfg, log=lambda s: None)
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_run_config_refuses_stages_on_a_reasoning_judge_before_any_model_runs(tmp_path):
    cfg = {"out": str(tmp_path / "runs"),
           "asymmetry": {"models": ["no-such/model"], "datasets": ["squad_v2"], "limit": 1,
                         "template": "reasoning"},
           "steering": {"layers": "all"}}
    with pytest.raises(ConfigError, match=r"^\[asymmetry\] template 'reasoning' is a reasoning "
                                          r"judge.*stages \['steering'\]"):
        pipeline.run_config(cfg, log=lambda s: None)
    assert not (tmp_path / "runs").exists()


def test_a_stage_answers_to_its_name_and_its_command():
    runner = CliRunner()
    for name in ("steering", "steer", "patching", "patch"):
        res = runner.invoke(cli.app, [name, "--help"])
        assert res.exit_code == 0 and "--run" in res.output, (name, res.output)


def test_the_wrote_line_names_only_the_files_the_stage_wrote(tmp_path):
    from interp.core.contract import spec

    lens = spec("lens")
    assert lens.written(tmp_path) == "wrote nothing"
    (tmp_path / "lens").mkdir()
    (tmp_path / "lens" / "summary.json").write_text("{}")
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "lens_layers.png").write_bytes(b"")
    line = lens.written(tmp_path)
    # no tuned lens was trained (--no-tuned): its report is not claimed
    assert line == f"wrote {tmp_path / 'lens/summary.json'}, {tmp_path / 'figures/lens_*.png'}"


def _module_files(module: str) -> list[Path]:
    path = ROOT / module.replace(".", "/")
    return [path / "__init__.py", *sorted(path.glob("[!_]*.py"))] if path.is_dir() else [
        path.with_suffix(".py")]


def test_a_stage_states_its_facts_in_its_contract_entry_only():
    from interp.core import errors
    from interp.core.options import StageConfig

    for s in SPECS:
        for f in _module_files(s.module) + _module_files(s.config_module):
            for node in ast.parse(f.read_text()).body:
                if not isinstance(node, ast.Assign):
                    continue
                names = [ast.unparse(t) for t in node.targets]
                value = ast.unparse(node.value)
                assert not value.startswith(("spec(", "SPEC.")), (f, names, value)
                assert "Config" not in names and "NAME" not in names, (f, names)
                if names == ["SPEC"]:
                    assert value == "stage_of(__name__)", (f, value)
        assert s.load().SPEC is s
        cls = s.config_class
        assert issubclass(cls, StageConfig) and cls.stage() == s.name
        assert "from_mapping" not in vars(cls), cls  # the one implementation: StageConfig's
        assert not hasattr(errors, f"{s.name.capitalize()}Error"), s.name
    commands = [s.command for s in SPECS]
    assert sorted(c for c in cli.ORDER if c in commands) == sorted(commands)
    assert len(set(cli.ORDER)) == len(cli.ORDER)


def test_a_new_stage_takes_every_place_from_its_entry(monkeypatch, tmp_path):
    """A hypothetical stage ``demo``, appended to the contract, takes its place everywhere.

    Its entry alone names its module, config, command and place in ``interp --help``, its
    table's errors, needs and kept parts.
    """
    from dataclasses import dataclass

    from interp.core.options import StageConfig, option

    demo = contract.StageSpec(
        name="demo", help="A demo stage.", folder="demo", needs=(contract.Need(
            "asymmetry", "records.jsonl"),),
        parts=(contract.Part("demo/parts/{dataset}__{id}.json", "demo parts", "record",
                             "JSON key 'signature'", naming="flat"),),
        tables=("demo/summary.json",), summaries={"demo/summary.json": "demo_summary.json"})
    assert (demo.command, demo.module, demo.config, demo.config_module) == (
        "demo", "interp.stages.demo", "DemoConfig", "interp.stages.configs.demo")
    specs = (*SPECS, demo)
    monkeypatch.setattr(contract, "SPECS", specs)
    monkeypatch.setattr(cli, "SPECS", specs)

    @dataclass
    class DemoConfig(StageConfig):
        limit: int | None = option(None, kind="count")
        band: str = option("last8", kind="layers")

    DemoConfig.__module__ = "interp.stages.configs.demo"
    assert DemoConfig.from_mapping({"limit": 2}).limit == 2
    with pytest.raises(ConfigError, match=r"^\[demo\]: unknown config keys \['limt'\] "
                                          r"\(did you mean 'limit'\?\)"):
        DemoConfig.from_mapping({"limt": 2})
    with pytest.raises(ConfigError, match=r"^--limit \(\[demo\] limit\) must be a whole"):
        DemoConfig.from_mapping({"limit": 0})
    order = cli._order()
    assert order.index("reasoning") < order.index("demo") < order.index("transfer")
    assert [c for c in order if c != "demo"] == list(cli.ORDER)
    assert spec("demo") is demo and contract.stage_names()[-2:] == ["reasoning", "demo"]
    run = _steer_run(tmp_path)
    (run / "records.jsonl").unlink()
    with pytest.raises(RunDirError, match=r"^\[demo\] needs .*records.jsonl, which the "
                                          r"asymmetry stage writes"):
        check_needs(run, [("demo", DemoConfig())])
    part = demo.parts[0].path(run, "squad_v2", "a")
    part.parent.mkdir(parents=True)
    part.write_text("{}")
    assert kept_work([run]) == f"1 demo parts in {run}"


def test_one_stage_error_carries_the_stage_name_across_processes():
    import pickle

    from interp.core.errors import InterpError, PairError, StageError

    err = StageError("steering", "alphas must include 1 (the unsteered reference)")
    assert isinstance(err, InterpError) and err.stage == "steering"
    assert str(err) == "alphas must include 1 (the unsteered reference)"
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), back.stage, str(back)) == (StageError, "steering", str(err))
    moved = err.reworded(f"[steering] {err}")
    assert (moved.stage, str(moved)) == ("steering", f"[steering] {err}")
    pair = pickle.loads(pickle.dumps(PairError("record 1: no gold answer", "no_gold")))
    assert (pair.stage, pair.reason, str(pair)) == ("patching", "no_gold",
                                                    "record 1: no gold answer")
    assert pair.reworded("x").reason == "no_gold"
    with pytest.raises(StageError, match=r"^alphas must include 1") as got:
        spec("steering").config_class.from_mapping({"alphas": [0.5]})
    assert got.value.stage == "steering"
    with pytest.raises(StageError, match=r"^\[transfer\]: unknown config keys") as got:
        spec("transfer").config_class.from_mapping({"lrr": 1})
    assert got.value.stage == "transfer"
