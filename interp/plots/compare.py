"""Figures that put several models side by side, one colour per model (:mod:`interp.run.compare`).

Drawn from stored tables only (each model's ``metrics.json``, ``attention/summary.json``,
``probes/results.json``). Models of different depths share an axis of RELATIVE depth,
``layer / (n_layers - 1)``, so layer 24 of 32 and layer 18 of 24 sit at the same place. Each
function writes ``NAME.png`` and ``NAME.pdf`` and returns the PNG path
(:func:`interp.plots.common.save`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.patches import Patch

from interp.analysis.stats import MIN_PASSAGES, degenerate_note, passage_note
from interp.core.names import in_dataset_order
from interp.plots.common import ci_bars, footnote, plt, save

__all__ = ["dataset_labels", "model_colors", "plot_models_asymmetry", "plot_models_attention",
           "plot_models_probes"]

_PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3")


def model_colors(specs: list[str]) -> dict[str, str]:
    """One colour per model, in the grid's order (the same in every figure)."""
    return {s: _PALETTE[i % len(_PALETTE)] for i, s in enumerate(specs)}


def _short(spec: str) -> str:
    return Path(spec).name if "/" in spec else spec


def _datasets(tables: Mapping[str, Mapping[str, Any]]) -> list[str]:
    names: list[str] = []
    for t in tables.values():
        names += [d for d, g in in_dataset_order(t["per_dataset"]) if g.get("n") and d not in names]
    return names + ["overall"]


def _group(t: Mapping[str, Any], ds: str) -> Mapping[str, Any] | None:
    g = t["overall"] if ds == "overall" else t.get("per_dataset", {}).get(ds)
    return g if g and g.get("n") else None


def _few(g: Mapping[str, Any]) -> bool:
    n_p = g.get("n_passages")
    return bool(g.get("few_passages")) or (n_p is not None and n_p < MIN_PASSAGES)


def dataset_labels(tables: Mapping[str, Mapping[str, Any]], datasets: list[str]
                   ) -> tuple[list[str], list[str]]:
    r"""X tick labels ``dataset\nn=N\nP passages`` (``*`` under 10 passages) and their notes.

    The same label as one model's figures (:func:`interp.plots.common.dataset_groups`); where the
    models' groups differ in size the values are joined with ``,`` in the models' order. The
    notes (one per starred dataset, :func:`interp.analysis.stats.passage_note` of its smallest
    group)
    go under the figure (:func:`interp.plots.common.footnote`).

    Args:
        tables: model spec -> a table with ``per_dataset`` and ``overall`` groups.
        datasets: the x positions' names.

    Returns:
        ``(labels, notes)``.
    """
    labels, notes = [], []
    for ds in datasets:
        groups = [g for t in tables.values() if (g := _group(t, ds))]
        ns = list(dict.fromkeys(str(g["n"]) for g in groups))
        ps = list(dict.fromkeys(g.get("n_passages") for g in groups))
        if not groups or None in ps:
            labels.append(f"{ds}\n(n={','.join(ns) or 0})")
            continue
        star = "*" if any(_few(g) for g in groups) else ""
        labels.append(f"{ds}\nn={','.join(ns)}\n{','.join(map(str, ps))} passages{star}")
        if star:
            notes.append(f"* {ds}: {passage_note(min(ps))}")
    return labels, notes


def _grouped_bars(ax: Any, tables: Mapping[str, Mapping[str, Any]], datasets: list[str],
                  get: Any, colors: Mapping[str, str], notes: list[str] | None = None
                  ) -> list[str]:
    """Bars per dataset, one per model (``get(group) -> (value, ci)``); missing groups blank.

    Drawn by :func:`interp.plots.common.ci_bars`: every drawn bar carries a line at its value
    and the value as text beside its whisker, so a bar of height 0 is visible (and told apart
    from a missing group, which has neither). The x ticks are :func:`dataset_labels`; returns
    their notes (appended to ``notes``, once each), and
    :func:`interp.analysis.stats.degenerate_note`
    when an interval has zero width.
    """
    x, w = np.arange(len(datasets)), 0.8 / len(tables)
    degenerate = False
    for j, (spec, t) in enumerate(tables.items()):
        got = [get(g) if (g := _group(t, ds)) else (None, None) for ds in datasets]
        degenerate |= ci_bars(ax, x + (j - (len(tables) - 1) / 2) * w, [v for v, _ in got],
                              [ci for _, ci in got], w, color=colors[spec], label=_short(spec),
                              capsize=2)
    labels, new = dataset_labels(tables, datasets)
    ax.set_xticks(x, labels, fontsize=7)
    notes = [] if notes is None else notes
    for n in new + ([degenerate_note()] if degenerate else []):
        if n not in notes:
            notes.append(n)
    return notes


def plot_models_asymmetry(metrics: Mapping[str, Mapping[str, Any]], out_dir: str | Path,
                          name: str = "models_asymmetry") -> Path:
    """GA, EA and Δ = EA − GA per dataset with 95% CIs, one colour per model.

    Args:
        metrics: model spec -> its ``metrics.json``
        (:func:`interp.methods.asymmetry.compute_metrics`).
        out_dir: output folder.
        name: file stem.
    """
    colors = model_colors(list(metrics))
    datasets = _datasets(metrics)
    fig, axes = plt.subplots(3, 1, figsize=(max(7.5, 1.5 * len(datasets) + 2.5), 9.6),
                             sharex=True)
    notes: list[str] = []
    for ax, key, title, ylabel in (
            (axes[0], "GA", "generation accuracy GA", "GA (share of answers right)"),
            (axes[1], "EA", "self-evaluation accuracy EA", "EA (share of verdicts right)"),
            (axes[2], "delta", "asymmetry Δ = EA − GA", "Δ = EA − GA")):
        _grouped_bars(ax, metrics, datasets, lambda g, k=key: (g[k], g.get(f"{k}_ci")),
                      colors, notes)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel, fontsize=8)
    axes[0].set_ylim(-0.03, 1.1)
    axes[1].set_ylim(-0.03, 1.1)
    axes[2].axhline(0, color="black", lw=0.8)
    axes[0].legend(frameon=False, fontsize=8, ncol=len(metrics), loc="upper left")
    fig.suptitle("Models side by side (CIs: bootstrap over passages; black line and number "
                 "beside the whisker: the bar's value)", fontsize=10)
    fig.tight_layout()
    footnote(fig, notes)
    return save(fig, out_dir, name)


