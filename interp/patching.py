"""Activation patching and attribution patching: the engine (tensors and prompts in, numbers out).

Setting (paper section 3.2): the same model judges (eval prompt, T_eval) and generates (gen
prompt, T_gen). We ask which internal states move the judge's verdict. The clean/corrupt pairs
are built in :mod:`interp.pairs`; the stage that runs them over a run directory and writes the
tables is :mod:`interp.stages.patching`.

Metric. At the verdict position (the eval prompt's last position) the logit difference
``LD = logit("Correct") - logit("Incorrect")`` (first tokens of each word,
:func:`interp.prompts.verdict_token_ids`), in nats; ``p_correct = sigmoid(LD)``. The normalised
patch effect is ``(LD_patched - LD_corrupt) / (LD_clean - LD_corrupt)`` (Wang et al. 2022,
"Interpretability in the wild", section 3; Heimersheim & Nanda 2024, "How to use and interpret
activation patching"): 0 = no change, 1 = the patch restores the clean verdict.

Algorithm (:class:`Patcher`):

1. Caching: one clean forward stores the activations at the hook points a sweep needs (on the
   ``donor`` model when there is one); one corrupt forward gives ``LD_corrupt``.
2. Exact activation patching: each patched run replaces activations of the corrupt run by the
   clean ones at a hook point (:data:`PATCH_POINTS`), on a mask of positions (``resid``:
   ``blocks.L.hook_resid_pre`` or ``hook_resid_post`` over (layer, position) and over
   (layer, span)) or of (position, head) (``heads``: ``blocks.L.attn.hook_z``, the input of
   ``o_proj`` split into heads, so a head's contribution is replaced exactly). Corrupt position
   ``i`` takes the clean activation at ``pos_map[i]`` (-1: nothing corresponds, never patched).
   Many patched runs share a forward: the corrupt input is stacked along the batch dimension
   and each row gets its own mask (:mod:`interp.hooks.backends`). Positions before ``start``
   hold identical activations in both runs, so patching them is the identity: their effect is
   exactly 0 and is not run; the shared prefix is computed once and its key/value cache reused
   by every row (``prefix_cache=True``), so a patched row costs only the suffix.
3. Attribution patching (Nanda 2023, "Attribution patching"; Syed et al. 2023, "Attribution
   patching outperforms automated circuit discovery"): one forward and ONE backward pass on
   the corrupt run give ``dLD/da`` at every hook point; the first-order estimate of patching
   ``a`` is ``(a_clean - a_corrupt) . dLD/da``, summed over ``d_model`` for (layer, position)
   at ``hook_resid_pre`` and over ``head_dim`` and the patched positions for (layer, head) at
   ``hook_z``.
4. Sweeps (:func:`sweep_resid`, :func:`sweep_heads`, :func:`sweep_task_layers`): the unit
   lists of one pair (every (layer, position) and (layer, span), every (layer, head), every
   layer over the context with the judge's attention mass) run through step 2.
5. Cost: wall time of the patched forwards divided by that of one clean forward pass.

The same engine patches between two models (``donor``): cross-model patching of the transfer
study (:func:`interp.transfer.cross_model_patching`).

Backends (same hook-point names, same masks): ``hf`` (default), ``transformer_lens``,
``nnsight`` (:mod:`interp.hooks.backends`). The invariants (patch everything = clean, patch
nothing = corrupt, self-patch = no change, backends agree) are tested in
``tests/equivalence/test_patching_equivalence.py``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.errors import PatchingError
from interp.hooks.backends import HFBackend, attention_mass, attn_implementation, get_backend
from interp.hooks.backends import hook_order as _hook_order
from interp.hooks.guard import inference_guard
from interp.hooks.points import hook_name, parse_hook
from interp.models import ModelHandle
from interp.prompts import RenderedPrompt, verdict_token_ids

__all__ = [
    "PATCH_POINTS",
    "Patch",
    "PatchResult",
    "Patcher",
    "logit_diff",
    "patch",
    "sweep_heads",
    "sweep_resid",
    "sweep_task_layers",
    "valid_hooks",
]

PATCH_POINTS = ("hook_resid_pre", "attn.hook_z", "hook_resid_post")
"""Patchable hook points per block, in execution order."""
TokenIds = Int[Tensor, " seq"] | Int[Tensor, "1 seq"] | Sequence[int]
"""One prompt's token ids: ``[seq]`` or ``[1, seq]``."""


