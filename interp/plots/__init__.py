"""Figures drawn from stored tables (metrics.json, summaries), never from live models.

Each ``plot_*`` function takes the parsed table and an output folder, writes ``NAME.png`` and
``NAME.pdf`` there, and returns the PNG path. The patching and steering figures are in
:mod:`interp.plots.patching` and :mod:`interp.plots.steering` (re-exported here).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

COLORS = {"GA": "#4C72B0", "EA": "#DD8452", "delta": "#55A868", "gen": "#4C72B0",
          "eval": "#DD8452", "correct": "#55A868", "incorrect": "#C44E52"}


def save(fig: plt.Figure, out_dir: str | Path, name: str) -> Path:
    """Save a figure as PNG (150 dpi) and PDF into ``out_dir``; close it; return the PNG."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / f"{name}.png"
    fig.savefig(png, dpi=150, bbox_inches="tight")
    fig.savefig(out_dir / f"{name}.pdf", bbox_inches="tight")
    plt.close(fig)
    return png


def _err(value: float | None, ci: list[float] | None) -> list[float]:
    if not ci or value is None:
        return [0.0, 0.0]
    return [max(value - ci[0], 0.0), max(ci[1] - value, 0.0)]


def dataset_groups(table: Mapping[str, Any]) -> tuple[list[tuple[str, Any]], list[str]]:
    r"""Non-empty ``per_dataset`` groups of a table and their x tick labels.

    ``overall`` is added when there are several groups; labels read ``name\n(n=N)``, or
    ``name\nn=N\nP passages`` when the group counts passages, with ``*`` when it has fewer
    than 10 (:func:`passage_footnote` explains the star).
    """
    groups = [(d, g) for d, g in table["per_dataset"].items() if g.get("n")]
    if len(groups) > 1:
        groups.append(("overall", table["overall"]))

    def label(d: str, g: Mapping[str, Any]) -> str:
        if g.get("n_passages") is None:
            return f"{d}\n(n={g['n']})"
        return f"{d}\nn={g['n']}\n{g['n_passages']} passages{'*' * bool(g.get('few_passages'))}"

    return groups, [label(d, g) for d, g in groups]


def footnote(fig: plt.Figure, notes: list[str], wrap: int | None = None) -> None:
    """Write ``notes`` (one per line, red, small) under the figure; nothing when empty.

    The text hangs below the axes; :func:`save` keeps it (``bbox_inches="tight"``). ``wrap``:
    fill each note to that many characters.
    """
    if notes:
        lines = [textwrap.fill(n, wrap) for n in notes] if wrap else notes
        fig.text(0.01, -0.01, "\n".join(lines), ha="left", va="top", fontsize=7.5,
                 color="#C44E52")


def passage_footnote(fig: plt.Figure, groups: list[tuple[str, Any]]) -> None:
    """Write, visibly under the figure, the notes of groups on fewer than 10 passages.

    Also a group's ``forced_choice_note`` (the forced choice is the same for every record).
    """
    notes = [f"* {d}: {g['note']}" for d, g in groups if g.get("few_passages")]
    notes += [f"{d}: {g['forced_choice_note']}" for d, g in groups
              if g.get("forced_choice_note")]
    footnote(fig, notes)


_VERDICT_COLORS = {"accept": "#55A868", "reject": "#C44E52", "none": "0.75"}


def _verdict_split_panel(ax: Any, groups: list[tuple[str, Any]], labels: list[str]) -> None:
    """Stacked shares accept / reject / none of generated verdicts per group and y*."""
    x, w = np.arange(len(groups)), 0.38
    for j, (lab, short) in enumerate((("correct", "y*=C"), ("incorrect", "y*=I"))):
        counts = [m["verdicts_by_label"][lab] for _, m in groups]
        tot = np.array([sum(c.values()) for c in counts], float)
        bottom = np.zeros(len(groups))
        for cls in ("accept", "reject", "none"):
            share = np.array([c[cls] for c in counts]) / np.maximum(tot, 1)
            ax.bar(x + (j - 0.5) * w, share, w, bottom=bottom, color=_VERDICT_COLORS[cls],
                   edgecolor="white", label=f"generated: {cls}" if j == 0 else None)
            bottom += share
        forced = [m.get(f"acceptance_rate_{lab}_forced") for _, m in groups]
        ax.plot(x + (j - 0.5) * w, [np.nan if f is None else f for f in forced], "kD", ms=5,
                label="forced choice: accept" if j == 0 else None)
        for xi, t in zip(x + (j - 0.5) * w, tot):
            ax.text(xi, 1.02, f"{short}\n{int(t)}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, labels)
    ax.set_ylim(0, 1.25)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel("share of answers")
    ax.set_title("Generated verdicts by oracle label", fontsize=10)
    ax.legend(frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25),
              ncol=2)


