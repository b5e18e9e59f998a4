"""A llama.cpp server for a GGUF file on the loopback address (``xllamacpp``), for tests and demos.

``xllamacpp`` (PyPI, a prebuilt wheel embedding llama.cpp's OpenAI-compatible server) serves a
GGUF in a child process on ``127.0.0.1``: :class:`LocalServer` starts it on a free port (or a
given one, so a stopped server can be started again at the same base URL and the request
cache's keys still match), waits until ``/v1/models`` answers, and stops it. The child runs
``python -m interp.endpoints.local GGUF --port N --alias NAME --threads T --parallel P``.

Slots (``--parallel P``, llama.cpp's ``n_parallel``): the server answers up to ``P`` requests at
once, batching their tokens into shared forward passes (continuous batching); a request that
finds every slot busy waits for one. The context is split as llama.cpp splits it (its KV cache
is not unified across slots here): each slot holds ``n_ctx // P`` tokens (raised to at least
256 by llama.cpp: ``--n-ctx 128 --parallel 2`` gives two slots of 256), so a prompt and its
reply must fit in that, and a longer one is refused by the server with a 400 ("request (631
tokens) exceeds the available context size (512 tokens)"; the run stops with it in one line
and the fix). The prompt cache is llama.cpp's default (``cache_prompt`` on): a slot
keeps its last prompt's KV cache and a request reuses the longest common prefix with it, a
request going to the idle slot whose cached prompt shares most of it
(``slot_prompt_similarity``); served Study 1's verdict request turns it off and pins a slot,
whose cached prompt the forced choice's continuation then reuses
(:mod:`interp.endpoints.scoring`). Not for production serving.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from interp.core.errors import ConfigError

__all__ = ["MIN_SLOT_CTX", "LocalServer", "check_port", "check_slots", "free_port"]

MIN_SLOT_CTX = 16
"""The fewest tokens of context one slot may hold (``n_ctx // parallel``)."""


def check_slots(n_ctx: int, parallel: int) -> None:
    """Refuse a slot count or a context that leaves a slot less than :data:`MIN_SLOT_CTX` tokens.

    Raises:
        interp.core.errors.ConfigError: one line naming both values and the fix.
    """
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ConfigError(f"--parallel must be a whole number of slots >= 1, not {parallel!r}")
    if n_ctx // parallel < MIN_SLOT_CTX:
        raise ConfigError(f"--n-ctx {n_ctx} over --parallel {parallel} slots leaves each slot "
                          f"{n_ctx // parallel} tokens (at least {MIN_SLOT_CTX}): raise --n-ctx "
                          f"to {MIN_SLOT_CTX * parallel} or more, or lower --parallel")


def check_port(port: int, host: str = "127.0.0.1") -> None:
    """Refuse a port another process listens on, before a server is started on it.

    Binds it for a moment the way a server does (``SO_REUSEADDR``: a port in ``TIME_WAIT``
    after a stopped server is free; one with a listener is not).

    Raises:
        interp.core.errors.ConfigError: one line naming the port and what to do.
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            raise ConfigError(f"port {port} on {host} is not free ({err.strerror or err}): "
                              f"another server listens there; stop it or pass --port with a "
                              f"free one (e.g. --port {free_port()})") from None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalServer:
    """A child process serving one GGUF file (module docstring).

    Args:
        gguf: the model file.
        alias: the model name the server answers to (``openai:ALIAS``).
        port: the port (None: a free one).
        threads: CPU threads of the server.
        n_ctx: context length (tokens), shared by the slots: each holds ``n_ctx // parallel``.
        parallel: slots, requests answered at once (module docstring).
        api_key: a key the server demands (None: none).

    Attributes:
        base_url: ``http://127.0.0.1:PORT/v1``.

    Raises:
        interp.core.errors.ConfigError: ``parallel`` below 1, or slots of fewer than
            :data:`MIN_SLOT_CTX` tokens (:func:`check_slots`).
    """

    def __init__(self, gguf: str | Path, alias: str, *, port: int | None = None,
                 threads: int = 1, n_ctx: int = 4096, parallel: int = 1,
                 api_key: str | None = None):
        check_slots(n_ctx, parallel)
        self.gguf, self.alias, self.threads, self.n_ctx = Path(gguf), alias, threads, n_ctx
        self.parallel = parallel
        self.port = port or free_port()
        self.api_key = api_key
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 300.0) -> LocalServer:
        """Start the child and wait until it answers.

        Raises:
            RuntimeError: it exited or did not answer within ``timeout_s``.
        """
        cmd = [sys.executable, "-m", "interp.endpoints.local", str(self.gguf), "--port",
               str(self.port), "--alias", self.alias, "--threads", str(self.threads),
               "--n-ctx", str(self.n_ctx), "--parallel", str(self.parallel)]
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads)}
        if self.api_key:
            env["INTERP_LOCAL_SERVER_KEY"] = self.api_key  # not on the command line
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the llama.cpp server for {self.gguf} exited "
                                   f"({self.proc.returncode})")
            try:
                if httpx.get(self.base_url + "/models", headers=headers,
                             timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the llama.cpp server for {self.gguf} did not answer in "
                           f"{timeout_s:.0f} s")

    def stop(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL after 10 s)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _serve(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="serve a GGUF with llama.cpp (xllamacpp)")
    p.add_argument("gguf")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--alias", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--parallel", type=int, default=1)
    a = p.parse_args(argv)
    check_slots(a.n_ctx, a.parallel)
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = a.gguf
    params.hostnames = ["127.0.0.1"]
    params.port = a.port
    params.model_alias = {a.alias}
    params.cpuparams.n_threads = a.threads
    params.cpuparams_batch.n_threads = a.threads
    params.n_parallel = a.parallel
    params.kv_unified = False  # each slot n_ctx // parallel tokens, as llama-server -np P
    params.n_ctx = a.n_ctx
    if key := os.environ.get("INTERP_LOCAL_SERVER_KEY"):
        params.api_keys = [key]
    server = xllamacpp.Server(params)  # serves until the process ends
    print(server.listening_address, flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    _serve()
