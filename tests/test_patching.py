"""Activation / attribution patching: invariants, backend agreement, pairs, the stage."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp.patching import (
    PairError,
    Patch,
    Patcher,
    PatchingConfig,
    PatchingError,
    build_pairs,
    candidate_swap_pair,
    check_candidate_alignment,
    parse_hook,
    patch,
    run_patching,
    task_swap_pair,
)
from interp.prompts import get_template, render
from interp.store import RunDir, write_json

CTX = "The Eiffel Tower is in Paris. It was built in 1889 by Gustave Eiffel's company."
Q = "Who built the Eiffel Tower?"


@pytest.fixture(scope="module")
def prompts(tokenizer):
    tpl = get_template()
    clean = render(tokenizer, tpl, "eval", context=CTX, question=Q, answer="Paris")
    corrupt = render(tokenizer, tpl, "eval", context=CTX, question=Q, answer="Lyon")
    return clean, corrupt


def test_patch_all_positions_gives_clean_and_nothing_gives_corrupt(tiny, prompts):
    clean, corrupt = prompts
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
        # all heads of hook_z at the LAST layer + its MLP input are not the full resid; but all
        # heads at every layer together with resid_pre of layer 0 is the whole clean run
        full = [Patch("blocks.0.hook_resid_pre")] + [Patch(f"blocks.{layer}.attn.hook_z")
                                                     for layer in range(tiny.n_layers)]
        np.testing.assert_allclose(pt.run([full]).patched, pt.clean_ld, atol=1e-4)


def test_self_patch_changes_nothing(tiny, prompts):
    _, corrupt = prompts
    pt = Patcher(tiny, corrupt.input_ids, corrupt.input_ids)
    rows = [Patch(f"blocks.{layer}.{p}", None, None) for layer in range(tiny.n_layers)
            for p in ("hook_resid_pre", "hook_resid_post", "attn.hook_z")]
    res = pt.run(rows)
    np.testing.assert_allclose(res.patched, pt.corrupt_ld, atol=1e-5)
    assert np.isnan(res.effect).all()  # clean == corrupt: the normalised effect is undefined


def test_prefix_cache_matches_full_run(tiny, prompts):
    clean, corrupt = prompts
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
def test_backends_agree_with_hf(tiny, prompts, backend):
    clean, corrupt = prompts
    n = len(corrupt)
    rows = [Patch("blocks.0.hook_resid_pre", (n - 3, n - 1)), Patch("blocks.1.hook_resid_post",
                                                                    (n - 1,)),
            Patch("blocks.1.attn.hook_z", None, (2,)), Patch("blocks.0.attn.hook_z", (n - 1,),
                                                            (0, 3))]
    ref = Patcher(tiny, clean.input_ids, corrupt.input_ids, prefix_cache=False).run(rows)
    other = Patcher(tiny, clean.input_ids, corrupt.input_ids, backend=backend).run(rows)
    assert abs(ref.clean - other.clean) < 1e-4 and abs(ref.corrupt - other.corrupt) < 1e-4
    np.testing.assert_allclose(other.patched, ref.patched, atol=1e-4)
    np.testing.assert_allclose(other.effect, ref.effect, atol=1e-4)


def test_attribution_gradient_matches_independent_autograd(tiny, prompts):
    """attribution = (clean - corrupt) . dLD/da, with dLD/da checked by a zero perturbation."""
    clean, corrupt = prompts
    pt = Patcher(tiny, clean.input_ids, corrupt.input_ids, prefix_cache=False)
    att = pt.attribution()
    layer = 1
    hook = f"blocks.{layer}.hook_resid_pre"
    delta = torch.zeros(1, len(corrupt), tiny.info["d_model"], requires_grad=True)
    h = tiny.model.model.layers[layer].register_forward_pre_hook(
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


def test_bad_hooks_layers_and_pairs(tiny, tokenizer, prompts):
    clean, corrupt = prompts
    with pytest.raises(PatchingError, match="valid.*hook_resid_pre"):
        parse_hook("blocks.0.mlp.hook_post", tiny.n_layers)
    with pytest.raises(PatchingError, match="valid layers: 0..1"):
        patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.7.hook_resid_post")
    with pytest.raises(PatchingError, match="heads= only"):
        patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.0.hook_resid_pre",
              heads=[0])
    other = render(tokenizer, get_template(), "eval", context=CTX.replace("1889", "1890"),
                   question=Q, answer="Lyon")
    with pytest.raises(PairError, match="outside the candidate span .* at position"):
        check_candidate_alignment(clean, other)
    longer = render(tokenizer, get_template(), "eval", context=CTX, question=Q,
                    answer="the city of Lyon in France")
    with pytest.raises(PairError, match="equal token length"):
        check_candidate_alignment(clean, longer)
    with pytest.raises(ValueError, match=r"\[patching\]: unknown config keys"):
        PatchingConfig.from_mapping({"pairz": "task-swap"})
    r = patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.1.hook_resid_post",
              positions=[-1])
    assert r.patched.shape == (1,) and np.isfinite(r.effect[0])


def _records():
    base = [("r1", "Gustave Eiffel's company", "Paris", False),
            ("r2", "1889", "1890", False),
            ("r3", "Paris", "Paris", True),
            ("r4", "France", "France", True)]
    qs = {"r1": Q, "r2": "When was the Eiffel Tower built?", "r3": "Where is the Eiffel Tower?",
          "r4": "In which country is the Eiffel Tower?"}
    return [{"id": rid, "dataset": "toy", "status": "ok", "context": CTX, "question": qs[rid],
             "answers": [gold], "answerable": True, "answer": own, "oracle_label": ok,
             "model": "tiny-llama", "template": "default"} for rid, gold, own, ok in base]


@pytest.fixture()
def toy_run(tmp_path):
    run = RunDir(tmp_path / "run")
    write_json(run.manifest_path, {"config": {"template": "default", "model": "tiny-llama"}})
    run.append_records(_records())
    return run


def test_pairs_from_records(tokenizer, toy_run):
    tpl = get_template()
    recs = _records()
    p = candidate_swap_pair(tokenizer, tpl, recs[1], recs)
    assert p.corrupt_source == "own" and p.clean_answer == "1889"
    assert p.clean.token_spans["candidate"] == p.corrupt.token_spans["candidate"]
    p3 = candidate_swap_pair(tokenizer, tpl, recs[2], recs)  # own answer right: rotation
    assert p3.corrupt_source == "rotation"
    t = task_swap_pair(tokenizer, tpl, recs[0])
    c0, c1 = t.corrupt.token_spans["context"]
    g0, _ = t.clean.token_spans["context"]
    assert t.corrupt.input_ids[c0:c1] == t.clean.input_ids[g0:g0 + c1 - c0]
    assert t.pos_map[c0] == g0 and t.pos_map[c0 - 1] == -1
    pairs, refused = build_pairs(toy_run, "candidate-swap", tokenizer, log=lambda s: None)
    assert len(pairs) + len(refused) == 4 and len(pairs) >= 3


def test_run_patching_stage_writes_tables_and_figures(tiny, toy_run):
    cfg = PatchingConfig.from_mapping({"pairs": ["candidate-swap", "task-swap"],
                                       "kinds": ["resid", "heads", "attribution"], "limit": 1,
                                       "layers": [0, 1],
                                       "batch_size": 32})
    summary = run_patching(toy_run, cfg, tiny, log=lambda s: None)
    root = toy_run.path / "patching"
    for key, s in summary.items():
        assert s["n_pairs"] >= 1, key
        assert (root / key / "effects.parquet").exists()
        assert s["cost_ratio_mean"] > 0
    import pandas as pd

    df = pd.read_parquet(root / "candidate-swap/resid/effects.parquet")
    np.testing.assert_allclose(df[df.span == "all"].effect, 1.0, atol=1e-3)
    ts = pd.read_parquet(root / "task-swap/resid/effects.parquet")
    # resid_pre at layer 0 = token embeddings, identical in both prompts: no change
    np.testing.assert_allclose(ts[ts.layer == 0].d_ld, 0.0, atol=1e-4)
    assert ts.context_mass.between(0, 1).all()
    assert summary["candidate-swap/attribution"]["correlation_heads"]["n"] > 0
    figs = sorted(p.name for p in (toy_run.path / "figures").glob("patching_*.png"))
    assert "patching_candidate_swap_resid_span.png" in figs
    assert "patching_task_swap_resid.png" in figs
    assert "patching_candidate_swap_attribution.png" in figs
    # resume: a second call reads the parts back and gives the same summary numbers
    cfg.figures = False
    msgs: list[str] = []
    again = run_patching(toy_run, cfg, tiny, log=msgs.append)
    assert not any("redone" in m or "sweep" in m for m in msgs), msgs
    assert again["candidate-swap/heads"]["top_heads"] == summary["candidate-swap/heads"][
        "top_heads"]
    # attribution took its exact comparison from the resid and heads sweeps of the same call;
    # computed afresh (attribution alone) it gives the same exact effects
    import json
    import shutil

    reused = pd.read_parquet(root / "candidate-swap/attribution/effects.parquet")
    part = next((root / "candidate-swap/attribution/parts").glob("*.json"))
    assert json.loads(part.read_text())["meta"]["exact_reused_from"] == ["heads", "resid"]
    shutil.rmtree(root / "candidate-swap/attribution")
    alone = PatchingConfig.from_mapping({"pairs": ["candidate-swap"], "kinds": ["attribution"],
                                         "limit": 1, "layers": [0, 1], "batch_size": 32,
                                         "figures": False})
    run_patching(toy_run, alone, tiny, log=lambda s: None)
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
    third = run_patching(toy_run, cfg2, tiny, log=msgs.append)
    assert any("redone" in m for m in msgs)
    assert third["candidate-swap/heads"]["layers"] == [1]
    assert {h["layer"] for h in third["candidate-swap/heads"]["top_heads"]} == {1}


@pytest.mark.integration
def test_bundled_quick_run_patching(bundled, quick_run, tmp_path):
    import json
    import shutil

    shutil.copytree(quick_run.path, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    cfg = PatchingConfig.from_mapping({"pairs": ["candidate-swap", "task-swap"],
                                       "kinds": ["resid"], "limit": 1, "layer_stride": 10,
                                       "per_position": False})
    summary = run_patching(run, cfg, bundled, log=lambda s: None)
    assert summary["candidate-swap/resid"]["n_pairs"] >= 1
    sp = summary["candidate-swap/resid"]["span_effect_by_layer"]["all"]
    assert all(abs(v - 1.0) < 1e-3 for v in sp.values())