def plot_asymmetry(metrics: Mapping[str, Any], out_dir: str | Path,
                   name: str = "asymmetry") -> Path:
    """GA, EA, EA_forced; Delta and Delta_forced; the 3-way split of generated verdicts.

    Panel 1: GA, EA (generated verdict, no verdict = wrong) and EA_forced (p_correct > 0.5)
    with 95% CIs (bootstrap over passages). Panel 2: Delta = EA - GA and Delta_forced, on an
    axis fitted to the values and CIs. Panel 3: per group, answers with y* Correct and y*
    Incorrect, stacked shares of generated verdicts accept / reject / none, and the
    forced-choice acceptance as a diamond. Tick labels give n and the passages; groups on
    fewer than 10 passages are starred and explained under the figure.

    Args:
        metrics: the content of ``metrics.json`` (:func:`interp.asymmetry.compute_metrics`).
        out_dir: output folder.
        name: file stem.
    """
    groups, labels = dataset_groups(metrics)
    x = np.arange(len(groups))
    fig, axes = plt.subplots(1, 3, figsize=(max(12, 3.6 * len(groups) + 5), 4.4),
                             gridspec_kw={"width_ratios": [1.3, 1, 1.3]})
    for ax, keys, w in ((axes[0], ("GA", "EA", "EA_forced"), 0.27),
                        (axes[1], ("delta", "delta_forced"), 0.38)):
        for j, key in enumerate(keys):
            vals = [np.nan if m[key] is None else m[key] for _, m in groups]  # None: n/a
            errs = np.array([_err(m[key], m.get(f"{key}_ci")) for _, m in groups]).T
            ax.bar(x + (j - (len(keys) - 1) / 2) * w, vals, w, yerr=errs, capsize=3,
                   color=COLORS.get(key, "#8172B3" if "forced" in key else None),
                   label=_ASYM_LABELS[key], alpha=0.6 if key == "delta_forced" else 1.0)
        ax.set_xticks(x, labels)
        ax.legend(frameon=False, fontsize=8)
    axes[0].set_ylim(0, 1.05)
    axes[0].set_ylabel("accuracy")
    axes[0].set_title("Generation (GA) vs self-evaluation (EA)", fontsize=10)
    ends = [abs(v) for _, m in groups for k in ("delta", "delta_forced")
            for v in [m[k], *(m.get(f"{k}_ci") or [])] if v is not None]
    lim = max(0.1, 1.15 * max(ends))
    axes[1].set_ylim(-lim, lim)
    axes[1].axhline(0, color="black", lw=0.8)
    axes[1].set_ylabel("EA − GA")
    axes[1].set_title("Asymmetry Δ", fontsize=10)
    _verdict_split_panel(axes[2], groups, labels)
    fig.suptitle(f"Task asymmetry — {', '.join(metrics.get('models', []))} (CIs: bootstrap "
                 f"over passages)", fontsize=10)
    fig.tight_layout()
    passage_footnote(fig, groups)
    return save(fig, out_dir, name)


_ASYM_LABELS = {"GA": "GA", "EA": "EA (generated verdict)", "EA_forced": "EA forced choice",
                "delta": "Δ = EA − GA", "delta_forced": "Δ forced = EA_forced − GA"}


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
        if pm and pm.get("metric") == "auc" and pm.get("null_q95") is not None:
            ax.axhline(pm["null_q95"], color="tab:red", ls="-.", lw=1,
                       label=f"best cell under permuted labels, 95th pct ({pm['n']} perms)")
    if key == "accuracy":
        ax.axhline(results["majority_baseline_accuracy"], color="grey", ls=":", lw=1,
                   label="chance AUC / majority-class accuracy")
    ax.set_title(f"{task} prompt — {label}", fontsize=10)
    ax.set_xlabel(f"layer ({results['hook_point']})")
    ax.set_ylim(0, 1.02)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    if first_column:
        b = t["best"]
        ax.set_ylabel(f"CV mean over {results['folds']} folds")
        ax.text(0.02, 0.03, f"best: {b['probe']} L{b['layer']} {b['pool']}\n"
                f"AUC {b['auc']:.2f}, F1 {b['f1']:.2f}{permutation_text(pm)}",
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
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=min(5, len(seen)),
               fontsize=9, frameon=False, bbox_to_anchor=(0.5, 0.0))
    return save(fig, out_dir, name)


