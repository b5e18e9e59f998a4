"""Run directory helpers and model spec handling."""

from __future__ import annotations

import pytest

from interp.errors import RunDirError
from interp.models import ModelSpecError, load_model
from interp.store.io import read_json, write_json
from interp.store.rundir import RunDir


def test_write_json_atomic_and_nan(tmp_path):
    """JSON is written whole (no temp files left) and NaN becomes null."""
    p = write_json(tmp_path / "a" / "x.json", {"v": float("nan"), "w": [1.0]})
    assert read_json(p) == {"v": None, "w": [1.0]}
    assert [q.name for q in p.parent.iterdir()] == ["x.json"]
    # readable like any file the user writes (mkstemp alone would leave it 0600)
    import os

    umask = os.umask(0)
    os.umask(umask)
    assert p.stat().st_mode & 0o777 == 0o666 & ~umask


def test_missing_run_names_the_command(tmp_path):
    """A run without records tells the user what to run first."""
    with pytest.raises(RunDirError, match="interp asymmetry"):
        RunDir(tmp_path).read_records()
    with pytest.raises(RunDirError, match="interp asymmetry"):
        RunDir(tmp_path).manifest()


def test_malformed_middle_line_is_an_error(tmp_path):
    """Only a cut LAST line is tolerated; a bad line elsewhere names its number."""
    rd = RunDir(tmp_path)
    (tmp_path / "records.jsonl").write_text('{"a": 1}\n{bad\n{"a": 2}\n')
    with pytest.raises(RunDirError, match="records.jsonl:2"):
        rd.read_records(status=None)


def test_manifest_key_fields(tmp_path):
    """Non-key fields may change between invocations; key fields may not."""
    rd = RunDir(tmp_path)
    rd.init_manifest({"model": "m", "limit": 5}, model_info={}, key_fields=["model"])
    m = rd.init_manifest({"model": "m", "limit": 9}, model_info={}, key_fields=["model"])
    assert m["config"]["limit"] == 9 and len(m["invocations"]) == 2
    with pytest.raises(RunDirError, match="model"):
        rd.init_manifest({"model": "other", "limit": 9}, model_info={}, key_fields=["model"])


def test_unknown_model_spec():
    """A spec that is no alias, path or hub id is refused with the accepted forms."""
    with pytest.raises(ModelSpecError, match="bundled alias"):
        load_model("no-such-model")
    with pytest.raises(ModelSpecError, match="does not exist"):
        load_model("/nowhere/model.gguf")


def test_config_from_table_names_section_and_keys():
    """One helper refuses unknown config keys for every stage, naming section and known keys."""
    from dataclasses import dataclass

    from interp.inputs import config_from_table

    @dataclass
    class Cfg:
        alpha: int = 1
        beta: str = "x"

    assert config_from_table(Cfg, {"alpha": 3}, "demo") == Cfg(alpha=3)

    class MyError(ValueError):
        pass

    with pytest.raises(MyError, match=r"\[demo\]: unknown config keys \['alpah'\]; known: "
                                      r"\['alpha', 'beta'\]"):
        config_from_table(Cfg, {"alpah": 3}, "demo", MyError)
