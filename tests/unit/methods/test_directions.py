"""One correctness direction or two: states, planted directions, folds, steering, the stage part.

Tiny random models and synthetic features: a direction added with norm 0 changes nothing (and
a real one does change the verdict, so the equality can fail); a planted direction is
recovered by both estimators; folds never share a passage between training and test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp.hooks.model import HookedModel
from interp.judging.prompts import get_template, render, render_self_check
from interp.judging.verdict import verdict_replies
from interp.methods.calibration import cosine
from interp.methods.directions import (
    answer_states,
    choose_layer,
    cross_decode,
    direction_cosines,
    fit_direction,
    mass_mean_direction,
    random_directions,
    steer_verdict,
    verdict_states,
)
from interp.stages.calibration_directions import accept_gap_change

CONTEXT = "The Eiffel Tower is in Paris. It was finished in 1889."
QUESTION = "Where is the Eiffel Tower?"


@pytest.fixture(scope="module")
def prompts(tiny):
    tpl = get_template()
    kw = {"context": CONTEXT, "question": QUESTION}
    return {"eval": render(tiny.tokenizer, tpl, "eval", answer="in Paris", **kw),
            "self": render_self_check(tiny.tokenizer, tpl, answer="in Paris", **kw)}


def _planted(n=120, d=32, n_layers=3, layer=1, seed=0, shift=3.0, passages=40):
    """States ``[n, n_layers, d]`` whose layer ``layer`` moves along ``u`` with the label."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2 == 0
    rng.shuffle(y)
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    X = rng.standard_normal((n, n_layers, d))
    X[:, layer] += np.where(y, shift, 0.0)[:, None] * u
    groups = [f"p{i % passages}" for i in range(n)]
    return X, y, u, groups