# --- transfer (Study 3, interp/transfer.py) ---------------------------------------------------


def _transfer_groups(table: Mapping[str, Any], kind: str = "self") -> tuple[list[str],
                                                                            list[str]]:
    models = list(table[kind])
    datasets = [d for d in next(iter(table[kind].values()))]
    return models, datasets


def judge_notes(table: Mapping[str, Any], kinds: tuple[str, ...] = ("self",
                                                                     "judge_base_answers")
                ) -> list[str]:
    """Where a transfer model's judge is degenerate, what its EA then means (one line each).

    From each group's verdict split (``verdicts``: accept / reject / none over ``n``): a judge
    that accepts every answer has EA = GA by construction, one that rejects every answer has
    EA = 1 - GA (the share of wrong answers), and when a third or more of the verdicts are
    unparseable, EA counts them as wrong ("Measuring honestly", DESIGN.md).

    Args:
        table: ``transfer/table.json``.
        kinds: the table's sections to read (own answers, the base model's answers).

    Returns:
        Lines such as ``"lora_eval, squad_v2 (own answers): rejects all 50: EA = 1 - GA"``.
    """
    where = {"self": "own answers", "judge_base_answers": "base answers"}
    out = []
    for kind in kinds:
        for model, groups in (table.get(kind) or {}).items():
            for d, g in groups.items():
                v, n = g.get("verdicts") or {}, g.get("n") or 0
                head = f"{model}, {d} ({where.get(kind, kind)})"
                if n and v.get("accept") == n:
                    out.append(f"{head}: accepts all {n}: EA = GA by construction")
                elif n and v.get("reject") == n:
                    out.append(f"{head}: rejects all {n}: EA = 1 - GA by construction")
                elif n and (v.get("none") or 0) * 3 >= n:
                    out.append(f"{head}: {v['none']} of {n} verdicts unparseable (EA counts "
                               f"them as wrong)")
    return out


