"""Base-rate-free judging: balanced accuracy, AUC and the balanced judge set.

EA mixes judging with the base rate. A judge whose acceptance rate ``a`` does not depend on
whether the answer is right has ``EA = a * GA + (1 - a) * (1 - GA)``: its EA (and so Delta =
EA - GA) is arithmetic on GA and an acceptance rate, not judging. Two numbers that do not
depend on GA say whether a judge tells right from wrong answers:

* **balanced accuracy** = (acceptance of right answers + rejection of wrong answers) / 2, 0.5
  for any judge whose verdict ignores correctness (Brodersen et al. 2010, "The balanced
  accuracy and its posterior distribution"). A reply without a verdict is neither an
  acceptance nor a rejection, so it counts wrong on both sides, as it does in EA;
* **the AUC** of the whole-reply verdict score ``logit_diff`` against the label (the
  Mann-Whitney statistic, :func:`interp.analysis.stats.roc_auc`), 0.5 at chance.

Both are measured on two sets:

1. **the judge's own answers** (:func:`own_balanced`, part of every group of
   ``metrics.json``): the records' answers, labelled by the oracle. Free: read from the
   records. Its classes are as unbalanced as GA is, which balanced accuracy and AUC do not
   mind, but a group with one class has neither.
2. **the balanced judge set** (:func:`balanced_candidates`, :func:`balanced_metrics`): for
   each record with a gold answer, the judge also scores the gold answer (label Correct) and
   one wrong answer (label Incorrect): the closed-book hard negative mined for the record
   (:func:`interp.methods.transfer.mine_hard_negatives`, the patching stage's store
   ``patching/hard_negatives.jsonl``), else the model's own answer when the oracle graded it
   Incorrect. One right and one wrong candidate per record, on the same passage and question:
   GA = 0.5 by construction, and a record without a wrong candidate is left out and counted
   (``n_without_negative``). Opt-in (``interp metrics --balanced``): two judge passes per
   record.

Every interval is the percentile bootstrap over passages
(:class:`interp.analysis.stats.ClusterBootstrap`), the two candidates of a record in one
cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from interp.analysis.stats import MIN_PASSAGES, ClusterBootstrap, passage_groups, roc_auc
from interp.methods.pairwise import _same  # the pairwise judge's rule: one normal form

__all__ = ["BALANCED_DEFINITIONS", "NEGATIVE_SOURCES", "balanced_candidates",
           "balanced_metrics", "compute_balanced", "own_balanced"]

NEGATIVE_SOURCES = ("hard_negative", "own_wrong_answer")
"""Where a record's wrong candidate comes from, in order of preference."""

BALANCED_DEFINITIONS = {
    "balanced_accuracy": "(acceptance of right answers + rejection of wrong answers) / 2 by "
                         "the generated verdict (no verdict: wrong on both sides); 0.5 for a "
                         "judge whose verdict ignores correctness, whatever GA is",
    "balanced_accuracy_forced": "the same by the forced choice p_correct > 0.5",
    "auc_logit_diff": "ROC AUC of logit_diff against the label (right = positive)",
    "acceptance_right": "share of right answers the generated verdict accepts (TPR)",
    "acceptance_wrong": "share of wrong answers it accepts (FPR); _forced: by forced choice",
    "n_pairs": "records judged on both their gold answer and a wrong answer (balanced set)",
    "n_without_negative": "records with a gold answer but no hard negative and no wrong "
                          "answer of their own: left out of the balanced set",
    "n_without_gold": "records without a gold answer (e.g. SQuAD 2.0's unanswerable): left out",
    "one_reply": "set when the judge accepted (or rejected) every candidate: balanced "
                 "accuracy is then 0.5 by construction",
}
"""What each key of a balanced group means (copied into ``metrics.json['balanced']``)."""


