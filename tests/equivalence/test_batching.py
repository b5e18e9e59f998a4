"""Padding and batching change nothing: generation, residual streams and probe features."""

from __future__ import annotations

import pytest
import torch

from interp.judging.generation import generate
from interp.judging.prompts import get_template, render
from interp.judging.residual_features import POOLS, extract_features, residual_stream
from tests.unit.judging.test_generation import prompts_of

GOOD = ["Paris", "Rome", "Berlin", "Madrid", "banana", "seven", "blue sky", "a dog"]


def hook_outputs(handle, ids, mask=None):
    """resid_post of every layer from forward hooks on the decoder layers (ground truth)."""
    layers = handle.model.model.layers
    got = {}
    hs = [layer.register_forward_hook(
        lambda m, a, o, L=L: got.__setitem__(L, (o[0] if isinstance(o, tuple) else o).clone()))
        for L, layer in enumerate(layers)]
    try:
        with torch.inference_mode():
            out = handle.model.model(input_ids=ids, attention_mask=mask,
                                     output_hidden_states=True)
    finally:
        for h in hs:
            h.remove()
    return got, out


def test_generation_batched_equals_single(tiny):
    """float32: batched output (different lengths, left padded) equals one-at-a-time."""
    prompts = prompts_of(tiny.tokenizer)
    one = generate(tiny, prompts, batch_size=1, max_new_tokens=8, stop_strings=(),
                   keep_first_logits=True)
    many = generate(tiny, prompts, batch_size=5, max_new_tokens=8, stop_strings=(),
                    keep_first_logits=True)
    assert [g.token_ids for g in one] == [g.token_ids for g in many]
    for a, b in zip(one, many):
        torch.testing.assert_close(a.first_logits, b.first_logits, atol=1e-4, rtol=1e-4)


def test_residual_stream_equals_hooks_and_hidden_states(tiny):
    """resid_post = the decoder layers' outputs = hidden_states[L + 1], but for the last layer.

    The last entry of hidden_states is after the final norm.
    """
    ids = torch.tensor([tiny.tokenizer("The cat sat on the mat.")["input_ids"]])
    got, out = hook_outputs(tiny, ids)
    n = tiny.n_layers
    hs = out.hidden_states
    assert len(hs) == n + 1
    assert torch.allclose(hs[0], tiny.model.model.embed_tokens(ids))  # resid_pre of layer 0
    for L in range(n - 1):
        assert torch.equal(hs[L + 1], got[L])
    assert torch.allclose(hs[n], tiny.model.model.norm(got[n - 1]), atol=1e-6)
    assert not torch.allclose(hs[n], got[n - 1], atol=1e-3)
    resid = residual_stream(tiny, ids)
    assert resid.shape == (1, n, ids.shape[1], tiny.info["d_model"])
    for L in range(n):
        assert torch.allclose(resid[0, L], got[L][0], atol=1e-6)


def test_padded_features_equal_unpadded(tiny):
    tpl = get_template("default")
    prompts = [render(tiny.tokenizer, tpl, "eval", question="What is the capital?",
                      context=" ".join(["The city of Paris is the capital of France."] * (1 + k)),
                      answer=GOOD[k % 8]) for k in range(5)]
    assert len({len(p) for p in prompts}) == 5  # different lengths: padding happens
    one, _ = extract_features(tiny, prompts, batch_size=1)
    batch, _ = extract_features(tiny, prompts, batch_size=5)
    for p in POOLS:
        assert one[p].shape == (5, tiny.n_layers, tiny.info["d_model"])
        torch.testing.assert_close(batch[p], one[p], atol=1e-4, rtol=1e-4)
    # and the unpadded features equal hooks on a single unpadded forward
    got, _ = hook_outputs(tiny, torch.tensor([prompts[2].input_ids]))
    s, e = prompts[2].token_spans["candidate"]
    for L in range(tiny.n_layers):
        torch.testing.assert_close(one["candidate"][2, L], got[L][0, s:e].mean(0), atol=1e-5,
                                   rtol=1e-5)
        torch.testing.assert_close(one["last"][2, L], got[L][0, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.integration
def test_generation_batched_equals_single_bundled(bundled):
    """The same on the bundled model, real prompts, with the newline stop rule."""
    prompts = prompts_of(bundled.tokenizer, 4)
    one = generate(bundled, prompts, batch_size=1, max_new_tokens=12)
    many = generate(bundled, prompts, batch_size=4, max_new_tokens=12)
    assert [g.text for g in one] == [g.text for g in many]
    assert all(g.stop in ("eos", "stop_string", "max_new_tokens") for g in many)
