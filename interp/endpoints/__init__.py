"""Models behind an OpenAI-compatible chat endpoint: an LLM oracle and Study 1 of a served model.

* :mod:`interp.endpoints.client`: ``openai:MODEL`` specs, :class:`EndpointConfig`,
  :class:`Endpoint` (preflight, retries, bounded concurrency, error rate);
* :mod:`interp.endpoints.cache`: the run directory's append-only request cache;
* :mod:`interp.endpoints.scoring`: the forced choice between the two whole verdict replies
  from the server's log-probs, and the constrained (JSON-schema) choice;
* :mod:`interp.endpoints.oracle`: :class:`EndpointOracle`;
* :mod:`interp.endpoints.study`: Study 1 of a served model.

Usage and what each server gives: docs/endpoints.md. Importing this package imports the
request cache (standard library and ``filelock`` only) and none of the other modules: each of
their names loads on first use, as they import ``httpx`` or torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from interp.endpoints.cache import CACHE_FILE, RequestCache, request_key

_HOMES = {
    "PREFIX": "client", "Endpoint": "client", "EndpointConfig": "client",
    "RequestFailed": "client", "is_endpoint_spec": "client",
    "EndpointOracle": "oracle", "endpoint_for": "oracle",
    "ServedReplies": "study", "oracle_facts": "study", "served_model_info": "study",
}

__all__ = ["CACHE_FILE", "RequestCache", "request_key", *sorted(_HOMES)]


def __getattr__(name: str) -> Any:
    """Each name of :data:`_HOMES` from its module, imported on first use.

    So a config's endpoint table is checked without importing ``httpx`` or the study's
    libraries.
    """
    if name not in _HOMES:
        raise AttributeError(f"module 'interp.endpoints' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"interp.endpoints.{_HOMES[name]}"), name)
    globals()[name] = value
    return value
