"""The patching engine and stage on a tiny random model.

Attribution against autograd, bad input, backends (names, hooks removed, no model kept alive),
the stage's tables and resume.
"""

from __future__ import annotations

import gc
import json
import shutil
import weakref

import numpy as np
import pandas as pd
import pytest
import torch

from interp.errors import BackendError, HookError, LayerSpecError, PatchingError
from interp.hooks.backends import BACKENDS, get_backend
from interp.hooks.points import decoder_layers
from interp.pairs import check_candidate_alignment
from interp.patching import Patch, Patcher, patch, valid_hooks
from interp.stages.patching import PatchingConfig, run
from interp.store import RunDir, write_json


def test_attribution_gradient_matches_independent_autograd(tiny, patch_prompts):
    """Attribution = (clean - corrupt) . dLD/da, with dLD/da checked by a zero perturbation."""
    clean, corrupt = patch_prompts
    pt = Patcher(tiny, clean.input_ids, corrupt.input_ids, prefix_cache=False)
    att = pt.attribution()
    layer = 1
    hook = f"blocks.{layer}.hook_resid_pre"
    delta = torch.zeros(1, len(corrupt), tiny.info["d_model"], requires_grad=True)
    h = decoder_layers(tiny.model)[layer].register_forward_pre_hook(
        lambda mod, args: (args[0] + delta, *args[1:]) if args else None)
    try:
        with torch.enable_grad():
            logits = tiny.model(torch.tensor([corrupt.input_ids])).logits[0, -1]
            c, i = pt.verdict_ids
            (g,) = torch.autograd.grad(logits[c] - logits[i], [delta])
    finally:
        h.remove()
    pt.ensure_clean([hook])
    with torch.no_grad():
        _, cache = pt.be.forward(pt.corrupt_ids[None], cache_hooks=[hook])
    expect = ((pt.source(hook) - cache[hook][0]) * g[0]).sum(-1).numpy()
    np.testing.assert_allclose(att["resid"][layer], expect, atol=1e-5)
    # positions that hold the same token in both prompts and come before them differ by 0
    start = check_candidate_alignment(clean, corrupt)
    assert np.abs(att["resid"][:, :start]).max() < 1e-6


def test_bad_hooks_layers_and_config(tiny, patch_prompts):
    clean, corrupt = patch_prompts
    with pytest.raises(HookError, match="unknown hook point.*hook_resid_pre"):
        patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.0.mlp.hook_post")
    with pytest.raises(HookError, match="valid layers: 0..1"):
        patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.7.hook_resid_post")
    with pytest.raises(PatchingError, match="not patchable.*attn.hook_z"):
        patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.0.hook_mlp_out")
    with pytest.raises(PatchingError, match="heads= only"):
        patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.0.hook_resid_pre",
              heads=[0])
    with pytest.raises(PatchingError, match=r"heads \[4\] out of range; valid: 0..3"):
        patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.0.attn.hook_z", heads=[4])
    with pytest.raises(PatchingError, match="pass pos_map"):
        Patcher(tiny, clean.input_ids[:-1], corrupt.input_ids)
    with pytest.raises(ValueError, match=r"\[patching\]: unknown config keys"):
        PatchingConfig.from_mapping({"pairz": "task-swap"})
    with pytest.raises(PatchingError, match="unknown kind 'headz'"):
        PatchingConfig.from_mapping({"kinds": "resid,headz"})
    with pytest.raises(LayerSpecError, match="0-1"):
        PatchingConfig(layers="0-5").layer_list(tiny.n_layers)
    assert PatchingConfig(layers="last1").layer_list(tiny.n_layers) == [1]
    assert len(valid_hooks(tiny.n_layers)) == 3 * tiny.n_layers
    r = patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.1.hook_resid_post",
              positions=[-1])
    assert r.patched.shape == (1,) and np.isfinite(r.effect[0])


def test_backends_are_named_once_leave_no_hooks_and_keep_no_model(tiny, patch_prompts):
    assert BACKENDS == ("hf", "transformer_lens", "nnsight")
    with pytest.raises(BackendError, match="unknown backend 'tlens'.*transformer_lens"):
        get_backend(tiny, "tlens")
    clean, corrupt = patch_prompts

    def hooks():  # transformers may install hooks of its own: compare, do not expect none
        return [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in tiny.model.modules()]

    before = hooks()
    pt = Patcher(tiny, clean.input_ids, corrupt.input_ids)
    pt.run([Patch("blocks.1.attn.hook_z", None, (1,)), Patch("blocks.0.hook_resid_post")])
    assert hooks() == before
    # a patched model is freed once the caller drops it (no process-wide backend cache)
    import copy

    from interp.models import ModelHandle

    other = ModelHandle(model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer,
                        spec="copy", info=dict(tiny.info))
    ref = weakref.ref(other.model)
    for backend in ("hf", "nnsight"):
        Patcher(other, clean.input_ids, corrupt.input_ids, backend=backend).run(
            [Patch("blocks.0.hook_resid_pre")])
    del other
    gc.collect()
    assert ref() is None