def test_answer_and_verdict_states_are_resid_post_at_the_right_positions(tiny, prompts):
    sc, ev = prompts["self"], prompts["eval"]
    a, b = sc.token_spans["candidate"]
    assert b - a >= 2                                  # "in Paris": a mean over several tokens
    hooks = [f"blocks.{L}.hook_resid_post" for L in range(tiny.n_layers)]
    from interp.hooks.capture import hooked

    with torch.no_grad(), hooked(tiny.model, cache=hooks) as acts:
        tiny.model(input_ids=torch.tensor([sc.input_ids[:b]]))
    want = torch.stack([acts[h][0] for h in hooks]).float()       # [L, pos, d]
    got = answer_states(HookedModel(tiny), sc)
    torch.testing.assert_close(got["mean"], want[:, a:b].mean(1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["last"], want[:, b - 1], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got["mean"], got["last"])
    with torch.no_grad(), hooked(tiny.model, cache=hooks) as acts:
        tiny.model(input_ids=torch.tensor([ev.input_ids]))
    torch.testing.assert_close(verdict_states(HookedModel(tiny), ev.input_ids),
                               torch.stack([acts[h][0, -1] for h in hooks]).float(),
                               atol=1e-5, rtol=1e-5)


def test_a_direction_added_with_norm_zero_changes_nothing(tiny, prompts):
    model = HookedModel(tiny)
    replies = verdict_replies(tiny.tokenizer)
    ids = prompts["eval"].input_ids
    u = torch.tensor(random_directions(model.d_model, 1, seed=3), dtype=torch.float32)
    r = steer_verdict(model, ids, 1, torch.cat([0 * u, 50 * u, -50 * u]), replies)
    assert r["logit_diff"][0] == r["base"]
    assert r["first_logit_diff"][0] == r["base_first"]
    # a real push moves the verdict, and the sign of the push matters
    assert abs(r["logit_diff"][1] - r["base"]) > 1e-3
    assert abs(r["logit_diff"][1] - r["logit_diff"][2]) > 1e-3
    # the unedited score by this path is the whole-prompt forward's (the cache was cropped back)
    again = steer_verdict(model, ids, 0, 0 * u, replies)
    assert again["base"] == pytest.approx(r["base"], abs=1e-5)
    with pytest.raises(ValueError, match="outside"):
        steer_verdict(model, ids, tiny.n_layers, u, replies)
    with pytest.raises(ValueError, match="d_model"):
        steer_verdict(model, ids, 0, u[:, :3], replies)


def test_a_planted_direction_is_recovered_by_both_estimators():
    X, y, u, _ = _planted(n=400, d=32, shift=2.0)
    for method in ("mass_mean", "logistic"):
        w = fit_direction(X[:, 1], y, method)
        assert np.linalg.norm(w) == pytest.approx(1.0)
        assert cosine(w, u) > 0.9, method
        assert abs(cosine(fit_direction(X[:, 0], y, method), u)) < 0.5
    assert cosine(mass_mean_direction(X[:, 1], ~y), u) < -0.9       # it points to "right"
    with pytest.raises(ValueError, match="both classes"):
        mass_mean_direction(X[:, 1], np.ones(len(y), bool))
    with pytest.raises(ValueError, match="unknown"):
        fit_direction(X[:, 1], y, "pca")


def test_one_shared_direction_gives_cosine_near_one_and_cross_decodes():
    X, y, u, groups = _planted(n=600, d=32, shift=2.0, passages=60)
    rng = np.random.default_rng(1)
    J = rng.standard_normal(X.shape)
    J[:, 1] += np.where(y, 2.0, 0.0)[:, None] * u                # the judge carries the same one
    cos = direction_cosines(X, J, y, [0, 1, 2], n_perm=20, seed=0)
    for m in ("mass_mean", "logistic"):
        at = {r["layer"]: r for r in cos[m]}
        assert at[1]["cos"] > 0.9 and at[1]["cos"] > at[1]["perm_q95"]
        assert abs(at[0]["cos"]) < at[0]["perm_q95"] + 0.2
        assert 0 < at[1]["perm_p"] <= 1 / 21 + 1e-12
        assert at[1]["perm_n"] == 20 and at[1]["perm_max"] >= at[1]["perm_q95"]
    few = direction_cosines(X, J, y, [1], n_perm=3, seed=0)["mass_mean"][0]
    assert few["perm_q95"] is None and few["perm_n"] == 3 and few["perm_max"] < few["cos"]
    from interp.analysis.stats import roc_auc

    cd = cross_decode(X, J, y, groups, [0, 1, 2], folds=4, seed=0)
    for m in ("mass_mean", "logistic"):
        s = cd["scores"][m]
        assert not np.isnan(s["gen_on_judge"]).any()
        # a shift of 2 noise sds: the best any reader can do is Phi(2 / sqrt(2)) = 0.92
        assert roc_auc(y, s["gen_on_judge"][1]) > 0.88
        assert roc_auc(y, s["judge_on_gen"][1]) > 0.88
        assert abs(roc_auc(y, s["gen_on_judge"][0]) - 0.5) < 0.2
    # a judge that carries nothing: the generator's direction reads nothing there
    cd0 = cross_decode(X, rng.standard_normal(X.shape), y, groups, [1], folds=4, seed=0,
                       methods=("mass_mean",))
    assert roc_auc(y, cd0["scores"]["mass_mean"]["gen_on_gen"][0]) > 0.88
    assert abs(roc_auc(y, cd0["scores"]["mass_mean"]["gen_on_judge"][0]) - 0.5) < 0.15


def test_folds_are_disjoint_by_passage_and_cover_every_record_once():
    X, y, _, groups = _planted(n=150, passages=50)
    cd = cross_decode(X, X, y, groups, [1], folds=5, seed=0, methods=("mass_mean",))
    g = np.array(groups)
    tested = []
    for tr, te in cd["folds"]:
        assert not set(g[tr]) & set(g[te])
        tested += te
    assert sorted(tested) == list(range(len(y)))
    ch = choose_layer(X, y, groups, [0, 1, 2], folds=3)
    assert ch["layer"] == 1 and ch["auc"][1] > 0.9 > ch["auc"][0]


def test_accept_gap_change_on_constructed_cases():
    y = np.array([1, 1, 1, 1, 0, 0, 0, 0], bool)
    g = [f"p{i}" for i in range(8)]
    base = np.array([1, 1, 0, 0, 1, 1, 0, 0])        # accepts half of each: gap 0
    steered = np.array([1, 1, 1, 1, 0, 0, 0, 0])     # accepts the right ones only: gap 1
    r = accept_gap_change(y, steered, base, g, np.random.default_rng(0), 200)
    assert (r["a"], r["b"], r["difference"]) == (1.0, 0.0, 1.0)
    assert r["ci"][0] <= 1.0 <= r["ci"][1] + 1e-12
    same = accept_gap_change(y, base, base, g, np.random.default_rng(0), 200)
    assert same["difference"] == 0.0 and same["ci"] == [0.0, 0.0]
    share = accept_gap_change(y, np.full(8, 0.5), base, g, np.random.default_rng(0), 0)
    assert share["difference"] == 0.0 and share["ci"] is None
    assert accept_gap_change(np.ones(3, bool), np.ones(3), np.ones(3), g[:3],
                             np.random.default_rng(0), 10)["difference"] is None


def test_the_directions_part_alone_writes_its_summary_and_figure_and_resumes(tmp_path):
    from interp.core.errors import StageError
    from interp.stages import calibration as stage
    from interp.testing import synthetic_probe_run, tiny_llama, tiny_tokenizer

    tok = tiny_tokenizer(vocab_size=280)
    handle = tiny_llama(tok, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, seed=3)
    run = synthetic_probe_run(tmp_path / "run", handle, n_good=8, n_bad=8)
    cfg = stage.CalibrationConfig(card=False, directions=True, folds=2, inner_folds=2,
                                  n_boot=30, direction_norms=[0.5, 1.0], direction_seeds=2,
                                  direction_perms=3, progress=False)
    s = stage.run(run, handle, cfg, log=lambda m: None)
    d = s["directions"]
    assert s["all"] is None and d["n"] == 16 and d["pool"] == "mean"
    assert [r["layer"] for r in d["cosine"]["mass_mean"]] == [0, 1]
    assert set(d["cross_decoding"]["logistic"]) == {"gen_on_gen", "gen_on_judge",
                                                   "judge_on_judge", "judge_on_gen"}
    st = d["steer"]
    assert st["norms"] == [0.5, 1.0] and len(st["own"]) == 2 and len(st["random_seeds"][0]) == 2
    assert len(st["folds"]) == 2 and sum(f["n_test"] for f in st["folds"]) == 16
    for o in st["own"]:
        assert 0 <= o["flip_share"]["mean"] <= 1 and o["delta_auc"]["b"] == st["base_auc"]
    # the base score by the steering path is the judge's score by a whole forward
    steer = sorted((run.path / "calibration/directions/steer").glob("*.json"))
    assert len(steer) == 16
    from interp.core.io import read_json
    from interp.judging.prompts import rerender
    from interp.judging.verdict import score_verdicts, verdict_replies

    part = read_json(steer[0])["part"]
    rec = next(r for r in run.read_records(status="ok") if r["id"] == part["id"])
    ev = rerender(rec, "eval", handle.tokenizer)
    sc = score_verdicts(handle, [ev.input_ids], replies=verdict_replies(handle.tokenizer))
    assert part["base"] == pytest.approx(float(sc.logit_diff[0]), abs=1e-4)
    assert (run.path / "figures/calibration_directions.png").is_file()
    assert "directions (mean over the answer tokens" in stage.format_summary(s)
    states = sorted((run.path / "calibration/directions/states").glob("*.safetensors"))
    before = {p: p.stat().st_mtime_ns for p in [*states, *steer]}
    s2 = stage.run(run, handle, cfg, log=lambda m: None)
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert s2["directions"]["steer"]["own"] == st["own"]
    with pytest.raises(StageError, match="direction_pool"):
        stage.CalibrationConfig.from_mapping({"direction_pool": "max"})
    with pytest.raises(StageError, match="direction_norms"):
        stage.CalibrationConfig.from_mapping({"direction_norms": [0.0]})
