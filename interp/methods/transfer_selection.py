"""Study 3's learning rate, chosen on held-out TRAIN records.

Step 4 of :mod:`interp.methods.transfer`.

The stage (:func:`interp.stages.transfer.select_learning_rates`) trains the adapters once
per candidate of ``lr_grid`` without ``select_holdout`` evenly spaced pool records
(:func:`holdout_split`) and scores them on those held-out TRAIN records, never on the
validation records it reports. Each adapter is scored on what it was trained for
(:data:`SELECTION_RULE`, :func:`selection_score`): LoRA-Gen by held-out GA (its own answers,
graded by the oracle); LoRA-Eval by the judge's balanced accuracy
(:func:`judge_balanced_accuracy`) on the SAME answers for every rate and adapter, each
held-out record's gold answer (y* Correct) and its hard negative (y* Incorrect), so both labels
are always there and a judge that gives one reply to every answer scores 0.5 at most;
LoRA-Both by the mean of the two. Such a one-reply judge is marked ``collapsed`` and ranked
under every judge that is not; then the highest score wins and a tie goes to the smaller
learning rate (:func:`choose_learning_rates`).

Source: balanced accuracy, Brodersen et al. 2010; a held-out split of the training data for
model selection, never the evaluation records (Hastie, Tibshirani & Friedman 2009, 7.2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from interp.core.errors import TransferError

__all__ = ["SELECTION_RULE", "choose_learning_rates", "holdout_split", "judge_balanced_accuracy",
           "selection_score"]


SELECTION_RULE = {"lora_gen": ("GA",), "lora_eval": ("judge_balanced_accuracy",),
                  "lora_both": ("GA", "judge_balanced_accuracy")}
"""What each adapter's held-out score averages (module docstring, step 4): the task it is
trained for (LoRA-Gen: generation; LoRA-Eval: judging; LoRA-Both: both, equally)."""


def holdout_split(n: int, hold: int) -> tuple[list[int], list[int]]:
    """Pool indices ``(train, held out)``: ``hold`` evenly spaced records held out.

    Evenly spaced over the pool (which lists its datasets one after another), so each dataset
    gives its share of the held-out records.

    Raises:
        TransferError: ``hold`` not in ``1..n-1``.
    """
    if not 0 < hold < n:
        raise TransferError(f"select_holdout = {hold} must be between 1 and the pool's "
                            f"{n} records less one")
    held = sorted({int((k + 0.5) * n / hold) for k in range(hold)})
    return [i for i in range(n) if i not in set(held)], held


def judge_balanced_accuracy(records: Sequence[Mapping[str, Any]]) -> float | None:
    """The judge's accuracy averaged over the two oracle labels (a missing verdict is wrong).

    ``mean(P(verdict Correct | y* Correct), P(verdict Incorrect | y* Incorrect))``: unlike EA
    it does not reward a judge for matching the base rate, and a judge that gives the same
    verdict to every answer scores at most 0.5 (Brodersen et al. 2010, balanced accuracy).

    Args:
        records: Study 1 records (``oracle_label`` bool, ``verdict`` True/False/None).

    Returns:
        The balanced accuracy in [0, 1]; None when either label is missing (a judge that
        rejects every answer would score 1 on wrong answers alone).
    """
    per = []
    for label in (True, False):
        grp = [r for r in records if bool(r["oracle_label"]) is label]
        if not grp:
            return None
        per.append(sum(r["verdict"] is label for r in grp) / len(grp))
    return sum(per) / 2


def selection_score(adapter: str, own: Sequence[Mapping[str, Any]] = (),
                    judged: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """An adapter's held-out records scored by :data:`SELECTION_RULE`.

    Args:
        adapter: ``lora_gen``, ``lora_eval`` or ``lora_both``.
        own: Study 1 records of the adapter on the held-out records (its own answers, graded
            by the oracle): ``GA`` (LoRA-Gen, LoRA-Both).
        judged: the adapter judging the held-out records' gold answers and hard negatives
            (the same answers for every rate): ``judge_balanced_accuracy`` (LoRA-Eval,
            LoRA-Both). Only ``status == "ok"`` records count in either.

    Returns:
        ``{"n_own", "GA", "n_judged", "judge_balanced_accuracy", "accept_share",
        "no_verdict_share", "collapsed", "score"}``: ``accept_share`` is the share of judged
        answers called ``Correct``; ``collapsed`` is True when the judge gave every judged
        answer the same verdict (or none), None without judged records; ``score`` the mean of
        the rule's metrics (None if one is undefined).

    Raises:
        TransferError: an unknown adapter name.
    """
    if adapter not in SELECTION_RULE:
        raise TransferError(f"no selection rule for adapter {adapter!r}; one of "
                            f"{sorted(SELECTION_RULE)}")
    own = [r for r in own if r.get("status", "ok") == "ok"]
    judged = [r for r in judged if r.get("status", "ok") == "ok"]
    n = len(judged)
    out: dict[str, Any] = {
        "n_own": len(own),
        "GA": sum(bool(r["oracle_label"]) for r in own) / len(own) if own else None,
        "n_judged": n,
        "judge_balanced_accuracy": judge_balanced_accuracy(judged),
        "accept_share": sum(r["verdict"] is True for r in judged) / n if n else None,
        "no_verdict_share": sum(r["verdict"] is None for r in judged) / n if n else None,
        "collapsed": len({r["verdict"] for r in judged}) <= 1 if n else None,
    }
    vals = [out[k] for k in SELECTION_RULE[adapter]]
    out["score"] = None if None in vals else sum(vals) / len(vals)
    return out


def choose_learning_rates(scores: Mapping[float, Mapping[str, Mapping[str, Any]]]
                          ) -> dict[str, dict[str, Any]]:
    """Each adapter's learning rate from its held-out scores (module docstring, step 4).

    A rate with a score beats one without; a judge that did not collapse beats one that did;
    then the higher score wins, and a tie goes to the smaller rate.

    Args:
        scores: ``{lr: {adapter: selection_score(...)}}``.

    Returns:
        ``{adapter: {"lr", "by"}}`` for every adapter scored at some rate, ``by`` saying how:
        ``held-out score``, or ``smallest rate: no rate could be scored`` when every score is
        None (every held-out record failed).
    """
    names = sorted({a for per in scores.values() for a in per})
    out = {}
    for a in names:
        rates = sorted(lr for lr in scores if a in scores[lr])
        best = max(rates, key=lambda lr: (scores[lr][a]["score"] is not None,
                                          scores[lr][a].get("collapsed") is not True,
                                          scores[lr][a]["score"] or 0.0, -lr))
        out[a] = {"lr": best, "by": "held-out score" if scores[best][a]["score"] is not None
                  else "smallest rate: no rate could be scored"}
    return out
