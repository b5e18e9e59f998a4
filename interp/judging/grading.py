"""Answer grading: correctness oracles, their agreement, and the grading vocabulary in one place.

Everything the GA (generation accuracy) and EA (evaluation accuracy) harness needs to turn raw
model text into labels. This module holds the oracles; it re-exports the official metrics and
the text parsers so that ``from interp.judging.grading import X`` is the one import for grading:

* :mod:`interp.judging.qa_metrics`: :func:`normalize_answer`, :func:`squad_em`, :func:`squad_f1`,
  :func:`drop_em_f1`, :func:`split_spans` (the official SQuAD v2.0 and DROP scripts, unchanged).
* :mod:`interp.judging.parsing`: :func:`extract_answer`, :func:`parse_verdict`,
:func:`is_abstention`,
  :func:`negated_at` (deterministic readers of model text).
* Here: :class:`BaseOracle`, :class:`RuleOracle`, :class:`ModelOracle`, :class:`OracleResult`
  (ground-truth correctness of a generated answer; the paper used an LLM oracle,
  :class:`RuleOracle` is the deterministic one, its rule stated in its docstring and its steps
  in :mod:`interp.judging.oracle_rules`, with :func:`oracle_tokens`, the normalisation that parses
  numbers first). Their agreement (Cohen's kappa, the confusion table) is
  :mod:`interp.methods.agreement`.
* The oracle spec (``rule``, ``model:SPEC``, ``openai:MODEL``), parsed here and nowhere else:
  :func:`parse_oracle_spec` checks one without loading anything, :func:`make_oracle` builds
  the oracle, and :data:`ORACLE_KINDS` maps each kind to its builder (register one more kind
  there, and every command and config accepts it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from interp.core.errors import ConfigError, GradingError
from interp.judging.oracle_rules import (
    FUNCTION_WORDS,
    HEDGE_TOKENS,
    MAX_CANDIDATE_TOKENS,
    Context,
    arithmetic_results,
    best_window_f1,
    competing,
    contains_at,
    gold_negated,
    hedges,
    oracle_tokens,
    other_option_first,
    restates_question,
    token_f1,
    tokenize,
    yes_no,
)
from interp.judging.parsing import (
    ABSTENTION_PATTERNS,
    extract_answer,
    is_abstention,
    negated_at,
    parse_verdict,
    strip_reasoning,
)
from interp.judging.qa_metrics import (
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
    "ORACLE_KINDS",
    "BaseOracle",
    "ModelOracle",
    "OracleResult",
    "OracleSpec",
    "RuleOracle",
    "drop_em_f1",
    "extract_answer",
    "is_abstention",
    "make_oracle",
    "negated_at",
    "oracle_builder",
    "normalize_answer",
    "oracle_tokens",
    "parse_oracle_spec",
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

    def rule_first(self, prediction: str, answers: Sequence[str], *, dataset: str,
                   answerable: bool = True, extras: Mapping | None = None,
                   ) -> tuple[OracleResult, list[dict[str, str]] | None]:
        """The rule grade, and the LLM grading prompt when the rule does not decide alone.

        The LLM oracles (:class:`ModelOracle`, :class:`interp.endpoints.oracle.EndpointOracle`)
        grade unanswerable questions (or ones without gold) by the rule oracle (abstention is
        correct; the caller counts it as ``rule``) and keep the rule's EM/F1 on the others;
        those are sent the grading prompt (:data:`ORACLE_SYSTEM`, :data:`ORACLE_USER`, filled
        from ``extras``' ``context`` and ``question``).

        Args:
            prediction: the extracted answer, as :meth:`grade`.
            answers: gold answer strings (``[]`` when unanswerable).
            dataset: the dataset name, as :meth:`grade`.
            answerable: False for unanswerable questions.
            extras: record fields; ``context`` and ``question`` fill the grading prompt.

        Returns:
            ``(ruled, messages)``: the :class:`RuleOracle` grade and the chat messages
            (system, user) of the grading prompt; ``messages`` is None when the rule decides.
        """
        ruled = RuleOracle().grade(prediction, answers, dataset=dataset,
                                   answerable=answerable, extras=extras)
        if not answerable or not answers:
            return ruled, None
        extras = extras or {}
        user = ORACLE_USER.format(context=extras.get("context", ""),
                                  question=extras.get("question", ""),
                                  gold=" | ".join(answers), prediction=prediction)
        return ruled, [{"role": "system", "content": ORACLE_SYSTEM},
                       {"role": "user", "content": user}]


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
       compares these tokens. A worked sum that holds counts as its result
       (:func:`interp.judging.oracle_rules.arithmetic_results`: "14,506 + 6,000 = 20,506" is
       "20,506"). The reported ``em``/``f1`` stay the official SQuAD / DROP values.
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
          "It is not 1850". "Paris, not Lyon" is not negated, nor is "32.9%" in "voters who
          did not vote was 32.9%" (a relative clause's negation ends at its main verb).
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
          what type of measure?", and neither does the shorter echo "communication
          complexity": a gold mention inside a run of question words is no evidence for any
          answer, :func:`interp.judging.oracle_rules.restates_question`), while "... represented
          Texas Tech University" matches for
          "The 1974 Texas Tech Raiders ... represented what university ...?").
       h. **Match**: token F1 >= :data:`SQUAD_F1_THRESHOLD` (0.6; DROP: DROP F1 >=
          :data:`DROP_F1_THRESHOLD`, 0.8) -> correct ("f1"); for single-span golds also the
          gold occurring as a contiguous token sequence of the prediction ("contained"), or a
          span of the prediction of about the gold's length
          (:func:`interp.judging.oracle_rules.best_window_f1`) reaching that F1 ("f1_span": "The
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
        pred = arithmetic_results(pred)
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
        # a gold phrase the question itself contains is evidence only when the question offers
        # it as a choice ("Todd Heap or Derrick Mason?"), not when the answer echoes it
        echo = not telling and bool(contains_at(ctx.q_toks, g_toks))
        mention_counts = not echo or choice
        if not mention_counts and restates_question(p_toks, g_toks, ctx.q_toks):
            return "question_words"
        if f1 >= thr:
            return "f1"
        if not multi and mention_counts and contains_at(p_toks, g_toks):
            return "contained"
        if not multi and mention_counts and best_window_f1(p_toks, g_toks) >= thr:
            return "f1_span"
        return "question_words" if not mention_counts else "no_match"


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
    ``p_correct > 0.5`` (:func:`interp.judging.verdict.score_verdicts` on the grading prompt). The
    result's ``rule`` says which happened: ``model:reply:<reply>`` or
    ``model:forced_choice(p_correct=0.731):<reply>``, and :attr:`counts` counts both. EM/F1 are
    the official metrics, reported alongside. Unanswerable questions are graded by the rule
    oracle (abstention is correct; counted as ``rule``).

    Args:
        handle: an :class:`interp.models.loading.ModelHandle` (the oracle model L*).
        max_new_tokens: reply cap.

    Attributes:
        counts: ``{"reply": k, "forced_choice": k, "rule": k}`` over this oracle's grades.
    """

    name = "model"

    def __init__(self, handle, max_new_tokens: int = 8):
        self.handle, self.max_new_tokens = handle, max_new_tokens
        self.name = f"model:{handle.spec}"
        self._replies = None
        self.counts = {"reply": 0, "forced_choice": 0, "rule": 0}

    def grade(self, prediction, answers, *, dataset, answerable=True, extras=None):
        """Grade with the oracle model (see the class docstring).

        ``extras`` must carry the record's ``context`` and ``question``.
        """
        from interp.judging.generation import generate
        from interp.judging.verdict import score_verdicts, verdict_replies

        ruled, msgs = self.rule_first(prediction, answers, dataset=dataset,
                                      answerable=answerable, extras=extras)
        if msgs is None:
            self.counts["rule"] += 1
            return ruled
        tok = self.handle.tokenizer
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
                            rule=f"model:{how}:{(strip_reasoning(g.text) or '').strip()[:40]}")


