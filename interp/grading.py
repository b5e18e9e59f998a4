"""Answer grading: official SQuAD v2.0 / DROP metrics, answer extraction, verdicts, oracles.

Everything the GA (generation accuracy) and EA (evaluation accuracy) harness needs to turn raw
model text into labels:

* :func:`normalize_answer`, :func:`squad_em`, :func:`squad_f1`: the official SQuAD v2.0
  evaluate script (``evaluate-v2.0.py``), used for SQuAD 2.0, HotpotQA and MuSiQue (the HotpotQA
  and MuSiQue official scripts use the same normalisation and token F1).
* :func:`drop_em_f1`: the official DROP evaluate script (allennlp ``drop_eval.py``).
* :func:`extract_answer`, :func:`parse_verdict`, :func:`is_abstention`: deterministic parsers of
  greedy generations and judge replies.
* :class:`BaseOracle`, :class:`RuleOracle`, :class:`OracleResult`: ground-truth correctness of a
  generated answer (the paper used an LLM oracle; :class:`RuleOracle` is the deterministic one).
"""

from __future__ import annotations

import re
import string
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

__all__ = [
    "ABSTENTION_PATTERNS",
    "DATASETS",
    "DROP_F1_THRESHOLD",
    "GOLD_SPAN_SEP",
    "HEDGE_TOKENS",
    "MAX_EXTRA_TOKENS",
    "SQUAD_F1_THRESHOLD",
    "BaseOracle",
    "ModelOracle",
    "OracleResult",
    "RuleOracle",
    "drop_em_f1",
    "extract_answer",
    "is_abstention",
    "normalize_answer",
    "parse_verdict",
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
    ``a``/``an``/``the`` (whole words) and collapses whitespace.

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
        1.0 or 0.0.

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
        F1 in [0, 1].

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


def _align_bags(pred: list[set[str]], gold: list[set[str]]) -> np.ndarray:
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
    return em, round(float(np.mean(_align_bags(pred_bags, gold_bags))), 2)


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


# --------------------------------------------------------------------------------------------
# Parsers of model text
# --------------------------------------------------------------------------------------------

_ANSWER_PREFIX = re.compile(
    r"^\s*(?:\*\*)?(?:(?:the\s+)?(?:final\s+|correct\s+|short\s+)?answer"
    r"(?:\s+to\s+(?:this|the|your)\s+question)?\s*(?:is\s*(?:that\b)?\s*:?|:)"
    r"|(?:ans|a)\s*:)(?:\*\*)?\s*",
    re.IGNORECASE,
)
_WRAPPERS = (("**", "**"), ('"', '"'), ("'", "'"), ("\u201c", "\u201d"), ("\u2018", "\u2019"),
             ("`", "`"))
_ABBREV = re.compile(r"(?:[A-Za-z]{1,3}\.){2,}$")


def _unwrap(s: str) -> str:
    for left, right in _WRAPPERS:
        if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
            inner = s[len(left):-len(right)]
            if right not in inner:
                return inner.strip()
    return s


def extract_answer(text: str) -> str:
    """Turn a raw greedy generation into the answer string.

    Steps, in order: strip whitespace; repeatedly drop a leading answer prefix ("Answer:",
    "A:", "Ans:", "The answer is", "The final answer is:", also wrapped in ``**``); cut at the
    first newline (the generation stop rule); unwrap one pair of surrounding quotes, backticks
    or ``**``; drop ONE trailing sentence period; unwrap once more (for ``"Paris".``).

    The period is kept only when the last token is an abbreviation made of dotted letters
    ("U.S.", "D.C.", "e.g."); numbers keep their inner dots and commas ("3.5", "$1,000.50")
    and lose only a sentence-final period ("1939." -> "1939").

    Args:
        text: The raw generation.

    Returns:
        The extracted answer (may be empty).

    Source:
        Project rule (no official counterpart); the newline stop matches the generation stop.
    """
    s = text.strip()
    while (m := _ANSWER_PREFIX.match(s)) and m.end() > 0:
        s = s[m.end():].lstrip()
    s = _unwrap(s.split("\n", 1)[0].strip())
    if s.endswith(".") and not s.endswith("..") and not _ABBREV.search(s.split()[-1]):
        s = s[:-1].rstrip()
    return _unwrap(s)


_VERDICT = re.compile(
    r"(?P<pair>\b(?:in)?correct\s*(?:or|/|\|)\s*(?:not\s+)?(?:in)?correct\b)"
    r"|(?P<neg>(?:\bnot|n['\u2019]t)\s+)?\b(?P<inc>in)?correct\b",
    re.IGNORECASE,
)


_ATTRIBUTIVE = re.compile(r"\s+(?:answer|response|option|choice|one|reply)\b", re.IGNORECASE)


def parse_verdict(text: str) -> bool | None:
    """Parse a judge reply into a verdict.

    Rule: scan the text left to right for verdict words ``correct`` / ``incorrect`` (whole
    words, any case, markdown such as ``**Correct**`` is fine). Alternative pairs such as
    "Correct or Incorrect" or "correct/incorrect" (a prompt echo) are skipped. The first
    remaining word decides: "correct" -> True, "incorrect" -> False; a preceding "not" or "n't"
    flips it ("Not correct", "isn't correct" -> False). Later words are ignored, so
    "Incorrect. The correct answer is X" is False. "the correct answer/response/option" is a
    noun phrase, not a verdict, and is skipped ("The correct answer is: X" alone -> None). "Yes"/"No", "right"/"wrong" and other words
    are NOT verdicts (the judge prompt asks for exactly "Correct" or "Incorrect").

    Args:
        text: The judge's raw reply.

    Returns:
        True (Correct), False (Incorrect) or None (no unambiguous verdict word, e.g. "",
        "Yes", "Correct or Incorrect").

    Source:
        Project rule (no official counterpart).
    """
    for m in _VERDICT.finditer(text):
        if m.group("pair") or (_ATTRIBUTIVE.match(text, m.end())
                               and text[:m.start()].rstrip().lower().endswith("the")):
            continue
        return bool(m.group("neg")) == bool(m.group("inc"))
    return None


_NEED = r"(?:information|context|details?|data|evidence)"
ABSTENTION_PATTERNS: tuple[str, ...] = (
    rf"\bi (?:would |will )?need more {_NEED}\b",
    rf"\bmore {_NEED} (?:is |would be )?(?:needed|required)\b",
    rf"\b(?:not enough|insufficient) {_NEED}\b",
    r"\b(?:cannot|can ?not|can't|could not|couldn't) (?:be )?"
    r"(?:determined?|answered|answer|inferred|infer|found|tell|say|know)\b",
    r"\b(?:impossible|unable|not possible) to (?:determine|answer|tell|say|know|infer)\b",
    r"\bnot (?:explicitly |directly |specifically |clearly )?"
    r"(?:mentioned|stated|specified|provided|given|included|answerable|known)\b",
    r"\bunanswerable\b",
    r"\bi (?:do not|don't|dont) know\b",
    r"\bno (?:relevant |such |clear )?(?:answer|information|mention|indication|way to)\b",
    r"\b(?:context|passage|text|document|article|paragraph|source|information)s? "
    r"(?:provided |given |above )?(?:does|do|did)(?: not|n't)\b",
    r"\b(?:is|are|was|were|remains?) (?:unknown|unclear|not clear)\b",
    r"\bi(?: am|'m) (?:sorry|not sure|unable)\b",
    r"^\W*(?:unknown|none|n/?a|not applicable)\W*$",
)
"""Regexes (searched case-insensitively, curly apostrophes folded to ``'``) that mark a refusal
or abstention: "I need more information", "cannot be determined", "not mentioned in the
context", "unanswerable", "I don't know", "no answer", "not enough information", "the context
does not ...", "it is unknown", and whole answers "unknown"/"none"/"N/A"."""

_ABSTENTION_RE = re.compile("|".join(f"(?:{p})" for p in ABSTENTION_PATTERNS), re.IGNORECASE)


def is_abstention(text: str) -> bool:
    """Whether a generation refuses or abstains instead of answering.

    Used to score SQuAD 2.0 unanswerable questions (abstaining is the correct answer) and to
    drop refusals when mining hard negatives.

    Args:
        text: A raw generation or an extracted answer.

    Returns:
        True iff any of :data:`ABSTENTION_PATTERNS` matches.

    Source:
        Project rule (no official counterpart).
    """
    return bool(_ABSTENTION_RE.search(text.replace("\u2019", "'")))


# --------------------------------------------------------------------------------------------
# Oracles
# --------------------------------------------------------------------------------------------

DATASETS = ("squad_v2", "squad", "drop", "hotpotqa", "musique")
SQUAD_F1_THRESHOLD = 0.6
"""Minimum SQuAD token F1 for partial credit (SQuAD 2.0, HotpotQA, MuSiQue)."""
DROP_F1_THRESHOLD = 0.8
"""Minimum official DROP F1 for partial credit."""
MAX_EXTRA_TOKENS = 10
"""Most tokens a prediction may add around a gold answer it contains."""
HEDGE_TOKENS = frozenset({"or", "either"})
"""Normalised words that mark a hedge between candidates unless the gold contains them."""
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True)
class OracleResult:
    """Ground-truth grade of one generated answer.

    Attributes:
        label: Whether the answer counts as correct.
        em: Official exact match (SQuAD or DROP), max over golds.
        f1: Official F1 (SQuAD or DROP), max over golds.
        rule: Which rule decided the label (e.g. "em", "f1", "contained", "abstained").
    """

    label: bool
    em: float
    f1: float
    rule: str


