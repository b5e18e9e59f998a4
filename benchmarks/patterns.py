"""Benchmark: full attention patterns of every layer, in memory and streamed, against HF eager.

On the bundled SmolLM2-135M-Instruct (float32, CPU, one torch thread by default), for prompts of
256 to 2,048 tokens (random token ids), measure in ONE process, methods interleaved round by
round so that a drifting machine load hits them alike:

1. ``plain``: ``model(ids, use_cache=False, logits_to_keep=1)`` with SDPA, nothing recorded;
2. ``eager``: eager attention with ``output_attentions=True``: every layer's pattern kept in
   memory (``[1, n_heads, pos, pos]`` float32 per layer), the reference of the targets;
3. ``patterns``: :func:`interp.hooks.recorder.record_rows` with every layer in ``act_layers``
   and ``patterns=True`` (the in-memory path: patterns ``[n_layers, n_heads, pos, pos]``
   float32, with both residual streams, ``z`` and the last rows);
4. ``streamed``: :func:`interp.stages.record.record_prompt` with ``what = attention`` (the
   ``interp record`` path): every layer's pattern written as float16 shards to a temporary
   folder as it is computed (removed after each call), with the span-to-span masses.

Time: CPU seconds (``time.process_time``: on a shared machine the wall time grows with the
load, the CPU time much less) and wall seconds, medians of ``--repeats`` rounds after one
warm-up round. Memory: in the warm-up round, the peak resident set size during the call
above the RSS just before it, sampled every 2 ms by a thread reading ``/proc/self/status``
(tensors of more than 32 MiB are mmapped and go back to the system when freed, so the
baseline does not creep), against the patterns' size ``n_layers * n_heads * pos^2 * 4``
bytes (``patterns`` also returns the residual streams, ``z`` and rows: the table gives the
size of all it returns too). ``--skip-memory-above`` leaves out the in-memory methods (eager,
patterns) at lengths whose patterns would need more memory than the machine can spare.

Targets (docs/performance.md): ``patterns`` at most 1.10x ``eager``'s time and its peak at
most 1.05x the patterns' size; ``streamed`` at most ``eager``'s time, its peak flat in the
length.

Run from a checkout whose ``interp`` is to be measured (``PYTHONPATH`` picks it):
``python benchmarks/patterns.py [--lengths 256 512 1024 2048] [--repeats 2] [--threads 1]
[--out FILE.json]``. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def rss_mib() -> float:
    """Current resident set size of this process, MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rise(fn: Callable[[], Any], every_s: float = 0.002) -> float:
    """Peak RSS during ``fn()`` above the RSS before it, MiB (sampled; result dropped)."""
    base = rss_mib()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib())
            time.sleep(every_s)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        out = fn()
        peak[0] = max(peak[0], rss_mib())
        del out
    finally:
        done.set()
        t.join()
    return peak[0] - base


