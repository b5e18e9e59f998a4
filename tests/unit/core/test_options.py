"""interp.core.options: each config field is declared once and drives its table key and option."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from interp import cli
from interp.core.contract import SPECS, spec
from interp.core.errors import InterpError
from interp.core.options import cli_options, field_help, split_list

ROOT = Path(__file__).resolve().parents[3]


def test_importing_the_command_line_imports_no_torch():
    code = ("import sys, interp.cli\n"
            "from typer.testing import CliRunner\n"
            "assert CliRunner().invoke(interp.cli.app, ['--help']).exit_code == 0\n"
            "print(sorted(m for m in ('torch', 'transformers', 'scipy', 'sklearn') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_field_is_an_option_of_its_command_with_its_help():
    group = typer.main.get_command(cli.app)
    for s in SPECS:
        cmd = group.commands[s.command]
        opts = {o for p in cmd.params for o in p.opts}
        helps = field_help(s.config_class)
        for f in dataclasses.fields(s.config_class):
            assert f.name in helps, f"{s.name}.{f.name} has no Attributes entry"
            if f.metadata.get("cli", True):
                assert f"--{(f.metadata.get('flag') or f.name).replace('_', '-')}" in opts


def _fields_of(cls, tp):
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls)
            if tp in {typing.get_origin(m) or m for m in typing.get_args(hints[f.name])
                      or (hints[f.name],)}]


@pytest.mark.parametrize("s", SPECS, ids=lambda s: s.name)
def test_a_quoted_word_is_never_a_boolean(s):
    """One rule for every key: a bool field given a string is refused, naming the key."""
    cls = s.config_class
    for name in _fields_of(cls, bool):
        with pytest.raises(InterpError, match=rf"\[{s.name}\] {name}\) must be true or false, "
                                              rf"not 'false'$"):
            cls.from_mapping({name: "false"})


def test_a_string_where_a_list_belongs_is_a_comma_list():
    asym = spec("asymmetry").config_class
    assert asym.from_mapping({"datasets": "squad_v2"}).datasets == ["squad_v2"]
    assert asym.from_mapping({"datasets": "squad_v2, drop"}).datasets == ["squad_v2", "drop"]
    assert spec("transfer").config_class.from_mapping({"datasets": "squad_v2"}).datasets == [
        "squad_v2"]
    steer = spec("steering").config_class
    assert steer.from_mapping({"alphas": "0.5,1", "tasks": "eval"}).tasks == ["eval"]
    assert steer.from_mapping({"alphas": "0.5,1"}).alphas == [0.5, 1.0]
    with pytest.raises(InterpError, match=r"^--pairs \(\[patching\] pairs\) must be a list"):
        spec("patching").config_class.from_mapping({"pairs": 3})
    with pytest.raises(InterpError, match=r"^--template \(\[asymmetry\] template\) must be "
                                          r"text, not \['a'\]$"):
        asym.from_mapping({"template": ["a"]})
    assert split_list(["a,b", " c ", ""]) == ["a", "b", "c"]


def test_limit_all_means_every_record_everywhere():
    for s in SPECS:
        cls = s.config_class
        key = "eval_limit" if s.name == "transfer" else "limit"
        assert getattr(cls.from_mapping({key: "all"}), key) is None, s.name
    assert spec("asymmetry").config_class().limit is None  # leaving it out: every record
    with pytest.raises(InterpError, match=r"^--limit \(\[steering\] limit\) must be a whole "
                                          r"number >= 1 \(or all to use every record\), not 0$"):
        spec("steering").config_class.from_mapping({"limit": 0})
    kinds = {o.name: o.kind for o in cli_options(spec("steering").config_class)}
    assert kinds["limit"] == "count" and kinds["alphas"] == "list"
    assert kinds["figures"] == "bool" and kinds["heads"] == "str"


def test_cli_limit_all_and_a_bad_count(tmp_path):
    res = CliRunner().invoke(cli.app, ["steer", "--run", str(tmp_path), "--limit", "all"])
    assert res.exit_code == 2 and "has no manifest.json" in res.output  # all was accepted
    res = CliRunner().invoke(cli.app, ["steer", "--run", str(tmp_path), "--limit", "some"])
    assert res.exit_code == 2
    assert "Invalid value for '--limit': 'some' is not a whole number or 'all'" in res.output


def test_toml_values_are_what_they_say(tmp_path):
    """include_unanswerable = "false" is refused in one line before any model loads."""
    from interp.run.pipeline import run_config

    cfg = tmp_path / "c.toml"
    cfg.write_text('[asymmetry]\nmodels = ["no-such-model"]\ndatasets = "squad_v2"\n'
                   'include_unanswerable = "false"\n')
    with pytest.raises(InterpError, match=r"^--include-unanswerable \(\[asymmetry\] "
                                          r"include_unanswerable\) must be true or false, not "
                                          r"'false'$"):
        run_config(cfg, log=lambda s: None)


def test_the_band_has_one_name_and_its_former_name_still_reads_with_a_warning():
    """`band` is the late-layer band of every table; `layers`, its former name, still reads.

    In [attention], [steering] and [reasoning] it is read as `band` with one warning line (and
    offered as `--layers`); giving both is refused.
    """
    from interp.core.errors import ConfigError
    from interp.core.layers import DEFAULT_BAND
    from interp.core.options import config_from_table

    for s in SPECS:  # a field whose default is the late band is called band, in every stage
        banded = [f.name for f in dataclasses.fields(s.config_class)
                  if f.metadata.get("kind") == "layers" and f.default == DEFAULT_BAND]
        assert banded in ([], ["band"]), (s.name, banded)
    for name in ("attention", "steering", "reasoning"):
        cls = spec(name).config_class
        with pytest.warns(FutureWarning, match=rf"^\[{name}\] layers is now called band; ") as got:
            cfg = config_from_table(cls, {"layers": "last2"}, name)
        assert cfg.band == "last2" and len(got) == 1 and "\n" not in str(got[0].message)
        with pytest.raises(ConfigError, match=rf"^\[{name}\]: layers is the former name of "
                                              rf"band; give band only$"):
            config_from_table(cls, {"layers": "all", "band": "all"}, name)
        assert [o.decls for o in cli_options(cls) if o.name == "band"] == [("--band", "--layers")]
    res = CliRunner().invoke(cli.app, ["attention", "--run", "/nonexistent/run", "--layers",
                                       "all"])
    assert res.exit_code != 0 and "No such option" not in res.output, res.output


def test_every_boolean_option_can_be_turned_on_and_off(monkeypatch):
    """A default of true needs --no-x (`interp patch --no-mine`), for every stage's flags."""
    for s in SPECS:
        for o in cli_options(s.config_class):
            if o.kind == "bool":
                long = [d for d in o.decls if d.startswith("--")]
                assert long and all("/--no-" in d for d in long), (s.name, o.decls)
    seen: dict = {}
    monkeypatch.setattr(cli, "_run_stage", lambda s, cls, kw: seen.update(kw))
    for args, mine in (([], None), (["--no-mine"], False), (["--mine"], True)):
        seen.clear()
        res = CliRunner().invoke(cli.app, ["patch", "--run", "/nonexistent/run", *args])
        assert res.exit_code == 0 and seen["mine"] is mine, (args, res.output)


def test_the_commands_are_listed_in_the_order_a_user_meets_them():
    import click
    import typer.main

    group = typer.main.get_command(cli.app)
    names = group.list_commands(click.Context(group))
    assert set(names) == set(cli.ORDER) and names == list(cli.ORDER)
    assert names[0] == "run" and names.index("asymmetry") < names.index("attention")
