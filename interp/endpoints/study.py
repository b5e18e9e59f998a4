"""Study 1 (paper section 3.1) of a model served behind a chat endpoint (``--model openai:M``).

Not a second harness: :class:`ServedReplies` is the :class:`interp.methods.asymmetry.ReplySource`
of a served model, and :func:`interp.methods.asymmetry.evaluate_examples` turns its replies
into records exactly as a local model's (the stage, :mod:`interp.stages.asymmetry`, runs it
one example per request slot). Where the replies come from, per example (c, q, a*):

1. T_gen: the generation prompt's chat messages (:func:`interp.judging.prompts.chat_messages`; the
   server applies its own chat template) at ``temperature = 0``, at most ``max_new_tokens``
   tokens, cut after its first line (:func:`first_line`: the local harness stops at a newline
   after the answer's first non-blank text).
2. T_eval: the evaluation prompt with the model's own answer as candidate, at most
   ``verdict_max_new_tokens`` tokens, read by :func:`interp.judging.judge.verdict_fields` as a
   local judge's reply is. Where the server scores whole replies
   (:func:`interp.endpoints.scoring.score_replies`), this request is sent with
   ``top_logprobs`` and ``cache_prompt: false`` (the prompt evaluated whole, whatever the slot
   held) on a slot pinned for the example (:meth:`interp.endpoints.client.Endpoint.slot`):
   its reply holds each whole reply's first-token log-prob, and the rest of a reply is one
   token's evaluation on that slot, so the forced choice adds no second prompt evaluation;
   the record gets ``logprob_correct``,
   ``logprob_incorrect``, ``logit_diff``, ``p_correct`` and ``verdict_coverage`` exactly as
   in-process (:class:`interp.judging.verdict.VerdictScores`); otherwise none of them and
   ``verdict_score: "unavailable"``, so ``EA_forced`` is reported as unavailable, never as 0
   (:func:`interp.methods.asymmetry.group_metrics`).

Records carry no ``prompts`` (no tokens are seen) and no ``verdict_reply_ids``, so the stages
that read a model's internals refuse such a run (:func:`interp.stages.common.load_run_model`).
Every request goes through the run directory's cache (:mod:`interp.endpoints.cache`): a rerun
or a resumed run makes no request twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch

from interp.data import QAExample
from interp.endpoints.client import Endpoint
from interp.endpoints.scoring import TOP_LOGPROBS, score_replies
from interp.judging.grading import BaseOracle
from interp.judging.judge import verdict_fields
from interp.judging.prefill import PromptPass
from interp.judging.prompts import Template, chat_messages
from interp.judging.verdict import VerdictScores

__all__ = ["ChatPrompt", "ServedReplies", "first_line", "oracle_facts", "prompt_version",
           "served_model_info"]


def prompt_version(template: Template) -> str:
    """The template's version in the request cache's keys: its name and a digest of its text."""
    text = "\x1f".join((template.gen_system, template.gen_user, template.eval_system,
                        template.eval_user))
    return f"{template.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def first_line(text: str) -> str:
    """``text`` up to and including its first newline after the first non-blank character.

    The generation stop rule of the in-process harness (:func:`interp.judging.prefill.run_prompts`,
    a newline stop checked on the left-stripped text), applied to a served reply
    that was generated without a server-side stop: leading blank lines are kept and skipped,
    as there.
    """
    lead = len(text) - len(text.lstrip())
    cut = text.find("\n", lead)
    return text if cut < 0 else text[:cut + 1]


def served_model_info(endpoint: Endpoint) -> dict[str, Any]:
    """The manifest's ``model`` entry of a served model (no key)."""
    return {"spec": endpoint.spec, "source": "openai-endpoint", "path": endpoint.base_url,
            "sha256": None, "revision": None, "endpoint": endpoint.config.public(),
            "server": endpoint.known_facts()}


class ChatPrompt(NamedTuple):
    """One prompt of a served model: its chat messages and the template version of its key."""

    messages: list[dict[str, str]]
    prompt_version: str


