"""interp.core.inputs: the checks every command shares (issue 17), and the CLI's use of them."""

from __future__ import annotations

import json

import pytest
import typer.main
from typer.testing import CliRunner

from interp import cli
from interp.core.errors import ConfigError, InterpError
from interp.core.inputs import kept_work, new_run_dir, read_toml, write_result
from interp.core.options import check_counts
from interp.stages import STAGES
from interp.stages.asymmetry import AsymmetryConfig


def test_read_toml_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"^config file .*nope.toml does not exist$"):
        read_toml(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[a\n")
    with pytest.raises(ConfigError, match=r"bad.toml is not valid TOML: .*line 1"):
        read_toml(bad)
    bad.write_bytes(b"x = '\xff'\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_toml(bad)
    ok = tmp_path / "ok.toml"
    ok.write_text('name = "x"\n[asymmetry]\nlimit = 3\n')
    assert read_toml(ok) == {"name": "x", "asymmetry": {"limit": 3}}


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "3"])
def test_counts_must_be_whole_numbers_of_at_least_one(value):
    with pytest.raises(ConfigError, match=rf"^--limit \(\[asymmetry\] limit\) must be a whole "
                                          rf"number >= 1 \(leave it out to use every record\), "
                                          rf"not {value!r}$"):
        AsymmetryConfig.from_mapping({"limit": value})
    with pytest.raises(ConfigError, match=r"--batch-size \(\[asymmetry\] batch_size\)"):
        AsymmetryConfig.from_mapping({"batch_size": value})


def test_every_stage_config_refuses_limit_zero():
    for name, stage in STAGES.items():
        key = "eval_limit" if name == "transfer" else "limit"
        cls = stage.SPEC.config_class
        with pytest.raises(InterpError, match=rf"\[{name}\] {key}\) must be a whole number"):
            cls.from_mapping({key: 0})
        if cls.__dataclass_fields__[key].default is None:
            check_counts(cls.from_mapping({key: None}), name)  # None: every record


def test_new_run_dir_removes_only_what_it_created_without_results(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RuntimeError), new_run_dir(out):
        out.mkdir()
        (out / "manifest.json").write_text("{}")
        raise RuntimeError("failed after the manifest")
    assert not out.exists()
    with pytest.raises(KeyboardInterrupt), new_run_dir(out):
        out.mkdir()
        (out / "records.jsonl").write_text('{"id": "a"}\n')
        raise KeyboardInterrupt
    assert (out / "records.jsonl").exists()  # a kept record: the run resumes
    (out / "records.jsonl").unlink()
    with pytest.raises(RuntimeError), new_run_dir(out):  # existed before: never touched
        raise RuntimeError
    assert out.is_dir()


def test_write_result_keeps_a_summary_when_nothing_was_computed(tmp_path):
    path = tmp_path / "summary.json"
    said: list[str] = []
    assert write_result(path, {"n": 0}, n=0, log=said.append)  # nothing there yet: written
    path.write_text('{"n": 5}\n')
    assert not write_result(path, {"n": 0}, n=0, log=said.append)
    assert path.read_text() == '{"n": 5}\n'
    assert said == [f"nothing was computed; {path} is kept as it was"]
    assert write_result(path, {"n": 2}, n=2)
    assert json.loads(path.read_text()) == {"n": 2}


def test_kept_work_counts_each_kind(tmp_path):
    assert kept_work([tmp_path]) == "nothing"
    (tmp_path / "records.jsonl").write_text('{"a": 1}\n{"a": 2}\n\n{"a": 3}\n')
    parts = tmp_path / "patching" / "candidate-swap" / "resid" / "parts"
    parts.mkdir(parents=True)
    for k in range(2):
        (parts / f"p{k}.json").write_text("{}")
    assert kept_work([tmp_path]) == f"3 records, 2 patching parts in {tmp_path}"


def test_every_option_has_help_text():
    group = typer.main.get_command(cli.app)
    missing = [f"{name} --{p.name}" for name, cmd in group.commands.items()
               for p in cmd.params if not getattr(p, "help", None)]
    assert missing == []
    assert "seed 003" not in (group.commands["probe"].help or "")


@pytest.mark.parametrize("args", [["patch", "--limit", "0"], ["steer", "--limit", "-2"],
                                  ["attention", "--limit", "0"], ["probe", "--limit", "0"],
                                  ["record", "--limit", "0"], ["transfer", "--eval-limit", "0"]])
def test_cli_refuses_limit_zero_before_reading_the_run(tmp_path, args):
    res = CliRunner().invoke(cli.app, [*args, *(["--run", str(tmp_path / "none")]
                                                if args[0] != "transfer" else
                                                ["--out", str(tmp_path / "none")])])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: --") and "must be a whole number >= 1" in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "none").exists()


def test_an_unknown_name_gets_the_nearest_known_one(tmp_path):
    from interp.core.names import did_you_mean

    assert did_you_mean("limt", ["limit", "seed"]) == " (did you mean 'limit'?)"
    assert did_you_mean("data/squad_v3.jsonl", ["squad_v2", "drop"]) == (
        " (did you mean 'squad_v2'?)")
    assert did_you_mean("zzz", ["limit"]) == ""
    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "c"\n[asymmetry]\nlimt = 3\n')
    for argv, want in ((["run", str(cfg)], "unknown config keys ['limt'] (did you mean "
                                           "'limit'?)"),
                       (["asymmetry", "--dataset", "squad_v3", "--out", str(tmp_path / "o")],
                        "unknown dataset 'squad_v3' (did you mean 'squad_v2'?)"),
                       (["asymmetry", "--dataset", "my/squad_v3.jsonl", "--out",
                         str(tmp_path / "o")], "(did you mean 'squad_v2'?); the bundled "
                                                "datasets are squad_v2, drop"),
                       (["asymmetry", "--model", "smollm2-135m", "--out", str(tmp_path / "o")],
                        "unknown model spec 'smollm2-135m' (did you mean "
                        "'smollm2-135m-instruct'?)")):
        res = CliRunner().invoke(cli.app, argv)
        assert res.exit_code == 2 and want in res.output, (argv, res.output)