class BaseOracle(ABC):
    """Interface of a correctness oracle (the rule oracle here, an LLM oracle elsewhere)."""

    name: str = "base"

    @abstractmethod
    def grade(
        self,
        prediction: str,
        answers: Sequence[str],
        *,
        dataset: str,
        answerable: bool = True,
        extras: Mapping | None = None,
    ) -> OracleResult:
        """Grade one prediction.

        Args:
            prediction: The extracted answer (see :func:`extract_answer`).
            answers: Gold answer strings (``[]`` for an unanswerable question).
            dataset: One of :data:`DATASETS`.
            answerable: False for SQuAD 2.0 unanswerable questions.
            extras: Further record fields the oracle may use (question, context, DROP spans).

        Returns:
            An :class:`OracleResult`.
        """


def _num_tokens(tokens: Sequence[str]) -> set[str]:
    return {t for t in tokens if _NUMBER.fullmatch(t)}


def _contains(pred: Sequence[str], gold: Sequence[str]) -> bool:
    n = len(gold)
    return n > 0 and any(list(pred[i:i + n]) == list(gold) for i in range(len(pred) - n + 1))


class RuleOracle(BaseOracle):
    """Deterministic, conservative correctness oracle.

    The paper labels generations with an LLM oracle; this rule oracle is meant to agree with it
    on clear cases and to err towards "incorrect" on verbose or hedged answers, so that listing
    several candidates never earns credit. The rule (the prediction should be the output of
    :func:`extract_answer`):

    1. Unanswerable (``answerable=False`` or no gold answers): correct iff the prediction is
       empty or :func:`is_abstention` holds. Answerable: an abstaining prediction is incorrect.
       EM/F1 are the official metrics with an abstention mapped to the no-answer string "".
    2. Otherwise, per gold answer (label = any gold passes):

       a. official exact match (SQuAD EM; DROP EM for ``dataset="drop"``) -> correct;
       b. else the *guards* must hold: no hedge word ("or", "either") absent from the gold;
          no more list segments (:func:`split_spans`) than the gold has, so "Bengals, Cowboys"
          or "Paris, France" against "Bengals" / "Paris" fail (a conservative false negative for
          the latter); and, when the gold contains numbers, the prediction's set of numbers
          equals the gold's ("43 or 64", "March 1944" fail);
       c. then correct if F1 >= :data:`SQUAD_F1_THRESHOLD` (0.6; DROP: official DROP F1 >=
          :data:`DROP_F1_THRESHOLD`, 0.8), or the normalised gold occurs as a contiguous token
          sequence in the normalised prediction with at most :data:`MAX_EXTRA_TOKENS` (10)
          extra tokens (not for multi-span DROP golds, which rely on the F1 alignment).

    Thresholds: 0.6 accepts a one-token-short name ("Romo" for "Tony Romo", F1 0.67) but not a
    half-overlapping one ("Patrick Ewing" for "Patrick Crayton", F1 0.5). DROP's 0.8 demands a
    near-complete multi-span answer (2 of 3 spans, F1 0.67, fails) and number answers are
    already all-or-nothing there. Ten extra tokens allow a short sentence around the answer
    ("It was founded in 1850 by the Normans") while the precision term of F1 and the guards stop
    long, candidate-listing outputs.

    DROP extras (optional): ``gold_spans`` (list of span lists, replaces ``answers``),
    ``multi_span`` (bool), or the record field ``answer_spans`` (more than one span implies
    ``multi_span``: golds are split on ", "). Number words ("three") are not converted.
    """

    name = "rule"

    def grade(
        self,
        prediction: str,
        answers: Sequence[str],
        *,
        dataset: str,
        answerable: bool = True,
        extras: Mapping | None = None,
    ) -> OracleResult:
        """Grade one prediction with the rule in the class docstring.

        Args:
            prediction: The extracted answer.
            answers: Gold answer strings (``[]`` when unanswerable).
            dataset: One of :data:`DATASETS`.
            answerable: False for unanswerable questions.
            extras: Optional record fields (DROP: ``gold_spans``, ``multi_span``,
                ``answer_spans``).

        Returns:
            An :class:`OracleResult`.

        Raises:
            ValueError: If ``dataset`` is not one of :data:`DATASETS`.
        """
        if dataset not in DATASETS:
            raise ValueError(f"unknown dataset {dataset!r}; expected one of {DATASETS}")
        extras = extras or {}
        abstained = is_abstention(prediction)
        pred = "" if abstained else prediction
        if dataset == "drop":
            golds = [list(s) for s in extras["gold_spans"]] if "gold_spans" in extras else [
                g.split(GOLD_SPAN_SEP) if self._drop_multi(extras) else [g] for g in answers]
            golds = [g for g in golds if g and g[0].strip()]
        else:
            golds = [[g] for g in answers if normalize_answer(g)]

        if not answerable or not golds:
            ok = abstained or not normalize_answer(prediction)
            em, f1 = squad_em(pred, []), squad_f1(pred, [])
            return OracleResult(ok, em, f1, "unanswerable:" + ("abstained" if ok else "answered"))

        if dataset == "drop":
            em, f1 = drop_em_f1(pred, golds)
        else:
            em, f1 = squad_em(pred, answers), squad_f1(pred, answers)
        if abstained:
            return OracleResult(False, em, f1, "abstained")
        rules = [self._rule(pred, g, dataset) for g in golds]
        for name in ("em", "f1", "contained"):
            if name in rules:
                return OracleResult(True, em, f1, name)
        return OracleResult(False, em, f1, next((r for r in rules if r != "no_match"), "no_match"))

    @staticmethod
    def _drop_multi(extras: Mapping) -> bool:
        if "multi_span" in extras:
            return bool(extras["multi_span"])
        return len(extras.get("answer_spans") or ()) > 1

    @staticmethod
    def _rule(pred: str, gold: list[str], dataset: str) -> str:
        drop = dataset == "drop"
        if drop:
            em, f1 = drop_em_f1(pred, [gold])
            norm, thr = _drop_normalize, DROP_F1_THRESHOLD
        else:
            em, f1 = squad_em(pred, gold), squad_f1(pred, gold)
            norm, thr = normalize_answer, SQUAD_F1_THRESHOLD
        if em == 1.0:
            return "em"
        p_toks, g_toks = norm(pred).split(), norm(" ".join(gold)).split()
        hedges = HEDGE_TOKENS & set(normalize_answer(pred).split())
        if hedges - set(normalize_answer(" ".join(gold)).split()):
            return "hedge"
        if len(split_spans(pred)) > sum(len(split_spans(s)) for s in gold):
            return "list"
        g_nums = _num_tokens(g_toks)
        if g_nums and _num_tokens(p_toks) != g_nums:
            return "numbers"
        if f1 >= thr:
            return "f1"
        single = len(gold) == 1
        if single and _contains(p_toks, g_toks) and len(p_toks) - len(g_toks) <= MAX_EXTRA_TOKENS:
            return "contained"
        return "no_match"


