"""Answer grading: correctness oracles, their agreement, and the grading vocabulary in one place.

Everything the GA (generation accuracy) and EA (evaluation accuracy) harness needs to turn raw
model text into labels. This module holds the oracles; it re-exports the official metrics and
the text parsers so that ``from interp.grading import X`` is the one import for grading:

* :mod:`interp.qa_metrics`: :func:`normalize_answer`, :func:`squad_em`, :func:`squad_f1`,
  :func:`drop_em_f1`, :func:`split_spans` (the official SQuAD v2.0 and DROP scripts, unchanged).
* :mod:`interp.parsing`: :func:`extract_answer`, :func:`parse_verdict`, :func:`is_abstention`,
  :func:`negated_at` (deterministic readers of model text).
* Here: :class:`BaseOracle`, :class:`RuleOracle`, :class:`ModelOracle`, :class:`OracleResult`
  (ground-truth correctness of a generated answer; the paper used an LLM oracle,
  :class:`RuleOracle` is the deterministic one, its rule stated in its docstring and its steps
  in :mod:`interp.oracle_rules`, with :func:`oracle_tokens`, the normalisation that parses
  numbers first) and :func:`oracle_agreement` / :func:`label_agreement` (Cohen's kappa and the
  confusion table between two oracles).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from interp.errors import GradingError
from interp.oracle_rules import (
    FUNCTION_WORDS,
    HEDGE_TOKENS,
    MAX_CANDIDATE_TOKENS,
    Context,
    best_window_f1,
    competing,
    contains_at,
    gold_negated,
    hedges,
    oracle_tokens,
    other_option_first,
    token_f1,
    tokenize,
    yes_no,
)
from interp.parsing import (
    ABSTENTION_PATTERNS,
    extract_answer,
    is_abstention,
    negated_at,
    parse_verdict,
)
from interp.qa_metrics import (
    GOLD_SPAN_SEP,
    drop_em_f1,
    normalize_answer,
    split_spans,
    squad_em,
    squad_f1,
)

__all__ = [
    "ABSTENTION_PATTERNS",
    "DATASETS",
    "DROP_F1_THRESHOLD",
    "GOLD_SPAN_SEP",
    "HEDGE_TOKENS",
    "MAX_CANDIDATE_TOKENS",
    "SQUAD_F1_THRESHOLD",
    "BaseOracle",
    "ModelOracle",
    "OracleResult",
    "RuleOracle",
    "drop_em_f1",
    "extract_answer",
    "is_abstention",
    "label_agreement",
    "negated_at",
    "normalize_answer",
    "oracle_agreement",
    "oracle_tokens",
    "parse_verdict",
    "split_spans",
    "squad_em",
    "squad_f1",
]

DATASETS = ("squad_v2", "squad", "drop", "hotpotqa", "musique")
"""Datasets with a known answer style. ``"drop"`` is graded with DROP's span-set rules; every
other name (these and any user dataset, e.g. a JSONL file's stem) with the extractive rules."""
SQUAD_F1_THRESHOLD = 0.6
"""Minimum token F1 (on :func:`oracle_tokens`) for partial credit (all but DROP)."""
DROP_F1_THRESHOLD = 0.8
"""Minimum DROP F1 (official alignment, on :func:`oracle_tokens` strings) for partial credit."""
# --------------------------------------------------------------------------------------------
# Oracles
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OracleResult:
    """Ground-truth grade of one generated answer.

    Attributes:
        label: Whether the answer counts as correct.
        em: Official exact match (SQuAD or DROP), max over golds.
        f1: Official F1 (SQuAD or DROP), max over golds.
        rule: Which rule decided the label (e.g. "em", "f1", "contained", "abstained",
            "negated", "list").
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
            dataset: The dataset name (``"drop"`` selects DROP's rules).
            answerable: False for SQuAD 2.0 unanswerable questions.
            extras: Further record fields the oracle may use (question, context, DROP spans).

        Returns:
            An :class:`OracleResult`.
        """


class RuleOracle(BaseOracle):
    """Deterministic correctness oracle: the gold, and nothing that competes with it, is right.

    The paper labels generations with an LLM oracle; this rule oracle is meant to agree with
    careful hand grading (measured on ``tests/data/hand_graded.jsonl``). The prediction should
    be the output of :func:`extract_answer`; ``extras`` may carry the record's ``question`` and
    ``context`` (used by steps 3e-3g) and DROP's span fields. The rule:

    1. **Unanswerable** (``answerable=False`` or no gold answers): correct iff the prediction
       is empty or an abstention (:func:`is_abstention`). On an answerable question an
       abstention is incorrect ("abstained").
    2. **Normalisation** (:func:`oracle_tokens`): numbers are parsed before punctuation is
       stripped, so "1.0" vs "10", "3.14" vs "314" and "0,1" vs "01" differ, "1.0" equals "1"
       and only true thousands groups lose their commas ("1,000" = "1000"). Everything below
       compares these tokens. The reported ``em``/``f1`` stay the official SQuAD / DROP values.
    3. Per gold answer (the label is True if any gold passes, reported with the first passing
       rule; else the first failing rule):

       a. **Exact match** of the token sequences -> correct ("em"); on DROP the official DROP
          EM over span sets, on these tokens.
       b. **Hedge**: a word of :data:`HEDGE_TOKENS` ("or", "either", "whether") or a slash
          between words that the gold does not have -> incorrect ("hedge"): "Paris or Lyon",
          "either 1850 or 1851", "Paris/Lyon". Text in parentheses is an alias, not an
          alternative ("the Central Secretariat (or Zhongshu Sheng)" passes).
       c. **Negation**: a gold mention in the scope of a negation (:func:`negated_at`: "not",
          "n't", "never", ... earlier in its clause) -> incorrect ("negated"): "Not Paris",
          "It is not 1850". "Paris, not Lyon" is not negated.
       d. **Numbers**: if the gold has numbers, the prediction's set of numbers must equal
          the gold's ("numbers"): "March 1944" vs "March 1943", "3.14" vs "314".
       e. **Competing candidates** ("list"): the prediction is split into list items
          (:func:`split_spans`: ", ", ";", "and", "&"); when it has more items than the gold
          and the item holding the gold is short (at most 3 tokens beyond the gold; otherwise
          the answer is prose, as in "...had its origins in the Kingdom of Sicily, but it was
          later influenced by ..."), another item is a competing candidate if it is
          answer-like (at most :data:`MAX_CANDIDATE_TOKENS` tokens, starting with a capital
          letter or a digit) and one of: (i) the dataset is DROP (answers are span sets:
          "Bengals, Cowboys" vs "Bengals"); (ii) an option of an "A or B" question; (iii) a
          phrase of the context that is not in the question and that the context does not
          join to the gold (with a context, "Paris, Lyon" fails; "Paris, France" passes when
          the context has "Paris, France", when "France" is in the question, or when the
          context does not mention France). Two or more answer-like items besides the gold's
          are an enumeration and fail on every dataset ("The Normans, Franks, Vikings, ...").
          Lower-case items ("1970s and later", "and so on") are never candidates. In a choice
          question ("Who was born earlier, A or B?") the option the prediction names first is
          its answer: "Caroline Wozniacki: Simone Bolelli (born ...)" and "The Battle of
          Vienna" fail for golds "Simone Bolelli" and "The Siege of Vienna" ("What happened
          first, the Siege of Vienna or the Battle of Vienna?"), "David Akers scored more
          field goals than John Potter" passes for "David Akers".
       f. **Yes/no**: for a gold "yes" or "no" and a prediction without either word, an answer
          that restates the question (at least 80% of its content words) says "yes", or "no"
          when it holds a negation or "different" ("yes_no"): "Both Cynthia Mort and George
          Archainbaud are American" is "yes".
       g. **Question words**: if the gold has words that are not in the question (function
          words aside) and the question offers no choice, the prediction must contain at
          least one of them ("question_words"): "Bielany Forest" does not match gold "Kabaty
          Forest" through "forest" (question: "What forest ...?"). A gold phrase that the
          question itself contains counts by containment (step h) only when the question
          offers a choice ("..., Todd Heap or Derrick Mason?"); otherwise only by F1 on the
          whole answer ("communication complexity is an example of a computational measure"
          does not match gold "complexity" for "Communication complexity is an example of
          what type of measure?", while "... represented Texas Tech University" matches for
          "The 1974 Texas Tech Raiders ... represented what university ...?").
       h. **Match**: token F1 >= :data:`SQUAD_F1_THRESHOLD` (0.6; DROP: DROP F1 >=
          :data:`DROP_F1_THRESHOLD`, 0.8) -> correct ("f1"); for single-span golds also the
          gold occurring as a contiguous token sequence of the prediction ("contained"), or a
          span of the prediction of about the gold's length
          (:func:`interp.oracle_rules.best_window_f1`) reaching that F1 ("f1_span": "The
          school was led by James Conant, ..." for "James Bryant Conant"); multi-span DROP
          golds rely on the F1 alignment. Otherwise "no_match".

    Thresholds: 0.6 accepts a one-token-short name ("Romo" for "Tony Romo", F1 0.67) but not a
    half-overlapping one ("Patrick Ewing" for "Patrick Crayton", F1 0.5). DROP's 0.8 demands a
    near-complete multi-span answer (2 of 3 spans, F1 0.67, fails).

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
            dataset: The dataset name; ``"drop"`` selects DROP's rules, any other name the
                extractive ones.
            answerable: False for unanswerable questions.
            extras: Optional record fields: ``question``, ``context``; DROP: ``gold_spans``,
                ``multi_span``, ``answer_spans``.

        Returns:
            An :class:`OracleResult`.

        Raises:
            GradingError: If ``dataset`` is not a non-empty string.
        """
        if not isinstance(dataset, str) or not dataset.strip():
            raise GradingError(f"dataset must be a non-empty name, got {dataset!r}")
        extras = extras or {}
        abstained = is_abstention(prediction)
        pred = "" if abstained else prediction
        drop = dataset == "drop"
        if drop:
            golds = [list(s) for s in extras["gold_spans"]] if "gold_spans" in extras else [
                g.split(GOLD_SPAN_SEP) if self._drop_multi(extras) else [g] for g in answers]
            golds = [g for g in golds if g and g[0].strip()]
        else:
            golds = [[g] for g in answers if normalize_answer(g) or oracle_tokens(g)]

        if not answerable or not golds:
            ok = abstained or not normalize_answer(prediction)
            em, f1 = squad_em(pred, []), squad_f1(pred, [])
            return OracleResult(ok, em, f1, "unanswerable:" + ("abstained" if ok else "answered"))

        if drop:
            em, f1 = drop_em_f1(pred, golds)
        else:
            em, f1 = squad_em(pred, answers), squad_f1(pred, answers)
        if abstained:
            return OracleResult(False, em, f1, "abstained")
        ctx = Context(str(extras.get("question") or ""), str(extras.get("context") or ""))
        rules = [self._rule(pred, g, drop, ctx) for g in golds]
        for name in ("em", "f1", "contained", "f1_span", "yes_no"):
            if name in rules:
                return OracleResult(True, em, f1, name)
        return OracleResult(False, em, f1, next((r for r in rules if r != "no_match"), "no_match"))

    @staticmethod
    def _drop_multi(extras: Mapping) -> bool:
        if "multi_span" in extras:
            return bool(extras["multi_span"])
        return len(extras.get("answer_spans") or ()) > 1

    @staticmethod
    def _rule(pred: str, gold: list[str], drop: bool, ctx: Context) -> str:
        """One gold answer (a list of spans): the rule's steps 3a-3h, first decision wins."""
        p = tokenize(pred)
        p_toks = [t.text for t in p]
        g_toks = [t.text for s in gold for t in tokenize(s)]
        multi = len(gold) > 1
        if drop:
            spans = [" ".join(oracle_tokens(s)) for s in (split_spans(pred) if multi else [pred])]
            em, f1 = drop_em_f1(spans, [[" ".join(oracle_tokens(s)) for s in gold]])
            thr = DROP_F1_THRESHOLD
        else:
            em, f1, thr = float(p_toks == g_toks), token_f1(p_toks, g_toks), SQUAD_F1_THRESHOLD
        if em == 1.0:
            return "em"
        if hedges(pred, gold):
            return "hedge"
        if gold_negated(pred, p, g_toks):
            return "negated"
        g_nums = {t.text for s in gold for t in tokenize(s) if t.number}
        if g_nums and {t.text for t in p if t.number} != g_nums:
            return "numbers"
        if competing(pred, gold, g_toks, drop, ctx) or other_option_first(p_toks, g_toks, ctx):
            return "list"
        polar = yes_no(pred, p_toks, g_toks, ctx)
        if polar is not None:
            return "yes_no" if polar == g_toks[0] else "no_match"
        choice = "or" in ctx.q_toks
        telling = set(g_toks) - set(ctx.q_toks) - FUNCTION_WORDS
        if telling and not choice and not telling & set(p_toks):
            return "question_words" if set(g_toks) & set(p_toks) else "no_match"
        if f1 >= thr:
            return "f1"
        # a gold phrase the question itself contains is evidence only when the question offers
        # it as a choice ("Todd Heap or Derrick Mason?"), not when the answer echoes it
        echo = not telling and bool(contains_at(ctx.q_toks, g_toks))
        mention_counts = not echo or choice
        if not multi and mention_counts and contains_at(p_toks, g_toks):
            return "contained"
        if not multi and mention_counts and best_window_f1(p_toks, g_toks) >= thr:
            return "f1_span"
        return "question_words" if not mention_counts else "no_match"


# --------------------------------------------------------------------------------------------
# Agreement between two oracles
# --------------------------------------------------------------------------------------------


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
        oracle_a: First oracle (e.g. :class:`RuleOracle`).
        oracle_b: Second oracle (e.g. a :class:`ModelOracle`).
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


# --------------------------------------------------------------------------------------------
# LLM oracle
# --------------------------------------------------------------------------------------------

ORACLE_SYSTEM = "You are a strict grader. You reply with exactly one word: Correct or Incorrect."
ORACLE_USER = """Context: {context}

Question: {question}

Gold answer(s): {gold}

Proposed answer: {prediction}

Does the proposed answer mean the same as one of the gold answers? \
Reply with exactly "Correct" or "Incorrect"."""


class ModelOracle(BaseOracle):
    """LLM oracle (paper section 3.1, ``y* = L*(c, q, a, a*)``).

    Any loadable model grades a prediction against the gold answers with a grading prompt
    (:data:`ORACLE_USER`).

    The label is the parsed verdict of a greedy reply (:func:`parse_verdict`). When the reply
    holds no verdict, the oracle model's forced choice between the two whole replies decides:
    ``p_correct > 0.5`` (:func:`interp.verdict.score_verdicts` on the grading prompt). The
    result's ``rule`` says which happened: ``model:reply:<reply>`` or
    ``model:forced_choice(p_correct=0.731):<reply>``, and :attr:`counts` counts both. EM/F1 are
    the official metrics, reported alongside. Unanswerable questions are graded by the rule
    oracle (abstention is correct; counted as ``rule``).

    Args:
        handle: an :class:`interp.models.ModelHandle` (the oracle model L*).
        max_new_tokens: reply cap.

    Attributes:
        counts: ``{"reply": k, "forced_choice": k, "rule": k}`` over this oracle's grades.
    """

    name = "model"

    def __init__(self, handle, max_new_tokens: int = 8):
        self.handle, self.max_new_tokens = handle, max_new_tokens
        self.name = f"model:{handle.spec}"
        self._rule = RuleOracle()
        self._replies = None
        self.counts = {"reply": 0, "forced_choice": 0, "rule": 0}

    def grade(self, prediction, answers, *, dataset, answerable=True, extras=None):
        """Grade with the oracle model (see the class docstring).

        ``extras`` must carry the record's ``context`` and ``question``.
        """
        from interp.generation import generate
        from interp.verdict import score_verdicts, verdict_replies

        ruled = self._rule.grade(prediction, answers, dataset=dataset, answerable=answerable,
                                 extras=extras)
        if not answerable or not answers:
            self.counts["rule"] += 1
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
        (g,) = generate(self.handle, [list(ids)], max_new_tokens=self.max_new_tokens)
        verdict, how = parse_verdict(g.text), "reply"
        if verdict is None:
            self._replies = self._replies or verdict_replies(tok)
            p = float(score_verdicts(self.handle, [list(ids)], replies=self._replies)
                      .p_correct[0])
            verdict, how = p > 0.5, f"forced_choice(p_correct={p:.3f})"
        self.counts[how.split("(")[0]] += 1
        return OracleResult(label=bool(verdict), em=ruled.em, f1=ruled.f1,
                            rule=f"model:{how}:{g.text.strip()[:40]}")