def _depth(n: int) -> np.ndarray:
    return np.arange(n) / max(n - 1, 1)


def plot_models_attention(summaries: Mapping[str, Mapping[str, Any]], out_dir: str | Path,
                          name: str = "models_attention") -> Path:
    """Context mass by relative depth (gen solid, eval dashed) and the context ratio per dataset.

    Panel 1: the layerwise mean context mass of the last-token row over all heads (overall
    group), generation and evaluation prompt, each model's band shaded in its colour. Panel 2:
    ``context_ratio`` (mean gen / mean eval context mass over the band) per dataset with its CI.

    Args:
        summaries: model spec -> its ``attention/summary.json``.
        out_dir: output folder.
        name: file stem.
    """
    colors = model_colors(list(summaries))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4), gridspec_kw={"width_ratios": [1.2, 1]})
    bands = []
    for spec, s in summaries.items():
        lw = s["overall"]["layerwise"]
        for task, style in (("gen", "-"), ("eval", "--")):
            mean = np.asarray(lw[task]["context"]["mean"], float)
            axes[0].plot(_depth(len(mean)), mean, style, color=colors[spec],
                         label=f"{_short(spec)} {task}")
        band, n = s["band"], s["n_layers"]
        axes[0].axvspan(band[0] / max(n - 1, 1), band[-1] / max(n - 1, 1), color=colors[spec],
                        alpha=0.08)
        bands.append(Patch(color=colors[spec], alpha=0.25,
                           label=f"{_short(spec)} band: layers {band[0]}-{band[-1]} of {n}"))
    handles, _ = axes[0].get_legend_handles_labels()
    axes[0].set_xlabel("relative depth (layer / (n_layers − 1))")
    axes[0].set_ylabel("context mass (mean over heads)")
    ns = ", ".join(f"{_short(spec)} n={s['overall']['n']}" for spec, s in summaries.items())
    axes[0].set_title(f"Last-token attention on the context (overall; {ns})", fontsize=9)
    axes[0].legend(handles=handles + bands, frameon=False, fontsize=7, ncol=2)
    datasets = _datasets(summaries)
    notes = _grouped_bars(axes[1], summaries, datasets,
                          lambda g: (g["context_ratio"], g.get("context_ratio_ci")), colors)
    axes[1].axhline(1, color="black", lw=0.8)
    axes[1].set_ylabel("context ratio (mean gen / mean eval mass)")
    axes[1].set_title("context ratio gen / eval over each model's band", fontsize=10)
    axes[1].legend(frameon=False, fontsize=7)
    fig.tight_layout()
    footnote(fig, notes)
    return save(fig, out_dir, name)


def plot_models_probes(results: Mapping[str, Mapping[str, Any]], out_dir: str | Path,
                       name: str = "models_probes") -> Path:
    """Best cross-validated probe AUC per layer (eval prompt) by relative depth, per model.

    Each layer's point is the MAXIMUM over the pools of the first probe kind of the sweep (a
    best-of-pools value, optimistic like every selected cell); the dotted line in the model's
    colour is its verbal judge's AUC (whole-reply ``logit_diff``) on the same CV test folds
    (``judge.folds``, as in the per-model probe figure), 0.5 is chance.

    Args:
        results: model spec -> its ``probes/results.json``.
        out_dir: output folder.
        name: file stem.
    """
    colors = model_colors(list(results))
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    kinds, n_pools = set(), set()
    for spec, r in results.items():
        task = r["tasks"].get("eval") or next(iter(r["tasks"].values()))
        kind = r["config"]["probes"][0]
        kinds.add(kind)
        n_pools.add(len(task.get("pools") or r["config"]["pools"]))
        best: dict[int, float] = {}
        for row in task["grid"]:
            if row["probe"] == kind and row.get("auc") is not None:
                best[row["layer"]] = max(best.get(row["layer"], 0.0), row["auc"])
        layers = sorted(best)
        ax.plot(np.asarray(layers) / max(r["n_layers"] - 1, 1), [best[x] for x in layers],
                "o-", ms=3, color=colors[spec],
                label=f"{_short(spec)} {kind} probe (n={r['n_records']})")
        judge = r["judge"].get("folds") or {}
        if (auc := judge.get("auc")) is not None:
            ax.axhline(auc, ls=":", color=colors[spec],
                       label=f"{_short(spec)} judge AUC, same folds ({auc:.2f})")
    ax.axhline(0.5, color="black", lw=0.8)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("relative depth (layer / (n_layers − 1))")
    pools = "/".join(map(str, sorted(n_pools)))
    ax.set_ylabel(f"CV ROC AUC (y*), max over {pools} pools")
    ax.set_title(f"Residual-stream probes ({'/'.join(sorted(kinds))}) vs the verbal judge:\n"
                 f"each point the best pool at that layer (a max, optimistic)", fontsize=10)
    ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return save(fig, out_dir, name)