# --------------------------------------------------------------------------------------------
# The oracle spec: ``rule`` | ``model:SPEC`` | any kind registered in ORACLE_KINDS
# --------------------------------------------------------------------------------------------


class OracleSpec(NamedTuple):
    """A parsed oracle spec: ``kind`` (``rule``, ``model``) and its argument (``""`` for rule).

    ``str()`` gives the spec back (``model:SPEC``).
    """

    kind: str
    arg: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.arg}" if self.arg else self.kind


class OracleBuilder(Protocol):
    """Builds the oracle of one kind from the spec's argument (:data:`ORACLE_KINDS`)."""

    def __call__(self, arg: str, *, device: str | None, dtype: str | None,
                 handle: Any | None, run_model: Any | None, **context: Any) -> BaseOracle:
        """The oracle (arguments as :func:`make_oracle`; ``context`` for kinds that use it)."""


def _rule_oracle(arg: str, **_: Any) -> BaseOracle:
    return RuleOracle()


def _model_oracle(arg: str, *, device: str | None, dtype: str | None, handle: Any | None,
                  run_model: Any | None, **_: Any) -> BaseOracle:
    if handle is None and run_model is not None and arg == run_model.spec:
        handle = run_model
    if handle is None:
        from interp.models.loading import load_model

        handle = load_model(arg, device=device, dtype=dtype)
    return ModelOracle(handle)


