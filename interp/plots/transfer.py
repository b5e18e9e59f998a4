"""The Study 3 transfer figures, drawn from ``DIR/transfer/table.json`` and its patching table."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.ticker import MaxNLocator

from interp.analysis.stats import degenerate_note
from interp.plots.common import COLORS, ci_bars, footnote, plt, save


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
    unparseable, EA counts them as wrong (docs/measuring.md).

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
        table: ``transfer/table.json`` (:func:`interp.stages.transfer.table.build_table`).
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
    # wide enough per model that two bars' value labels (with a zero-width mark) do not overlap
    fig, axes = plt.subplots(1, len(datasets),
                             figsize=(max(4.8, 1.9 * len(models)) * len(datasets), 3.8),
                             squeeze=False)
    x = np.arange(len(models))
    w = 0.38
    degenerate = False
    for ax, d in zip(axes[0], datasets):
        for j, key in enumerate(("correct", "incorrect")):
            gs = [table["self"][m].get(d, {}) for m in models]
            degenerate |= ci_bars(ax, x + (j - 0.5) * w,
                                  [g.get(f"acceptance_rate_{key}") for g in gs],
                                  [g.get(f"acceptance_rate_{key}_ci") for g in gs], w,
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
    footnote(fig, judge_notes(table, ("self",)) + ([degenerate_note()] if degenerate else []))
    return save(fig, out_dir, name)


def plot_transfer_patching(patching: Mapping[str, Any], out_dir: str | Path,
                           name: str = "transfer_patching", model: str | None = None) -> Path:
    """Per layer, the share of the adapter's verdict change carried by the patched residual.

    The share is of the adapter's verdict logit-difference change (adapter -> base solid,
    base -> adapter dashed).

    Args:
        patching: ``transfer/patching.json`` (:func:`interp.methods.transfer.cross_model_patching`
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
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer L (resid_post patched)")
    ax.set_ylabel("fraction of verdict logit-diff change")
    ax.set_title(f"Patching across models{' (' + model + ')' if model else ''}: "
                 f"{patching['positions']} positions, {patching['n_prompts']} eval prompts",
                 fontsize=10)
    ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return save(fig, out_dir, name)


# --- Study 2: attention span mass (interp.analysis.span_mass)
# ---------------------------------------
