"""The demo's records fit its token budgets on both bundled models (tokenizers only).

With the demo's asymmetry limits, each of SQuAD 2.0 and DROP has several eval prompts (gold
answer as the candidate) within the patching and steering ``max_tokens``, so the patching
figure of each model has pairs to show and steering has records to choose both oracle labels
from (``tests/unit/run/test_demo_config.py`` checks the rest of the config).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from interp.data.loading import load_examples
from interp.judging.prompts import get_template, render
from interp.models.loading import load_tokenizer

DEMO = tomllib.loads((Path(__file__).resolve().parents[2] / "experiments" / "demo.toml"
                      ).read_text())


@pytest.mark.parametrize("model", DEMO["asymmetry"]["models"])
def test_demo_datasets_have_prompts_within_the_token_budgets(model):
    tok, template = load_tokenizer(model), get_template("default")
    budget = min(DEMO["patching"]["max_tokens"], DEMO["steering"]["max_tokens"])
    for ds in ("squad_v2", "drop"):
        lengths = []
        for ex in load_examples(ds, limit=DEMO["asymmetry"]["limit"][ds]):
            gold = ex.answers[0]
            lengths.append(len(render(tok, template, "eval", context=ex.context,
                                      question=ex.question, answer=gold, reference=gold)))
        # measured: SmolLM2 squad_v2 9 of 12, drop 9 of 12 within 512 (Qwen alike)
        assert sum(n <= budget - 32 for n in lengths) >= 6, (ds, lengths)
