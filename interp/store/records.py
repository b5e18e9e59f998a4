"""The QA record: one line of ``records.jsonl``, its typed schema and its identity.

A QA record is the row the harness writes per example
(:func:`interp.methods.asymmetry.evaluate_examples`)
and every study reads; not to be confused with a recording of ``interp record``
(:mod:`interp.store.recordings`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Required, TypedDict

from interp.core.errors import ConfigError, RunDirError


class PromptSummary(TypedDict):
    """``prompts.gen`` / ``prompts.eval`` of a record (``RenderedPrompt.to_record()``).

    Attributes:
        n_tokens: length of the rendered prompt in tokens.
        token_spans: span name (``context``, ``question``, ``candidate``, ``reference``) ->
            ``[start, end)`` token range.
    """

    n_tokens: int
    token_spans: dict[str, list[int]]


class OracleResult(TypedDict):
    """``oracle`` of a record: which oracle graded the answer and how.

    Attributes:
        name: ``rule`` or ``model:SPEC``.
        em: exact match with the best gold answer (0 or 1).
        f1: token F1 with the best gold answer.
        rule: the rule that decided the label (``interp.judging.grading``).
    """

    name: str
    em: float
    f1: float
    rule: str


class Record(TypedDict, total=False):
    """One line of ``records.jsonl``: the contract between the harness and every analysis.

    Written by :func:`interp.methods.asymmetry.evaluate_examples` (plus ``template`` by the
    asymmetry
    stage); read by the attention, patching, probe and transfer studies. A ``skipped`` record
    has the example fields and ``reason`` only.

    Attributes:
        id, dataset, split, question, context, answers, answerable: the example.
        extras: the data file's other fields of the example (:attr:`interp.data.QAExample.extras`;
            absent when it has none).
        status: ``ok``, ``skipped`` or ``no_answer`` (:data:`NO_ANSWER`); reason: why it was
            skipped, or that the model generated no answer.
        model: the model spec that judged (and, without ``answer_source``, generated);
            template: the template variant.
        answer_source: ``{"model", "run"}`` that generated the answer, when the model judged
            another run's answers (:mod:`interp.methods.cross_judge`); absent: its own.
        generation: the raw generated text; answer: the extracted answer (the candidate the
            judge saw).
        oracle_label: y* (True = Correct); oracle: how it was graded.
        verdict: the parsed verdict (True = "Correct", False = "Incorrect", None = neither);
            verdict_source: what decided it (``word``, ``restated_answer`` or ``none``,
            :func:`interp.methods.asymmetry.parse_record_verdict`, or ``given`` for a verdict read
            from a judged file, :func:`interp.stages.audit.judged_run`, whose model's own
            verdict is then ``judge_verdict``); verdict_text: the judge's raw reply.
        logprob_correct, logprob_incorrect: ``log P(reply | eval prompt)`` of the whole
            replies "Correct" and "Incorrect" (nats, :mod:`interp.judging.verdict`).
        logit_diff: ``logprob_correct - logprob_incorrect`` (nats).
        p_correct: ``sigmoid(logit_diff)``, the forced choice between the two replies.
        verdict_coverage: ``P(Correct) + P(Incorrect)`` in ``(0, 1]``.
        verdict_reply_ids: the token ids of the two whole replies those scores compare,
            ``{"Correct": [...], "Incorrect": [...]}``
            (:func:`interp.judging.verdict.verdict_replies`;
            the manifest's ``model.verdict_replies`` also names their token strings).
        prompts: ``{"gen": PromptSummary, "eval": PromptSummary}``.
    """

    id: Required[str]
    dataset: Required[str]
    status: Required[Literal["ok", "skipped", "no_answer"]]
    split: str
    question: str
    context: str
    answers: list[str]
    answerable: bool
    extras: dict[str, Any]
    reason: str
    model: str
    answer_source: dict[str, str]
    template: str
    generation: str
    answer: str
    oracle_label: bool
    oracle: OracleResult
    verdict: bool | None
    verdict_source: Literal["word", "restated_answer", "none", "given"]
    judge_verdict: bool | None
    verdict_text: str
    logprob_correct: float
    logprob_incorrect: float
    logit_diff: float
    p_correct: float
    verdict_coverage: float
    verdict_reply_ids: dict[str, list[int]]
    prompts: dict[str, PromptSummary]


NO_ANSWER = "no_answer"
"""The status of a record whose model generated no answer: named and counted, never judged
(an empty candidate has no span), outside every metric."""

VERDICT_SCORE_FIELDS = ("logprob_correct", "logprob_incorrect", "logit_diff", "p_correct",
                        "verdict_coverage")
"""The whole-reply verdict score of a record (:meth:`interp.judging.verdict.VerdictScores.rows`)."""


def check_verdict_scores(records: Iterable[Mapping[str, Any]]) -> None:
    """Refuse records without the whole-reply verdict score.

    Runs made before :mod:`interp.judging.verdict` stored ``p_correct`` from the first sub-token of
    each verdict word ("Correct" vs "In"), a different number under the same name. A record
    marked ``verdict_score: "unavailable"`` (a served model whose server cannot score whole
    replies, docs/endpoints.md) passes: its group reports the forced-choice metrics as
    unavailable.

    Raises:
        RunDirError: names the first such record and how to redo the run.
    """
    for r in records:
        if r.get("verdict_score") == "unavailable":  # a served model that cannot score them
            continue
        if any(k not in r for k in VERDICT_SCORE_FIELDS):
            raise RunDirError(
                f"record {r.get('dataset')}/{r.get('id')} has no whole-reply verdict score "
                f"({', '.join(k for k in VERDICT_SCORE_FIELDS if k not in r)} missing): it was "
                f"made before interp scored whole verdict replies; redo the run that wrote it "
                f"(`interp asymmetry` or `interp transfer`) into a new --out or with "
                f"--overwrite")


def qa_key(rec: Record | Mapping[str, Any]) -> tuple[str, str]:
    """The identity of a record: ``(dataset, id)``."""
    return (rec["dataset"], rec["id"])


def prompt_tokens(rec: Mapping[str, Any]) -> int:
    """The length in tokens of a record's longest stored prompt (gen or eval), 0 if none."""
    return max((int(p.get("n_tokens") or 0) for p in (rec.get("prompts") or {}).values()),
               default=0)


def limit_per_dataset(records: Sequence[Mapping[str, Any]], limit: int | None, *,
                      per_label: bool = False, max_tokens: int | None = None) -> list[Any]:
    """The first ``limit`` records of each dataset, in their order (None: all).

    The one meaning of ``limit`` for stages that read a run's records: *per dataset*. (Which
    examples enter a run in the first place is decided when they are loaded,
    :func:`interp.data.load_examples`.)

    Args:
        records: the run's records, in their order.
        limit: records per dataset (None: all).
        per_label: count ``limit`` per (dataset, oracle label y*) instead, so a dataset with
            answers of both labels gives records of both (up to ``2 * limit``): a statistic
            conditioned on y* (acceptance of right and of wrong answers) is then defined.
        max_tokens: leave out records whose longest stored prompt is longer
            (:func:`prompt_tokens`) before counting (None: no bound).

    Raises:
        ConfigError: ``limit`` or ``max_tokens`` below 1.
    """
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be >= 1 (or left out for all records), not {limit}")
    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1 (or left out for no bound), not {max_tokens}")
    seen: dict[tuple[str, Any], int] = {}
    out = []
    for r in records:
        if max_tokens is not None and prompt_tokens(r) > max_tokens:
            continue
        k = (r["dataset"], bool(r.get("oracle_label")) if per_label else None)
        if limit is None or seen.get(k, 0) < limit:
            out.append(r)
            seen[k] = seen.get(k, 0) + 1
    return out