ORACLE_KINDS: dict[str, tuple[bool, OracleBuilder | str]] = {
    "rule": (False, _rule_oracle),
    "model": (True, _model_oracle),
    "openai": (True, "interp.endpoints.oracle:endpoint_oracle"),
}
"""Oracle kind -> (whether it takes ``:ARG``, its builder). One entry per accepted kind, all
declared here: a builder that lives in a higher room is named ``"module:object"`` and imported
on first use (:func:`oracle_builder`, as lm-eval's registry names its tasks), so every kind is
known to :func:`parse_oracle_spec` without importing its module, and no module writes into
this table when it is imported. ``openai`` (``openai:MODEL``): a served model
(:mod:`interp.endpoints.oracle`)."""


def oracle_builder(kind: str) -> OracleBuilder:
    """The builder of one oracle kind, importing its module on first use.

    Args:
        kind: a key of :data:`ORACLE_KINDS`.

    Returns:
        The builder (a ``"module:object"`` entry is resolved once and stored back).

    Raises:
        ConfigError: an unknown kind, or a declared builder that does not import.
    """
    if kind not in ORACLE_KINDS:
        raise ConfigError(f"unknown oracle kind {kind!r}: use one of {sorted(ORACLE_KINDS)}")
    takes_arg, builder = ORACLE_KINDS[kind]
    if isinstance(builder, str):
        import importlib

        module, _, name = builder.partition(":")
        try:
            builder = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"oracle kind {kind!r}: its builder {ORACLE_KINDS[kind][1]!r} "
                              f"does not import ({type(e).__name__}: {e}); reinstall interp"
                              ) from e
        ORACLE_KINDS[kind] = (takes_arg, builder)
    return builder


def parse_oracle_spec(spec: str, *, kinds: Sequence[str] | None = None,
                      what: str = "oracle") -> OracleSpec:
    """Parse and check an oracle spec (``rule`` or ``model:SPEC``) without loading anything.

    Args:
        spec: the spec as written on the command line or in a config.
        kinds: the kinds allowed here (default: every kind of :data:`ORACLE_KINDS`).
        what: the option's name, for the message.

    Returns:
        The :class:`OracleSpec`.

    Raises:
        ConfigError: an unknown kind, a kind not allowed here, or a missing or extra argument
            (the message lists the accepted forms).
    """
    allowed = list(kinds) if kinds is not None else list(ORACLE_KINDS)
    kind, sep, arg = str(spec).partition(":")
    takes_arg = ORACLE_KINDS.get(kind, (None,))[0]
    if kind not in allowed or takes_arg is None or bool(arg) != takes_arg or (sep and not arg):
        forms = " or ".join(f"'{k}:SPEC'" if ORACLE_KINDS[k][0] else f"'{k}'" for k in allowed)
        if kind in allowed and takes_arg and not arg:
            raise ConfigError(f"{what} {spec!r} names no model: write '{kind}:SPEC' "
                              f"(e.g. '{kind}:{'gpt-4o-mini' if kind == 'openai' else 'qwen'}')")
        raise ConfigError(f"unknown {what} {spec!r}: use {forms}")
    return OracleSpec(kind, arg)


def make_oracle(spec: str, *, device: str | None = None, dtype: str | None = None,
                handle: Any | None = None, run_model: Any | None = None,
                **context: Any) -> BaseOracle:
    """The oracle named by ``spec`` (:func:`parse_oracle_spec`).

    Args:
        spec: ``"rule"`` or ``"model:SPEC"`` (SPEC: any :func:`interp.models.loading.load_model`
            spec).
        device: where to load an LLM oracle.
        dtype: its precision (default by device, :func:`interp.models.loading.load_model`).
        handle: an already loaded model to grade with instead of loading SPEC.
        run_model: the run's model; used when SPEC names it (``model:<its spec>``), so the
            oracle is not loaded a second time (every stage that grades passes it; the
            transfer study does not, its base model takes adapters).
        **context: what a kind's builder may use besides (``openai``: ``run``, the run
            directory whose request cache it uses; ``endpoint``, its table; ``served``,
            endpoints already open by spec).

    Raises:
        ConfigError: an unknown spec (:func:`parse_oracle_spec`).
    """
    kind, arg = parse_oracle_spec(spec)
    return oracle_builder(kind)(arg, device=device, dtype=dtype, handle=handle,
                                run_model=run_model, **context)
