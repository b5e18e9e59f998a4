"""Benchmark: where a served Study 1's server time goes, from llama.cpp's own timings.

Replays the first ``--requests`` chat requests of each ``RUN`` directory's request cache
(``RUN/requests.jsonl``, as sent: messages and parameters; the forced choice's one-token
``/completion`` continuations are not chat requests and are left out) against a fresh one-slot
server of the bundled SmolLM2 GGUF (:class:`interp.endpoints.local.LocalServer`,
``--threads``), one after another, ``--repeats`` times alternating the runs, and prints per
replay the wall seconds and the sums of the server's ``timings``: prompt tokens evaluated
(``prompt_n``) and taken from a slot's cache (``cache_n``), milliseconds of prompt evaluation
(``prompt_ms``) and of decoding (``predicted_ms``), tokens decoded. docs/performance.md reads
from it how much of a served example is prompt evaluation, and what the prompt cache reuses.

    OMP_NUM_THREADS=1 python benchmarks/endpoint_replay.py RUN [RUN ...] [--requests 24]
        [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from interp.endpoints.cache import CACHE_FILE  # noqa: E402
from interp.endpoints.local import LocalServer  # noqa: E402
from interp.models.loading import bundled_gguf  # noqa: E402

TIMINGS = ("prompt_n", "cache_n", "prompt_ms", "predicted_n", "predicted_ms")


def replay(requests: list[dict], threads: int) -> dict[str, float]:
    """The requests one after another on a fresh one-slot server: wall s and timing sums."""
    with LocalServer(bundled_gguf("smollm2-135m-instruct"), "smollm2", threads=threads) as srv:
        tot = dict.fromkeys(("wall_s", *TIMINGS), 0.0)
        for q in requests:
            t0 = time.perf_counter()
            r = httpx.post(srv.base_url + "/chat/completions", timeout=600, json={
                "model": "smollm2", "messages": q["messages"], **q["params"]})
            r.raise_for_status()
            tot["wall_s"] += time.perf_counter() - t0
            for k in TIMINGS:
                tot[k] += r.json()["timings"][k]
    return {k: round(v, 1) for k, v in tot.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    sent = {}
    for run in a.runs:
        rows = [json.loads(line) for line in (Path(run) / CACHE_FILE).read_text().splitlines()]
        sent[run] = [r["request"] for r in rows if "params" in r["request"]][:a.requests]
    for i in range(a.repeats):
        for run, requests in sent.items():
            print(json.dumps({"run": run, "repeat": i, "requests": len(requests),
                              **replay(requests, a.threads)}), flush=True)


if __name__ == "__main__":
    main()
