"""Equivalence tests pair the tiny models with the tokenizer built in code."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer(tiny_tokenizer):
    """``tokenizer`` is the tokenizer built in code here (the bundled one only via ``bundled``)."""
    return tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_on_disk(tiny, tmp_path_factory):
    """The tiny model saved and loaded back: TransformerLens boots a bridge from a checkpoint."""
    from interp.models.loading import load_model

    path = tmp_path_factory.mktemp("tiny_checkpoint")
    tiny.model.save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    return load_model(str(path), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def multi_on_disk(tmp_path_factory):
    """A tiny model, saved and loaded back, whose tokenizer splits both verdict replies.

    Correct = C + orrect, Incorrect = I + nc + orrect: the whole-reply score needs the
    replies' later tokens.
    """
    from interp.models.loading import load_model
    from interp.testing import tiny_llama, tiny_tokenizer

    tok = tiny_tokenizer(vocab_size=280)
    h = tiny_llama(tok, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, seed=1)
    path = tmp_path_factory.mktemp("multi_checkpoint")
    h.model.save_pretrained(path)
    tok.save_pretrained(path)
    return load_model(str(path), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def multi_prompts(multi_on_disk):
    """Eval prompts (Paris: clean, Rome: corrupt) in the split-reply tokenizer."""
    from interp.judging.prompts import get_template, render

    kw = {"context": "The Eiffel Tower is in Paris.", "question": "Where is it?"}
    tok = multi_on_disk.tokenizer
    return (render(tok, get_template(), "eval", answer="Paris", **kw),
            render(tok, get_template(), "eval", answer="Rome", **kw))
