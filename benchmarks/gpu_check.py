"""GPU check of the paper configuration (issue 13); ``benchmarks/gpu_check.sh`` runs it.

On a machine with an NVIDIA GPU and this repo (no package index, no hub, no bundled GGUF: it
builds what it needs), using whatever torch / transformers the machine has:

1. Build the rehearsal stand-in of Llama-3.1-8B-Instruct (``interp.testing.llama31_checkpoint``:
   32 layers, GQA 4:1, Llama 3.1 rope scaling and chat template, random bfloat16 weights) and
   ``--records`` bundled records per dataset (``interp.testing.rehearsal_datasets``).
2. Run ``experiments/paper.toml`` with only its model and dataset sources swapped
   (``interp.run.pipeline.swap_sources``) and the device set (``[asymmetry] device``,
   ``[transfer] device``), stage by stage, timing each: records/s per stage.
3. On the records that run produced, compute on BOTH the CPU and ``--device`` (bfloat16, the
   same prompts): the last-token span mass over the band 24-31 (mean over heads and band
   layers, per prompt and span) and the whole-reply verdict score ``logit_diff``. They must
   agree to ``--tol-mass`` (1e-3) and ``--tol-logit`` (1e-2 nats); the largest differences
   are printed.
4. Two shards on one device: ``interp asymmetry --shard 0/2`` and ``--shard 1/2`` started
   together on the stand-in (``--shard-records`` records of one dataset; both processes on
   the one GPU; batches of one prompt, so padding cannot differ), then ``interp merge``,
   against the same command unsharded: identical answers and verdicts, ``logit_diff``
   within ``--tol-logit``; the wall times of both.
5. A device map split between the device and the CPU: the stand-in loaded with its first
   half of blocks on ``--device`` and the rest (with the final norm and the head) on the CPU
   (``load_model(device_map=...)``; on a GPU accelerate keeps those weights in CPU memory and
   streams them in; in the dry run the second half is offloaded to disk). Step 3's numbers on
   the same prompts must equal the plain load's on ``--device`` within the tolerances.
6. The paper-shaped stand-in by prompt length (``benchmarks/standin.py`` in a child process,
   rows in ``OUT/standin.jsonl``): Llama-3.1-8B's width, heads, vocabulary and rope scaling
   with ``--standin-layers`` (4) blocks, each stage's core method (plain forward, last-token
   rows, ``interp record``, the lens, direct logit attribution) at 512 to 4,096 tokens on
   ``--device``: peak GPU memory, seconds and bytes written, printed as docs/performance.md's
   table (:func:`benchmarks.standin.table`), the numbers its H100 model projects from. It runs
   first, in what ``--budget-s`` (570) leaves beside 450 s for steps 2-5, at most
   ``--standin-budget-s`` (120); lengths it does not reach print as "not reached".
7. Print throughput, peak GPU memory (``torch.cuda.max_memory_allocated``) and wall time;
   write everything to ``OUT/gpu_check.json`` (also after each step, so a run stopped at the
   budget keeps what it measured). Exit status 1 when the numbers disagree, 2 on an error, 0
   otherwise.

``--device cpu`` is the dry run: every step on the CPU (step 3 then compares the CPU with
itself; step 6 on the reduced stand-in: width 256, 2 layers, 128 and 256 tokens), so the
script is tested end to end on a machine without a GPU.

Not run here: ``benchmarks/patterns.py`` and ``benchmarks/pairwise.py`` measure the bundled
SmolLM2 (weights that do not travel to a GPU machine) in CPU seconds and resident memory;
their GPU counterparts are step 6's ``record``/``rows`` and ``dla`` rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.shard_compare import one_vs_shards  # noqa: E402
from benchmarks.standin import table as standin_table  # noqa: E402
from interp.analysis.span_mass import span_mass  # noqa: E402
from interp.hooks.recorder import record_rows  # noqa: E402
from interp.judging.prompts import record_prompts  # noqa: E402
from interp.judging.verdict import score_verdicts  # noqa: E402
from interp.models.loading import PAPER_MODEL, load_model, runtime_facts  # noqa: E402
from interp.run.pipeline import run_config, swap_sources  # noqa: E402
from interp.store.rundir import RunDir  # noqa: E402
from interp.testing import llama31_checkpoint, rehearsal_datasets  # noqa: E402

SPANS = ("context", "question", "candidate", "template")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (the dry run)")
    ap.add_argument("--records", type=int, default=3, help="records per dataset")
    ap.add_argument("--config", default=str(ROOT / "experiments" / "paper.toml"))
    ap.add_argument("--out", default="runs/gpu_check", help="work and output folder")
    ap.add_argument("--only", default=None,
                    help="comma-separated stages (default: every stage of the config)")
    ap.add_argument("--seed", type=int, default=2,
                    help="weights seed of the stand-in (tests/rehearsal: SEEDS)")
    ap.add_argument("--shard-records", type=int, default=4,
                    help="records of the two-shard check (step 4; 0 skips it)")
    ap.add_argument("--no-device-map", action="store_true", help="skip step 5")
    ap.add_argument("--tol-mass", type=float, default=1e-3)
    ap.add_argument("--tol-logit", type=float, default=1e-2)
    ap.add_argument("--budget-s", type=float,
                    default=float(os.environ.get("GPU_CHECK_TIMEOUT", "570")),
                    help="seconds the whole check may take (gpu_check.sh's limit; 0: none)")
    ap.add_argument("--standin-layers", type=int, default=None,
                    help="step 6's decoder blocks (default 4 on a GPU, 2 in the dry run)")
    ap.add_argument("--standin-lengths", type=int, nargs="+", default=None,
                    help="step 6's prompt lengths (default 512 1024 2048 4096 on a GPU, "
                         "128 256 in the dry run)")
    ap.add_argument("--no-standin", action="store_true", help="skip step 6")
    ap.add_argument("--standin-budget-s", type=float, default=120.0,
                    help="the most seconds step 6 may take")
    return ap.parse_args(argv)


def standin_check(args: argparse.Namespace, out: Path, left_s: float | None) -> dict:
    """Step 6: ``benchmarks/standin.py`` on ``--device`` in a child process; its rows.

    ``left_s``: the seconds the child may take (None: ``--standin-budget-s``). Rows already in
    ``OUT/standin.jsonl`` are kept (the benchmark resumes).
    """
    gpu = args.device.startswith("cuda")
    layers = args.standin_layers or (4 if gpu else 2)
    lengths = args.standin_lengths or ([512, 1024, 2048, 4096] if gpu else [128, 256])
    path = out / "standin.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "standin.py"), "--layers", str(layers),
           "--lengths", *map(str, lengths), "--device", args.device, "--threads",
           str(torch.get_num_threads()), "--out", str(path)]
    if not gpu:
        cmd += ["--narrow", "256"]
    limit = min(args.standin_budget_s, left_s) if left_s is not None else args.standin_budget_s
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
        status = "done" if r.returncode == 0 else (
            f"error: {(r.stdout + r.stderr).strip().splitlines()[-1:]}")
    except subprocess.TimeoutExpired:
        status = f"stopped after {limit:.0f} s (the budget)"
    rows = [json.loads(line) for line in path.read_text().splitlines()] \
        if path.exists() else []
    rows = [r for r in rows if r.get("device", "cpu") == args.device]
    return {"layers": layers, "lengths": lengths, "width": 4096 if gpu else 256,
            "status": status, "seconds": time.perf_counter() - t0, "rows": rows,
            "table": standin_table(rows, lengths) if rows else ""}


def _stages(cfg: dict, only: str | None) -> list[str]:
    names = ["asymmetry"] + [k for k in ("attention", "probe", "transfer", "patching",
                                         "steering", "record") if k in cfg]
    names += [k for k in cfg if isinstance(cfg[k], dict) and k not in names]
    return [n for n in names if not only or n in only.split(",")]


def run_stages(cfg: dict, device: str, only: str | None) -> dict[str, dict]:
    """Step 2: each stage on its own, timed (seconds, records/s), on ``device``."""
    cfg["asymmetry"]["device"] = device
    if "transfer" in cfg:
        cfg["transfer"]["device"] = device
    timings: dict[str, dict] = {}
    for name in _stages(cfg, only):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        summary = run_config(cfg, only=[name], log=lambda s: None)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        (spec,) = summary
        n = len(RunDir(summary[spec]["run_dir"]).read_records())
        timings[name] = {"seconds": dt, "records": n, "records_per_s": n / dt}
        print(f"  {name:<10} {dt:7.1f} s  {n / dt:7.2f} records/s", flush=True)
    return timings


def measure(ckpt: Path, run: RunDir, device: str, **placement: object
            ) -> dict[str, list[float]]:
    """Step 3 on one device: band span mass per (record, task, span) and logit_diff per record.

    ``placement``: ``device_map`` / ``offload_folder`` for :func:`interp.models.loading.load_model`.
    """
    handle = load_model(str(ckpt), device=device, dtype="bfloat16", **placement)
    band = list(range(24, 32))
    mass, prompts, keys = [], [], []
    for r in run.read_records():
        ps = record_prompts(r, handle.tokenizer)
        for task in ("gen", "eval"):
            rows = record_rows(handle, ps[task].input_ids).rows          # [layer, head, pos]
            m = span_mass(rows[band], ps[task].labels, SPANS).mean(dim=(0, 1))
            mass += m.tolist()
            keys += [f"{r['dataset']}/{r['id']}/{task}/{s}" for s in SPANS]
        prompts.append(ps["eval"].input_ids)
    scores = score_verdicts(handle, prompts, batch_size=8)
    return {"keys": keys, "mass": mass, "logit_diff": scores.logit_diff.tolist(),
            "runtime": runtime_facts(handle)}


def split_map(n_layers: int, device: str) -> dict[str, object]:
    """Step 5's device map: the first half of the blocks on ``device``, the rest on the CPU.

    The final norm and the head go with the second half; in the dry run (``device`` cpu) the
    second half is offloaded to disk.
    """
    first: object = int(device.split(":")[1]) if device.startswith("cuda:") else (
        0 if device == "cuda" else "cpu")
    rest = "cpu" if device.startswith("cuda") else "disk"
    dm: dict[str, object] = {"model.embed_tokens": first, "model.rotary_emb": first}
    dm.update({f"model.layers.{i}": first if i < n_layers // 2 else rest
               for i in range(n_layers)})
    dm.update({"model.norm": rest, "lm_head": rest})
    return dm


def compare(ckpt: Path, run: RunDir, device: str, tol_mass: float, tol_logit: float,
            ref: dict | None = None, dev: dict | None = None) -> dict:
    """Step 3: the same prompts on the CPU and on ``device``; the largest differences.

    ``ref`` / ``dev``: :func:`measure` results already made (step 5 compares a device map).
    """
    ref = ref or measure(ckpt, run, "cpu")
    dev = dev or measure(ckpt, run, device)
    dm = [abs(a - b) for a, b in zip(ref["mass"], dev["mass"])]
    dl = [abs(a - b) for a, b in zip(ref["logit_diff"], dev["logit_diff"])]
    worst = max(range(len(dm)), key=dm.__getitem__)
    return {"n_prompts": len(dm) // len(SPANS), "n_records": len(dl),
            "span_mass_max_abs_diff": max(dm), "span_mass_worst": ref["keys"][worst],
            "logit_diff_max_abs_diff": max(dl),
            "logit_diff_cpu": ref["logit_diff"], "logit_diff_device": dev["logit_diff"],
            "tol_mass": tol_mass, "tol_logit": tol_logit,
            "agree": max(dm) <= tol_mass and max(dl) <= tol_logit,
            "runtime_cpu": ref["runtime"], "runtime_device": dev["runtime"]}


def shard_check(ckpt: Path, data: dict[str, str], device: str, n: int, out: Path,
                tol_logit: float) -> dict:
    """Step 4: two shards started together on one device, merged, against one process."""
    import os

    name, path = next(iter(data.items()))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    base = [sys.executable, "-m", "interp", "asymmetry", "--model", str(ckpt), "--dataset",
            path, "--limit", str(n), "--batch-size", "1", "--max-new-tokens", "8",
            "--device", device, "--dtype", "bfloat16"]
    got = one_vs_shards(base, out / "shards", env_one=env, env_split=env)
    same = got["same_answers_and_verdicts"]
    return {"dataset": name, "records": got["records"], "one_process_s": got["one_s"],
            "two_shards_s": got["shards_s"], "merge_s": got["merge_s"],
            "same_answers_and_verdicts": same,
            "logit_diff_max_abs_diff": got["logit_diff_max_abs_diff"],
            "agree": same and got["logit_diff_max_abs_diff"] <= tol_logit}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            print("error: no CUDA device visible to torch; use --device cpu for the dry run")
            return 2
        torch.cuda.reset_peak_memory_stats()
    out = Path(args.out)
    print(f"gpu_check: torch {torch.__version__}, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else ""))
    report: dict = {"device": args.device, "torch": torch.__version__}

    def save() -> None:
        out.mkdir(parents=True, exist_ok=True)
        report["wall_s"] = time.perf_counter() - t_start
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1))

    standin = None
    if not args.no_standin:
        # steps 2-5 keep 450 s of the budget (they had 480 s before step 6 came first)
        left = args.budget_s - (time.perf_counter() - t_start) - 450 if args.budget_s else None
        print(f"the paper-shaped stand-in by prompt length on {args.device} "
              f"(benchmarks/standin.py):", flush=True)
        standin = standin_check(args, out, None if left is None else max(left, 30.0))
        print(standin["table"] or "  no row", flush=True)
        print(f"  {standin['status']} in {standin['seconds']:.0f} s; rows "
              f"{out / 'standin.jsonl'}", flush=True)
        report["standin"] = standin
        save()
    ckpt = llama31_checkpoint(out / "llama31", seed=args.seed)
    data = rehearsal_datasets(out / "data", n=args.records)
    cfg = swap_sources(args.config, models={PAPER_MODEL: str(ckpt)}, datasets=data,
                       out=out / "runs")
    print(f"stages of {args.config} on {args.device} ({args.records} records per dataset):")
    timings = run_stages(cfg, args.device, args.only)
    report["timings"] = timings
    save()
    run = RunDir(out / "runs" / ckpt.name)
    print("CPU vs device on the same prompts (bfloat16):", flush=True)
    agreement = compare(ckpt, run, args.device, args.tol_mass, args.tol_logit)
    shards = None
    if args.shard_records:
        print(f"two shards on one {args.device} ({args.shard_records} records), merged:",
              flush=True)
        shards = shard_check(ckpt, data, args.device, args.shard_records, out,
                             args.tol_logit)
        print(f"  1 process {shards['one_process_s']:.1f} s, 2 shards "
              f"{shards['two_shards_s']:.1f} s, merge {shards['merge_s']:.1f} s; answers and "
              f"verdicts {'identical' if shards['same_answers_and_verdicts'] else 'DIFFER'}, "
              f"max |logit_diff| difference {shards['logit_diff_max_abs_diff']:.2e}")
    mapped = None
    if not args.no_device_map:
        n_layers = json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]
        dm = split_map(n_layers, args.device)
        print(f"device map: blocks 0-{n_layers // 2 - 1} on {args.device}, the rest on "
              f"{'the CPU' if args.device.startswith('cuda') else 'disk'}:", flush=True)
        plain = measure(ckpt, run, args.device)
        split = measure(ckpt, run, args.device, device_map=dm,
                        offload_folder=str(out / "offload"))
        mapped = compare(ckpt, run, args.device, args.tol_mass, args.tol_logit, ref=plain,
                         dev=split)
        print(f"  span mass max |plain - mapped| = {mapped['span_mass_max_abs_diff']:.2e}, "
              f"logit_diff {mapped['logit_diff_max_abs_diff']:.2e} nats")
    peak = (torch.cuda.max_memory_allocated() / 2**20
            if args.device.startswith("cuda") else None)
    report.update({"agreement": agreement, "shards": shards, "device_map": mapped,
                   "peak_gpu_memory_mib": peak})
    agree = agreement["agree"] and (shards is None or shards["agree"]) and (
        mapped is None or mapped["agree"])
    save()
    a = agreement
    print(f"  span mass: max |cpu - {args.device}| = {a['span_mass_max_abs_diff']:.2e} "
          f"(tolerance {args.tol_mass:g}; worst {a['span_mass_worst']}) over "
          f"{a['n_prompts']} prompts")
    print(f"  logit_diff: max |cpu - {args.device}| = {a['logit_diff_max_abs_diff']:.2e} nats "
          f"(tolerance {args.tol_logit:g}) over {a['n_records']} records")
    print(f"peak GPU memory: {'-' if peak is None else f'{peak:.0f} MiB'}; wall "
          f"{report['wall_s']:.0f} s; {'AGREE' if agree else 'DISAGREE'}; "
          f"report {out / 'gpu_check.json'}")
    if standin is not None and standin["status"].startswith("error"):
        print(f"the stand-in step failed: {standin['status']}")
        return 2
    return 0 if agree else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as err:  # noqa: BLE001 - one line, then the status the script promises
        print(f"error: {type(err).__name__}: {err}")
        raise SystemExit(2) from err
