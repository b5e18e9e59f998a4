"""Agreement between two correctness oracles: Cohen's kappa, raw agreement, the confusion table.

The rule oracle is meant to agree with careful hand grading and with an LLM oracle; these
functions measure how far it does on a run's records (``interp oracle-agreement``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from interp.core.errors import GradingError
from interp.judging.grading import BaseOracle

__all__ = ["label_agreement", "oracle_agreement"]


def label_agreement(labels_a: Sequence[bool], labels_b: Sequence[bool],
                    items: Sequence[Mapping[str, Any]] | None = None,
                    max_examples: int = 5) -> dict[str, Any]:
    """Cohen's kappa, raw agreement and the confusion table of two binary labelings.

    Args:
        labels_a: First rater's labels (True = correct), one per item.
        labels_b: Second rater's labels, same length.
        items: Optional description of each item (a dict), copied into ``disagreements``.
        max_examples: How many disagreements to list (in item order).

    Returns:
        ``{"n", "agreement" (share of equal labels), "kappa" (Cohen's kappa,
        ``sklearn.metrics.cohen_kappa_score``; NaN when both raters give one and the same
        label to every item, where kappa is 0/0), "kappa_note" (why it is NaN, else None),
        "confusion" ({"a_correct_b_correct", "a_correct_b_incorrect", "a_incorrect_b_correct",
        "a_incorrect_b_incorrect"}: counts), "n_disagreements", "disagreements" (up to
        ``max_examples`` entries: ``{"index", "a", "b", **item}``)}``.

    Raises:
        GradingError: If the lists are empty or of different lengths.

    Source:
        J. Cohen, "A coefficient of agreement for nominal scales", Educational and
        Psychological Measurement 20(1), 1960: kappa = (p_o - p_e) / (1 - p_e).
    """
    from sklearn.metrics import cohen_kappa_score

    a, b = [bool(x) for x in labels_a], [bool(x) for x in labels_b]
    if not a or len(a) != len(b):
        raise GradingError(f"need two equally long, non-empty label lists, got {len(a)} and "
                           f"{len(b)}")
    conf = Counter((x, y) for x, y in zip(a, b))
    word = {True: "correct", False: "incorrect"}
    confusion = {f"a_{word[x]}_b_{word[y]}": conf[(x, y)]
                 for x in (True, False) for y in (True, False)}
    degenerate = len(set(a)) == 1 and set(a) == set(b)
    kappa = math.nan if degenerate else float(cohen_kappa_score(a, b))
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    return {
        "n": len(a),
        "agreement": (len(a) - len(diff)) / len(a),
        "kappa": kappa,
        "kappa_note": ("undefined: both raters give every item the same label"
                       if degenerate else None),
        "confusion": confusion,
        "n_disagreements": len(diff),
        "disagreements": [{"index": i, "a": a[i], "b": b[i], **(dict(items[i]) if items else {})}
                          for i in diff[:max_examples]],
    }


def oracle_agreement(records: Iterable[Mapping[str, Any]], oracle_a: BaseOracle,
                     oracle_b: BaseOracle, *, max_examples: int = 5) -> dict[str, Any]:
    """Agreement of two oracles on a run's records (Cohen's kappa and the confusion table).

    Each record with ``status`` "ok" (or no status) is graded by both oracles from its fields:
    ``answer`` (the extracted answer), ``answers``, ``dataset``, ``answerable`` (default
    True), and as extras the record's ``extras`` (if any) plus ``question`` and ``context``.

    Args:
        records: Run records (``records.jsonl`` rows) or dicts with the fields above.
        oracle_a: First oracle (e.g. :class:`interp.judging.grading.RuleOracle`).
        oracle_b: Second oracle (e.g. a :class:`interp.judging.grading.ModelOracle`).
        max_examples: How many disagreements to list.

    Returns:
        :func:`label_agreement`'s dict, plus ``"oracle_a"`` / ``"oracle_b"`` (their names);
        each disagreement carries ``id``, ``dataset``, ``question``, ``answers``, ``answer``,
        ``rule_a`` and ``rule_b``.

    Raises:
        GradingError: If no record is gradable, or a record lacks ``answer``, ``answers`` or
            ``dataset`` (the message names the record and field).
    """
    la, lb, items = [], [], []
    for n, rec in enumerate(records):
        if rec.get("status", "ok") != "ok":
            continue
        for key in ("answer", "answers", "dataset"):
            if key not in rec:
                raise GradingError(f"record {rec.get('id', n)!r} has no {key!r} field; "
                                   "oracle agreement needs graded run records")
        extras = {**(rec.get("extras") or {}), "question": rec.get("question", ""),
                  "context": rec.get("context", "")}
        kw = {"dataset": rec["dataset"], "answerable": rec.get("answerable", True),
              "extras": extras}
        ga = oracle_a.grade(rec["answer"], rec["answers"], **kw)
        gb = oracle_b.grade(rec["answer"], rec["answers"], **kw)
        la.append(ga.label)
        lb.append(gb.label)
        items.append({"id": rec.get("id", n), "dataset": rec["dataset"],
                      "question": rec.get("question", ""), "answers": list(rec["answers"]),
                      "answer": rec["answer"], "rule_a": ga.rule, "rule_b": gb.rule})
    if not la:
        raise GradingError("no gradable records (status 'ok') to compare the oracles on")
    out = label_agreement(la, lb, items, max_examples=max_examples)
    return {"oracle_a": oracle_a.name, "oracle_b": oracle_b.name, **out}
