"""Tests of interp.probing: residual-stream indexing, pools, padding, folds, probes, the study."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from interp import probing
from interp.probing import (FittedProbe, ProbeConfig, ProbeError, extract_features, fit_probe,
                            make_folds, parse_layers, passage_groups, pool_resid, rerender,
                            residual_stream, run_probes)
from interp.prompts import get_template, render
from interp.store import RunDir

GOOD = ["Paris", "Rome", "Berlin", "Madrid"]
BAD = ["banana", "seven", "blue sky", "a dog"]


def _hook_outputs(handle, ids, mask=None):
    """resid_post of every layer from forward hooks on model.model.layers[L] (ground truth)."""
    layers = handle.model.model.layers
    got = {}
    hs = [layer.register_forward_hook(
        lambda m, a, o, L=L: got.__setitem__(L, (o[0] if isinstance(o, tuple) else o).clone()))
        for L, layer in enumerate(layers)]
    try:
        with torch.inference_mode():
            out = handle.model.model(input_ids=ids, attention_mask=mask,
                                     output_hidden_states=True)
    finally:
        for h in hs:
            h.remove()
    return got, out


def test_hidden_states_indexing_against_hooks(tiny):
    ids = torch.tensor([tiny.tokenizer("The cat sat on the mat.")["input_ids"]])
    got, out = _hook_outputs(tiny, ids)
    n = tiny.n_layers
    hs = out.hidden_states
    assert len(hs) == n + 1
    # hidden_states[0]: the embedding output (resid_pre of layer 0)
    assert torch.allclose(hs[0], tiny.model.model.embed_tokens(ids))
    for L in range(n - 1):
        assert torch.equal(hs[L + 1], got[L])
    # the last entry is AFTER the final norm, not resid_post of the last layer
    assert torch.allclose(hs[n], tiny.model.model.norm(got[n - 1]), atol=1e-6)
    assert not torch.allclose(hs[n], got[n - 1], atol=1e-3)
    resid = residual_stream(tiny, ids)
    assert resid.shape == (1, n, ids.shape[1], tiny.info["d_model"])
    for L in range(n):
        assert torch.allclose(resid[0, L], got[L][0], atol=1e-6)


def test_pool_resid_ground_truth():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(3, 7, 5, generator=g)
    out, fb = pool_resid(r, (2, 5), probing.POOLS)
    a = r.numpy()
    assert not fb
    np.testing.assert_allclose(out["last"].numpy(), a[:, 6])
    np.testing.assert_allclose(out["candidate"].numpy(), a[:, 2:5].mean(1), rtol=1e-6)
    np.testing.assert_allclose(out["mean"].numpy(), a.mean(1), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out["max"].numpy(), a.max(1))
    np.testing.assert_allclose(out["min"].numpy(), a.min(1))
    out, fb = pool_resid(r, None, ["candidate"])
    assert fb and torch.equal(out["candidate"], r[:, -1])


def _prompts(tokenizer, n=5):
    tpl = get_template("default")
    out = []
    for k in range(n):
        ctx = " ".join(["The city of Paris is the capital of France."] * (1 + k))
        out.append(render(tokenizer, tpl, "eval", context=ctx, question="What is the capital?",
                          answer=(GOOD + BAD)[k % 8]))
    return out


def test_padded_batch_equals_unpadded(tiny):
    prompts = _prompts(tiny.tokenizer, 5)
    assert len({len(p) for p in prompts}) == 5  # different lengths: padding happens
    one, _ = extract_features(tiny, prompts, batch_size=1)
    batch, _ = extract_features(tiny, prompts, batch_size=5)
    for p in probing.POOLS:
        assert one[p].shape == (5, tiny.n_layers, tiny.info["d_model"])
        torch.testing.assert_close(batch[p], one[p], atol=1e-4, rtol=1e-4)
    # and the unpadded features equal hooks on a single unpadded forward
    ids = torch.tensor([prompts[2].input_ids])
    got, _ = _hook_outputs(tiny, ids)
    s, e = prompts[2].token_spans["candidate"]
    for L in range(tiny.n_layers):
        torch.testing.assert_close(one["candidate"][2, L], got[L][0, s:e].mean(0), atol=1e-5,
                                   rtol=1e-5)
        torch.testing.assert_close(one["last"][2, L], got[L][0, -1], atol=1e-5, rtol=1e-5)


def test_parse_layers():
    assert parse_layers("0,2-4,-1", 30) == [0, 2, 3, 4, 29]
    assert parse_layers(None, 30) is None
    with pytest.raises(ProbeError, match="valid layers are 0..29"):
        parse_layers("31", 30)
    with pytest.raises(ProbeError, match="bad layer item"):
        parse_layers("a-b", 30)


def test_folds_disjoint_and_class_count_error():
    y = np.array([True] * 6 + [False] * 14)
    folds = make_folds(y, 3, seed=1)
    seen = np.concatenate([te for _, te in folds])
    assert sorted(seen.tolist()) == list(range(20))
    for tr, te in folds:
        assert not set(tr) & set(te)
        assert y[te].any() and (~y[te]).any()
    with pytest.raises(ProbeError, match=r"y\*=Correct 2, y\*=Incorrect 18"):
        make_folds(np.array([True] * 2 + [False] * 18), 5, seed=0)


def test_group_folds_keep_each_passage_in_one_fold():
    """Records about one passage never sit in both a train and a test fold."""
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(15), 3)            # 15 passages x 3 questions
    y = rng.random(45) < 0.4
    y[:3], y[3:6] = True, False                     # both classes present in many groups
    folds = make_folds(y, 3, seed=0, groups=groups)
    assert sorted(np.concatenate([te for _, te in folds]).tolist()) == list(range(45))
    for tr, te in folds:
        assert not set(groups[tr]) & set(groups[te])
    # the class check counts passages, not records: 6 Correct records on 2 passages
    y2 = np.zeros(45, bool)
    y2[:6] = True
    with pytest.raises(ProbeError, match=r"too few groups \(passages\).*y\*=Correct 2"):
        make_folds(y2, 3, seed=0, groups=groups)
    recs = [{"dataset": "squad_v2", "context": "A"}, {"dataset": "squad_v2", "context": "A"},
            {"dataset": "drop", "context": "A"}, {"dataset": "squad_v2", "context": "B"}]
    g = passage_groups(recs)
    assert g[0] == g[1] and len(set(g)) == 3


@pytest.mark.parametrize("kind", ["logreg", "svm", "mlp"])
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_probe_matches_sklearn_and_roundtrips(kind, tmp_path):
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 8)) * rng.uniform(0.5, 5, size=8) + rng.normal(size=8)
    y = X[:, 0] + 0.5 * rng.normal(size=60) > 1.0
    p = fit_probe(X, y, kind, seed=3)
    Z = StandardScaler().fit_transform(X)
    if kind == "logreg":
        from sklearn.linear_model import LogisticRegression

        ref = LogisticRegression(class_weight="balanced", max_iter=2000).fit(Z, y)
        np.testing.assert_allclose(p.decision(X), ref.decision_function(Z), atol=1e-6)
    elif kind == "svm":
        from sklearn.svm import LinearSVC

        ref = LinearSVC(class_weight="balanced", max_iter=5000).fit(Z, y)
        np.testing.assert_allclose(p.decision(X), ref.decision_function(Z), atol=1e-6)
    else:
        from sklearn.neural_network import MLPClassifier

        ref = MLPClassifier(hidden_layer_sizes=(64,), alpha=1e-2, max_iter=300,
                            random_state=3).fit(Z, y, sample_weight=probing._balanced_weights(y))
        np.testing.assert_allclose(1 / (1 + np.exp(-p.decision(X))), ref.predict_proba(Z)[:, 1],
                                   atol=1e-6)
    assert (p.predict(X) == y).mean() > 0.8
    p.meta = {"layer": 3}
    npz, js = p.save(tmp_path / f"probe_{kind}")
    q = FittedProbe.load(tmp_path / f"probe_{kind}")
    np.testing.assert_allclose(q.decision(X), p.decision(X))
    doc = json.loads(js.read_text())
    assert doc["meta"] == {"layer": 3} and len(doc["scaler_mean"]) == 8
    with np.load(npz, allow_pickle=False) as z:  # no pickled objects inside
        assert all(z[k].dtype != object for k in z.files)


def _synthetic_run(tmp_path, handle, n_good=9, n_bad=15):
    """A run directory whose y* is decided by the candidate word (a signal a probe can find)."""
    tpl = get_template("default")
    run = RunDir(tmp_path / "run")
    run.init_manifest({"model": handle.spec, "templates_path": None}, model_info=handle.info)
    rng = np.random.default_rng(0)
    recs = []
    for k in range(n_good + n_bad):
        good = k < n_good
        ans = (GOOD if good else BAD)[k % 4]
        ctx = f"Fact {k}: the city of {GOOD[k % 4]} is large." + " It rains." * int(k % 3)
        q = f"Which city is in fact {k}?"
        ds = "squad_v2" if k % 2 else "hotpotqa"
        gp = render(handle.tokenizer, tpl, "gen", context=ctx, question=q, reference=ans)
        ep = render(handle.tokenizer, tpl, "eval", context=ctx, question=q, answer=ans,
                    reference=ans)
        verdict = bool(rng.random() < 0.8)  # an acquiescent judge
        recs.append({"id": f"ex{k}", "dataset": ds, "question": q, "context": ctx,
                     "answers": [ans], "answerable": True, "status": "ok", "model": handle.spec,
                     "template": "default", "generation": ans, "answer": ans,
                     "oracle_label": good, "verdict": verdict if k != 3 else None,
                     "verdict_text": "Correct", "p_correct": float(rng.random()),
                     "logit_diff": 0.0,
                     "prompts": {"gen": gp.to_record(), "eval": ep.to_record()}})
    run.append_records(recs)
    return run, recs


def test_rerender_mismatch_names_record(tiny, tmp_path):
    _, recs = _synthetic_run(tmp_path, tiny, 2, 2)
    rec = json.loads(json.dumps(recs[1]))
    assert rerender(rec, "eval", tiny.tokenizer).token_spans["candidate"] == tuple(
        rec["prompts"]["eval"]["token_spans"]["candidate"])
    rec["prompts"]["eval"]["token_spans"]["candidate"][0] += 1
    with pytest.raises(ProbeError, match="record squad_v2/ex1"):
        rerender(rec, "eval", tiny.tokenizer)


def test_run_probes_end_to_end_and_resume(tiny, tmp_path):
    from interp.asymmetry import group_metrics

    run, recs = _synthetic_run(tmp_path, tiny)
    cfg = ProbeConfig(folds=3, top_k=1, batch_size=4, seed=0, pools=["last", "candidate", "max"],
                      permutations=3)
    logs: list[str] = []
    res = run_probes(run, cfg, handle=tiny, log=logs.append)
    pm = res["tasks"]["eval"]["permutation"]
    assert pm["n"] + pm["skipped"] == 3 and pm["observed"] == pytest.approx(
        max(r["auc"] for r in res["tasks"]["eval"]["grid"] if r["probe"] == "logreg"))
    assert "permutation null" in probing.format_results(res)
    out = run.path / "probes"
    assert (out / "results.json").exists() and (run.path / "figures" / "probes.png").exists()
    assert (out / "features_eval.safetensors").exists()
    # the judge's numbers equal the asymmetry harness's on the same records
    gm = group_metrics(recs, n_boot=10)
    assert res["judge"]["overall"]["EA"] == pytest.approx(gm["EA"])
    assert res["judge"]["overall"]["auc"] == pytest.approx(gm["auc_p_correct"])
    assert res["class_counts"] == {"correct": 9, "incorrect": 15}
    # every cell of the first probe was swept; the others at top_k cells
    grid = res["tasks"]["eval"]["grid"]
    assert len([r for r in grid if r["probe"] == "logreg"]) == tiny.n_layers * 3
    assert len([r for r in grid if r["probe"] == "svm"]) == 1
    assert len([r for r in res["tasks"]["gen"]["grid"] if r["probe"] == "logreg"]) == \
        tiny.n_layers * 2  # no candidate pool on the gen prompt
    # y* is decided by the candidate word: the best eval probe finds it
    assert res["best"]["auc"] > 0.9
    assert res["best"] == max((r for r in grid), key=lambda r: (r["auc"], r["f1"], -r["layer"]))
    # transfer between the two datasets (both have both classes)
    tr = res["transfer"]
    assert tr["possible"] and {(p["train"], p["test"]) for p in tr["pairs"]} >= {
        ("hotpotqa", "squad_v2"), ("squad_v2", "hotpotqa")}
    # saved weights reproduce the refitted probe on the cached features
    w = res["weights"]["eval/logreg"]
    probe = FittedProbe.load(run.path / w["json"].removesuffix(".json"))
    from interp.store import load_tensors

    feats = load_tensors(out / "features_eval.safetensors")
    b = res["tasks"]["eval"]["best_by_probe"]["logreg"]
    X = feats[b["pool"]][:, b["layer"]].numpy()
    y = np.array([r["oracle_label"] for r in recs])
    ref = fit_probe(X, y, "logreg")
    np.testing.assert_allclose(probe.decision(X), ref.decision(X), atol=1e-8)
    # resume: nothing recomputed, same results
    logs.clear()
    res2 = run_probes(run, cfg, handle=tiny, log=logs.append)
    assert not any("to extract" in s for s in logs)
    assert any("sweep reused" in s for s in logs)
    assert res2["tasks"]["eval"]["grid"] == res["tasks"]["eval"]["grid"]
    assert res2["tasks"]["eval"]["permutation"] == pm
    assert not any("permutation null" in s for s in logs)


def test_too_few_examples_error_and_bad_config(tiny, tmp_path):
    run, _ = _synthetic_run(tmp_path, tiny, n_good=2, n_bad=6)
    with pytest.raises(ProbeError, match=r"y\*=Correct 2, y\*=Incorrect 6"):
        run_probes(run, ProbeConfig(folds=3), handle=tiny, log=lambda s: None)
    # limit keeps the first N records of each dataset: here k = 0, 2 (hotpotqa), 1, 3 (squad_v2)
    with pytest.raises(ProbeError, match=r"y\*=Correct 2, y\*=Incorrect 2"):
        run_probes(run, ProbeConfig(folds=3, limit=2), handle=tiny, log=lambda s: None)
    with pytest.raises(ValueError, match="\\[probe\\]: unknown config keys \\['foo'\\]"):
        ProbeConfig.from_mapping({"foo": 1})
    with pytest.raises(ProbeError, match="unknown probe"):
        ProbeConfig(probes=["forest"])
    empty = RunDir(tmp_path / "empty")
    with pytest.raises(Exception, match="interp asymmetry"):
        run_probes(empty, ProbeConfig(), handle=tiny)


@pytest.mark.integration
def test_bundled_quick_run(bundled, quick_run, tmp_path):
    """Real records re-render to their stored spans; the bundled model's last hidden state is
    after the final norm; the study runs (or names the class counts when too few)."""
    run = RunDir(tmp_path / "q")
    shutil.copytree(quick_run.path, run.path)
    recs = run.read_records()
    for r in recs:
        for task in ("eval", "gen"):
            rerender(r, task, bundled.tokenizer)
    ids = torch.tensor([bundled.tokenizer("Hello there, judge.")["input_ids"]])
    got, out = _hook_outputs(bundled, ids)
    n = bundled.n_layers
    assert torch.allclose(out.hidden_states[n - 1], got[n - 2])
    assert torch.allclose(out.hidden_states[n], bundled.model.model.norm(got[n - 1]), atol=1e-5)
    y = np.array([r["oracle_label"] for r in recs])
    cfg = ProbeConfig(folds=2, layers=[0, 15, 29], probes=["logreg", "svm"], top_k=1)
    g = np.array(passage_groups(recs))          # the folds count passages, not records
    n_c, n_i = len(set(g[y].tolist())), len(set(g[~y].tolist()))
    if min(n_c, n_i) < 2:
        with pytest.raises(ProbeError, match=f"y\\*=Correct {n_c}, y\\*=Incorrect {n_i}"):
            run_probes(run, cfg, handle=bundled, log=lambda s: None)
    else:
        res = run_probes(run, cfg, handle=bundled, log=lambda s: None)
        assert res["layers"] == [0, 15, 29] and res["best"]["layer"] in (0, 15, 29)


def test_binary_metrics_equal_sklearn():
    from sklearn.metrics import (accuracy_score, balanced_accuracy_score, f1_score,
                                 roc_auc_score)

    from interp.probing import binary_metrics

    rng = np.random.default_rng(1)
    for trial in range(20):
        n = int(rng.integers(4, 40))
        y = rng.random(n) < rng.uniform(0.1, 0.9)
        y[0], y[1] = True, False
        score = np.round(rng.normal(size=n) + y, 1)  # ties on purpose
        pred = score > rng.normal()
        m = binary_metrics(y, pred, score)
        assert m["accuracy"] == pytest.approx(accuracy_score(y, pred))
        assert m["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y, pred))
        assert m["f1"] == pytest.approx(f1_score(y, pred, zero_division=0))
        assert m["f1_macro"] == pytest.approx(f1_score(y, pred, average="macro",
                                                       zero_division=0))
        assert m["auc"] == pytest.approx(roc_auc_score(y, score))
    assert binary_metrics(np.array([True, True]), np.array([True, False]), None)["auc"] is None


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_permutation_null_separates_signal_from_selection():
    """A real signal beats every permuted-label search; pure noise does not (its best cell is
    as good as the best cell found on permuted labels)."""
    from interp.probing import best_row, permutation_null, sweep

    rng = np.random.default_rng(0)
    n, n_layers, d = 60, 3, 8
    y = np.zeros(n, bool)
    y[rng.choice(n, 20, replace=False)] = True
    noise = {"last": rng.normal(size=(n, n_layers, d)), "max": rng.normal(size=(n, n_layers, d))}
    signal = {k: v.copy() for k, v in noise.items()}
    signal["last"][:, 1, 0] += 3.0 * y               # layer 1, last token carries y
    cfg = ProbeConfig(folds=3, probes=["logreg"], permutations=9, seed=0)
    for feats, strong in ((signal, True), (noise, False)):
        rows = sweep(feats, y, range(n_layers), cfg, make_folds(y, 3, 0), log=lambda s: None)
        obs = best_row(rows, "auc")["auc"]
        pm = permutation_null(feats, y, range(n_layers), cfg, obs, log=lambda s: None)
        assert pm["n"] == 9 and len(pm["null"]) == 9 and pm["skipped"] == 0
        assert all(0.0 <= v <= 1.0 for v in pm["null"])
        if strong:
            assert obs > 0.9 and pm["p_value"] == pytest.approx(0.1)   # (1 + 0) / (1 + 9)
        else:
            assert pm["p_value"] > 0.1 and pm["null_q95"] > 0.55      # selection inflates
