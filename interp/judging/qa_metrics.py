"""Official QA metrics: SQuAD v2.0 and DROP exact match and F1, exactly as their scripts compute.

* :func:`normalize_answer`, :func:`squad_em`, :func:`squad_f1`: the official SQuAD v2.0
  evaluate script (``evaluate-v2.0.py``), used for SQuAD 2.0, HotpotQA and MuSiQue (the HotpotQA
  and MuSiQue official scripts use the same normalisation and token F1).
* :func:`drop_em_f1`: the official DROP evaluate script (allennlp ``drop_eval.py``).

These functions reproduce the official scripts, including what they get wrong for a grader:
SQuAD's normalisation strips punctuation before comparing, so "1.0" equals "10" and "3.14"
equals "314"; DROP's strips it from tokens that are not floats, so "0,1" equals "01". They are
kept as the scripts are (they are what published EM/F1 numbers mean). The correctness label of
the rule oracle does not use them for numbers: it parses numbers before punctuation is stripped
(:class:`interp.judging.grading.RuleOracle`).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Any

__all__ = [
    "GOLD_SPAN_SEP",
    "drop_em_f1",
    "normalize_answer",
    "split_spans",
    "squad_em",
    "squad_f1",
]

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)

# --------------------------------------------------------------------------------------------
# SQuAD v2.0 (official evaluate-v2.0.py)
# --------------------------------------------------------------------------------------------


def normalize_answer(s: str) -> str:
    """Normalise an answer string exactly as the official SQuAD v2.0 evaluate script does.

    Lower-cases, removes every ``string.punctuation`` character, removes the articles
    ``a``/``an``/``the`` (whole words) and collapses whitespace. Kept exactly as the official
    script, so numbers lose their decimal point and separators: "1.0" -> "10", "3.14" -> "314",
    "1,000" -> "1000" (the rule oracle's label parses numbers first; see
    :class:`interp.judging.grading.RuleOracle`).

    Args:
        s: Any answer string.

    Returns:
        The normalised string (possibly empty).

    Source:
        ``normalize_answer`` of the official SQuAD v2.0 evaluate script (``evaluate-v2.0.py``).
    """
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _squad_golds(golds: Sequence[str]) -> list[str]:
    # Official get_raw_scores: keep golds that normalise to non-empty; none left -> [""].
    kept = [g for g in golds if normalize_answer(g)]
    return kept or [""]


def _squad_f1_one(pred: str, gold: str) -> float:
    pred_toks, gold_toks = normalize_answer(pred).split(), normalize_answer(gold).split()
    if not pred_toks or not gold_toks:
        return float(pred_toks == gold_toks)
    same = sum((Counter(pred_toks) & Counter(gold_toks)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_toks), same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def squad_em(pred: str, golds: Sequence[str]) -> float:
    """Exact match, maximised over the gold answers (official SQuAD v2.0 semantics).

    Args:
        pred: The predicted answer string ("" means "no answer").
        golds: Gold answer strings. Golds that normalise to "" are dropped; an empty list (an
            unanswerable SQuAD 2.0 question) is scored against the no-answer string "", so the
            score is 1.0 iff ``normalize_answer(pred)`` is empty, else 0.0.

    Returns:
        1.0 or 0.0. Exactly the official value, including its number blind spot
        (``squad_em("1.0", ["10"]) == 1.0``).

    Source:
        ``compute_exact`` and ``get_raw_scores`` of the official SQuAD v2.0 evaluate script.
    """
    p = normalize_answer(pred)
    return float(any(p == normalize_answer(g) for g in _squad_golds(golds)))


def squad_f1(pred: str, golds: Sequence[str]) -> float:
    """Token F1 (multiset overlap of normalised tokens), maximised over the gold answers.

    Args:
        pred: The predicted answer string ("" means "no answer").
        golds: Gold answer strings; an empty list means unanswerable (see :func:`squad_em`):
            F1 is 1.0 iff the normalised prediction is empty, else 0.0. If exactly one of
            prediction and gold is empty after normalisation the F1 is 0.0.

    Returns:
        F1 in [0, 1], exactly the official value (numbers normalised as in
        :func:`normalize_answer`).

    Source:
        ``compute_f1`` and ``get_raw_scores`` of the official SQuAD v2.0 evaluate script.
    """
    return max(_squad_f1_one(pred, g) for g in _squad_golds(golds))


# --------------------------------------------------------------------------------------------
# DROP (official allennlp drop_eval.py)
# --------------------------------------------------------------------------------------------

GOLD_SPAN_SEP = ", "
"""Separator that joins the spans of a multi-span DROP gold in our records (``answers``)."""

_PRED_SPAN_SPLIT = re.compile(r"\s*(?:,\s+(?:and\s+)?|;\s*|\s+(?:and|&)\s+)\s*", re.IGNORECASE)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _drop_normalize(text: str) -> str:
    # Official _normalize_answer: per token (split on " " and "-"): lower, strip punctuation
    # unless the token parses as a float, canonicalise floats, drop articles, fix whitespace.
    parts = []
    for tok in re.split(" |-", text):
        tok = tok.lower()
        if not _is_number(tok):
            tok = "".join(ch for ch in tok if ch not in _PUNCT)
        if _is_number(tok):
            tok = str(float(tok))
        parts.append(" ".join(_ARTICLES.sub(" ", tok).split()))
    return " ".join(p for p in parts if p.strip()).strip()


def _answer_to_bags(spans: Sequence[str]) -> tuple[list[str], list[set[str]]]:
    normalized = [_drop_normalize(s) for s in spans]
    return normalized, [set(s.split()) for s in normalized]


def _bag_f1(pred: set[str], gold: set[str]) -> float:
    inter = len(gold & pred)
    precision = inter / len(pred) if pred else 1.0
    recall = inter / len(gold) if gold else 1.0
    return 0.0 if precision == recall == 0.0 else 2 * precision * recall / (precision + recall)


def _match_numbers_if_present(gold: set[str], pred: set[str]) -> bool:
    gold_nums = {w for w in gold if _is_number(w)}
    return not gold_nums or bool(gold_nums & {w for w in pred if _is_number(w)})


def _align_bags(pred: list[set[str]], gold: list[set[str]]) -> Any:
    import numpy as np  # numpy and scipy load with the first DROP score, not with the module
    from scipy.optimize import linear_sum_assignment

    scores = np.zeros((len(gold), len(pred)))
    for i, g in enumerate(gold):
        for j, p in enumerate(pred):
            if _match_numbers_if_present(g, p):
                scores[i, j] = _bag_f1(p, g)
    rows, cols = linear_sum_assignment(-scores)
    best = np.zeros(max(len(gold), len(pred)))
    for r, c in zip(rows, cols):
        best[r] = max(best[r], scores[r, c])
    return best


def _drop_get_metrics(pred: Sequence[str], gold: Sequence[str]) -> tuple[float, float]:
    pred_spans, pred_bags = _answer_to_bags(pred)
    gold_spans, gold_bags = _answer_to_bags(gold)
    em = float(set(pred_spans) == set(gold_spans) and len(pred_spans) == len(gold_spans))
    aligned = _align_bags(pred_bags, gold_bags)
    return em, round(float(aligned.mean()), 2)


def split_spans(text: str) -> list[str]:
    """Split a free-text prediction into answer spans (for multi-span DROP questions).

    Separators: ``", "`` (optionally followed by "and"), ``";"``, and the words "and" / "&"
    surrounded by spaces. A comma without a following space is kept, so "1,000" is one span.
    "or" is *not* a separator (a hedge such as "Bengals or Cowboys" must not earn full credit).

    Args:
        text: The prediction.

    Returns:
        Non-empty, stripped spans in order; ``[text.strip()]`` when there is no separator.
    """
    return [s for s in (p.strip() for p in _PRED_SPAN_SPLIT.split(text.strip())) if s] or [""]


def _drop_gold_list(golds: Sequence[str | Sequence[str]], multi_span: bool) -> list[list[str]]:
    out = []
    for g in golds:
        if isinstance(g, str):
            out.append(g.split(GOLD_SPAN_SEP) if multi_span else [g])
        else:
            out.append(list(g))
    return out


def drop_em_f1(
    pred: str | Sequence[str],
    golds: Sequence[str | Sequence[str]],
    *,
    multi_span: bool = False,
) -> tuple[float, float]:
    """Official DROP exact match and F1, maximised over the gold answers.

    Normalisation is DROP's (SQuAD's, per token split on spaces and hyphens, plus number
    canonicalisation: "2,206" -> "2206.0", "3.0" and "3" -> "3.0"). Each answer is a list of
    spans turned into bags of tokens; EM needs the same set and number of normalised spans;
    F1 aligns predicted and gold bags one-to-one (Hungarian matching via
    ``scipy.optimize.linear_sum_assignment``), a pair scores 0 when the gold bag has numbers
    and none of them is in the predicted bag, and the per-gold-bag F1s are averaged (over
    ``max(#gold, #pred)`` bags) and rounded to 2 decimals.

    Span splitting (our records store each gold as one string):

    * A gold given as a sequence of strings is used as its span list, as in the official
      script. A gold given as a string is one span, unless ``multi_span=True``, in which case it
      is split on :data:`GOLD_SPAN_SEP` (``", "``, how our records join multi-span golds). Do not
      set ``multi_span`` for single-span questions: a span such as "Motul, Yucatan" would split.
    * A prediction given as a sequence is used as its span list. A string prediction is split
      with :func:`split_spans` only when compared with a gold that has more than one span;
      against a single-span gold it stays one span (so "Motul, Yucatan" is not broken up).

    Args:
        pred: Predicted answer string or list of predicted spans.
        golds: Gold answers, each a string or a sequence of spans.
        multi_span: Split string golds on ``", "``.

    Returns:
        ``(em, f1)``, each the maximum over the golds. Golds whose first span is blank are
        skipped (as in the official script); with no usable gold the result is ``(0.0, 0.0)``.
        Exactly the official values, including its number blind spot: a token that is not a
        float loses its punctuation first, so ``drop_em_f1("0,1", ["01"]) == (1.0, 1.0)`` (the
        rule oracle's label parses numbers first; see :class:`interp.judging.grading.RuleOracle`).

    Source:
        Official DROP evaluate script (allennlp ``drop_eval.py``: ``_normalize_answer``,
        ``_answer_to_bags``, ``_align_bags``, ``_match_numbers_if_present``, ``get_metrics``,
        and the max over candidate answers in ``evaluate_json``).
    """
    best_em = best_f1 = 0.0
    for gold in _drop_gold_list(golds, multi_span):
        if not gold or not gold[0].strip():
            continue
        if isinstance(pred, str):
            spans = split_spans(pred) if len(gold) > 1 else [pred]
        else:
            spans = list(pred)
        em, f1 = _drop_get_metrics(spans, gold)
        best_em, best_f1 = max(best_em, em), max(best_f1, f1)
    return best_em, best_f1
