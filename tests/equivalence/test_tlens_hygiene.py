"""Issue 12 items 3 and 7 on the TransformerLens backend (it boots from a checkpoint on disk).

The bridge wraps a deep copy of the model: after a bad call or an exception raised inside the
bridge's forward, the model AND the bridge have the hooks and training flags they had, and a
clean run of each is bit for bit what it was; in training mode with dropout, patching clean ==
corrupt through the bridge gives exactly equal logit differences.
"""

from __future__ import annotations

import pytest
import torch

from interp.core.errors import BackendError, HookError
from interp.hooks.backends import get_backend
from interp.hooks.guard import hook_counts
from interp.hooks.recorder import record_rows
from interp.hooks.wrappers import to_tlens
from interp.methods.patching import Patch, Patcher, patch
from interp.models.loading import load_model
from interp.testing import tiny_llama


@pytest.fixture(scope="module")
def on_disk(tiny_tokenizer, tmp_path_factory):
    """A tiny model with attention dropout, saved and loaded back (the bridge needs a path)."""
    path = tmp_path_factory.mktemp("tiny_dropout")
    h = tiny_llama(tiny_tokenizer, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, seed=1,
                   attention_dropout=0.5)
    h.model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return load_model(str(path), device="cpu", dtype="float32")


def _state(handle):
    bridge = to_tlens(handle)
    ids = torch.tensor([[5, 9, 17, 33, 65, 129]])
    with torch.no_grad():
        logits = handle.model(input_ids=ids).logits
        blogits = bridge(ids, return_type="logits")
    return (hook_counts(handle.model), hook_counts(bridge),
            [m.training for m in handle.model.modules()],
            [m.training for m in bridge.modules()], logits, blogits)


def _same(a, b):
    assert a[:4] == b[:4]
    assert torch.equal(a[4], b[4]) and torch.equal(a[5], b[5])


def test_tlens_leaves_model_and_bridge_as_they_were(on_disk, patch_prompts):
    clean, corrupt = patch_prompts
    be = get_backend(on_disk, "transformer_lens")
    ids = torch.tensor([corrupt.input_ids])
    calls = (lambda: be.forward(ids, cache_hooks=["blocks.0.hook_resid_post"]),
             lambda: patch(on_disk, clean.input_ids, corrupt.input_ids,
                           hook="blocks.1.attn.hook_z", backend="transformer_lens"),
             lambda: record_rows(on_disk, corrupt.input_ids, backend="transformer_lens"))
    for call in calls:  # TransformerLens installs hooks of its own on the bridge on first use
        call()
    before = _state(on_disk)
    with pytest.raises(HookError, match=r"layer 2 .* valid layers: 0..1"):
        be.forward(ids, cache_hooks=["blocks.2.hook_resid_post"])
    with pytest.raises(BackendError, match="no source activation"):
        be.forward(ids, masks={"blocks.0.hook_resid_pre": torch.ones(1, len(corrupt),
                                                                      dtype=torch.bool)})
    _same(_state(on_disk), before)

    def boom(mod, args):
        raise RuntimeError("boom inside the bridge")

    bomb = be.bridge.blocks[1].register_forward_pre_hook(boom)
    try:
        for call in calls:
            counts = (hook_counts(on_disk.model), hook_counts(be.bridge))
            with pytest.raises(Exception, match="boom inside the bridge"):
                call()
            assert (hook_counts(on_disk.model), hook_counts(be.bridge)) == counts
    finally:
        bomb.remove()
    _same(_state(on_disk), before)


def test_tlens_patching_in_training_mode_is_exact(on_disk, patch_prompts):
    """Patching through the bridge of a model left in training mode runs in eval mode.

    The numbers equal those of the model in eval mode, patching every position restores the
    clean score, and both training flags come back.
    """
    clean, corrupt = (p.input_ids for p in patch_prompts)
    bridge = to_tlens(on_disk)
    units = [Patch("blocks.0.hook_resid_pre"), Patch("blocks.1.attn.hook_z", None, (1,))]
    ref = Patcher(on_disk, clean, corrupt, backend="transformer_lens")
    ref_res = ref.run(units)
    on_disk.model.train()
    bridge.train()
    try:
        pt = Patcher(on_disk, clean, corrupt, backend="transformer_lens")
        res = pt.run(units)
        assert (pt.clean_ld, pt.corrupt_ld) == (ref.clean_ld, ref.corrupt_ld)
        assert res.patched.tolist() == ref_res.patched.tolist()
        assert float(res.patched[0]) == pytest.approx(pt.clean_ld, abs=1e-5)
        assert all(m.training for m in on_disk.model.modules())
        assert all(m.training for m in bridge.modules())
    finally:
        on_disk.model.eval()
        bridge.eval()
