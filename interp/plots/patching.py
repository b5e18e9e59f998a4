"""Patching figures, drawn from ``DIR/patching/{pairs}/{kind}/`` tables (never live models).

Every effect is the judge's whole-reply verdict score (``logit_diff``, nats); normalised
effects are ratios of sums over the pairs kept (``|gap| >= min_gap``,
:mod:`interp.stages.patching_summary`). Titles give the pairs kept / built and the passages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from interp.plots import COLORS, plt, save

__all__ = ["plot_patching"]


def _heat(ax: Any, mat: Any, xlabels: list[str], ylabels: list[str], title: str,
          cbar_label: str) -> None:
    vals = np.asarray(mat, dtype=float)
    lim = np.nanmax(np.abs(vals)) if np.isfinite(vals).any() else 1.0
    im = ax.imshow(vals, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim,
                   interpolation="nearest", origin="lower")
    ax.set_xticks(range(len(xlabels)), xlabels, rotation=90, fontsize=6)
    step = max(1, len(ylabels) // 15)
    ax.set_yticks(range(0, len(ylabels), step), ylabels[::step], fontsize=7)
    ax.set_title(title, fontsize=9)
    plt.colorbar(im, ax=ax, fraction=0.03, label=cbar_label)


def _pair_heat(units: Any, col_key: str, cols: list, xl: list[str], stem: str, title: str,
               out_dir: Path, xlabel: str) -> Path:
    """Two heatmaps: the exact ratio of sums and the attribution estimate's.

    The exact panel is blank where no kept pair had the unit patched exactly.
    """
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 0.5 * len(xl) + 5), 5))
    for ax, col, lab in zip(axes, ("ratio", "ratio_attr"),
                            ("exact (ratio of sums)", "attribution estimate (ratio of sums)")):
        m = units.pivot_table(index="layer", columns=col_key, values=col, aggfunc="first",
                              dropna=False).reindex(columns=cols)
        _heat(ax, m.to_numpy(dtype=float), xl, [str(i) for i in m.index], lab,
              "normalised effect")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("layer")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save(fig, out_dir, stem)


def _layer_lines(units: Any, span: str, s: dict[str, Any], stem: str, title: str,
                 out_dir: Path) -> Path:
    """Per patched layer: normalised effect, raw change, forced-verdict flip rate, context."""
    u = units[(units.unit == "span") & (units.span == span)].sort_values("layer")
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    base = s.get("mean_corrupt_context_mass", np.nan)
    for ax, col, lab in zip(axes, ("ratio", "mean_d_ld", "flip_rate", "mean_context_mass"),
                            ("normalised effect (ratio of sums)", "mean Δ logit_diff (nats)",
                             "forced-verdict flip rate", "judge's context mass (band)")):
        ax.plot(u.layer, u[col], color=COLORS["eval"], lw=2, marker="o", ms=3)
        ref = base if col == "mean_context_mass" else 0.0
        ax.axhline(ref, color="black", lw=0.8)
        ax.set_xlabel("patched layer")
        ax.set_ylabel(lab)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save(fig, out_dir, stem)


def _attribution(df: Any, s: dict[str, Any], stem: str, title: str, out_dir: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    agree = s.get("agreement", {})
    for ax, (lab, g), key in zip(axes, (("heads", df[df.unit == "head"]),
                                        ("residual", df[df.unit != "head"])),
                                 ("heads", "resid")):
        ax.scatter(g.d_ld, g.attr_ld, s=8, alpha=0.5, color=COLORS["eval"])
        if len(g):
            lo = float(np.nanmin([g.d_ld.min(), g.attr_ld.min()]))
            hi = float(np.nanmax([g.d_ld.max(), g.attr_ld.max()]))
            ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, ls="--")
        a = agree.get(key, {})
        ov, sp = a.get("overlap_at_k_mean"), a.get("spearman_mean")
        ax.set_title(f"{lab}: overlap@{a.get('k')} "
                     f"{'-' if ov is None else f'{ov:.2f}'}, Spearman "
                     f"{'-' if sp is None else f'{sp:.2f}'}", fontsize=9)
        ax.set_xlabel(f"exact patching Δ logit_diff (nats); {len(g)} (pair, unit) rows")
        ax.set_ylabel("attribution estimate (nats)")
        ax.xaxis.set_major_locator(plt.MaxNLocator(nbins=5))
        ax.yaxis.set_major_locator(plt.MaxNLocator(nbins=6))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save(fig, out_dir, stem)


def _position_labels(effects: Any, cols: list) -> list[str]:
    """Column labels of the position heatmap: the offset, the token and how many pairs.

    Pairs of different lengths are aligned at the end, so a column holds different tokens in
    different pairs; its token is shown only when every pair has the same one there.
    """
    out = []
    for c in cols:
        rows = effects[effects.rel_position == c]
        if "kept" in rows and rows.kept.any():  # the heatmap sums over the kept pairs
            rows = rows[rows.kept]
        toks = set(rows.token) if "token" in rows else set()
        n = rows.id.nunique() if "id" in rows else len(rows)
        tok = repr(next(iter(toks)))[1:-1][:10] + " " if len(toks) == 1 else ""
        out.append(f"{tok}{c} [{n}]")
    return out


def plot_patching(table_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Figures of one patching experiment, from its stored tables.

    * ``candidate-swap``/``resid``: layer x position (offset from the end) and layer x span,
      each as the exact ratio of sums and the attribution estimate's;
    * last-position pairs (``gen-to-eval``, ``eval-to-gen``) and the system-prompt control,
      ``resid``: per patched layer the normalised effect, the raw change, the forced-verdict
      flip rate and the judge's context mass;
    * ``heads``: layer x head (exact and attribution);
    * ``attribution``: attribution estimate vs exact change, heads and residual units, with
      AtP*'s top-k overlap and Spearman correlation.

    Returns:
        The PNG paths written (``patching_{pairs}_{kind}[_...].png``).
    """
    import pandas as pd

    table_dir, out_dir = Path(table_dir), Path(out_dir)
    s = json.loads((table_dir / "summary.json").read_text())
    if not (table_dir / "units.parquet").exists():
        return []
    units = pd.read_parquet(table_dir / "units.parquet")
    pk, kind = s["pairs"], s["kind"]
    stem = f"patching_{pk.replace('-', '_')}_{kind}"
    mode = "exact top-k (AtP*)" if s.get("exact") == "topk" else "exact, every unit"
    head = (f"{pk}{' (control)' if s.get('control') else ''}, {kind}: "
            f"{s.get('n_pairs_kept')} of {s.get('n_pairs')} pairs with |gap| >= "
            f"{s.get('min_gap')} nats, {s.get('n_passages')} passages; {mode}")
    out: list[Path] = []
    if kind == "resid" and pk == "candidate-swap":
        pos = units[units.unit == "position"]
        if len(pos):
            cols = sorted(pos.rel_position.unique())
            xl = _position_labels(pd.read_parquet(table_dir / "effects.parquet"), cols)
            out.append(_pair_heat(pos, "rel_position", cols, xl, f"{stem}_position", head,
                                  out_dir, "position, offset from the end (its token when every "
                                           "pair has the same one there; [n pairs])"))
        sp = units[units.unit == "span"]
        order = [c for c in ("context", "question", "candidate", "template", "verdict", "all")
                 if c in set(sp.span)] + sorted(set(sp.span) - {
                     "context", "question", "candidate", "template", "verdict", "all"})
        out.append(_pair_heat(sp, "span", order, order, f"{stem}_span", head, out_dir, "span"))
    elif kind == "resid":
        span = "verdict" if pk in ("gen-to-eval", "eval-to-gen") else "context"
        out.append(_layer_lines(units, span, s, stem, head, out_dir))
    elif kind == "heads":
        hs = units[units.unit == "head"]
        cols = sorted(hs["head"].unique())
        out.append(_pair_heat(hs, "head", cols, [str(c) for c in cols], stem, head, out_dir,
                              "head"))
    else:
        df = pd.read_parquet(table_dir / "effects.parquet")
        out.append(_attribution(df, s, stem, head, out_dir))
    return out
