"""A targeted test of attention heads a candidate-swap heads sweep singled out.

Usage: ``python -m experiments.findings.head_test RUN_DIR OUT_JSON L14.H5 [L12.H7 ...] [L14.*]``

RUN_DIR is a finished patching run with the ``candidate-swap`` pairs swept over ``heads``
(``experiments/findings_gap.toml``). The sweep patched each head alone, clean into corrupt:
how much of the gap one head's output RESTORES (denoising: is the head enough?). This script
takes the same pairs (rebuilt from each part's stored answers, checked against the stored
token counts and gaps) and, for each named head or head set (``L14.*`` = every head of layer
14) at every patchable position:

* ``denoise``: clean into corrupt, as the sweep did; its per-pair effects must equal the
  sweep's stored ones for a single head (a check of the rebuild, reported as
  ``max_abs_diff_vs_sweep``);
* ``noise``: corrupt into clean (the reverse pair: the right answer's prompt takes the head's
  output from the wrong answer's prompt): the share of the gap the head's output REMOVES,
  ``(LD_clean - LD_noised) / (LD_clean - LD_corrupt)`` (is the head needed?).

and, for each head of the named layers, where it looks: its attention (full pattern,
:func:`interp.hooks.recorder.record_stream`) on the candidate's tokens from the verdict
position and, averaged, from every position after the candidate, on both prompts
(``attention``; the layer's other heads for comparison).

The patching effects are ratios of sums over pairs with a passage-cluster bootstrap 95% CI
(:func:`interp.analysis.stats.cluster_bootstrap_ratio`), and the share of pairs whose forced choice
flips. Heimersheim & Nanda 2024 ("How to use and interpret activation patching", section 3):
denoising finds what is sufficient, noising what is necessary; a head can be one without the
other (a backup path takes over when it is removed).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from interp.analysis.stats import cluster_bootstrap_mean, cluster_bootstrap_ratio
from interp.core.errors import ConfigError
from interp.core.io import write_json
from interp.core.progress import tqdm
from interp.hooks.recorder import record_stream
from interp.judging.prompts import get_template, render
from interp.methods.pairs import align_positions
from interp.methods.patching import Patch, Patcher
from interp.models.points import hook_name
from interp.stages import load_run_model
from interp.stages.common import ok_records
from interp.store import RunDir


def parse_heads(specs: list[str], n_layers: int, n_heads: int) -> dict[str, tuple[int, tuple]]:
    """``L14.H5`` -> ``(14, (5,))``; ``L14.*`` -> every head of layer 14."""
    out = {}
    for s in specs:
        m = re.fullmatch(r"L(\d+)\.(?:H(\d+)|\*)", s)
        if not m or int(m[1]) >= n_layers or (m[2] and int(m[2]) >= n_heads):
            raise ConfigError(f"head {s!r}: write L<layer>.H<head> or L<layer>.* with layer < "
                              f"{n_layers} and head < {n_heads}")
        out[s] = (int(m[1]), (int(m[2]),) if m[2] else tuple(range(n_heads)))
    return out


def patch_both_ways(handle: Any, clean: Any, corrupt: Any,
                    heads: dict[str, tuple[int, tuple]], sweep_rows: list[dict[str, Any]]
                    ) -> dict[str, Any]:
    """One pair patched both ways: ``clean_ld``, ``corrupt_ld`` and per head set ``heads``.

    Each head set gets its denoised and noised ``LD`` (nats) and, for a single head, the
    sweep's stored effect (None where attribution did not rank it for exact patching).
    """
    fwd, _, _ = align_positions(clean.input_ids, corrupt.input_ids)
    rev, _, _ = align_positions(corrupt.input_ids, clean.input_ids)
    den = Patcher(handle, clean.input_ids, corrupt.input_ids, pos_map=fwd, batch_size=16)
    noi = Patcher(handle, corrupt.input_ids, clean.input_ids, pos_map=rev, batch_size=16)
    patches = [[Patch(hook_name(layer, "attn.hook_z"), None, hs)]
               for layer, hs in heads.values()]
    rd, rn = den.run(patches), noi.run(patches)
    sweep = {(r["layer"], r["head"]): r["effect"] for r in sweep_rows
             if r.get("effect") is not None}
    return {"clean_ld": rd.clean, "corrupt_ld": rd.corrupt, "heads": {
        s: {"denoised_ld": float(rd.patched[i]), "noised_ld": float(rn.patched[i]),
            "sweep_effect": sweep.get((layer, hs[0])) if len(hs) == 1 else None}
        for i, (s, (layer, hs)) in enumerate(heads.items())}}


def candidate_attention(handle: Any, prompt: Any, layers: list[int]
                        ) -> dict[int, dict[str, list[float]]]:
    """Per layer and head: attention on the candidate's tokens (summed over them).

    Returns ``{layer: {"verdict": [n_heads], "after": [n_heads]}}``: from the last position
    (the verdict position) and the mean over the positions after the candidate.
    """
    cand = prompt.span_positions("candidate")
    after = list(range(cand[-1] + 1, len(prompt)))
    pats: dict[int, Any] = {}

    def sink(name: str, start: int, value: Any) -> None:
        layer = int(name.split(".")[1])
        pat = pats.setdefault(layer, [])
        pat.append((start, value[:, after][:, :, cand].sum(-1).float().cpu()))

    record_stream(handle, prompt.input_ids, sink, layers=layers, points=())
    out = {}
    for layer, chunks in pats.items():
        m = torch.cat([v for _, v in sorted(chunks, key=lambda c: c[0])])  # [heads, after]
        out[layer] = {"verdict": m[:, -1].tolist(), "after": m.mean(1).tolist()}
    return out


def summarise(pairs: list[dict[str, Any]], heads: dict[str, tuple[int, tuple]],
              n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Per head: ratios of sums over pairs, both ways, as the sweep aggregates them.

    ``denoise`` = ``sum s (LD_denoised - LD_corrupt) / sum |gap|`` and ``noise`` =
    ``sum s (LD_clean - LD_noised) / sum |gap|`` with ``s = sign(LD_clean - LD_corrupt)``
    (:func:`interp.methods.patching.ratio_of_sums`: pairs whose judge prefers the wrong answer are
    aligned, not cancelled), passage-cluster bootstrap 95% CIs; ``flips``: pairs whose forced
    choice ends on the other side of 0 than the run it was patched into.
    """
    groups = [p["passage"] for p in pairs]
    gap = np.array([p["clean_ld"] - p["corrupt_ld"] for p in pairs])
    clean, corrupt = (np.array([p[k] for p in pairs]) for k in ("clean_ld", "corrupt_ld"))
    rng = np.random.default_rng(seed)
    out = {}
    for s, (layer, hs) in heads.items():
        den_ld, noi_ld = (np.array([p["heads"][s][k] for p in pairs])
                          for k in ("denoised_ld", "noised_ld"))
        res: dict[str, Any] = {"layer": layer, "heads": list(hs)}
        for way, num, ld, into in (("denoise", den_ld - corrupt, den_ld, corrupt),
                                   ("noise", clean - noi_ld, noi_ld, clean)):
            r = cluster_bootstrap_ratio(np.sign(gap) * num, np.abs(gap), groups, rng, n_boot)
            flips = int((np.sign(ld) != np.sign(into)).sum())
            res[way] = {**r, "flips": flips, "flip_share": flips / len(pairs)}
        if len(hs) == 1:
            diffs = [abs(p["heads"][s]["sweep_effect"] - (p["heads"][s]["denoised_ld"]
                         - p["corrupt_ld"]) / (p["clean_ld"] - p["corrupt_ld"]))
                     for p in pairs if p["heads"][s]["sweep_effect"] is not None]
            res["max_abs_diff_vs_sweep"] = max(diffs) if diffs else None
            res["n_sweep_checked"] = len(diffs)
        if all("attention" in p for p in pairs) and len(hs) == 1:
            h = hs[0]
            att = {}
            for prompt in ("clean", "corrupt"):
                for where in ("verdict", "after"):
                    x = np.array([p["attention"][prompt][str(layer)][where][h] for p in pairs])
                    lay = np.array([np.mean(p["attention"][prompt][str(layer)][where])
                                    for p in pairs])
                    att[f"{prompt}_{where}"] = {
                        "head": cluster_bootstrap_mean(x, groups, rng, n_boot),
                        "layer_mean": float(lay.mean())}
            res["attention_on_candidate"] = att
        out[s] = res
    return out


