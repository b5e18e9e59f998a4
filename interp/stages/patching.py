"""The patching stage: pairs x sweeps over a run directory, resumable, with tables and figures.

Algorithm of :func:`run` (methods: :mod:`interp.pairs` and :mod:`interp.patching`):

1. Validate the config and the layers (:func:`interp.layers.parse_layers`, then every
   ``layer_stride``-th) before any model work.
2. For each pair kind: build the pairs from the run's ``ok`` records with the run's template
   (:func:`interp.pairs.build_pairs`, ``limit`` built pairs per dataset).
3. For each sweep kind and pair: reuse ``parts/{dataset}__{id}.json`` when it is fresh (its
   signature, :func:`interp.store.signature`, covers the model and its sha256, the sweep kind,
   the layers, the hook point, ``per_position``, the pair's token ids, position map and shared
   prefix, and the result-relevant runtime facts, :func:`interp.stages.common.stage_facts`:
   parts made under other facts are refused unless ``overwrite``); else run the sweep
   (:func:`run_pair`) and write the part atomically. ``attribution`` takes its exact-patching
   comparison from the ``heads`` / ``resid`` sweeps of the same pair in the same call when
   they were run (same units), instead of running them again.
4. Per (pair kind, sweep kind): ``pairs.parquet`` (one row per pair: clean/corrupt logit
   differences, cost), ``effects.parquet`` (+ ``.csv``; one row per patched unit) and
   ``summary.json`` (:func:`summarise`), then the figures (:func:`interp.plots.plot_patching`).
5. ``DIR/patching/summary.json`` gathers every (pairs, kind) summary of this and earlier calls.

Layout: ``DIR/patching/{pairs}/{kind}/parts/{dataset}__{id}.json``, ``effects.parquet``,
``pairs.parquet``, ``summary.json``; ``DIR/patching/summary.json``; ``DIR/figures/patching_*.png``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from interp.errors import PatchingError
from interp.layers import parse_layers
from interp.models import ModelHandle
from interp.pairs import PAIR_KINDS, PatchPair, build_pairs
from interp.patching import Patch, Patcher, sweep_heads, sweep_resid, sweep_task_layers
from interp.prompts import get_template
from interp.stages.common import stage_facts
from interp.stats import correlations
from interp.store import (
    RunDir,
    config_from_table,
    is_fresh,
    read_json,
    signature,
    write_json,
    write_table,
)

NAME = "patching"
SUMMARIES = {"patching/summary.json": "patching_summary.json"}
"""Run-dir tables that ``interp run`` copies next to the figures (source -> name)."""
SWEEP_KINDS = ("resid", "heads", "attribution")


@dataclass
class PatchingConfig:
    """Settings of ``interp patch`` / the ``[patching]`` config table.

    Attributes:
        pairs: pair kinds to run (``candidate-swap``, ``task-swap``).
        kinds: sweeps (``resid``, ``heads``, ``attribution``).
        limit: built pairs per dataset (None: all).
        layers: layers to sweep, a spec of :func:`interp.layers.parse_layers` (``"all"``,
            ``"last8"``, ``"24-31"``, ``"0,4,-1"``) or a list (None: all).
        layer_stride: sweep every k-th layer (after ``layers``).
        hook: residual hook point for ``resid`` and task-swap (``hook_resid_pre`` or
            ``hook_resid_post``).
        per_position: also sweep single positions (not only spans) in ``resid``.
        max_tokens: refuse pairs longer than this (CPU time).
        batch_size: patched rows per forward.
        backend: ``hf`` (the sweeps need it; :func:`interp.patching.patch` takes all three).
        prefix_cache: reuse the shared prefix's key/value cache.
        figures: draw the figures after the tables.
    """

    pairs: list[str] = field(default_factory=lambda: ["candidate-swap"])
    kinds: list[str] = field(default_factory=lambda: ["resid"])
    limit: int | None = 5
    layers: str | list[int] | None = None
    layer_stride: int = 1
    hook: str = "hook_resid_pre"
    per_position: bool = True
    max_tokens: int | None = 1024
    batch_size: int = 16
    backend: str = "hf"
    prefix_cache: bool = True
    figures: bool = True

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> PatchingConfig:
        """Build from a mapping, refusing unknown keys and values (lists the known ones).

        Raises:
            ValueError: unknown keys (the message lists the known ones).
            PatchingError: unknown pair kinds, sweep kinds, hooks or backends.
        """
        d = dict(d)
        for k in ("pairs", "kinds"):
            if isinstance(d.get(k), str):
                d[k] = [x.strip() for x in d[k].split(",")]
        cfg = config_from_table(cls, d, NAME)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raises PatchingError on unknown pair kinds, sweep kinds, hooks or backends."""
        for p in self.pairs:
            if p not in PAIR_KINDS:
                raise PatchingError(f"unknown pair kind {p!r}; valid: {list(PAIR_KINDS)}")
        for k in self.kinds:
            if k not in SWEEP_KINDS:
                raise PatchingError(f"unknown kind {k!r}; valid: {list(SWEEP_KINDS)}")
        if self.hook not in ("hook_resid_pre", "hook_resid_post"):
            raise PatchingError(f"hook must be hook_resid_pre or hook_resid_post, not "
                                f"{self.hook!r}")
        if self.backend != "hf":
            raise PatchingError("sweeps run on the hf backend (use patch() for the others)")

    def layer_list(self, n_layers: int) -> list[int]:
        """The swept layers.

        Raises:
            LayerSpecError: a bad spec or a layer out of range (names the valid range).
        """
        layers = parse_layers(self.layers, n_layers, default="all")
        return layers[:: max(1, self.layer_stride)]


