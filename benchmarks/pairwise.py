"""Benchmark: the cost of one pairwise-judge pair (:func:`interp.methods.pairwise.measure_pair`).

The fused measurement (one full forward per order) and the unfused reference
(``_measure_pair_unfused``: each step's own forwards) side by side in one process, each pair
measured by both in turn (which first alternates from pair to pair). On a bundled model
(float32, CPU), for the first ``--pairs`` answerable bundled SQuAD 2.0 validation records whose
pairwise prompts fit ``--max-tokens``, each record's first gold answer against the next
record's (a wrong answer to this question), measure per pair and way:

* ``forwards``: calls of the decoder (``model.model``), and ``full``, those that run more
  than one position (a whole prompt or a prefix; the rest are the patched rows' and replies'
  one-token steps over a cached prefix);
* ``tokens``: positions run through the decoder in all;
* ``seconds`` and ``cpu_seconds``: wall time and process CPU time of one measurement (band
  ``last8``, every band head patched, ``--batch-size`` rows a forward), after one warm-up
  pair measured by both;
* ``max_abs_diff``, ``max_rel_diff``: the largest difference between the two measurements'
  numbers, absolute and relative to ``max(1, |unfused|)``; ``lens_last_minus_score``: per
  way, the larger gap of the lens's last layer and the letter score over the two orders
  (float rounding between a whole-prompt forward and one token over a key/value cache).

Run: ``python benchmarks/pairwise.py [--model smollm2-135m-instruct] [--pairs 6]
[--max-tokens 700] [--threads 1] [--out FILE.json]``. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=700)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import torch

    from interp.core.layers import parse_layers
    from interp.data.loading import load_examples
    from interp.judging.prompts import get_pairwise_template
    from interp.methods.pairwise import (
        JudgePair,
        _measure_pair_unfused,
        letter_replies,
        measure_pair,
        render_orders,
    )
    from interp.models.loading import load_model

    torch.set_num_threads(a.threads)
    handle = load_model(a.model)
    template = get_pairwise_template()
    replies = letter_replies(handle.tokenizer)
    band = parse_layers("last8", handle.n_layers)
    exs = [e for e in load_examples("squad_v2") if e.answers]
    pairs: list[JudgePair] = []
    for e, nxt in zip(exs, exs[1:]):
        p = JudgePair("squad_v2", e.id, e.id, "model", e.answers[0], nxt.answers[0],
                      e.context, e.question)
        if e.answers[0].lower() != nxt.answers[0].lower() and max(
                len(x) for x in render_orders(handle.tokenizer, template, p)) <= a.max_tokens:
            pairs.append(p)
        if len(pairs) == a.pairs + 1:
            break

    calls: list[int] = []

    def count(_module: Any, args: tuple, kwargs: dict) -> None:
        x = kwargs.get("input_ids", args[0] if args else None)
        x = x if x is not None else kwargs.get("inputs_embeds")
        calls.append(int(x.shape[0] * x.shape[1]) if x.shape[1] > 1 else -int(x.shape[0]))

    ways = {"fused": measure_pair, "unfused": _measure_pair_unfused}

    def numbers(d: Any) -> list[float]:
        if isinstance(d, dict):
            return [x for k in sorted(d) for x in numbers(d[k])]
        if isinstance(d, list):
            return [x for v in d for x in numbers(v)]
        return [float(d)]

    hook = handle.model.model.register_forward_pre_hook(count, with_kwargs=True)
    rows: dict[str, list[dict[str, Any]]] = {w: [] for w in ways}
    diffs = []
    try:
        for k, p in enumerate(pairs):
            n = max(len(x) for x in render_orders(handle.tokenizer, template, p))
            got = {}
            for w in (list(ways) if k % 2 else list(ways)[::-1]):
                calls.clear()
                c0, t0 = time.process_time(), time.perf_counter()
                got[w] = ways[w](handle, p, template, replies, band, batch_size=a.batch_size)
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
                rows[w].append({"tokens_prompt": n, "seconds": dt, "cpu_seconds": dc,
                                "forwards": len(calls), "full": sum(c > 0 for c in calls),
                                "tokens": sum(abs(c) for c in calls)})
            x, y = np.array(numbers(got["fused"])), np.array(numbers(got["unfused"]))
            diffs.append((float(np.abs(x - y).max()),
                          float((np.abs(x - y) / np.maximum(1.0, np.abs(y))).max())))
            for w in ways:   # the lens's last layer against the letter score, both orders
                g = got[w]
                rows[w][-1]["lens_last_minus_score"] = max(
                    abs(g["lens"]["right_first"][-1] - g["s1"]),
                    abs(g["lens"]["right_second"][-1] - g["s2"]))
            print(f"pair {k}: {n} tokens, " + ", ".join(
                f"{w} {rows[w][-1]['cpu_seconds']:.2f} CPU-s" for w in ways), flush=True)
    finally:
        hook.remove()
    out: dict[str, Any] = {"model": a.model, "threads": a.threads, "batch_size": a.batch_size,
                           "max_abs_diff": max(d[0] for d in diffs[1:]),
                           "max_rel_diff": max(d[1] for d in diffs[1:])}
    for w in ways:
        r = rows[w][1:]   # the first pair is the warm-up
        out[w] = {"pairs": r, "median_cpu_seconds": statistics.median(x["cpu_seconds"] for x in r),
                  "median_seconds": statistics.median(x["seconds"] for x in r),
                  "median_full_forwards": statistics.median(x["full"] for x in r),
                  "median_tokens": statistics.median(x["tokens"] for x in r)}
    out["cpu_ratio_unfused_over_fused"] = [u["cpu_seconds"] / f["cpu_seconds"] for f, u in
                                           zip(out["fused"]["pairs"], out["unfused"]["pairs"])]
    print(json.dumps(out, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
