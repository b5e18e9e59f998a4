"""ECE, Brier score and reliability data on constructed cases computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from interp.analysis.calibration import bin_index, brier, calibration_card, ece, reliability

Y = [True, False, True, True]
P = [0.9, 0.2, 0.6, 0.7]


def test_brier_by_hand():
    # (0.1^2 + 0.2^2 + 0.4^2 + 0.3^2) / 4 = (0.01 + 0.04 + 0.16 + 0.09) / 4
    assert brier(Y, P) == pytest.approx(0.075)
    assert brier([True, False], [1.0, 0.0]) == 0.0
    assert brier([True, False], [0.5, 0.5]) == pytest.approx(0.25)


def test_ece_equal_width_by_hand():
    # 2 bins of width 0.5: {0.2 (wrong)} -> |0 - 0.2| = 0.2; {0.9, 0.6, 0.7 (all right)}
    # -> |3 - 2.2| = 0.8; ECE = (0.2 + 0.8) / 4
    assert ece(Y, P, n_bins=2, binning="width") == pytest.approx(0.25)
    # p = 1.0 goes to the last bin, not to a bin of its own
    assert bin_index(np.array([0.0, 0.5, 1.0]), 2, "width").tolist() == [0, 1, 1]


def test_ece_equal_mass_by_hand():
    # sorted p: 0.2, 0.6 | 0.7, 0.9; gaps (0 - 0.2) + (1 - 0.6) = 0.2 and 0.3 + 0.1 = 0.4
    assert ece(Y, P, n_bins=2, binning="mass") == pytest.approx(0.15)
    assert bin_index(np.array(P), 2, "mass").tolist() == [1, 0, 0, 1]
    # one bin: |sum(y) - sum(p)| / n = |3 - 2.4| / 4
    assert ece(Y, P, n_bins=1) == pytest.approx(0.15)


def test_ece_zero_when_each_bin_is_calibrated_and_one_when_sure_and_wrong():
    y = [True, False, True, False, True, True, True, False]
    p = [0.5, 0.5, 0.5, 0.5, 0.75, 0.75, 0.75, 0.75]
    assert ece(y, p, n_bins=2) == pytest.approx(0.0)
    assert ece(y, p, n_bins=4, binning="width") == pytest.approx(0.0)
    assert ece([True, False], [0.0, 1.0], n_bins=2) == pytest.approx(1.0)


def test_integer_weights_count_an_example_that_often():
    w = np.array([2, 1, 3, 1])
    y_rep = np.repeat(Y, w)
    p_rep = np.repeat(P, w)
    assert brier(Y, P, weights=w) == pytest.approx(brier(y_rep, p_rep))
    # equal-width bins do not depend on the sample, so the weighted ECE is the repeated one
    assert ece(Y, P, 2, "width", weights=w) == pytest.approx(ece(y_rep, p_rep, 2, "width"))


def test_reliability_rows_by_hand():
    rows = reliability(Y, P, n_bins=2, binning="width")
    assert [(r["lo"], r["hi"], r["n"]) for r in rows] == [(0.0, 0.5, 1), (0.5, 1.0, 3)]
    assert rows[1]["confidence"] == pytest.approx(2.2 / 3) and rows[1]["accuracy"] == 1.0
    assert rows[0]["accuracy_ci"][0] == 0.0 and 0 < rows[0]["accuracy_ci"][1] < 1
    mass = reliability(Y, P, n_bins=2)
    assert [(r["lo"], r["hi"]) for r in mass] == [(0.2, 0.6), (0.7, 0.9)]
    assert [r["accuracy"] for r in mass] == [0.5, 1.0]


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="probabilities"):
        ece([True], [1.5])
    with pytest.raises(ValueError, match="binning"):
        ece([True], [0.5], binning="quantile")
    with pytest.raises(ValueError, match="one length"):
        brier([True, False], [0.5])


def test_card_values_and_cluster_intervals():
    rng = np.random.default_rng(0)
    n = 200
    p = rng.uniform(0, 1, n)
    y = rng.uniform(0, 1, n) < p            # calibrated by construction
    groups = [f"g{i // 2}" for i in range(n)]
    c = calibration_card(y, p, groups, np.random.default_rng(1), 300, n_bins=10)
    assert c["brier"] == pytest.approx(brier(y, p))
    assert c["ece"]["mass"]["value"] == pytest.approx(ece(y, p, 10, "mass"))
    assert c["ece"]["width"]["value"] == pytest.approx(ece(y, p, 10, "width"))
    assert c["n_passages"] == 100 and c["ece"]["mass"]["n_bins"] == 10
    for key in ("auc_ci", "brier_ci"):
        lo, hi = c[key]
        assert lo < hi
    lo, hi = c["ece"]["mass"]["ci"]
    assert lo < hi and lo >= 0
    assert c["auc"] > 0.7 and c["auc_ci"][0] < c["auc"] < c["auc_ci"][1]
    # a score squashed towards 0.5 keeps its AUC and loses calibration
    sq = 0.5 + 0.2 * (p - 0.5)
    c2 = calibration_card(y, sq, groups, np.random.default_rng(1), 300, n_bins=10)
    assert c2["auc"] == pytest.approx(c["auc"])
    assert c2["ece"]["mass"]["value"] > c["ece"]["mass"]["value"] + 0.1
    assert len(c["reliability"]["mass"]) == 10 and sum(r["n"] for r in
                                                        c["reliability"]["mass"]) == n


def test_card_without_resamples_on_one_passage():
    c = calibration_card(Y, P, ["a"] * 4, np.random.default_rng(0), 100, n_bins=2)
    assert c["auc_ci"] is None and c["ece"]["mass"]["ci"] is None
    assert c["ece"]["mass"]["value"] == pytest.approx(0.15)