def plot_transfer_matrix(table: Mapping[str, Any], out_dir: str | Path,
                         name: str = "transfer_matrix", model: str | None = None) -> Path:
    """Transfer matrix: model (base, LoRA-Gen, LoRA-Eval, LoRA-Both) x task heatmap.

    Columns per dataset: GA (T_gen accuracy), EA (T_eval accuracy on its own answers), EA on
    the base model's answers, and the two acceptance rates; cells annotated with the value.
    Row labels give each model's verdict split on its own answers (accept / reject / none);
    degenerate judges are named under the figure (:func:`judge_notes`).

    Args:
        table: ``transfer/table.json`` (:func:`interp.stages.transfer.build_table`).
        out_dir: output folder.
        name: file stem.
        model: the base model's name, for the title.
    """
    models, datasets = _transfer_groups(table)
    cols = [("GA", "self", "GA\n(T_gen)"), ("EA", "self", "EA\n(T_eval, own)"),
            ("EA", "judge_base_answers", "EA\n(base answers)"),
            ("acceptance_rate_correct", "self", "accept\n| y*=C"),
            ("acceptance_rate_incorrect", "self", "accept\n| y*=I")]
    grid, xlabels = [], []
    for d in datasets:
        for key, kind, lab in cols:
            xlabels.append(f"{lab}\n{d}" if len(datasets) > 1 else lab)
    for m in models:
        row = []
        for d in datasets:
            for key, kind, _ in cols:
                v = table.get(kind, {}).get(m, {}).get(d, {}).get(key)
                row.append(np.nan if v is None else v)
        grid.append(row)
    arr = np.array(grid, dtype=float)
    fig, ax = plt.subplots(figsize=(1.25 * arr.shape[1] + 2.2, 0.7 * len(models) + 1.8))
    im = ax.imshow(arr, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for i in range(arr.shape[0]):
        for j in range(arr.shape[1]):
            if not np.isnan(arr[i, j]):
                ax.text(j, i, f"{arr[i, j]:.2f}", ha="center", va="center", fontsize=8,
                        color="white" if arr[i, j] < 0.55 else "black")
    ax.set_xticks(range(arr.shape[1]), xlabels, fontsize=7)
    def split(m: str) -> str:
        v = [table["self"][m].get(d, {}).get("verdicts") or {} for d in datasets]
        return "/".join(str(sum(x.get(k, 0) for x in v)) for k in ("accept", "reject", "none"))

    ax.set_yticks(range(len(models)), [f"{m}\nacc/rej/none {split(m)}" for m in models],
                  fontsize=8)
    base = next(iter(table["self"].values()))
    ns = ", ".join(f"{d}: n={base[d].get('n')}" + (f", {base[d]['n_passages']} passages"
                                                   if base[d].get("n_passages") else "")
                   for d in datasets)
    ax.set_title(f"Transfer matrix (model x task){' of ' + model if model else ''} — "
                 f"validation records, {ns}", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.02, label="rate (accuracy or acceptance)")
    fig.tight_layout()
    footnote(fig, judge_notes(table))
    return save(fig, out_dir, name)


def plot_transfer_acceptance(table: Mapping[str, Any], out_dir: str | Path,
                             name: str = "transfer_acceptance", model: str | None = None
                             ) -> Path:
    """Acceptance rates P(verdict Correct | y*) per model, with 95% CIs (bootstrap over passages).

    One panel per dataset; for each model two bars: answers the oracle judges correct and
    incorrect (self-evaluation of the model's own answers), plus GA as a marker; degenerate
    judges are named under the figure (:func:`judge_notes`).

    Args:
        table: ``transfer/table.json``.
        out_dir: output folder.
        name: file stem.
        model: the base model's name, for the title.
    """
    models, datasets = _transfer_groups(table)
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.8 * len(datasets), 3.8),
                             squeeze=False)
    x = np.arange(len(models))
    w = 0.38
    for ax, d in zip(axes[0], datasets):
        for j, key in enumerate(("correct", "incorrect")):
            vals, errs = [], []
            for m in models:
                g = table["self"][m].get(d, {})
                v = g.get(f"acceptance_rate_{key}")
                vals.append(np.nan if v is None else v)
                errs.append(_err(v or 0.0, g.get(f"acceptance_rate_{key}_ci")))
            ax.bar(x + (j - 0.5) * w, vals, w, yerr=np.array(errs).T, capsize=3,
                   color=COLORS[key], label=f"answer oracle-{key}")
        ga = [table["self"][m].get(d, {}).get("GA", np.nan) for m in models]
        ax.plot(x, ga, "k_", ms=18, mew=2, label="GA")
        ax.set_xticks(x, models)
        ax.set_ylim(0, 1.05)
        ax.set_title(d)
        ax.set_ylabel("P(judge says Correct)")
    axes[0][0].legend(frameon=False, fontsize=8)
    fig.suptitle("Acceptance rates after LoRA fine-tuning (self-evaluation)"
                 + (f", {model}" if model else ""), fontsize=10)
    fig.tight_layout()
    footnote(fig, judge_notes(table, ("self",)))
    return save(fig, out_dir, name)


def plot_transfer_patching(patching: Mapping[str, Any], out_dir: str | Path,
                           name: str = "transfer_patching", model: str | None = None) -> Path:
    """Per layer, the share of the adapter's verdict change carried by the patched residual.

    The share is of the adapter's verdict logit-difference change (adapter -> base solid,
    base -> adapter dashed).

    Args:
        patching: ``transfer/patching.json`` (:func:`interp.transfer.cross_model_patching`
            per adapter).
        out_dir: output folder.
        name: file stem.
        model: the base model's name, for the title.
    """
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for k, (adapter, res) in enumerate(patching["adapters"].items()):
        if res.get("fraction_a_to_b") is None:
            continue
        c = f"C{k}"
        ax.plot(res["layers"], res["fraction_a_to_b"], "-o", ms=3, color=c,
                label=f"{adapter} -> base (|ΔLD|={res['mean_abs_change']:.2f})")
        ax.plot(res["layers"], res["fraction_b_to_a"], "--", color=c,
                label=f"base -> {adapter}")
    ax.axhline(0, color="black", lw=0.6)
    ax.axhline(1, color="gray", lw=0.6, ls=":")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("layer L (resid_post patched)")
    ax.set_ylabel("fraction of verdict logit-diff change")
    ax.set_title(f"Patching across models{' (' + model + ')' if model else ''}: "
                 f"{patching['positions']} positions, {patching['n_prompts']} eval prompts",
                 fontsize=10)
    ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return save(fig, out_dir, name)


