"""Did the judge read? Attention and confidence signals of each verdict; a wrong-verdict detector.

The paper's explanation of bad judging (section 3.2) is that the judge barely reads the
context or the candidate when it gives its verdict. This module turns that into a check a user
of an LLM-as-a-judge pipeline can run on any judged records (the run-directory work is
:mod:`interp.stages.audit`; here arrays in, numbers out).

Algorithm, per ok record (one verdict) of a judged run:

1. Span masses of the verdict position (the last eval-prompt token, whose attention row
   predicts the first verdict token), ``mass[l, h, s]`` per layer, head and span, are the
   attention stage's recordings (:func:`interp.stages.attention.load_masses`,
   :func:`interp.analysis.span_mass.span_mass`): nothing is measured again here.
2. Signals (:func:`verdict_signals`): ``context_mass`` and ``candidate_mass`` = the band mean
   (band layers, all heads) of the mass on the context / the candidate, exactly the
   attention stage's band mean; ``lookback_ratio`` = the band mean of the per-head Lookback
   Lens ratio ``LR[l, h] = a_ctx / (a_ctx + a_rest)`` with ``a_ctx = mass on the context /
   context tokens`` and ``a_rest = mass on every other prompt position / their count`` (the
   MEAN attention per token on the context against the rest; Chuang et al. 2024, "Lookback
   Lens", where the rest are the generated tokens; here the verdict position has only the
   prompt before it); ``logit_diff`` = the judge's own ``log P(Correct) - log P(Incorrect)``
   (:mod:`interp.judging.verdict`) and ``logit_diff_margin = |logit_diff|`` (its confidence).
3. Target: the verdict is wrong, ``wrong = not (verdict == y*)``; an unparseable verdict
   counts as wrong, as in EA (:func:`interp.methods.asymmetry.group_metrics`).
4. How well each signal predicts a wrong verdict (:func:`signal_aucs`): ROC AUC with a stated
   orientation (:data:`ORIENTATION`: low context / candidate mass, a low Lookback ratio, a
   low margin and a HIGH logit_diff (leaning Correct: the acquiescent error) are taken to
   mean wrong; an AUC below 0.5 says the opposite), per dataset and overall, with a
   percentile bootstrap over passages (:func:`interp.analysis.stats.cluster_bootstrap_auc`).
5. Detector (:func:`detector`): class-balanced logistic regression on standardised per-head
   features (the Lookback ratio of every head of ``detector_layers`` by default,
   :func:`interp.methods.probing.fit_probe`), out-of-fold scores from ``StratifiedGroupKFold`` with
   one
   group per passage (:func:`interp.analysis.stats.make_folds`; fewer folds when a class has fewer
   passages than asked, none below 2), their AUC with its passage CI.
6. Flags at a stated false-positive rate (:func:`flag_at_fpr`): the threshold is the score
   that at most ``fpr`` of the RIGHT verdicts exceed (set on these same out-of-fold scores, so
   the stated rate holds on these records by construction; on new records it is an
   estimate); the share flagged, the wrong verdicts caught (TPR) and the achieved FPR, for
   the detector and for each signal; the flagged records as a table.

What it cannot show: a signal that predicts wrong verdicts is a correlation; whether reading
the context would have changed the verdict is the steering study's question
(:mod:`interp.methods.steering`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from jaxtyping import Bool, Float
from sklearn.metrics import roc_curve

from interp.analysis.span_mass import span_tokens
from interp.analysis.stats import (
    MIN_PASSAGES,
    cluster_bootstrap_auc,
    make_folds,
    passage_groups,
    passage_note,
)
from interp.core.errors import StageError
from interp.core.names import dataset_order
from interp.core.vocab import DETECTOR_FEATURES
from interp.methods.probing import cross_validate

__all__ = ["DEFINITIONS", "DETECTOR_FEATURES", "ORIENTATION", "SIGNALS", "detector",
           "flag_at_fpr", "head_features", "lookback_ratio", "roc_points", "signal_aucs",
           "verdict_signals", "wrong_verdicts"]

SIGNALS = ("context_mass", "candidate_mass", "lookback_ratio", "logit_diff_margin", "logit_diff")
ORIENTATION = {"context_mass": -1.0, "candidate_mass": -1.0, "lookback_ratio": -1.0,
               "logit_diff_margin": -1.0, "logit_diff": 1.0}
"""Sign applied to each signal so that a higher oriented score means "wrong" (step 4)."""

DEFINITIONS = {
    "wrong": "verdict != y* (an unparseable verdict counts as wrong, as in EA)",
    "context_mass / candidate_mass": "attention mass of the verdict position on the context / "
                                     "candidate, mean over the band's layers and all heads "
                                     "(the attention stage's band mean)",
    "lookback_ratio": "band mean over heads of a_ctx / (a_ctx + a_rest): mean attention per "
                      "context token vs per other prompt token (Lookback Lens)",
    "logit_diff": "the judge's log P(Correct) - log P(Incorrect) (nats); logit_diff_margin = "
                  "|logit_diff|",
    "orientation": "AUCs score -signal for the masses, the ratio and the margin (low = wrong) "
                   "and +logit_diff (leaning Correct = wrong); AUC < 0.5: the other way",
    "auc": "ROC AUC of the oriented signal for wrong verdicts (positives) vs right ones; ci: "
           "95% percentile bootstrap over passages; None with one class",
    "detector": "class-balanced logistic regression on standardised per-head features, "
                "out-of-fold scores of passage-grouped stratified k-fold CV",
    "flags": "threshold = the score at most fpr of the right verdicts exceed, set on these "
             "out-of-fold scores (the stated FPR holds here by construction); share_flagged = "
             "flagged / n, tpr = flagged wrong / wrong, fpr_achieved = flagged right / right",
}
"""What each number of ``audit/summary.json`` means (copied into it)."""


def wrong_verdicts(records: Sequence[Mapping[str, Any]]) -> Bool[np.ndarray, " n"]:
    """``[n]`` True where the verdict is not y* (None counts as wrong; step 3)."""
    return np.array([not (r.get("verdict") is not None and bool(r["verdict"]) ==
                          bool(r["oracle_label"])) for r in records])


def lookback_ratio(mass: Float[np.ndarray, "n layer head span"], spans: Sequence[str],
                   tokens: Float[np.ndarray, "n span"]) -> Float[np.ndarray, "n layer head"]:
    """Per-head Lookback ratio of the verdict position (module step 2).

    Args:
        mass: eval-prompt span masses ``[n, n_layers, n_heads, n_spans]`` (rows sum to 1).
        spans: span names of the last axis (``context`` among them).
        tokens: ``[n, n_spans]`` token counts of each span (:func:`interp.analysis.span_mass.
            span_tokens`; they sum to the prompt length).

    Returns:
        ``[n, n_layers, n_heads]`` in [0, 1]; 0.5 = as much attention per context token as per
        other token.
    """
    c = list(spans).index("context")
    n_ctx = np.maximum(tokens[:, c], 1)[:, None, None]
    n_rest = np.maximum(tokens.sum(1) - tokens[:, c], 1)[:, None, None]
    a_ctx = mass[..., c] / n_ctx
    a_rest = (mass.sum(-1) - mass[..., c]) / n_rest
    with np.errstate(all="ignore"):
        return np.where(a_ctx + a_rest > 0, a_ctx / (a_ctx + a_rest), 0.5)


def verdict_signals(records: Sequence[Mapping[str, Any]],
                    mass: Float[np.ndarray, "n layer head span"], spans: Sequence[str],
                    band: Sequence[int]) -> dict[str, Float[np.ndarray, " n"]]:
    """The signals of :data:`SIGNALS` per record (module step 2)."""
    band = list(band)
    idx = {s: i for i, s in enumerate(spans)}
    lr = lookback_ratio(mass, spans, span_tokens(records, "eval", spans))
    ld = np.array([float(r["logit_diff"]) for r in records])
    in_band = mass[:, band]
    return {"context_mass": in_band[..., idx["context"]].mean(axis=(1, 2)),
            "candidate_mass": in_band[..., idx["candidate"]].mean(axis=(1, 2)),
            "lookback_ratio": lr[:, band].mean(axis=(1, 2)),
            "logit_diff_margin": np.abs(ld), "logit_diff": ld}


def head_features(records: Sequence[Mapping[str, Any]],
                  mass: Float[np.ndarray, "n layer head span"], spans: Sequence[str],
                  layers: Sequence[int], features: Sequence[str]) -> Float[np.ndarray, "n f"]:
    """The detector's per-head features: ``[n, len(features) * len(layers) * n_heads]``."""
    idx = {s: i for i, s in enumerate(spans)}
    cols = []
    for f in features:
        if f == "lookback_ratio":
            x = lookback_ratio(mass, spans, span_tokens(records, "eval", spans))
        else:
            x = mass[..., idx[f]]
        cols.append(x[:, list(layers)].reshape(len(records), -1))
    return np.concatenate(cols, axis=1)


