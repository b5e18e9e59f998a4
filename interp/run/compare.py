"""Several models side by side: one table and figures over the run directories of a grid.

``interp run`` on a config with several ``[asymmetry] models`` writes one run directory per
model (``out/<model-slug>/``); :func:`write_comparison` then reads each directory's stored
tables (never a live model) and writes, into ``out/``:

* ``comparison.json``: ``{"models", "definitions", "rows"}``, one row per (model, dataset)
  plus each model's ``overall`` row (:func:`comparison_rows`), and ``comparison.md``, the
  same rows as a Markdown table;
* ``figures/models_asymmetry.png`` (GA, EA and Δ per dataset, one colour per model),
  ``figures/models_attention.png`` (context mass by relative depth and the context ratio per
  dataset, one colour per model; when the attention stage ran) and
  ``figures/models_probes.png`` (best probe AUC by relative depth against the verbal judge's
  AUC, one colour per model; when the probe stage ran), :mod:`interp.plots.compare`.

A stage that did not run for a model leaves its columns None in that model's rows. Numbers
are copied, not recomputed: each keeps the definition of the table it comes from
(``metrics.json``, ``attention/summary.json``, ``probes/results.json``,
``transfer/table.json``), summarised in :data:`DEFINITIONS`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from interp.analysis.stats import (
    MIN_PASSAGES,
    ci_text,
    degenerate_note,
    fit_note,
    is_degenerate,
    passage_note,
)
from interp.core.io import write_json
from interp.core.names import in_dataset_order

__all__ = ["DEFINITIONS", "comparison_rows", "format_markdown", "probe_headline", "read_run",
           "write_comparison"]

DEFINITIONS: dict[str, str] = {
    "model": "model spec of the run directory",
    "n_layers": "decoder blocks of the model (manifest)",
    "dataset": "dataset name, or 'overall' (every record of the run)",
    "n": "ok records", "n_passages": "distinct passages among them",
    "few_passages": f"true when n_passages < {MIN_PASSAGES}: few independent units, CIs are "
                    "fragile (the Markdown table stars the row and says so under it)",
    "GA": "generation accuracy P(y* = Correct) (metrics.json)",
    "EA": "evaluation accuracy P(y = y*), generated verdict, no verdict = wrong",
    "EA_forced": "evaluation accuracy of the forced choice p_correct > 0.5",
    "delta": "EA - GA", "GA_ci / EA_ci / delta_ci": "95% bootstrap CIs over passages",
    "acceptance_rate_correct": "judge says Correct | y* Correct",
    "acceptance_rate_incorrect": "judge says Correct | y* Incorrect",
    "no_verdict": "share of replies with no parseable verdict",
    "auc_logit_diff": "ROC AUC of the whole-reply logit_diff against y*",
    "band": "attention band (layers) of the ctx_* and context_ratio columns",
    "ctx_gen / ctx_eval": "mean last-token attention mass on the context over the band and all "
                          "heads, generation / evaluation prompt (attention/summary.json)",
    "cand_eval": "same, on the candidate answer of the evaluation prompt",
    "context_ratio": "mean ctx_gen / mean ctx_eval (a ratio of means), with its CI",
    "probe_auc / probe_probe / probe_layer / probe_pool": "best-of-N CV AUC: mean test-fold AUC "
        "of the best (probe, layer, pool) cell on the eval prompt, selected among probe_cells "
        "cells by that same AUC, so optimistic by the selection (overall rows; "
        "probes/results.json)",
    "probe_cells": "N, the (probe, layer, pool) cells the best probe was selected from",
    "probe_fit_note": "set when the probe was fit on too few records to read its AUC "
                      "(interp.analysis.stats.fit_note); the AUC cell then has a *",
    "probe_perm_p / probe_perm_n / probe_perm_probe / probe_perm_auc": "label-permutation p of "
        "the best cell of probe kind probe_perm_probe (observed AUC probe_perm_auc), re-selected "
        "over every layer and pool under each of probe_perm_n permutations; None when not run",
    "judge_auc": "AUC of the verbal judge's logit_diff on the same CV test folds as the probe "
                 "(mean over folds, probes/results.json judge.folds), comparable to probe_auc",
    "judge_auc_pooled": "AUC of the judge's logit_diff pooled over the probe's records",
    "transfer_delta_<adapter>": "EA - GA of base / lora_gen / lora_eval / lora_both on that "
                                "dataset's validation records (transfer/table.json)",
}
"""What every column of ``comparison.json`` holds."""

_METRIC_KEYS = ("GA", "GA_ci", "EA", "EA_ci", "EA_forced", "delta", "delta_ci",
                "acceptance_rate_correct", "acceptance_rate_incorrect", "auc_logit_diff")


def _read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """The stored tables of one run directory (None for a stage that did not run).

    Returns:
        ``{"manifest", "metrics", "attention", "probes", "transfer"}``.
    """
    p = Path(run_dir)
    return {"manifest": _read(p / "manifest.json") or {}, "metrics": _read(p / "metrics.json"),
            "attention": _read(p / "attention" / "summary.json"),
            "probes": _read(p / "probes" / "results.json"),
            "transfer": _read(p / "transfer" / "table.json")}


def _attention_cols(att: Mapping[str, Any] | None, ds: str) -> dict[str, Any]:
    group = None if att is None else (att["overall"] if ds == "overall"
                                      else att.get("per_dataset", {}).get(ds))
    if not group or not group.get("n"):
        return {}
    band = att["band"]
    return {"band": f"{band[0]}-{band[-1]}" if len(band) > 1 else str(band[0]),
            "ctx_gen": group["gen"]["context"]["mean"],
            "ctx_eval": group["eval"]["context"]["mean"],
            "cand_eval": group["eval"]["candidate"]["mean"],
            "context_ratio": group["context_ratio"],
            "context_ratio_ci": group.get("context_ratio_ci")}


def _transfer_cols(table: Mapping[str, Any] | None, ds: str) -> dict[str, Any]:
    if not table:
        return {}
    out = {}
    for adapter, per in table.get("self", {}).items():
        m = per.get(ds)
        out[f"transfer_delta_{adapter}"] = m["delta"] if m and m.get("n") else None
    return out


_PROBE_KEYS = ("probe_auc", "probe_probe", "probe_layer", "probe_pool", "probe_cells",
               "probe_perm_p", "probe_perm_n", "probe_perm_probe", "probe_perm_auc",
               "judge_auc", "judge_auc_pooled", "probe_fit_note")


def probe_headline(results: Mapping[str, Any], task: str = "eval") -> dict[str, Any]:
    """The probe columns of a comparison row (:data:`DEFINITIONS`) from ``probes/results.json``.

    The best cell is a best-of-N pick (N = cells with an AUC in the task's grid), so it comes
    with N and the permutation test of :func:`interp.stages.probe.run` (whose null re-selects
    the best cell of one probe kind, named in ``probe_perm_probe``); the judge AUC beside it
    is the one on the same CV test folds (``judge.folds.auc``), as in the probe figure.

    Args:
        results: the content of ``DIR/probes/results.json``.
        task: the probed prompt (``eval``; falls back to the first task stored).

    Returns:
        The ``_PROBE_KEYS`` columns (None where the results lack them).
    """
    t = results["tasks"].get(task) or next(iter(results["tasks"].values()))
    best, pm = t["best"], t.get("permutation") or {}
    judge = results.get("judge") or {}
    return {"probe_auc": best["auc"], "probe_probe": best["probe"], "probe_layer": best["layer"],
            "probe_pool": best["pool"],
            "probe_cells": sum(r.get("auc") is not None for r in t["grid"]),
            "probe_perm_p": pm.get("p_value"), "probe_perm_n": pm.get("n"),
            "probe_perm_probe": pm.get("probe"), "probe_perm_auc": pm.get("observed"),
            "judge_auc": (judge.get("folds") or {}).get("auc"),
            "judge_auc_pooled": (judge.get("overall") or {}).get("auc"),
            "probe_fit_note": fit_note(results["n_records"], results.get("class_counts"))
            if "n_records" in results else None}


def comparison_rows(runs: Mapping[str, str | Path]) -> list[dict[str, Any]]:
    """One row per (model, dataset) and per model ``overall``, in the grid's model order.

    Args:
        runs: model spec -> its run directory (with ``metrics.json``).

    Returns:
        Rows with the columns of :data:`DEFINITIONS` (None where a stage did not run).

    Raises:
        FileNotFoundError: a run directory without ``metrics.json``.
    """
    rows = []
    for spec, run_dir in runs.items():
        t = read_run(run_dir)
        if t["metrics"] is None:
            raise FileNotFoundError(f"{run_dir} has no metrics.json; run the asymmetry stage")
        groups = [(d, g) for d, g in in_dataset_order(t["metrics"]["per_dataset"]) if g.get("n")]
        groups.append(("overall", t["metrics"]["overall"]))
        probes = t["probes"]
        for ds, g in groups:
            shares = g.get("verdict_shares") or {}
            row: dict[str, Any] = {
                "model": spec, "n_layers": t["manifest"].get("model", {}).get("n_layers"),
                "dataset": ds, "n": g["n"], "n_passages": g.get("n_passages"),
                **{k: g.get(k) for k in _METRIC_KEYS}, "no_verdict": shares.get("none"),
                "band": None, "ctx_gen": None, "ctx_eval": None, "cand_eval": None,
                "context_ratio": None, "context_ratio_ci": None,
                **dict.fromkeys(_PROBE_KEYS)}
            if row["n_passages"] is not None:
                row["few_passages"] = row["n_passages"] < MIN_PASSAGES
            row.update(_attention_cols(t["attention"], ds))
            if probes and ds == "overall":
                row.update(probe_headline(probes))
            row.update(_transfer_cols(t["transfer"], ds))
            rows.append(row)
    return rows


_MD_COLUMNS = (("model", "model"), ("dataset", "dataset"), ("n", "n"),
               ("n_passages", "passages"), ("GA", "GA"), ("EA", "EA"),
               ("EA_forced", "EA_forced"), ("delta", "Δ"), ("delta_ci", "Δ 95% CI"),
               ("acceptance_rate_incorrect", "acc|y*=I"), ("no_verdict", "no verdict"),
               ("ctx_gen", "ctx gen"), ("ctx_eval", "ctx eval"), ("context_ratio", "ratio"),
               ("probe_auc", "probe best-of-N CV AUC"), ("probe_perm_p", "perm. p"),
               ("judge_auc", "judge AUC (same folds)"))


def _md_cell(row: Mapping[str, Any], key: str) -> str:
    v = row.get(key)
    if key == "n_passages" and v is not None:
        return f"{v}{'*' * bool(row.get('few_passages'))}"
    if key == "probe_auc" and v is not None:
        star = "*" * bool(row.get("probe_fit_note"))
        return f"{v:.3f}{star} (best of {row.get('probe_cells')}: {row.get('probe_probe')} " \
               f"L{row.get('probe_layer')} {row.get('probe_pool')})"
    if key == "probe_perm_p" and v is not None:
        return f"{v:.2f} ({row.get('probe_perm_n')} perms, best {row.get('probe_perm_probe')} " \
               f"cell, AUC {row.get('probe_perm_auc'):.3f})"
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)):
        return ci_text(v, ".3f", ", ") if len(v) == 2 else \
            "[" + ", ".join(f"{x:.3f}" for x in v) + "]"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _md_escape(text: str) -> str:
    r"""A table cell's text with its pipes escaped (GFM tables: ``\|`` inside a cell).

    See https://github.github.com/gfm/#tables-extension-: an unescaped ``|`` splits a cell.
    """
    return text.replace("|", "\\|").replace("\n", " ")


def format_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The main columns of :func:`comparison_rows` as a Markdown table (3 decimals, '-').

    Rows on fewer than :data:`interp.analysis.stats.MIN_PASSAGES` passages get a ``*`` on their
    passage count, explained under the table with the per-model summaries' wording
    (:func:`interp.analysis.stats.passage_note`); the probe columns say what the best-of-N AUC is.
    Every cell's ``|`` is escaped (``acc|y*=I``), so each row has one cell per column.
    """
    head = "| " + " | ".join(_md_escape(name) for _, name in _MD_COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in _MD_COLUMNS) + "|"
    body = ["| " + " | ".join(_md_escape(_md_cell(r, k)) for k, _ in _MD_COLUMNS) + " |"
            for r in rows]
    notes = [f"\\* {r['model']} {r['dataset']}: {passage_note(r['n_passages'])}"
             for r in rows if r.get("few_passages")]
    notes += [f"\\* {r['model']} probe: {r['probe_fit_note']}" for r in rows
              if r.get("probe_fit_note") and r.get("probe_auc") is not None]
    if any(is_degenerate(v) for r in rows for v in r.values() if isinstance(v, (list, tuple))):
        notes.append(degenerate_note())
    if any(r.get("probe_auc") is not None for r in rows):
        notes.append("probe best-of-N CV AUC: mean test-fold AUC of the best of N (probe, "
                     "layer, pool) cells, selected by that same AUC (optimistic); perm. p: "
                     "label-permutation test of the best cell of the named probe kind; judge "
                     "AUC on the same CV test folds.")
    return "\n".join([head, rule, *body]) + "\n" + "".join(f"\n{n}\n" for n in notes)


def write_comparison(out: str | Path, runs: Mapping[str, str | Path]) -> dict[str, Any]:
    """Write ``comparison.json``, ``comparison.md`` and the model figures into ``out``.

    Args:
        out: the grid's output folder (figures go to ``out/figures``).
        runs: model spec -> run directory, in the grid's order.

    Returns:
        ``{"table": path of comparison.json, "markdown": ..., "figures": [png paths]}``.
    """
    from interp.plots.compare import (
        plot_models_asymmetry,
        plot_models_attention,
        plot_models_probes,
    )

    out = Path(out)
    rows = comparison_rows(runs)
    tables = {spec: read_run(d) for spec, d in runs.items()}
    write_json(out / "comparison.json", {"models": list(runs), "definitions": DEFINITIONS,
                                         "rows": rows})
    (out / "comparison.md").write_text(format_markdown(rows))
    figs = [plot_models_asymmetry({s: t["metrics"] for s, t in tables.items()},
                                  out / "figures")]
    if att := {s: t["attention"] for s, t in tables.items() if t["attention"]}:
        figs.append(plot_models_attention(att, out / "figures"))
    if probes := {s: t["probes"] for s, t in tables.items() if t["probes"]}:
        figs.append(plot_models_probes(probes, out / "figures"))
    return {"table": out / "comparison.json", "markdown": out / "comparison.md",
            "figures": figs}
