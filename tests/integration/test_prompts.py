"""Prompt rendering with the bundled SmolLM2 tokenizer.

Every test of ``tests/unit/test_prompts.py`` runs again here with ``tok`` = the bundled
tokenizer, plus what only SmolLM2's chat template does.
"""

from __future__ import annotations

import pytest

from interp.prompts import get_template, render
from tests.unit.test_prompts import *  # noqa: F403 - the same tests, collected with this `tok`
from tests.unit.test_prompts import CTX, Q

pytestmark = pytest.mark.integration


@pytest.fixture()
def tok(tokenizer):
    return tokenizer


def test_default_system_prompt_is_template(tok):
    """SmolLM2's chat template inserts its own system turn when a variant has none."""
    p = render(tok, get_template("closed_book"), "eval", context=CTX, question=Q,
               answer="Rollo")
    assert p.text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    first = p.token_spans["question"][0]
    assert set(p.labels[:first]) == {"template"}
    s, e = p.token_spans["candidate"]
    assert tok.decode(p.input_ids[s:e]).strip() == "Rollo"
