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
from matplotlib.colors import to_rgba
from matplotlib.patches import Patch

from interp.plots.common import COLORS, footnote, plt, save

__all__ = ["LEFT_OUT", "NOT_EXACT", "NOT_MEASURED", "nothing_to_show", "plot_patching"]

NOT_MEASURED = "0.7"
"""Colour of a heatmap cell that was never measured (no such unit in any pair), told apart
from a zero effect (white in the diverging colour map)."""
NOT_EXACT = "0.9"
"""Colour of an exact-panel cell measured by attribution only (AtP*: outside the top k)."""
LEFT_OUT = "#E3D3B0"
"""Colour of a cell measured only in pairs left out of the headline (``|gap| < min_gap``)."""

_SPAN_ORDER = ("context", "question", "candidate", "template", "verdict", "all")


def nothing_to_show(s: dict[str, Any]) -> str | None:
    """The panel text of an experiment without a kept pair, else None.

    ``nothing to show: 0 of N pairs with |gap| >= X nats`` (the summary's ``n_pairs_kept``,
    ``min_gap`` and, for N, ``n_pairs`` plus the pairs scored and left out under ``min_gap``,
    ``small_gaps``, with their largest |gap|).
    """
    if s.get("n_pairs_kept"):
        return None
    small = s.get("small_gaps") or {}
    most = (f" (largest {small['max_abs']:.2f})" if small.get("max_abs") is not None else "")
    return (f"nothing to show: 0 of {(s.get('n_pairs') or 0) + small.get('n', 0)} pairs with "
            f"|gap| >= {s.get('min_gap')} nats{most}")


