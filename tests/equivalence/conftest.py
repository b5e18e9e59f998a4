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
    from interp.models import load_model

    path = tmp_path_factory.mktemp("tiny_checkpoint")
    tiny.model.save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    return load_model(str(path), device="cpu", dtype="float32")