def signal_aucs(records: Sequence[Mapping[str, Any]], signals: Mapping[str, np.ndarray],
                wrong: np.ndarray, *, n_boot: int, seed: int,
                extra: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Step 4: per dataset and overall, the AUC of each oriented signal for wrong verdicts.

    Args:
        records: the records (``dataset``, ``context``).
        signals: ``{name: [n]}`` raw signals (:func:`verdict_signals`).
        wrong: ``[n]`` targets.
        n_boot: bootstrap resamples of passages.
        seed: seed of the one generator all groups draw from, in a fixed order.
        extra: already oriented scores to add (the detector's out-of-fold scores).

    Returns:
        ``{"per_dataset": {name: group}, "overall": group}``; a group has ``n``, ``n_wrong``,
        ``n_passages``, ``few_passages``, ``note`` and ``signals: {name: {auc, ci, ...}}``.
    """
    rng = np.random.default_rng(seed)
    groups = np.array(passage_groups(records), dtype=object)
    ds = np.array([r["dataset"] for r in records])
    scores = {k: ORIENTATION[k] * np.asarray(v, float) for k, v in signals.items()}
    scores.update(extra or {})

    def group(sel: np.ndarray) -> dict[str, Any]:
        n_p = len(set(groups[sel].tolist()))
        return {"n": int(sel.sum()), "n_wrong": int(wrong[sel].sum()), "n_passages": n_p,
                "few_passages": n_p < MIN_PASSAGES, "note": passage_note(n_p),
                "signals": {k: cluster_bootstrap_auc(wrong[sel], s[sel], groups[sel].tolist(),
                                                     rng, n_boot) for k, s in scores.items()}}

    return {"per_dataset": {d: group(ds == d) for d in dataset_order(ds.tolist())},
            "overall": group(np.ones(len(records), dtype=bool))}


def detector(X: Float[np.ndarray, "n f"], wrong: np.ndarray,
             records: Sequence[Mapping[str, Any]], *, folds: int, seed: int,
             C: float = 1.0) -> dict[str, Any]:
    """Step 5: out-of-fold logistic-regression scores for wrong verdicts.

    Returns:
        ``{"possible": True, "folds", "cv" (fold means of accuracy, balanced accuracy, F1 of
        "wrong", AUC), "oof" [n]}``, or ``{"possible": False, "reason"}`` when a class has
        fewer than two passages.
    """
    groups = np.array(passage_groups(records))
    k = min(folds, len(set(groups[wrong].tolist())), len(set(groups[~wrong].tolist())))
    if k < 2:
        return {"possible": False,
                "reason": f"wrong verdicts on {len(set(groups[wrong].tolist()))} passage(s), "
                          f"right ones on {len(set(groups[~wrong].tolist()))}: grouped CV "
                          f"needs >= 2 of each"}
    try:
        fl = make_folds(wrong, k, seed, groups=groups, what="verdicts")
    except StageError as err:
        return {"possible": False, "reason": str(err)}
    summary, oof = cross_validate(X, wrong, fl, "logreg", C=C, seed=seed)
    return {"possible": True, "folds": k, "n_features": int(X.shape[1]), "cv": summary,
            "oof": oof}


def flag_at_fpr(score: Float[np.ndarray, " n"], wrong: np.ndarray,
                fpr: float) -> dict[str, Any]:
    """Step 6: flag scores above the threshold that at most ``fpr`` of right verdicts exceed.

    Returns:
        ``{"fpr_target", "threshold", "flagged" [n] bool, "share_flagged", "tpr",
        "fpr_achieved", "n_flagged"}`` (``tpr`` / ``fpr_achieved`` None without that class).
    """
    score = np.asarray(score, float)
    neg = np.sort(score[~wrong])[::-1]
    k = int(np.floor(fpr * len(neg) + 1e-9))
    thr = float(neg[k]) if k < len(neg) else float(-np.inf)
    if not len(neg):
        thr = float(np.min(score)) if len(score) else 0.0
    flagged = score > thr
    return {"fpr_target": fpr, "threshold": thr, "flagged": flagged,
            "n_flagged": int(flagged.sum()), "share_flagged": float(flagged.mean()),
            "tpr": float(flagged[wrong].mean()) if wrong.any() else None,
            "fpr_achieved": float(flagged[~wrong].mean()) if (~wrong).any() else None}


def roc_points(wrong: np.ndarray, score: np.ndarray) -> dict[str, list[float] | None]:
    """``{"fpr", "tpr"}`` of the ROC curve (None with one class)."""
    if wrong.all() or not wrong.any():
        return {"fpr": None, "tpr": None}
    f, t, _ = roc_curve(wrong, score)
    return {"fpr": f.tolist(), "tpr": t.tolist()}