def valid_hooks(n_layers: int) -> list[str]:
    """All patchable hook-point names of a model with ``n_layers`` blocks."""
    return [hook_name(layer, p) for layer in range(n_layers) for p in PATCH_POINTS]


def _parse(name: str, n_layers: int) -> tuple[int, str]:
    """``(layer, point)`` of a patchable hook point.

    Raises:
        HookError: an unknown name or a layer out of range (lists the valid ones).
        PatchingError: a known point that is not patchable here (lists the patchable ones).
    """
    layer, point = parse_hook(name, n_layers)
    if point not in PATCH_POINTS:
        raise PatchingError(f"{name!r} is not patchable; valid points: {list(PATCH_POINTS)}")
    return layer, point


@dataclass(frozen=True)
class Patch:
    """One intervention of a patched run: copy clean activations into the corrupt run.

    Attributes:
        hook: hook-point name (:func:`valid_hooks`).
        positions: corrupt-run positions to patch (None: every position).
        heads: query heads to patch (``attn.hook_z`` only; None: all heads).
    """

    hook: str
    positions: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None


def _as_ids(ids: TokenIds, name: str) -> Int[Tensor, " seq"]:
    t = torch.as_tensor(ids, dtype=torch.long)
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1 or t.numel() == 0:
        raise PatchingError(f"{name} must be one prompt's token ids [seq] or [1, seq], got shape "
                            f"{tuple(t.shape)}")
    return t


def logit_diff(logits: Float[Tensor, "*batch vocab"], ids: tuple[int, int]
               ) -> Float[Tensor, "*batch"]:
    """``logit(Correct) - logit(Incorrect)`` from ``[..., vocab]`` logits (nats)."""
    return logits[..., ids[0]] - logits[..., ids[1]]


@dataclass
class PatchResult:
    """Effects of a list of patched runs of one pair.

    Attributes:
        clean, corrupt: ``LD`` of the clean and corrupt runs (nats).
        patched: ``LD`` of each patched run, ``[n_patches]``.
        patches: the patches (one per run; a run may also hold several, see ``labels``).
        wall_s: seconds of the patched forwards; ``clean_forward_s`` of one clean forward.
        n_runs: patched rows actually run (rows whose masks are empty are not run).
    """

    clean: float
    corrupt: float
    patched: Float[np.ndarray, " n_patches"]
    patches: list[Any] = field(default_factory=list)
    wall_s: float = 0.0
    clean_forward_s: float = float("nan")
    n_runs: int = 0

    @property
    def effect(self) -> Float[np.ndarray, " n_patches"]:
        """Normalised effects ``(patched - corrupt) / (clean - corrupt)``.

        NaN when the denominator is below 1e-6 nats.
        """
        den = self.clean - self.corrupt
        if abs(den) < 1e-6:
            return np.full_like(self.patched, np.nan)
        return (self.patched - self.corrupt) / den

    @property
    def cost_ratio(self) -> float:
        """Patched-forward wall time as a multiple of one clean forward pass."""
        return self.wall_s / self.clean_forward_s if self.clean_forward_s else float("nan")