def _heat(ax: Any, mat: Any, xlabels: list[str], ylabels: list[str], title: str,
          cbar_label: str, empty: str | None = None, kinds: Any = None) -> None:
    """One diverging heatmap; NaN cells in :data:`NOT_MEASURED` grey, or coloured by ``kinds``.

    ``empty``: written across the panel (no kept pair, :func:`nothing_to_show`). ``kinds``:
    per cell why it has no value (:func:`_cells`); None: every NaN cell is not measured.
    """
    vals = np.asarray(mat, dtype=float)
    lim = np.nanmax(np.abs(vals)) if np.isfinite(vals).any() else 1.0
    lim = lim if lim > 0 else 1.0
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad=NOT_MEASURED)
    im = ax.imshow(np.ma.masked_invalid(vals), aspect="auto", cmap=cmap, vmin=-lim, vmax=lim,
                   interpolation="nearest", origin="lower")
    if kinds is not None:
        rgba = np.zeros((*vals.shape, 4))
        for kind, color in ((_NOT_EXACT, NOT_EXACT), (_LEFT_OUT, LEFT_OUT)):
            rgba[np.asarray(kinds) == kind] = to_rgba(color)
        ax.imshow(rgba, aspect="auto", interpolation="nearest", origin="lower")
    if empty:
        ax.text(0.5, 0.5, empty.replace(": ", ":\n", 1), transform=ax.transAxes,
                ha="center", va="center", fontsize=9, bbox={"fc": "white", "ec": "0.5"})
    ax.set_xticks(range(len(xlabels)), xlabels, rotation=90, fontsize=6)
    step = max(1, len(ylabels) // 15)
    ax.set_yticks(range(0, len(ylabels), step), ylabels[::step], fontsize=7)
    ax.set_title(title, fontsize=9)
    plt.colorbar(im, ax=ax, fraction=0.03, label=cbar_label)


_VALUE, _NOT_MEASURED, _NOT_EXACT, _LEFT_OUT = range(4)


def _cells(units: Any, col_key: str, cols: list, col: str) -> tuple[Any, Any, list]:
    """The ``layer x col_key`` matrix of ``col`` and, per cell, why it has no value.

    A cell is a value, or NOT MEASURED (no pair has the unit: a span that is empty, a position
    past the shorter prompt), or, in the exact panel (``col == "ratio"``), measured by the
    attribution estimate only (AtP*: not among the top k patched exactly), or LEFT OUT: the
    unit was measured only in pairs left out of the headline (``|gap| < min_gap``).

    Returns:
        ``(values [layers, cols], kinds [layers, cols], layers)``.
    """
    def pivot(c: str) -> Any:
        return units.pivot_table(index="layer", columns=col_key, values=c, aggfunc="first",
                                 dropna=False).reindex(columns=cols)

    vals = pivot(col)
    layers = list(vals.index)
    present = pivot("_present").reindex(index=layers).to_numpy(dtype=float)
    vals = vals.to_numpy(dtype=float)
    kinds = np.where(np.isfinite(vals), _VALUE, _NOT_MEASURED)
    missing = ~np.isfinite(vals) & (present == 1)
    if col == "ratio" and "n_exact" in units:
        exact = pivot("n_exact").reindex(index=layers).to_numpy(dtype=float)
        kinds[missing & (exact == 0)] = _NOT_EXACT
        kinds[missing & (exact > 0)] = _LEFT_OUT
    else:
        kinds[missing] = _LEFT_OUT
    return vals, kinds, layers


def _legend(kinds: set[int], s: dict[str, Any]) -> list[Patch]:
    """Legend entries of the kinds of empty cells the figure shows (none: no legend)."""
    text = {_NOT_MEASURED: (NOT_MEASURED, "grey: not measured (no such unit in any pair)"),
            _NOT_EXACT: (NOT_EXACT, f"light grey: not patched exactly (outside the top "
                                    f"{s.get('top_k')} by attribution; attribution estimate only)"),
            _LEFT_OUT: (LEFT_OUT, f"beige: left out, measured only in pairs with |gap| < "
                                  f"{s.get('min_gap')} nats")}
    return [Patch(color=text[k][0], label=text[k][1]) for k in sorted(kinds) if k in text]


def _pair_heat(units: Any, col_key: str, cols: list, xl: list[str], stem: str, title: str,
               out_dir: Path, xlabel: str, summary: dict[str, Any], *,
               empty: str | None = None, notes: list[str] | None = None) -> Path:
    """Two heatmaps: the exact ratio of sums and the attribution estimate's.

    Cells without a value are coloured by why (:func:`_cells`: not measured, not patched
    exactly, left out), each kind shown named in the legend only where such cells exist;
    ``empty`` (:func:`nothing_to_show`) is written on both panels; ``notes`` go under the
    figure.
    """
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 0.5 * len(xl) + 5), 5))
    units = units.assign(_present=1.0)
    shown: set[int] = set()
    for ax, col, lab in zip(axes, ("ratio", "ratio_attr"),
                            ("exact (ratio of sums)", "attribution estimate (ratio of sums)")):
        vals, kinds, layers = _cells(units, col_key, cols, col)
        shown |= set(np.unique(kinds).tolist())
        _heat(ax, vals, xl, [str(i) for i in layers], lab, "normalised effect", empty, kinds)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("layer")
    fig.suptitle(title, fontsize=10)
    handles = _legend(shown, summary)
    fig.tight_layout(rect=(0, 0.01 + 0.04 * len(handles), 1, 1))
    if handles:
        # anchored in figure coordinates: a legend placed by ``loc`` alone moves with the
        # figure box, which bbox_inches="tight" grows over the footnote when saving
        fig.legend(handles=handles, loc="lower right", fontsize=8, frameon=False,
                   bbox_to_anchor=(1, 0), bbox_transform=fig.transFigure)
    footnote(fig, notes, wrap=max(60, int(12 * fig.get_figwidth())))
    return save(fig, out_dir, stem)


