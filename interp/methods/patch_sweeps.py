"""Unit sweeps of one patching pair: every unit exactly, or AtP* (attribution first).

Units of a pair (:class:`Unit`, from :class:`interp.methods.pairs.PatchPair`):

* ``resid``: (layer, position) for each single position that corresponds one to one
  (:meth:`~interp.methods.pairs.PatchPair.position_units`) and (layer, span) for each span with a
  patchable position (:meth:`~interp.methods.pairs.PatchPair.span_units`), at
  ``blocks.L.hook_resid_pre``
  or ``hook_resid_post``;
* ``heads``: (layer, head) at ``blocks.L.attn.hook_z`` over every patchable position.

Algorithm of :func:`sweep` (every effect is the judge's whole-reply ``LD``, nats,
:mod:`interp.methods.patching`):

1. ``exact="all"``: one patched row per unit (the full sweep; batched, shared prefix once).
2. ``exact="topk"`` (AtP*-style, Kramar et al. 2024, "AtP*: An efficient and scalable method for
   localizing LLM behaviour to components", arXiv 2403.00745): attribution patching gives an
   estimate ``attr_ld`` of ``LD_patched - LD_corrupt`` for EVERY unit from one clean forward
   and one forward + backward of the corrupt run
   (:meth:`interp.methods.patching.Patcher.attribution`;
   a span's estimate is the sum of its positions', the first-order estimate of patching them
   together); then the ``top_k`` units by ``|attr_ld|`` are patched exactly. Rule: rank by the
   absolute first-order estimate; verify the top ``k``; report the exact value where verified
   and the estimate elsewhere, marked (``verified``). AtP*'s two corrections: its query-key fix
   recomputes the attention softmax exactly for nodes that act through one head's queries or
   keys; our units (residual positions and head outputs ``z``) are not such nodes, so it does
   not apply here (their effect on later attention patterns is what the exact verification
   measures). GradDrop (AtP*'s guard against cancelling paths) is not implemented; the
   ``attribution`` sweep kind measures how often the verified top ``k`` agrees with the full
   sweep (:func:`agreement`) so the risk is reported, not assumed away.
3. With ``context_span`` and a band of layers, each row also records the judge's context
   attention mass at the verdict position under the patch (mean over heads and band layers;
   the last-row recorder of :mod:`interp.hooks.steering` with no steering).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from interp.analysis.stats import correlations
from interp.core.errors import StageError
from interp.core.tokens import token_strings
from interp.core.vocab import EXACT_MODES
from interp.hooks.recorder import context_mass
from interp.hooks.steering import Steer, steering
from interp.methods.pairs import PatchPair
from interp.methods.patching import Patch, Patcher
from interp.models.points import hook_name

__all__ = ["EXACT_MODES", "Unit", "agreement", "head_units", "resid_units",
           "sweep"]



@dataclass(frozen=True)
class Unit:
    """One patched unit.

    Attributes:
        layer: block index.
        kind: ``position``, ``span`` or ``head``.
        positions: corrupt positions patched.
        position: the single position (``position`` units; else -1).
        span: the span name (``span`` units; else ``""``).
        head: the query head (``head`` units; else -1).
    """

    layer: int
    kind: str
    positions: tuple[int, ...]
    position: int = -1
    span: str = ""
    head: int = -1

    def patch(self, resid_hook: str) -> Patch:
        """The :class:`interp.methods.patching.Patch` of this unit."""
        if self.kind == "head":
            return Patch(hook_name(self.layer, "attn.hook_z"), self.positions, (self.head,))
        return Patch(hook_name(self.layer, resid_hook), self.positions)

    def estimate(self, att: dict[str, np.ndarray]) -> float:
        """The attribution estimate of this unit (module step 2)."""
        if self.kind == "head":
            return float(att["heads"][self.layer, self.head])
        return float(att["resid"][self.layer, list(self.positions)].sum())


def resid_units(pair: PatchPair, layers: Sequence[int], *, per_position: bool = True
                ) -> list[Unit]:
    """(layer, position) and (layer, span) units of a pair (module docstring).

    A span whose positions equal those of an earlier unit (a single position, or a span
    listed before it: ``verdict`` first, ``all`` last) is not repeated.
    """
    singles = pair.position_units() if per_position else []
    spans: dict[tuple[int, ...], str] = {}
    for s, p in pair.span_units().items():
        if tuple(p) not in spans and not (len(p) == 1 and p[0] in singles):
            spans[tuple(p)] = s
    out = []
    for layer in layers:
        out += [Unit(layer, "position", (i,), position=i) for i in singles]
        out += [Unit(layer, "span", p, span=s) for p, s in spans.items()]
    return out


def head_units(pair: PatchPair, layers: Sequence[int], n_heads: int) -> list[Unit]:
    """(layer, head) units over every patchable position of a pair."""
    pos = tuple(pair.patchable())
    return [Unit(layer, "head", pos, head=h) for layer in layers for h in range(n_heads)]


def _recorder(pt: Patcher, band: Sequence[int], span: tuple[int, int],
              out: list[np.ndarray]) -> Callable[[int], Any]:
    """``extra_hooks`` of :meth:`Patcher.run` that appends each batch's context masses."""
    import contextlib

    @contextlib.contextmanager
    def cm(batch: int) -> Any:
        st = Steer(units={}, keys=span, alphas=[1.0] * batch, keep_rows=True)
        with steering(pt.handle, st):
            yield
        out.append(context_mass(st.rows, band, span))
    return cm