class Patcher:
    """Clean/corrupt runs of one pair and batched patched runs on a backend.

    Args:
        handle: the model of the corrupt (and patched) runs.
        clean_ids: token ids ``[seq]`` of the clean prompt.
        corrupt_ids: token ids ``[seq]`` of the corrupt prompt.
        pos_map: for each corrupt position the clean position whose activation it takes, or
            -1 where nothing corresponds (default: identity, equal lengths required).
        start: first corrupt position whose activations can differ from the clean run or be
            patched; positions before it are run once as a shared prefix (``hf`` only).
        backend: ``hf``, ``transformer_lens`` or ``nnsight``.
        batch_size: patched rows per forward.
        prefix_cache: reuse the key/value cache of ``corrupt_ids[:start]`` (``hf`` only).
        donor: the model of the clean run (default ``handle``): cross-model patching.

    Raises:
        PatchingError: ids of the wrong shape, unequal lengths without ``pos_map``.
        BackendError: an unknown backend.
    """

    def __init__(self, handle: ModelHandle, clean_ids: TokenIds, corrupt_ids: TokenIds, *,
                 pos_map: Sequence[int] | None = None, start: int = 0, backend: str = "hf",
                 batch_size: int = 16, prefix_cache: bool = True,
                 donor: ModelHandle | None = None):
        self.handle = handle
        self.clean_ids = _as_ids(clean_ids, "clean_ids").to(handle.device)
        self.corrupt_ids = _as_ids(corrupt_ids, "corrupt_ids").to(handle.device)
        n = len(self.corrupt_ids)
        if pos_map is None:
            if len(self.clean_ids) != n:
                raise PatchingError(f"clean and corrupt prompts have {len(self.clean_ids)} and "
                                    f"{n} tokens; pass pos_map to align them")
            pos_map = list(range(n))
        self.pos_map = torch.as_tensor(list(pos_map), dtype=torch.long)
        if len(self.pos_map) != n or int(self.pos_map.max()) >= len(self.clean_ids):
            raise PatchingError("pos_map must have one entry per corrupt position, each < the "
                                "clean length or -1")
        self.be = get_backend(handle, backend)
        self.donor_be = self.be if donor is None else get_backend(donor, backend)
        self.batch_size = batch_size
        self.start = int(start) if (prefix_cache and backend == "hf") else 0
        self.start = min(self.start, n - 1)
        self.verdict_ids = verdict_token_ids(handle.tokenizer)
        self._clean_cache: dict[str, Tensor] = {}
        self._prefix = None
        self.clean_ld, self.corrupt_ld = float("nan"), float("nan")
        self.clean_forward_s = float("nan")
        self._clean_logits = None

    # -- baselines ------------------------------------------------------------------------
    def ensure_clean(self, hooks: Iterable[str]) -> None:
        """Run the clean prompt once (more when new hook points are asked) and cache them."""
        need = [h for h in hooks if h not in self._clean_cache]
        for h in need:
            _parse(h, self.handle.n_layers)
        if need or self._clean_logits is None:
            t0 = time.perf_counter()
            with torch.no_grad():
                logits, cache = self.donor_be.forward(self.clean_ids[None], cache_hooks=need)
            dt = time.perf_counter() - t0
            self.clean_forward_s = dt if math.isnan(self.clean_forward_s) else min(
                dt, self.clean_forward_s)
            self._clean_logits = logits[0]
            self.clean_ld = float(logit_diff(logits[0], self.verdict_ids))
            self._clean_cache.update({k: v[0] for k, v in cache.items()})
        if math.isnan(self.corrupt_ld):
            with torch.no_grad():
                logits, _ = self.be.forward(self.corrupt_ids[None])
            self.corrupt_ld = float(logit_diff(logits[0], self.verdict_ids))

    def source(self, hook: str) -> Float[Tensor, "pos ..."]:
        """Clean activation mapped onto corrupt positions ``[S_corrupt, ...]``."""
        act = self._clean_cache[hook]
        return act[self.pos_map.clamp(min=0).to(act.device)]

    # -- masks ----------------------------------------------------------------------------
    def _row_mask(self, p: Patch) -> Bool[Tensor, " pos *heads"]:
        _, point = _parse(p.hook, self.handle.n_layers)
        n = len(self.corrupt_ids)
        pos = torch.zeros(n, dtype=torch.bool)
        if p.positions is None:
            pos[:] = True
        else:
            idx = torch.as_tensor(list(p.positions), dtype=torch.long)
            if len(idx) and (idx.min() < -n or idx.max() >= n):
                raise PatchingError(f"positions must lie in 0..{n - 1} (or be negative from the "
                                    f"end), got {list(p.positions)[:8]}")
            pos[idx] = True
        pos &= self.pos_map >= 0
        pos[: self.start] = False  # identical in both runs (module docstring, step 2)
        if point != "attn.hook_z":
            if p.heads is not None:
                raise PatchingError(f"heads= only applies to attn.hook_z, not {p.hook!r}")
            return pos
        h = torch.zeros(self.handle.n_heads, dtype=torch.bool)
        if p.heads is None:
            h[:] = True
        else:
            bad = [x for x in p.heads if not 0 <= x < self.handle.n_heads]
            if bad:
                raise PatchingError(f"heads {bad} out of range; valid: "
                                    f"0..{self.handle.n_heads - 1}")
            h[list(p.heads)] = True
        return pos[:, None] & h[None, :]

    def _suffix_masks(self, rows: list[list[Patch]]) -> list[dict[str, Tensor]]:
        """Per row: hook -> mask over the positions from ``start`` (empty masks dropped)."""
        out = []
        for r in rows:
            m: dict[str, Tensor] = {}
            for p in r:
                mk = self._row_mask(p)
                m[p.hook] = m[p.hook] | mk if p.hook in m else mk
            out.append({k: v[self.start:] for k, v in m.items() if v.any()})
        return out

    def _batch_masks(self, hooks: list[str], chunk: list[int], masks_all: list[dict],
                     n: int) -> dict[str, Tensor]:
        masks: dict[str, Tensor] = {}
        for h in hooks:
            shape = (len(chunk), n) + ((self.handle.n_heads,) if "hook_z" in h else ())
            mk = torch.zeros(shape, dtype=torch.bool)
            for j, i in enumerate(chunk):
                if h in masks_all[i]:
                    mk[j] = masks_all[i][h]
            if mk.any():
                masks[h] = mk.to(self.handle.device)
        return masks

    # -- sweeps ---------------------------------------------------------------------------
    def run(self, rows: Sequence[Patch | Sequence[Patch]]) -> PatchResult:
        """Run patched forwards, one per row (a row is one patch or several at once).

        Returns:
            :class:`PatchResult` with ``LD`` per row (rows with nothing left to patch after
            ``start`` get the corrupt ``LD`` without running).
        """
        rows = [[r] if isinstance(r, Patch) else list(r) for r in rows]
        hooks = sorted({p.hook for r in rows for p in r}, key=_hook_order)
        self.ensure_clean(hooks)
        if self.start > 0 and self._prefix is None:
            self._prefix = self.be.prefix_cache(self.corrupt_ids[None, : self.start])
        sources = {h: self.source(h)[self.start:] for h in hooks}
        out = np.full(len(rows), self.corrupt_ld, dtype=np.float64)
        masks_all = self._suffix_masks(rows)
        todo = [i for i, m in enumerate(masks_all) if m]
        suffix = self.corrupt_ids[self.start:]
        t0 = time.perf_counter()
        for s in range(0, len(todo), self.batch_size):
            chunk = todo[s:s + self.batch_size]
            masks = self._batch_masks(hooks, chunk, masks_all, len(suffix))
            with torch.no_grad():
                logits, _ = self.be.forward(suffix[None].expand(len(chunk), -1), masks=masks,
                                            sources=sources, prefix=self._prefix)
            out[chunk] = logit_diff(logits, self.verdict_ids).double().cpu().numpy()
        wall = time.perf_counter() - t0
        return PatchResult(clean=self.clean_ld, corrupt=self.corrupt_ld, patched=out,
                           patches=rows, wall_s=wall, clean_forward_s=self.clean_forward_s,
                           n_runs=len(todo))

    def attribution(self, layers: Sequence[int] | None = None,
                    positions: Sequence[int] | None = None
                    ) -> dict[str, Float[np.ndarray, "layer _"]]:
        """Attribution patching (module step 3) on the ``hf`` backend, one backward pass.

        Args:
            layers: layers to score (default all).
            positions: corrupt positions whose differences count for the head scores (default:
                every mapped position from ``start``).

        Returns:
            ``resid`` ``[n_layers, S]``: ``sum_d (clean - corrupt) * dLD/da`` at
            ``hook_resid_pre`` per (layer, position); ``heads`` ``[n_layers, n_heads]``: the same
            at ``attn.hook_z`` summed over head_dim and ``positions``; both in nats (divide by
            ``clean - corrupt`` for normalised effects). Rows of layers not scored are 0.

        Raises:
            PatchingError: another backend than ``hf``.
        """
        if not isinstance(self.be, HFBackend):
            raise PatchingError("attribution patching runs on the hf backend")
        nl = self.handle.n_layers
        layers = list(range(nl)) if layers is None else list(layers)
        hooks = [hook_name(layer, p) for layer in layers for p in ("hook_resid_pre", "attn.hook_z")]
        self.ensure_clean(hooks)
        n = len(self.corrupt_ids)
        valid = (self.pos_map >= 0).clone()
        valid[: self.start] = False
        sel = torch.zeros(n, dtype=torch.bool)
        if positions is None:
            sel = valid.clone()
        else:
            sel[list(positions)] = True
            sel &= valid
        emb = self.handle.model.get_input_embeddings()(self.corrupt_ids[None]).detach()
        emb.requires_grad_(True)
        with torch.enable_grad():
            logits, cache = self.be.forward(self.corrupt_ids[None], cache_hooks=hooks,
                                            inputs_embeds=emb, keep_graph=True)
            ld = logit_diff(logits[0], self.verdict_ids)
            grads = dict(zip(hooks, torch.autograd.grad(ld, [cache[h] for h in hooks])))
        resid, heads = np.zeros((nl, n)), np.zeros((nl, self.handle.n_heads))
        vm, sm = valid.to(self.handle.device), sel.to(self.handle.device)
        for layer in layers:
            h = hook_name(layer, "hook_resid_pre")
            diff = (self.source(h) - cache[h][0].detach()) * vm[:, None]
            resid[layer] = (diff * grads[h][0]).sum(-1).cpu().numpy()
            h = hook_name(layer, "attn.hook_z")
            diff = (self.source(h) - cache[h][0].detach()) * sm[:, None, None]
            heads[layer] = (diff * grads[h][0]).sum((0, 2)).cpu().numpy()
        return {"resid": resid, "heads": heads}


