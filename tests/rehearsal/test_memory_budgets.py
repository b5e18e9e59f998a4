"""Peak memory grows as each method's stated budget says, at Llama 3.1's vocabulary and heads.

The reduced stand-in (:func:`interp.testing.llama31_standin` with ``narrow``): Llama-3.1-8B's
vocabulary (128,256), head layout (32 query / 8 key-value heads of width 128) and rope
scaling at a residual width of 256 and 2 layers, so that a readout over layers x positions x
vocabulary is large (394 MiB of float32 at 3 readouts x 256 positions) while the model is
small. Each test measures the peak resident memory of a call above the memory before it
(:func:`interp.testing.peak_rss_rise`, freed blocks of 1 MiB and more returned to the system)
with a small budget and, as the control, without one: the budgeted peak stays within a few
budgets while the control's reaches the size the budget avoids.
"""

from __future__ import annotations

import pytest
import torch

from interp.hooks import recorder
from interp.methods import lens
from interp.testing import llama31_standin, mmap_large_blocks, peak_rss_rise

MIB = 2**20


@pytest.fixture(scope="module")
def standin():
    if not mmap_large_blocks():
        pytest.skip("needs glibc's mallopt to measure freed memory")
    return llama31_standin(2, narrow=256, dtype=torch.float32)


def test_the_reduced_standin_has_the_paper_vocabulary_heads_and_rope(standin):
    cfg = standin.model.config
    assert (cfg.vocab_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (
        128256, 32, 8, 128)
    assert cfg.rope_scaling["rope_type"] == "llama3" and cfg.rope_scaling["factor"] == 8.0
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.tie_word_embeddings) == (256, 2, False)


def test_lens_kl_is_chunked_by_positions_within_its_budget(standin, monkeypatch):
    n = 96
    ro = lens.readout(standin.model)
    stack, final = lens.residual_stack(standin, torch.randint(3, 500, (n,)).tolist(),
                                       list(range(n)))
    full_mib = stack.shape[0] * n * 128256 * 4 / MIB             # layers x positions x vocab
    monkeypatch.setattr(lens, "LOGIT_CHUNK_BYTES", 2**40)       # control: one chunk
    whole, rise_whole = peak_rss_rise(lambda: lens.lens_kl(ro, stack, final))
    monkeypatch.setattr(lens, "LOGIT_CHUNK_BYTES", 4 * MIB)
    chunked, rise = peak_rss_rise(lambda: lens.lens_kl(ro, stack, final))
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)
    assert rise_whole >= full_mib, (rise_whole, full_mib)
    assert rise <= 8 * 4, rise  # a few chunks of 4 MiB (logits, log-softmax, p - q, ...)


def test_reply_lens_is_chunked_by_positions_within_its_budget(standin, monkeypatch):
    prompt = torch.randint(3, 500, (16,)).tolist()
    reply = torch.randint(3, 500, (95,)).tolist()
    full_mib = (standin.n_layers + 1) * len(reply) * 128256 * 4 / MIB
    monkeypatch.setattr(lens, "LOGIT_CHUNK_BYTES", 2**40)
    whole, rise_whole = peak_rss_rise(lambda: lens.reply_lens(standin, prompt, [reply]))
    monkeypatch.setattr(lens, "LOGIT_CHUNK_BYTES", 4 * MIB)
    chunked, rise = peak_rss_rise(lambda: lens.reply_lens(standin, prompt, [reply]))
    torch.testing.assert_close(chunked["logprobs"], whole["logprobs"], rtol=1e-5, atol=1e-3)
    # the same values up to float32 rounding: with several threads a matmul over a chunk of
    # positions may sum in another order than over all of them
    torch.testing.assert_close(chunked["first_logprobs"], whole["first_logprobs"],
                               rtol=1e-6, atol=1e-4)
    assert rise_whole >= full_mib, (rise_whole, full_mib)
    # the model's own logits of the reply positions [pos, vocab] are the method's budget:
    # positions x vocab (the forward's output, the copy kept, its log-softmax), never times
    # the layers
    own_mib = len(reply) * 128256 * 4 / MIB
    assert rise <= 3.2 * own_mib + 8 * 4, (rise, own_mib)
    assert rise_whole >= rise + full_mib, (rise_whole, rise, full_mib)


def test_streamed_patterns_stay_flat_and_in_memory_patterns_are_held_once(standin, monkeypatch):
    n = 1024
    ids = torch.randint(3, 500, (n,))
    layer_mib = standin.n_heads * n * n * 4 / MIB                 # one layer's pattern: 128 MiB
    monkeypatch.setattr(recorder, "PATTERN_CHUNK_BYTES", 8 * MIB)

    def plain():
        with torch.no_grad():
            return standin.model(input_ids=ids[None], use_cache=False, logits_to_keep=1).logits

    _, own = peak_rss_rise(plain)                                  # the forward's own memory
    got = []
    rows, rise = peak_rss_rise(lambda: recorder.record_stream(
        standin, ids, lambda name, h0, v: got.append((name, h0, float(v[:, -1].sum()))),
        layers=[0, 1], points=()))
    assert len(got) == 2 * standin.n_heads // 2                   # chunks of 2 heads
    assert all(abs(s - 2.0) < 1e-4 for _, _, s in got)          # 2 heads' last rows sum to 1
    # one chunk (8 MiB), its layer's output and mask beside the forward's own, not the
    # recorded layers' patterns (256 MiB)
    assert rise <= own + 48, (rise, own)
    assert own + 48 < 2 * layer_mib
    rec, rise_mem = peak_rss_rise(lambda: recorder.record_rows(standin, ids, act_layers=[0, 1],
                                                                patterns=True))
    size = rec.acts["pattern"].nbytes / MIB                        # both layers: 256 MiB
    others = sum(v.nbytes for k, v in rec.acts.items() if k != "pattern") / MIB
    assert size == 2 * layer_mib
    # held once (no stacked copy): the patterns, what else it returns, the forward's own
    assert size <= rise_mem <= 1.05 * size + others + own, (rise_mem, size, others, own)
    torch.testing.assert_close(rec.rows, rows, rtol=0, atol=1e-5)
