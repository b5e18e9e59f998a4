"""Do earlier heads act on the verdict THROUGH a later head? Blocking the receiver, both ways.

Usage: ``python -m experiments.findings.path_test RUN_DIR OUT_JSON RECEIVERS SENDERS [SENDERS ...]``

``RECEIVERS``: heads of one layer, comma-separated (``L14.H5,L14.H3``; ``L14.*`` the layer's
every head); ``L14.H5@last`` holds the head at the verdict position only, ``L14.H5@rest``
at every other patchable position. ``SENDERS``: a head set of earlier layers, ``+``-joined
(``L10.H4+L12.H2+L12.H7``). RUN_DIR and its pairs are those of
``experiments/findings/head_test.py``: a finished candidate-swap heads sweep, its pairs rebuilt from
each part's stored answers and checked against the stored token counts.

For each sender set, at every patchable position, both ways (:mod:`experiments.findings.head_test`):

* ``denoise``: the senders' outputs (``attn.hook_z``) from the clean prompt patched into the
  corrupt one; once with everything else free (``free``), and once per receiver with that
  receiver's output held at the corrupt run's own value (``frozen``);
* ``noise``: the senders' outputs from the corrupt prompt patched into the clean one, free,
  and with the receiver held at the clean run's own value.

Holding the receiver blocks every path from the senders that runs through it (to the logits
directly or through later layers); paths around it stay open. So
``through = (effect_free - effect_frozen) / effect_free`` is the share of the senders' effect
that needs the receiver (a ratio of sums over pairs, sign-aligned by the pair's gap, with a
passage-cluster bootstrap 95% CI). It is the blocking form of path patching: Wang et al. 2022
("Interpretability in the Wild", section 3.1) patch the sender-to-receiver path forward;
Heimersheim & Nanda 2024 (section 3) discuss both. A receiver that is not on the path gives
``through`` near 0; a second head of the same layer is the control. Effects are also given as
shares of the pair's gap, ``sum s (LD - LD_base) / sum |gap|``. A check on every pair: the
receiver held with no sender patched gives the run's own ``LD``
(``held_alone_max_abs_diff``, nats).

The receiver is held at the patchable positions (the positions from the first token where
the two prompts differ that have a counterpart in the other prompt): the candidate's own
extra tokens, where the prompts have no counterpart, stay free; they precede the template
tokens and the verdict position, where the heads this is run on act.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.findings.head_test import parse_heads, swept_pairs
from interp.analysis.stats import cluster_bootstrap_ratio
from interp.core.errors import ConfigError
from interp.core.io import write_json
from interp.core.progress import tqdm
from interp.methods.pairs import align_positions
from interp.methods.patching import Patch, Patcher, own_activation
from interp.models.points import hook_name
from interp.stages import load_run_model
from interp.store import RunDir


def parse_senders(spec: str, n_layers: int, n_heads: int) -> list[tuple[int, tuple]]:
    """``L10.H4+L12.H2`` -> ``[(10, (4,)), (12, (2,))]`` (heads of a layer merged)."""
    by_layer: dict[int, set] = {}
    for layer, hs in parse_heads(spec.split("+"), n_layers, n_heads).values():
        by_layer.setdefault(layer, set()).update(hs)
    return [(layer, tuple(sorted(hs))) for layer, hs in sorted(by_layer.items())]


def parse_receivers(spec: str, n_layers: int, n_heads: int) -> dict[str, tuple]:
    """``L14.H5,L14.H5@last`` -> ``{name: (layer, heads, where)}``.

    ``where``: ``all`` (every patchable position), ``last`` (the verdict position only) or
    ``rest`` (every patchable position but the verdict position).

    Raises:
        ConfigError: an unknown ``@`` suffix, or a malformed head.
    """
    out = {}
    for item in spec.split(","):
        name, _, where = item.partition("@")
        if (where or "all") not in ("all", "last", "rest"):
            raise ConfigError(f"receiver {item!r}: write HEAD, HEAD@last or HEAD@rest")
        ((layer, hs),) = parse_heads([name], n_layers, n_heads).values()
        out[item] = (layer, hs, where or "all")
    return out


def block_both_ways(handle: Any, clean: Any, corrupt: Any, receivers: dict[str, tuple],
                    senders: dict[str, list[tuple[int, tuple]]]) -> dict[str, Any]:
    """One pair: per sender set, ``LD`` with the senders patched, free and per receiver held."""
    (r_layer,) = {r[0] for r in receivers.values()}
    hook = hook_name(r_layer, "attn.hook_z")
    out: dict[str, Any] = {}
    for way, src, dst in (("denoise", clean, corrupt), ("noise", corrupt, clean)):
        pos_map, _, _ = align_positions(src.input_ids, dst.input_ids)
        p = Patcher(handle, src.input_ids, dst.input_ids, pos_map=pos_map, batch_size=16,
                    held={hook: own_activation(handle, dst.input_ids, hook)})
        last = len(dst) - 1
        where = {"all": None, "last": (last,),
                 "rest": tuple(i for i in p.patchable() if i != last)}
        held = {r: Patch(hook, where[w], hs) for r, (_, hs, w) in receivers.items()}
        rows, keys = [], []
        for s, groups in senders.items():
            base = [Patch(hook_name(layer, "attn.hook_z"), None, hs) for layer, hs in groups]
            rows.append(base)
            keys.append((s, "free"))
            for r, h in held.items():
                rows.append(base + [h])
                keys.append((s, r))
        for r, h in held.items():  # a check: holding alone changes nothing
            rows.append([h])
            keys.append(("held_alone", r))
        res = p.run(rows)
        if way == "denoise":
            out["clean_ld"], out["corrupt_ld"] = res.clean, res.corrupt
        own = res.corrupt  # the run patched into: corrupt (denoise) or clean (noise)
        for (s, what), ld in zip(keys, res.patched, strict=True):
            if s == "held_alone":
                diff = abs(float(ld) - own)
                out["held_alone_max_abs_diff"] = max(out.get("held_alone_max_abs_diff", 0.0),
                                                     diff)
            else:
                out.setdefault(s, {}).setdefault(way, {})[what] = float(ld)
    return out


def summarise(pairs: list[dict[str, Any]], receivers: dict[str, tuple],
              senders: dict[str, Any], n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Per sender set and way: effects as gap shares, and per receiver the share through it."""
    groups = [p["passage"] for p in pairs]
    clean, corrupt = (np.array([p[k] for p in pairs]) for k in ("clean_ld", "corrupt_ld"))
    gap = clean - corrupt
    sg, rng = np.sign(gap), np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for s in senders:
        res: dict[str, Any] = {}
        for way in ("denoise", "noise"):
            ld = {w: np.array([p[s][way][w] for p in pairs]) for w in ("free", *receivers)}
            # the senders' effect: what they restore (denoise) or remove (noise), in nats
            eff = {w: sg * ((v - corrupt) if way == "denoise" else (clean - v))
                   for w, v in ld.items()}
            r: dict[str, Any] = {"effect_free": cluster_bootstrap_ratio(
                eff["free"], np.abs(gap), groups, rng, n_boot)}
            for rcv in receivers:
                r[f"effect_held_{rcv}"] = cluster_bootstrap_ratio(
                    eff[rcv], np.abs(gap), groups, rng, n_boot)
                r[f"through_{rcv}"] = cluster_bootstrap_ratio(
                    eff["free"] - eff[rcv], eff["free"], groups, rng, n_boot)
            res[way] = r
        out[s] = res
    return out