def swept_pairs(rd: RunDir, handle: Any) -> tuple[list[Path], Any]:
    """The candidate-swap heads sweep's part files and ``rebuild(part) -> (clean, corrupt)``.

    ``rebuild`` renders the pair's two judge prompts from the run's record and the part's
    stored answers, and checks their token counts against the part's.

    Raises:
        SystemExit: no swept pair, or a rebuilt pair whose token counts differ.
    """
    d = rd.path / "patching" / "candidate-swap"
    parts = sorted((d / "heads" / "parts").glob("*.json"))
    if not parts:
        raise SystemExit(f"{d}/heads/parts has no swept pair: run the heads sweep first")
    manifest, records = ok_records(rd, handle, None, stage="patching")
    mcfg = manifest.get("config", {})
    template = get_template(mcfg.get("template", "default"), mcfg.get("templates_path"))
    by_key = {(r["dataset"], str(r["id"])): r for r in records}

    def rebuild(part: dict[str, Any]) -> tuple[Any, Any]:
        meta = part["meta"]
        rec = by_key[(meta["dataset"], str(meta["id"]))]
        gold = next(a for a in rec["answers"] if a.strip())
        kw = {"context": rec["context"], "question": rec["question"], "reference": gold}
        clean = render(handle.tokenizer, template, "eval", answer=meta["clean_answer"], **kw)
        corrupt = render(handle.tokenizer, template, "eval", answer=meta["corrupt_answer"], **kw)
        if (len(clean), len(corrupt)) != (meta["n_clean"], meta["n_tokens"]):
            raise SystemExit(f"{meta['dataset']}/{meta['id']}: rebuilt pair has {len(clean)}/"
                             f"{len(corrupt)} tokens, the sweep's {meta['n_clean']}/"
                             f"{meta['n_tokens']}")
        return clean, corrupt

    return parts, rebuild


