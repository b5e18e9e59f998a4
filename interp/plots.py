"""Figures drawn from stored tables (metrics.json, summaries), never from live models.

Each ``plot_*`` function takes the parsed table and an output folder, writes ``NAME.png`` and
``NAME.pdf`` there, and returns the PNG path.
"""

from __future__ import annotations

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


def _err(value: float, ci: list[float] | None) -> list[float]:
    if not ci:
        return [0.0, 0.0]
    return [max(value - ci[0], 0.0), max(ci[1] - value, 0.0)]


def plot_asymmetry(metrics: Mapping[str, Any], out_dir: str | Path,
                   name: str = "asymmetry") -> Path:
    """GA, EA and Delta per dataset with 95% CI bars, and the two acceptance rates.

    Args:
        metrics: the content of ``metrics.json`` (:func:`interp.asymmetry.compute_metrics`).
        out_dir: output folder.
        name: file stem.
    """
    groups = [(d, m) for d, m in metrics["per_dataset"].items() if m.get("n")]
    if len(groups) > 1:
        groups.append(("overall", metrics["overall"]))
    labels = [f"{d}\n(n={m['n']})" for d, m in groups]
    x = np.arange(len(groups))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8, 2.6 * len(groups) + 3), 4.2))
    w = 0.27
    for j, key in enumerate(("GA", "EA", "delta")):
        vals = [m[key] for _, m in groups]
        errs = np.array([_err(m[key], m.get(f"{key}_ci")) for _, m in groups]).T
        ax1.bar(x + (j - 1) * w, vals, w, yerr=errs, capsize=3, color=COLORS[key],
                label={"delta": "Δ = EA − GA"}.get(key, key))
    ax1.axhline(0, color="black", lw=0.8)
    ax1.set_xticks(x, labels)
    ax1.set_ylim(-1, 1)
    ax1.set_ylabel("accuracy / difference")
    ax1.set_title("Generation (GA) vs self-evaluation (EA)")
    ax1.legend(frameon=False, fontsize=8)
    w = 0.38
    for j, (key, lab) in enumerate((("correct", "answer oracle-correct"),
                                    ("incorrect", "answer oracle-incorrect"))):
        vals = [m.get(f"acceptance_rate_{key}") for _, m in groups]
        errs = np.array([_err(v or 0.0, m.get(f"acceptance_rate_{key}_ci"))
                         for v, (_, m) in zip(vals, groups)]).T
        ax2.bar(x + (j - 0.5) * w, [v if v is not None else np.nan for v in vals], w,
                yerr=errs, capsize=3, color=COLORS[key], label=lab)
    ax2.set_xticks(x, labels)
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("P(judge says Correct)")
    ax2.set_title("Acceptance rates (acquiescence bias)")
    ax2.legend(frameon=False, fontsize=8)
    models = ", ".join(metrics.get("models", []))
    fig.suptitle(f"Task asymmetry — {models}", fontsize=10)
    fig.tight_layout()
    return save(fig, out_dir, name)
