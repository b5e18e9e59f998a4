"""Benchmark: harness throughput against this machine's matmul roofline; bfloat16 vs float32.

Measures in ONE process (issue 14 item 5):

1. Roofline: FLOP/s of a plain matmul of the model's size (``[tokens, d_model] x [d_model,
   d_ffn]``, 512 x 576 x 1536 for SmolLM2) in the run's dtype, best of 20 after a warm-up.
2. The Study 1 harness stage (:func:`interp.stages.asymmetry.run`, its defaults: batch size 8,
   48 answer tokens, 12 verdict tokens, the one pass on; chunks of ``--chunk-batches 4``) on
   ``--n`` bundled records of ``--dataset`` into a temporary run directory: examples per
   minute (wall clock, model load excluded), and per minute of this process's CPU time
   (``time.process_time``: less sensitive to other processes on a shared machine; with T
   threads busy it is T times less).
   ``fraction_of_matmul_cpu`` is the achieved FLOP/s per CPU second times the thread count
   over the roofline: the fraction the harness would reach with its threads not preempted.
3. Model FLOPs of what the harness had to compute, counted per example from the prompt and
   reply lengths: ``2 * N * T`` for the ``N`` non-embedding parameters (decoder layers and
   final norm) over the ``T`` tokens run (both prompts, the decoded answer and verdict tokens,
   the verdict reply's extra token), ``2 * d_model * vocab`` per position whose logits are read
   (one per prompt and per decoded token, plus the reply's), and attention ``4 * n_layers *
   n_heads * head_dim`` per (query, key) pair (causal: ``n (n + 1) / 2`` pairs in a prompt of
   ``n``, ``n + i`` for the ``i``-th decoded token). Padding and finished rows of a batch are
   NOT counted (they are overhead, not useful work). Achieved = model FLOPs / wall time; the
   fraction is achieved / roofline.
4. With ``--compare-dtype bfloat16``: the same in bfloat16, and its agreement with the
   float32 run: share of records with the same generated answer, the same verdict, the same
   forced choice (p_correct > 0.5), max |logit_diff| difference (nats) and max |span mass|
   difference over every record, layer, head and span.
5. With ``--profile``: ``torch.profiler`` over the first 8 examples, the top operators by
   self CPU time (where the time goes).

    OMP_NUM_THREADS=2 python benchmarks/harness.py [--n 50] [--dtype float32]
        [--compare-dtype bfloat16] [--profile] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from interp.models.loading import load_model
from interp.stages import attention as attention_stage
from interp.stages.asymmetry import AsymmetryConfig
from interp.stages.asymmetry import run as run_asymmetry
from interp.store.rundir import RunDir


def matmul_flops(d_model: int, d_ffn: int, dtype: torch.dtype, tokens: int = 512,
                 reps: int = 20) -> float:
    """Best FLOP/s of ``[tokens, d_model] @ [d_model, d_ffn]`` over ``reps`` runs."""
    a = torch.randn(tokens, d_model, dtype=dtype)
    b = torch.randn(d_model, d_ffn, dtype=dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * tokens * d_model * d_ffn / best


def _shape(handle: Any) -> dict[str, int]:
    cfg = handle.model.config
    emb = handle.model.get_input_embeddings().weight
    n_total = sum(p.numel() for p in handle.model.parameters())
    head = handle.model.get_output_embeddings().weight
    tied = head.data_ptr() == emb.data_ptr()
    n_nonemb = n_total - emb.numel() - (0 if tied else head.numel())
    return {"n_nonemb": n_nonemb, "d_model": cfg.hidden_size, "vocab": emb.shape[0],
            "d_ffn": cfg.intermediate_size, "n_layers": cfg.num_hidden_layers,
            "n_heads": cfg.num_attention_heads,
            "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size
            // cfg.num_attention_heads}


def model_flops(rec: dict, handle: Any, shape: dict[str, int], reply_extra: int) -> float:
    """Useful FLOPs of one record (module docstring, step 3)."""
    tok = handle.tokenizer
    n_g, n_e = rec["prompts"]["gen"]["n_tokens"], rec["prompts"]["eval"]["n_tokens"]
    a = len(tok(rec["generation"], add_special_tokens=False)["input_ids"]) + 1  # + end token
    v = len(tok(rec["verdict_text"], add_special_tokens=False)["input_ids"]) + 1
    tokens = n_g + n_e + (a - 1) + (v - 1) + reply_extra
    logits = a + v + reply_extra
    pairs = (n_g * (n_g + 1) / 2 + sum(n_g + i for i in range(1, a))
             + n_e * (n_e + 1) / 2 + sum(n_e + i for i in range(1, v))
             + reply_extra * (n_e + 1))
    per_pair = 4 * shape["n_layers"] * shape["n_heads"] * shape["head_dim"]
    return (2 * shape["n_nonemb"] * tokens + 2 * shape["d_model"] * shape["vocab"] * logits
            + per_pair * pairs)


def measure(args: argparse.Namespace, dtype: str, out: Path) -> dict[str, Any]:
    """Steps 1-3 for one dtype; the run directory is ``out``."""
    handle = load_model(args.model, device="cpu", dtype=dtype)
    shape = _shape(handle)
    tdtype = next(handle.model.parameters()).dtype
    roof = matmul_flops(shape["d_model"], shape["d_ffn"], tdtype)
    cfg = AsymmetryConfig(model=args.model, datasets=[args.dataset], limit=args.n,
                          batch_size=args.batch_size, dtype=dtype, one_pass=not args.no_one_pass,
                          chunk_batches=args.chunk_batches, n_boot=200)
    t, c = time.perf_counter(), time.process_time()
    run_asymmetry(out, handle, cfg, log=lambda s: None)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    roof_after = matmul_flops(shape["d_model"], shape["d_ffn"], tdtype)
    recs = RunDir(out).read_records()
    from interp.judging.verdict import verdict_replies

    extra = max(len(r) for r in verdict_replies(handle.tokenizer).ids) - 1
    flops = sum(model_flops(r, handle, shape, extra) for r in recs)
    achieved = flops / wall
    res = {"dtype": dtype, "n": len(recs), "wall_s": wall, "examples_per_min": 60 * len(recs)
           / wall, "cpu_s": cpu, "examples_per_cpu_min": 60 * len(recs) / cpu,
           "model_gflop_per_example": flops / len(recs) / 1e9,
           "achieved_gflops": achieved / 1e9, "matmul_gflops_before": roof / 1e9,
           "matmul_gflops_after": roof_after / 1e9,
           "fraction_of_matmul": achieved / max(roof, roof_after),
           "achieved_gflops_per_cpu_s": flops / cpu / 1e9 * torch.get_num_threads(),
           "fraction_of_matmul_cpu": flops / cpu * torch.get_num_threads()
           / max(roof, roof_after),
           "mean_prompt_tokens": {t: float(np.mean([r["prompts"][t]["n_tokens"] for r in recs]))
                                  for t in ("gen", "eval")}}
    if args.profile:
        res["profile"] = profile(handle, args)
    return res


def profile(handle: Any, args: argparse.Namespace) -> str:
    """Step 5: the top operators by self CPU time over 8 examples of the harness."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with tempfile.TemporaryDirectory() as d, prof(activities=[ProfilerActivity.CPU]) as p:
        cfg = AsymmetryConfig(model=args.model, datasets=[args.dataset], limit=8,
                              batch_size=args.batch_size, one_pass=not args.no_one_pass)
        run_asymmetry(d, handle, cfg, log=lambda s: None)
    return p.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)


