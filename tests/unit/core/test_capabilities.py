"""One model interface: stages are chosen or refused by what the model can do, not by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from interp.core.capabilities import CAPABILITIES, IN_PROCESS, SERVED, capabilities, is_served
from interp.core.contract import SPECS, spec
from interp.core.errors import ConfigError
from interp.stages.common import check_capabilities

ROOT = Path(__file__).resolve().parents[3]


def test_every_stage_declares_known_needs_and_a_model_source():
    for s in SPECS:
        assert s.model_needs and s.model_needs <= set(CAPABILITIES), s.name
        assert s.model_from in ("run", "config", "stage"), s.name
        assert (s.model_from == "run") == s.needs_run, s.name


def test_a_served_model_runs_study_1_and_nothing_that_reads_internals():
    assert capabilities("openai:qwen") == SERVED and capabilities("smollm2-135m-instruct") == \
        IN_PROCESS
    runs = {s.name for s in SPECS if s.model_needs <= capabilities("openai:qwen")}
    assert runs == {"asymmetry"}
    check_capabilities("asymmetry", "openai:qwen")  # replies and log-probs are enough
    for s in SPECS:
        check_capabilities(s.name, "smollm2-135m-instruct")
    with pytest.raises(ConfigError, match=r"^\[attention\] needs the model's attention; "
                                          r"openai:qwen \(served behind an endpoint"):
        check_capabilities("attention", "openai:qwen", where="[attention]")
    with pytest.raises(ConfigError, match="needs the model's weights"):
        check_capabilities(spec("transfer").command, "openai:qwen")
    with pytest.raises(ConfigError, match="needs the model's weights"):
        check_capabilities(None, "openai:qwen")  # a command that loads the run's weights


def test_both_model_kinds_answer_the_same_question():
    from interp.endpoints.client import Endpoint, EndpointConfig
    from interp.models.loading import ModelHandle

    assert ModelHandle(model=None, tokenizer=None, spec="x").capabilities == IN_PROCESS
    ep = Endpoint(EndpointConfig.from_spec("openai:m", {"base_url": "http://127.0.0.1:9/v1"}))
    assert ep.capabilities == SERVED == capabilities(ep.spec)
    assert is_served(ep.spec) and not is_served("smollm2-135m-instruct") and not is_served(None)


def test_the_served_prefix_is_tested_in_one_place():
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in (ROOT / "interp").rglob("*.py")
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"""startswith\(\s*["']openai:""", line)]
    assert hits == []
    cli = (ROOT / "interp/cli.py").read_text()
    assert not re.search(r"""s\.name == ["']""", cli), "cli.py chooses by stage name"
