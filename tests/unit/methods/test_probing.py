"""Probes: pools, probes against scikit-learn, the permutation null, and the probe stage."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from interp.analysis.stats import make_folds
from interp.core.errors import LayerSpecError, StageError
from interp.judging.residual_features import POOLS, pool_resid
from interp.methods import probing
from interp.methods.probing import (
    FittedProbe,
    best_row,
    fit_probe,
    nested_selection,
    permutation_null,
    sweep,
)
from interp.stages.probe import ProbeConfig, format_summary
from interp.stages.probe import run as run_probes
from interp.store.rundir import RunDir
from interp.testing import synthetic_probe_run


def _synthetic_run(tmp_path, handle, n_good=9, n_bad=15):
    run = synthetic_probe_run(tmp_path / "run", handle, n_good, n_bad)
    return run, run.read_records()


def test_pool_resid_ground_truth():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(3, 7, 5, generator=g)
    out, fb = pool_resid(r, (2, 5), POOLS)
    a = r.numpy()
    assert not fb
    np.testing.assert_allclose(out["last"].numpy(), a[:, 6])
    np.testing.assert_allclose(out["candidate"].numpy(), a[:, 2:5].mean(1), rtol=1e-6)
    np.testing.assert_allclose(out["mean"].numpy(), a.mean(1), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out["max"].numpy(), a.max(1))
    np.testing.assert_allclose(out["min"].numpy(), a.min(1))
    out, fb = pool_resid(r, None, ["candidate"])
    assert fb and torch.equal(out["candidate"], r[:, -1])


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
                            random_state=3).fit(Z, y, sample_weight=probing.balanced_weights(y))
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


def test_run_probes_end_to_end_and_resume(tiny, tmp_path):
    from interp.methods.asymmetry import group_metrics

    run, recs = _synthetic_run(tmp_path, tiny)
    cfg = ProbeConfig(folds=3, top_k=1, batch_size=4, seed=0, pools=["last", "candidate", "max"],
                      permutations=3)
    logs: list[str] = []
    res = run_probes(run, tiny, cfg, log=logs.append)
    pm = res["tasks"]["eval"]["permutation"]
    assert pm["n"] + pm["skipped"] == 3 and pm["observed"] == pytest.approx(
        max(r["auc"] for r in res["tasks"]["eval"]["grid"] if r["probe"] == "logreg"))
    assert "permutation null" in format_summary(res)
    # 24 records, 9 of the rarer class: no flag; the same scores on 6 records are flagged
    assert "fit on only" not in format_summary(res) and "*  F1" not in format_summary(res)
    tiny_fit = format_summary({**res, "n_records": 6, "class_counts": {"correct": 3,
                                                                        "incorrect": 3}})
    assert "\n* fit on only 6 records, 3 of the rarer class" in tiny_fit
    assert all("*  F1" in line for line in tiny_fit.splitlines() if "prompt best" in line)
    from interp.plots.probes import permutation_text  # the figure names the permuted cell
    assert permutation_text(pm) == (f"\npermutation p={pm['p_value']:.2f} (best logreg cell, "
                                    f"AUC {pm['observed']:.2f}, {pm['n']} permutations)")
    assert permutation_text(None) == "" and "1 permutation)" in permutation_text(
        {**pm, "n": 1})
    out = run.path / "probes"
    assert (out / "results.json").exists() and (run.path / "figures" / "probes.png").exists()
    assert (out / "features_eval.safetensors").exists()
    # the judge's numbers equal the asymmetry harness's on the same records
    gm = group_metrics(recs, n_boot=10)
    assert res["judge"]["overall"]["EA"] == pytest.approx(gm["EA"])
    assert res["judge"]["overall"]["auc"] == pytest.approx(gm["auc_logit_diff"])
    assert res["judge"]["overall"]["EA_forced"] == pytest.approx(gm["EA_forced"])
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
    # the paired comparison with the judge: both AUCs on the same records (the probe's from
    # the best cell's pooled out-of-fold scores, which find the candidate word too)
    pa = res["tasks"]["eval"]["vs_judge"]["auc_paired"]
    assert pa["probe"] > 0.9 and pa["n"] == 24 and pa["n_passages"] == res["n_passages"]
    # and within each dataset, where knowing the dataset gains nothing
    vs = res["tasks"]["eval"]["vs_judge"]
    w = vs["auc_paired_within_dataset"]
    assert w["probe"] > 0.9 and w["n"] == 24 and w["probe_minus_judge"] == pytest.approx(
        w["probe"] - w["judge"])
    by_ds = {d: np.mean([r["oracle_label"] for r in recs if r["dataset"] == d])
             for d in {r["dataset"] for r in recs}}
    assert vs["auc_dataset_only"] == pytest.approx(roc_auc_score(
        [r["oracle_label"] for r in recs], [by_ds[r["dataset"]] for r in recs]))
    assert pa["judge"] == pytest.approx(gm["auc_logit_diff"])
    assert pa["probe_minus_judge"] == pytest.approx(pa["probe"] - pa["judge"])
    assert pa["ci"][0] <= pa["probe_minus_judge"] <= pa["ci"][1] and pa["n"] == 24
    # transfer between the two datasets (both have both classes)
    tr = res["transfer"]
    assert tr["possible"] and {(p["train"], p["test"]) for p in tr["pairs"]} >= {
        ("hotpotqa", "squad_v2"), ("squad_v2", "hotpotqa")}
    # saved weights reproduce the refitted probe on the cached features
    w = res["weights"]["eval/logreg"]
    probe = FittedProbe.load(run.path / w["json"].removesuffix(".json"))
    from interp.core.io import load_tensors

    feats = load_tensors(out / "features_eval.safetensors")
    b = res["tasks"]["eval"]["best_by_probe"]["logreg"]
    X = feats[b["pool"]][:, b["layer"]].numpy()
    y = np.array([r["oracle_label"] for r in recs])
    ref = fit_probe(X, y, "logreg")
    np.testing.assert_allclose(probe.decision(X), ref.decision(X), atol=1e-8)
    # resume: nothing recomputed, same results
    logs.clear()
    res2 = run_probes(run, tiny, cfg, log=logs.append)
    assert not any("to extract" in s for s in logs)
    assert any("sweep reused" in s for s in logs)
    assert res2["tasks"]["eval"]["grid"] == res["tasks"]["eval"]["grid"]
    assert res2["tasks"]["eval"]["permutation"] == pm
    assert not any("permutation null" in s for s in logs)
    # a longer null keeps the permutations already run (the checkpoint of each one)
    partial = json.loads((out / "permutation_eval.partial.json").read_text())["outcomes"]
    assert [x for x in partial if x is not None] == pm["null"] and len(partial) == 3
    logs.clear()
    cfg.permutations = 5
    longer = run_probes(run, tiny, cfg, log=logs.append)["tasks"]["eval"]["permutation"]
    assert any("3 permutations of an interrupted null kept" in s for s in logs)
    assert longer["n"] + longer["skipped"] == 5 and longer["null"][:pm["n"]] == pm["null"]
    # the nested selection: one chosen cell per outer fold, reused from its cache on resume
    ne = res["tasks"]["eval"]["vs_judge"]["nested"]
    assert len(ne["chosen"]) == 3 and ne["inner_folds"] >= 2
    assert ne["auc_paired"]["probe"] > 0.75   # 16 training records choose the cell
    assert ne["auc_paired_within_dataset"]["n"] == 24
    assert ne["auc_paired"]["judge"] == pytest.approx(pa["judge"])   # the same judge, records
    assert (out / "nested_eval.json").exists() and (out / "nested_gen.json").exists()
    assert longer is not None and not any("nested selection" in s for s in logs)


def test_too_few_examples_error_and_bad_config(tiny, tmp_path):
    run, _ = _synthetic_run(tmp_path, tiny, n_good=2, n_bad=6)
    with pytest.raises(StageError, match=r"y\*=Correct 2, y\*=Incorrect 6"):
        run_probes(run, tiny, ProbeConfig(folds=3), log=lambda s: None)
    # limit keeps the first N records of each dataset: here k = 0, 2 (hotpotqa), 1, 3 (squad_v2)
    with pytest.raises(StageError, match=r"y\*=Correct 2, y\*=Incorrect 2"):
        run_probes(run, tiny, ProbeConfig(folds=3, limit=2), log=lambda s: None)
    with pytest.raises(ValueError, match="\\[probe\\]: unknown config keys \\['foo'\\]"):
        ProbeConfig.from_mapping({"foo": 1})
    with pytest.raises(StageError, match="unknown probe"):
        ProbeConfig(probes=["forest"])
    empty = RunDir(tmp_path / "empty")
    with pytest.raises(Exception, match="interp asymmetry"):
        run_probes(empty, tiny, ProbeConfig())


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_permutation_null_separates_signal_from_selection():
    """A real signal beats every permuted-label search; pure noise does not.

    Noise's best cell is as good as the best cell found on permuted labels.
    """
    rng = np.random.default_rng(0)
    n, n_layers, d = 60, 3, 8
    y = np.zeros(n, bool)
    y[rng.choice(n, 20, replace=False)] = True
    noise = {"last": rng.normal(size=(n, n_layers, d)), "max": rng.normal(size=(n, n_layers, d))}
    signal = {k: v.copy() for k, v in noise.items()}
    signal["last"][:, 1, 0] += 3.0 * y               # layer 1, last token carries y
    for feats, strong in ((signal, True), (noise, False)):
        rows = sweep(feats, y, range(n_layers), make_folds(y, 3, 0), probes=["logreg"],
                     log=lambda s: None)
        obs = best_row(rows, "auc")["auc"]
        pm = permutation_null(feats, y, range(n_layers), obs, n_permutations=9, folds=3, seed=0,
                              log=lambda s: None)
        assert pm["n"] == 9 and len(pm["null"]) == 9 and pm["skipped"] == 0
        assert all(0.0 <= v <= 1.0 for v in pm["null"])
        if strong:
            assert obs > 0.9 and pm["p_value"] == pytest.approx(0.1)   # (1 + 0) / (1 + 9)
        else:
            assert pm["p_value"] > 0.1 and pm["null_q95"] > 0.55      # selection inflates



def test_a_null_permuted_within_datasets_keeps_what_the_dataset_alone_gives():
    """Two datasets with base rates 0.7 and 0.1; the features know only the dataset.

    Permuted across datasets the labels lose the base rates, so the dataset feature "beats"
    the null; permuted within each dataset they keep them, and it does not.
    """
    rng = np.random.default_rng(3)
    n = 60
    ds = np.array(["a"] * 30 + ["b"] * 30)
    y = np.zeros(n, bool)
    y[rng.choice(30, 21, replace=False)] = True              # a: 21 of 30
    y[30 + rng.choice(30, 3, replace=False)] = True          # b: 3 of 30
    feats = {"last": rng.normal(size=(n, 1, 4))}
    feats["last"][:, 0, 0] += 3.0 * (ds == "a")
    folds = make_folds(y, 3, 0)
    obs = best_row(sweep(feats, y, [0], folds, probes=["logreg"], log=lambda s: None),
                   "auc")["auc"]
    kw = dict(n_permutations=9, folds=3, seed=0, log=lambda s: None)
    across = permutation_null(feats, y, [0], obs, **kw)
    within = permutation_null(feats, y, [0], obs, strata=ds, **kw)
    assert obs > 0.75 and across["p_value"] == pytest.approx(0.1) and across["within"] is None
    assert within["within"] == "strata" and within["p_value"] > 0.1
    assert within["null_mean"] > across["null_mean"] + 0.15


def _noise(seed: int, n_layers: int, d: int, pools=("last",), n: int = 40, pos: int = 15):
    """Labels with ``pos`` positives and Gaussian features ``{pool: [n, n_layers, d]}``."""
    rng = np.random.default_rng(seed)
    y = np.zeros(n, bool)
    y[rng.choice(n, pos, replace=False)] = True
    return y, {p: rng.normal(size=(n, n_layers, d)) for p in pools}


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_an_interrupted_permutation_null_resumes_to_the_uninterrupted_result():
    n_layers = 2
    y, feats = _noise(1, n_layers, 4)
    kw = {"n_permutations": 6, "folds": 3, "seed": 4, "log": lambda s: None}
    steps: list[list] = []
    whole = permutation_null(feats, y, range(n_layers), 0.6, on_step=lambda o: steps.append(
        list(o)), **kw)
    assert [len(s) for s in steps] == [1, 2, 3, 4, 5, 6] and steps[-1] == whole["null"]

    class Killed(Exception):
        pass

    def kill_after_two(o):
        if len(o) == 2:
            raise Killed
    with pytest.raises(Killed):
        permutation_null(feats, y, range(n_layers), 0.6, on_step=kill_after_two, **kw)
    resumed = permutation_null(feats, y, range(n_layers), 0.6, done=steps[1], **kw)
    assert resumed == whole
    assert resumed["null"][:2] == steps[1]


def test_probe_layers_use_the_one_layer_grammar(tiny, tmp_path):
    """`--layers last1` works for probes as for attention; a bad spec fails before any work."""
    run, _ = _synthetic_run(tmp_path, tiny, n_good=3, n_bad=3)
    cfg = ProbeConfig(folds=3, layers="last1", probes=["logreg"], pools=["last"], tasks=["eval"])
    res = run_probes(run, tiny, cfg, log=lambda s: None)
    assert res["layers"] == [1] and {r["layer"] for r in res["tasks"]["eval"]["grid"]} == {1}
    with pytest.raises(LayerSpecError, match="cannot parse"):
        ProbeConfig(layers="1..2")
    with pytest.raises(LayerSpecError, match="valid layers are 0-1"):
        run_probes(run, tiny, ProbeConfig(folds=3, layers="5"), log=lambda s: None)



def test_probe_figure_best_box_stays_inside_its_axes_and_flags_a_small_fit(tmp_path):
    """The 'best' box of the probe figure, drawn from the stored results, fits its panel."""
    from pathlib import Path

    import matplotlib
    from matplotlib.figure import Figure

    from interp.plots import probes as probe_plots

    results = json.loads((Path(__file__).resolve().parents[3] / "figures"
                          / "smollm2-135m-instruct__probes_results.json").read_text())
    small = {**results, "n_records": 6, "class_counts": {"correct": 3, "incorrect": 3}}
    seen: list[tuple[str, bool]] = []
    save = Figure.savefig

    def check(fig, *args, **kwargs):
        if not str(args[0]).endswith(".png"):
            return save(fig, *args, **kwargs)
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        for ax in fig.axes:
            box = ax.get_window_extent(r)
            for t in ax.texts:
                if t.get_text().startswith("best of "):
                    e = t.get_bbox_patch().get_window_extent(r)
                    seen.append((t.get_text(), box.x0 <= e.x0 and e.x1 <= box.x1))
        return save(fig, *args, **kwargs)

    matplotlib.figure.Figure.savefig = check
    try:
        probe_plots.plot_probes(small, tmp_path, "probes")
    finally:
        matplotlib.figure.Figure.savefig = save
    assert len(seen) == 2 and all(inside for _, inside in seen), seen
    assert all("AUC " in s and "* fit on only 6 records" in s for s, _ in seen)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_cells_in_parallel_processes_give_the_rows_and_null_of_one_process():
    """n_jobs only spreads the cells over processes: sweep rows and null outcomes are equal."""
    n_layers = 3
    y, feats = _noise(2, n_layers, 5, pools=("last", "mean"))
    folds = make_folds(y, 3, 0)
    kw = {"probes": ["logreg", "svm"], "top_k": 2, "log": lambda s: None, "progress": False}
    one = sweep(feats, y, range(n_layers), folds, **kw)
    two = sweep(feats, y, range(n_layers), folds, n_jobs=2, **kw)
    assert two == one and len(one) == 2 * 3 + 2
    pk = {"n_permutations": 3, "folds": 3, "seed": 1, "log": lambda s: None}
    assert (permutation_null(feats, y, range(n_layers), 0.6, n_jobs=2, **pk)
            == permutation_null(feats, y, range(n_layers), 0.6, **pk))


def test_an_svm_probe_fit_is_reproducible():
    """LinearSVC's dual coordinate descent shuffles with numpy's global state unless seeded."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 300)), rng.random(40) < 0.5
    a, b = fit_probe(X, y, "svm", seed=1), fit_probe(X, y, "svm", seed=1)
    np.testing.assert_array_equal(a.coef, b.coef)


