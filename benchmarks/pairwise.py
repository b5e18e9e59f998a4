"""Benchmark: the cost of one pairwise-judge pair (:func:`interp.methods.pairwise.measure_pair`).

On a bundled model (float32, CPU), for the first ``--pairs`` answerable bundled SQuAD 2.0
validation records whose pairwise prompts fit ``--max-tokens``, each record's first gold answer
against the next record's (a wrong answer to this question), measure per pair:

* ``forwards``: calls of the decoder (``model.model``), and ``full``, those that run more
  than one position (a whole prompt or a prefix; the rest are the patched rows' and replies'
  one-token steps over a cached prefix);
* ``tokens``: positions run through the decoder in all;
* ``seconds``: wall time of ``measure_pair`` (band ``last8``, every band head patched,
  ``--batch-size`` rows a forward), after one warm-up pair.

Run: ``python benchmarks/pairwise.py [--model smollm2-135m-instruct] [--pairs 6]
[--max-tokens 700] [--threads 1] [--out FILE.json]``. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any


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
    from interp.methods.pairwise import JudgePair, letter_replies, measure_pair, render_orders
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

    hook = handle.model.model.register_forward_pre_hook(count, with_kwargs=True)
    rows = []
    try:
        for k, p in enumerate(pairs):
            calls.clear()
            t0 = time.perf_counter()
            measure_pair(handle, p, template, replies, band, batch_size=a.batch_size)
            dt = time.perf_counter() - t0
            if k == 0:
                continue   # warm-up
            n = max(len(x) for x in render_orders(handle.tokenizer, template, p))
            rows.append({"tokens_prompt": n, "seconds": dt, "forwards": len(calls),
                         "full": sum(c > 0 for c in calls),
                         "tokens": sum(abs(c) for c in calls)})
    finally:
        hook.remove()
    out = {"model": a.model, "threads": a.threads, "batch_size": a.batch_size,
           "pairs": rows, "median_seconds": statistics.median(r["seconds"] for r in rows),
           "median_full_forwards": statistics.median(r["full"] for r in rows),
           "median_tokens": statistics.median(r["tokens"] for r in rows)}
    print(json.dumps(out, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
