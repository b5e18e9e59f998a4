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

When a generated reply holds no verdict, the oracle falls back to this forced choice, else to
a constrained choice (:func:`constrained_choice`: ``response_format`` with a JSON schema whose
``verdict`` is the enum ``["Correct", "Incorrect"]``), else to no verdict.
"""

from __future__ import annotations

import json
import math

from interp.core.vocab import VERDICT_WORDS
from interp.endpoints.client import Endpoint, RequestFailed, grammar

__all__ = ["LOGPROB_TOLERANCE", "VERDICT_SCHEMA", "check_logprobs", "constrained_choice",
           "score_replies"]

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


def score_replies(endpoint: Endpoint, messages: list[dict[str, str]], *,
                  prompt_version: str) -> dict[str, float] | None:
    """``log P(reply | messages)`` of both whole replies, or None where the server cannot.

    Args:
        endpoint: a preflighted endpoint.
        messages: the judge's chat messages.
        prompt_version: cache identity of the prompt.

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
        r = endpoint.chat(messages, prompt_version=prompt_version, max_tokens=len(ids) + 1,
                          logprobs=True, grammar=grammar(ids), cache_prompt=False)
        got = (r["logprobs"] or [])[:len(ids)]
        if [t[0] for t in got] != ids:
            raise RequestFailed(f"the forced reply {word!r} came back as "
                                f"{[t[1] for t in got]}")
        per_token[word] = [float(t[2]) for t in got]
        out[key] = math.fsum(per_token[word])
    if reason := check_logprobs(per_token):
        return {"unavailable": reason}
    return out


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