def agreement(a: Path, b: Path) -> dict[str, Any]:
    """Step 4: how far run ``b`` (another dtype) is from run ``a``."""
    ra = {r["id"]: r for r in RunDir(a).read_records()}
    rb = {r["id"]: r for r in RunDir(b).read_records()}
    ids = sorted(set(ra) & set(rb))
    same = {k: float(np.mean([ra[i][k] == rb[i][k] for i in ids]))
            for k in ("answer", "verdict", "oracle_label")}
    forced = float(np.mean([(ra[i]["p_correct"] > 0.5) == (rb[i]["p_correct"] > 0.5)
                            for i in ids]))
    ld = max(abs(ra[i]["logit_diff"] - rb[i]["logit_diff"]) for i in ids)
    out = {"n": len(ids), "same_answer": same["answer"], "same_verdict": same["verdict"],
           "same_oracle_label": same["oracle_label"], "same_forced_choice": forced,
           "max_abs_logit_diff": ld}
    try:
        ma, mb = attention_stage.load_masses(RunDir(a))[1], attention_stage.load_masses(
            RunDir(b))[1]
        same_prompts = [i for i in ids if ra[i]["prompts"] == rb[i]["prompts"]]
        out["span_mass_records"] = len(same_prompts)
        if len(same_prompts) == len(ids):
            out["max_abs_span_mass"] = float(max(np.abs(ma[t] - mb[t]).max() for t in ma))
        else:  # another answer changes the eval prompt: compare the gen prompts only
            out["max_abs_span_mass_gen"] = float(np.abs(ma["gen"] - mb["gen"]).max())
    except Exception as err:  # the one pass was off
        out["span_mass"] = f"not compared: {err}"
    return out


def main() -> None:
    """Run the benchmark and print (and optionally write) the report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dataset", default="squad_v2")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=AsymmetryConfig.batch_size)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--compare-dtype", default=None, help="e.g. bfloat16")
    ap.add_argument("--no-one-pass", action="store_true")
    ap.add_argument("--chunk-batches", type=int, default=4,
                    help="batches per length-sorted chunk (the README's numbers: 4)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    report: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
        "torch_threads": torch.get_num_threads(), "load_avg_start": os.getloadavg()[0],
        "model": args.model, "dataset": args.dataset, "batch_size": args.batch_size}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for dtype in [args.dtype] + ([args.compare_dtype] if args.compare_dtype else []):
            runs[dtype] = Path(tmp) / dtype
            report[dtype] = measure(args, dtype, runs[dtype])
            prof = report[dtype].pop("profile", None)
            print(json.dumps(report[dtype], indent=1))
            if prof:
                print(prof)
        if args.compare_dtype:
            report["agreement"] = agreement(runs[args.dtype], runs[args.compare_dtype])
            print(json.dumps(report["agreement"], indent=1))
    report["load_avg_end"] = os.getloadavg()[0]
    print(f"machine {report['machine']}, torch threads {report['torch_threads']}, load "
          f"{report['load_avg_start']:.1f} -> {report['load_avg_end']:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
