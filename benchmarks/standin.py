"""Benchmark: each stage's core method on the Llama-3.1-8B-shaped stand-in, by prompt length.

The stand-in is :func:`interp.testing.llama31_standin`: Llama-3.1-8B's configuration (hidden
4,096, 32 query / 8 key-value heads of width 128, MLP 14,336, vocabulary 128,256, llama3 rope
scaling) with ``--layers`` decoder blocks (4 by default), random weights drawn in bfloat16
(3.85 GB at 4 layers). For each prompt length (random token ids) and each method, ONE call
after a warm-up forward at that length, measuring its peak resident memory above the memory
before it (:func:`interp.testing.peak_rss_rise`, freed blocks of 1 MiB and more returned to
the system), its CPU and wall seconds, and the bytes it wrote:

* ``forward``: a plain forward (``logits_to_keep=1``): Study 1's prefill and every stage's
  base cost;
* ``rows``: :func:`interp.hooks.recorder.record_rows` (the attention stage and the one-pass
  harness: last-token rows of every layer and head);
* ``record``: :func:`interp.stages.record.record_prompt` with every layer, ``what`` =
  attention, resid and z, float16 on disk (``interp record``; streamed);
* ``lens``: :func:`interp.methods.lens.reply_lens` with a 2-token reply and
  :func:`interp.methods.lens.token_lens` (the lens stage's per-record readouts);
* ``dla``: :func:`interp.methods.lens.direct_logit_attribution` (the pairwise stage's
  attribution).

With ``--device cuda`` the stand-in is built on the CPU, moved to the GPU and every method
runs there (the clock synchronised around each call); each row adds ``peak_gpu_mib``, the
peak of ``torch.cuda.max_memory_allocated`` during the call above the memory allocated before
it (``benchmarks/gpu_check.py`` runs this step when a GPU is lent).

Rows are appended to ``--out`` (JSON lines) as they finish; a rerun skips the (method,
length) pairs already there, so a killed run resumes. docs/performance.md's model of the full
32 layers on an 80 GB H100 is fitted to these rows. At the end the rows are printed as
docs/performance.md's table (:func:`table`: peak MiB and seconds per method and length).

Run: ``python benchmarks/standin.py [--layers 4] [--lengths 512 1024 2048 4096]
[--methods forward rows record lens dla] [--threads 1] [--device cpu] --out FILE.jsonl``.
Not part of the test suite; about 3.9 GB of weights plus each method's peak.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

METHODS = ("forward", "rows", "record", "lens", "dla")
LABELS = {"forward": "plain forward (Study 1's prefill)",
          "rows": "last-token rows (attention stage, one pass)",
          "record": "`interp record`, {layers} layers, float16",
          "lens": "lens: `reply_lens` (2 replies) + `token_lens`",
          "dla": "direct logit attribution (pairwise)"}
"""Each method's row label in :func:`table` (docs/performance.md's)."""


def table(rows: list[dict[str, Any]], lengths: list[int] | None = None) -> str:
    """The rows as docs/performance.md's Markdown table, one line per method.

    Each length's cell is the peak MiB and the seconds of the call: on the GPU (rows with
    ``peak_gpu_mib``) the GPU memory's peak and wall seconds, on the CPU the resident set
    size's peak and CPU seconds; a (method, length) with no row is "not reached". The last
    column is what ``record`` wrote per prompt.

    Args:
        rows: the benchmark's JSON lines (dicts), of one device.
        lengths: the columns (default: every length in the rows, ascending).

    Returns:
        The table's lines, joined by newlines (a header line naming the device first).
    """
    lengths = lengths or sorted({r["tokens"] for r in rows})
    gpu = any("peak_gpu_mib" in r for r in rows)
    unit = "peak GPU MiB / s" if gpu else "peak MiB / CPU-s"
    by = {(r["method"], r["tokens"]): r for r in rows}
    layers = next((r["layers"] for r in rows), "?")
    head = (f"| method | {' | '.join(f'{n} tokens: {unit}' for n in lengths)} | written "
            f"(per prompt) |")
    out = [head, "| --- | " + " | ".join("---:" for _ in lengths) + " | --- |"]
    for m in METHODS:
        if not any(k[0] == m for k in by):
            continue
        cells = []
        for n in lengths:
            r = by.get((m, n))
            cells.append("not reached" if r is None else
                         f"{r['peak_gpu_mib'] if gpu else r['peak_rise_mib']:.0f} / "
                         f"{r['wall_s'] if gpu else r['cpu_s']:.2f}")
        wrote = "; ".join(f"{n}: {by[(m, n)]['disk_bytes'] / 1e6:.0f} MB" for n in lengths
                          if (m, n) in by and by[(m, n)]["disk_bytes"]) or "-"
        out.append(f"| {LABELS[m].format(layers=layers)} | {' | '.join(cells)} | {wrote} |")
    return "\n".join(out)


def main() -> None:
    """Run the benchmark, appending one JSON line per (method, length)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--narrow", type=int, default=None,
                    help="a narrow width instead of 4,096 (a quick check of the script)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (a GPU lent)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["method"], r["tokens"]))

    import torch

    torch.set_num_threads(args.threads)
    gpu = args.device.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device visible to torch; use --device cpu")
    from interp.judging.prompts import RenderedPrompt
    from interp.methods.lens import direct_logit_attribution, reply_lens, token_lens
    from interp.stages.record import RecordConfig, record_prompt
    from interp.testing import llama31_standin, mmap_large_blocks, peak_rss_rise

    mmap_large_blocks()
    t0 = time.perf_counter()
    handle = llama31_standin(args.layers, narrow=args.narrow, dtype=getattr(torch, args.dtype))
    handle.model.to(args.device)
    weights = sum(p.numel() * p.element_size() for p in handle.model.parameters())
    print(f"stand-in: {args.layers} layers, {weights / 1e9:.2f} GB of {args.dtype} weights "
          f"on {args.device}, built in {time.perf_counter() - t0:.0f} s", flush=True)

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()
    from interp.hooks.recorder import record_rows

    folder = Path(tempfile.mkdtemp(prefix="interp-bench-standin-"))
    g = torch.Generator().manual_seed(0)
    for n in args.lengths:
        ids = torch.randint(3, 500, (n,), generator=g).to(args.device)
        labels = ["template"] * n
        labels[n // 8: n // 2] = ["context"] * (n // 2 - n // 8)
        prompt = RenderedPrompt(task="eval", text="", input_ids=ids.tolist(), char_spans={},
                                token_spans={"context": (n // 8, n // 2)}, labels=labels)

        def forward() -> Any:
            with torch.no_grad():
                return handle.model(input_ids=ids[None], use_cache=False,
                                    logits_to_keep=1).logits

        def rows() -> Any:
            return record_rows(handle, ids).rows

        def record() -> Any:
            cfg = RecordConfig(what=["attention", "resid", "z"], dtype="float16")
            return record_prompt(handle, prompt, cfg, list(range(args.layers)),
                                 ["context", "question", "candidate", "template"], folder,
                                 "eval")[1]

        def lens() -> Any:
            return (reply_lens(handle, ids[:-1].tolist(), [[7, 8], [9, 10]]),
                    token_lens(handle, ids.tolist(), 7))

        def dla() -> Any:
            return direct_logit_attribution(handle, ids.tolist(), 7, 9)

        calls = {"forward": forward, "rows": rows, "record": record, "lens": lens, "dla": dla}
        todo = [m for m in args.methods if (m, n) not in done]
        if not todo:
            continue
        forward()  # warm-up at this length
        for m in todo:
            sync()
            if gpu:
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            c, w = time.process_time(), time.perf_counter()

            def timed(fn: Any = calls[m]) -> Any:
                out = fn()
                sync()
                return out

            res, rise = peak_rss_rise(timed)
            row = {"method": m, "tokens": n, "layers": args.layers, "dtype": args.dtype,
                   "width": args.narrow or 4096, "device": args.device,
                   "threads": torch.get_num_threads(), "weights_bytes": weights,
                   "peak_rise_mib": round(rise, 1), "cpu_s": round(time.process_time() - c, 2),
                   "wall_s": round(time.perf_counter() - w, 2),
                   "disk_bytes": int(sum(res.values())) if m == "record" else 0}
            if gpu:
                row["peak_gpu_mib"] = round((torch.cuda.max_memory_allocated() - base) / 2**20,
                                            1)
            for f in folder.iterdir():
                f.unlink()
            del res
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    print(table([r for r in rows if r.get("device", "cpu") == args.device], args.lengths))


if __name__ == "__main__":
    main()