def patch(handle: ModelHandle, clean_ids: TokenIds, corrupt_ids: TokenIds, *, hook: str,
          positions: Sequence[int] | None = None, heads: Sequence[int] | None = None,
          backend: str = "hf", pos_map: Sequence[int] | None = None) -> PatchResult:
    """Patch one pair at one hook point (the notebook entry point).

    Example:
        >>> r = patch(h, clean_ids, corrupt_ids, hook="blocks.5.hook_resid_post",
        ...           positions=[-1])
        >>> r.effect[0]   # normalised effect; r.clean, r.corrupt, r.patched[0] in nats

    Args:
        handle: the model.
        clean_ids: token ids of the clean prompt ``[seq]``.
        corrupt_ids: token ids of the corrupt prompt ``[seq]`` (same length unless
            ``pos_map``).
        hook: hook-point name (:func:`valid_hooks`).
        positions: corrupt positions to patch (None: all; negative counts from the end).
        heads: query heads (``attn.hook_z`` only).
        backend: ``hf``, ``transformer_lens`` or ``nnsight``.
        pos_map: corrupt position -> clean position (-1: none), for prompts of unequal length.

    Returns:
        :class:`PatchResult` with one patched run.

    Raises:
        HookError: unknown hook or layer (lists valid ones).
        PatchingError: a point that is not patchable, bad positions or heads.
        ModelSpecError: query heads not a multiple of key/value heads.

    Every forward runs in eval mode (:func:`interp.hooks.guard.inference_guard`); the model
    gets its training flags and hooks back afterwards, whatever raises.
    """
    _parse(hook, handle.n_layers)
    n = len(_as_ids(corrupt_ids, "corrupt_ids"))
    pos = None if positions is None else tuple(int(p) % n for p in positions)
    with inference_guard(handle):
        p = Patcher(handle, clean_ids, corrupt_ids, pos_map=pos_map, backend=backend,
                    prefix_cache=False)
        return p.run([Patch(hook, pos, None if heads is None else tuple(heads))])


