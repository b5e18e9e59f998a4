"""The judge's verdict score over an endpoint: both whole replies, from the model's log-probs.

The in-process score (:mod:`interp.judging.verdict`) is ``log P(reply | prompt)`` summed over the
tokens the chat template gives each whole reply ("Correct", "Incorrect"); never the first
sub-token of a word. A server gives the same number where it can be made to emit a chosen
token sequence and report the model's own log-prob of each token:

* **llama.cpp** (``llama-server``, also embedded by ``xllamacpp``): a GBNF grammar of token
  ids (``root ::= <[id1]> <[id2]> ...``) forces the reply token by token, and with
  ``logprobs`` on each returned token carries the log-prob the unconstrained model gave it;
  with the prompt cache off (``cache_prompt: false``) these equal the model's own values
  (docs/endpoints.md, measured against the same GGUF). The reply's tokens come from the
  server's own template and tokenizer (``/apply-template``, ``/tokenize``), as
  :func:`interp.judging.verdict.verdict_replies` takes them from the local ones: render ``[user:
  X]``
  with the generation prompt, and the same chat continued by the reply; the reply's tokens
  are those after the first rendering's.
* vLLM's ``prompt_logprobs`` would give the same numbers; that path is not implemented
  (docs/endpoints.md).

Algorithm of :func:`interp.endpoints.client.probe_forced_choice` (in the preflight): both
reply token lists from the server, then one forced request; the method is available only
when the reply came back as exactly the forced ids, each with a log-prob. Otherwise the
forced-choice fields of Study 1 are absent and EA_forced is reported as unavailable.

Without a second prompt evaluation (:func:`score_replies` given the verdict request's reply):
in served Study 1 the verdict request itself evaluates the prompt whole (``cache_prompt:
false``) with ``top_logprobs``, on a slot pinned for the example. Position 1 of its reply holds
the first token of both whole replies (where each ranks in the top 20), which is the number a
forced request returns for it (the same last row of the same whole-prompt forward). A reply's
later tokens (``Incorrect`` is ``In`` + ``correct`` for SmolLM2) come from the same slot, whose
KV cache still holds the prompt: the prompt plus the reply's first token as token ids, so the
server evaluates that one token, as a forced request's decoding step does. The server's count of
evaluated tokens is checked; where it is not one, or a first token is not among the top 20,
the whole forced request is sent instead. Measured on the bundled SmolLM2 GGUF: the values
equal the whole forced requests' to float32 rounding (docs/endpoints.md).

When a generated reply holds no verdict, the oracle falls back to this forced choice, else to
a constrained choice (:func:`constrained_choice`: ``response_format`` with a JSON schema whose
``verdict`` is the enum ``["Correct", "Incorrect"]``), else to no verdict.
"""

from __future__ import annotations

import json
import math
from typing import Any

from interp.core.vocab import VERDICT_WORDS
from interp.endpoints.client import Endpoint, RequestFailed, grammar

__all__ = ["LOGPROB_TOLERANCE", "TOP_LOGPROBS", "VERDICT_SCHEMA", "check_logprobs",
           "constrained_choice", "reply_logprobs", "score_replies"]

LOGPROB_TOLERANCE = 1e-6
"""Slack for float rounding in :func:`check_logprobs` (nats, and probability mass)."""


def check_logprobs(per_token: dict[str, list[float]]) -> str | None:
    """Why a server's returned log-probs are not log-probabilities of the two replies, or None.

    Each token's value must be finite and at most 0 (a value above 0 is a probability, or a
    score of another kind), and the two whole replies, which exclude each other, must hold at
    most all of the probability: ``exp(lp_correct) + exp(lp_incorrect) <= 1``.

    Args:
        per_token: ``{"Correct": [lp, ...], "Incorrect": [lp, ...]}`` in nats.

    Returns:
        A one-line reason, or None when the values are valid.
    """
    for word, lps in per_token.items():
        bad = [x for x in lps if not math.isfinite(x) or x > LOGPROB_TOLERANCE]
        if bad:
            return (f"the server returned {bad[0]!r} as a log-probability of a {word!r} token "
                    f"(must be finite and <= 0): probabilities or scores of another kind")
    mass = math.fsum(math.exp(math.fsum(lps)) for lps in per_token.values())
    if mass > 1 + LOGPROB_TOLERANCE:
        return (f"the two verdict replies' probabilities sum to {mass:.4g} > 1: the server's "
                f"log-probs are not the model's (a one-token grammar reports 0, for one)")
    return None

VERDICT_SCHEMA = {"type": "json_schema", "json_schema": {
    "name": "verdict", "strict": True,
    "schema": {"type": "object", "additionalProperties": False, "required": ["verdict"],
               "properties": {"verdict": {"type": "string", "enum": list(VERDICT_WORDS)}}}}}
"""``response_format`` of the constrained choice."""


TOP_LOGPROBS = 20
"""Top log-probs asked of the verdict reply per token (the largest ``top_logprobs`` of the
OpenAI API)."""


