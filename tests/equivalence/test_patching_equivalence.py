"""Patching invariants that hold by construction, and the three backends agreeing.

* patch everything = the clean run, patch nothing = the corrupt run, self-patch = no change;
* the shared-prefix key/value cache gives the same numbers as full runs;
* ``hf``, ``transformer_lens`` and ``nnsight`` give the same patched logit differences;
* cross-model patching: the donor's last residual stream at every position reproduces the
  donor's verdict (fraction 1), patching a model with itself changes nothing, and batched
  rows equal one-layer-at-a-time runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp.hooks.points import decoder_layers
from interp.pairs import check_candidate_alignment
from interp.patching import Patch, Patcher
from interp.transfer import cross_model_patching


def test_patch_all_positions_gives_clean_and_nothing_gives_corrupt(tiny, patch_prompts):
    clean, corrupt = patch_prompts
    start = check_candidate_alignment(clean, corrupt)
    for prefix in (True, False):
        pt = Patcher(tiny, clean.input_ids, corrupt.input_ids, start=start, prefix_cache=prefix,
                     batch_size=3)
        rows = [Patch(f"blocks.{layer}.{p}") for layer in range(tiny.n_layers)
                for p in ("hook_resid_pre", "hook_resid_post")] + [[]]
        res = pt.run(rows)
        assert abs(pt.clean_ld - pt.corrupt_ld) > 1e-3
        np.testing.assert_allclose(res.patched[:-1], pt.clean_ld, atol=1e-4)
        np.testing.assert_allclose(res.effect[:-1], 1.0, atol=1e-3)
        assert res.patched[-1] == pt.corrupt_ld and res.effect[-1] == 0.0
        # every head of hook_z at every layer together with resid_pre of layer 0 is the
        # whole clean run
        full = [Patch("blocks.0.hook_resid_pre")] + [Patch(f"blocks.{layer}.attn.hook_z")
                                                     for layer in range(tiny.n_layers)]
        np.testing.assert_allclose(pt.run([full]).patched, pt.clean_ld, atol=1e-4)


def test_self_patch_changes_nothing(tiny, patch_prompts):
    _, corrupt = patch_prompts
    pt = Patcher(tiny, corrupt.input_ids, corrupt.input_ids)
    rows = [Patch(f"blocks.{layer}.{p}", None, None) for layer in range(tiny.n_layers)
            for p in ("hook_resid_pre", "hook_resid_post", "attn.hook_z")]
    res = pt.run(rows)
    np.testing.assert_allclose(res.patched, pt.corrupt_ld, atol=1e-5)
    assert np.isnan(res.effect).all()  # clean == corrupt: the normalised effect is undefined


def test_prefix_cache_matches_full_run(tiny, patch_prompts):
    clean, corrupt = patch_prompts
    start = check_candidate_alignment(clean, corrupt)
    n = len(corrupt)
    rows = [Patch(f"blocks.{layer}.hook_resid_pre", (i,)) for layer in range(tiny.n_layers)
            for i in range(max(start, n - 12), n)] + [
        Patch(f"blocks.{layer}.attn.hook_z", None, (h,)) for layer in range(tiny.n_layers)
        for h in range(tiny.n_heads)]
    a = Patcher(tiny, clean.input_ids, corrupt.input_ids, start=start, batch_size=7).run(rows)
    b = Patcher(tiny, clean.input_ids, corrupt.input_ids, prefix_cache=False,
                batch_size=32).run(rows)
    np.testing.assert_allclose(a.patched, b.patched, atol=1e-4)
    assert a.n_runs == len(rows)


@pytest.mark.parametrize("backend", ["transformer_lens", "nnsight"])
def test_backends_agree_with_hf(tiny_on_disk, patch_prompts, backend):
    tiny = tiny_on_disk
    clean, corrupt = patch_prompts
    n = len(corrupt)
    rows = [Patch("blocks.0.hook_resid_pre", (n - 3, n - 1)),
            Patch("blocks.1.hook_resid_post", (n - 1,)),
            Patch("blocks.1.attn.hook_z", None, (2,)),
            Patch("blocks.0.attn.hook_z", (n - 1,), (0, 3))]
    ref = Patcher(tiny, clean.input_ids, corrupt.input_ids, prefix_cache=False).run(rows)
    other = Patcher(tiny, clean.input_ids, corrupt.input_ids, backend=backend).run(rows)
    assert abs(ref.clean - other.clean) < 1e-4 and abs(ref.corrupt - other.corrupt) < 1e-4
    np.testing.assert_allclose(other.patched, ref.patched, atol=1e-4)
    np.testing.assert_allclose(other.effect, ref.effect, atol=1e-4)


@pytest.fixture(scope="module")
def perturbed(tiny):
    """``tiny`` with two weight matrices of its blocks changed.

    A stand-in for an adapter: it leaves the final norm and the unembedding alone.
    """
    import copy

    from interp.models import ModelHandle

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
    # the donor's last residual stream at every position is the donor's whole run
    assert res["fraction_a_to_b"][-1] == pytest.approx(1.0, abs=1e-4)
    assert res["fraction_b_to_a"][-1] == pytest.approx(1.0, abs=1e-4)
    np.testing.assert_allclose([r[-1] for r in res["patched_a_to_b"]], res["ld_adapter"],
                               atol=1e-4)
    # a model patched with itself does not change
    same = cross_model_patching(tiny, tiny, [p], positions="all")
    np.testing.assert_allclose(same["patched_a_to_b"][0], same["ld_base"][0], atol=1e-5)
    assert same["fraction_a_to_b"] is None
    # batched rows equal one-layer-at-a-time runs
    both = cross_model_patching(tiny, perturbed, [p], positions="last", layers=[0, 1])
    one = [cross_model_patching(tiny, perturbed, [p], positions="last", layers=[x])
           ["patched_a_to_b"][0][0] for x in (0, 1)]
    np.testing.assert_allclose(both["patched_a_to_b"][0], one, atol=1e-5)