def _rates(bs: ClusterBootstrap, y: np.ndarray, accepted: np.ndarray, rejected: np.ndarray,
           forced: np.ndarray) -> dict[str, Any]:
    """Acceptance of right and wrong answers and balanced accuracy, each with its cluster CI."""
    out: dict[str, Any] = {}
    for mode, acc, rej in (("", accepted, rejected), ("_forced", forced, ~forced)):
        tpr, tpr_b = bs.ratio_of_means(acc & y, y)
        fpr, fpr_b = bs.ratio_of_means(acc & ~y, ~y)
        tnr, tnr_b = bs.ratio_of_means(rej & ~y, ~y)
        out[f"acceptance_right{mode}"], out[f"acceptance_right{mode}_ci"] = tpr, bs.interval(
            tpr_b)
        out[f"acceptance_wrong{mode}"], out[f"acceptance_wrong{mode}_ci"] = fpr, bs.interval(
            fpr_b)
        ba = None if tpr is None or tnr is None else (tpr + tnr) / 2
        out[f"balanced_accuracy{mode}"] = ba
        out[f"balanced_accuracy{mode}_ci"] = None if tpr_b is None or tnr_b is None else \
            bs.interval((tpr_b + tnr_b) / 2)
    return out


def own_balanced(bs: ClusterBootstrap, y: np.ndarray, verdicts: Sequence[bool | None],
                 forced: np.ndarray) -> dict[str, Any]:
    """Balanced accuracy of the judge on its own answers (generated verdict and forced choice).

    Args:
        bs: the group's passage bootstrap (resamples shared with GA and EA).
        y: ``[n]`` the oracle's labels (True: right).
        verdicts: ``[n]`` generated verdicts (True accept, False reject, None no verdict).
        forced: ``[n]`` the forced choice (``p_correct > 0.5``).

    Returns:
        ``balanced_accuracy`` and ``balanced_accuracy_forced`` with their ``_ci``; None (and
        no interval) when the group has one class.
    """
    accepted = np.array([v is True for v in verdicts])
    rejected = np.array([v is False for v in verdicts])
    r = _rates(bs, np.asarray(y, bool), accepted, rejected, np.asarray(forced, bool))
    return {k: r[k] for k in ("balanced_accuracy", "balanced_accuracy_ci",
                              "balanced_accuracy_forced", "balanced_accuracy_forced_ci")}