# ---------------------------------------------------------------------------------------------
# One pair
# ---------------------------------------------------------------------------------------------


def _pair_meta(pair: PatchPair, pt: Patcher) -> dict[str, Any]:
    return {"id": pair.record_id, "dataset": pair.dataset, "pair": pair.kind,
            "n_tokens": len(pair.corrupt), "start": pair.start,
            "clean_answer": pair.clean_answer, "corrupt_answer": pair.corrupt_answer,
            "corrupt_source": pair.corrupt_source, "clean_ld": pt.clean_ld,
            "corrupt_ld": pt.corrupt_ld, "clean_forward_s": pt.clean_forward_s}


def _exact_resid(pt: Patcher, pair: PatchPair, cfg: PatchingConfig, layers: Sequence[int],
                 prior: Mapping[str, Mapping[str, Any]]) -> tuple[list[dict], float, bool]:
    """Exact resid patching for the attribution comparison: ``(rows, wall_s, reused)``."""
    if pair.kind == "candidate-swap" and "resid" in prior and cfg.per_position \
            and cfg.hook == "hook_resid_pre":
        return prior["resid"]["resid"], prior["resid"]["meta"]["wall_s"], True
    if pair.kind == "task-swap":
        pos = tuple(range(*pair.corrupt.token_spans["context"]))
        res = pt.run([Patch(f"blocks.{layer}.hook_resid_pre", pos) for layer in layers])
        rows = [{"layer": layer, "unit": "span", "position": -1, "span": "context",
                 "ld": float(ld)} for layer, ld in zip(layers, res.patched)]
        return rows, res.wall_s, False
    rows, wall = sweep_resid(pt, pair.corrupt, layers=layers, hook="hook_resid_pre",
                             start=pair.start, per_position=True)
    return rows, wall, False


def _attribution_rows(pt: Patcher, pair: PatchPair, att: Mapping[str, np.ndarray],
                      exact_h: list[dict], exact_r: list[dict]) -> list[dict]:
    """Attribution estimates next to the exact changes, per head and per resid unit."""
    den = pt.clean_ld - pt.corrupt_ld

    def norm(a: float) -> float:
        return float(a / den) if abs(den) > 1e-6 else float("nan")

    rows = [{**r, "unit": "head", "attr_ld": float(a), "exact_d_ld": r["ld"] - pt.corrupt_ld,
             "attr_effect": norm(a)}
            for r in exact_h for a in [att["heads"][r["layer"], r["head"]]]]
    ctx = list(range(*pair.corrupt.token_spans.get("context", (0, 0))))
    for r in exact_r:
        if r["unit"] == "position":
            a = att["resid"][r["layer"], r["position"]]
        elif r["span"] == "context" and pair.kind == "task-swap":
            a = att["resid"][r["layer"], ctx].sum()
        else:
            continue
        rows.append({"layer": r["layer"], "head": -1, "unit": r["unit"],
                     "position": r["position"], "ld": r["ld"], "attr_ld": float(a),
                     "exact_d_ld": r["ld"] - pt.corrupt_ld, "attr_effect": norm(a),
                     "effect": r.get("effect", float("nan"))})
    return rows