def test_the_probe_figure_says_when_a_mean_leaves_out_folds(tmp_path, monkeypatch):
    """A cell whose test fold held one class averages over fewer folds: the figure says so."""
    import copy
    from pathlib import Path

    from interp.plots import probes as probe_plots

    results = json.loads((Path(__file__).resolve().parents[3] / "figures"
                          / "smollm2-135m-instruct__probes_results.json").read_text())
    kept: list = []
    monkeypatch.setattr(probe_plots, "save", lambda fig, d, n: kept.append(fig) or n)
    probe_plots.plot_probes(results, tmp_path)
    notes = [t.get_text() for t in kept[-1].texts if t.get_gid() == "footnote"]
    assert not any("fewer folds" in n for n in notes)
    short = copy.deepcopy(results)
    task = next(iter(short["tasks"]))
    short["tasks"][task]["grid"][0]["undefined_folds"] = [{"fold": 1, "correct": 0,
                                                           "incorrect": 4}]
    probe_plots.plot_probes(short, tmp_path)
    notes = [t.get_text() for t in kept[-1].texts if t.get_gid() == "footnote"]
    assert any(f"{task}: 1 of {len(short['tasks'][task]['grid'])} cells average over fewer "
               f"folds (up to 1 of {short['folds']}" in n.replace("\n", " ") for n in notes)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_nested_selection_finds_a_real_cell_and_is_not_fooled_by_noise():
    """Signal in one cell is chosen in every fold; noise over many cells is not rewarded.

    With the signal, every outer fold chooses its cell and the held-out AUC is high. Over pure
    noise the sweep's best cell looks better than chance, the nested scores (the cell chosen
    without the test fold) do not.
    """
    from interp.analysis.stats import roc_auc

    rng = np.random.default_rng(0)
    n, n_layers = 80, 12
    y = np.zeros(n, bool)
    y[rng.choice(n, 32, replace=False)] = True
    groups = np.arange(n) // 2                        # two records a passage
    noise = {p: rng.normal(size=(n, n_layers, 6)) for p in ("last", "max")}
    signal = {k: v.copy() for k, v in noise.items()}
    signal["max"][:, 7, 2] += 2.5 * y                  # layer 7, max pool carries y
    folds = make_folds(y, 4, 0, groups=groups)
    kw = dict(inner_folds=3, seed=0, probes=["logreg"], log=lambda s: None)
    sig = nested_selection(signal, y, range(n_layers), folds, groups, **kw)
    assert [(c["layer"], c["pool"]) for c in sig["chosen"]] == [(7, "max")] * 4
    assert sig["n_distinct"] == 1 and roc_auc(y, sig["oof"]) > 0.9
    rows = sweep(noise, y, range(n_layers), folds, probes=["logreg"], log=lambda s: None)
    best = best_row(rows, "auc")["auc"]
    nested = roc_auc(y, nested_selection(noise, y, range(n_layers), folds, groups, **kw)["oof"])
    assert best > 0.6 and nested < best - 0.1     # selection inflates; nesting removes it


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_nested_selection_never_reads_the_test_fold():
    """The test fold's features never change its chosen cell: only its own scores move."""
    y, feats = _noise(2, 4, 5, pools=("last", "mean"), n=48, pos=20)
    groups = np.arange(48)
    folds = make_folds(y, 3, 0, groups=groups)
    kw = dict(inner_folds=3, seed=1, probes=["logreg"], log=lambda s: None)
    a = nested_selection(feats, y, range(4), folds, groups, **kw)
    te = folds[0][1]
    moved = {p: f.copy() for p, f in feats.items()}
    for f in moved.values():
        f[te] = np.random.default_rng(9).normal(size=f[te].shape) * 5
    b = nested_selection(moved, y, range(4), folds, groups, **kw)
    assert b["chosen"][0] == a["chosen"][0]
    assert not np.allclose(b["oof"][te], a["oof"][te])