class ServedReplies:
    """The :class:`interp.methods.asymmetry.ReplySource` of a model behind an endpoint.

    Steps 1 and 3 of the module docstring, one request each per example; everything else is
    :func:`interp.methods.asymmetry.evaluate_examples`. Requests go one after another within a
    call: concurrency comes from calling it on one example at a time in
    :meth:`interp.endpoints.client.Endpoint.map`.

    Args:
        endpoint: the served model (preflighted, with the run directory's cache).
    """

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self.spec = endpoint.spec
        self.capabilities = endpoint.capabilities

    def check(self, template: Template, verdict_max_new_tokens: int,
              max_reasoning_tokens: int) -> None:
        """Nothing to check before a request: the server's tokens are not seen."""

    def gen_prompts(self, template: Template, examples: Mapping[int, QAExample],
                    max_new_tokens: int) -> tuple[dict[int, Any], dict[int, str]]:
        """Step 1's chat messages (:func:`interp.judging.prompts.chat_messages`); none skipped."""
        pv = prompt_version(template)
        return {k: ChatPrompt(chat_messages(template, "gen", context=ex.context,
                                            question=ex.question, reference=_reference(ex)),
                              pv) for k, ex in examples.items()}, {}

    def generate(self, prompts: Mapping[int, Any], *, max_new_tokens: int, batch_size: int,
                 rows: bool, pools: Sequence[str], progress: str | None
                 ) -> dict[int, PromptPass]:
        """Step 1's replies at ``temperature = 0``, each cut after its first line.

        The in-process stop rule (:func:`first_line`): a newline ends the answer only after
        its first non-blank text; a server's newline stop would cut a reply that begins with a
        blank line to ``""``.

        Raises:
            interp.endpoints.client.RequestFailed: a request failed after its retries.
            interp.core.errors.EndpointError: as :meth:`interp.endpoints.client.Endpoint.chat`.
        """
        return {k: PromptPass(text=first_line(self.endpoint.chat(
                    p.messages, prompt_version=p.prompt_version,
                    max_tokens=max_new_tokens)["content"] or "")) for k, p in prompts.items()}

    def judge(self, template: Template, examples: Mapping[int, QAExample],
              candidates: Mapping[int, str], *, verdict_max_new_tokens: int,
              max_reasoning_tokens: int, batch_size: int, rows: bool, pools: Sequence[str],
              progress: str | None) -> tuple[dict[int, Any], dict[int, str],
                                             dict[int, tuple[dict[str, Any], Any]]]:
        """Step 3: the verdict reply and, where the server scores them, both whole replies.

        Raises:
            interp.endpoints.client.RequestFailed, interp.core.errors.EndpointError: as
                :meth:`generate`.
        """
        pv = prompt_version(template)
        scored = bool(self.endpoint.known_facts().get("forced_choice"))
        prompts, judged = {}, {}
        for k, ex in examples.items():
            ev = chat_messages(template, "eval", context=ex.context, question=ex.question,
                               answer=candidates[k], reference=_reference(ex))
            prompts[k] = ChatPrompt(ev, pv)
            if not scored:
                text = self.endpoint.chat(ev, prompt_version=pv,
                                          max_tokens=verdict_max_new_tokens)["content"]
                judged[k] = (verdict_fields(text, candidates[k], self._scores(ev, pv)), None)
                continue
            with self.endpoint.slot() as sid:
                extra = {} if sid is None else {"id_slot": sid}
                r = self.endpoint.chat(ev, prompt_version=pv, max_tokens=verdict_max_new_tokens,
                                       logprobs=True, top_logprobs=TOP_LOGPROBS,
                                       cache_prompt=False, **extra)
                judged[k] = (verdict_fields(r["content"], candidates[k],
                                            self._scores(ev, pv, r, sid)), None)
        return prompts, {}, judged

    def _scores(self, messages: list[dict[str, str]], pv: str,
                reply: dict[str, Any] | None = None, slot: int | None = None
                ) -> dict[str, Any]:
        """The whole-reply verdict score (:func:`interp.endpoints.scoring.score_replies`)."""
        sc = score_replies(self.endpoint, messages, prompt_version=pv, reply=reply, slot=slot)
        if sc is None or "unavailable" in sc:  # no method, or values that are not log-probs
            out: dict[str, Any] = {"verdict_score": "unavailable"}
            if sc is not None:
                out["verdict_score_reason"] = sc["unavailable"]
            return out
        return VerdictScores(torch.tensor([sc["logprob_correct"]], dtype=torch.float64),
                             torch.tensor([sc["logprob_incorrect"]], dtype=torch.float64)
                             ).rows()[0]

    def prompt_fields(self, gen: Any, ev: Any) -> dict[str, Any]:
        """None: a served model's tokens are not seen, so records carry no ``prompts``."""
        return {}


def _reference(ex: QAExample) -> str:
    return ex.answers[0] if ex.answers else ""


def oracle_facts(oracle: BaseOracle) -> dict[str, Any]:
    """Result facts of a served oracle (``oracle_*``), empty for any other oracle."""
    ep = getattr(oracle, "endpoint", None)
    return {f"oracle_{k}": v for k, v in ep.result_facts().items()} if ep is not None else {}