def run_pair(handle: ModelHandle, pair: PatchPair, kind: str, cfg: PatchingConfig,
             layers: Sequence[int], prior: Mapping[str, Mapping[str, Any]] | None = None
             ) -> dict[str, Any]:
    """All tables of one pair for one sweep kind (module docstring, step 3).

    Args:
        handle: the model.
        pair: the pair.
        kind: ``resid``, ``heads`` or ``attribution``.
        cfg: hook, per-position, batch size and prefix-cache settings.
        layers: layers to sweep.
        prior: kind (``heads``, ``resid``) -> this pair's finished sweep of that kind on the
            same layers; ``attribution`` then takes its exact-patching comparison from them
            (``resid`` only when it used ``hook_resid_pre`` per position, the units
            attribution scores).

    Returns:
        ``{"meta": {...}, <table>: [rows]}`` with table ``resid``, ``task_layers``, ``heads``
        or ``attribution``; ``meta`` holds the clean/corrupt logit differences, wall time and
        cost in clean forwards.
    """
    prior = prior or {}
    pt = Patcher(handle, pair.clean.input_ids, pair.corrupt.input_ids, pos_map=pair.pos_map,
                 start=pair.start, batch_size=cfg.batch_size, prefix_cache=cfg.prefix_cache)
    pt.ensure_clean([])
    meta = _pair_meta(pair, pt)
    out: dict[str, Any] = {"meta": meta}
    band = list(range(max(0, handle.n_layers - 8), handle.n_layers))
    if pair.kind == "task-swap" and kind == "resid":
        out["task_layers"], wall = sweep_task_layers(pt, pair.corrupt, layers=layers,
                                                     hook=cfg.hook, band=band)
    elif kind == "resid":
        out["resid"], wall = sweep_resid(pt, pair.corrupt, layers=layers, hook=cfg.hook,
                                         start=pair.start, per_position=cfg.per_position)
    elif kind == "heads":
        out["heads"], wall = sweep_heads(pt, layers=layers, start=pair.start)
    else:  # attribution, with exact patching on the same pair for the comparison
        t0 = time.perf_counter()
        att = pt.attribution(layers)
        wall = time.perf_counter() - t0
        if "heads" in prior:
            exact_h, w1 = prior["heads"]["heads"], prior["heads"]["meta"]["wall_s"]
        else:
            exact_h, w1 = sweep_heads(pt, layers=layers, start=pair.start)
        exact_r, w2, reused_r = _exact_resid(pt, pair, cfg, layers, prior)
        out["attribution"] = _attribution_rows(pt, pair, att, exact_h, exact_r)
        meta["exact_wall_s"] = w1 + w2
        meta["exact_reused_from"] = ["heads"] * ("heads" in prior) + ["resid"] * reused_r
    meta["wall_s"] = wall
    meta["cost_ratio"] = wall / pt.clean_forward_s
    return out


def part_signature(cfg: PatchingConfig, kind: str, layers: Sequence[int], handle: ModelHandle,
                   pair: PatchPair, facts: Mapping[str, Any] | None = None) -> str:
    """Signature of one pair's sweep: everything that shapes it (module docstring, step 3).

    ``facts``: :func:`interp.models.result_facts` of the call.
    """
    return signature({"model": handle.spec, "sha256": handle.info.get("sha256"), "kind": kind,
                      "layers": list(layers), "hook": cfg.hook,
                      "per_position": cfg.per_position, "clean": pair.clean.input_ids,
                      "corrupt": pair.corrupt.input_ids, "pos_map": list(pair.pos_map or []),
                      "start": pair.start, "runtime": facts})


# ---------------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------------


def _summary_candidate_resid(df: Any, top: int) -> dict[str, Any]:
    s: dict[str, Any] = {}
    sp = df[df.unit == "span"].groupby(["layer", "span"]).effect.mean().unstack()
    s["span_effect_by_layer"] = {c: {int(k): float(v) for k, v in sp[c].items()}
                                 for c in sp.columns}
    pos = df[df.unit == "position"]
    if len(pos):
        lay = pos.groupby("layer").effect.apply(lambda e: float(np.nanmax(np.abs(e))))
        s["top_layers"] = [{"layer": int(k), "max_abs_position_effect": float(v)}
                           for k, v in lay.sort_values(ascending=False).head(top).items()]
        cell = pos.groupby(["layer", "rel_position"]).effect.mean()
        s["top_cells"] = [{"layer": int(k[0]), "rel_position": int(k[1]),
                           "mean_effect": float(cell[k])}
                          for k in cell.abs().sort_values(ascending=False).head(top).index]
    return s


