"""The last-row recorder equals eager attention, a hand computation, nnsight and TransformerLens."""

from __future__ import annotations

import pytest
import torch

from interp.analysis.span_mass import span_mass
from interp.hooks.recorder import record_rows
from interp.judging.prompts import get_template, record_prompts, render


def _prompt(tokenizer):
    return render(tokenizer, get_template("default"), "eval",
                  context="The Eiffel Tower is in Paris. It was finished in 1889.",
                  question="When was the Eiffel Tower finished?", answer="1889")


def test_hf_rows_are_exact_and_sum_to_one(tiny):
    ids = _prompt(tiny.tokenizer).input_ids
    hf = record_rows(tiny, ids).rows
    eager = record_rows(tiny, ids, attn="eager").rows
    assert hf.shape == (tiny.n_layers, tiny.n_heads, len(ids))
    torch.testing.assert_close(hf.sum(-1), torch.ones(hf.shape[:2]), atol=1e-5, rtol=0)
    assert (hf - eager).abs().max().item() <= 1e-5
    # the handle's kernel is restored after recording
    assert tiny.model.config._attn_implementation == "sdpa"


def test_gqa_rows_match_manual_attention(tiny):
    """Ground truth computed by hand from hooked q/k projections and RoPE (layer 0)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    ids = torch.tensor(_prompt(tiny.tokenizer).input_ids)[None]
    model = tiny.model
    attn = model.model.layers[0].self_attn
    seen = {}
    h = model.model.layers[0].input_layernorm.register_forward_hook(
        lambda m, i, o: seen.setdefault("x", o))
    with torch.no_grad():
        model(ids)
    h.remove()
    x = seen["x"]
    d = attn.head_dim
    q = attn.q_proj(x).view(1, -1, tiny.n_heads, d).transpose(1, 2)
    k = attn.k_proj(x).view(1, -1, tiny.n_kv_heads, d).transpose(1, 2)
    pos = torch.arange(ids.shape[1])[None]
    cos, sin = model.model.rotary_emb(x, pos)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    group = tiny.n_heads // tiny.n_kv_heads
    want = torch.stack([torch.softmax(q[0, hq, -1] @ k[0, hq // group].T / d ** 0.5, -1)
                        for hq in range(tiny.n_heads)])
    got = record_rows(tiny, ids[0]).rows[0]
    assert (got - want).abs().max().item() < 1e-5


def test_backends_agree_on_a_tiny_checkpoint(tiny, tmp_path):
    """eager, nnsight and TransformerLens give the hf recorder's rows.

    The bridge boots from a checkpoint on disk, so the tiny model is saved and loaded back.
    """
    from interp.models.loading import load_model

    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    handle = load_model(str(tmp_path), device="cpu", dtype="float32")
    ids = _prompt(handle.tokenizer).input_ids
    hf = record_rows(handle, ids).rows
    for backend, attn in (("hf", "eager"), ("nnsight", None), ("transformer_lens", None)):
        rows = record_rows(handle, ids, backend=backend, attn=attn).rows
        assert (rows - hf).abs().max().item() <= 1e-5, backend
    assert handle.model.config._attn_implementation == "sdpa"


@pytest.mark.integration
def test_three_backends_agree_on_the_bundled_model(bundled, quick_run):
    rec = quick_run.read_records()[0]
    p = record_prompts(rec, bundled.tokenizer)["eval"]
    n = 160  # a prefix keeps the test fast; it still holds template, context and question
    ids, labels = p.input_ids[:n], p.labels[:n]
    assert {"template", "context"} <= set(labels)
    masses = {b: span_mass(record_rows(bundled, ids, backend=b).rows, labels)
              for b in ("hf", "transformer_lens", "nnsight")}
    for b in ("transformer_lens", "nnsight"):
        assert (masses[b] - masses["hf"]).abs().max().item() <= 1e-4, b
    assert bundled.model.config._attn_implementation == "sdpa"
    # the bridge wraps a copy: the handle still dispatches through AttentionInterface
    assert record_rows(bundled, ids[:20]).rows.shape[0] == bundled.n_layers
