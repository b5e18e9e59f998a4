"""Models behind an OpenAI-compatible chat endpoint: an LLM oracle and Study 1 of a served model.

* :mod:`interp.endpoints.client`: ``openai:MODEL`` specs, :class:`EndpointConfig`,
  :class:`Endpoint` (preflight, retries, bounded concurrency, error rate);
* :mod:`interp.endpoints.cache`: the run directory's append-only request cache;
* :mod:`interp.endpoints.scoring`: the forced choice between the two whole verdict replies
  from the server's log-probs, and the constrained (JSON-schema) choice;
* :mod:`interp.endpoints.oracle`: :class:`EndpointOracle`;
* :mod:`interp.endpoints.study`: Study 1 of a served model.

Usage and what each server gives: docs/endpoints.md.
"""

from interp.endpoints.cache import CACHE_FILE, RequestCache, request_key
from interp.endpoints.client import (
    PREFIX,
    Endpoint,
    EndpointConfig,
    RequestFailed,
    is_endpoint_spec,
)
from interp.endpoints.oracle import EndpointOracle, endpoint_for
from interp.endpoints.study import evaluate_served, oracle_facts, run_served

__all__ = ["CACHE_FILE", "PREFIX", "Endpoint", "EndpointConfig", "EndpointOracle",
           "RequestCache", "RequestFailed", "endpoint_for", "evaluate_served",
           "is_endpoint_spec", "oracle_facts", "request_key", "run_served"]