def _summary_task_resid(df: Any, top: int) -> dict[str, Any]:
    g = df.groupby("layer")[["d_ld", "d_p_correct", "d_context_mass"]].mean()
    flips = df.groupby("layer").verdict_flip.mean()
    gl = g.drop(index=-1, errors="ignore")
    return {"by_layer": {int(k): {**{c: float(v[c]) for c in g.columns},
                                  "flip_rate": float(flips[k])} for k, v in g.iterrows()},
            "top_layers": [{"layer": int(k), "mean_d_ld": float(gl.d_ld[k])}
                           for k in gl.d_ld.abs().sort_values(ascending=False).head(top).index]}


def _summary_heads(df: Any, pk: str, metas: list[dict], top: int) -> dict[str, Any]:
    col = "effect"
    if pk == "task-swap":
        base = {m["id"]: m["corrupt_ld"] for m in metas}
        df["d_ld"] = df.ld - df.id.map(base)
        col = "d_ld"
    hm = df.groupby(["layer", "head"])[col].mean()
    return {"top_heads": [{"layer": int(k[0]), "head": int(k[1]), f"mean_{col}": float(hm[k])}
                          for k in hm.abs().sort_values(ascending=False).head(top).index]}


def _summary_attribution(df: Any, metas: list[dict]) -> dict[str, Any]:
    h, r = df[df.unit == "head"], df[df.unit != "head"]
    per = [correlations(g.attr_ld.to_numpy(), g.exact_d_ld.to_numpy())["pearson"]
           for _, g in h.groupby("id")]
    per = [x for x in per if x is not None]
    return {"correlation_heads": correlations(h.attr_ld.to_numpy(), h.exact_d_ld.to_numpy()),
            "correlation_resid": correlations(r.attr_ld.to_numpy(), r.exact_d_ld.to_numpy()),
            "exact_cost_ratio_mean": float(np.mean(
                [m["exact_wall_s"] / m["clean_forward_s"] for m in metas])),
            "correlation_heads_per_pair_mean_pearson": float(np.mean(per)) if per else None}


def summarise(d: Path, pk: str, kind: str, results: list[dict], refused: list[dict],
              layers: Sequence[int], handle: ModelHandle, top: int = 5) -> dict[str, Any]:
    """Write the tables of one (pairs, kind) and return its summary (module docstring, step 4).

    Returns:
        ``pairs``, ``kind``, ``n_pairs``, ``n_refused`` (+ the first 20 refusals), ``layers``,
        ``model``, mean clean/corrupt logit differences and costs, and per kind: span effects
        by layer, top layers and cells (candidate-swap resid); per-layer changes and flip rate
        (task-swap resid); top heads (heads); attribution-vs-exact correlations (attribution).
    """
    import pandas as pd

    metas = [r["meta"] for r in results]
    if metas:
        write_table(pd.DataFrame(metas), d / "pairs.parquet")
    s: dict[str, Any] = {"pairs": pk, "kind": kind, "n_pairs": len(results),
                         "n_refused": len(refused), "refused": refused[:20],
                         "layers": list(layers), "model": handle.spec}
    if not results:
        return s
    s["cost_ratio_mean"] = float(np.mean([m["cost_ratio"] for m in metas]))
    s["clean_forward_s_mean"] = float(np.mean([m["clean_forward_s"] for m in metas]))
    s["mean_clean_ld"] = float(np.mean([m["clean_ld"] for m in metas]))
    s["mean_corrupt_ld"] = float(np.mean([m["corrupt_ld"] for m in metas]))
    rows = [{"id": r["meta"]["id"], "dataset": r["meta"]["dataset"], "table": table, **x}
            for r in results for table in ("resid", "heads", "task_layers", "attribution")
            for x in r.get(table, [])]
    df = pd.DataFrame(rows)
    write_table(df, d / "effects.parquet")
    if kind == "resid":
        s.update(_summary_candidate_resid(df, top) if pk == "candidate-swap"
                 else _summary_task_resid(df, top))
    elif kind == "heads":
        s.update(_summary_heads(df, pk, metas, top))
    else:
        s.update(_summary_attribution(df, metas))
    return s


# ---------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------