def test_the_verbal_judges_balanced_accuracy_counts_no_verdict_wrong_on_both_sides():
    """The probe stage's judge line and Study 1's ``balanced_accuracy`` are one number."""
    from interp.analysis.stats import ClusterBootstrap
    from interp.methods.balanced import own_balanced

    # right answers: accepted, accepted, no verdict, rejected; wrong: no verdict x2, rejected,
    # accepted
    y = [True] * 4 + [False] * 4
    v = [True, True, None, False, None, None, False, True]
    recs = [{"id": f"r{i}", "dataset": "squad_v2", "oracle_label": t, "verdict": x,
             "logit_diff": float(i), "p_correct": 0.5, "logprob_correct": -1.0,
             "logprob_incorrect": -1.0 - i, "verdict_coverage": 0.9}
            for i, (t, x) in enumerate(zip(y, v))]
    j = probing.judge_metrics(recs)["overall"]
    assert j["balanced_accuracy"] == pytest.approx((2 / 4 + 1 / 4) / 2)   # not (2/4 + 3/4) / 2
    bs = ClusterBootstrap(list(range(8)), 50, np.random.default_rng(0))
    ref = own_balanced(bs, np.array(y), v, np.zeros(8, bool))["balanced_accuracy"]
    assert j["balanced_accuracy"] == pytest.approx(ref)
    assert j["EA"] == pytest.approx(3 / 8) and j["invalid_verdicts"] == 3