def main() -> None:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--methods", nargs="+", default=["plain", "eager", "patterns", "streamed"])
    ap.add_argument("--skip-memory-above", type=float, default=6.0,
                    help="GiB of patterns above which the in-memory methods are left out")
    ap.add_argument("--memory-only", action="store_true",
                    help="measure memory alone (mallopt: blocks of 1 MiB or more mmapped, so "
                         "the RSS follows the live tensors; this slows allocation, so time "
                         "in another process)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.memory_only:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, 2**20)  # M_MMAP_THRESHOLD
        args.repeats = 0

    import torch

    torch.set_num_threads(args.threads)
    from interp.hooks.recorder import record_rows
    from interp.hooks.wrappers import attn_implementation
    from interp.judging.prompts import RenderedPrompt
    from interp.models.loading import load_model
    from interp.stages.record import RecordConfig, record_prompt

    handle = load_model(device="cpu", dtype="float32")
    model, n_layers = handle.model, handle.n_layers
    with torch.no_grad():  # page every weight in before the first measurement
        model(input_ids=torch.tensor([[1, 2, 3, 4]]), use_cache=False)
    g = torch.Generator().manual_seed(0)
    folder = Path(tempfile.mkdtemp(prefix="interp-bench-patterns-"))
    results = []
    for n in args.lengths:
        ids = torch.randint(100, len(handle.tokenizer) - 100, (n,), generator=g)
        labels = ["template"] * n
        labels[n // 8: n // 2] = ["context"] * (n // 2 - n // 8)
        prompt = RenderedPrompt(task="eval", text="", input_ids=ids.tolist(), char_spans={},
                                token_spans={"context": (n // 8, n // 2)}, labels=labels)
        size_mib = n_layers * handle.n_heads * n * n * 4 / 2**20

        @torch.no_grad()
        def plain() -> Any:
            return model(input_ids=ids[None], use_cache=False, logits_to_keep=1).logits

        @torch.no_grad()
        def eager() -> Any:
            with attn_implementation(handle, "eager"):
                return model(input_ids=ids[None], use_cache=False, output_attentions=True,
                             logits_to_keep=1).attentions

        def patterns() -> Any:
            return record_rows(handle, ids, act_layers=list(range(n_layers)), patterns=True)

        def streamed() -> Any:
            cfg = RecordConfig(what=["attention"], dtype="float16")
            out = record_prompt(handle, prompt, cfg, list(range(n_layers)),
                                ["context", "question", "candidate", "template"], folder, "eval")
            for f in folder.iterdir():
                f.unlink()
            return out

        every = {"plain": plain, "eager": eager, "patterns": patterns, "streamed": streamed}
        methods = {m: every[m] for m in args.methods}
        if size_mib / 1024 > args.skip_memory_above:
            methods = {m: f for m, f in methods.items() if m not in ("eager", "patterns")}
        row: dict[str, Any] = {"tokens": n, "patterns_mib": size_mib}
        for name, fn in methods.items():  # warm-up round: memory
            row[f"{name}_peak_mib"] = peak_rise(fn)
        times: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
        for _ in range(args.repeats):
            for name, fn in methods.items():
                c, w = time.process_time(), time.perf_counter()
                out = fn()
                times[name].append((time.process_time() - c, time.perf_counter() - w))
                del out
        for name in methods:
            row[f"{name}_cpu_s"] = statistics.median(t[0] for t in times[name] or [(0, 0)])
            row[f"{name}_wall_s"] = statistics.median(t[1] for t in times[name] or [(0, 0)])
        if "patterns" in methods and "eager" in methods and not args.memory_only:
            with torch.no_grad(), attn_implementation(handle, "eager"):
                ref = model(input_ids=ids[None], use_cache=False, output_attentions=True,
                            logits_to_keep=1).attentions
            got = patterns().acts["pattern"]
            row["patterns_max_abs_err_vs_eager"] = max(
                float((got[x] - ref[x][0]).abs().max()) for x in range(n_layers))
            del ref, got
        if "patterns" in methods:
            rec = patterns()
            row["patterns_returned_mib"] = (rec.rows.nbytes + sum(
                v.nbytes for v in rec.acts.values())) / 2**20
            del rec
        results.append(row)
        ref_cpu = row.get("eager_cpu_s")
        print(f"{n:>5} tokens, patterns {size_mib:.0f} MiB: " + " | ".join(
            f"{m} {row[f'{m}_cpu_s']:.2f} CPU-s"
            + (f" ({row[f'{m}_cpu_s'] / ref_cpu:.2f}x eager)" if ref_cpu else "")
            + f" peak +{row[f'{m}_peak_mib']:.0f} MiB ({row[f'{m}_peak_mib'] / size_mib:.2f}x)"
            for m in methods), flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    print("\ntokens  method     cpu_s  wall_s  x_eager(cpu)  peak_MiB  x_patterns_size")
    for row in results:
        for m in args.methods:
            if f"{m}_cpu_s" not in row:
                continue
            x = row[f"{m}_cpu_s"] / row["eager_cpu_s"] if row.get("eager_cpu_s") else float("nan")
            print(f"{row['tokens']:>6}  {m:<9} {row[f'{m}_cpu_s']:>6.2f}  "
                  f"{row[f'{m}_wall_s']:>6.2f}  {x:>12.2f}  {row[f'{m}_peak_mib']:>8.0f}  "
                  f"{row[f'{m}_peak_mib'] / row['patterns_mib']:>15.2f}")
    for row in results:
        if "patterns_returned_mib" in row:
            print(f"{row['tokens']:>6}  patterns returns {row['patterns_returned_mib']:.0f} MiB in "
                  f"all (patterns, residual streams, z, rows): peak / returned = "
                  f"{row['patterns_peak_mib'] / row['patterns_returned_mib']:.2f}")
    print(f"\ntorch threads: {torch.get_num_threads()}")
    if args.out:
        Path(args.out).write_text(json.dumps({"threads": torch.get_num_threads(),
                                              "results": results}, indent=2))


if __name__ == "__main__":
    main()