# ---------------------------------------------------------------------------------------------
# Sweeps of one pair (module step 4)
# ---------------------------------------------------------------------------------------------


def _spans(p: RenderedPrompt) -> dict[str, list[int]]:
    out = {lab: p.span_positions(lab) for lab in dict.fromkeys(p.labels)}
    out["verdict"] = [len(p) - 1]
    out["all"] = list(range(len(p)))
    return out


def _patchable(pt: Patcher, start: int) -> list[int]:
    """Corrupt positions from ``start`` that have a clean counterpart."""
    return [i for i in range(len(pt.corrupt_ids)) if pt.pos_map[i] >= 0 and i >= start]


def sweep_resid(pt: Patcher, corrupt: RenderedPrompt, *, layers: Sequence[int], hook: str,
                start: int, per_position: bool = True) -> tuple[list[dict], float]:
    """(layer, position) and (layer, span) activation patching at ``hook`` (a point name).

    Args:
        pt: the pair's patcher.
        corrupt: the corrupt prompt (its span labels name the span units).
        layers: layers to sweep.
        hook: ``hook_resid_pre`` or ``hook_resid_post``.
        start: first position that can differ (single positions before it are not swept).
        per_position: sweep single positions as well as spans.

    Returns:
        ``(rows, wall_s)``: table rows with ``layer``, ``unit`` (``position``/``span``),
        ``position``, ``rel_position`` (position - length), ``span``, ``token``, ``ld``,
        ``effect``; the patched forwards' wall time.
    """
    n = len(corrupt)
    toks = [pt.handle.tokenizer.decode([i]) for i in corrupt.input_ids]
    units: list[tuple[int, str, int, str]] = []
    patches: list[Patch] = []
    valid = _patchable(pt, start)
    for layer in layers:
        name = hook_name(layer, hook)
        if per_position:
            for i in valid:
                units.append((layer, "position", i, corrupt.labels[i]))
                patches.append(Patch(name, (i,)))
        for span, pos in _spans(corrupt).items():
            units.append((layer, "span", -1, span))
            patches.append(Patch(name, tuple(pos)))
    res = pt.run(patches)
    rows = [{"layer": u[0], "unit": u[1], "position": u[2],
             "rel_position": u[2] - n if u[2] >= 0 else 0, "span": u[3],
             "token": toks[u[2]] if u[2] >= 0 else "", "ld": float(ld), "effect": float(e)}
            for u, ld, e in zip(units, res.patched, res.effect)]
    return rows, res.wall_s