# --- Study 2: attention span mass (interp.attention) ---------------------------------------

_SPAN_TITLES = {"context": "context c", "question": "question q", "candidate": "candidate a",
                "template": "template (rest)", "reference": "reference"}


def plot_span_mass_layerwise(summary: Mapping[str, Any], out_dir: str | Path,
                             name: str = "attention_layerwise") -> Path:
    """Layerwise last-token span mass, gen vs eval, one panel per span, one row per dataset.

    Lines are means over heads and records; bands are bootstrap 95% CIs over passages; the
    grey area is the summary's layer band (paper: the last eight layers).

    Args:
        summary: ``attention/summary.json`` (:func:`interp.attention.summarize`).
        out_dir: output folder.
        name: file stem.
    """
    groups = [(d, g) for d, g in summary["per_dataset"].items() if g.get("layerwise")]
    if len(groups) > 1:
        groups.append(("overall", summary["overall"]))
    spans = [s for s in summary["spans"] if s != "reference"] + (
        ["reference"] if "reference" in summary["spans"] else [])
    band = summary["band"]
    fig, axes = plt.subplots(len(groups), len(spans), figsize=(3.1 * len(spans),
                                                                2.3 * len(groups) + 0.6),
                             squeeze=False, sharex=True)
    for i, (ds, g) in enumerate(groups):
        for j, s in enumerate(spans):
            ax = axes[i, j]
            ax.axvspan(band[0] - 0.5, band[-1] + 0.5, color="0.9", zorder=0)
            for t in ("gen", "eval"):
                lw = g["layerwise"][t].get(s)
                if lw is None or (t == "gen" and s == "candidate"):
                    continue
                x = np.arange(len(lw["mean"]))
                ax.plot(x, lw["mean"], color=COLORS[t], lw=1.4, label=t)
                ax.fill_between(x, lw["lo"], lw["hi"], color=COLORS[t], alpha=0.25, lw=0)
            ax.set_ylim(0, None)
            if i == 0:
                ax.set_title(_SPAN_TITLES.get(s, s), fontsize=10)
            if j == 0:
                ax.set_ylabel(f"{ds} (n={g['n']}, {g.get('n_passages', '?')} passages"
                              f"{'*' * bool(g.get('few_passages'))})\nmass", fontsize=9)
            if i == len(groups) - 1:
                ax.set_xlabel("layer")
    axes[0, 0].legend(frameon=False, fontsize=8)
    fig.suptitle(f"Last-token attention mass per span ({summary.get('model') or ''}; shaded: "
                 f"band {band[0]}-{band[-1]}; bands: bootstrap over passages)", fontsize=11)
    fig.tight_layout()
    passage_footnote(fig, groups)
    return save(fig, out_dir, name)


