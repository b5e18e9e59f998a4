"""The judge step of Study 1 (paper section 3.1, T_eval), shared by the harness and reruns.

:func:`interp.methods.asymmetry.evaluate_examples` (the model judges its own answers) and
:func:`interp.methods.asymmetry.judge_records` (a judge-only rerun on given records' answers) both
judge through :func:`judge_candidates`: it renders the eval prompt of each candidate
(:func:`eval_prompt`: skipped with its reason when it does not fit the model with the judge's
reply, :func:`judge_room`) and judges them all with :func:`judge_prompts`, which dispatches
on the template's ``judge``: ``"word"`` (the paper's one-word verdict: whole-reply verdict
score and decoded verdict from one prefill, :mod:`interp.judging.verdict`,
:func:`parse_record_verdict`) or ``"reasoning"`` (:mod:`interp.judging.reasoning`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from interp.core.errors import Interrupted, PromptError
from interp.data import QAExample
from interp.judging.grading import parse_verdict
from interp.judging.prefill import run_prompts
from interp.judging.prompts import RenderedPrompt, Template, render
from interp.judging.reasoning import MAX_REASONING_TOKENS, judge_reasoning, verdict_endings
from interp.judging.verdict import VerdictScores, verdict_replies
from interp.models.loading import ModelHandle

__all__ = ["eval_prompt", "judge_candidates", "judge_prompts", "judge_room", "parse_record_verdict",
           "verdict_fields"]


def judge_room(handle: ModelHandle, template: Template, verdict_max_new_tokens: int,
               max_reasoning_tokens: int = MAX_REASONING_TOKENS) -> int:
    """Positions a judge reply may need after its prompt.

    Raises:
        PromptError: the verdict replies (or a reasoning judge's verdict lines) cannot be
            scored with this tokenizer.
    """
    if template.judge == "reasoning":
        ends = verdict_endings(handle.tokenizer)
        return max_reasoning_tokens + len(ends.newline) + len(ends.shared) + max(
            map(len, ends.words))
    return max(verdict_max_new_tokens, *map(len, verdict_replies(handle.tokenizer).ids))


def eval_prompt(handle: ModelHandle, template: Template, ex: QAExample, answer: str,
                verdict_max_new_tokens: int,
                max_reasoning_tokens: int = MAX_REASONING_TOKENS) -> RenderedPrompt | str:
    """The eval prompt of one candidate, or why it is skipped (a render error, no room).

    Raises:
        PromptError: as :func:`judge_room`.
    """
    try:
        ep = render(handle.tokenizer, template, "eval", context=ex.context,
                    question=ex.question, answer=answer,
                    reference=ex.answers[0] if ex.answers else "")
    except PromptError as err:
        return str(err)
    need = judge_room(handle, template, verdict_max_new_tokens, max_reasoning_tokens)
    return handle.overflow(len(ep), need, what="evaluation prompt",
                           new="for the judge's reply") or ep


def judge_candidates(handle: ModelHandle, template: Template,
                     examples: Mapping[int, QAExample], candidates: Mapping[int, str], *,
                     verdict_max_new_tokens: int = 12,
                     max_reasoning_tokens: int = MAX_REASONING_TOKENS, **judge: Any
                     ) -> tuple[dict[int, RenderedPrompt], dict[int, str],
                                dict[int, tuple[dict[str, Any], Any]]]:
    """Step 3 on candidate answers: render their eval prompts and judge those that fit.

    The one judge step of the harness (the model's own answers, or given ones) and of a
    judge-only rerun (module docstring).

    Args:
        handle: the judge model.
        template: its template variant.
        examples: the examples by key.
        candidates: the candidate answer of each example, by the same keys.
        verdict_max_new_tokens: one-word verdict length cap (tokens).
        max_reasoning_tokens: a reasoning judge's budget (tokens).
        **judge: :func:`judge_prompts`' recording and batching options (``rows``, ``pools``,
            ``batch_size``, ``reasoning_attention``, ``progress``).

    Returns:
        ``(prompts, skipped, judged)``: the eval prompts that fit, the reason of each example
        whose prompt does not (:func:`eval_prompt`), and :func:`judge_prompts`' result on the
        prompts, all by key.

    Raises:
        PromptError: as :func:`judge_room`.
        interp.core.errors.Interrupted: a Ctrl-C during the judging; its ``done`` holds
            ``(prompts, skipped, judged)`` with the prompts judged before it.
    """
    prompts: dict[int, RenderedPrompt] = {}
    skipped: dict[int, str] = {}
    for k, ex in examples.items():
        ep = eval_prompt(handle, template, ex, candidates[k], verdict_max_new_tokens,
                         max_reasoning_tokens)
        if isinstance(ep, str):
            skipped[k] = ep
        else:
            prompts[k] = ep
    try:
        judged = judge_prompts(handle, template, prompts, candidates,
                               verdict_max_new_tokens=verdict_max_new_tokens,
                               max_reasoning_tokens=max_reasoning_tokens, **judge)
    except Interrupted as exc:
        raise Interrupted((prompts, skipped, exc.done)) from exc
    return prompts, skipped, judged


def judge_prompts(handle: ModelHandle, template: Template,
                  prompts: Mapping[int, RenderedPrompt], candidates: Mapping[int, str], *,
                  rows: bool = False, pools: Sequence[str] = (), batch_size: int = 8,
                  verdict_max_new_tokens: int = 12,
                  max_reasoning_tokens: int = MAX_REASONING_TOKENS,
                  reasoning_attention: bool = False, progress: str | None = None
                  ) -> dict[int, tuple[dict[str, Any], Any]]:
    """Step 3 on rendered eval prompts: ``{k: (record fields, PromptPass or judgement)}``.

    A one-word template (``judge = "word"``): one prefill per prompt gives the whole-reply
    verdict score, the decoded verdict and the recordings asked for (``rows``, ``pools``). A
    reasoning template: :func:`interp.judging.reasoning.judge_reasoning` (the pools are not
    recorded: its verdict position lies after its reasoning).

    Raises:
        interp.core.errors.Interrupted: a Ctrl-C during the prefills; its ``done`` holds this
            function's result for the prompts of the batches that finished before it (a
            reasoning judge's: none).
    """
    keys, eps = list(prompts), list(prompts.values())
    if template.judge == "reasoning":
        got = judge_reasoning(handle, eps, max_reasoning_tokens=max_reasoning_tokens,
                              batch_size=batch_size, rows=rows,
                              reasoning_attention=reasoning_attention, progress=progress)
        return {k: (j.to_fields(), j) for k, j in zip(keys, got)}
    replies = verdict_replies(handle.tokenizer)
    try:
        evals = run_prompts(handle, [ep.input_ids for ep in eps], batch_size=batch_size,
                            max_new_tokens=verdict_max_new_tokens, continuations=replies.ids,
                            rows=rows, pools=pools,
                            candidate_spans=[ep.token_spans.get("candidate") for ep in eps],
                            progress=progress and f"{progress} eval")
    except Interrupted as exc:  # keep the verdicts of the finished batches
        done = sorted(exc.done)
        raise Interrupted(_verdicts(replies, [keys[i] for i in done],
                                    [exc.done[i] for i in done], candidates)) from exc
    return _verdicts(replies, keys, evals, candidates)


def _verdicts(replies: Any, keys: Sequence[int], evals: Sequence[Any],
              candidates: Mapping[int, str]) -> dict[int, tuple[dict[str, Any], Any]]:
    """:func:`judge_prompts`' result of one-word judge passes (``evals``, by ``keys``)."""
    lps = torch.stack([v.logprobs for v in evals]) if evals else torch.zeros(0, 2)
    scores = VerdictScores(logprob_correct=lps[:, 0], logprob_incorrect=lps[:, 1]).rows()
    out = {}
    for k, v, sc in zip(keys, evals, scores):
        out[k] = (verdict_fields(v.text, candidates[k], sc,
                                 verdict_reply_ids=replies.id_lists()), v)
    return out


def verdict_fields(text: str, candidate: str, scores: Mapping[str, Any],
                   **extra: Any) -> dict[str, Any]:
    """A one-word judge's record fields from its reply: the one place a reply becomes a verdict.

    Used for every model, local (:func:`judge_prompts`) or served
    (:class:`interp.endpoints.study.ServedReplies`), so the same reply gives the same fields.

    Args:
        text: the judge's decoded reply.
        candidate: the answer it judged (for a restated answer, :func:`parse_record_verdict`).
        scores: the whole-reply verdict score (:meth:`interp.judging.verdict.VerdictScores.rows`
            keys), or why there is none (``verdict_score: "unavailable"``).
        **extra: fields after the scores (a local judge's ``verdict_reply_ids``).

    Returns:
        ``verdict``, ``verdict_source``, ``verdict_text``, the scores, then ``extra``, in this
        order (the order of ``records.jsonl``).
    """
    verdict, source = parse_record_verdict(text, candidate)
    return {"verdict": verdict, "verdict_source": source, "verdict_text": text, **scores,
            **extra}


def parse_record_verdict(text: str, candidate: str) -> tuple[bool | None, str]:
    """The verdict of a judge reply and what decided it.

    Returns:
        ``(verdict, source)``: ``source`` is ``"word"`` (a verdict word decided,
        :func:`interp.judging.grading.parse_verdict` steps 1-5), ``"restated_answer"`` (no verdict
        word; "The correct answer is X" compared with the candidate, step 6) or ``"none"``
        (verdict None).
    """
    v = parse_verdict(text)
    if v is not None:
        return v, "word"
    v = parse_verdict(text, candidate)
    return v, "none" if v is None else "restated_answer"
