"""Benchmark: how often AtP* (attribution, then exact top-k) agrees with the full exact sweep.

On a finished asymmetry run, the patching stage's ``attribution`` sweep patches EVERY unit
exactly and computes the attribution estimate of every unit, per pair
(:mod:`interp.methods.patch_sweeps`). From those tables this reports, per pair kind and sweep
(``resid``: (layer, position) and (layer, span); ``heads``: (layer, head)) and for several
verification budgets ``k``:

* ``overlap@k``: the share of the exact top-``k`` units (by ``|d_ld|``) that AtP* verifies
  (its top-``k`` by ``|attr_ld|``), mean over pairs;
* ``top-1``: how often the unit with the largest exact change is verified;
* Spearman of the estimate against the exact change (mean over pairs);
* cost in clean forwards per pair: attribution alone (one pass scores both sweeps), AtP*
  (attribution + ``k`` exact rows, rows costed at the full sweep's mean row cost), and the
  full sweep.

Not a test: the numbers describe the pairs of the run given. Example::

    OMP_NUM_THREADS=1 python benchmarks/atp_agreement.py --run runs/smol \
        --pairs candidate-swap,gen-to-eval --limit 3 --layers all --k 4,8,16,32
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import pandas as pd
import torch

from interp.core.io import read_json
from interp.methods.patch_sweeps import agreement
from interp.stages import load_run_model
from interp.stages.patching import PatchingConfig, run
from interp.store.rundir import RunDir


def report(run_dir: RunDir, pk: str, ks: list[int]) -> list[dict]:
    """The agreement table of one pair kind from its stored ``attribution`` parts."""
    d = run_dir.path / "patching" / pk / "attribution"
    parts = [read_json(f) for f in sorted((d / "parts").glob("*.json"))]
    out = []
    for sub, is_sub in (("resid", lambda u: u != "head"), ("heads", lambda u: u == "head")):
        for k in ks:
            ag, attr, full, atp = [], [], [], []
            for part in parts:
                rows = [r for r in part["rows"] if is_sub(r["unit"])]
                a = agreement(rows, k)
                ag.append(a)
                m = part["meta"]["agreement"]
                # one attribution pass scores both sweeps (the second reads it back)
                c_attr = max(m["resid"]["attr_cost_ratio"], m["heads"]["attr_cost_ratio"])
                c_full = m[sub]["exact_cost_ratio"]
                attr.append(c_attr)
                full.append(c_full)
                atp.append(c_attr + min(k, len(rows)) * c_full / max(len(rows), 1))
            out.append({"pairs": pk, "sweep": sub, "k": k, "n_pairs": len(ag),
                        "units_mean": float(np.mean([a["n"] for a in ag])),
                        "overlap_at_k": float(np.mean([a["overlap_at_k"] for a in ag])),
                        "top1_verified": float(np.mean([a["top1_verified"] for a in ag])),
                        "spearman": float(np.nanmean([np.nan if a["spearman"] is None
                                                      else a["spearman"] for a in ag])),
                        "cost_attr": float(np.mean(attr)), "cost_atp_k": float(np.mean(atp)),
                        "cost_full": float(np.mean(full))})
    return out


def main() -> None:
    """Run the comparison (or read it back) and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--pairs", default="candidate-swap,gen-to-eval")
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--layers", default="all")
    ap.add_argument("--k", default="4,8,16,32")
    ap.add_argument("--max-tokens", type=int, default=1024)
    args = ap.parse_args()
    rd = RunDir(args.run)
    handle = load_run_model(rd)
    cfg = PatchingConfig.from_mapping({"pairs": args.pairs, "kinds": ["attribution"],
                                       "limit": args.limit, "layers": args.layers,
                                       "max_tokens": args.max_tokens, "figures": False,
                                       "n_boot": 100})
    t = time.perf_counter()
    run(rd, handle, cfg, log=print)
    wall = time.perf_counter() - t
    ks = [int(x) for x in args.k.split(",")]
    rows = [r for pk in cfg.pairs for r in report(rd, pk, ks)]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"torch threads {torch.get_num_threads()}; stage wall {wall:.0f} s")
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.2f}"))


if __name__ == "__main__":
    main()
