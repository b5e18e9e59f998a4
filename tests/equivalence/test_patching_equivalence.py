"""Patching invariants that hold by construction, and the three backends agreeing.

* patch every position = the clean run (equal lengths: the whole-reply score; unequal lengths
  with the prefix/suffix alignment: every aligned position restores the verdict position's
  logits);
* a request that touches no activation is refused, naming the position, on every backend;
* the shared-prefix key/value cache gives the same numbers as full runs;
* ``hf`` (replies scored from the patched cache), ``transformer_lens`` and ``nnsight``
  (replies appended to the prompt) give the same whole-reply scores;
* cross-model patching: the donor's last residual stream at every position reproduces the
  donor's verdict (fraction 1), patching a model with itself changes nothing, and batched
  rows equal one-layer-at-a-time runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp.core.errors import StageError
from interp.methods.pairs import align_positions
from interp.methods.patching import Patch, Patcher
from interp.methods.transfer import cross_model_patching
from interp.models.points import decoder_layers


def test_patch_every_position_restores_the_clean_run(multi_on_disk, multi_prompts):
    h = multi_on_disk
    clean, corrupt = multi_prompts
    from interp.judging.prompts import get_template, render

    kw = {"context": "The Eiffel Tower is in Paris.", "question": "Where is it?"}
    same_len = render(h.tokenizer, get_template(), "eval", answer="Berlin", **kw)
    assert len(same_len) == len(clean)
    for prefix in (True, False):
        pt = Patcher(h, clean.input_ids, same_len.input_ids, prefix_cache=prefix, batch_size=3)
        res = pt.run([Patch("blocks.0.hook_resid_pre"),
                      [Patch("blocks.0.hook_resid_pre")] + [
                          Patch(f"blocks.{x}.attn.hook_z") for x in range(h.n_layers)]])
        assert abs(pt.clean_ld - pt.corrupt_ld) > 1e-2
        # the embeddings of every position: the whole clean run, replies included
        np.testing.assert_allclose(res.patched, pt.clean_ld, atol=1e-4)
        np.testing.assert_allclose(res.effect, 1.0, atol=1e-3)
    # unequal lengths: every aligned position (embeddings, then every head's output) gives
    # the clean verdict position; the replies' later tokens read the unpatched middle
    pm, _, middle = align_positions(clean.input_ids, corrupt.input_ids)
    assert middle == (0, 0) and -1 in pm
    pt = Patcher(h, clean.input_ids, corrupt.input_ids, pos_map=pm)
    res = pt.run([[Patch("blocks.0.hook_resid_pre")] + [
        Patch(f"blocks.{x}.attn.hook_z") for x in range(h.n_layers)]], keep_logits=True)
    with torch.no_grad():
        ref = h.model(torch.tensor([clean.input_ids])).logits[0, -1]
    np.testing.assert_allclose(res.last_logits[0].numpy(), ref.numpy(), atol=1e-4)


@pytest.mark.parametrize("backend", ["hf", "transformer_lens", "nnsight"])
def test_a_patch_that_touches_nothing_is_refused(multi_on_disk, multi_prompts, backend):
    """Issue 12, item 6: a position in the shared prefix, a position mapped to -1."""
    clean, corrupt = multi_prompts
    pm, prefix, _ = align_positions(clean.input_ids, corrupt.input_ids)
    assert prefix > 4
    pt = Patcher(multi_on_disk, clean.input_ids, corrupt.input_ids, pos_map=pm,
                 backend=backend)
    with pytest.raises(StageError, match="position 1 lies in the shared prefix"):
        pt.run([Patch("blocks.0.hook_resid_post", (1,))])
    unmapped = pm.index(-1)
    with pytest.raises(StageError, match=f"position {unmapped} has no clean counterpart"):
        pt.run([Patch("blocks.1.attn.hook_z", (unmapped,), (2,))])
    assert pt.clean_lp is None  # refused before any forward


def test_prefix_cache_matches_full_run(multi_on_disk, multi_prompts):
    h = multi_on_disk
    clean, corrupt = multi_prompts
    pm, _, _ = align_positions(clean.input_ids, corrupt.input_ids)
    a = Patcher(h, clean.input_ids, corrupt.input_ids, pos_map=pm, batch_size=7)
    n = len(corrupt)
    rows = [Patch(f"blocks.{x}.hook_resid_pre", (i,)) for x in range(h.n_layers)
            for i in a.patchable()[-12:]] + [
        Patch(f"blocks.{x}.attn.hook_z", None, (k,)) for x in range(h.n_layers)
        for k in range(h.n_heads)]
    ra = a.run(rows)
    rb = Patcher(h, clean.input_ids, corrupt.input_ids, pos_map=pm, prefix_cache=False,
                 batch_size=32).run(rows)
    assert a.use_prefix and 0 < a.start < n
    np.testing.assert_allclose(ra.patched, rb.patched, atol=1e-4)
    np.testing.assert_allclose(ra.coverage, rb.coverage, atol=1e-5)
    assert ra.n_runs == len(rows)


@pytest.mark.parametrize("backend", ["transformer_lens", "nnsight"])
def test_backends_agree_with_hf_on_whole_reply_scores(multi_on_disk, multi_prompts, backend):
    h = multi_on_disk
    clean, corrupt = multi_prompts
    pm, _, _ = align_positions(clean.input_ids, corrupt.input_ids)
    n = len(corrupt)
    rows = [Patch("blocks.0.hook_resid_pre", (n - 3, n - 1)),
            Patch("blocks.1.hook_resid_post", (n - 1,)),
            Patch("blocks.1.attn.hook_z", None, (2,)),
            Patch("blocks.0.attn.hook_z", (n - 1,), (0, 3))]
    ref = Patcher(h, clean.input_ids, corrupt.input_ids, pos_map=pm, prefix_cache=False
                  ).run(rows)
    other = Patcher(h, clean.input_ids, corrupt.input_ids, pos_map=pm, backend=backend
                    ).run(rows)
    assert abs(ref.clean - other.clean) < 1e-4 and abs(ref.corrupt - other.corrupt) < 1e-4
    np.testing.assert_allclose(other.patched, ref.patched, atol=1e-4)
    np.testing.assert_allclose(other.logprob_incorrect, ref.logprob_incorrect, atol=1e-4)


@pytest.fixture(scope="module")
def perturbed(tiny):
    """``tiny`` with two weight matrices of its blocks changed.

    A stand-in for an adapter: it leaves the final norm and the unembedding alone.
    """
    import copy

    from interp.models.loading import ModelHandle

    model = copy.deepcopy(tiny.model)
    g = torch.Generator().manual_seed(0)
    blocks = decoder_layers(model)
    with torch.no_grad():
        for w in (blocks[-1].self_attn.o_proj.weight, blocks[0].mlp.down_proj.weight):
            w.add_(torch.randn(w.shape, generator=g) * 0.2)
    return ModelHandle(model=model, tokenizer=tiny.tokenizer, spec="tiny-perturbed",
                       info=dict(tiny.info))


def test_cross_model_patching_ground_truths(tiny, perturbed, patch_prompts):
    clean, corrupt = patch_prompts
    p, q = clean.input_ids, corrupt.input_ids[:30]
    res = cross_model_patching(tiny, perturbed, [p, q], positions="all")
    # the donor's last residual stream at every position is the donor's whole run (one-token
    # replies in this tokenizer: the whole reply is the verdict position's)
    assert res["fraction_a_to_b"][-1] == pytest.approx(1.0, abs=1e-4)
    assert res["fraction_b_to_a"][-1] == pytest.approx(1.0, abs=1e-4)
    np.testing.assert_allclose([r[-1] for r in res["patched_a_to_b"]], res["ld_adapter"],
                               atol=1e-4)
    # a model patched with a copy of itself does not change; with itself it is refused
    import copy

    from interp.core.errors import StageError
    from interp.models.loading import ModelHandle

    twin = ModelHandle(model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer, spec="twin",
                       info=dict(tiny.info))
    same = cross_model_patching(tiny, twin, [p], positions="all")
    np.testing.assert_allclose(same["patched_a_to_b"][0], same["ld_base"][0], atol=1e-5)
    assert same["fraction_a_to_b"] is None
    with pytest.raises(StageError, match="the base model itself"):
        cross_model_patching(tiny, tiny, [p])
    # batched rows equal one-layer-at-a-time runs
    both = cross_model_patching(tiny, perturbed, [p], positions="last", layers=[0, 1])
    one = [cross_model_patching(tiny, perturbed, [p], positions="last", layers=[x])
           ["patched_a_to_b"][0][0] for x in (0, 1)]
    np.testing.assert_allclose(both["patched_a_to_b"][0], one, atol=1e-5)
