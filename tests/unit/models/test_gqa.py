"""Grouped-query attention on a Qwen2-shaped model: 14 query heads, 2 key/value heads (7:1).

Qwen2.5-Coder-0.5B-Instruct has this layout; the tiny random Qwen2 here has the same head
counts (and Qwen2's q/k/v biases) at head_dim 4, so the checks run in a second. The same check
on the bundled model is in tests/integration/test_models_qwen.py.
"""

from __future__ import annotations

import pytest
import torch

from interp.core.errors import ModelSpecError
from interp.hooks.capture import hooked
from interp.models.points import HEAD_POINTS, kv_head, n_heads_at, query_heads
from interp.testing import tiny_llama


@pytest.fixture(scope="module")
def tiny_qwen(tiny_tokenizer):
    return tiny_llama(tiny_tokenizer, arch="qwen2", n_layers=2, d_model=56, n_heads=14,
                      n_kv_heads=2, seed=1)


def test_gqa_mapping_7_to_1():
    assert [kv_head(h, 14, 2) for h in range(14)] == [0] * 7 + [1] * 7
    assert list(query_heads(1, 14, 2)) == list(range(7, 14))
    assert list(query_heads(0, 14, 2)) == list(range(7))
    assert [kv_head(h, 8, 2) for h in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]  # Llama 3.1 4:1
    with pytest.raises(ValueError, match="out of range 0..13"):
        kv_head(14, 14, 2)
    with pytest.raises(ValueError, match="out of range 0..1"):
        query_heads(2, 14, 2)
    with pytest.raises(ModelSpecError, match="multiple of key/value heads"):
        kv_head(0, 6, 4)


def _prompts(tok):
    a = tok("Rollo founded Normandy in 911.", add_special_tokens=False)["input_ids"]
    b = tok("Paris is the capital of France.", add_special_tokens=False)["input_ids"]
    n = min(len(a), len(b))
    return torch.tensor([a[:n]]), torch.tensor([b[:n]])


@pytest.mark.parametrize("point", ["attn.hook_v", "attn.hook_k"])
def test_patching_kv_head_1_changes_query_heads_7_to_13_only(tiny_qwen, point):
    """Key/value head 1 from prompt A patched into prompt B: z changes in heads 7-13 only."""
    model, layer = tiny_qwen.model, 1
    a, b = _prompts(tiny_qwen.tokenizer)
    name, z = f"blocks.{layer}.{point}", f"blocks.{layer}.attn.hook_z"
    assert n_heads_at(model, point) == 2 and n_heads_at(model, "attn.hook_z") == 14
    with hooked(model, cache=[name]) as acts:
        model(input_ids=a)
    clean = acts[name]
    assert clean.shape == (1, a.shape[1], 2, 4)

    def patch_kv1(x):
        x = x.clone()
        x[:, :, 1] = clean[:, :, 1]
        return x

    with hooked(model, cache=[z, "blocks.0.attn.hook_z"]) as base:
        model(input_ids=b)
    with hooked(model, cache=[z, "blocks.0.attn.hook_z"], edits={name: patch_kv1}) as patched:
        model(input_ids=b)
    diff = (patched[z] - base[z]).abs()[0]                 # [pos, 14 heads, head_dim]
    per_head = diff[1:].amax(dim=(0, 2))                   # position 0 attends to itself only
    assert torch.equal(patched[z][0, :, :7], base[z][0, :, :7])  # heads 0-6: bit-identical
    assert bool((per_head[7:] > 1e-3).all()), per_head
    assert torch.equal(patched["blocks.0.attn.hook_z"], base["blocks.0.attn.hook_z"])


def test_head_points_are_viewed_per_head(tiny_qwen):
    """hook_k / hook_v are [batch, pos, n_kv_heads, head_dim]; an identity edit changes nothing."""
    model = tiny_qwen.model
    ids = _prompts(tiny_qwen.tokenizer)[0]
    names = [f"blocks.0.{p}" for p in HEAD_POINTS]
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    with hooked(model, cache=names, edits={n: (lambda x: x * 1.0) for n in names}) as acts:
        out = model(input_ids=ids).logits
    assert torch.equal(out, ref)
    n = ids.shape[1]
    assert [tuple(acts[x].shape) for x in names] == [(1, n, 2, 4), (1, n, 2, 4), (1, n, 14, 4)]
