"""Statistics shared by the studies: cluster bootstrap, Wilson, McNemar, ROC AUC, metrics, folds.

Every function takes arrays (or records) and returns plain numbers, lists and dicts, so the
same computation serves Study 1 (GA, EA, Delta), Study 2 (span-mass means and the context
ratios), the probes (cross-validated metrics) and patching (correlations).

* Cluster (passage) percentile bootstrap, :class:`ClusterBootstrap` (Davison & Hinkley 1997,
  section 3.8; Field & Welsh 2007): questions about one passage are not independent, so the
  resampled unit is the passage (:func:`passage_groups`: dataset + context hash), not the
  question. Algorithm: number the ``k`` clusters in order of first appearance; draw ``n_boot``
  resamples of ``k`` clusters with replacement (:func:`resample_indices`, one
  ``rng.integers(0, k, (n_boot, k))`` call, so a seeded generator gives the same resamples
  everywhere); turn each resample into example weights (how often the example's cluster was
  drawn); compute each statistic as a weighted mean (or a ratio of weighted means) on every
  resample; report the 2.5th and 97.5th percentiles (:func:`percentile_ci`; resamples where a
  ratio's denominator is 0 are left out). Paired statistics (Delta = EA - GA; the gen/eval
  context ratio) use the SAME resamples for both parts. With one example per cluster this is
  the ordinary example bootstrap (Efron & Tibshirani 1993, ch. 13). With fewer than two
  clusters no interval is given; a group on fewer than :data:`MIN_PASSAGES` passages is
  flagged (:func:`passage_note`).
  :func:`cluster_bootstrap_ratio` (a ratio of sums, e.g. a patching effect summed over pairs)
  and :func:`cluster_bootstrap_mean` are thin functions over :class:`ClusterBootstrap`.
* Wilson score interval of a binomial proportion (Wilson 1927), via
  ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``.
* McNemar's exact test of two classifiers on the same examples: ``b`` = only the first right,
  ``c`` = only the second right, p = two-sided exact binomial test of ``b`` in ``b + c`` at 1/2.
* ROC AUC as the Mann-Whitney U statistic with average ranks for ties (equal to the area under
  the ROC curve; ``sklearn.metrics.roc_auc_score`` computes the same number);
  :func:`cluster_bootstrap_auc` gives it a passage-cluster CI (the weighted statistic on each
  resample).
* Stratified (group) k-fold splits (scikit-learn ``StratifiedKFold`` / ``StratifiedGroupKFold``)
  with one group per passage: questions that share a passage are not independent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from jaxtyping import Bool, Float, Int
from scipy.stats import binomtest, pearsonr, rankdata, spearmanr
from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

from interp.core.errors import StageError
from interp.data import passage_key

__all__ = ["DEGENERATE_MARK", "MIN_FIT_CLASS", "MIN_FIT_RECORDS", "MIN_PASSAGES",
           "MIN_QUANTILE_PERMUTATIONS", "null_level",
           "ClusterBootstrap", "binary_metrics", "cluster_bootstrap_auc",
           "cluster_bootstrap_auc_difference", "cluster_bootstrap_mean",
           "cluster_bootstrap_ratio", "correlations", "fold_summary", "make_folds", "mcnemar",
           "mean_stat", "ratio_stat",
           "passage_groups", "ci_text", "degenerate_note", "fit_note", "is_degenerate",
           "merge_notes",
           "passage_note", "percentile_ci", "resample_indices", "roc_auc", "strata_indices",
           "stratified_auc", "wilson_ci"]

Array = np.ndarray

MIN_QUANTILE_PERMUTATIONS = 20
"""Fewest permutations whose null is reported as a 95th percentile. With fewer draws the 95th
percentile is an interpolation between the largest two (with 2 draws, 95% of the way from the
smaller to the larger), not a level that 5% of the null passes: :func:`null_level` gives the
largest draw instead and says so."""


def null_level(null, q95: float | None = None) -> tuple[float, str]:
    """The level of a permutation null to draw or compare with, and its words.

    Args:
        null: the null's draws (a sequence of floats; at least one).
        q95: their stored 95th percentile, if any (else computed).

    Returns:
        ``(95th percentile, "95th pct (N perms)")`` with at least
        :data:`MIN_QUANTILE_PERMUTATIONS` draws, else ``(max, "largest of N perms (too few
        for a 95th pct)")``.

    Raises:
        ValueError: no draws.
    """
    arr = np.asarray(list(null), float)
    if not arr.size:
        raise ValueError("a permutation null needs at least one draw")
    n = arr.size
    if n >= MIN_QUANTILE_PERMUTATIONS:
        return float(np.quantile(arr, 0.95) if q95 is None else q95), f"95th pct ({n} perms)"
    return float(arr.max()), f"largest of {n} perm{'s' * (n != 1)} (too few for a 95th pct)"


def resample_indices(n: int, n_boot: int, rng: np.random.Generator) -> Int[Array, "n_boot n"]:
    """Bootstrap resamples of ``n`` examples: ``n_boot`` rows of indices drawn with replacement.

    Args:
        n: number of examples.
        n_boot: number of resamples.
        rng: the generator (its state advances by one ``integers`` call).
    """
    return rng.integers(0, n, size=(n_boot, n))


def percentile_ci(samples: Float[Array, "n_boot ..."], level: float = 0.95
                  ) -> list[float] | list[Float[Array, "..."]]:
    """Percentile interval ``[lo, hi]`` of bootstrap statistics along the first axis.

    Returns:
        Two floats for 1-D ``samples``; two arrays of the trailing shape otherwise.
    """
    q = 100 * (1 - level) / 2
    lo, hi = np.percentile(samples, q, axis=0), np.percentile(samples, 100 - q, axis=0)
    if np.ndim(lo) == 0:
        return [float(lo), float(hi)]
    return [lo, hi]


MIN_PASSAGES = 10
"""A table or figure built on fewer passages than this says so (:func:`passage_note`)."""


def passage_note(n_passages: int) -> str | None:
    """The visible note of a group built on fewer than :data:`MIN_PASSAGES` passages, else None."""
    if n_passages >= MIN_PASSAGES:
        return None
    return (f"only {n_passages} passage{'s' * (n_passages != 1)} (< {MIN_PASSAGES}): questions "
            f"about one passage are not independent, so this group has few independent units")


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def merge_notes(items: Sequence[tuple[str, str]]) -> list[str]:
    """One line per fact: notes of several groups that differ only in their numbers, merged.

    ``[("drop", "only 4 passages (< 10): ..."), ("overall", "only 12 passages (< 10): ...")]``
    -> ``["drop, overall: only N passages (< 10): ... (N = 4, 12)"]``: the groups are named
    once, the numbers that differ between them are listed in the groups' order, and numbers
    they share stay in the text. A note no other group shares is ``"group: note"``.

    Args:
        items: ``(group name, note)`` pairs, in the order to print.

    Returns:
        The lines, in the order of each fact's first group.
    """
    facts: dict[str, list[tuple[str, str]]] = {}
    for name, text in items:
        facts.setdefault(_NUMBER.sub("#", text), []).append((name, text))
    out = []
    for members in facts.values():
        names = ", ".join(dict.fromkeys(n for n, _ in members))
        first = members[0][1]
        nums = [_NUMBER.findall(t) for _, t in members]
        differ = [i for i in range(len(nums[0])) if len({n[i] for n in nums}) > 1]
        if not differ:
            out.append(f"{names}: {first}")
            continue
        marks = {i: "N" if len(differ) == 1 else f"N{k + 1}" for k, i in enumerate(differ)}
        pieces = _NUMBER.split(first)
        text = pieces[0] + "".join(marks.get(i, v) + pieces[i + 1]
                                   for i, v in enumerate(nums[0]))
        listed = "; ".join(f"{marks[i]} = {', '.join(n[i] for n in nums)}" for i in differ)
        out.append(f"{names}: {text} ({listed})")
    return out


MIN_FIT_RECORDS = 20
"""A classifier scored on fewer records than this (or on fewer than :data:`MIN_FIT_CLASS` of
either class) is flagged (:func:`fit_note`): its fold scores can be 1.000 +/- 0.000 by chance."""
MIN_FIT_CLASS = 5
"""The fewest records of the rarer class for a fit that :func:`fit_note` leaves unflagged."""
DEGENERATE_MARK = "(zero width)"
"""Written after an interval whose bounds are equal (:func:`ci_text`)."""


def is_degenerate(ci: Sequence[float] | None) -> bool:
    """Whether a (lower, upper) interval has zero width: every resample gave one value.

    On a handful of clusters the bootstrap can draw the same value every time
    (``[1.00, 1.00]``); that is no evidence of precision, only of too few units.
    """
    return ci is not None and len(ci) == 2 and ci[0] is not None and ci[1] is not None \
        and math.isclose(float(ci[0]), float(ci[1]), rel_tol=0.0, abs_tol=1e-12)


def ci_text(ci: Sequence[float] | None, spec: str = ".2f", sep: str = ",") -> str:
    """An interval as shown to a person: ``[lo,hi]``, marked when degenerate, ``-`` if None.

    Args:
        ci: ``[lower, upper]`` or None.
        spec: The format spec of each bound (``"+.2f"``).
        sep: Between the bounds.

    Returns:
        ``"[0.10,0.30]"``; ``"[1.00,1.00] (zero width)"`` (:data:`DEGENERATE_MARK`) when the
        bounds are equal; ``"-"`` without an interval.
    """
    if not ci:
        return "-"
    text = f"[{ci[0]:{spec}}{sep}{ci[1]:{spec}}]"
    return f"{text} {DEGENERATE_MARK}" if is_degenerate(ci) else text


def degenerate_note(n_passages: int | None = None) -> str:
    """The note under a table or figure that shows a :data:`DEGENERATE_MARK` interval."""
    on = f" on {n_passages} passage{'s' * (n_passages != 1)}" if n_passages is not None else ""
    return (f"{DEGENERATE_MARK}: every bootstrap resample{on} gave the same value (the outcome "
            f"is the same on every record, or the group is too small); that is no evidence the "
            f"value is exact: read it with its count")


def fit_note(n_records: int, class_counts: Mapping[str, int] | None = None) -> str | None:
    """The visible note of a classifier fit on too few records, else None.

    A fit is flagged on fewer than :data:`MIN_FIT_RECORDS` records or fewer than
    :data:`MIN_FIT_CLASS` records of either class: with a few test records per fold every
    fold's AUC can be 1.000 and its spread 0.000 by chance.

    Args:
        n_records: Records the classifier was cross-validated on.
        class_counts: ``{"correct": k, "incorrect": k}`` (optional).

    Returns:
        The note, or None for a fit on enough records.
    """
    rare = min(class_counts.values()) if class_counts else None
    if n_records >= MIN_FIT_RECORDS and (rare is None or rare >= MIN_FIT_CLASS):
        return None
    classes = f", {rare} of the rarer class" if rare is not None else ""
    return (f"fit on only {n_records} records{classes} (< {MIN_FIT_RECORDS} records or < "
            f"{MIN_FIT_CLASS} per class): scores and their spread are not meaningful")


class ClusterBootstrap:
    """Percentile bootstrap over clusters, as example weights (module docstring).

    Draw once per group; every statistic of the group is then computed on the same resamples.

    Args:
        clusters: ``[n]`` hashable cluster id of each example (:func:`passage_groups`), or
            None for one cluster per example (the ordinary example bootstrap). With ids, the
            resamples do not depend on the order of the examples.
        n_boot: number of resamples (``<= 0``: no intervals).
        rng: the generator (advanced by one ``integers`` call when resamples are drawn).
        n: number of examples when ``clusters`` is None.

    Attributes:
        n: number of examples; n_clusters: number of distinct clusters.
        weights: ``[n_boot, n]`` how often each example's cluster was drawn, or None when no
            interval can be given (``n_boot <= 0`` or fewer than two clusters).

    Raises:
        ValueError: neither ``clusters`` nor ``n`` given.
    """

    def __init__(self, clusters: Sequence[Any] | None, n_boot: int, rng: np.random.Generator,
                 *, n: int | None = None) -> None:
        if clusters is None:
            if n is None:
                raise ValueError("give clusters or n")
            codes = np.arange(n)
        else:
            # clusters numbered in a sorted order, not by first appearance: the resamples (and
            # so every interval) do not depend on the order of the examples, which a resumed,
            # sharded or merged run does not keep
            index = {c: i for i, c in enumerate(sorted(set(clusters),
                                                       key=lambda c: (type(c).__name__, str(c))))}
            codes = np.array([index[c] for c in clusters], dtype=np.int64)
        self.n = len(codes)
        self.n_clusters = int(codes.max()) + 1 if self.n else 0
        self.weights: Float[Array, "n_boot n"] | None = None
        if n_boot > 0 and self.n_clusters >= 2:
            k = self.n_clusters
            draws = resample_indices(k, n_boot, rng)
            flat = (draws + k * np.arange(n_boot)[:, None]).ravel()
            counts = np.bincount(flat, minlength=n_boot * k).reshape(n_boot, k)
            self.weights = counts[:, codes].astype(np.float64)

    def means(self, x: Float[Array, "n ..."]) -> Float[Array, "n_boot ..."] | None:
        """The weighted mean of ``x`` on every resample (None without resamples)."""
        if self.weights is None:
            return None
        x = np.asarray(x, dtype=np.float64)
        tot = np.tensordot(self.weights, x, axes=(1, 0))
        return tot / self.weights.sum(1).reshape((-1,) + (1,) * (x.ndim - 1))

    def aucs(self, y: Bool[Array, " n"], score: Float[Array, " n"],
             strata: Sequence[Any] | None = None) -> Float[Array, " n_boot"] | None:
        """The ROC AUC of ``score`` against ``y`` on every resample (None without resamples).

        The weighted Mann-Whitney statistic (:func:`cluster_bootstrap_auc`); NaN on a resample
        that drew no (positive, negative) pair. With ``strata`` (e.g. the dataset of each
        example) only pairs within one stratum count: the stratified AUC, which a score that
        only knows each stratum's base rate cannot raise above 0.5.
        """
        if self.weights is None:
            return None
        num, den = _pair_sums(y, score, self.weights, strata)
        with np.errstate(all="ignore"):
            return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)

    @staticmethod
    def interval(samples: Float[Array, "n_boot ..."] | None
                 ) -> list[float] | list[Float[Array, "..."]] | None:
        """Percentile 95% interval of resampled statistics, ignoring NaN resamples.

        Returns:
            None without resamples or when every resample is NaN (a denominator always 0).
        """
        if samples is None:
            return None
        samples = np.asarray(samples, dtype=np.float64)
        if np.isnan(samples).all():
            return None
        with np.errstate(all="ignore"):
            lo = np.nanpercentile(samples, 2.5, axis=0)
            hi = np.nanpercentile(samples, 97.5, axis=0)
        return [float(lo), float(hi)] if np.ndim(lo) == 0 else [lo, hi]

    def mean(self, x: Float[Array, " n"]) -> dict[str, Any]:
        """``{"mean", "ci"}`` of ``x`` (mean None for no examples, ci as :meth:`interval`)."""
        x = np.asarray(x, dtype=np.float64)
        if x.size == 0:
            return {"mean": None, "ci": None}
        return {"mean": float(x.mean()), "ci": self.interval(self.means(x))}

    def ratio_of_means(self, a: Float[Array, " n"], b: Float[Array, " n"]
                       ) -> tuple[float | None, Float[Array, " n_boot"] | None]:
        """``mean(a) / mean(b)`` (a ratio of means) and its resampled values.

        Returns:
            ``(value, samples)``: value None when ``mean(b) == 0``; samples NaN where a
            resample's ``mean(b)`` is 0, None without resamples.
        """
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        value = float(a.mean() / b.mean()) if b.size and b.mean() != 0 else None
        ma, mb = self.means(a), self.means(b)
        if ma is None:
            return value, None
        with np.errstate(all="ignore"):
            return value, np.where(mb != 0, ma / np.where(mb != 0, mb, 1.0), np.nan)


def cluster_bootstrap_ratio(num: Float[Array, " n"], den: Float[Array, " n"],
                            groups: Sequence[Any], rng: np.random.Generator,
                            n_boot: int) -> dict[str, Any]:
    """``sum(num) / sum(den)`` with a passage-cluster percentile bootstrap 95% CI.

    The resamples are :class:`ClusterBootstrap`'s (a ratio of sums is the ratio of the two
    weighted means on each resample).

    Args:
        num: per-item numerators (non-finite items, in ``num`` or ``den``, are dropped).
        den: per-item denominators.
        groups: per-item cluster ids (e.g. :func:`passage_groups`).
        rng: the generator (advances by one :func:`resample_indices` call).
        n_boot: resamples of the clusters.

    Returns:
        ``{"value", "ci", "n", "n_clusters"}``: ``value`` None when ``sum(den)`` is 0 or no
        item is left; ``ci`` None with fewer than two clusters or ``n_boot <= 0``; resamples
        whose ``sum(den)`` is 0 are left out of the interval.
    """
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    ok = np.isfinite(num) & np.isfinite(den)
    g = [str(x) for x, keep in zip(groups, ok) if keep]
    num, den = num[ok], den[ok]
    out: dict[str, Any] = {"value": None, "ci": None, "n": int(len(num)),
                           "n_clusters": len(set(g))}
    if not len(num) or den.sum() == 0:
        return out
    value, samples = ClusterBootstrap(g, n_boot, rng).ratio_of_means(num, den)
    out.update(value=value, ci=ClusterBootstrap.interval(samples))
    return out


def cluster_bootstrap_mean(x: Float[Array, " n"], groups: Sequence[Any],
                           rng: np.random.Generator, n_boot: int) -> dict[str, Any]:
    """Mean of the finite values of ``x`` with a passage-cluster bootstrap 95% CI.

    Returns:
        ``{"mean", "ci", "n", "n_clusters"}`` (:func:`cluster_bootstrap_ratio` of ``x`` over
        ones; ``mean`` None for no finite value).
    """
    x = np.asarray(x, dtype=np.float64)
    r = cluster_bootstrap_ratio(x, np.where(np.isfinite(x), 1.0, np.nan), groups, rng, n_boot)
    return {"mean": r["value"], "ci": r["ci"], "n": r["n"], "n_clusters": r["n_clusters"]}


def mean_stat(x: Float[Array, " n"], groups: Sequence[Any], rng: np.random.Generator,
              n_boot: int) -> dict[str, Any]:
    """:func:`cluster_bootstrap_mean` as the stages' summaries write it.

    Returns:
        ``{"mean", "ci", "n", "n_passages"}``.
    """
    r = cluster_bootstrap_mean(np.asarray(x, dtype=float), list(groups), rng, n_boot)
    return {"mean": r["mean"], "ci": r["ci"], "n": r["n"], "n_passages": r["n_clusters"]}


def ratio_stat(num: Float[Array, " n"], den: Float[Array, " n"], groups: Sequence[Any],
               rng: np.random.Generator, n_boot: int) -> dict[str, Any]:
    """:func:`cluster_bootstrap_ratio` (a ratio of sums) as the stages' summaries write it.

    Returns:
        ``{"share", "ci", "n", "n_passages"}``.
    """
    r = cluster_bootstrap_ratio(np.asarray(num, dtype=float), np.asarray(den, dtype=float),
                                list(groups), rng, n_boot)
    return {"share": r["value"], "ci": r["ci"], "n": r["n"], "n_passages": r["n_clusters"]}


def cluster_bootstrap_auc(y: Bool[Array, " n"], score: Float[Array, " n"],
                          groups: Sequence[Any], rng: np.random.Generator,
                          n_boot: int, *, strata: Sequence[Any] | None = None
                          ) -> dict[str, Any]:
    """ROC AUC of ``score`` against ``y`` with a passage-cluster percentile bootstrap 95% CI.

    On each resample (:class:`ClusterBootstrap` weights ``w``) the AUC is the weighted
    Mann-Whitney statistic ``sum_{i pos, j neg} w_i w_j [s_i > s_j] (+ 1/2 on ties) /
    (sum_pos w * sum_neg w)``, which is the AUC of the resampled set (each example counted as
    often as its passage was drawn); resamples without both classes are left out.

    Args:
        y: ``[n]`` bool labels (True = positive).
        score: ``[n]`` scores (higher = positive).
        groups: ``[n]`` cluster ids (:func:`passage_groups`).
        rng: the generator (advances by one :func:`resample_indices` call).
        n_boot: resamples of the clusters.
        strata: ``[n]`` stratum of each example (e.g. its dataset), or None: with them only
            pairs within a stratum count (:func:`stratified_auc`).

    Returns:
        ``{"auc", "ci", "n", "n_pos", "n_neg", "n_clusters"}``: ``auc`` None with one class
        (with ``strata``: without a pair in one stratum), ``ci`` None then or with fewer than
        two clusters.
    """
    y = np.asarray(y, bool)
    score = np.asarray(score, np.float64)
    auc = roc_auc(y, score) if strata is None else stratified_auc(y, score, strata)
    bs = ClusterBootstrap([str(g) for g in groups], n_boot, rng)
    out: dict[str, Any] = {"auc": auc, "ci": None, "n": int(len(y)), "n_pos": int(y.sum()),
                           "n_neg": int((~y).sum()), "n_clusters": bs.n_clusters}
    if auc is None or bs.weights is None:
        return out
    out["ci"] = bs.interval(bs.aucs(y, score, strata))
    return out


def stratified_auc(y: Bool[Array, " n"], score: Float[Array, " n"],
                   strata: Sequence[Any] | None = None) -> float | None:
    """ROC AUC over the (positive, negative) pairs within one stratum (None without a pair).

    Without ``strata``, :func:`roc_auc`. With them (e.g. each example's dataset), a score
    that only knows each stratum's base rate ties every counted pair, so it scores 0.5.
    """
    if strata is None:
        return roc_auc(y, score)
    num, den = _pair_sums(y, score, np.ones((1, len(score))), strata)
    return float(num[0] / den[0]) if den[0] else None


def strata_indices(strata: Sequence[Any]) -> list[Int[Array, " k"]]:
    """The example indices of each stratum, strata in sorted order of ``str(stratum)``."""
    keys = np.asarray([str(s) for s in strata])
    return [np.flatnonzero(keys == k) for k in np.unique(keys)]


def _pair_sums(y: Bool[Array, " n"], score: Float[Array, " n"], weights: Float[Array, "b n"],
               strata: Sequence[Any] | None) -> tuple[Float[Array, " b"], Float[Array, " b"]]:
    """Weighted Mann-Whitney sums over (positive, negative) pairs within each stratum.

    Returns ``(num, den)`` per row of ``weights``: ``sum w_i w_j ([s_i > s_j] + 1/2 on ties)``
    and ``sum w_i w_j`` over the pairs (``i`` positive, ``j`` negative, one stratum); their
    ratio is the (stratified) AUC of that weighting.
    """
    y, score = np.asarray(y, bool), np.asarray(score, np.float64)
    num, den = np.zeros(weights.shape[0]), np.zeros(weights.shape[0])
    for idx in [np.arange(len(y))] if strata is None else strata_indices(strata):
        pos, neg = idx[y[idx]], idx[~y[idx]]
        cmp = (score[pos][:, None] > score[neg][None, :]) + 0.5 * (
            score[pos][:, None] == score[neg][None, :])
        wp, wn = weights[:, pos], weights[:, neg]
        num += ((wp @ cmp) * wn).sum(1)
        den += wp.sum(1) * wn.sum(1)
    return num, den


def cluster_bootstrap_auc_difference(y: Bool[Array, " n"], score_a: Float[Array, " n"],
                                     score_b: Float[Array, " n"], groups: Sequence[Any],
                                     rng: np.random.Generator, n_boot: int, *,
                                     strata: Sequence[Any] | None = None) -> dict[str, Any]:
    """Two scores' ROC AUCs on the same examples and their paired difference, with CIs.

    Both AUCs are computed on every passage-cluster resample with the SAME weights (the
    statistic of :func:`cluster_bootstrap_auc`), so the interval of ``auc_a - auc_b`` is a
    paired one: it accounts for both scores being read on the same records, which the two
    separate intervals do not.

    Args:
        y: ``[n]`` bool labels (True = positive).
        score_a: ``[n]`` first scores (higher = positive); e.g. a probe's out-of-fold scores.
        score_b: ``[n]`` second scores; e.g. the verbal judge's ``logit_diff``.
        groups: ``[n]`` cluster ids (:func:`passage_groups`).
        rng: the generator (advances by one :func:`resample_indices` call).
        n_boot: resamples of the clusters.
        strata: ``[n]`` stratum of each example (e.g. its dataset), or None: with them, both
            AUCs count only pairs within a stratum (:func:`stratified_auc`), so neither score
            gains from knowing which stratum has more positives.

    Returns:
        ``{"auc_a", "ci_a", "auc_b", "ci_b", "difference", "ci", "n", "n_pos", "n_neg",
        "n_clusters"}``: the AUCs None without a (positive, negative) pair, every ``ci`` None
        then or with fewer than two clusters.
    """
    y = np.asarray(y, bool)
    a, b = np.asarray(score_a, np.float64), np.asarray(score_b, np.float64)
    auc_a, auc_b = stratified_auc(y, a, strata), stratified_auc(y, b, strata)
    bs = ClusterBootstrap([str(g) for g in groups], n_boot, rng)
    out: dict[str, Any] = {
        "auc_a": auc_a, "ci_a": None, "auc_b": auc_b, "ci_b": None,
        "difference": None if auc_a is None or auc_b is None else auc_a - auc_b, "ci": None,
        "n": int(len(y)), "n_pos": int(y.sum()), "n_neg": int((~y).sum()),
        "n_clusters": bs.n_clusters}
    if out["difference"] is None or bs.weights is None:
        return out
    sa, sb = bs.aucs(y, a, strata), bs.aucs(y, b, strata)
    out.update(ci_a=bs.interval(sa), ci_b=bs.interval(sb), ci=bs.interval(sa - sb))
    return out


def wilson_ci(k: int, n: int, level: float = 0.95) -> list[float] | None:
    """Wilson score interval of ``k`` successes in ``n`` trials (None when ``n == 0``)."""
    if n == 0:
        return None
    ci = binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
    return [float(ci.low), float(ci.high)]


def mcnemar(a_right: Bool[Array, " n"], b_right: Bool[Array, " n"]) -> dict[str, Any]:
    """Exact McNemar test of two classifiers on the same examples.

    Returns:
        ``{"b": a right & b wrong, "c": a wrong & b right, "p_value": exact two-sided}``
        (``p_value`` 1.0 when ``b + c == 0``).
    """
    a_right, b_right = np.asarray(a_right, bool), np.asarray(b_right, bool)
    b = int(np.sum(a_right & ~b_right))
    c = int(np.sum(~a_right & b_right))
    return {"b": b, "c": c, "p_value": float(binomtest(b, b + c, 0.5).pvalue) if b + c else 1.0}


def roc_auc(y: Bool[Array, " n"], score: Float[Array, " n"]) -> float | None:
    """ROC AUC of ``score`` (higher = positive) against ``y``; None with one class in ``y``."""
    y = np.asarray(y, bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if not n_pos or not n_neg:
        return None
    r = rankdata(np.asarray(score, float))
    return float((r[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def binary_metrics(y: Bool[Array, " n"], pred: Bool[Array, " n"],
                   score: Float[Array, " n"] | None) -> dict[str, Any]:
    """Accuracy, balanced accuracy, F1 of the positive class, macro F1 and ROC AUC of one split.

    Args:
        y: truth (True = positive, here y* Correct).
        pred: predictions.
        score: scores for the AUC (higher = positive), or None.

    Returns:
        The metrics; ``balanced_accuracy`` and ``auc`` are None with one class in ``y`` (``auc``
        also without a score). Computed in numpy (sklearn's metric functions cost ~10 ms a call,
        which dominates a layer sweep); a test checks them against ``sklearn.metrics``. F1 of a
        class with no true or predicted example is 0 (sklearn's ``zero_division=0``).
    """
    y, pred = np.asarray(y, bool), np.asarray(pred, bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    two = n_pos > 0 and n_neg > 0
    tp, fp = int(np.sum(pred & y)), int(np.sum(pred & ~y))
    fn, tn = n_pos - tp, n_neg - fp

    def f1(t: int, f_p: int, f_n: int) -> float:
        return 2 * t / (2 * t + f_p + f_n) if t else 0.0

    return {
        "accuracy": (tp + tn) / len(y),
        "balanced_accuracy": (tp / n_pos + tn / n_neg) / 2 if two else None,
        "f1": f1(tp, fp, fn),
        "f1_macro": (f1(tp, fp, fn) + f1(tn, fn, fp)) / 2,
        "auc": roc_auc(y, score) if two and score is not None else None,
    }


def fold_summary(per_fold: Sequence[Mapping[str, Any]], keys: Sequence[str],
                 class_counts: Sequence[tuple[int, int]] | None = None) -> dict[str, Any]:
    """Mean and spread (``{key}_std``) of each metric over folds, and ``{key}_n_folds``.

    A fold where a metric is None (an AUC on a one-class test fold) is left out of its mean
    and listed in ``undefined_folds`` (``fold``, ``metrics``, and with ``class_counts``, the
    folds' test ``(n_correct, n_incorrect)``, its counts); ``n_folds``: all folds.
    """
    out: dict[str, Any] = {}
    for m in keys:
        vals = [f[m] for f in per_fold if f.get(m) is not None]
        out[m], out[f"{m}_std"] = (float(np.mean(vals)), float(np.std(vals))) if vals else (
            None, None)
        out[f"{m}_n_folds"] = len(vals)
    counts = [{} if class_counts is None else {"n_correct": int(a), "n_incorrect": int(b)}
              for a, b in (class_counts or [(0, 0)] * len(per_fold))]
    out["n_folds"], out["undefined_folds"] = len(per_fold), [
        {"fold": i, "metrics": miss, **counts[i]} for i, f in enumerate(per_fold)
        if (miss := [m for m in keys if f.get(m) is None])]
    return out


def make_folds(y: Bool[Array, " n"], folds: int, seed: int, *,
               groups: Sequence[Any] | None = None, what: str = "records"
               ) -> list[tuple[Int[Array, " n_train"], Int[Array, " n_test"]]]:
    """Stratified k-fold ``(train, test)`` index pairs, checked for class counts.

    With ``groups`` (e.g. one id per passage: SQuAD and DROP ask several questions about one
    passage), ``StratifiedGroupKFold`` keeps every group inside one fold, so a probe is never
    tested on a passage it was trained on; without, ``StratifiedKFold``. Both shuffle with
    ``seed``.

    Args:
        y: ``[n]`` bool labels.
        folds: number of folds.
        seed: shuffling seed.
        groups: ``[n]`` hashable group ids, or None (every example its own group).
        what: what the examples are, for the error message.

    Raises:
        StageError: fewer than ``folds`` examples (with groups: groups) of a class; the
            message gives the counts.
    """
    y = np.asarray(y, bool)
    n_c, n_i = int(y.sum()), int((~y).sum())
    unit = "examples"
    if groups is not None:
        g = np.asarray(groups)
        if len(g) != len(y):
            raise StageError("probe", f"groups has {len(g)} entries for {len(y)} labels")
        n_c, n_i = len(set(g[y].tolist())), len(set(g[~y].tolist()))
        unit = "groups (passages)"
    if min(n_c, n_i) < folds:
        raise StageError(
            "probe", f"too few {unit} of a class for {folds}-fold cross-validation of {what}: "
            f"y*=Correct {n_c}, y*=Incorrect {n_i} (each needs >= {folds}"
            + ("); use fewer --folds (2 is the fewest) or add records" if folds > 2 else
               f", and {folds} is the fewest folds); add records")
            + " (`interp asymmetry --limit`)")
    if groups is None:
        skf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
        return [(tr, te) for tr, te in skf.split(np.zeros(len(y)), y)]
    sgkf = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
    return [(tr, te) for tr, te in sgkf.split(np.zeros(len(y)), y, groups)]


def passage_groups(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """One group id per record: its passage (:func:`interp.data.passage_key`)."""
    return [passage_key(r) for r in records]


def correlations(a: Float[Array, " n"], b: Float[Array, " n"]) -> dict[str, float | None]:
    """Pearson and Spearman correlation of the finite pairs of ``a`` and ``b``.

    Returns:
        ``{"pearson", "spearman", "n"}``; both correlations None with fewer than 3 finite pairs
        or a constant side (the correlation is undefined there, not 0).
    """
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return {"pearson": None, "spearman": None, "n": int(len(a))}
    return {"pearson": float(pearsonr(a, b)[0]), "spearman": float(spearmanr(a, b)[0]),
            "n": int(len(a))}