def plot_head_context_heatmaps(summary: Mapping[str, Any], out_dir: str | Path,
                               name: str = "attention_heads_context",
                               dataset: str | None = None) -> Path:
    """Layer x head heatmaps of last-token context mass: gen, eval and gen minus eval.

    Args:
        summary: ``attention/summary.json``.
        out_dir: output folder.
        name: file stem.
        dataset: one dataset (default: all records).
    """
    g = summary["overall"] if dataset is None else summary["per_dataset"][dataset]
    gen = np.asarray(g["head_context"]["gen"])
    ev = np.asarray(g["head_context"]["eval"])
    diff = gen - ev
    band = summary["band"]
    fig, axes = plt.subplots(1, 3, figsize=(4 + 0.45 * gen.shape[1] * 3,
                                            max(3.2, 1.2 + 0.2 * gen.shape[0])))
    vmax = float(max(gen.max(), ev.max()))
    lim = float(np.abs(diff).max()) or 1.0
    for ax, arr, title, kw in ((axes[0], gen, "gen", {"cmap": "viridis", "vmin": 0,
                                                      "vmax": vmax}),
                               (axes[1], ev, "eval", {"cmap": "viridis", "vmin": 0,
                                                      "vmax": vmax}),
                               (axes[2], diff, "gen − eval", {"cmap": "RdBu_r", "vmin": -lim,
                                                             "vmax": lim})):
        im = ax.imshow(arr, aspect="auto", origin="lower", interpolation="nearest", **kw)
        ax.axhline(band[0] - 0.5, color="white" if title != "gen − eval" else "black",
                   lw=0.8, ls="--")
        ax.set_title(f"context mass, {title}", fontsize=10)
        ax.set_xlabel("head")
        ax.set_xticks(range(arr.shape[1]))
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03,
                     label="gen − eval" if title == "gen − eval" else "mean context mass")
    axes[0].set_ylabel("layer")
    fig.suptitle(f"Per-head last-token context mass ({dataset or 'all datasets'}, "
                 f"n={g['n']}, {g.get('n_passages', '?')} passages; dashed: band start)",
                 fontsize=11)
    fig.tight_layout()
    passage_footnote(fig, [(dataset or "all datasets", g)])
    return save(fig, out_dir, name)


def plot_context_ratio(summary: Mapping[str, Any], out_dir: str | Path,
                       name: str = "attention_context_ratio") -> Path:
    """Per dataset: band context mass gen vs eval, candidate mass (eval), and three ratios.

    Right panel, gen/eval with cluster-bootstrap CIs: the ratio of band means, the geometric
    mean of per-record ratios, and the ratio of the context shares of the content spans
    (context / (context + question + candidate)), which discounts mass moved onto the
    template.

    Args:
        summary: ``attention/summary.json``.
        out_dir: output folder.
        name: file stem.
    """
    groups, labels = dataset_groups(summary)
    x = np.arange(len(groups))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8, 2.4 * len(groups) + 3), 4))
    w = 0.27
    bars = (("gen", "context", "context, gen"), ("eval", "context", "context, eval"),
            ("eval", "candidate", "candidate, eval"))
    for j, (t, s, lab) in enumerate(bars):
        vals = [g[t][s]["mean"] or 0.0 for _, g in groups]
        errs = np.array([_err(g[t][s]["mean"] or 0.0, g[t][s]["ci"]) for _, g in groups]).T
        color = COLORS[t] if s == "context" else "#8172B3"
        ax1.bar(x + (j - 1) * w, vals, w, yerr=errs, capsize=3, color=color, label=lab)
    ax1.set_xticks(x, labels)
    ax1.set_ylabel("band-mean attention mass")
    band = summary["band"]
    ax1.set_title(f"Last-token mass, layers {band[0]}-{band[-1]}, all heads", fontsize=10)
    ax1.set_ylim(0, 1.3 * ax1.get_ylim()[1])
    ax1.legend(frameon=True, fontsize=8, ncol=3, loc="upper center")
    for j, (key, lab) in enumerate((("context_ratio", "ratio of means"),
                                    ("context_ratio_geometric", "geometric mean of ratios"),
                                    ("content_context_share_ratio",
                                     "context share of content spans"))):
        vals = [np.nan if g.get(key) is None else g[key] for _, g in groups]
        errs = np.array([_err(v if v == v else 0.0, g.get(f"{key}_ci"))
                         for v, (_, g) in zip(vals, groups)]).T
        ax2.bar(x + (j - 1) * w, vals, w, yerr=errs, capsize=3, label=lab,
                color=("#55A868", "#8172B3", "#937860")[j])
    ax2.axhline(1, color="black", lw=0.8)
    ax2.set_xticks(x, labels)
    ax2.set_ylabel("gen / eval")
    ax2.set_title("Context ratio gen/eval (paper: 3-5x)", fontsize=10)
    ax2.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    passage_footnote(fig, groups)
    return save(fig, out_dir, name)


from interp.plots.patching import plot_patching  # noqa: E402
from interp.plots.steering import plot_steering  # noqa: E402

__all__ = ["COLORS", "dataset_groups", "footnote", "plot_asymmetry", "plot_context_ratio",
           "permutation_text", "plot_head_context_heatmaps", "plot_patching", "plot_probes",
           "plot_span_mass_layerwise", "plot_steering", "plot_transfer_acceptance",
           "plot_transfer_matrix", "plot_transfer_patching", "save"]
