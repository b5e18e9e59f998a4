"""interp.analysis.stats against hand computations, scipy and scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest

from interp.analysis.stats import (
    MIN_PASSAGES,
    ClusterBootstrap,
    binary_metrics,
    correlations,
    fold_summary,
    make_folds,
    mcnemar,
    passage_groups,
    passage_note,
    percentile_ci,
    resample_indices,
    roc_auc,
    wilson_ci,
)
from interp.core.errors import StageError


def test_folds_disjoint_and_class_count_error():
    y = np.array([True] * 6 + [False] * 14)
    folds = make_folds(y, 3, seed=1)
    seen = np.concatenate([te for _, te in folds])
    assert sorted(seen.tolist()) == list(range(20))
    for tr, te in folds:
        assert not set(tr) & set(te)
        assert y[te].any() and (~y[te]).any()
    with pytest.raises(StageError, match=r"y\*=Correct 2, y\*=Incorrect 18"):
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
    with pytest.raises(StageError, match=r"too few groups \(passages\).*y\*=Correct 2"):
        make_folds(y2, 3, seed=0, groups=groups)
    recs = [{"dataset": "squad_v2", "context": "A"}, {"dataset": "squad_v2", "context": "A"},
            {"dataset": "drop", "context": "A"}, {"dataset": "squad_v2", "context": "B"}]
    g = passage_groups(recs)
    assert g[0] == g[1] and len(set(g)) == 3


def test_binary_metrics_equal_sklearn():
    from sklearn.metrics import accuracy_score, balanced_accuracy_score, f1_score, roc_auc_score

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
    assert roc_auc(np.array([True, False, True]), np.array([0.9, 0.1, 0.2])) == 1.0
    assert roc_auc(np.array([True, True]), np.array([0.3, 0.4])) is None


def test_bootstrap_is_one_draw_of_a_seeded_generator():
    """One example per cluster is the ordinary example bootstrap.

    The resamples are rng.integers(0, n, (n_boot, n)) as weights; CIs are the 2.5/97.5
    percentiles.
    """
    x = np.arange(10.0)
    bs = ClusterBootstrap(None, 400, np.random.default_rng(5), n=10)
    a = bs.mean(x)
    idx = np.random.default_rng(5).integers(0, 10, size=(400, 10))
    assert (resample_indices(10, 400, np.random.default_rng(5)) == idx).all()
    means = x[idx].mean(1)
    assert np.allclose(bs.means(x), means, atol=1e-12)
    assert a["mean"] == 4.5
    assert a["ci"] == pytest.approx([np.percentile(means, 2.5), np.percentile(means, 97.5)],
                                    abs=1e-12)
    # distinct cluster labels are the same thing as no clusters
    same = ClusterBootstrap([f"p{i}" for i in range(10)], 400, np.random.default_rng(5))
    assert np.array_equal(same.weights, bs.weights)
    assert bs.mean(np.array([])) == {"mean": None, "ci": None}
    one = ClusterBootstrap(["p"] * 4, 400, np.random.default_rng(0))
    assert one.weights is None and one.mean(np.ones(4)) == {"mean": 1.0, "ci": None}
    assert ClusterBootstrap(None, 0, np.random.default_rng(0), n=5).mean(x[:5])["ci"] is None
    lo, hi = percentile_ci(np.stack([means, -means], axis=1))
    assert lo.shape == (2,) and lo[0] == pytest.approx(a["ci"][0]) and hi[1] == -lo[0]


def test_cluster_bootstrap_is_wider_than_the_example_bootstrap_on_three_passages():
    """30 records on 3 passages whose means are 0, 0.5 and 1.

    Resampling passages, a resample of three times the same passage (probability 1/27 > 2.5%
    each) gives 0 or 1, so the CI is exactly [0, 1]; resampling records gives about +-1/6.
    """
    x = np.array([0.0] * 10 + [0.0, 1.0] * 5 + [1.0] * 10)
    passages = ["A"] * 10 + ["B"] * 10 + ["C"] * 10
    clus = ClusterBootstrap(passages, 2000, np.random.default_rng(0))
    ex = ClusterBootstrap(None, 2000, np.random.default_rng(0), n=30)
    assert clus.n_clusters == 3 and ex.n_clusters == 30
    assert clus.mean(x) == {"mean": 0.5, "ci": [0.0, 1.0]}
    assert ex.mean(x) == {"mean": 0.5, "ci": [pytest.approx(1 / 3), pytest.approx(2 / 3)]}
    # every record of a passage gets its passage's draw count; each resample draws 3 passages
    w = clus.weights
    assert (w[:, :10] == w[:, :1]).all() and (w.sum(1) == 30).all()
    # a ratio of means: NaN where a resample's denominator is 0, left out of the interval
    num, den = np.array([1.0] * 10 + [0.0] * 20), np.array([1.0] * 10 + [0.0] * 20)
    value, samples = clus.ratio_of_means(num, den)
    assert value == 1.0 and np.isnan(samples).any() and clus.interval(samples) == [1.0, 1.0]
    assert clus.ratio_of_means(num, np.zeros(30))[0] is None


def test_cluster_bootstrap_does_not_depend_on_the_order_of_the_examples():
    """A merged or resumed run keeps its records in another order: the same CIs."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=60)
    passages = [f"p{i % 17}" for i in range(60)]
    order = rng.permutation(60)
    a = ClusterBootstrap(passages, 500, np.random.default_rng(5)).mean(x)
    b = ClusterBootstrap([passages[i] for i in order], 500, np.random.default_rng(5)).mean(
        x[order])
    assert a["ci"] == pytest.approx(b["ci"], abs=1e-12) and a["mean"] == pytest.approx(b["mean"])