@pytest.fixture()
def toy_run(tmp_path, toy_records):
    run_dir = RunDir(tmp_path / "run")
    write_json(run_dir.manifest_path, {"config": {"template": "default", "model": "tiny-llama"}})
    run_dir.append_records(toy_records)
    return run_dir


def _check_tables(toy_run, summary):
    root = toy_run.path / "patching"
    for key, s in summary.items():
        assert s["n_pairs"] >= 1, key
        assert (root / key / "effects.parquet").exists()
        assert (root / key / "effects.csv").exists()
        assert s["cost_ratio_mean"] > 0
    df = pd.read_parquet(root / "candidate-swap/resid/effects.parquet")
    np.testing.assert_allclose(df[df.span == "all"].effect, 1.0, atol=1e-3)
    ts = pd.read_parquet(root / "task-swap/resid/effects.parquet")
    # resid_pre at layer 0 = token embeddings, identical in both prompts: no change
    np.testing.assert_allclose(ts[ts.layer == 0].d_ld, 0.0, atol=1e-4)
    assert ts.context_mass.between(0, 1).all()
    assert summary["candidate-swap/attribution"]["correlation_heads"]["n"] > 0
    figs = sorted(p.name for p in (toy_run.path / "figures").glob("patching_*.png"))
    for name in ("patching_candidate_swap_resid_span.png", "patching_task_swap_resid.png",
                 "patching_candidate_swap_attribution.png"):
        assert name in figs


def test_stage_writes_tables_figures_and_resumes(tiny, toy_run):
    cfg = PatchingConfig.from_mapping({"pairs": ["candidate-swap", "task-swap"],
                                       "kinds": ["resid", "heads", "attribution"], "limit": 1,
                                       "layers": "0-1", "batch_size": 32})
    summary = run(toy_run, tiny, cfg, log=lambda s: None)
    _check_tables(toy_run, summary)
    root = toy_run.path / "patching"
    # resume: a second call reads the parts back and gives the same summary numbers
    cfg.figures = False
    msgs: list[str] = []
    again = run(toy_run, tiny, cfg, log=msgs.append)
    assert not any("redone" in m or "sweep" in m for m in msgs), msgs
    assert again["candidate-swap/heads"]["top_heads"] == summary["candidate-swap/heads"][
        "top_heads"]
    # attribution took its exact comparison from the resid and heads sweeps of the same call;
    # computed afresh (attribution alone) it gives the same exact effects
    reused = pd.read_parquet(root / "candidate-swap/attribution/effects.parquet")
    part = next((root / "candidate-swap/attribution/parts").glob("*.json"))
    assert json.loads(part.read_text())["meta"]["exact_reused_from"] == ["heads", "resid"]
    shutil.rmtree(root / "candidate-swap/attribution")
    alone = PatchingConfig.from_mapping({"pairs": ["candidate-swap"], "kinds": ["attribution"],
                                         "limit": 1, "layers": [0, 1], "batch_size": 32,
                                         "figures": False})
    run(toy_run, tiny, alone, log=lambda s: None)
    fresh = pd.read_parquet(root / "candidate-swap/attribution/effects.parquet")
    assert json.loads(part.read_text())["meta"]["exact_reused_from"] == []
    key = ["unit", "layer", "head", "position"]
    a, b = reused.sort_values(key).reset_index(), fresh.sort_values(key).reset_index()
    assert len(a) == len(b) > 0
    np.testing.assert_allclose(a.exact_d_ld, b.exact_d_ld, atol=1e-4)
    np.testing.assert_allclose(a.attr_ld, b.attr_ld, atol=1e-5)
    # other layers: the stored parts are stale and are recomputed, not reused
    cfg2 = PatchingConfig.from_mapping({"pairs": ["candidate-swap"], "kinds": ["heads"],
                                        "limit": 1, "layers": [1], "figures": False})
    msgs = []
    third = run(toy_run, tiny, cfg2, log=msgs.append)
    assert any("redone" in m for m in msgs)
    assert third["candidate-swap/heads"]["layers"] == [1]
    assert {h["layer"] for h in third["candidate-swap/heads"]["top_heads"]} == {1}
    # the run's summary keeps every (pairs, kind) of earlier calls
    stored = json.loads((root / "summary.json").read_text())
    assert "task-swap/heads" in stored and stored["candidate-swap/heads"]["layers"] == [1]
