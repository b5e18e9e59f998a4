"""The probe figure, drawn from ``DIR/probes/results.json`` (never live models)."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.ticker import MaxNLocator

from interp.analysis.stats import MIN_FIT_RECORDS, fit_note, null_level
from interp.plots.common import footnote, plt, save

_PROBE_METRICS = [("auc", "ROC AUC", "auc"), ("f1", "F1 (Correct)", "f1"),
                  ("accuracy", "accuracy", "accuracy"),
                  ("balanced_accuracy", "balanced accuracy", "balanced_accuracy")]
"""(sweep key, axis label, key of the judge's fold metrics) of the probe figure's columns."""


def _probe_panel(ax: Any, results: Mapping[str, Any], task: str, key: str, label: str,
                 jkey: str, first_column: bool) -> None:
    """One panel of :func:`plot_probes`: one task's metric ``key`` over layers."""
    t = results["tasks"][task]
    rows, probes = t["grid"], results["config"]["probes"]
    first, cmap = probes[0], plt.get_cmap("tab10")
    markers = {"svm": "s", "mlp": "^", "logreg": "o"}
    for k, pool in enumerate(t["pools"]):
        pr = sorted((r for r in rows if r["probe"] == first and r["pool"] == pool),
                    key=lambda r: r["layer"])
        if not pr:
            continue
        xs = np.array([r["layer"] for r in pr])
        m = np.array([np.nan if r[key] is None else r[key] for r in pr], float)
        s = np.array([0.0 if r[f"{key}_std"] is None else r[f"{key}_std"] for r in pr])
        ax.plot(xs, m, color=cmap(k), lw=1.4, label=f"{first}: {pool}")
        ax.fill_between(xs, m - s, m + s, color=cmap(k), alpha=0.12, lw=0)
        for kind in probes[1:]:
            other = [r for r in rows if r["probe"] == kind and r["pool"] == pool]
            if other:
                ax.scatter([r["layer"] for r in other],
                           [np.nan if r[key] is None else r[key] for r in other],
                           color=cmap(k), marker=markers.get(kind, "x"), s=22,
                           edgecolor="black", linewidth=0.5, zorder=3, label=f"{kind}: {pool}")
    jv = results["judge"]["folds"].get(jkey)
    if jv is not None:  # one legend entry for the judge; its value is written on the panel
        ax.axhline(jv, color="black", ls="--", lw=1.4,
                   label="verbal judge, same folds (value on each panel)")
        ax.annotate(f"judge {jv:.2f}", (1.0, jv), xycoords=("axes fraction", "data"),
                    xytext=(-2, 2), textcoords="offset points", ha="right", va="bottom",
                    fontsize=7.5, fontweight="bold")
    pm = t.get("permutation")
    if key == "auc":
        ax.axhline(0.5, color="grey", ls=":", lw=1, label="chance AUC / majority-class accuracy")
        if pm and pm.get("metric") == "auc" and pm.get("null"):
            level, what = null_level(pm["null"], pm.get("null_q95"))
            ax.axhline(level, color="tab:red", ls="-.", lw=1,
                       label=f"best cell under permuted labels, {what}")
    if key == "accuracy":
        ax.axhline(results["majority_baseline_accuracy"], color="grey", ls=":", lw=1,
                   label="chance AUC / majority-class accuracy")
    ax.set_title(f"{task} prompt — {label}", fontsize=10)
    ax.set_xlabel(f"layer ({results['hook_point']})")
    ax.set_ylim(0, 1.02)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if first_column:
        b = t["best"]
        ax.set_ylabel(f"CV mean over {results['folds']} folds")
        # one clause a line, so the box stays inside a narrow panel
        perm = permutation_text(pm).replace(" (best", "\n(best", 1)
        few = fit_note(results.get("n_records", MIN_FIT_RECORDS), results.get("class_counts"))
        ax.text(0.02, 0.03, f"best of {len(rows)} cells: {b['probe']} L{b['layer']} "
                f"{b['pool']}\nfold-mean AUC {b['auc']:.2f}{'*' * bool(few)}, "
                f"F1 {b['f1']:.2f}{perm}"
                + (f"\n* {textwrap.fill(few, 48)}" if few else ""),
                transform=ax.transAxes,
                fontsize=8, va="bottom", bbox={"fc": "white", "ec": "0.7", "alpha": 0.85})


def permutation_text(pm: Mapping[str, Any] | None) -> str:
    r"""``\npermutation p=P (best KIND cell, AUC A, N permutations)``, or '' when not run.

    The permutation null of :func:`interp.stages.probe.run` re-selects the best cell of one
    probe kind (``pm["probe"]``, observed value ``pm["observed"]``), which need not be the
    overall best cell printed beside it; the text names the cell the p belongs to.
    """
    if not pm or pm.get("p_value") is None:
        return ""
    metric = str(pm.get("metric", "auc")).upper()
    obs = pm.get("observed")
    what = f", {metric} {obs:.2f}" if obs is not None else ""
    n = pm.get("n")
    return (f"\npermutation p={pm['p_value']:.2f} (best {pm.get('probe', '?')} cell{what}, "
            f"{n} permutation{'s' * (n != 1)})")


def plot_probes(results: Mapping[str, Any], out_dir: str | Path, name: str = "probes") -> Path:
    """Probe metrics per layer for each pooling, with the verbal judge as horizontal lines.

    One row per probed prompt (``eval``, ``gen``), one column per metric (ROC AUC, F1 of
    Correct, accuracy, balanced accuracy): the first probe's mean over CV test folds per layer,
    one line per pooling, shaded ±1 std; the other probes' cells as markers. Horizontal lines:
    the verbal judge on the same test folds (AUC of the whole-reply ``logit_diff``, F1 of the
    verdict, EA, balanced accuracy of the verdict), the majority-class accuracy, chance AUC
    and, when the permutation null was run, the 95th percentile of the best cell under
    permuted labels.

    Args:
        results: the content of ``DIR/probes/results.json`` (:func:`interp.stages.probe.run`).
        out_dir: output folder.
        name: file stem.
    """
    tasks = list(results["tasks"])
    fig, axes = plt.subplots(len(tasks), len(_PROBE_METRICS),
                             figsize=(4.6 * len(_PROBE_METRICS), 3.6 * len(tasks) + 1.2),
                             squeeze=False)
    seen: dict[str, Any] = {}
    for i, task in enumerate(tasks):
        for j, (key, label, jkey) in enumerate(_PROBE_METRICS):
            _probe_panel(axes[i, j], results, task, key, label, jkey, first_column=j == 0)
            for h, lab in zip(*axes[i, j].get_legend_handles_labels()):
                seen.setdefault(lab, h)
    cc = results["class_counts"]
    datasets = ", ".join(f"{d} {k}" for d, k in (results.get("datasets") or {}).items())
    fig.suptitle(f"Residual-stream probes for y* vs the verbal judge — {results['model']}, "
                 f"{datasets}: n={results['n_records']} records (Correct {cc['correct']}, "
                 f"Incorrect {cc['incorrect']}), {results['folds']}-fold CV grouped by passage; "
                 f"lines: mean over test folds, bands ±1 std; best cell by CV "
                 f"{results['select_by'].upper()}", fontsize=11)
    notes = []
    for task in tasks:  # a mean over folds says when some folds could not be scored
        grid = results["tasks"][task].get("grid") or []
        short = [r for r in grid if r.get("undefined_folds")]
        if short:
            k = max(len(r["undefined_folds"]) for r in short)
            notes.append(f"{task}: {len(short)} of {len(grid)} cells average over fewer folds "
                         f"(up to {k} of {results['folds']} held one class, so no AUC there)")
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=min(5, len(seen)),
               fontsize=9, frameon=False, bbox_to_anchor=(0.5, 0.0),
               bbox_transform=fig.transFigure)   # stays put when saving grows the box
    footnote(fig, notes)
    return save(fig, out_dir, name)


