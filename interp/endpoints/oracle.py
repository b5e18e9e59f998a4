"""The LLM oracle over a chat endpoint (paper section 3.1, ``y* = L*(c, q, a, a*)``).

The same grading prompt as the in-process oracle (:data:`interp.judging.grading.ORACLE_SYSTEM`,
:data:`interp.judging.grading.ORACLE_USER`), sent at ``temperature = 0`` with a seed, and the same
verdict parser (:func:`interp.judging.grading.parse_verdict`). When the reply holds no verdict, in
this order (the grade's ``rule`` says which decided, :attr:`EndpointOracle.counts` counts):

1. ``openai:reply:<reply>``: the reply's verdict;
2. ``openai:forced_choice(p_correct=0.731):<reply>``: the oracle model's forced choice between
   the two whole replies from its log-probs, where the server gives them
   (:func:`interp.endpoints.scoring.score_replies`);
3. ``openai:constrained:<verdict>``: a reply constrained to a JSON-schema enum
   (:func:`interp.endpoints.scoring.constrained_choice`);
4. ``openai:none:<reply>``: no verdict, counted as such (label False: not shown correct).

Unanswerable questions are graded by the rule oracle, as in-process (counted as ``rule``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from interp.endpoints.cache import CACHE_FILE, RequestCache
from interp.endpoints.client import PREFIX, Endpoint, EndpointConfig
from interp.endpoints.scoring import constrained_choice, score_replies
from interp.judging.grading import (
    ORACLE_SYSTEM,
    ORACLE_USER,
    BaseOracle,
    OracleResult,
    parse_verdict,
)
from interp.judging.parsing import strip_reasoning

__all__ = ["ORACLE_PROMPT_VERSION", "EndpointOracle", "endpoint_for", "endpoint_oracle"]

ORACLE_PROMPT_VERSION = "oracle-" + hashlib.sha256(
    (ORACLE_SYSTEM + ORACLE_USER).encode()).hexdigest()[:12]
"""The grading prompt's version in the request cache's keys (changes with its text)."""


class EndpointOracle(BaseOracle):
    """LLM oracle whose model is served behind an OpenAI-compatible endpoint.

    Args:
        endpoint: the served oracle model (:class:`interp.endpoints.client.Endpoint`).
        max_new_tokens: reply cap (tokens), as :class:`interp.judging.grading.ModelOracle`.

    Attributes:
        counts: ``{"reply", "forced_choice", "constrained", "none", "rule"}`` over its grades.
    """

    def __init__(self, endpoint: Endpoint, max_new_tokens: int = 8):
        self.endpoint, self.max_new_tokens = endpoint, max_new_tokens
        self.name = endpoint.spec
        self.counts = {"reply": 0, "forced_choice": 0, "constrained": 0, "none": 0, "rule": 0}

    def grade(self, prediction: str, answers: Sequence[str], *, dataset: str,
              answerable: bool = True, extras: Mapping | None = None) -> OracleResult:
        """Grade with the served model (module docstring for the order of fallbacks).

        ``extras`` must carry the record's ``context`` and ``question``.

        Raises:
            interp.endpoints.client.RequestFailed: a request failed after its retries.
            interp.core.errors.EndpointError: as :meth:`interp.endpoints.client.Endpoint.chat`.
        """
        ruled, msgs = self.rule_first(prediction, answers, dataset=dataset,
                                      answerable=answerable, extras=extras)
        if msgs is None:
            self.counts["rule"] += 1
            return ruled
        kw: dict[str, Any] = {"prompt_version": ORACLE_PROMPT_VERSION}
        text = self.endpoint.chat(msgs, max_tokens=self.max_new_tokens, **kw)["content"]
        verdict, how = parse_verdict(text), "reply"
        if verdict is None and (sc := score_replies(self.endpoint, msgs, **kw)) is not None \
                and "unavailable" not in sc:
            d = sc["logprob_correct"] - sc["logprob_incorrect"]
            p = 1 / (1 + math.exp(-d))
            verdict, how = p > 0.5, f"forced_choice(p_correct={p:.3f})"
        if verdict is None and (c := constrained_choice(self.endpoint, msgs, **kw)) is not None:
            verdict, how = c, "constrained"
            text = "Correct" if c else "Incorrect"
        if verdict is None:
            how = "none"
        self.counts[how.split("(")[0]] += 1
        return OracleResult(label=bool(verdict), em=ruled.em, f1=ruled.f1,
                            rule=f"openai:{how}:{(strip_reasoning(text) or '').strip()[:40]}")


def endpoint_for(spec: str, table: Mapping[str, Any] | None, run: Any, where: str) -> Endpoint:
    """An :class:`Endpoint` for ``openai:MODEL`` with a run directory's request cache.

    Args:
        spec: ``openai:MODEL``.
        table: its config table (:class:`interp.endpoints.client.EndpointConfig`).
        run: the run directory (a :class:`interp.store.RunDir`) whose ``requests.jsonl`` it
            uses; None: an in-memory cache.
        where: the table's name, for messages.

    Raises:
        interp.core.errors.ConfigError: a bad spec or table.
        interp.core.errors.EndpointError: ``api_key_env`` names an unset variable.
    """
    cache = RequestCache(run.path / CACHE_FILE if run is not None else None)
    return Endpoint(EndpointConfig.from_spec(spec, table, where), cache)


def endpoint_oracle(arg: str, *, run: Any = None, endpoint: Mapping[str, Any] | None = None,
                     served: Mapping[str, Endpoint] | None = None, **_: Any) -> BaseOracle:
    """The ``openai`` kind of :data:`interp.judging.grading.ORACLE_KINDS` (preflighted lazily).

    Declared there by name (``"interp.endpoints.oracle:endpoint_oracle"``) and imported when
    an ``openai:MODEL`` oracle is first built.

    Args:
        arg: ``MODEL`` of ``openai:MODEL``.
        run: the run directory whose request cache it uses (None: in memory).
        endpoint: the ``oracle_endpoint`` table (:class:`interp.endpoints.client.EndpointConfig`).
        served: endpoints already open, by spec (reused, not opened twice).

    Returns:
        An :class:`EndpointOracle`.

    Raises:
        interp.core.errors.ConfigError: a bad spec or table.
        interp.core.errors.EndpointError: ``api_key_env`` names an unset variable.
    """
    spec = PREFIX + arg
    ep = (served or {}).get(spec) or endpoint_for(spec, endpoint, run, "oracle_endpoint")
    return EndpointOracle(ep)