def test_passage_note():
    assert passage_note(MIN_PASSAGES) is None
    assert passage_note(3).startswith("only 3 passages (< 10)")


def test_wilson_mcnemar_correlations_fold_summary():
    from scipy.stats import binomtest

    assert wilson_ci(0, 0) is None
    lo, hi = wilson_ci(3, 10)
    z = 1.959963984540054  # Wilson (1927) by hand
    c = (3 / 10 + z * z / 20) / (1 + z * z / 10)
    w = z / (1 + z * z / 10) * np.sqrt(0.3 * 0.7 / 10 + z * z / 400)
    assert (lo, hi) == pytest.approx((c - w, c + w), abs=1e-9)
    a = np.array([True, True, False, False, True])
    b = np.array([False, True, True, True, True])
    assert mcnemar(a, b) == {"b": 1, "c": 2, "p_value": pytest.approx(binomtest(1, 3).pvalue)}
    assert mcnemar(a, a)["p_value"] == 1.0
    r = correlations(np.array([1.0, 2, 3, np.nan, 5]), np.array([2.0, 4, 7, 1, 10]))
    assert r["n"] == 4 and r["spearman"] == pytest.approx(1.0) and 0.9 < r["pearson"] < 1
    assert correlations(np.ones(5), np.arange(5.0))["pearson"] is None
    s = fold_summary([{"auc": 0.5, "f1": 1.0}, {"auc": None, "f1": 0.0}], ["auc", "f1"])
    assert s == {"auc": 0.5, "auc_std": 0.0, "auc_n_folds": 1, "f1": 0.5, "f1_std": 0.5,
                 "f1_n_folds": 2, "n_folds": 2, "undefined_folds": [{"fold": 1,
                                                                     "metrics": ["auc"]}]}


def test_a_cross_validated_mean_says_which_folds_it_left_out():
    """A one-class test fold has no AUC: the mean says it is over 4 of 5 folds, and why."""
    from interp.methods.probing import cross_validate

    rng = np.random.default_rng(0)
    y = np.array([True] * 6 + [False] * 6)
    X = rng.normal(size=(12, 3)) + y[:, None]
    idx = np.arange(12)
    folds = [(np.setdiff1d(idx, te), te) for te in
             (np.array([0, 1, 2]), np.array([3, 6]), np.array([4, 7]), np.array([5, 8]),
              np.array([9, 10, 11]))]                   # folds 0 and 4 hold one class
    summary, _ = cross_validate(X, y, folds, "logreg")
    assert summary["n_folds"] == 5 and summary["auc_n_folds"] == 3
    assert summary["accuracy_n_folds"] == 5
    undefined = {u["fold"]: u for u in summary["undefined_folds"]}
    assert sorted(undefined) == [0, 4]
    assert (undefined[0]["n_correct"], undefined[0]["n_incorrect"]) == (3, 0)
    assert (undefined[4]["n_correct"], undefined[4]["n_incorrect"]) == (0, 3)
    assert "auc" in undefined[0]["metrics"] and "accuracy" not in undefined[0]["metrics"]


