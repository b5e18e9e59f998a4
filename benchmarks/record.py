"""Benchmark: time, peak memory and bytes of ``interp record`` against a plain forward.

On the bundled SmolLM2-135M-Instruct (float32, CPU), for prompts of 512, 1024 and 2048 tokens
(random token ids; span labels: a context block in the middle, the rest template), measure:

1. ``plain``: ``model(ids, use_cache=False, logits_to_keep=1)`` with SDPA, nothing recorded;
2. ``record_1``: :func:`interp.stages.record.record_prompt` of ONE layer (the last): full
   pattern, ``hook_resid_pre``/``hook_resid_post`` and ``attn.hook_z`` at every position,
   float16, shards of 512 MiB, span-to-span masses;
3. ``record_all``: the same for all 30 layers.

Memory: each (method, length) runs ONCE in a FRESH process, so its peak RSS (``ru_maxrss``)
is its own:
reported as the peak above the process's RSS once the model is loaded and every weight paged
in (a forward on 8 tokens: the cached checkpoint is memory-mapped). ``record_1`` vs
``record_all`` shows whether memory grows with the number of layers recorded (it must not:
each layer's tensors go to disk as they are produced). Time: one more process per length runs
the three methods interleaved round by round, ``--repeats`` rounds after one warm-up each
(the shards removed after every call), and reports medians. Bytes are the shard files
of one prompt (a record = a gen and an eval prompt, about twice that).

Run: ``python benchmarks/record.py [--lengths 512 1024 2048] [--repeats 2] [--threads 1]
[--out FILE.json]``. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

METHODS = ("plain", "record_1", "record_all")


def _rss_mib() -> float:
    """Current resident set size of this process, MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _setup(n: int, threads: int | None) -> tuple[Any, dict[str, Callable[[], int]], Path]:
    """Load the model, build the prompt, and return ``(torch, {method: call}, folder)``.

    A call returns the bytes it wrote (0 for ``plain``) and removes its shards afterwards.
    """
    import torch

    if threads:
        torch.set_num_threads(threads)
    from interp.judging.prompts import RenderedPrompt
    from interp.models.loading import load_model
    from interp.stages.record import RecordConfig, record_prompt

    handle = load_model(device="cpu", dtype="float32")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, len(handle.tokenizer) - 100, (n,), generator=g).tolist()
    labels = ["template"] * n
    labels[n // 8: n // 2] = ["context"] * (n // 2 - n // 8)
    prompt = RenderedPrompt(task="eval", text="", input_ids=ids, char_spans={},
                            token_spans={"context": (n // 8, n // 2)}, labels=labels)
    spans = ["context", "question", "candidate", "template"]
    cfg = RecordConfig(dtype="float16")
    folder = Path(tempfile.mkdtemp(prefix="interp-bench-record-"))

    @torch.no_grad()
    def plain() -> int:
        handle.model(input_ids=torch.tensor(ids)[None], use_cache=False, logits_to_keep=1)
        return 0

    def rec(layers: list[int]) -> Callable[[], int]:
        def call() -> int:
            _, sizes, _ = record_prompt(handle, prompt, cfg, layers, spans, folder, "eval")
            for f in folder.iterdir():
                f.unlink()
            return sum(sizes.values())
        return call

    with torch.no_grad():  # touch every weight (the checkpoint is memory-mapped) on 8 tokens
        handle.model(input_ids=torch.tensor(ids[:8])[None], use_cache=False, logits_to_keep=1)
    calls = {"plain": plain, "record_1": rec([handle.n_layers - 1]),
             "record_all": rec(list(range(handle.n_layers)))}
    return torch, calls, folder


def memory(method: str, n: int, threads: int | None) -> dict:
    """Peak RSS of ONE call of ``method`` in this (fresh) process, and the bytes it wrote."""
    torch, calls, folder = _setup(n, threads)
    rss_loaded = _rss_mib()
    try:
        t = time.perf_counter()
        written = calls[method]()
        cold = time.perf_counter() - t
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"method": method, "tokens": n, "cold_seconds": cold, "peak_rss_mib": peak,
            "rss_after_load_mib": rss_loaded, "peak_above_load_mib": peak - rss_loaded,
            "bytes": written, "threads": torch.get_num_threads()}


def timing(n: int, repeats: int, threads: int | None) -> dict:
    """Median seconds of every method, interleaved round by round after one warm-up each.

    A drifting machine load then hits the methods alike.
    """
    _, calls, folder = _setup(n, threads)
    times: dict[str, list[float]] = {m: [] for m in calls}
    try:
        for fn in calls.values():
            fn()
        for _ in range(repeats):
            for m, fn in calls.items():
                t = time.perf_counter()
                fn()
                times[m].append(time.perf_counter() - t)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {m: statistics.median(v) for m, v in times.items()}


def _child(args: list[str]) -> dict:
    cmd = [sys.executable, __file__, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    """Run the timing and memory processes of every length and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--memory", nargs=2, metavar=("METHOD", "TOKENS"), help=argparse.SUPPRESS)
    ap.add_argument("--timing", type=int, metavar="TOKENS", help=argparse.SUPPRESS)
    args = ap.parse_args()
    extra = ["--threads", str(args.threads)] if args.threads else []
    if args.memory:
        print(json.dumps(memory(args.memory[0], int(args.memory[1]), args.threads)))
        return
    if args.timing:
        print(json.dumps(timing(args.timing, args.repeats, args.threads)))
        return
    results = []
    for n in args.lengths:
        secs = _child(["--timing", str(n), "--repeats", str(args.repeats), *extra])
        for m in METHODS:
            row = {**_child(["--memory", m, str(n), *extra]), "seconds": secs[m]}
            results.append(row)
            print(f"{n:>5} tokens {m:<10} {row['seconds']:8.3f} s  peak RSS "
                  f"{row['peak_rss_mib']:7.0f} MiB (+{row['peak_above_load_mib']:6.0f} above the "
                  f"loaded model)  {row['bytes'] / 2**20:8.1f} MiB on disk", flush=True)
    plain = {r["tokens"]: r["seconds"] for r in results if r["method"] == "plain"}
    print("\ntokens  method      time_s  x_plain  peak_rss_MiB  above_load_MiB  MiB_per_prompt")
    for r in results:
        print(f"{r['tokens']:>6}  {r['method']:<10} {r['seconds']:>7.3f}  "
              f"{r['seconds'] / plain[r['tokens']]:>7.2f}  {r['peak_rss_mib']:>12.0f}  "
              f"{r['peak_above_load_mib']:>14.0f}  {r['bytes'] / 2**20:>14.1f}")
    print(f"\ntorch threads: {results[0]['threads']}; a record = gen + eval prompt (about twice "
          f"the time and bytes of one prompt)")
    if args.out:
        Path(args.out).write_text(json.dumps({"results": results}, indent=2))


if __name__ == "__main__":
    main()
