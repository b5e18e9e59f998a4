"""Benchmark: cost and exactness of the last-token attention recorder (interp.hooks.recorder).

On the bundled SmolLM2-135M-Instruct (float32), for prompts of 512, 1024 and 2048 tokens,
measure in ONE process:

1. plain: ``model(ids, use_cache=False, logits_to_keep=1)`` with SDPA, no recording;
2. recorder: :func:`interp.hooks.recorder.record_rows` (``hf`` backend: rows computed inside the
   registered ``AttentionInterface`` function around SDPA) -- the same forward call;
3. eager: ``output_attentions=True`` with eager attention (full patterns of every layer);
4. tlens: TransformerBridge ``run_with_cache`` of every ``blocks.L.attn.hook_pattern``.

Wall time is the median of ``--repeats`` runs after one warm-up run (which also measures
memory), the methods interleaved round by round so that a drifting machine load hits them
alike. Peak memory is the peak of Python-visible allocations of one run measured with
``tracemalloc`` (torch CPU tensors are
allocated outside Python's allocator, so we also report the rise of the process's max RSS from
``resource.getrusage``, which only grows: the methods run from cheapest to dearest). Each method
is printed as a ratio to the plain forward measured in the same run, with the recorder's max abs
error against eager. Targets (issue 3): recorder <= 1.10x plain at 2048 tokens, error <= 1e-5.

Run: ``python benchmarks/attention_recorder.py [--lengths 512 1024 2048] [--repeats 3]
[--threads N] [--out FILE.json]``. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
import tracemalloc

import torch


def _peak(fn) -> tuple[float, float]:
    """(tracemalloc peak MiB, rise of max RSS MiB) of one call."""
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20, (rss1 - rss0) / 1024


def main() -> None:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-tlens", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from interp.hooks.recorder import record_rows
    from interp.hooks.wrappers import attn_implementation, to_tlens
    from interp.models.loading import load_model

    handle = load_model(device="cpu", dtype="float32")
    model = handle.model
    bridge = None if args.no_tlens else to_tlens(handle)
    g = torch.Generator().manual_seed(0)
    results = []
    for n in args.lengths:
        ids = torch.randint(100, len(handle.tokenizer) - 100, (n,), generator=g)

        @torch.no_grad()
        def plain():
            model(input_ids=ids[None], use_cache=False, logits_to_keep=1)

        def recorder():
            return record_rows(handle, ids).rows

        @torch.no_grad()
        def eager():
            with attn_implementation(handle, "eager"):
                out = model(input_ids=ids[None], use_cache=False, output_attentions=True,
                            logits_to_keep=1)
            return torch.stack([a[0, :, -1, :] for a in out.attentions])

        names = [f"blocks.{x}.attn.hook_pattern" for x in range(handle.n_layers)]

        @torch.no_grad()
        def tlens():
            bridge.run_with_cache(ids[None], names_filter=lambda s: s in names)

        methods = {"plain": plain, "recorder": recorder, "eager": eager}
        if bridge is not None:
            methods["tlens"] = tlens
        row = {"tokens": n}
        for name, fn in methods.items():  # warm-up and memory, cheapest method first
            row[f"{name}_tracemalloc_mib"], row[f"{name}_rss_rise_mib"] = _peak(fn)
        times: dict[str, list[float]] = {m: [] for m in methods}
        for _ in range(args.repeats):  # interleaved, so drifting machine load hits all alike
            for name, fn in methods.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        for name in methods:
            row[f"{name}_s"] = statistics.median(times[name])
        row["recorder_max_abs_err"] = float((recorder() - eager().float()).abs().max())
        for name in methods:
            row[f"{name}_x"] = row[f"{name}_s"] / row["plain_s"]
        results.append(row)
        print(f"{n:>5} tokens: plain {row['plain_s']:.3f} s | "
              + " | ".join(f"{m} {row[f'{m}_x']:.2f}x" for m in methods if m != "plain")
              + f" | recorder max|err| vs eager {row['recorder_max_abs_err']:.2e}", flush=True)
    print("\ntokens  method    time_s   x_plain  tracemalloc_MiB  rss_rise_MiB")
    for row in results:
        for m in ("plain", "recorder", "eager", "tlens"):
            if f"{m}_s" in row:
                print(f"{row['tokens']:>6}  {m:<8} {row[f'{m}_s']:>7.3f}  {row[f'{m}_x']:>7.2f}  "
                      f"{row[f'{m}_tracemalloc_mib']:>15.1f}  {row[f'{m}_rss_rise_mib']:>12.1f}")
    print(f"\ntorch threads: {torch.get_num_threads()}; target: recorder <= 1.10x plain at 2048 "
          f"tokens, max abs error <= 1e-5")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