# ---------------------------------------------------------------- tiny groups are marked


def test_degenerate_interval_is_marked_wherever_formatted():
    from interp.analysis.stats import DEGENERATE_MARK, ci_text, degenerate_note, is_degenerate

    assert is_degenerate([1.0, 1.0]) and is_degenerate((0.25, 0.25))
    assert not is_degenerate([0.9, 1.0]) and not is_degenerate(None)
    assert ci_text([1.0, 1.0]) == "[1.00,1.00] (zero width)"
    assert ci_text([0.1, 0.3], "+.2f", ", ") == "[+0.10, +0.30]"
    assert ci_text(None) == "-"
    assert DEGENERATE_MARK in degenerate_note(3) and "on 3 passages" in degenerate_note(3)


def test_a_constant_metric_names_its_zero_width_intervals_in_metrics():
    """10 records (10 passages) all right and all judged right: GA = EA = 1.0 with [1.0, 1.0].

    The summary (``metrics.json``) names every zero-width interval in ``degenerate_cis``, as
    the tables and figures mark it (:data:`interp.analysis.stats.DEGENERATE_MARK`); a varied group
    names none.
    """
    from interp.methods.asymmetry import METRIC_DEFINITIONS, group_metrics

    def rec(i, right, verdict):
        return {"id": f"r{i}", "dataset": "squad_v2", "status": "ok", "context": f"passage {i}",
                "oracle_label": right, "verdict": verdict, "verdict_source": "word",
                "logit_diff": 1.0 + 0.1 * i if verdict else -1.0 - 0.1 * i,
                "p_correct": 0.9 if verdict else 0.1, "verdict_coverage": 0.5,
                "logprob_correct": -0.1 if verdict else -2.0,
                "logprob_incorrect": -2.0 if verdict else -0.1}

    same = group_metrics([rec(i, True, True) for i in range(10)], n_boot=200)
    assert (same["GA"], same["EA"], same["GA_ci"]) == (1.0, 1.0, [1.0, 1.0])
    assert {"GA_ci", "EA_ci", "delta_ci"} <= set(same["degenerate_cis"])
    assert "degenerate_cis" in METRIC_DEFINITIONS
    varied = group_metrics([rec(i, i % 2 == 0, i % 3 == 0) for i in range(10)], n_boot=200)
    assert "GA_ci" not in varied["degenerate_cis"] and "EA_ci" not in varied["degenerate_cis"]


def test_fit_note_flags_a_fit_on_too_few_records():
    from interp.analysis.stats import MIN_FIT_RECORDS, fit_note

    assert "only 6 records, 3 of the rarer class" in fit_note(6, {"correct": 3, "incorrect": 3})
    assert fit_note(MIN_FIT_RECORDS - 1) is not None
    assert fit_note(200, {"correct": 198, "incorrect": 2}) is not None  # one class too rare
    assert fit_note(200, {"correct": 100, "incorrect": 100}) is None
    assert fit_note(MIN_FIT_RECORDS) is None


def test_null_level_is_a_95th_percentile_only_with_enough_permutations():
    from interp.analysis.stats import MIN_QUANTILE_PERMUTATIONS, null_level

    level, words = null_level([0.5, 0.7])           # 2 draws: np.quantile gives 0.69
    assert level == 0.7 and words == "largest of 2 perms (too few for a 95th pct)"
    assert null_level([0.6]) == (0.6, "largest of 1 perm (too few for a 95th pct)")
    draws = np.linspace(0.0, 1.0, MIN_QUANTILE_PERMUTATIONS + 1)
    level, words = null_level(draws)
    assert level == pytest.approx(0.95) and words == "95th pct (21 perms)"
    assert null_level(draws, q95=0.9)[0] == 0.9     # a stored percentile is kept
    with pytest.raises(ValueError, match="at least one draw"):
        null_level([])
