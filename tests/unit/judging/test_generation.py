"""Greedy decoding helpers: left padding, first-step logits, the verdict score."""

from __future__ import annotations

import torch

from interp.judging.generation import generate
from interp.judging.prompts import get_template, render
from interp.models.kv_cache import left_pad


def prompts_of(tok, n=5):
    ctx = ["Paris is the capital of France.", "The river Nile flows north through Egypt and "
           "Sudan to the Mediterranean Sea.", "Rollo founded Normandy in 911.",
           "Water boils at 100 degrees Celsius at sea level, and at lower temperatures higher "
           "up in the mountains.", "3.5 million people live there."][:n]
    return [render(tok, get_template(), "gen", context=c, question="What is stated?").input_ids
            for c in ctx]


def test_left_pad_shapes():
    """Left padding puts pads first and marks them 0 in the mask."""
    ids, mask = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_first_logits_match_plain_forward(tiny):
    """first_logits are the logits of the prompt's last position in an unpadded forward."""
    p = prompts_of(tiny.tokenizer, 2)
    (g, _) = generate(tiny, p, batch_size=2, max_new_tokens=1, keep_first_logits=True)
    with torch.no_grad():
        ref = tiny.model(torch.tensor([p[0]])).logits[0, -1]
    torch.testing.assert_close(g.first_logits, ref, atol=1e-4, rtol=1e-4)