def sweep(pt: Patcher, pair: PatchPair, units: Sequence[Unit], *, resid_hook: str,
          exact: str = "topk", top_k: int = 16, context_span: tuple[int, int] | None = None,
          band: Sequence[int] = (), progress: Callable[[int, int], None] | None = None
          ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Patch the units of one pair (module docstring).

    Args:
        pt: the pair's :class:`~interp.methods.patching.Patcher`.
        pair: the pair (tokens and positions for the table).
        units: the units (:func:`resid_units`, :func:`head_units`).
        resid_hook: ``hook_resid_pre`` or ``hook_resid_post``.
        exact: ``topk`` (AtP*) or ``all``; ``both`` runs every unit exactly AND the attribution
            estimates (the comparison of the ``attribution`` sweep kind).
        top_k: units verified exactly with ``topk``.
        context_span: the corrupt prompt's context ``[start, end)`` (records the context mass).
        band: layers averaged for the context mass.
        progress: called with ``(rows done in the batch, rows in all)`` after each batch.

    Returns:
        ``(rows, info)``: one row per unit (``layer``, ``unit``, ``position``,
        ``rel_position``, ``span``, ``head``, ``token``, ``attr_ld``, ``verified``, ``ld``,
        ``d_ld``, ``p_correct``, ``coverage``, ``effect``, ``context_mass``; NaN where not
        measured) and ``info`` (``attr_wall_s``, ``exact_wall_s``, ``n_exact``).

    Raises:
        StageError: an unknown ``exact`` mode or ``top_k < 1``.
    """
    if exact not in (*EXACT_MODES, "both"):
        raise StageError("patching",
                         f"exact must be one of {[*EXACT_MODES, 'both']}, not {exact!r}")
    if top_k < 1:
        raise StageError("patching", f"top_k must be >= 1, got {top_k}")
    est = np.full(len(units), np.nan)
    attr_wall = 0.0
    if exact in ("topk", "both") and units:
        t0 = time.perf_counter()
        att = pt.attribution(sorted({u.layer for u in units}), resid_hook=resid_hook)
        est = np.array([u.estimate(att) for u in units])
        attr_wall = time.perf_counter() - t0
    if exact == "topk":
        chosen = list(np.argsort(-np.abs(est), kind="stable")[:top_k])
    else:
        chosen = list(range(len(units)))
    masses: list[np.ndarray] = []
    extra = _recorder(pt, band, context_span, masses) if context_span and band else None
    res = pt.run([units[i].patch(resid_hook) for i in chosen], extra_hooks=extra,
                 progress=progress) if chosen else None
    rows = _rows(pt, pair, units, est, chosen, res,
                 np.concatenate(masses) if masses else None)
    return rows, {"attr_wall_s": attr_wall, "exact_wall_s": res.wall_s if res else 0.0,
                  "n_exact": len(chosen), "n_units": len(units)}


def _rows(pt: Patcher, pair: PatchPair, units: Sequence[Unit], est: np.ndarray,
          chosen: list[int], res: Any, mass: np.ndarray | None) -> list[dict[str, Any]]:
    n = len(pair.corrupt)
    tok = pt.handle.tokenizer
    nan = float("nan")
    exact = {i: j for j, i in enumerate(chosen)}
    shown = token_strings(tok, pair.corrupt.input_ids)
    rows = []
    for k, u in enumerate(units):
        j = exact.get(k)
        r = {"layer": u.layer, "unit": u.kind, "position": u.position,
             "rel_position": u.position - n if u.position >= 0 else 0, "span": u.span,
             "head": u.head,
             "token": shown[u.position] if u.position >= 0
             else "", "attr_ld": float(est[k]), "verified": j is not None}
        if j is None:
            r.update(ld=nan, d_ld=nan, p_correct=nan, coverage=nan, effect=nan,
                     context_mass=nan)
        else:
            r.update(ld=float(res.patched[j]), d_ld=float(res.patched[j] - res.corrupt),
                     p_correct=float(res.p_correct[j]), coverage=float(res.coverage[j]),
                     effect=float(res.effect[j]),
                     context_mass=float(mass[j]) if mass is not None else nan)
        rows.append(r)
    return rows


def agreement(rows: Sequence[dict[str, Any]], k: int) -> dict[str, Any]:
    """How well AtP* (attribution, then exact top-``k``) reproduces the full exact sweep.

    Args:
        rows: one pair's rows of a sweep with every unit exact AND estimated
            (``exact="both"``).
        k: the verification budget.

    Returns:
        ``overlap_at_k``: ``|top_k(|attr_ld|) & top_k(|d_ld|)| / k`` (the share of the true
        top-``k`` units that AtP* verifies); ``top1_verified``: whether the unit with the
        largest exact ``|d_ld|`` is among the verified; ``pearson`` / ``spearman`` of
        ``attr_ld`` against ``d_ld``; ``n`` units (None where undefined).
    """
    a = np.array([r["attr_ld"] for r in rows], dtype=float)
    e = np.array([r["d_ld"] for r in rows], dtype=float)
    ok = np.isfinite(a) & np.isfinite(e)
    a, e = a[ok], e[ok]
    if not len(a):
        return {"overlap_at_k": None, "top1_verified": None, "pearson": None,
                "spearman": None, "n": 0, "k": k}
    kk = min(k, len(a))
    ta = set(np.argsort(-np.abs(a), kind="stable")[:kk].tolist())
    te = np.argsort(-np.abs(e), kind="stable")[:kk].tolist()
    c = correlations(a, e)
    return {"overlap_at_k": len(ta & set(te)) / kk, "top1_verified": te[0] in ta,
            "pearson": c["pearson"], "spearman": c["spearman"], "n": int(len(a)), "k": kk}