def reply_logprobs(reply: dict[str, Any] | None, ids: list[int]) -> list[float]:
    """The log-probs of a whole reply's first tokens that a generated reply already holds.

    Position ``i`` of the verdict reply (generated at temperature 0 with ``top_logprobs``)
    carries the model's top log-probs given the prompt and the reply's first ``i`` tokens:
    token ``ids[i]``'s value is there when the reply began with ``ids[:i]`` and ``ids[i]`` is
    among its tops. The values are the same numbers a forced request returns for those tokens
    (the same forwards, measured in docs/endpoints.md).

    Args:
        reply: :meth:`interp.endpoints.client.Endpoint.chat`'s reply, or None.
        ids: the whole reply's token ids.

    Returns:
        The log-probs (nats) of ``ids[:k]`` for the largest such ``k`` (possibly none).
    """
    tops = (reply or {}).get("top_logprobs") or []
    made = [t[0] for t in (reply or {}).get("logprobs") or []]
    out: list[float] = []
    for i, tid in enumerate(ids):
        if i >= len(tops) or made[:i] != ids[:i]:
            break
        lp = next((v for t, v in tops[i] if t == tid), None)
        if lp is None:
            break
        out.append(float(lp))
    return out


def score_replies(endpoint: Endpoint, messages: list[dict[str, str]], *,
                  prompt_version: str, reply: dict[str, Any] | None = None,
                  slot: int | None = None) -> dict[str, float] | None:
    """``log P(reply | messages)`` of both whole replies, or None where the server cannot.

    Each reply's token log-probs come, in this order of preference (all three give the same
    values: docs/endpoints.md):

    1. from ``reply``, the verdict request's own reply when it was generated with
       ``top_logprobs`` after a whole-prompt evaluation (:func:`reply_logprobs`): the first
       token's value always is there when it ranks in the top :data:`TOP_LOGPROBS`;
    2. the rest, after the first token, from a continuation on the slot that holds the prompt
       (:meth:`interp.endpoints.client.Endpoint.continue_forced`: one token evaluated);
    3. otherwise one forced request of the whole reply with ``cache_prompt: false`` (the
       prompt evaluated whole), as when no reply is given.

    Args:
        endpoint: a preflighted endpoint.
        messages: the judge's chat messages.
        prompt_version: cache identity of the prompt.
        reply: the verdict request's reply (top log-probs, ``cache_prompt: false``), or None.
        slot: the llama.cpp slot that evaluated ``reply``'s prompt
            (:meth:`interp.endpoints.client.Endpoint.slot`), or None.

    Returns:
        ``{"logprob_correct", "logprob_incorrect"}`` in nats (the sum over each reply's
        tokens; the end-of-turn token the grammar lets follow is not part of it); None when
        the preflight found no forced choice; ``{"unavailable": reason}`` when the returned
        values are not log-probabilities (:func:`check_logprobs`).

    Raises:
        RequestFailed: a request failed, or a reply came back with other tokens than forced.
    """
    fc = endpoint.known_facts().get("forced_choice")
    if not fc:
        return None
    out, per_token = {}, {}
    for word, key in zip(VERDICT_WORDS, ("logprob_correct", "logprob_incorrect")):
        ids = fc["reply_ids"][word]
        lps = reply_logprobs(reply, ids)
        if lps and len(lps) < len(ids):
            rest = endpoint.continue_forced(messages, ids[:1], ids[1:],
                                            prompt_version=prompt_version, slot=slot)
            lps = [lps[0], *rest] if rest is not None else []
        if not lps:
            lps = _forced(endpoint, messages, ids, word, prompt_version, slot)
        per_token[word] = lps
        out[key] = math.fsum(lps)
    if reason := check_logprobs(per_token):
        return {"unavailable": reason}
    return out


def _forced(endpoint: Endpoint, messages: list[dict[str, str]], ids: list[int], word: str,
            prompt_version: str, slot: int | None) -> list[float]:
    """One whole reply forced after a whole-prompt evaluation: its per-token log-probs."""
    extra = {} if slot is None else {"id_slot": slot}
    r = endpoint.chat(messages, prompt_version=prompt_version, max_tokens=len(ids) + 1,
                      logprobs=True, grammar=grammar(ids), cache_prompt=False, **extra)
    got = (r["logprobs"] or [])[:len(ids)]
    if [t[0] for t in got] != ids:
        raise RequestFailed(f"the forced reply {word!r} came back as "
                            f"{[t[1] for t in got]}")
    return [float(t[2]) for t in got]


def constrained_choice(endpoint: Endpoint, messages: list[dict[str, str]], *,
                       prompt_version: str) -> bool | None:
    """The verdict of a reply constrained to the JSON schema :data:`VERDICT_SCHEMA`.

    Returns:
        True ("Correct"), False ("Incorrect"), or None when the server ignored the schema
        (the reply is not such a JSON object) or refused it (400).

    Raises:
        RequestFailed: a request failed for another reason.
    """
    try:
        r = endpoint.chat(messages, prompt_version=prompt_version, max_tokens=24,
                          response_format=VERDICT_SCHEMA)
    except RequestFailed as err:
        if "status 400" in str(err):
            return None
        raise
    try:
        v = json.loads(r["content"])["verdict"]
    except (ValueError, KeyError, TypeError):
        return None
    return {"Correct": True, "Incorrect": False}.get(v)
