"""Study 1 (paper section 3.1): generation accuracy vs self-evaluation accuracy.

Algorithm, per example (c, q, a*):

1. T_gen: render the generation prompt and greedy-decode the answer ``a = L(c, q)``; extract
   the answer string (:func:`interp.judging.grading.extract_answer`). An empty answer (the
   model generated nothing, or nothing after its reasoning) is named, not judged: the record's
   status is ``no_answer`` (:data:`interp.store.records.NO_ANSWER`), counted in
   ``metrics.json["no_answer"]`` and the printout, outside every metric.
2. Oracle: ``y* = L*(c, q, a, a*)`` in {Correct, Incorrect} (rule oracle by default,
   :class:`interp.judging.grading.RuleOracle`; or an LLM oracle,
   :class:`interp.judging.grading.ModelOracle`).
3. T_eval: render the evaluation prompt with the model's OWN answer as candidate and
   greedy-decode the verdict; ``verdict`` is the parsed reply (:func:`parse_verdict` with the
   candidate: a verdict word decides; failing that, a reply "The correct answer is X" accepts
   the candidate when X restates it and rejects it otherwise; None when neither, the
   ``verdict_source`` says which). The verdict score is the judge's preference between the
   two whole replies (:func:`interp.judging.verdict.score_verdicts`): ``logprob_correct``,
   ``logprob_incorrect``, ``logit_diff`` (nats), ``p_correct = sigmoid(logit_diff)`` (the
   forced choice) and ``verdict_coverage = P(Correct) + P(Incorrect)``.
4. Metrics over the same examples (:func:`group_metrics`): ``GA = P(y* = Correct)``,
   ``EA = P(y = y*)`` from the generated verdict (an unparseable verdict counts as wrong),
   ``EA_forced`` from the forced choice ``p_correct > 0.5`` (no invalid case), ``delta = EA -
   GA`` and ``delta_forced``; the 3-way split of generated verdicts (accept / reject / none);
   acceptance rates on oracle-correct and oracle-incorrect answers among all answers, among
   valid verdicts and by forced choice (the acquiescence bias); mean ``verdict_coverage``;
   McNemar's exact test of gen-correct vs eval-correct; the ROC AUC of ``logit_diff`` against
   y*. Every CI is a percentile bootstrap over passages
   (:class:`interp.analysis.stats.ClusterBootstrap`,
   cluster = dataset + context hash), and a group on fewer than 10 passages says so.

This module holds the method (examples and records in, records and numbers out); the run
directory work (resume, manifest, ``metrics.json``) is :mod:`interp.stages.asymmetry`. Record
fields: :class:`interp.store.Record`; the later studies render a record's prompts again with
:func:`interp.judging.prompts.rerender`, which checks them against the stored spans.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from interp.analysis.stats import (
    MIN_PASSAGES,
    ClusterBootstrap,
    ci_text,
    degenerate_note,
    is_degenerate,
    mcnemar,
    merge_notes,
    passage_groups,
    passage_note,
    roc_auc,
)
from interp.core.capabilities import IN_PROCESS
from interp.core.errors import ConfigError, Interrupted, PromptError
from interp.core.names import dataset_order, in_dataset_order
from interp.data import QAExample
from interp.judging.grading import BaseOracle, extract_answer
from interp.judging.judge import judge_candidates, judge_room, parse_record_verdict
from interp.judging.prefill import Capture, PromptPass, run_prompts
from interp.judging.prompts import RenderedPrompt, Template, render
from interp.judging.reasoning import MAX_REASONING_TOKENS
from interp.methods.balanced import own_balanced
from interp.models.loading import ModelHandle
from interp.store.records import NO_ANSWER, Record, check_verdict_scores

__all__ = ["CAPTURE_NEEDS", "METRIC_DEFINITIONS", "LocalReplies", "ReplySource", "compute_metrics",
           "evaluate_examples", "format_balanced", "format_metrics", "group_metrics",
           "judge_records", "parse_record_verdict", "reply_source"]


def _example_fields_names() -> tuple[str, ...]:
    return ("id", "dataset", "split", "question", "context", "answers", "answerable")


def _example_fields(ex: QAExample) -> dict[str, Any]:
    """The example's fields of a record, with the data file's extra fields as ``extras``."""
    return {"id": ex.id, "dataset": ex.dataset, "split": ex.split, "question": ex.question,
            "context": ex.context, "answers": list(ex.answers), "answerable": ex.answerable,
            **({"extras": dict(ex.extras)} if ex.extras else {})}


def _skipped(ex: QAExample, reason: str) -> Record:
    return {**_example_fields(ex), "status": "skipped", "reason": reason}  # type: ignore[typeddict-item]


def _no_answer(ex: QAExample, raw: str) -> Record:
    """The record of an example the model answered with nothing (module docstring, step 1)."""
    return {**_example_fields(ex), "status": NO_ANSWER, "generation": raw,  # type: ignore[typeddict-item]
            "reason": f"the model generated no answer (generation {raw[:60]!r})"}


def _render(handle: ModelHandle, template: Template, task: str, ex: QAExample,
            answer: str | None = None) -> RenderedPrompt:
    return render(handle.tokenizer, template, task, context=ex.context, question=ex.question,
                  answer=answer, reference=ex.answers[0] if ex.answers else "")


CAPTURE_NEEDS = frozenset({"attention", "activations"})
"""What a reply source must be able to do for the one-pass capture
(:class:`interp.judging.prefill.Capture`)."""


class ReplySource(Protocol):
    """Where Study 1's replies come from: the one interface of :func:`evaluate_examples`.

    A model loaded in this process (:class:`LocalReplies`, what a
    :class:`interp.models.loading.ModelHandle` is wrapped in) or one served behind an endpoint
    (:class:`interp.endpoints.study.ServedReplies`); what each can do beyond replies is
    :mod:`interp.core.capabilities`. Every method works on examples keyed by an int (their
    position in the call) and answers by the same keys; the algorithm that turns the replies
    into records (extract, grade, parse, record fields) is :func:`evaluate_examples`' alone.

    Attributes:
        spec: the model's spec, the records' ``model``.
        capabilities: what the model can do (:mod:`interp.core.capabilities`); the one-pass
            capture needs ``attention`` and ``activations``.
    """

    spec: str
    capabilities: frozenset[str]

    def check(self, template: Template, verdict_max_new_tokens: int,
              max_reasoning_tokens: int) -> None:
        """Refuse a template whose judge replies cannot be read, before any reply is asked for.

        Raises:
            interp.core.errors.PromptError: as :func:`interp.judging.judge.judge_room`.
        """

    def gen_prompts(self, template: Template, examples: Mapping[int, QAExample],
                    max_new_tokens: int) -> tuple[dict[int, Any], dict[int, str]]:
        """Step 1's generation prompts: ``(prompts, skipped)``, by key.

        A prompt that cannot be rendered, or leaves no room for ``max_new_tokens``, is
        skipped with its reason.
        """

    def generate(self, prompts: Mapping[int, Any], *, max_new_tokens: int, batch_size: int,
                 rows: bool, pools: Sequence[str], progress: str | None
                 ) -> dict[int, PromptPass]:
        """Step 1's replies (``PromptPass.text``: the raw reply, cut after its first line).

        ``max_new_tokens = 0`` decodes nothing (given candidates, with a capture).

        Raises:
            interp.core.errors.Interrupted: a Ctrl-C (a local model).
        """

    def judge(self, template: Template, examples: Mapping[int, QAExample],
              candidates: Mapping[int, str], *, verdict_max_new_tokens: int,
              max_reasoning_tokens: int, batch_size: int, rows: bool, pools: Sequence[str],
              progress: str | None) -> tuple[dict[int, Any], dict[int, str],
                                             dict[int, tuple[dict[str, Any], Any]]]:
        """Step 3 on the candidates: ``(prompts, skipped, judged)`` by key.

        ``judged[k]`` is ``(verdict fields, pass)``: the fields of
        :func:`interp.judging.judge.verdict_fields` (or a reasoning judge's), as
        :func:`interp.judging.judge.judge_candidates` returns them.

        Raises:
            interp.core.errors.Interrupted: as :func:`interp.judging.judge.judge_candidates`.
        """

    def prompt_fields(self, gen: Any, ev: Any) -> dict[str, Any]:
        """The record's fields of its two prompts (``prompts``; none for a served model)."""


class LocalReplies:
    """A :class:`ReplySource` of a model loaded in this process (batched prefills and decodes).

    Step 1 renders with the model's tokenizer and chat template
    (:func:`interp.judging.prompts.render`; a prompt beyond the model's positions is skipped)
    and greedy-decodes through :func:`interp.judging.prefill.run_prompts`; step 3 is
    :func:`interp.judging.judge.judge_candidates`. The one-pass capture (attention rows,
    pooled residual stream) is recorded in the same forwards.

    Args:
        handle: the loaded model.
    """

    def __init__(self, handle: ModelHandle):
        self.handle = handle
        self.spec = handle.spec
        self.capabilities = getattr(handle, "capabilities", IN_PROCESS)

    def check(self, template: Template, verdict_max_new_tokens: int,
              max_reasoning_tokens: int) -> None:
        """As :meth:`ReplySource.check` (:func:`interp.judging.judge.judge_room`)."""
        judge_room(self.handle, template, verdict_max_new_tokens, max_reasoning_tokens)

    def gen_prompts(self, template: Template, examples: Mapping[int, QAExample],
                    max_new_tokens: int) -> tuple[dict[int, Any], dict[int, str]]:
        """As :meth:`ReplySource.gen_prompts`: rendered prompts that fit the model."""
        prompts: dict[int, Any] = {}
        skipped: dict[int, str] = {}
        for k, ex in examples.items():
            try:
                p = _render(self.handle, template, "gen", ex)
            except PromptError as err:
                skipped[k] = str(err)
                continue
            if too_long := self.handle.overflow(len(p), max_new_tokens,
                                                what="generation prompt"):
                skipped[k] = too_long
                continue
            prompts[k] = p
        return prompts, skipped

    def generate(self, prompts: Mapping[int, Any], *, max_new_tokens: int, batch_size: int,
                 rows: bool, pools: Sequence[str], progress: str | None
                 ) -> dict[int, PromptPass]:
        """As :meth:`ReplySource.generate` (:func:`interp.judging.prefill.run_prompts`)."""
        gens = run_prompts(self.handle, [p.input_ids for p in prompts.values()],
                           batch_size=batch_size, rows=rows, pools=pools,
                           max_new_tokens=max_new_tokens,
                           progress=progress and f"{progress} gen")
        return dict(zip(prompts, gens))

    def judge(self, template: Template, examples: Mapping[int, QAExample],
              candidates: Mapping[int, str], **kw: Any
              ) -> tuple[dict[int, Any], dict[int, str], dict[int, tuple[dict[str, Any], Any]]]:
        """As :meth:`ReplySource.judge` (:func:`interp.judging.judge.judge_candidates`)."""
        return judge_candidates(self.handle, template, examples, candidates, **kw)

    def prompt_fields(self, gen: Any, ev: Any) -> dict[str, Any]:
        """``prompts``: both rendered prompts' ids, spans and lengths (``to_record``)."""
        return {"prompts": {"gen": gen.to_record(), "eval": ev.to_record()}}


def reply_source(model: ModelHandle | ReplySource) -> ReplySource:
    """``model`` as a :class:`ReplySource`: a loaded model wrapped in :class:`LocalReplies`."""
    return model if callable(getattr(model, "gen_prompts", None)) else LocalReplies(
        model)  # type: ignore[arg-type]


def evaluate_examples(
    model: ModelHandle | ReplySource,
    examples: Sequence[QAExample],
    *,
    template: Template,
    oracle: BaseOracle,
    max_new_tokens: int = 48,
    verdict_max_new_tokens: int = 12,
    max_reasoning_tokens: int = MAX_REASONING_TOKENS,
    batch_size: int = 8,
    candidates: Sequence[str] | None = None,
    capture: Capture | None = None,
    progress: str | None = None,
) -> list[Record]:
    """Run steps 1-3 of the module algorithm on a list of examples; return their records.

    The one harness of Study 1: a local model and a served one differ only in where their
    replies come from (:class:`ReplySource`); the same replies give the same records, but for
    ``prompts`` (a served model's tokens are not seen).

    Args:
        model: the model that generates AND judges (self-evaluation): a loaded model or any
            :class:`ReplySource` (a served model: :class:`interp.endpoints.study.ServedReplies`).
        examples: the examples.
        template: prompt variant.
        oracle: grades generated answers (step 2).
        max_new_tokens: answer length cap (tokens).
        verdict_max_new_tokens: verdict length cap (tokens).
        max_reasoning_tokens: a reasoning judge's reply budget (tokens; templates with
            ``judge = "reasoning"``, :mod:`interp.judging.reasoning`).
        batch_size: prompts per forward.
        candidates: when given, judge these answers instead of the model's own (used by the
            transfer and patching studies; GA then describes the candidates).
        capture: when given, also record in the same prefill forwards the last-token
            attention rows and the pooled ``resid_post`` of both prompts of every ok record
            (:class:`interp.judging.prefill.Capture`; filled in place; a local model only).
        progress: a tqdm description for per-batch bars (None: none).

    Returns:
        One :class:`interp.store.Record` per example (``status`` ``"ok"``; ``"skipped"``
        with a ``reason`` when a prompt does not fit the model's context; ``"no_answer"``
        with its ``generation`` and a ``reason`` when the model generated no answer, which
        is neither graded nor judged: an empty candidate has no span to judge).

    Raises:
        interp.core.errors.ConfigError: a capture with a reasoning template, or from a
            source without :data:`CAPTURE_NEEDS` (a served model).
        interp.core.errors.Interrupted: a Ctrl-C (or SIGTERM); its ``done`` is the list of
            records as above with None for each example not finished before it: the skipped
            ones are, and once the judging has begun those whose judge batch finished
            (``capture`` holds theirs, by the same positions).
        interp.endpoints.client.RequestFailed, interp.core.errors.EndpointError: a served
            model's request failed (:meth:`interp.endpoints.client.Endpoint.chat`).
    """
    source = reply_source(model)
    # refuses a template whose replies cannot be scored, before any generation
    source.check(template, verdict_max_new_tokens, max_reasoning_tokens)
    if capture is not None and not CAPTURE_NEEDS <= source.capabilities:
        raise ConfigError(f"{source.spec} cannot show its attention and activations, so the "
                          f"one-pass capture does not apply (one_pass = false)")
    if capture is not None and template.judge != "word":
        raise ConfigError(f"template {template.name!r} judges with reasoning: its verdict "
                          f"position lies after the reasoning, so the one-pass capture of the "
                          f"eval prompt does not apply (one_pass = false)")
    records: list[Record | None] = [None] * len(examples)
    gen_prompts, skipped = source.gen_prompts(template, dict(enumerate(examples)),
                                              max_new_tokens)
    for k, reason in skipped.items():
        records[k] = _skipped(examples[k], reason)
    rows, pools = (capture.rows, capture.pools) if capture is not None else (False, ())
    gen_pools = [x for x in pools if x != "candidate"]
    gen_pass: dict[int, PromptPass] = {}
    if candidates is None or capture is not None:  # given candidates: no answer to decode
        try:
            gen_pass = source.generate(gen_prompts, batch_size=batch_size, rows=rows,
                                       pools=gen_pools,
                                       max_new_tokens=max_new_tokens if candidates is None
                                       else 0, progress=progress)
        except KeyboardInterrupt as exc:  # no answer judged yet: the skipped records
            raise Interrupted(records) from exc
    if candidates is None:
        raw = {k: g.text for k, g in gen_pass.items()}
        answers = {k: extract_answer(t) for k, t in raw.items()}
        for k in [k for k, a in answers.items() if not a.strip()]:  # nothing to judge
            records[k] = _no_answer(examples[k], raw[k])
            del answers[k]
    else:
        raw = answers = {k: candidates[k] for k in gen_prompts}
    try:
        eval_prompts, skipped, judged = source.judge(
            template, {k: examples[k] for k in answers}, answers, rows=rows,
            pools=pools, batch_size=batch_size, verdict_max_new_tokens=verdict_max_new_tokens,
            max_reasoning_tokens=max_reasoning_tokens, progress=progress)
    except Interrupted as exc:  # the records of the judge batches that finished
        eval_prompts, skipped, judged = exc.done
        _finish(source, examples, records, oracle, raw, answers, gen_prompts, gen_pass,
                {k: eval_prompts[k] for k in judged}, skipped, judged, capture)
        raise Interrupted(records) from exc
    except KeyboardInterrupt as exc:
        raise Interrupted(records) from exc
    _finish(source, examples, records, oracle, raw, answers, gen_prompts, gen_pass,
            eval_prompts, skipped, judged, capture)
    return records  # type: ignore[return-value]


def _finish(source: ReplySource, examples: Sequence[QAExample], records: list[Record | None],
            oracle: BaseOracle, raw: Mapping[int, str], answers: Mapping[int, str],
            gen_prompts: Mapping[int, Any], gen_pass: Mapping[int, PromptPass],
            eval_prompts: Mapping[int, Any], skipped: Mapping[int, str],
            judged: Mapping[int, tuple[dict[str, Any], Any]], capture: Capture | None) -> None:
    """Steps 2-3's records (in place) of the judged examples and of the skipped ones."""
    for k, reason in skipped.items():
        records[k] = _skipped(examples[k], reason)
    for k, ep in eval_prompts.items():
        fields, v = judged[k]
        records[k] = _ok_record(source, examples[k], oracle, raw[k], answers[k], fields,
                                gen_prompts[k], ep)
        if capture is not None:
            capture.got[k] = {"gen": (gen_prompts[k], gen_pass[k]), "eval": (ep, v)}


def _ok_record(source: ReplySource, ex: QAExample, oracle: BaseOracle, raw: str, answer: str,
               judged: Mapping[str, Any], gp: Any, ep: Any) -> Record:
    """Step 2 (grade) and the record of one fully evaluated example."""
    graded = oracle.grade(answer, ex.answers, dataset=ex.dataset, answerable=ex.answerable,
                          extras={**ex.extras, "context": ex.context, "question": ex.question})
    return {  # type: ignore[typeddict-item]
        **_example_fields(ex), "status": "ok", "model": source.spec,
        "generation": raw, "answer": answer,
        "oracle_label": bool(graded.label),
        "oracle": {"name": oracle.name, "em": graded.em, "f1": graded.f1, "rule": graded.rule},
        **judged,
        **source.prompt_fields(gp, ep),
    }


def judge_records(handle: ModelHandle, records: Sequence[Record] | Sequence[Mapping[str, Any]],
                  *, template: Template, verdict_max_new_tokens: int = 12,
                  max_reasoning_tokens: int = MAX_REASONING_TOKENS, batch_size: int = 8,
                  rows: bool = False, reasoning_attention: bool = False,
                  progress: str | None = None) -> tuple[list[Record], list[Any]]:
    """A judge-only rerun: ``handle`` judges the given records' candidate answers.

    Nothing is generated or graded again: each record's example, ``generation``, ``answer``
    (the candidate), ``oracle_label`` and ``oracle`` are kept, so the new judge is compared
    with the old one on the same records and the same answers (paired). The judge step is
    the harness's own (step 3 of the module algorithm, any template's ``judge``).

    Args:
        handle: the judge (the records' model, or another one).
        records: ``ok`` records of a run (``answer``, ``oracle_label`` and the example).
        template: the judge's template variant.
        verdict_max_new_tokens: one-word verdict length cap (tokens).
        max_reasoning_tokens: a reasoning judge's budget (:mod:`interp.judging.reasoning`).
        batch_size: prompts per forward.
        rows: record the verdict position's attention (reasoning judge: in its judgement).
        reasoning_attention: a reasoning judge's attention while reasoning, too.
        progress: a tqdm description (None: no bar).

    Returns:
        ``(records, passes)``: one new record per given record (``status`` ``"skipped"`` when
        its eval prompt does not fit), with ``model`` = the judge, ``answers_from`` = the
        records' model, ``template`` = the judge's template and the new verdict fields; and
        per record the :class:`interp.judging.prefill.PromptPass` or
        :class:`interp.judging.reasoning.ReasoningJudgement` (None when skipped).
    """
    judge_room(handle, template, verdict_max_new_tokens, max_reasoning_tokens)
    examples = {k: QAExample(id=rec["id"], dataset=rec["dataset"], context=rec["context"],
                             question=rec["question"], answers=tuple(rec.get("answers") or ()),
                             answerable=rec.get("answerable", True), split=rec.get("split", ""))
                for k, rec in enumerate(records)}
    prompts, skipped, judged = judge_candidates(
        handle, template, examples, {k: rec["answer"] for k, rec in enumerate(records)},
        rows=rows, batch_size=batch_size, verdict_max_new_tokens=verdict_max_new_tokens,
        max_reasoning_tokens=max_reasoning_tokens, reasoning_attention=reasoning_attention,
        progress=progress)
    out: list[Any] = [None] * len(records)
    for k, reason in skipped.items():
        out[k] = _skipped(examples[k], reason)
    passes: list[Any] = [None] * len(records)
    for k, (fields, v) in judged.items():
        src = records[k]
        kept = {f: src[f] for f in (*_example_fields_names(), "generation", "answer",
                                    "oracle_label", "oracle") if f in src}
        out[k] = {**kept, "status": "ok", "model": handle.spec, "answers_from": src.get("model"),
                  "template": template.name, **fields,
                  "prompts": {**(src.get("prompts") or {}), "eval": prompts[k].to_record()}}
        passes[k] = v
    return out, passes


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


METRIC_DEFINITIONS = {
    "n": "ok records in the group; n_passages: distinct passages (dataset + context hash)",
    "few_passages": f"true when n_passages < {MIN_PASSAGES}; note then says so",
    "GA": "mean of y* (oracle says the generated answer is correct)",
    "EA": "mean of (generated verdict == y*); a verdict that cannot be parsed counts as wrong",
    "EA_forced": "mean of ((p_correct > 0.5) == y*): the forced choice, no invalid case",
    "delta": "EA - GA (paired: same resamples); delta_forced = EA_forced - GA",
    "delta_valid": "EA - GA on the n_valid records whose verdict was parsed (paired): the "
                   "asymmetry without counting an unparseable reply as a wrong verdict; "
                   "EA_valid, GA_valid its two sides; n_passages_valid the distinct passages "
                   "of those records",
    "verdicts": "counts of generated verdicts accept / reject / none (unparseable); they sum "
                "to n; verdict_shares = counts / n; verdicts_by_label splits them by y*",
    "n_verdict_restated": "verdicts decided by a restated answer ('The correct answer is X'), "
                          "not a verdict word (records' verdict_source)",
    "acceptance_rate": "sum(accepted) / n (a ratio of sums); _valid: among parseable "
                       "verdicts; _correct / _incorrect: among answers with y* Correct / "
                       "Incorrect; _forced: p_correct > 0.5 instead of the generated verdict",
    "EA_forced_unavailable": "set (and every forced-choice and score key None) when the "
                             "model's server cannot score the two whole replies, or returns "
                             "values that are not log-probabilities (the reason)",
    "forced_choice_note": "set when the forced choice is the same for every record, so "
                          "EA_forced is GA or 1 - GA by construction (a control, no finding)",
    "mean_verdict_coverage": "mean over records of P(Correct) + P(Incorrect), the judge's "
                             "probability held by the two whole replies",
    "mean_p_correct": "mean over records of sigmoid(logit_diff)",
    "auc_logit_diff": "ROC AUC of logit_diff = log P(Correct) - log P(Incorrect) against y* "
                      "(None with one class); _ci: its passage-cluster interval",
    "balanced_accuracy": "(acceptance of right answers + rejection of wrong answers) / 2 by "
                         "the generated verdict, no verdict wrong on both sides: 0.5 for a "
                         "judge whose verdict ignores correctness, whatever GA is (None with "
                         "one class); _forced: by the forced choice (interp.methods.balanced)",
    "mcnemar": "exact McNemar test of generator-right vs judge-right (b: only the generator "
               "right, c: only the judge right); it assumes independent records",
    "degenerate_cis": "the *_ci keys whose interval has zero width (every bootstrap resample "
                      "gave one value: the outcome is the same on every record, or too few "
                      "passages): no evidence of precision, read them with their counts",
    "_ci": "95% percentile cluster bootstrap over passages "
           "(interp.analysis.stats.ClusterBootstrap); None with fewer than 2 passages; a "
           "rate of 0 or 1 gets [0, 0] or [1, 1] (the bootstrap cannot leave the sample): "
           "read it with its count",
}
"""What each key of a :func:`group_metrics` group means (copied into ``metrics.json``)."""

_VERDICT_CLASSES = ("accept", "reject", "none")


def _verdict_class(v: Any) -> str:
    return "accept" if v is True else "reject" if v is False else "none"


def _split(classes: Sequence[str]) -> dict[str, int]:
    return {c: int(sum(x == c for x in classes)) for c in _VERDICT_CLASSES}


def _acceptance(bs: ClusterBootstrap, y: np.ndarray, accepted: np.ndarray, valid: np.ndarray,
                forced: np.ndarray) -> dict[str, Any]:
    """Acceptance rates (ratios of sums) with cluster CIs: among all, valid, forced; by y*."""
    out: dict[str, Any] = {}
    everyone = np.ones_like(y)
    for label, mask in (("", everyone), ("_correct", y), ("_incorrect", ~y)):
        for mode, num, den in (("", accepted & mask, mask), ("_valid", accepted & mask,
                                                              valid & mask),
                               ("_forced", forced & mask, mask)):
            value, samples = bs.ratio_of_means(num, den)
            key = f"acceptance_rate{label}{mode}"
            out[key], out[f"{key}_ci"] = value, bs.interval(samples)
    return out


def _valid_delta(bs: ClusterBootstrap, y: np.ndarray, right: np.ndarray,
                 valid: np.ndarray, groups: Sequence[str]) -> dict[str, Any]:
    """EA, GA and their paired difference on the records with a parsed verdict.

    Each is a ratio of sums over the group's records weighted by ``valid`` (on every resample
    too), so records without a verdict leave both sides, not only EA. ``n_passages_valid``
    counts the distinct passages (``groups``, one per record) of those records: the passages
    behind ``delta_valid``, fewer than ``n_passages`` when a passage has no parsed verdict.
    """
    out: dict[str, Any] = {"n_valid": int(valid.sum()),
                           "n_passages_valid": len({g for g, v in zip(groups, valid) if v}),
                           "EA_valid": None, "GA_valid": None,
                           "delta_valid": None, "delta_valid_ci": None}
    if not valid.any():
        return out
    w = valid.astype(np.float64)
    out["EA_valid"] = float(right[valid].mean())
    out["GA_valid"] = float(y[valid].mean())
    out["delta_valid"], samples = bs.ratio_of_means((right.astype(np.float64) - y) * w, w)
    out["delta_valid_ci"] = bs.interval(samples)
    return out


def _constant_choice_note(forced: np.ndarray) -> str | None:
    """A note when the forced choice is the same for every record (EA_forced is then fixed)."""
    if forced.all():
        return (f"the forced choice accepts all {forced.size} answers (p_correct > 0.5 for "
                f"each): EA_forced = GA by construction")
    if not forced.any():
        return (f"the forced choice rejects all {forced.size} answers: EA_forced = 1 - GA by "
                f"construction")
    return None


def group_metrics(records: Sequence[Record] | Sequence[Mapping[str, Any]], *, n_boot: int = 2000,
                  seed: int = 0) -> dict[str, Any]:
    """GA, EA, EA_forced, Delta and the judge's diagnostics over one group of ``ok`` records.

    Keys and what they mean: :data:`METRIC_DEFINITIONS`.

    Args:
        records: records with ``dataset``, ``context``, ``oracle_label`` (bool), ``verdict``
            (bool or None), ``p_correct``, ``logit_diff`` and ``verdict_coverage`` (the
            whole-reply verdict score, :mod:`interp.judging.verdict`).
        n_boot: bootstrap resamples of passages (GA, EA and Delta on the same resamples).
        seed: bootstrap seed.

    Returns:
        ``{"n": 0, "n_passages": 0}`` for no records; otherwise every key of
        :data:`METRIC_DEFINITIONS` (with ``*_ci`` = ``[lo, hi]`` or None).

        A group with a record marked ``verdict_score: "unavailable"`` (a served model whose
        server cannot score whole replies) has every forced-choice and score key None and
        ``EA_forced_unavailable`` saying why.

    Raises:
        RunDirError: a record without the whole-reply verdict score (made before it existed).
    """
    n = len(records)
    if n == 0:
        return {"n": 0, "n_passages": 0}
    check_verdict_scores(records)
    y = np.array([bool(r["oracle_label"]) for r in records])
    v = [r["verdict"] for r in records]
    accepted, valid = np.array([x is True for x in v]), np.array([x is not None for x in v])
    right = valid & (accepted == y)
    scored = all(r.get("verdict_score") != "unavailable" for r in records)
    p = np.array([float(r["p_correct"]) if scored else 0.0 for r in records])
    forced = p > 0.5
    right_f = forced == y
    groups = passage_groups(records)
    bs = ClusterBootstrap(groups, n_boot, np.random.default_rng(seed))
    ga_b, ea_b, ef_b = bs.means(y), bs.means(right), bs.means(right_f)
    classes = [_verdict_class(x) for x in v]
    split = _split(classes)
    cov = np.array([float(r["verdict_coverage"]) if scored else 0.0 for r in records])
    ld = np.array([float(r["logit_diff"]) if scored else 0.0 for r in records])
    auc = roc_auc(y, ld)
    out = {
        "n": n, "n_passages": bs.n_clusters, "few_passages": bs.n_clusters < MIN_PASSAGES,
        "note": passage_note(bs.n_clusters),
        "GA": float(y.mean()), "EA": float(right.mean()), "EA_forced": float(right_f.mean()),
        "delta": float(right.mean() - y.mean()),
        "delta_forced": float(right_f.mean() - y.mean()),
        "GA_ci": bs.interval(ga_b), "EA_ci": bs.interval(ea_b), "EA_forced_ci": bs.interval(ef_b),
        "delta_ci": None if ga_b is None else bs.interval(ea_b - ga_b),
        "delta_forced_ci": None if ga_b is None else bs.interval(ef_b - ga_b),
        **_valid_delta(bs, y, right, valid, groups),
        "verdicts": split, "verdict_shares": {c: k / n for c, k in split.items()},
        "verdicts_by_label": {
            name: _split([c for c, m in zip(classes, mask) if m])
            for name, mask in (("correct", y), ("incorrect", ~y))},
        "n_verdict_restated": sum(r.get("verdict_source") == "restated_answer"
                                  for r in records),
        "invalid_verdicts": split["none"],
        "n_oracle_correct": int(y.sum()), "n_oracle_incorrect": int((~y).sum()),
        **_acceptance(bs, y, accepted, valid, forced),
        "forced_choice_note": _constant_choice_note(forced),
        "mean_verdict_coverage": float(cov.mean()),
        "mean_verdict_coverage_ci": bs.interval(bs.means(cov)),
        "mean_p_correct": float(p.mean()),
        "auc_logit_diff": auc,
        "auc_logit_diff_ci": None if auc is None else bs.interval(bs.aucs(y, ld)),
        "mcnemar": mcnemar(y, right),
        **own_balanced(bs, y, v, forced),
    }
    if not scored:  # never a 0 standing for "not measured"
        why = next((r["verdict_score_reason"] for r in records
                    if r.get("verdict_score_reason")), None)
        out.update({k: None for k in out if "forced" in k or k in _SCORE_KEYS},
                   EA_forced_unavailable=f"unavailable: {why}" if why else FORCED_UNAVAILABLE)
    # an interval of zero width (every resample gave one value: constant outcomes, or too
    # few passages) is named here as in every table and figure (interp.analysis.stats.ci_text)
    out["degenerate_cis"] = sorted(k for k, ci in out.items()
                                   if k.endswith("_ci") and is_degenerate(ci))
    return out


_SCORE_KEYS = ("mean_verdict_coverage", "mean_verdict_coverage_ci", "mean_p_correct",
               "auc_logit_diff", "auc_logit_diff_ci")
FORCED_UNAVAILABLE = ("unavailable: the server cannot score the two whole verdict replies "
                      "(docs/endpoints.md)")
"""``EA_forced_unavailable`` of a group whose records have no verdict score."""


def compute_metrics(records: Sequence[Record] | Sequence[Mapping[str, Any]], *,
                    n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Metrics per dataset and overall (see :func:`group_metrics`), plus skip counts.

    Returns:
        ``{"per_dataset": {name: metrics}, "overall": metrics, "skipped": {name: count}
        (every record not ``ok``), "no_answer": {name: count} (those of them the model
        answered with nothing),
        "models": [...], "definitions": METRIC_DEFINITIONS, "n_boot", "seed"}``.

    Raises:
        RunDirError: an ok record without the whole-reply verdict score.
    """
    ok = [r for r in records if r.get("status") == "ok"]
    datasets = dataset_order(r["dataset"] for r in records)
    return {
        "per_dataset": {d: group_metrics([r for r in ok if r["dataset"] == d], n_boot=n_boot,
                                         seed=seed) for d in datasets},
        "overall": group_metrics(ok, n_boot=n_boot, seed=seed),
        "skipped": {d: sum(1 for r in records if r["dataset"] == d and r.get("status") != "ok")
                    for d in datasets},
        "no_answer": {d: sum(1 for r in records if r["dataset"] == d
                             and r.get("status") == NO_ANSWER) for d in datasets},
        "models": sorted({r["model"] for r in ok}),
        "n_boot": n_boot, "seed": seed, "definitions": METRIC_DEFINITIONS,
    }


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """A plain-text table of metrics.json (one row per dataset and overall).

    Columns: n, passages, GA, EA, EA_forced, delta with its CI, delta_forced, acceptance among
    all answers with y* Correct / Incorrect, the share of generated verdicts with no verdict,
    the forced-choice acceptance with y* Correct / Incorrect, mean coverage, AUC of
    ``logit_diff``. A group on fewer than 10 passages gets a ``*`` and a note below.
    """
    head = (f"{'dataset':<10} {'n':>4} {'pass':>5} {'GA':>5} {'EA':>5} {'EA_f':>5} "
            f"{'delta':>6} {'95% CI delta':>15} {'d_f':>6} {'acc|C':>5} {'acc|I':>5} "
            f"{'none':>5} {'fC|C':>5} {'fC|I':>5} {'cov':>5} {'AUC':>5} {'BA':>5} {'BA_f':>5}")
    rows = [head, "-" * len(head)]
    few, zero, forced, unavailable = [], [], [], []
    groups = in_dataset_order(metrics["per_dataset"]) + [("overall", metrics["overall"])]

    def f(x: float | None) -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"

    def fs(x: float | None) -> str:
        return "-" if x is None else f"{x:+.2f}"

    for name, m in groups:
        if not m.get("n"):
            rows.append(f"{name:<10} {0:>4}")
            continue
        ci = m.get("delta_ci")
        ci_s = ci_text(ci, "+.2f")
        star = "*" if m.get("few_passages") else ""
        if star:
            few.append((name, m["note"]))
        if is_degenerate(ci):
            zero.append((name, degenerate_note(m.get("n_passages"))))
        if m.get("forced_choice_note"):
            forced.append((name, m["forced_choice_note"]))
        if m.get("EA_forced_unavailable"):
            unavailable.append((name, f"EA_forced {m['EA_forced_unavailable']}"))
        rows.append(
            f"{name:<10} {m['n']:>4} {str(m['n_passages']) + star:>5} {m['GA']:>5.2f} "
            f"{m['EA']:>5.2f} {f(m['EA_forced']):>5} {m['delta']:>+6.2f} {ci_s:>15} "
            f"{fs(m['delta_forced']):>6} {f(m['acceptance_rate_correct']):>5} "
            f"{f(m['acceptance_rate_incorrect']):>5} {f(m['verdict_shares']['none']):>5} "
            f"{f(m['acceptance_rate_correct_forced']):>5} "
            f"{f(m['acceptance_rate_incorrect_forced']):>5} "
            f"{f(m['mean_verdict_coverage']):>5} {f(m['auc_logit_diff']):>5} "
            f"{f(m.get('balanced_accuracy')):>5} {f(m.get('balanced_accuracy_forced')):>5}")
    # one line per fact: groups whose notes differ only in their counts share it
    notes = ["* " + n for n in merge_notes(few)] + [
        "  " + n for n in merge_notes(zero) + merge_notes(forced) + merge_notes(unavailable)]
    for name, n in (metrics.get("no_answer") or {}).items():
        if n:
            total = (metrics["per_dataset"].get(name) or {}).get("n", 0) + metrics[
                "skipped"].get(name, n)
            notes.append(f"  {name}: {n} of {total} records have no answer (the model "
                         f"generated nothing): not graded, not judged, outside every column")
    legend = ("EA_f/d_f: forced choice p_correct > 0.5; acc|C, acc|I: generated verdict "
              "'Correct' among answers with y* Correct / Incorrect (no verdict = not accepted); "
              "none: share with no verdict; fC|C, fC|I: forced-choice acceptance; cov: mean "
              "P(Correct)+P(Incorrect); AUC: logit_diff vs y*; BA, BA_f: balanced accuracy "
              "(acc|C + rejection|I) / 2, generated and forced (0.5: a judge that ignores "
              "correctness); CIs: bootstrap over passages")
    out = rows + notes + [legend]
    if metrics.get("balanced"):
        out += ["", format_balanced(metrics["balanced"])]
    return "\n".join(out)


def format_balanced(balanced: Mapping[str, Any]) -> str:
    """A plain-text table of the balanced judge set (``metrics.json['balanced']``).

    Per dataset and overall: records with a gold and a wrong candidate (pairs), passages,
    acceptance of the right (gold) and of the wrong candidates, balanced accuracy and the
    AUC of ``logit_diff``, each with its passage-cluster 95% interval.
    """
    head = (f"{'balanced':<10} {'pairs':>5} {'pass':>5} {'acc|right':>17} {'acc|wrong':>17} "
            f"{'BA':>17} {'AUC':>17}")
    rows = [head, "-" * len(head)]
    counts = balanced.get("counts") or {}
    groups = list(balanced["per_dataset"].items()) + [("overall", balanced["overall"])]
    for name, g in groups:
        if not g.get("n"):
            rows.append(f"{name:<10} {0:>5}")
            continue

        def c(key: str) -> str:
            v = g.get(key)
            return "-" if v is None else f"{v:.2f} {ci_text(g.get(key + '_ci'))}"

        rows.append(f"{name:<10} {g['n'] // 2:>5} {g['n_passages']:>5} "
                    f"{c('acceptance_right'):>17} {c('acceptance_wrong'):>17} "
                    f"{c('balanced_accuracy'):>17} {c('auc_logit_diff'):>17}")
        if g.get("one_reply"):
            rows.append(f"  {name}: {g['one_reply']}")
    for name, k in counts.items():
        if k.get("n_without_gold") or k.get("n_without_negative"):
            rows.append(f"  {name}: left out {k.get('n_without_gold', 0)} without a gold "
                        f"answer, {k.get('n_without_negative', 0)} without a wrong one")
    rows.append("balanced set: each record's gold answer and one wrong answer (its mined hard "
                "negative, else its own wrong answer): GA = 0.5 by construction")
    return "\n".join(rows)
