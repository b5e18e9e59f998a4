"""interp.run.pipeline.swap_sources: a rehearsal config differs from its source in sources only."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from interp.core.errors import ConfigError
from interp.run.pipeline import load_config, swap_sources

CFG = {"name": "x", "out": "runs/x", "figures": "figs",
       "asymmetry": {"models": ["org/big", "other"], "datasets": ["squad_v2", "drop"],
                     "from_hub": True, "oracle": "model:org/big",
                     "limit": {"squad_v2": 12, "drop": 3}},
       "attention": {"band": "24-31"},
       "transfer": {"datasets": ["squad_v2"], "from_hub": True, "oracle": "rule", "rank": 16},
       "steering": {"oracle": "model:other", "alphas": [0.5, 2.0]}}


def test_only_sources_change_and_the_input_is_kept():
    before = copy.deepcopy(CFG)
    new = swap_sources(CFG, models={"org/big": "/ck/a", "other": "/ck/b"},
                       datasets={"squad_v2": "/d/s.jsonl", "drop": "/d/d.jsonl"}, out="/tmp/r")
    assert CFG == before
    assert new["asymmetry"] == {"models": ["/ck/a", "/ck/b"],
                                "datasets": ["/d/s.jsonl", "/d/d.jsonl"], "from_hub": False,
                                "oracle": "model:/ck/a",
                                "limit": {"/d/s.jsonl": 12, "/d/d.jsonl": 3}}
    assert new["transfer"] == {"datasets": ["/d/s.jsonl"], "from_hub": False, "oracle": "rule",
                               "rank": 16}
    assert new["steering"]["oracle"] == "model:/ck/b" and new["attention"] == CFG["attention"]
    assert (new["out"], new["figures"]) == ("/tmp/r", str(Path("/tmp/r") / "figures"))


@pytest.mark.parametrize("models, datasets, match", [
    ({"org/big": "/a"}, {"squad_v2": "s", "drop": "d"}, "model 'other' is not swapped"),
    ({"org/big": "/a", "other": "/b"}, {"squad_v2": "s"}, r"datasets \['drop'\] are not"),
])
def test_an_uncovered_source_is_refused(models, datasets, match):
    with pytest.raises(ConfigError, match=match):
        swap_sources(CFG, models=models, datasets=datasets, out="o")


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file .*missing.toml does not exist"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[asymmetry\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
