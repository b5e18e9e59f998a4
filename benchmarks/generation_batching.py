"""Benchmark: batched vs one-at-a-time greedy generation, and harness throughput.

Measures, in one process on the same prompts:
  1. the generation step (T_gen prompts) with batch_size=1 and with batch_size=B;
  2. the whole Study 1 harness (generate, grade, self-evaluate) in examples/minute.
Prints the speed-up of batched over one-at-a-time generation. Not a test: timings vary by
machine; the report states the machine and thread count.

    python benchmarks/generation_batching.py [--dataset squad_v2] [--n 16] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from interp.data import load_examples
from interp.judging.generation import generate
from interp.judging.grading import RuleOracle
from interp.judging.prompts import get_template, render
from interp.methods.asymmetry import evaluate_examples
from interp.models.loading import load_model


def main() -> None:
    """Run the benchmark and print a small report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="squad_v2")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    args = ap.parse_args()
    handle = load_model(args.model)
    tpl = get_template()
    exs = load_examples(args.dataset, limit=args.n)
    prompts = [render(handle.tokenizer, tpl, "gen", context=e.context,
                      question=e.question).input_ids for e in exs]
    generate(handle, prompts[:2], batch_size=2, max_new_tokens=4)  # warm-up
    times = {}
    outs = {}
    for bs in (1, args.batch_size):
        t = time.perf_counter()
        outs[bs] = generate(handle, prompts, batch_size=bs, max_new_tokens=args.max_new_tokens)
        times[bs] = time.perf_counter() - t
    same = sum(a.text == b.text for a, b in zip(outs[1], outs[args.batch_size]))
    t = time.perf_counter()
    evaluate_examples(handle, exs, template=tpl, oracle=RuleOracle(),
                      max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    harness = time.perf_counter() - t
    mean_len = sum(map(len, prompts)) / len(prompts)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"torch threads {torch.get_num_threads()}, device {handle.device}")
    print(f"{args.dataset}: {len(prompts)} prompts, mean {mean_len:.0f} tokens, "
          f"max_new_tokens {args.max_new_tokens}")
    print(f"generation one-at-a-time : {times[1]:8.2f} s")
    print(f"generation batch_size={args.batch_size:<3}: {times[args.batch_size]:8.2f} s")
    print(f"speed-up of batched      : {times[1] / times[args.batch_size]:8.2f}x")
    print(f"identical outputs        : {same}/{len(prompts)}")
    print(f"harness (gen+oracle+eval): {60 * len(exs) / harness:8.1f} examples/minute")


if __name__ == "__main__":
    main()
