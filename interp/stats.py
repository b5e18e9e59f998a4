"""Statistics shared by the studies: bootstrap CIs, Wilson, McNemar, ROC AUC, metrics, folds.

Every function takes arrays (or records) and returns plain numbers, lists and dicts, so the
same computation serves Study 1 (GA, EA, Delta), Study 2 (span-mass means and the context
ratio), the probes (cross-validated metrics) and patching (correlations).

* Percentile bootstrap over examples (Efron & Tibshirani 1993, ch. 13): draw ``n_boot``
  resamples of the ``n`` examples with replacement (:func:`resample_indices`, one
  ``rng.integers(0, n, (n_boot, n))`` call, so a seeded generator gives the same resamples
  everywhere), compute the statistic on each, and report the 2.5th and 97.5th percentiles
  (:func:`percentile_ci`). Paired statistics (Delta = EA - GA; the gen/eval context ratio) are
  computed on the SAME resample for both parts.
* Passage-cluster bootstrap (:func:`cluster_bootstrap_ratio`, :func:`cluster_bootstrap_mean`):
  questions that share a passage are not independent, so whole passages are resampled with
  replacement (Field & Welsh 2007, "Bootstrapping clustered data"); a statistic that is a
  ratio of sums (a mean is sums over counts) is recomputed from the drawn clusters' sums.
* Wilson score interval of a binomial proportion (Wilson 1927), via
  ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``.
* McNemar's exact test of two classifiers on the same examples: ``b`` = only the first right,
  ``c`` = only the second right, p = two-sided exact binomial test of ``b`` in ``b + c`` at 1/2.
* ROC AUC as the Mann-Whitney U statistic with average ranks for ties (equal to the area under
  the ROC curve; ``sklearn.metrics.roc_auc_score`` computes the same number).
* Stratified (group) k-fold splits (scikit-learn ``StratifiedKFold`` / ``StratifiedGroupKFold``)
  with one group per passage: questions that share a passage are not independent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from jaxtyping import Bool, Float, Int
from scipy.stats import binomtest, pearsonr, rankdata, spearmanr
from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

from interp.errors import ProbeError

__all__ = [
    "binary_metrics",
    "bootstrap_mean",
    "cluster_bootstrap_mean",
    "cluster_bootstrap_ratio",
    "correlations",
    "fold_summary",
    "make_folds",
    "mcnemar",
    "passage_groups",
    "percentile_ci",
    "resample_indices",
    "roc_auc",
    "wilson_ci",
]

Array = np.ndarray


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


def bootstrap_mean(x: Float[Array, " n"], rng: np.random.Generator,
                   n_boot: int) -> dict[str, Any]:
    """Mean of ``x`` with its percentile-bootstrap 95% CI.

    Returns:
        ``{"mean", "ci"}``: ``mean`` None for an empty ``x``; ``ci`` None for fewer than two
        values or ``n_boot <= 0`` (no resampling is drawn then).
    """
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return {"mean": None, "ci": None}
    if x.size == 1 or n_boot <= 0:
        return {"mean": float(x.mean()), "ci": None}
    b = x[resample_indices(x.size, n_boot, rng)].mean(axis=1)
    return {"mean": float(x.mean()), "ci": percentile_ci(b)}


def cluster_bootstrap_ratio(num: Float[Array, " n"], den: Float[Array, " n"],
                            groups: Sequence[Any], rng: np.random.Generator, n_boot: int,
                            level: float = 0.95) -> dict[str, Any]:
    """``sum(num) / sum(den)`` with a passage-cluster percentile bootstrap CI.

    Args:
        num: per-item numerators (non-finite items, in ``num`` or ``den``, are dropped).
        den: per-item denominators.
        groups: per-item cluster ids (e.g. :func:`passage_groups`).
        rng: the generator (advances by one :func:`resample_indices` call).
        n_boot: resamples of the clusters.
        level: CI level.

    Returns:
        ``{"value", "ci", "n", "n_clusters"}``: ``value`` None when ``sum(den)`` is 0 or no
        item is left; ``ci`` None with fewer than two clusters or ``n_boot <= 0``; resamples
        whose ``sum(den)`` is 0 are left out of the interval.
    """
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    ok = np.isfinite(num) & np.isfinite(den)
    g = np.asarray([str(x) for x in groups], dtype=object)[ok]
    num, den = num[ok], den[ok]
    if not len(num) or den.sum() == 0:
        return {"value": None, "ci": None, "n": int(len(num)), "n_clusters": len(set(g))}
    keys, inv = np.unique(g, return_inverse=True)
    sn = np.bincount(inv, weights=num, minlength=len(keys))
    sd = np.bincount(inv, weights=den, minlength=len(keys))
    out = {"value": float(num.sum() / den.sum()), "ci": None, "n": int(len(num)),
           "n_clusters": int(len(keys))}
    if len(keys) >= 2 and n_boot > 0:
        idx = resample_indices(len(keys), n_boot, rng)
        d = sd[idx].sum(1)
        keep = d != 0
        if keep.any():
            out["ci"] = percentile_ci(sn[idx].sum(1)[keep] / d[keep], level)
    return out


def cluster_bootstrap_mean(x: Float[Array, " n"], groups: Sequence[Any],
                           rng: np.random.Generator, n_boot: int,
                           level: float = 0.95) -> dict[str, Any]:
    """Mean of ``x`` with a passage-cluster bootstrap CI (:func:`cluster_bootstrap_ratio`).

    Returns:
        ``{"mean", "ci", "n", "n_clusters"}`` (``mean`` None for no finite value).
    """
    x = np.asarray(x, dtype=np.float64)
    r = cluster_bootstrap_ratio(x, np.where(np.isfinite(x), 1.0, np.nan), groups, rng, n_boot,
                                level)
    return {"mean": r["value"], "ci": r["ci"], "n": r["n"], "n_clusters": r["n_clusters"]}


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


def fold_summary(per_fold: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """Mean and standard deviation (``{key}_std``) of each metric over folds (None skipped)."""
    out: dict[str, Any] = {}
    for m in keys:
        vals = [f[m] for f in per_fold if f.get(m) is not None]
        out[m] = float(np.mean(vals)) if vals else None
        out[f"{m}_std"] = float(np.std(vals)) if vals else None
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
        ProbeError: fewer than ``folds`` examples (with groups: groups) of a class; the
            message gives the counts.
    """
    y = np.asarray(y, bool)
    n_c, n_i = int(y.sum()), int((~y).sum())
    unit = "examples"
    if groups is not None:
        g = np.asarray(groups)
        if len(g) != len(y):
            raise ProbeError(f"groups has {len(g)} entries for {len(y)} labels")
        n_c, n_i = len(set(g[y].tolist())), len(set(g[~y].tolist()))
        unit = "groups (passages)"
    if min(n_c, n_i) < folds:
        raise ProbeError(
            f"too few {unit} of a class for {folds}-fold cross-validation of {what}: "
            f"y*=Correct {n_c}, y*=Incorrect {n_i} (each needs >= {folds}); use fewer --folds "
            f"or more records (`interp asymmetry --limit`)")
    if groups is None:
        skf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
        return [(tr, te) for tr, te in skf.split(np.zeros(len(y)), y)]
    sgkf = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
    return [(tr, te) for tr, te in sgkf.split(np.zeros(len(y)), y, groups)]


def passage_groups(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """One group id per record: its dataset plus a hash of its context (the passage)."""
    return [f"{r.get('dataset')}:"
            f"{hashlib.sha1(str(r.get('context', '')).encode()).hexdigest()[:12]}"
            for r in records]


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