def _sweep_kind(handle: ModelHandle, cfg: PatchingConfig, pk: str, kind: str,
                pairs: list[PatchPair], layers: list[int], parts: Path,
                finished: dict[tuple[str, str, str], dict], log: Callable[[str], None],
                facts: Mapping[str, Any] | None = None) -> list[dict]:
    """Every pair's sweep of one kind: fresh parts read back, the others run and written."""
    results = []
    for pair in pairs:
        f = parts / f"{pair.key}.json"
        sig = part_signature(cfg, kind, layers, handle, pair, facts)
        if is_fresh(f, sig):
            res = read_json(f)
        else:
            if f.exists():
                log(f"[{pk}/{kind}] {pair.key}: stored sweep used other settings; redone")
            prior = {k: finished[(pk, pair.key, k)] for k in ("heads", "resid")
                     if (pk, pair.key, k) in finished} if kind == "attribution" else None
            res = run_pair(handle, pair, kind, cfg, layers, prior=prior)
            res["meta"]["signature"] = sig
            write_json(f, res)
            m = res["meta"]
            log(f"[{pk}/{kind}] {pair.dataset} {pair.record_id}: clean LD "
                f"{m['clean_ld']:+.2f}, corrupt LD {m['corrupt_ld']:+.2f}, sweep "
                f"{m['wall_s']:.1f} s = {m['cost_ratio']:.0f} clean forwards")
        finished[(pk, pair.key, kind)] = res
        results.append(res)
    return results


def run(run_dir: RunDir | str | Path, handle: ModelHandle, cfg: PatchingConfig, *,
        overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every (pair kind, sweep kind) of ``cfg`` on a run's records (module docstring).

    ``overwrite``: redo parts computed under other result-relevant runtime facts (else they
    are refused).

    Returns:
        ``{"{pairs}/{kind}": summary}`` of this call (also merged into
        ``DIR/patching/summary.json``).

    Raises:
        PatchingError: bad config values (unknown kinds).
        LayerSpecError: layers out of range.
        RunDirError: the run has no manifest or no records, or parts computed under other
            runtime facts and not ``overwrite``.
    """
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    cfg.validate()
    layers = cfg.layer_list(handle.n_layers)
    facts = stage_facts(run_dir, handle, NAME, overwrite=overwrite)
    mcfg = run_dir.manifest().get("config", {})
    template = get_template(mcfg.get("template", "default"), mcfg.get("templates_path"))
    records = run_dir.read_records()
    root = run_dir.sub("patching")
    summary: dict[str, Any] = {}
    finished: dict[tuple[str, str, str], dict[str, Any]] = {}   # (pairs, pair, kind) -> part
    for pk in cfg.pairs:
        pairs, refused = build_pairs(records, pk, template, handle.tokenizer, limit=cfg.limit,
                                     max_tokens=cfg.max_tokens, log=log)
        for kind in cfg.kinds:
            d = root / pk / kind
            t0 = time.perf_counter()
            results = _sweep_kind(handle, cfg, pk, kind, pairs, layers, d / "parts", finished,
                                  log, facts)
            s = summarise(d, pk, kind, results, refused, layers, handle)
            s["elapsed_s"] = time.perf_counter() - t0
            write_json(d / "summary.json", s)
            summary[f"{pk}/{kind}"] = s
            if cfg.figures:
                _figures(d, run_dir, f"[{pk}/{kind}]", log)
    old = read_json(root / "summary.json") if (root / "summary.json").exists() else {}
    write_json(root / "summary.json", {**old, **summary})
    return summary


def _figures(d: Path, run_dir: RunDir, tag: str, log: Callable[[str], None]) -> None:
    try:
        from interp import plots

        plots.plot_patching(d, run_dir.sub("figures"))
    except Exception as err:  # noqa: BLE001 - figures never block the tables
        log(f"{tag} figure failed: {err}")


def format_summary(summary: Mapping[str, Any]) -> str:
    """Plain-text lines of :func:`run`'s summary: pairs, refusals, cost, top units."""
    lines = []
    for key, s in summary.items():
        lines.append(f"== {key}: {s.get('n_pairs')} pairs, {s.get('n_refused')} refused, "
                     f"cost {s.get('cost_ratio_mean', float('nan')):.1f} clean forwards/pair")
        for k in ("top_layers", "top_heads", "correlation_heads", "correlation_resid"):
            if k in s:
                lines.append(f"   {k}: {s[k]}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Entry points until the lead merges R1's pipeline/cli (issue 10)
# ---------------------------------------------------------------------------------------------


Config = PatchingConfig
"""The stage's config class (the Stage protocol's name for it)."""