def main(run: str, out_json: str, receiver_spec: str, sender_specs: list[str]) -> None:
    """Rebuild the swept pairs, block each receiver under each sender set, write ``out_json``.

    Resumable: ``out_json`` is rewritten after every pair, and a rerun with the same run,
    receivers and senders patches only the pairs it lacks.

    Raises:
        ConfigError: receivers of more than one layer, or senders not in earlier layers.
    """
    rd, out = RunDir(run), Path(out_json)
    handle = load_run_model(rd, device="cpu", dtype="float32")
    nl, nh = handle.n_layers, handle.model.config.num_attention_heads
    receivers = parse_receivers(receiver_spec, nl, nh)
    senders = {s: parse_senders(s, nl, nh) for s in sender_specs}
    r_layers = {r[0] for r in receivers.values()}
    if len(r_layers) != 1:
        raise ConfigError(f"receivers {receiver_spec!r}: name heads of one layer")
    if any(layer >= min(r_layers) for g in senders.values() for layer, _ in g):
        raise ConfigError(f"senders {sender_specs}: every sender must lie in a layer before "
                          f"the receivers' ({min(r_layers)})")
    parts, rebuild = swept_pairs(rd, handle)
    spec = {"receivers": {r: [layer, list(hs)] + ([w] if w != "all" else [])
                          for r, (layer, hs, w) in receivers.items()},
            "senders": {s: [[layer, list(hs)] for layer, hs in g] for s, g in senders.items()}}
    old = json.loads(out.read_text()) if out.exists() else {}
    same = old.get("run") == str(rd.path) and old.get("spec") == spec \
        and old.get("sha256") == handle.info.get("sha256")
    done = {(p["dataset"], str(p["id"])): p for p in old.get("pairs", [])} if same else {}
    seconds = float(old.get("seconds", 0.0)) if same else 0.0
    head = {"run": str(rd.path), "model": handle.spec, "sha256": handle.info.get("sha256"),
            "spec": spec}
    pairs_out = []
    for f in tqdm(parts, desc="pairs", unit="pair"):
        part = json.loads(f.read_text())
        meta = part["meta"]
        key = (meta["dataset"], str(meta["id"]))
        if key not in done:
            t0 = time.perf_counter()
            clean, corrupt = rebuild(part)
            done[key] = {"dataset": meta["dataset"], "id": meta["id"],
                         "passage": meta["passage"],
                         "corrupt_source": meta.get("corrupt_source"),
                         **block_both_ways(handle, clean, corrupt, receivers, senders)}
            seconds += time.perf_counter() - t0
            write_json(out, {**head, "seconds": round(seconds, 1),
                             "pairs": list(done.values())})
        pairs_out.append(done[key])
    summary = summarise(pairs_out, receivers, senders)
    write_json(out, {
        **head, "pair": "candidate-swap",
        "positions": "every patchable position (as the heads sweep), senders and held receivers",
        "aggregate": "ratio of sums, sign-aligned by the pair's gap, passage-cluster bootstrap "
                     "95% CI, 2000 resamples; through_R = (effect_free - effect_held_R) / "
                     "effect_free",
        "held_alone_max_abs_diff": max(p["held_alone_max_abs_diff"] for p in pairs_out),
        "n_pairs": len(pairs_out), "n_passages": len({p["passage"] for p in pairs_out}),
        "seconds": round(seconds, 1), "summary": summary, "pairs": pairs_out})
    for s, res in summary.items():
        for way, r in res.items():
            print(f"{s} {way}: free {r['effect_free']['value']:.3f}  " + "  ".join(
                f"held {rc} {r[f'effect_held_{rc}']['value']:.3f} through "
                f"{r[f'through_{rc}']['value']:.2f} {np.round(r[f'through_{rc}']['ci'], 2)}"
                for rc in receivers))


if __name__ == "__main__":
    if len(sys.argv) < 5:
        raise SystemExit(__doc__.split("\n\n")[1])
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