ORACLE_SYSTEM = "You are a strict grader. You reply with exactly one word: Correct or Incorrect."
ORACLE_USER = """Context: {context}

Question: {question}

Gold answer(s): {gold}

Proposed answer: {prediction}

Does the proposed answer mean the same as one of the gold answers? Reply with exactly "Correct" or "Incorrect"."""


class ModelOracle(BaseOracle):
    """LLM oracle (paper section 3.1, ``y* = L*(c, q, a, a*)``): any loadable model grades a
    prediction against the gold answers with a grading prompt (:data:`ORACLE_USER`).

    The label is the parsed verdict of a greedy reply; when the reply is neither word, the
    probability of "Correct" vs "Incorrect" at the first reply position decides (> 0.5).
    EM/F1 are the official metrics, reported alongside. Unanswerable questions are graded by
    the rule oracle (abstention is correct).

    Args:
        handle: an :class:`interp.models.ModelHandle` (the oracle model L*).
        max_new_tokens: reply cap.
    """

    name = "model"

    def __init__(self, handle, max_new_tokens: int = 8):
        self.handle, self.max_new_tokens = handle, max_new_tokens
        self.name = f"model:{handle.spec}"
        self._rule = RuleOracle()

    def grade(self, prediction, answers, *, dataset, answerable=True, extras=None):
        """Grade with the oracle model (see the class docstring); ``extras`` must carry the
        record's ``context`` and ``question``."""
        from interp.generation import generate, verdict_scores
        from interp.prompts import verdict_token_ids

        ruled = self._rule.grade(prediction, answers, dataset=dataset, answerable=answerable,
                                 extras=extras)
        if not answerable or not answers:
            return ruled
        extras = extras or {}
        tok = self.handle.tokenizer
        user = ORACLE_USER.format(context=extras.get("context", ""),
                                  question=extras.get("question", ""),
                                  gold=" | ".join(answers), prediction=prediction)
        msgs = [{"role": "system", "content": ORACLE_SYSTEM}, {"role": "user", "content": user}]
        ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        (g,) = generate(self.handle, [list(ids)], max_new_tokens=self.max_new_tokens,
                        keep_first_logits=True)
        verdict = parse_verdict(g.text)
        if verdict is None:
            verdict = verdict_scores(g.first_logits, *verdict_token_ids(tok))[1] > 0.5
        return OracleResult(label=bool(verdict), em=ruled.em, f1=ruled.f1,
                            rule=f"model:{g.text.strip()[:40]}")