def span_notes(effects: Any, spans: list[str], pairs: Any = None) -> list[str]:
    """Notes for the span columns no kept pair patched (their column stays, grey).

    ``candidate`` is patched as a whole only when the clean and corrupt answers have the same
    token length (:meth:`interp.methods.pairs.PatchPair.span_units`); otherwise the pair's
    ``middle``
    is the empty span ``[0, 0]``. With ``pairs`` (``pairs.parquet``) the note counts the kept
    pairs with an empty middle.

    Args:
        effects: ``effects.parquet`` (columns ``id``, ``kept``, ``unit``, ``span``).
        spans: the span columns of the figure.
        pairs: ``pairs.parquet`` (columns ``id``, ``middle``, ``n_clean``, ``n_tokens``).
    """
    kept = effects[effects.kept] if "kept" in effects else effects
    if not len(kept):
        return []
    have = set(kept[kept.unit == "span"].span)
    notes = []
    for sp in spans:
        if sp in have:
            continue
        if sp != "candidate":
            notes.append(f"{sp}: not measured in any kept pair")
            continue
        why = ""
        if pairs is not None and "middle" in pairs:
            k = pairs[pairs.id.isin(set(kept.id))]
            empty = [r for r in k.itertuples() if r.middle[1] <= r.middle[0]]
            lens = ", ".join(f"{r.n_clean} vs {r.n_tokens}" for r in empty[:3])
            why = (f": its middle span is empty ([0, 0]) in {len(empty)} of {len(k)} kept "
                   f"pairs, clean and corrupt prompts differ in length (tokens {lens}"
                   f"{', ...' if len(empty) > 3 else ''})")
        notes.append(f"candidate: not patched as a whole in any kept pair{why}; the clean and "
                     "corrupt answers must have the same token length for that")
    return notes


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
        if empty := nothing_to_show(s):
            ax.text(0.5, 0.5, empty.replace(": ", ":\n", 1), transform=ax.transAxes,
                    ha="center", va="center", fontsize=8, bbox={"fc": "white", "ec": "0.5"})
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
    * heatmap cells without a value are coloured by why: never measured (grey), measured by
      attribution only (light grey, the exact panel of AtP*), or measured only in pairs left
      out (``|gap| < min_gap``, beige), each named in the legend only where it occurs; a zero
      effect is white; without a kept pair the panels say ``nothing to show: 0 of N pairs ...``; a
      candidate-swap span column no kept pair patched (``candidate`` when the answers differ
      in length) stays, grey, with a note under the figure (:func:`span_notes`);
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
    empty = nothing_to_show(s)
    if kind == "resid" and pk == "candidate-swap":
        pos = units[units.unit == "position"]
        if len(pos):
            cols = sorted(pos.rel_position.unique())
            xl = _position_labels(pd.read_parquet(table_dir / "effects.parquet"), cols)
            out.append(_pair_heat(pos, "rel_position", cols, xl, f"{stem}_position", head,
                                  out_dir, "position, offset from the end (its token when every "
                                           "pair has the same one there; [n pairs])", s,
                                  empty=empty))
        sp = units[units.unit == "span"]
        order = [c for c in _SPAN_ORDER if c in set(sp.span) or c == "candidate"] + sorted(
            set(sp.span) - set(_SPAN_ORDER))
        pairs_path = table_dir / "pairs.parquet"
        notes = span_notes(pd.read_parquet(table_dir / "effects.parquet"), order,
                           pd.read_parquet(pairs_path) if pairs_path.exists() else None)
        out.append(_pair_heat(sp, "span", order, order, f"{stem}_span", head, out_dir, "span",
                              s, empty=empty, notes=notes))
    elif kind == "resid":
        span = "verdict" if pk in ("gen-to-eval", "eval-to-gen") else "context"
        out.append(_layer_lines(units, span, s, stem, head, out_dir))
    elif kind == "heads":
        hs = units[units.unit == "head"]
        cols = sorted(hs["head"].unique())
        out.append(_pair_heat(hs, "head", cols, [str(c) for c in cols], stem, head, out_dir,
                              "head", s, empty=empty))
    else:
        df = pd.read_parquet(table_dir / "effects.parquet")
        out.append(_attribution(df, s, stem, head, out_dir))
    return out
