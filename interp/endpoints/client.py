"""A model behind an OpenAI-compatible chat endpoint: configuration, preflight, cached requests.

A spec ``openai:MODEL`` names the model ``MODEL`` of a chat-completions server
(docs/endpoints.md). Where the server is and how to reach it:

* base URL: the config's ``base_url``, else ``$INTERP_OPENAI_BASE_URL``, else
  ``$OPENAI_BASE_URL``, else the ``openai`` library's default (api.openai.com);
* API key: the variable the config's ``api_key_env`` names, else ``$OPENAI_API_KEY``; a
  key-less local server needs none. The key is handed to the ``openai`` client only: it is
  never put in a request's cache identity, a manifest, a log line or an error message.

Algorithm of :class:`Endpoint`:

1. **Preflight** (:meth:`Endpoint.preflight`, once, before the first record and before any
   local model loads): ``GET /v1/models`` (a wrong URL or key fails here, in seconds, with one
   line), a check that ``MODEL`` is among the served ids (or llama.cpp's aliases), one chat
   request of one token (a wrong model name or a server that cannot chat fails here), and a
   probe of the forced choice (:mod:`interp.endpoints.scoring`). The answers become
   :attr:`Endpoint.facts`: the ``/v1/models`` entry of the model (volatile ``created`` dropped),
   the ``system_fingerprint`` and the forced-choice method, stored in the manifest and compared
   like any result fact.
2. **Requests** (:meth:`Endpoint.chat`): ``temperature = 0`` and the config's ``seed``; the
   request's identity goes through the run directory's cache
   (:class:`interp.endpoints.cache.RequestCache`) first. A miss is sent with the ``openai``
   client, which retries connection errors, timeouts, 408, 409, 429 (after ``Retry-After``) and
   5xx with exponential backoff, ``max_retries`` times, each try bounded by ``timeout_s`` in
   all (:class:`DeadlineTransport`: a server that trickles its reply a few bytes at a time
   cannot stretch a try, as httpx's per-read timeout alone would let it); a
   200 reply with a malformed body or no choices is retried the same number of times here. A
   401/403 (key) or 404 (model) stops the run at once; any other failure after the retries
   counts against ``max_error_rate``: once ``failed > max_error_rate * max(requests, 20)``
   the run stops with one line (the caller keeps every record finished before).
3. **Concurrency** (:meth:`Endpoint.map`): at most ``concurrency`` items (a served Study 1
   example: its requests one after another) in flight, results in the items' order; a
   server answers them at once only with as many slots (``interp serve --parallel N``).

Reference: the OpenAI chat-completions API as served by llama.cpp's ``llama-server`` and vLLM
(docs/endpoints.md lists what each gives).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Any
from urllib.parse import urlsplit

import httpx

from interp.core.capabilities import SERVED, SERVED_PREFIX, is_served
from interp.core.errors import ConfigError, EndpointError
from interp.core.vocab import VERDICT_WORDS
from interp.endpoints.cache import RequestCache, request_key

__all__ = ["FORCED_METHOD", "PREFIX", "ROUTING_PARAMS", "DeadlineTransport", "Endpoint",
           "EndpointConfig", "RequestFailed", "grammar", "is_endpoint_spec", "probe_forced_choice",
           "without_system_role"]

class DeadlineTransport(httpx.BaseTransport):
    """An httpx transport that bounds a whole request, reply body included, by ``deadline_s``.

    httpx's timeouts are per operation (connect, each read, each write): a server that sends
    a byte every second never trips a 1-second read timeout, and one try lasts as long as the
    reply takes. This transport starts a clock when the request is sent and raises
    :class:`httpx.ReadTimeout` (which the ``openai`` client retries like any timeout) as soon
    as the headers, or any later chunk of the body, arrive after ``deadline_s`` seconds.
    (httpx has no total timeout of its own: encode/httpx discussion #1450.)

    Args:
        deadline_s: the longest one try may take, seconds.
        inner: the transport that sends (default ``httpx.HTTPTransport()``).
    """

    def __init__(self, deadline_s: float, inner: httpx.BaseTransport | None = None):
        self.deadline_s = float(deadline_s)
        self.inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; its reply's body stream raises once the deadline has passed."""
        start = time.monotonic()
        response = self.inner.handle_request(request)
        self._check(start, request)
        stream = response.stream
        transport = self

        class _Stream(httpx.SyncByteStream):
            def __iter__(self):
                for chunk in stream:
                    transport._check(start, request)
                    yield chunk

            def close(self):
                stream.close()

        response.stream = _Stream()
        return response

    def _check(self, start: float, request: httpx.Request) -> None:
        if time.monotonic() - start > self.deadline_s:
            raise httpx.ReadTimeout(f"the whole request took over {self.deadline_s:g} s",
                                    request=request)

    def close(self) -> None:
        """Close the inner transport."""
        self.inner.close()


ROUTING_PARAMS = ("id_slot",)
"""Request fields that say where a request runs, not what it asks: left out of its cache identity
(llama.cpp's ``id_slot`` pins a request to one slot, :meth:`Endpoint.slot`)."""

PREFIX = SERVED_PREFIX
"""The spec prefix of a served model: ``openai:MODEL`` (:mod:`interp.core.capabilities`)."""
FORCED_METHOD = "llama.cpp token grammar, cache_prompt false"
"""The ``forced_choice.method`` of a server that scores whole replies
(:mod:`interp.endpoints.scoring`)."""
MIN_REQUESTS_FOR_RATE = 20
"""The error rate's denominator is at least this many requests (one early failure of a
long run does not stop it)."""


is_endpoint_spec = is_served
"""Whether ``spec`` names a served model (:func:`interp.core.capabilities.is_served`)."""


class RequestFailed(Exception):  # noqa: N818 - a request outcome, not an interp input error
    """One request failed after its retries (counted; the caller leaves its record undone)."""


@dataclass(frozen=True)
class EndpointConfig:
    """How to reach one served model (module docstring; a config table's keys).

    Attributes:
        model: the served model's name (``MODEL`` of ``openai:MODEL``).
        base_url: the server's OpenAI base URL (e.g. ``http://127.0.0.1:8080/v1``); None: from
            the environment.
        api_key_env: the environment variable holding the key (None: ``OPENAI_API_KEY``).
        concurrency: items of :meth:`Endpoint.map` in flight at once (>= 1): a served
            Study 1's examples, each its requests one after another (``--concurrency``).
        timeout_s: seconds one try of a request may take in all, reply body included
            (:class:`DeadlineTransport`).
        max_retries: retries of a failed try (connection errors, timeouts, 408/409/429/5xx,
            malformed replies).
        max_error_rate: share of failed requests that stops the run (0 to 1).
        seed: sent with every request (servers that take one sample reproducibly); None: none.
        system_role: False for a server whose chat template rejects the system role ("System
            role not supported"): a system message is sent as the start of the first user
            message instead (the system text, a blank line, then the user's).
        cache_prompt: llama.cpp's per-request ``cache_prompt``. None: not sent (the server's
            default: llama.cpp reuses the longest prefix a slot's last prompt shares with the
            request, so a reply can depend on what that slot answered before, docs/endpoints.md);
            False: sent with every chat request, so each prompt is evaluated whole (the forced
            choice's requests and served Study 1's verdict request always send False). Part of
            each request's cache identity when given.
    """

    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    concurrency: int = 4
    timeout_s: float = 60.0
    max_retries: int = 4
    max_error_rate: float = 0.05
    seed: int | None = 0
    system_role: bool = True
    cache_prompt: bool | None = None

    @classmethod
    def from_spec(cls, spec: str, table: Mapping[str, Any] | None = None,
                  where: str = "endpoint") -> EndpointConfig:
        """Build from ``openai:MODEL`` and an optional table of the other fields.

        Raises:
            ConfigError: not an ``openai:`` spec, an empty model name, an unknown key, or a
                value out of range (named with ``where``).
        """
        if not is_endpoint_spec(spec) or not spec.removeprefix(PREFIX).strip():
            raise ConfigError(f"{where}: {spec!r} is not openai:MODEL")
        table = dict(table or {})
        known = {f.name for f in fields(cls)} - {"model"}
        if unknown := set(table) - known:
            raise ConfigError(f"[{where}]: unknown keys {sorted(unknown)}; known: "
                              f"{sorted(known)}")
        cfg = cls(model=spec.removeprefix(PREFIX), **table)
        for name, ok in (("concurrency", isinstance(cfg.concurrency, int) and
                          cfg.concurrency >= 1),
                         ("timeout_s", isinstance(cfg.timeout_s, int | float) and
                          cfg.timeout_s > 0),
                         ("max_retries", isinstance(cfg.max_retries, int) and
                          cfg.max_retries >= 0),
                         ("max_error_rate", isinstance(cfg.max_error_rate, int | float) and
                          0 <= cfg.max_error_rate <= 1),
                         ("system_role", isinstance(cfg.system_role, bool)),
                         ("cache_prompt", cfg.cache_prompt is None or
                          isinstance(cfg.cache_prompt, bool))):
            if not ok:
                raise ConfigError(f"[{where}] {name} = {getattr(cfg, name)!r} is out of range")
        _api_key(cfg)   # a missing key fails here, before any model loads, not at the preflight
        return cfg

    def resolved_base_url(self) -> str:
        """The base URL (module docstring), without a trailing slash."""
        url = (self.base_url or os.environ.get("INTERP_OPENAI_BASE_URL")
               or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1")
        return url.rstrip("/")

    def key_variable(self) -> str:
        """The name of the environment variable the key is read from."""
        return self.api_key_env or "OPENAI_API_KEY"

    def public(self) -> dict[str, Any]:
        """The config as stored in a manifest: the resolved base URL, no key."""
        return {**asdict(self), "base_url": self.resolved_base_url()}


OPENAI_HOST = "api.openai.com"
"""The host whose requests always need a key (a local server needs none)."""


def _api_key(cfg: EndpointConfig) -> str:
    """The key to send: the variable :meth:`EndpointConfig.key_variable` names, else "no-key".

    Raises:
        EndpointError: ``api_key_env`` names an unset variable, or the base URL is OpenAI's
            (the default) and ``$OPENAI_API_KEY`` is not set.
    """
    var = cfg.key_variable()
    key = os.environ.get(var)
    if cfg.api_key_env and not key:
        raise EndpointError(f"api_key_env names {var}, which is not set: export it or drop "
                            f"api_key_env for a key-less server")
    url = cfg.resolved_base_url()
    if not key and urlsplit(url).hostname == OPENAI_HOST:
        raise EndpointError(f"{var} is not set, and {url} needs a key: export {var}, or set "
                            f"base_url (or $INTERP_OPENAI_BASE_URL) to a local server")
    return key or "no-key"  # the openai client insists on a string; local servers ignore it


class Endpoint:
    """A served model: preflight, cached chat requests, error accounting (module docstring).

    Args:
        config: where and how to reach it.
        cache: the run directory's request cache (default: in memory only).

    Attributes:
        facts: what the preflight learnt (None before it ran).
        requests: requests sent (cache misses); failed: those that failed after retries.
    """

    def __init__(self, config: EndpointConfig, cache: RequestCache | None = None):
        import openai

        self.config = config
        self.base_url = config.resolved_base_url()
        self.cache = cache if cache is not None else RequestCache(None)
        self._key = _api_key(config)
        self._client = openai.OpenAI(
            base_url=self.base_url, api_key=self._key, max_retries=config.max_retries,
            timeout=config.timeout_s,
            http_client=httpx.Client(transport=DeadlineTransport(config.timeout_s),
                                     timeout=config.timeout_s))
        self._lock = threading.Lock()
        self.requests = self.failed = 0
        self.facts: dict[str, Any] | None = None
        self._assumed: dict[str, Any] | None = None  # the cache's facts, taken without a request
        self._last_error: tuple[int, str] | None = None
        self._same = 0  # failures in a row with the message _last_error
        self._slots: queue.Queue[int] | None = None  # free llama.cpp slot ids (Endpoint.slot)
        self._nslots = 0
        self._raw: httpx.Client | None = None  # the server's own routes (continue_forced)

    def __repr__(self) -> str:
        return f"Endpoint({self.config.model!r} at {self.base_url!r})"

    capabilities = SERVED
    """What it can do (:mod:`interp.core.capabilities`): replies and log-probs, no internals."""

    @property
    def spec(self) -> str:
        """``openai:MODEL``."""
        return PREFIX + self.config.model

    # -- preflight ------------------------------------------------------------------------
    def preflight(self) -> dict[str, Any]:
        """Step 1 of the module algorithm; returns (and keeps) :attr:`facts`.

        Raises:
            EndpointError: the server cannot be reached, refuses the key, does not serve the
                model or cannot answer a chat request (one line, no key in it).
        """
        if self.facts is not None:
            return self.facts
        quick = self._client.with_options(max_retries=1, timeout=min(self.config.timeout_s,
                                                                     15.0))
        try:
            listed = quick.models.list()
            served = [m.model_dump() for m in listed.data]
        except Exception as err:  # noqa: BLE001 - every failure becomes one line
            raise self._fatal(err, "GET /models") from None
        names = {m.get("id") for m in served} | {a for m in served for a in
                                                 (m.get("aliases") or [])}
        if served and self.config.model not in names:
            raise EndpointError(f"{self.base_url} does not serve model {self.config.model!r}; "
                                f"it serves {sorted(n for n in names if n)}")
        try:
            r = quick.chat.completions.create(
                model=self.config.model, messages=[{"role": "user", "content": "Say OK."}],
                max_tokens=1, temperature=0)
        except Exception as err:  # noqa: BLE001
            raise self._fatal(err, "a one-token chat request") from None
        if not r.choices:
            raise EndpointError(f"{self.base_url}: a chat request to {self.config.model!r} "
                                f"came back with no choices; is it a chat model?")
        entry = [{k: v for k, v in m.items() if k != "created"} for m in served
                 if self.config.model in {m.get("id"), *(m.get("aliases") or [])}]
        self.facts = {"base_url": self.base_url, "model": self.config.model,
                      "models": entry or served, "system_fingerprint": r.system_fingerprint}
        self.facts["forced_choice"] = probe_forced_choice(self)
        if self._assumed is not None and _result_fields(self._assumed) != _result_fields(
                self.facts):
            raise EndpointError(
                f"{self.base_url} now reports other facts than the run's cached ones "
                f"({_result_fields(self._assumed)} -> {_result_fields(self.facts)}): the cached "
                f"replies came from another server or model; rerun with --overwrite (or into "
                f"a new --out) to redo them against this one")
        self.cache.put(self._facts_key, {"preflight": self.base_url,
                                         "model": self.config.model}, self.facts, replace=True)
        return self.facts

    @property
    def _facts_key(self) -> str:
        return request_key({"preflight": self.base_url, "model": self.config.model})

    def known_facts(self) -> dict[str, Any]:
        """The preflight's facts: this object's, else the run's last (cached), else a preflight.

        A rerun answered from the cache learns from it whether the server scores whole
        replies, with no request: a fully cached run needs no server. When a request is then
        sent after all, its preflight must find the same facts (else :meth:`preflight` refuses
        in one line: the cached replies are another server's).
        """
        if self.facts is not None:
            return self.facts
        if (cached := self.cache.peek(self._facts_key)) is not None:
            self._assumed = cached
            return cached
        return self.preflight()

    def result_facts(self) -> dict[str, Any]:
        """The facts a changed server changes (stored work under other ones is refused).

        From :meth:`known_facts`: the cache's when it has them, so checking a finished run
        sends no request.
        """
        return _result_fields(self.known_facts())

    def _fatal(self, err: Exception, what: str) -> EndpointError:
        """One line for a failed preflight step (never the key or the server's body)."""
        import openai

        var = self.config.key_variable()
        if isinstance(err, openai.AuthenticationError | openai.PermissionDeniedError):
            return EndpointError(f"{self.base_url} refused the API key ({err.status_code}) on "
                                 f"{what}: set the right key in ${var}")
        if isinstance(err, openai.NotFoundError):
            return EndpointError(f"{self.base_url}: 404 on {what}: check the base URL (it "
                                 f"usually ends in /v1) and the model name "
                                 f"{self.config.model!r}")
        if isinstance(err, openai.APIStatusError):
            return EndpointError(f"{self.base_url} answered {err.status_code} on {what} for "
                                 f"model {self.config.model!r}")
        return EndpointError(f"cannot reach {self.base_url} ({type(err).__name__}) on {what}: "
                             f"check base_url, $INTERP_OPENAI_BASE_URL or $OPENAI_BASE_URL")

    # -- requests -------------------------------------------------------------------------
    def chat(self, messages: list[dict[str, str]], *, prompt_version: str,
             max_tokens: int, **params: Any) -> dict[str, Any]:
        """One chat completion at temperature 0, from the cache when it holds it.

        Args:
            messages: the chat messages.
            prompt_version: the version of the prompt that made the messages (cache identity).
            max_tokens: reply cap (tokens).
            **params: further request fields (``stop``, ``logprobs``, ``response_format``;
                server options such as llama.cpp's ``grammar`` and ``cache_prompt`` go in the
                body as given).

        Returns:
            ``{"content", "finish_reason", "logprobs" ([[token id or None, token, logprob],
            ...] or None), "system_fingerprint"}``, and ``"top_logprobs"`` (per reply token,
            ``[[token id or None, logprob], ...]``) when ``top_logprobs`` was asked for.

        Raises:
            RequestFailed: the request failed after its retries (counted).
            EndpointError: a 401/403/404, or the failures passed ``max_error_rate``.
        """
        if not self.config.system_role:
            messages = without_system_role(messages)
        body = {"temperature": 0, "max_tokens": max_tokens, **params}
        if self.config.cache_prompt is not None:
            body.setdefault("cache_prompt", self.config.cache_prompt)
        if self.config.seed is not None:
            body["seed"] = self.config.seed
        ident = {"base_url": self.base_url, "model": self.config.model, "messages": messages,
                 "params": {k: v for k, v in body.items() if k not in ROUTING_PARAMS},
                 "prompt_version": prompt_version}
        key = request_key(ident)
        if (hit := self.cache.get(key)) is not None:
            return hit
        self.preflight()
        with self._lock:
            self.requests += 1
        try:
            out = self._send(messages, body)
        except RequestFailed as err:
            self._count_failure(str(err))
            raise
        self.cache.put(key, ident, out)
        return out

    @contextmanager
    def slot(self) -> Iterator[int | None]:
        """A llama.cpp slot held for one example's requests (``id_slot``), given back after.

        The server's slot count comes from its ``GET /props`` (``total_slots``), asked once;
        the ids ``0 .. total_slots - 1`` are dealt out to the callers in flight, and a caller
        waits while all are held (``concurrency`` above the slot count). Pinning keeps an
        example's requests on the slot whose KV cache holds its prompt
        (:meth:`continue_forced`); it changes no reply (:data:`ROUTING_PARAMS`).

        Yields:
            The slot id, or None when the server does not say how many slots it has (not
            llama.cpp): nothing is pinned then.
        """
        with self._lock:
            if self._slots is None:
                self._slots = queue.Queue()
                for i in range(self._total_slots()):
                    self._slots.put(i)
                self._nslots = self._slots.qsize()
        if not self._nslots:
            yield None
            return
        sid = self._slots.get()
        try:
            yield sid
        finally:
            self._slots.put(sid)

    def _total_slots(self) -> int:
        try:
            n = self._raw_client().get("/props").json().get("total_slots")
        except (httpx.HTTPError, ValueError, AttributeError):
            return 0
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0

    def _raw_client(self) -> httpx.Client:
        """An httpx client for the server's own routes (llama.cpp's, beside ``/v1``).

        One per endpoint: the preflight's probe, the slot count and :meth:`continue_forced`.
        """
        if self._raw is None:
            self._raw = httpx.Client(
                base_url=_root(self), headers={"Authorization": f"Bearer {self._key}"},
                timeout=self.config.timeout_s,
                transport=DeadlineTransport(self.config.timeout_s))
        return self._raw

    def continue_forced(self, messages: list[dict[str, str]], prefix: list[int],
                        forced: list[int], *, prompt_version: str,
                        slot: int | None) -> list[float] | None:
        """Log-probs of the tokens ``forced`` after the chat prompt continued by ``prefix``.

        Evaluated on a llama.cpp slot that already holds the prompt's KV cache, so the server
        evaluates only ``prefix``: llama.cpp's ``POST /completion`` with the prompt as token ids
        (the server's own ``/apply-template`` and ``/tokenize``, as its chat route renders and
        tokenizes), ``cache_prompt`` on, ``id_slot = slot``, ``forced`` imposed by a token
        grammar (:func:`grammar`), ``n_probs`` 1. Called by
        :func:`interp.endpoints.scoring.score_replies` right after the verdict request
        evaluated the whole prompt on ``slot``: a forced request that evaluates the prompt
        whole and then decodes ``prefix`` token by token runs the same forwards, so the values
        are its values (a one-token ``prefix``: the same single-token forward). The server's
        ``timings.prompt_n`` says what it evaluated; any other count than ``len(prefix)`` (the
        slot held another prompt: a reply read from the request cache, another caller's
        request) discards the values, uncached, and returns None: the caller then sends the
        whole forced request.

        Args:
            messages: the chat messages of the prompt.
            prefix: reply tokens after the prompt (ids), evaluated here.
            forced: reply tokens after ``prefix`` whose log-probs are returned.
            prompt_version: cache identity of the prompt.
            slot: the llama.cpp slot (:meth:`slot`), or None (the server picks one).

        Returns:
            One log-prob (nats) per token of ``forced``, from the request cache when it holds
            them; None as above.

        Raises:
            RequestFailed: the request failed (counted), or the reply's tokens are not
                ``forced``.
            EndpointError: the failures passed ``max_error_rate``.
        """
        if not self.config.system_role:
            messages = without_system_role(messages)
        ident = {"base_url": self.base_url, "model": self.config.model, "messages": messages,
                 "continue": [int(t) for t in prefix], "forced": [int(t) for t in forced],
                 "prompt_version": prompt_version}
        key = request_key(ident)
        if (hit := self.cache.get(key)) is not None:
            return hit["logprobs"]
        self.preflight()
        with self._lock:
            self.requests += 1
        raw = self._raw_client()
        try:
            text = raw.post("/apply-template", json={"messages": messages}
                            ).raise_for_status().json()["prompt"]
            ids = raw.post("/tokenize", json={"content": text, "add_special": True,
                                              "parse_special": True}
                           ).raise_for_status().json()["tokens"]
            body = {"prompt": [*ids, *ident["continue"]], "n_predict": len(forced),
                    "temperature": 0, "grammar": grammar(ident["forced"]), "n_probs": 1,
                    "cache_prompt": True}
            if slot is not None:
                body["id_slot"] = slot
            r = raw.post("/completion", json=body).raise_for_status().json()
            got = r["completion_probabilities"][:len(forced)]
            evaluated = (r.get("timings") or {}).get("prompt_n")
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
            failure = f"{type(err).__name__}: {err}".replace(self._key, "***")
            self._count_failure(failure)
            raise RequestFailed(failure) from None
        if [p.get("id") for p in got] != ident["forced"]:
            raise RequestFailed(f"the forced continuation came back as "
                                f"{[p.get('token') for p in got]}")
        if evaluated != len(prefix):
            return None
        out = [float(p["logprob"]) for p in got]
        self.cache.put(key, ident, {"logprobs": out})
        return out

    def _send(self, messages: list[dict[str, str]], body: dict[str, Any]) -> dict[str, Any]:
        import openai

        std = {"temperature", "max_tokens", "seed", "stop", "logprobs", "top_logprobs",
               "response_format"}
        kwargs = {k: v for k, v in body.items() if k in std}
        extra = {k: v for k, v in body.items() if k not in std}
        last: Exception | None = None
        # a feature the server may not have (a JSON schema, a token grammar): its 4xx says so,
        # and the caller falls back (interp.endpoints.scoring)
        optional = "response_format" in body or "grammar" in body
        for attempt in range(self.config.max_retries + 1):
            try:
                r = self._client.chat.completions.create(
                    model=self.config.model, messages=messages, extra_body=extra or None,
                    **kwargs)
                if not getattr(r, "choices", None):
                    raise ValueError("a reply with no choices")
                return _reply(r)
            except (openai.AuthenticationError, openai.PermissionDeniedError,
                    openai.NotFoundError) as err:
                raise self._fatal(err, "a chat request") from None
            except openai.APIStatusError as err:  # a 4xx, or a 5xx the client retried
                if 400 <= err.status_code < 500 and err.status_code not in (408, 409, 429) \
                        and not optional:
                    raise self._refused(err) from None  # the same request fails every time
                last = err
                self._repeat(err)
                break
            except openai.APIError as err:  # a connection failure the client retried
                last = err
                break
            except (ValueError, TypeError, AttributeError) as err:  # malformed body: retry
                last = err
                time.sleep(min(0.5 * 2 ** attempt, 8.0))
        raise RequestFailed(f"{type(last).__name__}: {_status(last)}")

    def _refused(self, err: Any) -> EndpointError:
        """One line for a request the server refuses as such: its own message, and the fix."""
        msg = _server_message(err, self._key)
        return EndpointError(f"{self.base_url} refused a chat request to model "
                             f"{self.config.model!r} ({err.status_code}: {msg}); finished "
                             f"records are kept.{_fix(msg)}")

    def _repeat(self, err: Any) -> None:
        """Stop at the third failure in a row with the same 5xx message: it is not transient."""
        msg = (err.status_code, _server_message(err, self._key))
        with self._lock:
            same = self._last_error == msg
            self._last_error, self._same = msg, (self._same + 1 if same else 1)
            again = self._same
        if again >= 3:
            raise self._refused(err)

    def _count_failure(self, failure: str) -> None:
        """Count a failed request; past ``max_error_rate``, stop in one line naming the last.

        Args:
            failure: the last failure (``RequestFailed``'s text: its kind and detail, e.g.
                ``APITimeoutError: Request timed out.``), whatever it was.
        """
        with self._lock:
            self.failed += 1
            failed, n = self.failed, self.requests
        if failed > self.config.max_error_rate * max(n, MIN_REQUESTS_FOR_RATE):
            status = self._last_error
            hint = _fix(status[1] if status else "")
            if "Timeout" in failure.partition(":")[0]:
                hint += (f" A client timeout: each try may take timeout_s = "
                         f"{self.config.timeout_s:g} s; a slow or loaded server needs more "
                         f"(--timeout-s, or timeout_s in the endpoint table).")
            raise EndpointError(f"{failed} of {n} requests to {self.base_url} failed (the last: "
                                f"{failure}), more than max_error_rate "
                                f"{self.config.max_error_rate}; finished records are kept: fix "
                                f"the server and run again to resume.{hint}")

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any],
            done: Callable[[], None] | None = None) -> list[Any]:
        """``fn`` over ``items``, at most ``concurrency`` in flight, results in ``items``' order.

        A thread pool of ``concurrency`` workers (the ``openai`` client and
        :class:`interp.endpoints.cache.RequestCache` are thread-safe). Each result is
        ``fn(item)``, or the :class:`RequestFailed` or :class:`interp.core.errors.EndpointError`
        it raised (that item is left undone), so the caller keeps every finished item before it
        stops. After the first ``EndpointError`` (a refused key, model or request; the error
        rate passed) no further item is started: those not started get the same error, and
        only the requests already in flight are waited for (each bounded by ``timeout_s``). An
        exception of another kind, or an interrupt, cancels the items not started and is
        raised.

        Args:
            fn: the work of one item (e.g. one example's requests, one after another).
            items: the items.
            done: called once per finished item (result or error), one call at a time, from
                the worker threads (a progress bar's ``update(1)``).
        """
        stop: list[EndpointError] = []
        tick = threading.Lock()

        def one(item: Any) -> Any:
            try:
                if stop:
                    return stop[0]
                try:
                    return fn(item)
                except RequestFailed as err:
                    return err
                except EndpointError as err:
                    stop.append(err)
                    return err
            finally:
                if done is not None:
                    with tick:
                        done()

        pool = ThreadPoolExecutor(max_workers=self.config.concurrency)
        try:
            futures = [pool.submit(one, item) for item in items]
            return [f.result() for f in futures]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _fix(message: str) -> str:
    """The fix a server's error message points to, as a sentence (or "")."""
    m = message.lower()
    if "system" in m and "role" in m:
        return (" Set system_role = false in the endpoint table: the system prompt then goes "
                "at the start of the user message.")
    if "exceeds the available context size" in m:  # llama.cpp: one slot's context is too small
        return (" A llama.cpp server's slot holds its context divided by its slots: start it "
                "with a larger --n-ctx or fewer --parallel slots (interp serve), or ask for "
                "shorter prompts or replies.")
    return ""