def sweep_heads(pt: Patcher, *, layers: Sequence[int], start: int) -> tuple[list[dict], float]:
    """(layer, head) patching of ``attn.hook_z`` at every mapped position from ``start``.

    Returns:
        ``(rows, wall_s)``: rows with ``layer``, ``head``, ``ld``, ``effect``.
    """
    pos = tuple(_patchable(pt, start))
    units = [(layer, h) for layer in layers for h in range(pt.handle.n_heads)]
    res = pt.run([Patch(hook_name(layer, "attn.hook_z"), pos, (h,)) for layer, h in units])
    rows = [{"layer": u[0], "head": u[1], "ld": float(ld), "effect": float(e)}
            for u, ld, e in zip(units, res.patched, res.effect)]
    return rows, res.wall_s


def sweep_task_layers(pt: Patcher, corrupt: RenderedPrompt, *, layers: Sequence[int],
                      hook: str, band: Sequence[int]) -> tuple[list[dict], float]:
    """Task-swap per layer: patch every context position of ``hook`` at one layer per run.

    Runs with eager attention on the ``hf`` backend (the attention weights are read).

    Returns:
        ``(rows, wall_s)``: rows with ``layer``, ``ld``, ``p_correct``, ``context_mass``
        (judge's last-token attention on the context, mean over heads and ``band`` layers) and
        their changes ``d_*`` against the unpatched judge (``layer = -1`` row = the judge
        itself), ``verdict_flip``.

    Raises:
        PatchingError: another backend than ``hf``.
    """
    if not isinstance(pt.be, HFBackend):
        raise PatchingError("task-swap sweeps run on the hf backend")
    span = corrupt.token_spans["context"]
    hooks = [hook_name(layer, hook) for layer in layers]
    pt.ensure_clean(hooks)
    sources = {h: pt.source(h) for h in hooks}
    rows_hooks: list[str | None] = [None, *hooks]
    n, bs = len(corrupt), max(1, pt.batch_size // 2)
    t0 = time.perf_counter()
    lds, mass = [], []
    for s in range(0, len(rows_hooks), bs):
        chunk = rows_hooks[s:s + bs]
        masks = {}
        for h in hooks:
            mk = torch.zeros((len(chunk), n), dtype=torch.bool)
            for j, rh in enumerate(chunk):
                if rh == h:
                    mk[j, span[0]:span[1]] = True
            masks[h] = mk.to(pt.handle.device)
        store: dict[int, Tensor] = {}
        with attn_implementation(pt.handle, "eager"), torch.no_grad():
            logits, _ = pt.be.forward(pt.corrupt_ids[None].expand(len(chunk), -1),
                                      masks=masks, sources=sources,
                                      extra_hooks=lambda: attention_mass(
                                          pt.handle.model, band, span, store))
        lds.append(logit_diff(logits, pt.verdict_ids).double().cpu())
        mass.append(torch.stack([store[layer] for layer in band]).mean(0).double())
    wall = time.perf_counter() - t0
    ld, cm = torch.cat(lds).numpy(), torch.cat(mass).numpy()
    pc = 1 / (1 + np.exp(-ld))
    rows = [{"layer": layer, "ld": float(ld[j]), "p_correct": float(pc[j]),
             "context_mass": float(cm[j]), "d_ld": float(ld[j] - ld[0]),
             "d_p_correct": float(pc[j] - pc[0]), "d_context_mass": float(cm[j] - cm[0]),
             "verdict_flip": bool((ld[j] > 0) != (ld[0] > 0))}
            for j, layer in enumerate([-1, *layers])]
    return rows, wall
