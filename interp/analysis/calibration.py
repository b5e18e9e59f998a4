"""Calibration of a confidence score: ECE, Brier score and reliability-diagram data, with CIs.

A score ``p`` in ``[0, 1]`` (a probability that the answer is right) is *calibrated* when,
among the examples given ``p``, a share ``p`` are right. Three numbers of one score against
the labels ``y`` (True = right):

* **Brier score** (Brier 1950): ``mean((p - y)^2)``; 0 is perfect, 0.25 is the constant 0.5;
  it mixes calibration and discrimination.
* **Expected calibration error** (ECE; Naeini et al. 2015, Guo et al. 2017 ``arXiv
  1706.04599``): the examples are cut into ``n_bins`` bins of ``p``; ECE = ``sum_b (n_b / n)
  |acc_b - conf_b|`` = ``sum_b |sum_{i in b} (y_i - p_i)| / n``, where ``acc_b`` is the share
  right and ``conf_b`` the mean ``p`` in bin ``b``. Two binnings (always stated with the bin
  count): ``mass`` (equal-mass, the default: examples sorted by ``p``, stable, then cut into
  ``n_bins`` runs of as equal size as possible, ``np.array_split``; Nixon et al. 2019
  ``arXiv 1904.01685`` "adaptive" ECE) and ``width`` (equal-width: bin ``min(floor(p *
  n_bins), n_bins - 1)``, Guo et al.'s). ECE is biased upward on few examples per bin (it is
  a sum of absolute values: a perfectly calibrated score on 15 examples per bin has ECE about
  ``0.8 sqrt(p(1-p)/15) ~ 0.1``); read it beside its CI and against the same bins of another
  score, never against 0.
* **ROC AUC** (:func:`interp.analysis.stats.roc_auc`): discrimination only; a monotone
  rescaling of ``p`` leaves it unchanged and moves ECE and Brier.

Intervals (:func:`calibration_card`): a passage-cluster percentile bootstrap
(:class:`interp.analysis.stats.ClusterBootstrap`); on each resample every statistic is the
weighted one (each example counted as often as its passage was drawn). The ECE's bins are
those of the full sample (fixed edges for ``width``; the full sample's bin of each example
for ``mass``), so a resample moves the counts, not the bins.

Reliability-diagram data (:func:`reliability`): per bin its range of ``p``, count, mean ``p``
(confidence), share right (accuracy) with a Wilson interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from jaxtyping import Bool, Float, Int

from interp.analysis.stats import ClusterBootstrap, roc_auc, wilson_ci

__all__ = ["BINNINGS", "bin_index", "brier", "calibration_card", "ece", "reliability"]

BINNINGS = ("mass", "width")
"""ECE binnings: equal-mass (``mass``) and equal-width (``width``) (module docstring)."""

Array = np.ndarray


def _check(y: Any, p: Any) -> tuple[Bool[Array, " n"], Float[Array, " n"]]:
    y = np.asarray(y, dtype=bool)
    p = np.asarray(p, dtype=np.float64)
    if y.shape != p.shape or y.ndim != 1:
        raise ValueError(f"y and p must be 1-D of one length, got {y.shape} and {p.shape}")
    if p.size and (not np.isfinite(p).all() or p.min() < 0 or p.max() > 1):
        raise ValueError("p must be finite probabilities in [0, 1]")
    return y, p


def bin_index(p: Float[Array, " n"], n_bins: int = 10, binning: str = "mass") -> Int[Array, " n"]:
    """The bin of every example (module docstring), ``[n]`` ints in ``0..n_bins - 1``.

    Args:
        p: ``[n]`` probabilities.
        n_bins: number of bins (``mass``: at most ``n``; fewer examples leave none empty).
        binning: ``mass`` (equal-mass, by stable rank) or ``width`` (equal-width on [0, 1]).

    Raises:
        ValueError: an unknown binning or ``n_bins < 1``.
    """
    if binning not in BINNINGS:
        raise ValueError(f"binning must be one of {BINNINGS}, not {binning!r}")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    p = np.asarray(p, dtype=np.float64)
    if binning == "width":
        return np.minimum(np.floor(p * n_bins).astype(np.int64), n_bins - 1)
    out = np.empty(len(p), dtype=np.int64)
    for b, idx in enumerate(np.array_split(np.argsort(p, kind="stable"), min(n_bins, max(len(p),
                                                                                   1)))):
        out[idx] = b
    return out


def brier(y: Bool[Array, " n"], p: Float[Array, " n"],
          weights: Float[Array, " n"] | None = None) -> float | None:
    """Brier score ``sum w (p - y)^2 / sum w`` (None for no examples).

    Raises:
        ValueError: ``y`` and ``p`` of other shapes, or ``p`` outside [0, 1].
    """
    y, p = _check(y, p)
    if not len(y):
        return None
    w = np.ones(len(y)) if weights is None else np.asarray(weights, np.float64)
    return float((w * (p - y) ** 2).sum() / w.sum())


def ece(y: Bool[Array, " n"], p: Float[Array, " n"], n_bins: int = 10, binning: str = "mass",
        weights: Float[Array, " n"] | None = None) -> float | None:
    """Expected calibration error ``sum_b |sum_{i in b} w_i (y_i - p_i)| / sum w``.

    Args:
        y: ``[n]`` labels (True = right).
        p: ``[n]`` probabilities that the example is right.
        n_bins: bins (module docstring).
        binning: ``mass`` or ``width`` (:func:`bin_index`).
        weights: ``[n]`` example weights (None: 1 each); an integer weight counts the example
            that often.

    Returns:
        The ECE in ``[0, 1]``, None for no examples.

    Raises:
        ValueError: as :func:`bin_index`, or bad ``y``/``p``.
    """
    y, p = _check(y, p)
    if not len(y):
        return None
    w = np.ones(len(y)) if weights is None else np.asarray(weights, np.float64)
    b = bin_index(p, n_bins, binning)
    gap = np.bincount(b, weights=w * (y - p), minlength=n_bins)
    return float(np.abs(gap).sum() / w.sum())


def reliability(y: Bool[Array, " n"], p: Float[Array, " n"], n_bins: int = 10,
                binning: str = "mass") -> list[dict[str, Any]]:
    """Reliability-diagram data: one row per non-empty bin, in order of ``p``.

    Returns:
        ``[{"bin", "lo", "hi" (smallest and largest p in the bin; for ``width`` the bin's
        edges), "n", "confidence" (mean p), "accuracy" (share right), "accuracy_ci" (Wilson
        95%)}]``.

    Raises:
        ValueError: as :func:`ece`.
    """
    y, p = _check(y, p)
    b = bin_index(p, n_bins, binning)
    rows = []
    for k in range(n_bins):
        m = b == k
        if not m.any():
            continue
        lo, hi = (k / n_bins, (k + 1) / n_bins) if binning == "width" else (
            float(p[m].min()), float(p[m].max()))
        rows.append({"bin": k, "lo": lo, "hi": hi, "n": int(m.sum()),
                     "confidence": float(p[m].mean()), "accuracy": float(y[m].mean()),
                     "accuracy_ci": wilson_ci(int(y[m].sum()), int(m.sum()))})
    return rows


def calibration_card(y: Bool[Array, " n"], p: Float[Array, " n"], groups: Sequence[Any],
                     rng: np.random.Generator, n_boot: int, *, n_bins: int = 10,
                     binnings: Sequence[str] = BINNINGS) -> dict[str, Any]:
    """AUROC, ECE (each binning) and Brier score of one score, with passage-cluster CIs.

    Every statistic is computed on the same resamples (module docstring), so differences
    between two cards drawn with one seed are paired only if the caller uses the same seed
    and groups.

    Args:
        y: ``[n]`` labels (True = right).
        p: ``[n]`` probabilities.
        groups: ``[n]`` passage ids (:func:`interp.analysis.stats.passage_groups`).
        rng: the generator (advances by one resample draw).
        n_boot: resamples (0: no CIs).
        n_bins: ECE bins.
        binnings: which ECEs (``mass``, ``width``).

    Returns:
        ``{"n", "n_pos", "n_passages", "mean_p", "accuracy", "auc", "auc_ci", "brier",
        "brier_ci", "ece": {binning: {"value", "ci", "n_bins"}}, "reliability": {binning:
        rows}}``; an AUC is None with one class; CIs None with fewer than two passages.

    Raises:
        ValueError: as :func:`ece`.
    """
    y, p = _check(y, p)
    bs = ClusterBootstrap([str(g) for g in groups], n_boot, rng)
    w = bs.weights
    out: dict[str, Any] = {
        "n": int(len(y)), "n_pos": int(y.sum()), "n_passages": bs.n_clusters,
        "mean_p": float(p.mean()) if len(p) else None,
        "accuracy": float(y.mean()) if len(y) else None,
        "auc": roc_auc(y, p), "auc_ci": None,
        "brier": brier(y, p), "brier_ci": None, "ece": {}, "reliability": {}}
    if w is not None:
        tot = w.sum(1)
        out["brier_ci"] = bs.interval((w * (p - y) ** 2).sum(1) / tot)
        if out["auc"] is not None:
            out["auc_ci"] = bs.interval(bs.aucs(y, p))
    for binning in binnings:
        b = bin_index(p, n_bins, binning)
        e: dict[str, Any] = {"value": ece(y, p, n_bins, binning), "ci": None, "n_bins": n_bins}
        if w is not None and len(y):
            onehot = np.zeros((len(y), n_bins))
            onehot[np.arange(len(y)), b] = 1.0
            gap = (w * (y - p)) @ onehot                                   # [n_boot, n_bins]
            e["ci"] = bs.interval(np.abs(gap).sum(1) / w.sum(1))
        out["ece"][binning] = e
        out["reliability"][binning] = reliability(y, p, n_bins, binning)
    return out