def without_system_role(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The messages with their system message put at the start of the first user message.

    For servers whose chat template rejects the system role (``system_role = false``).
    """
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if system:
        first = next((m for m in rest if m["role"] == "user"), None)
        if first is None:
            rest.insert(0, {"role": "user", "content": system})
        else:
            first["content"] = f"{system}\n\n{first['content']}"
    return rest


def _server_message(err: Any, key: str | None = None) -> str:
    """The server's error message in one line (at most 200 characters; never the key)."""
    body = getattr(err, "body", None)
    msg = body.get("message") or body.get("error") if isinstance(body, dict) else body
    if isinstance(msg, dict):
        msg = msg.get("message") or str(msg)
    text = " ".join(str(msg or getattr(err, "message", "") or err).split())
    if key:
        text = text.replace(key, "***")
    return text[:200]


def _status(err: Exception | None) -> str:
    code = getattr(err, "status_code", None)
    return f"status {code}: {_server_message(err)}" if code else (
        str(err).splitlines()[0][:120] if err else "?")


def _reply(r: Any) -> dict[str, Any]:
    """The parts of a chat completion a study keeps (JSON-safe)."""
    ch = r.choices[0]
    lps = None
    content = getattr(ch.logprobs, "content", None) if ch.logprobs is not None else None
    top = None
    if content:
        lps = [[_token_id(t), t.token, float(t.logprob)] for t in content]
        if any(getattr(t, "top_logprobs", None) for t in content):
            top = [[[_token_id(x), float(x.logprob)] for x in (t.top_logprobs or [])]
                   for t in content]
    out = {"content": ch.message.content or "", "finish_reason": ch.finish_reason,
           "logprobs": lps, "system_fingerprint": r.system_fingerprint}
    if top is not None:
        out["top_logprobs"] = top
    return out


def _token_id(t: Any) -> int | None:
    """A returned token's id (llama.cpp's ``id``, outside the OpenAI schema), or None."""
    tid = getattr(t, "id", None)
    return tid if tid is not None else (getattr(t, "model_extra", None) or {}).get("id")


def _root(endpoint: Endpoint) -> str:
    url = endpoint.base_url
    return url[:-3] if url.endswith("/v1") else url


def _result_fields(f: Mapping[str, Any]) -> dict[str, Any]:
    """The facts that change a result (:meth:`Endpoint.result_facts`)."""
    return {"endpoint_model": f["model"], "endpoint_models": f["models"],
            "system_fingerprint": f["system_fingerprint"],
            "forced_choice": (f["forced_choice"] or {}).get("method")}


def _server_reply_ids(endpoint: Endpoint, client: httpx.Client, word: str) -> list[int]:
    """The reply's token ids under the server's template (module docstring)."""
    msgs = [{"role": "user", "content": "X"}]
    head = client.post("/apply-template", json={"messages": msgs}).json()["prompt"]
    full = client.post("/apply-template", json={
        "messages": [*msgs, {"role": "assistant", "content": word}]}).json()["prompt"]
    if not full.startswith(head) or not full[len(head):].startswith(word):
        raise ValueError(f"the server's template does not continue with {word!r}")

    def tok(text: str) -> list[dict[str, Any]]:
        return client.post("/tokenize", json={"content": text, "with_pieces": True,
                                              "add_special": False,
                                              "parse_special": True}).json()["tokens"]

    h, f = tok(head), tok(full[:len(head) + len(word)])
    if [t["id"] for t in f[:len(h)]] != [t["id"] for t in h]:
        raise ValueError(f"the reply {word!r} merges with the generation prompt")
    reply = f[len(h):]
    if "".join(t["piece"] for t in reply).strip() != word:
        raise ValueError(f"the reply {word!r} does not tokenize on its own")
    return [int(t["id"]) for t in reply]


def probe_forced_choice(endpoint: Endpoint) -> dict[str, Any] | None:
    """Whether the server scores whole replies; the method and reply tokens, or None.

    Called by :meth:`Endpoint.preflight` (its requests are not cached and not counted);
    the method: :mod:`interp.endpoints.scoring`.
    """
    client = endpoint._raw_client()
    try:
        ids = {w: _server_reply_ids(endpoint, client, w) for w in VERDICT_WORDS}
        body = {"model": endpoint.config.model, "temperature": 0, "max_tokens": 8,
                "logprobs": True, "cache_prompt": False, "grammar": grammar(ids["Incorrect"]),
                "messages": [{"role": "user", "content": "Is 2 + 2 = 5?"}]}
        r = client.post("/v1/chat/completions", json=body).json()
        got = r["choices"][0]["logprobs"]["content"][:len(ids["Incorrect"])]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None
    if [t.get("id") for t in got] != ids["Incorrect"] or \
            not all(isinstance(t.get("logprob"), float) for t in got):
        return None
    return {"method": FORCED_METHOD, "reply_ids": ids}


def grammar(ids: list[int]) -> str:
    """A llama.cpp GBNF grammar that allows exactly the token ids ``ids``, in order."""
    return "root ::= " + " ".join(f"<[{i}]>" for i in ids)
