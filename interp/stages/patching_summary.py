"""Tables and summary of one (pair kind, sweep kind) of the patching stage.

Aggregation (docs/measuring.md; docs/stages.md, patch):

1. Per pair: ``gap = LD_clean - LD_corrupt`` (the judge's whole-reply verdict score, nats). A
   pair is KEPT for the headline when ``|gap| >= min_gap`` (default 1 nat); every pair's gap
   is published (``summary.json`` ``gaps``, ``pairs.parquet``).
2. Per unit (layer, and position counted from the end / span / head): the headline normalised
   effect is the ratio of sums over the kept pairs where the unit was patched exactly,
   ``sum s (LD_patched - LD_corrupt) / sum |gap|`` with ``s = sign(gap)``
   (:func:`interp.methods.patching.ratio_of_sums`), with a passage-cluster bootstrap CI
   (:func:`interp.analysis.stats.cluster_bootstrap_ratio`) for the listed top units; next to it the
   number of pairs it rests on, the mean raw change ``d_ld`` in nats over every pair where it
   was patched, the forced-verdict flip rate (``sign(LD_patched) != sign(LD_corrupt)``), mean
   ``p_correct``, coverage and context mass, and the same ratio of the attribution estimates
   (``ratio_attr``, every unit).
3. ``units.parquet`` (+ csv) holds step 2 for every unit, ``effects.parquet`` every row of every
   pair, ``summary.json`` the counts (pairs by corrupt source, skipped by reason), the gaps,
   the top units and, per kind, the by-layer table (last-position and control pairs), the
   span-by-layer table (candidate swap) or the agreement of AtP* with the full sweep
   (``attribution``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from interp.analysis.stats import ci_text, cluster_bootstrap_ratio, degenerate_note, is_degenerate
from interp.core.io import write_table
from interp.methods.patching import ratio_of_sums

__all__ = ["UNIT_KEY", "format_summary", "summarise", "unit_table"]

UNIT_KEY = ["layer", "unit", "rel_position", "span", "head"]
"""Columns that identify a unit across pairs (single positions by their offset from the end:
the shared suffix is the same template text in every pair)."""


def unit_table(df: Any) -> Any:
    """Step 2 of the module docstring for every unit of an effects table.

    Args:
        df: rows with :data:`UNIT_KEY`, ``id``, ``kept``, ``gap``, ``corrupt_ld``, ``ld``,
            ``d_ld``, ``attr_ld``, ``verified``, ``p_correct``, ``coverage``,
            ``context_mass``.

    Returns:
        A DataFrame, one row per unit: ``ratio``, ``n_pairs`` (kept and exact), ``ratio_attr``,
        ``mean_d_ld``, ``mean_attr_ld``, ``flip_rate``, ``mean_p_correct``, ``mean_coverage``,
        ``mean_context_mass``, ``n_exact`` (pairs patched exactly, kept or not).
    """
    import pandas as pd

    out = []
    for key, g in df.groupby(UNIT_KEY, sort=True, dropna=False):
        ex = g[g.verified]
        kept = ex[ex.kept]
        ka = g[g.kept]
        out.append({**dict(zip(UNIT_KEY, key)),
                    "ratio": ratio_of_sums(kept.ld, kept.corrupt_ld + kept.gap, kept.corrupt_ld),
                    "n_pairs": int(len(kept)),
                    "ratio_attr": ratio_of_sums(ka.corrupt_ld + ka.attr_ld,
                                                ka.corrupt_ld + ka.gap, ka.corrupt_ld),
                    "mean_d_ld": float(ex.d_ld.mean()) if len(ex) else np.nan,
                    "mean_attr_ld": float(g.attr_ld.mean()),
                    "flip_rate": float(((ex.ld > 0) != (ex.corrupt_ld > 0)).mean())
                    if len(ex) else np.nan,
                    "mean_p_correct": float(ex.p_correct.mean()) if len(ex) else np.nan,
                    "mean_coverage": float(ex.coverage.mean()) if len(ex) else np.nan,
                    "mean_context_mass": float(ex.context_mass.mean()) if len(ex) else np.nan,
                    "n_exact": int(len(ex))})
    return pd.DataFrame(out)


def _with_ci(df: Any, units: Any, rng: np.random.Generator, n_boot: int) -> list[dict]:
    """The listed units with a passage-cluster bootstrap CI of their ratio."""
    out = []
    for _, u in units.iterrows():
        g = df[(df[UNIT_KEY] == u[UNIT_KEY]).all(axis=1) & df.verified & df.kept]
        s = np.sign(g.gap.to_numpy())
        ci = cluster_bootstrap_ratio(s * (g.ld - g.corrupt_ld).to_numpy(),
                                     np.abs(g.gap.to_numpy()), g.passage.tolist(), rng, n_boot)
        out.append({**{k: (u[k].item() if hasattr(u[k], "item") else u[k]) for k in UNIT_KEY},
                    "ratio": u.ratio, "ci": ci["ci"], "n_pairs": int(u.n_pairs),
                    "n_passages": ci["n_clusters"], "mean_d_ld": u.mean_d_ld,
                    "flip_rate": u.flip_rate})
    return out


def _by_layer(units: Any, unit: str, span: str) -> dict[int, dict[str, Any]]:
    sel = units[(units.unit == unit) & (units.span == span)]
    cols = ("ratio", "n_pairs", "mean_d_ld", "flip_rate", "mean_p_correct", "mean_coverage",
            "mean_context_mass", "ratio_attr")
    return {int(r.layer): {c: (None if r[c] is None or (isinstance(r[c], float) and
                                                         np.isnan(r[c])) else r[c])
                           for c in cols} for _, r in sel.iterrows()}


def _agreement(metas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sub in ("resid", "heads"):
        a = [m["agreement"][sub] for m in metas if m.get("agreement", {}).get(sub)]

        def mean(k: str, a: list = a) -> float | None:
            v = [x[k] for x in a if x.get(k) is not None]
            return float(np.mean(v)) if v else None

        out[sub] = {"n_pairs": len(a), "k": a[0]["k"] if a else None,
                    "overlap_at_k_mean": mean("overlap_at_k"),
                    "top1_verified_rate": mean("top1_verified"),
                    "spearman_mean": mean("spearman"), "pearson_mean": mean("pearson"),
                    "attr_cost_clean_forwards": mean("attr_cost_ratio"),
                    "exact_all_cost_clean_forwards": mean("exact_cost_ratio"),
                    "n_units_mean": mean("n_units"), "per_pair": a}
    return out


def _meta_stats(metas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    def mean(k: str) -> float:
        return float(np.nanmean([m[k] for m in metas]))

    return {f"mean_{k}": mean(k) for k in (
        "clean_ld", "corrupt_ld", "clean_p_correct", "corrupt_p_correct", "clean_coverage",
        "corrupt_coverage", "clean_context_mass", "corrupt_context_mass", "cost_ratio",
        "clean_forward_s")}


def summarise(d: Path, pk: str, kind: str, results: list[dict], skipped: list[dict],
              layers: Sequence[int], band: Sequence[int], model: str, cfg: Any,
              top: int = 10) -> dict[str, Any]:
    """Write the tables of one (pairs, kind) and return its summary (module docstring).

    Returns:
        ``pairs``, ``kind``, ``control``, ``model``, ``layers``, ``band``, ``exact``,
        ``top_k``, ``min_gap``, ``n_pairs``, ``pairs_by_source``, ``n_skipped``,
        ``skipped_by_reason``, ``skipped`` (first 20), ``gaps`` (every pair),
        ``small_gaps`` (``n``, ``median_abs``, ``max_abs``: the |gap| in nats of the pairs
        skipped under ``min_gap``), ``n_pairs_kept``, means of the clean/corrupt scores,
        context masses and costs,
        ``top_units`` (with CIs) and per kind ``by_layer``, ``span_by_layer`` or
        ``agreement``.
    """
    import pandas as pd

    metas = [r["meta"] for r in results]
    s: dict[str, Any] = {
        "pairs": pk, "kind": kind, "control": pk == "system-prompt-control", "model": model,
        "layers": list(layers), "band": list(band), "exact": cfg.exact, "top_k": cfg.top_k,
        "min_gap": cfg.min_gap, "metric": "whole-reply logit_diff = log P(Correct) - "
                                          "log P(Incorrect), nats",
        "n_pairs": len(results),
        "pairs_by_source": dict(Counter(m["corrupt_source"] for m in metas)),
        "n_skipped": len(skipped), "skipped_by_reason": dict(Counter(x["reason"]
                                                                     for x in skipped)),
        "skipped": skipped[:20],
        "gaps": [{"id": m["id"], "dataset": m["dataset"], "clean_ld": m["clean_ld"],
                  "corrupt_ld": m["corrupt_ld"], "gap": m["gap"],
                  "kept": abs(m["gap"]) >= cfg.min_gap} for m in metas]}
    s["n_pairs_kept"] = sum(g["kept"] for g in s["gaps"])
    small = [abs(x["gap"]) for x in skipped if x.get("reason") == "small_gap"]
    s["small_gaps"] = {"n": len(small),   # how close the pairs left out came to min_gap
                       "median_abs": float(np.median(small)) if small else None,
                       "max_abs": float(max(small)) if small else None}
    s["n_passages"] = len({m["passage"] for m in metas})
    if not results:
        return s
    write_table(pd.DataFrame([{k: v for k, v in m.items() if k != "agreement"}
                              for m in metas]), d / "pairs.parquet")
    s.update(_meta_stats(metas))
    df = pd.DataFrame([{"id": m["id"], "dataset": m["dataset"], "passage": m["passage"],
                        "gap": m["gap"], "corrupt_ld": m["corrupt_ld"],
                        "kept": abs(m["gap"]) >= cfg.min_gap, **x}
                       for r, m in zip(results, metas) for x in r["rows"]])
    write_table(df, d / "effects.parquet")
    units = unit_table(df)
    write_table(units, d / "units.parquet")
    rng = np.random.default_rng(cfg.seed)
    ranked = units[units.ratio.notna()].copy()
    ranked = ranked.reindex(ranked.ratio.abs().sort_values(ascending=False).index)
    s["top_units"] = _with_ci(df, ranked[ranked.unit != "span"].head(top), rng, cfg.n_boot)
    if kind == "resid":   # the residual stream by span: its ranked units, with CIs
        s["top_spans"] = _with_ci(df, ranked[ranked.unit == "span"].head(top), rng, cfg.n_boot)
    if kind == "resid" and pk == "candidate-swap":
        sp = units[units.unit == "span"]
        s["span_by_layer"] = {sv: {int(r.layer): r.ratio for _, r in g.iterrows()}
                              for sv, g in sp.groupby("span")}
    elif kind == "resid":
        span = "verdict" if pk in ("gen-to-eval", "eval-to-gen") else "context"
        s["by_layer"] = _by_layer(units, "span", span)
    elif kind == "attribution":
        s["agreement"] = _agreement(metas)
    return s


def format_summary(summary: Mapping[str, Any]) -> str:
    """Plain-text lines of the stage's summary: pairs, skips, gaps, cost, top units."""
    lines = []
    degenerate = False
    for key, s in summary.items():
        tag = " (CONTROL)" if s.get("control") else ""
        lines.append(f"== {key}{tag}: {s.get('n_pairs')} pairs ({s.get('n_pairs_kept')} with "
                     f"|gap| >= {s.get('min_gap')} nats) by source {s.get('pairs_by_source')}; "
                     f"skipped {s.get('skipped_by_reason')}; cost "
                     f"{s.get('mean_cost_ratio', float('nan')):.1f} clean forwards/pair")
        gaps = ", ".join(f"{g['gap']:+.2f}" for g in s.get("gaps", []))
        lines.append(f"   gaps (nats): {gaps}")
        small = s.get("small_gaps") or {}
        if small.get("n"):
            lines.append(f"   {small['n']} pairs under min_gap: |gap| median "
                         f"{small['median_abs']:.2f}, largest {small['max_abs']:.2f} nats")
        for u in s.get("top_units", [])[:5]:
            ci = u.get("ci")
            degenerate |= is_degenerate(ci)
            lines.append(f"   L{u['layer']} {u['unit']} {u['span'] or ''}"
                         f"{u['rel_position'] if u['unit'] == 'position' else ''}"
                         f"{'h' + str(u['head']) if u['unit'] == 'head' else ''}: ratio "
                         f"{u['ratio']:+.2f}"
                         + (f" {ci_text(ci, '+.2f', ', ')}" if ci else "")
                         + f" over {u['n_pairs']} pairs, mean d_ld {u['mean_d_ld']:+.2f}")
        for sub, a in (s.get("agreement") or {}).items():
            lines.append(f"   AtP* {sub}: overlap@{a['k']} {a['overlap_at_k_mean']}, top-1 "
                         f"verified {a['top1_verified_rate']}, spearman {a['spearman_mean']}; "
                         f"cost {a['attr_cost_clean_forwards']} vs full "
                         f"{a['exact_all_cost_clean_forwards']} clean forwards")
    if degenerate:
        lines.append(degenerate_note())
    return "\n".join(lines)
