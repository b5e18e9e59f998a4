"""Batched greedy decoding equals one-at-a-time decoding; padding does not leak."""

from __future__ import annotations

import pytest
import torch

from interp.generation import generate, left_pad, verdict_scores
from interp.prompts import get_template, render


def _prompts(tok, n=5):
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


def test_batched_equals_single_tiny(tiny):
    """float32: batched output (different lengths, left padded) equals one-at-a-time."""
    prompts = _prompts(tiny.tokenizer)
    one = generate(tiny, prompts, batch_size=1, max_new_tokens=8, stop_strings=(),
                   keep_first_logits=True)
    many = generate(tiny, prompts, batch_size=5, max_new_tokens=8, stop_strings=(),
                    keep_first_logits=True)
    assert [g.token_ids for g in one] == [g.token_ids for g in many]
    for a, b in zip(one, many):
        torch.testing.assert_close(a.first_logits, b.first_logits, atol=1e-4, rtol=1e-4)


def test_first_logits_match_plain_forward(tiny):
    """first_logits are the logits of the prompt's last position in an unpadded forward."""
    p = _prompts(tiny.tokenizer, 2)
    (g, _) = generate(tiny, p, batch_size=2, max_new_tokens=1, keep_first_logits=True)
    with torch.no_grad():
        ref = tiny.model(torch.tensor([p[0]])).logits[0, -1]
    torch.testing.assert_close(g.first_logits, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.integration
def test_batched_equals_single_bundled(bundled):
    """The same on the bundled model, real prompts, with the newline stop rule."""
    prompts = _prompts(bundled.tokenizer, 4)
    one = generate(bundled, prompts, batch_size=1, max_new_tokens=12)
    many = generate(bundled, prompts, batch_size=4, max_new_tokens=12)
    assert [g.text for g in one] == [g.text for g in many]
    assert all(g.stop in ("eos", "stop_string", "max_new_tokens") for g in many)


def test_verdict_scores():
    """logit diff is l_C - l_I and p_correct its sigmoid."""
    logits = torch.zeros(10)
    logits[3], logits[7] = 2.0, 0.5
    diff, p = verdict_scores(logits, 3, 7)
    assert diff == pytest.approx(1.5)
    assert p == pytest.approx(1 / (1 + torch.exp(torch.tensor(-1.5)).item()))