def balanced_candidates(records: Sequence[Mapping[str, Any]],
                        negatives: Mapping[tuple[str, str], str]
                        ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The balanced judge set: each record's gold answer and one wrong answer.

    Args:
        records: ``ok`` records (``dataset``, ``id``, ``answers``, ``answer``,
            ``oracle_label`` and the example's fields).
        negatives: ``(dataset, id) -> hard negative`` (a closed-book answer the oracle graded
            Incorrect; the patching stage's ``hard_negatives.jsonl``).

    Returns:
        ``(candidates, counts)``: two dicts per kept record, copies of the record with
        ``answer`` set to the candidate, ``oracle_label`` to its label (gold True, wrong
        False), ``balanced_role`` (``gold`` / ``wrong``) and ``negative_source`` (one of
        :data:`NEGATIVE_SOURCES`); ``counts`` has ``n_pairs``, ``n_without_gold``,
        ``n_without_negative`` and ``n_negative_same_as_gold`` (a wrong candidate that reads
        as the gold one).
    """
    out: list[dict[str, Any]] = []
    counts = {"n_pairs": 0, "n_without_gold": 0, "n_without_negative": 0,
              "n_negative_same_as_gold": 0}
    for rec in records:
        gold = next((a.strip() for a in rec.get("answers") or [] if a and a.strip()), None)
        if gold is None:
            counts["n_without_gold"] += 1
            continue
        wrong, source = negatives.get((rec["dataset"], str(rec["id"]))), "hard_negative"
        if not wrong and rec.get("oracle_label") is False and (rec.get("answer") or "").strip():
            wrong, source = rec["answer"].strip(), "own_wrong_answer"
        if not wrong:
            counts["n_without_negative"] += 1
            continue
        if _same(gold, wrong):
            counts["n_negative_same_as_gold"] += 1
            continue
        base = {k: v for k, v in rec.items() if k not in ("verdict", "logit_diff", "p_correct")}
        for role, cand in (("gold", gold), ("wrong", wrong.strip())):
            out.append({**base, "answer": cand, "oracle_label": role == "gold",
                        "balanced_role": role, "negative_source": source})
        counts["n_pairs"] += 1
    return out, counts


def balanced_metrics(records: Sequence[Mapping[str, Any]], *, n_boot: int = 2000,
                     seed: int = 0) -> dict[str, Any]:
    """Balanced accuracy, acceptance of right and wrong answers and AUC of one judged group.

    Args:
        records: judged candidates (:func:`balanced_candidates` after a judge pass): each
            with ``oracle_label`` (the candidate's label), ``verdict`` (True / False / None),
            ``p_correct``, ``logit_diff`` and the example's ``dataset`` and ``context``.
        n_boot: passage resamples.
        seed: bootstrap seed.

    Returns:
        :data:`BALANCED_DEFINITIONS`' keys with ``_ci`` intervals, ``n`` (candidates),
        ``n_passages``, ``few_passages``, ``no_verdict_share`` and ``one_reply`` (None or why);
        ``{"n": 0, "n_passages": 0}`` for no records.
    """
    n = len(records)
    if n == 0:
        return {"n": 0, "n_passages": 0}
    y = np.array([bool(r["oracle_label"]) for r in records])
    v = [r.get("verdict") for r in records]
    accepted = np.array([x is True for x in v])
    rejected = np.array([x is False for x in v])
    scored = all(r.get("logit_diff") is not None for r in records)
    ld = np.array([float(r["logit_diff"]) if scored else 0.0 for r in records])
    forced = np.array([float(r["p_correct"]) > 0.5 if scored else False for r in records])
    bs = ClusterBootstrap(passage_groups(records), n_boot, np.random.default_rng(seed))
    auc = roc_auc(y, ld) if scored else None
    one = None
    if accepted.all() or rejected.all():
        one = (f"the judge {'accepts' if accepted.all() else 'rejects'} all {n} candidates: "
               f"balanced accuracy is 0.5 by construction")
    out = {"n": n, "n_right": int(y.sum()), "n_wrong": int((~y).sum()),
           "n_passages": bs.n_clusters, "few_passages": bs.n_clusters < MIN_PASSAGES,
           **_rates(bs, y, accepted, rejected, forced),
           "auc_logit_diff": auc,
           "auc_logit_diff_ci": None if auc is None else bs.interval(bs.aucs(y, ld)),
           "no_verdict_share": float(np.mean([x is None for x in v])),
           "one_reply": one}
    if not scored:
        out.update({k: None for k in out if "forced" in k})
    return out


def compute_balanced(records: Sequence[Mapping[str, Any]], counts: Mapping[str, Any] | None = None,
                     *, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """:func:`balanced_metrics` per dataset and overall, with the set's counts.

    Args:
        records: judged candidates of every dataset (``status`` ``ok`` only are used).
        counts: :func:`balanced_candidates`' counts per dataset (``{dataset: counts}``).
        n_boot: passage resamples.
        seed: bootstrap seed.

    Returns:
        ``{"per_dataset": {name: group}, "overall": group, "counts": ..., "definitions":
        BALANCED_DEFINITIONS}``.
    """
    ok = [r for r in records if r.get("status", "ok") == "ok"]
    datasets = sorted({r["dataset"] for r in ok} | set(counts or {}))
    return {"per_dataset": {d: balanced_metrics([r for r in ok if r["dataset"] == d],
                                                n_boot=n_boot, seed=seed) for d in datasets},
            "overall": balanced_metrics(ok, n_boot=n_boot, seed=seed),
            "counts": dict(counts or {}), "definitions": BALANCED_DEFINITIONS}