def main(run: str, out_json: str, specs: list[str]) -> None:
    """Rebuild the swept pairs, patch each named head both ways, write ``out_json``.

    Resumable: ``out_json`` is rewritten after every pair, and a rerun with the same run and
    heads patches only the pairs it lacks.
    """
    rd, out = RunDir(run), Path(out_json)
    handle = load_run_model(rd, device="cpu", dtype="float32")
    heads = parse_heads(specs, handle.n_layers, handle.model.config.num_attention_heads)
    parts, rebuild = swept_pairs(rd, handle)
    att_layers = sorted({layer for layer, _ in heads.values()})
    head_d = {s: [layer, list(hs)] for s, (layer, hs) in heads.items()}
    old = json.loads(out.read_text()) if out.exists() else {}
    same = old.get("run") == str(rd.path) and old.get("head_sets") == head_d \
        and old.get("sha256") == handle.info.get("sha256")
    done = {(p["dataset"], str(p["id"])): p for p in old.get("pairs", [])} if same else {}
    pairs_out, seconds = [], float(old.get("seconds", 0.0)) if same else 0.0
    for f in tqdm(parts, desc="pairs", unit="pair"):
        part = json.loads(f.read_text())
        meta = part["meta"]
        key = (meta["dataset"], str(meta["id"]))
        if key in done and "attention" in done[key]:
            pairs_out.append(done[key])
            continue
        t0 = time.perf_counter()
        clean, corrupt = rebuild(part)
        attention = {name: {str(k): v for k, v in candidate_attention(handle, pr, att_layers)
                            .items()} for name, pr in (("clean", clean), ("corrupt", corrupt))}
        if key in done:  # patched before attention was measured: add it
            rec_out = {**done[key], "attention": attention}
        else:
            rec_out = {"dataset": meta["dataset"], "id": meta["id"], "passage": meta["passage"],
                       "corrupt_source": meta.get("corrupt_source"),
                       **patch_both_ways(handle, clean, corrupt, heads, part["rows"]),
                       "attention": attention}
        pairs_out.append(rec_out)
        done[key] = rec_out  # the file keeps every finished pair, also those not reached yet
        seconds += time.perf_counter() - t0
        write_json(out, {"run": str(rd.path), "model": handle.spec,
                         "sha256": handle.info.get("sha256"), "head_sets": head_d,
                         "seconds": round(seconds, 1), "pairs": list(done.values())})
    summary = summarise(pairs_out, heads)
    write_json(out, {
        "run": str(rd.path), "model": handle.spec, "sha256": handle.info.get("sha256"),
        "pair": "candidate-swap", "positions": "every patchable position (as the heads sweep)",
        "aggregate": "ratio of sums, sign-aligned (interp.methods.patching.ratio_of_sums), "
                     "passage-cluster bootstrap 95% CI, 2000 resamples",
        "head_sets": head_d, "n_pairs": len(pairs_out),
        "n_passages": len({p["passage"] for p in pairs_out}), "seconds": round(seconds, 1),
        "summary": summary, "pairs": pairs_out})
    for s, r in summary.items():
        print(f"{s}: denoise {r['denoise']['value']:.3f} {r['denoise']['ci']}  "
              f"noise {r['noise']['value']:.3f} {r['noise']['ci']}  flips "
              f"{r['denoise']['flips']}/{r['noise']['flips']} of {len(pairs_out)}")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__.split("\n\n")[1])
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
