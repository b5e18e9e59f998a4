"""The patching engine and stage on a tiny random model.

The whole-reply metric against the harness's scorer, attribution against autograd, refused
requests, bad input, backends (names, hooks removed, no model kept alive), ratio of sums, the
stage's tables, counts and resume.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import shutil
import weakref

import numpy as np
import pandas as pd
import pytest
import torch

from interp.core.errors import BackendError, HookError, LayerSpecError, StageError
from interp.core.io import read_jsonl, write_json, write_jsonl
from interp.hooks.backends import BACKENDS, get_backend
from interp.judging.verdict import score_verdicts, verdict_replies
from interp.methods.pairs import align_positions
from interp.methods.patching import Patch, Patcher, own_activation, patch, ratio_of_sums
from interp.models.points import decoder_layers
from interp.stages.patching import PatchingConfig, run
from interp.store.rundir import RunDir
from interp.testing import tiny_llama, tiny_tokenizer


@pytest.fixture(scope="module")
def multi():
    """A tiny model whose tokenizer splits both replies: Correct = C + orrect, Incorrect = 3."""
    tok = tiny_tokenizer(vocab_size=280)
    return tiny_llama(tok, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, seed=1)


@pytest.fixture(scope="module")
def multi_prompts(multi):
    from interp.judging.prompts import get_template, render

    kw = {"context": "The Eiffel Tower is in Paris.", "question": "Where is it?"}
    clean = render(multi.tokenizer, get_template(), "eval", answer="Paris", **kw)
    corrupt = render(multi.tokenizer, get_template(), "eval", answer="Rome", **kw)
    return clean, corrupt


def test_whole_reply_metric_equals_the_harness_scorer(multi, multi_prompts):
    clean, corrupt = multi_prompts
    r = verdict_replies(multi.tokenizer)
    assert len(r.correct) == 2 and len(r.incorrect) == 3
    pm, _, _ = align_positions(clean.input_ids, corrupt.input_ids)
    pt = Patcher(multi, clean.input_ids, corrupt.input_ids, pos_map=pm)
    pt.ensure_clean([])
    ref = score_verdicts(multi, [clean.input_ids, corrupt.input_ids]).logit_diff
    assert pt.clean_ld == pytest.approx(float(ref[0]), abs=1e-5)
    assert pt.corrupt_ld == pytest.approx(float(ref[1]), abs=1e-5)
    assert pt.use_prefix and pt.start > 0   # the corrupt score went through the prefix cache
    # a patch that writes the corrupt run's own activation back reads the corrupt score
    # itself: the baseline and the patched rows share one computation
    hook = "blocks.1.hook_resid_pre"
    own = Patcher(multi, clean.input_ids, corrupt.input_ids, pos_map=pm,
                  held={hook: own_activation(multi, corrupt.input_ids, hook)})
    res = own.run([Patch(hook)])
    assert float(res.patched[0]) == pytest.approx(own.corrupt_ld, abs=1e-6)
    sc = pt.scores()["clean"]
    assert sc["p_correct"] == pytest.approx(1 / (1 + np.exp(-pt.clean_ld)), abs=1e-9)
    assert 0 < sc["verdict_coverage"] <= 1


def test_attribution_runs_in_bfloat16(multi, multi_prompts):
    """A bfloat16 model's attribution comes back float64 and tracks the float32 one.

    (numpy has no bfloat16: the products are taken in float32; found by the paper rehearsal.)
    """
    import copy

    clean, corrupt = multi_prompts
    pm, _, _ = align_positions(clean.input_ids, corrupt.input_ids)
    ref = Patcher(multi, clean.input_ids, corrupt.input_ids, pos_map=pm).attribution()
    bf = copy.copy(multi)
    bf.model = copy.deepcopy(multi.model).to(torch.bfloat16)
    att = Patcher(bf, clean.input_ids, corrupt.input_ids, pos_map=pm).attribution()
    for key in ("resid", "heads"):
        assert att[key].dtype == np.float64 and att[key].shape == ref[key].shape
        r = np.corrcoef(att[key].ravel(), ref[key].ravel())[0, 1]
        assert r > 0.98, (key, r)                         # bfloat16 rounding, same estimate
        big = np.unravel_index(np.abs(ref[key]).argmax(), ref[key].shape)
        assert np.sign(att[key][big]) == np.sign(ref[key][big]) != 0


def test_attribution_is_the_gradient_of_the_whole_reply_metric(multi, multi_prompts):
    """Attribution = (clean - corrupt) . dLD/da with LD summed over every reply token.

    dLD/da is checked against a zero perturbation of the corrupt prompt's residual, with the
    replies appended.
    """
    clean, corrupt = multi_prompts
    pm, _, _ = align_positions(clean.input_ids, corrupt.input_ids)
    pt = Patcher(multi, clean.input_ids, corrupt.input_ids, pos_map=pm, prefix_cache=False)
    att = pt.attribution()
    layer, n = 1, len(corrupt)
    hook = f"blocks.{layer}.hook_resid_pre"
    rep = verdict_replies(multi.tokenizer)
    delta = torch.zeros(1, n, multi.info["d_model"], requires_grad=True)

    def add(mod, args):
        x = args[0]
        return (x + torch.cat([delta, delta.new_zeros(1, x.shape[1] - n, x.shape[2])], 1),
                *args[1:])

    h = decoder_layers(multi.model)[layer].register_forward_pre_hook(add)
    try:
        with torch.enable_grad():
            total = 0.0
            for sign, reply in ((1, rep.correct), (-1, rep.incorrect)):
                ids = torch.tensor([corrupt.input_ids + list(reply[:-1])])
                lp = torch.log_softmax(multi.model(ids).logits[0], -1)
                total = total + sign * sum(lp[n - 1 + j, t] for j, t in enumerate(reply))
            (g,) = torch.autograd.grad(total, [delta])
    finally:
        h.remove()
    assert float(total.detach()) == pytest.approx(pt.corrupt_ld, abs=1e-4)
    pt.ensure_clean([hook])
    with torch.no_grad():
        cache = pt.be.forward(pt.corrupt_ids[None], cache_hooks=[hook]).acts
    diff = pt.source(hook) - cache[hook][0]
    diff[[i for i in range(n) if i not in pt.patchable()]] = 0
    np.testing.assert_allclose(att["resid"][layer], (diff * g[0]).sum(-1).numpy(), atol=1e-5)
    # positions before the first patchable one count 0
    assert np.abs(att["resid"][:, :pt.start]).max() == 0.0


def test_requests_that_patch_nothing_are_refused_with_the_position(tiny, patch_prompts):
    clean, corrupt = patch_prompts
    pm, prefix, _ = align_positions(clean.input_ids, corrupt.input_ids)
    pt = Patcher(tiny, clean.input_ids, corrupt.input_ids, pos_map=pm)
    assert pt.shared == prefix and pt.start == prefix
    with pytest.raises(StageError, match="position 1 lies in the shared prefix"):
        pt.run([Patch("blocks.0.hook_resid_pre", (1,))])
    with pytest.raises(StageError, match="row 0 patches nothing"):
        pt.run([[]])
    with pytest.raises(StageError, match="an empty position list"):
        pt.run([Patch("blocks.0.hook_resid_pre", ())])
    # a position mapped to -1
    other = list(pm)
    other[prefix + 1] = -1
    pt2 = Patcher(tiny, clean.input_ids, corrupt.input_ids, pos_map=other)
    with pytest.raises(StageError, match=f"position {prefix + 1} has no clean counterpart"):
        pt2.run([Patch("blocks.1.attn.hook_z", (prefix, prefix + 1), (0,))])
    # refused before any forward: no baseline was computed
    assert pt2.clean_lp is None and pt2.corrupt_lp is None
    # the same prompt twice: nothing can be patched
    same = Patcher(tiny, corrupt.input_ids, corrupt.input_ids)
    with pytest.raises(StageError, match="no position to patch"):
        same.run([Patch("blocks.0.hook_resid_post")])


def test_bad_hooks_layers_and_config(tiny, patch_prompts):
    clean, corrupt = patch_prompts
    pm, _, _ = align_positions(clean.input_ids, corrupt.input_ids)
    kw = {"pos_map": pm}
    with pytest.raises(HookError, match="unknown hook point.*hook_resid_pre"):
        patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.0.mlp.hook_post", **kw)
    with pytest.raises(HookError, match="valid layers: 0..1"):
        patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.7.hook_resid_post", **kw)
    with pytest.raises(StageError, match="not patchable.*attn.hook_z"):
        patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.0.hook_mlp_out", **kw)
    with pytest.raises(StageError, match="heads= only"):
        patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.0.hook_resid_pre",
              heads=[0], **kw)
    with pytest.raises(StageError, match=r"heads \[4\] out of range or empty; valid: 0..3"):
        patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.0.attn.hook_z",
              heads=[4], **kw)
    with pytest.raises(StageError, match="pass pos_map"):
        Patcher(tiny, clean.input_ids[:-1], corrupt.input_ids)
    with pytest.raises(ValueError, match=r"\[patching\]: unknown config keys"):
        PatchingConfig.from_mapping({"pairz": "gen-to-eval"})
    with pytest.raises(StageError, match="unknown pair kind 'task-swap'"):
        PatchingConfig.from_mapping({"pairs": "task-swap"})
    with pytest.raises(StageError, match="unknown kind 'headz'"):
        PatchingConfig.from_mapping({"kinds": "resid,headz"})
    with pytest.raises(StageError, match="exact must be one of"):
        PatchingConfig.from_mapping({"exact": "some"})
    with pytest.raises(StageError, match=r"^the sweeps \(attribution patching; patch\(\) takes "
                       r"every backend\): the 'hf' backend only, not 'nnsight'$"):
        PatchingConfig.from_mapping({"backend": "nnsight"})
    with pytest.raises(StageError, match="unknown backend 'tl'; valid: "):
        PatchingConfig.from_mapping({"backend": "tl"})
    with pytest.raises(LayerSpecError, match="0-1"):
        PatchingConfig(layers="0-5").layer_list(tiny.n_layers)
    assert PatchingConfig(layers="last1").layer_list(tiny.n_layers) == [1]
    r = patch(tiny, clean.input_ids, corrupt.input_ids, hook="blocks.1.hook_resid_post",
              positions=[-1], **kw)
    # the gap rule: an effect only for a pair whose |gap| reaches min_gap (1 nat by default)
    assert r.patched.shape == (1,) and np.isfinite(r.effect[0]) == r.measurable
    assert r.measurable == (abs(r.gap) >= 1.0) and (r.note == "") == (r.measurable and r.gap > 0)


def test_ratio_of_sums_is_not_a_mean_of_ratios():
    patched = np.array([0.5, 2.0, -1.0])
    clean, corrupt = np.array([1.0, 4.0, -3.0]), np.array([0.0, 0.0, 0.0])
    # sign-aligned: (0.5 + 2 + 1) / (1 + 4 + 3) = 3.5 / 8
    assert ratio_of_sums(patched, clean, corrupt) == pytest.approx(3.5 / 8)
    assert np.mean((patched - corrupt) / (clean - corrupt)) == pytest.approx(4 / 9)
    assert ratio_of_sums(patched, corrupt, corrupt) is None
    assert ratio_of_sums([np.nan], [1.0], [0.0]) is None


def test_backends_are_named_once_leave_no_hooks_and_keep_no_model(tiny, patch_prompts):
    assert BACKENDS == ("hf", "transformer_lens", "nnsight")
    with pytest.raises(BackendError, match="unknown backend 'tlens'.*transformer_lens"):
        get_backend(tiny, "tlens")
    clean, corrupt = patch_prompts
    pm, _, _ = align_positions(clean.input_ids, corrupt.input_ids)

    def hooks():  # transformers may install hooks of its own: compare, do not expect none
        return [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in tiny.model.modules()]

    before = hooks()
    pt = Patcher(tiny, clean.input_ids, corrupt.input_ids, pos_map=pm)
    pt.run([Patch("blocks.1.attn.hook_z", None, (1,)), Patch("blocks.0.hook_resid_post")])
    assert hooks() == before
    import copy

    from interp.models.loading import ModelHandle

    other = ModelHandle(model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer,
                        spec="copy", info=dict(tiny.info))
    ref = weakref.ref(other.model)
    for backend in ("hf", "nnsight"):
        Patcher(other, clean.input_ids, corrupt.input_ids, backend=backend, pos_map=pm).run(
            [Patch("blocks.0.hook_resid_post")])
    del other
    gc.collect()
    assert ref() is None


@pytest.fixture()
def toy_run(tmp_path, toy_records):
    run_dir = RunDir(tmp_path / "run")
    write_json(run_dir.manifest_path, {"config": {"template": "default", "model": "tiny-llama"}})
    run_dir.append_records(toy_records)
    return run_dir


STAGE = {"limit": 4, "layers": "0-1", "band": "0-1", "batch_size": 32, "top_k": 4,
         "n_boot": 20, "progress": False, "hard_negative_attempts": 2}


def test_stage_counts_sources_gaps_and_ratio_of_sums(tiny, toy_run):
    cfg = PatchingConfig.from_mapping({**STAGE, "pairs": ["candidate-swap"],
                                       "kinds": ["resid", "heads"], "exact": "all"})
    summary = run(toy_run, tiny, cfg, log=lambda s: None)
    s = summary["candidate-swap/resid"]
    # r1, r2: own wrong answers; r3, r4: own answers right -> hard negatives mined closed-book
    assert s["pairs_by_source"] == {"own": 2, "mined": 2} and s["n_skipped"] == 0
    mined = [json.loads(x) for x in (toy_run.path / "patching/hard_negatives.jsonl")
             .read_text().splitlines()]
    assert sorted(r["id"] for r in mined) == ["r3", "r4"]
    assert all(r["source"] == "closed_book" and not r["fallback"] for r in mined)
    root = toy_run.path / "patching/candidate-swap/resid"
    pairs = pd.read_parquet(root / "pairs.parquet")
    np.testing.assert_allclose(pairs.gap, pairs.clean_ld - pairs.corrupt_ld)
    assert [g["gap"] for g in s["gaps"]] == pytest.approx(pairs.gap.tolist())
    assert s["n_pairs_kept"] == int((pairs.gap.abs() >= 1.0).sum())
    # the headline ratio of one unit, recomputed by hand from the effects table
    df = pd.read_parquet(root / "effects.parquet")
    units = pd.read_parquet(root / "units.parquet")
    u = units[(units.unit == "position") & (units.layer == 1) & (units.rel_position == -1)]
    e = df[(df.unit == "position") & (df.layer == 1) & (df.rel_position == -1) & df.kept]
    sgn = np.sign(e.gap)
    assert float(u.ratio.iloc[0]) == pytest.approx(
        float((sgn * (e.ld - e.corrupt_ld)).sum() / e.gap.abs().sum()))
    assert int(u.n_pairs.iloc[0]) == s["n_pairs_kept"]
    # every unit of the full sweep is exact; figures drawn
    assert df.verified.all() and np.isnan(df.attr_ld).all()
    figs = {p.name for p in (toy_run.path / "figures").glob("patching_*.png")}
    assert {"patching_candidate_swap_resid_span.png", "patching_candidate_swap_heads.png",
            "patching_candidate_swap_resid_position.png"} <= figs


def test_stage_keeps_each_finished_kind_when_a_later_one_is_interrupted(tiny, toy_run,
                                                                       monkeypatch):
    import interp.stages.patching as stage

    real = stage._sweep_kind

    def interrupted(handle, cfg, pk, kind, *a, **kw):
        if kind == "heads":
            raise KeyboardInterrupt
        return real(handle, cfg, pk, kind, *a, **kw)

    monkeypatch.setattr(stage, "_sweep_kind", interrupted)
    cfg = PatchingConfig.from_mapping({**STAGE, "pairs": ["candidate-swap"],
                                       "kinds": ["resid", "heads"], "figures": False})
    with pytest.raises(KeyboardInterrupt):
        run(toy_run, tiny, cfg, log=lambda s: None)
    stored = json.loads((toy_run.path / "patching/summary.json").read_text())
    assert list(stored) == ["candidate-swap/resid"]   # the finished kind is published
    assert stored["candidate-swap/resid"] == json.loads(
        (toy_run.path / "patching/candidate-swap/resid/summary.json").read_text())


def test_stage_atp_topk_attribution_agreement_and_resume(tiny, toy_run):
    cfg = PatchingConfig.from_mapping({**STAGE, "pairs": ["gen-to-eval",
                                                          "system-prompt-control"],
                                       "kinds": ["resid", "heads", "attribution"],
                                       "mine": False})
    summary = run(toy_run, tiny, cfg, log=lambda s: None)
    root = toy_run.path / "patching"
    heads = pd.read_parquet(root / "gen-to-eval/heads/effects.parquet")
    # AtP*: 4 of 8 head units exact per pair, the others carry only the estimate
    assert heads.groupby("id").verified.sum().tolist() == [4, 4, 4, 4]
    assert heads.attr_ld.notna().all()
    ver = heads[heads.verified]
    top = heads.assign(a=heads.attr_ld.abs()).sort_values("a", ascending=False, kind="stable")
    assert set(top.groupby("id").head(4).index) == set(ver.index)
    ag = summary["gen-to-eval/attribution"]["agreement"]
    assert ag["heads"]["k"] == 4 and 0 <= ag["heads"]["overlap_at_k_mean"] <= 1
    assert summary["system-prompt-control/resid"]["control"] is True
    by_layer = summary["gen-to-eval/resid"]["by_layer"]
    assert sorted(by_layer) == [0, 1]
    # resid_pre of layer 0 at the last position: the same token in both prompts, no change
    assert by_layer[0]["mean_d_ld"] == pytest.approx(0.0, abs=1e-5)  # prefix cache vs full
    # its span units ranked with CIs, as for the candidate swap: the top one is a real row
    top = summary["gen-to-eval/resid"]["top_spans"][0]
    assert top["unit"] == "span" and top["ratio"] == pytest.approx(
        by_layer[top["layer"]]["ratio"]) and top["n_pairs"] == by_layer[top["layer"]]["n_pairs"]
    # resume: a second call reads every part back
    cfg.figures = False
    msgs: list[str] = []
    again = run(toy_run, tiny, cfg, log=msgs.append)
    assert not any("redone" in m or "exact rows" in m for m in msgs), msgs
    assert again["gen-to-eval/heads"]["top_units"] == summary["gen-to-eval/heads"]["top_units"]
    # other settings: stale parts are redone
    shutil.rmtree(root / "system-prompt-control")
    cfg2 = PatchingConfig.from_mapping({**STAGE, "pairs": ["gen-to-eval"], "kinds": ["heads"],
                                        "top_k": 2, "figures": False})
    msgs = []
    run(toy_run, tiny, cfg2, log=msgs.append)
    assert sum("redone" in m for m in msgs) == 4
    stored = json.loads((root / "summary.json").read_text())
    assert "system-prompt-control/heads" in stored and stored["gen-to-eval/heads"]["top_k"] == 2


def test_patching_heatmap_tells_unmeasured_from_zero_and_says_when_empty():
    """NaN cells are masked and drawn grey (zero stays white).

    No kept pair is said on the panel; a candidate column no kept pair patched gets a note.
    """
    import matplotlib.colors as mcolors
    import pandas as pd

    from interp.plots.common import plt
    from interp.plots.patching import NOT_MEASURED, _heat, nothing_to_show, span_notes

    assert nothing_to_show({"n_pairs_kept": 0, "n_pairs": 2, "min_gap": 1.0}) == (
        "nothing to show: 0 of 2 pairs with |gap| >= 1.0 nats")
    assert nothing_to_show({"n_pairs_kept": 1, "n_pairs": 2, "min_gap": 1.0}) is None
    fig, ax = plt.subplots()
    _heat(ax, [[0.0, np.nan], [0.5, -0.5]], ["a", "b"], ["0", "1"], "t", "c", empty="gone")
    im = ax.images[0]
    assert im.get_array().mask.tolist() == [[False, True], [False, False]]
    assert mcolors.to_hex(im.cmap(np.ma.masked_invalid([np.nan]))[0]) == mcolors.to_hex(
        NOT_MEASURED)
    assert mcolors.to_hex(im.cmap(im.norm(0.0))) != mcolors.to_hex(NOT_MEASURED)
    assert [t.get_text() for t in ax.texts] == ["gone"]
    plt.close(fig)
    effects = pd.DataFrame({"id": ["p1", "p1", "p2"], "kept": [True, True, False],
                            "unit": "span", "span": ["template", "verdict", "candidate"]})
    pairs = pd.DataFrame({"id": ["p1", "p2"], "middle": [np.array([0, 0]), np.array([5, 9])],
                          "n_clean": [219, 100], "n_tokens": [227, 100]})
    notes = span_notes(effects, ["candidate", "template", "verdict", "all"], pairs)
    assert notes[0].startswith("candidate: not patched as a whole in any kept pair: its middle "
                               "span is empty ([0, 0]) in 1 of 1 kept pairs")
    assert "219 vs 227" in notes[0] and notes[1] == "all: not measured in any kept pair"
    assert span_notes(effects.assign(kept=False), ["candidate"], pairs) == []


def test_stage_limit_kept_counts_pairs_over_min_gap_and_sweeps_no_other(tiny, toy_run,
                                                                      monkeypatch):
    base = {**STAGE, "pairs": ["gen-to-eval"], "kinds": ["resid"], "exact": "all",
            "figures": False, "mine": False}
    every = run(toy_run, tiny, PatchingConfig.from_mapping({**base, "limit": "all"}),
                log=lambda s: None)["gen-to-eval/resid"]
    gaps = {g["id"]: g["gap"] for g in every["gaps"]}
    assert len(gaps) == 4
    # a threshold between the 2nd and 3rd largest |gap|: 2 of the 4 pairs clear it
    ranked = sorted(gaps, key=lambda k: -abs(gaps[k]))
    cut = (abs(gaps[ranked[1]]) + abs(gaps[ranked[2]])) / 2
    assert abs(gaps[ranked[1]]) > cut > abs(gaps[ranked[2]])
    cfg = PatchingConfig.from_mapping({**base, "limit": 2, "limit_kept": True, "min_gap": cut})
    shutil.rmtree(toy_run.path / "patching")
    msgs: list[str] = []
    s = run(toy_run, tiny, cfg, log=msgs.append)["gen-to-eval/resid"]
    assert sorted(g["id"] for g in s["gaps"]) == sorted(ranked[:2])
    assert s["n_pairs"] == s["n_pairs_kept"] == 2
    # in record order (one dataset), the pairs under the cut before the 2nd kept one were
    # scored and left out; those after it were never built
    order = sorted(gaps)
    last = max(order.index(k) for k in ranked[:2])
    tried = [k for k in order[:last] if k not in ranked[:2]]
    assert tried   # the tiny model's gaps put at least one small pair before the 2nd kept
    small = [x for x in s["skipped"] if x["reason"] == "small_gap"]
    assert [x["id"] for x in small] == tried and len(s["skipped"]) == len(tried)
    assert {x["id"]: x["gap"] for x in small} == pytest.approx({k: gaps[k] for k in tried},
                                                               abs=1e-6)
    left = sorted(abs(gaps[k]) for k in tried)   # how close the left-out pairs came
    assert s["small_gaps"] == pytest.approx({"n": len(tried), "median_abs": np.median(left),
                                             "max_abs": left[-1]}, abs=1e-6)
    parts = sorted(p.stem for p in (toy_run.path / "patching/gen-to-eval/resid/parts")
                   .glob("*.json"))
    assert len(parts) == 2   # the pairs under min_gap were scored, never swept
    # every scored pair's gap is stored, kept or not
    stored = {e["id"]: e for e in read_jsonl(toy_run.path / "patching/gen-to-eval/gaps.jsonl")}
    assert sorted(stored) == sorted([*tried, *ranked[:2]])
    assert {k: e["gap"] for k, e in stored.items()} == pytest.approx(
        {k: gaps[k] for k in stored}, abs=1e-6)
    assert all(e["gap"] == pytest.approx(e["clean_ld"] - e["corrupt_ld"])
               for e in stored.values())
    # resume: the kept pairs' gaps are read from their parts and the skipped ones' from
    # gaps.jsonl; nothing is scored or swept again
    import interp.stages.patching as stage

    made = []

    class Counting(stage.Patcher):
        def __init__(self, *a, **kw):
            made.append(1)
            super().__init__(*a, **kw)

    monkeypatch.setattr(stage, "Patcher", Counting)
    msgs = []
    again = run(toy_run, tiny, cfg, log=msgs.append)["gen-to-eval/resid"]
    assert not any("exact rows" in m for m in msgs) and again["gaps"] == s["gaps"]
    assert not made and again["skipped"] == s["skipped"]
    # a stored gap of another pair (its signature differs) is scored again
    e = stored[tried[0]]
    write_jsonl(toy_run.path / "patching/gen-to-eval/gaps.jsonl",
                [dict(e, signature="other", gap=99.0)])
    again = run(toy_run, tiny, cfg, log=lambda s: None)["gen-to-eval/resid"]
    assert len(made) == len(tried) and again["skipped"] == s["skipped"]
    monkeypatch.undo()
    # without limit_kept the same limit counts built pairs: the first 2, whatever their gap
    built = run(toy_run, tiny, PatchingConfig.from_mapping({**base, "limit": 2,
                                                            "min_gap": cut}),
                log=lambda s: None)["gen-to-eval/resid"]
    assert [g["id"] for g in built["gaps"]] == ["r1", "r2"]
    # no pair reaches min_gap: the summary says so, with every scored pair and the closest
    from experiments.findings.report import claims
    from interp.plots.patching import nothing_to_show

    high = max(abs(g) for g in gaps.values()) + 1.0
    shutil.rmtree(toy_run.path / "patching")
    none = run(toy_run, tiny, dataclasses.replace(cfg, min_gap=high),
               log=lambda s: None)["gen-to-eval/resid"]
    most = max(abs(g) for g in gaps.values())
    assert (none["n_pairs"], none["n_pairs_kept"], none["small_gaps"]["n"]) == (0, 0, 4)
    assert none["small_gaps"]["max_abs"] == pytest.approx(most, abs=1e-6)
    assert nothing_to_show(none) == (f"nothing to show: 0 of 4 pairs with |gap| >= {high} "
                                     f"nats (largest {most:.2f})")
    write_json(toy_run.path / "m__patching_summary.json", {"gen-to-eval/resid": none})
    cell = {r["claim"]: r["cells"] for r in claims(toy_run.path, ["m"])}[
        "... generator's run into the judge's: residual stream"]["m"]
    assert (cell.value, cell.n) == (None, 0)
    assert cell.verdict == f"no pair to sweep: 0 of 4 scored pairs reach {high} nat " \
                           f"(largest |gap| {most:.2f})"


def test_held_unit_at_its_own_value_changes_nothing_and_blocks_paths(multi, multi_prompts):
    """``held``: a head held at the corrupt run's own output leaves that run as it is.

    Holding every head of layer 1 while layer 0's heads are patched blocks the paths through
    layer 1's heads, so the senders' effect changes; rows without the held hook are as a
    plain :class:`Patcher`'s.
    """
    from interp.methods.patching import own_activation
    from interp.models.points import hook_name

    clean, corrupt = multi_prompts
    pm, _, _ = align_positions(clean.input_ids, corrupt.input_ids)
    recv = hook_name(1, "attn.hook_z")
    own = own_activation(multi, corrupt.input_ids, recv)
    assert own.shape == (len(corrupt), multi.n_heads, multi.model.config.head_dim)
    held = Patcher(multi, clean.input_ids, corrupt.input_ids, pos_map=pm, held={recv: own},
                   prefix_cache=False)
    free = Patcher(multi, clean.input_ids, corrupt.input_ids, pos_map=pm, prefix_cache=False)
    senders = Patch(hook_name(0, "attn.hook_z"))
    r = held.run([[Patch(recv)], [Patch(recv, None, (1,))], [senders],
                  [senders, Patch(recv)]])
    f = free.run([[senders], [Patch(recv)]])
    assert r.patched[0] == pytest.approx(r.corrupt, abs=1e-5)  # held alone: the corrupt run
    assert r.patched[1] == pytest.approx(r.corrupt, abs=1e-5)
    assert r.patched[2] == pytest.approx(f.patched[0], abs=1e-5)  # unheld rows as before
    assert abs(f.patched[1] - f.corrupt) > 1e-3  # patched from clean, layer 1 does move it
    # the senders move the verdict, and holding layer 1 changes how much
    assert abs(r.patched[2] - r.corrupt) > 1e-3
    assert abs(r.patched[3] - r.patched[2]) > 1e-4
    with pytest.raises(StageError, match="held blocks.1.attn.hook_z: 3 positions"):
        Patcher(multi, clean.input_ids, corrupt.input_ids, pos_map=pm, held={recv: own[:3]})
