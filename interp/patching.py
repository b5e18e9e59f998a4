"""Activation patching and attribution patching between the judge and the generator.

Setting (paper section 3.2 and the design card): the same model judges (eval prompt, T_eval)
and generates (gen prompt, T_gen). We ask which internal states move the judge's verdict.

Metric. At the verdict position (the eval prompt's last position) the logit difference
``LD = logit("Correct") - logit("Incorrect")`` (first tokens of each word,
:func:`interp.prompts.verdict_token_ids`), in nats; ``p_correct = sigmoid(LD)``. The normalised
patch effect is ``(LD_patched - LD_corrupt) / (LD_clean - LD_corrupt)`` (Wang et al. 2022,
"Interpretability in the wild", section 3; Heimersheim & Nanda 2024, "How to use and interpret
activation patching"): 0 = no change, 1 = the patch restores the clean verdict.

Algorithm:

1. Pairs (:func:`candidate_swap_pair`, :func:`task_swap_pair`), built from a run's records:

   * ``candidate-swap``: the SAME eval prompt with a right candidate (clean: a gold answer) and a
     wrong one (corrupt: the model's own wrong answer, else a hard negative from the record,
     else ``own_trimmed``: the model's own wrong answer cut to its first k tokens, k within
     one of the gold's token count, decoded, and kept only when it is still not a gold
     answer; else answer rotation = a gold answer of another record of the same dataset, as
     the paper's section 3.3 fallback). Alignment rule: the candidate spans must have the SAME
     number of tokens at the SAME positions, and every token outside the candidate span must
     be identical; the builder searches corrupt candidates (in the order above) x gold
     aliases for the first combination that satisfies it. Pairs that do not are refused with
     the first differing position (:class:`PairError`). No padding is done, so a position
     means the same token slot in both runs.
   * ``task-swap``: clean = the generation prompt, corrupt = the eval prompt (the judge) with
     the record's own answer. The context token ids must be identical (checked, else refused
     with the first differing context offset); context position ``i`` of the eval prompt takes
     the generator's activation at context position ``i`` of the gen prompt. Because the
     generator emits no verdict, task-swap reports raw changes (patched - judge): logit
     difference, ``p_correct``, verdict flips and the judge's last-token attention mass on the
     context (mean over heads of the last ``min(8, n_layers)`` layers, the paper's band).

2. Caching: one clean forward stores the activations at the hook points a sweep needs;
   one corrupt forward gives ``LD_corrupt``.
3. Exact activation patching: each patched run replaces activations of the corrupt run by the
   clean ones at a hook point, on a mask of positions (``resid``: ``blocks.L.hook_resid_pre``
   or ``hook_resid_post`` over (layer, position) and over (layer, span)) or of
   (position, head) (``heads``: ``blocks.L.attn.hook_z``, the input of ``o_proj`` split into
   heads, so a head's contribution is replaced exactly). Many patched runs share a forward:
   the corrupt input is stacked along the batch dimension and each row gets its own mask.
   Positions before the first position where the two runs can differ hold identical
   activations in both, so patching them is the identity: their effect is exactly 0 and is
   not run; the shared prefix is computed once and its key/value cache reused by every row
   (``prefix_cache=True``), so a patched row costs only the suffix.
4. Attribution patching (Nanda 2023, "Attribution patching"; Syed et al. 2023, "Attribution
   patching outperforms automated circuit discovery"): one forward and ONE backward pass on
   the corrupt run give ``dLD/da`` at every hook point; the first-order estimate of patching
   ``a`` is ``(a_clean - a_corrupt) . dLD/da``, summed over ``d_model`` for (layer, position)
   at ``hook_resid_pre`` and over ``head_dim`` and the patched positions for (layer, head) at
   ``hook_z``. It is compared with exact patching on the same pairs (Pearson and Spearman).
5. Cost: wall time of the sweep divided by that of one clean forward pass of the full prompt.

Backends (same hook-point names, same masks): ``hf`` (PyTorch forward hooks on the Hugging
Face modules, default), ``transformer_lens`` (``TransformerBridge.run_with_hooks``) and
``nnsight`` (``trace`` with in-place interventions). The invariants (patch everything = clean,
patch nothing = corrupt, self-patch = no change, backends agree) are tested in
``tests/test_patching.py``.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
import typer

from interp.errors import PairError, PatchingError
from interp.models import ModelHandle
from interp.prompts import RenderedPrompt, get_template, render, verdict_token_ids
from interp.store import RunDir, config_from_table, read_json, write_json

STAGE = "patching"
SUMMARIES = {"patching/summary.json": "patching_summary.json"}
"""Run-dir tables that ``interp run`` copies next to the figures (source -> name)."""
PAIR_KINDS = ("candidate-swap", "task-swap")
SWEEP_KINDS = ("resid", "heads", "attribution")
BACKENDS = ("hf", "transformer_lens", "nnsight")
HOOK_POINTS = ("hook_resid_pre", "attn.hook_z", "hook_resid_post")
"""Patchable hook points per block, in execution order."""
_HOOK_RE = re.compile(r"^blocks\.(\d+)\.(hook_resid_pre|hook_resid_post|attn\.hook_z)$")


# ---------------------------------------------------------------------------------------------
# Hook points
# ---------------------------------------------------------------------------------------------


def valid_hooks(n_layers: int) -> list[str]:
    """All patchable hook-point names of a model with ``n_layers`` blocks."""
    return [f"blocks.{layer}.{p}" for layer in range(n_layers) for p in HOOK_POINTS]


def parse_hook(name: str, n_layers: int) -> tuple[int, str]:
    """Split a hook-point name into ``(layer, point)``.

    Args:
        name: e.g. ``"blocks.5.hook_resid_post"`` or ``"blocks.3.attn.hook_z"``.
        n_layers: number of blocks of the model.

    Raises:
        PatchingError: an unknown hook point or a layer out of range; the message lists the
            valid points and layers.
    """
    m = _HOOK_RE.match(name)
    if not m:
        raise PatchingError(f"unknown hook point {name!r}; valid: blocks.{{L}}.{{point}} with "
                            f"point in {list(HOOK_POINTS)} and L in 0..{n_layers - 1}, e.g. "
                            f"'blocks.0.hook_resid_pre'")
    layer = int(m.group(1))
    if not 0 <= layer < n_layers:
        raise PatchingError(f"layer {layer} of {name!r} is out of range; valid layers: "
                            f"0..{n_layers - 1}")
    return layer, m.group(2)


def _hook_order(name: str) -> tuple[int, int]:
    layer, point = parse_hook(name, 10**9)
    return layer, HOOK_POINTS.index(point)


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


# ---------------------------------------------------------------------------------------------
# Backends: run a batch of corrupt copies with per-row masks
# ---------------------------------------------------------------------------------------------


def _apply(act: torch.Tensor, mask: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``where(mask, src, act)``; act ``[B, S, d]`` or ``[B, S, H, dh]``; mask ``[B, S(, H)]``;
    src ``[S, d]`` or ``[S, H, dh]`` (broadcast over the batch)."""
    m = mask.unsqueeze(-1)
    return torch.where(m, src.unsqueeze(0).to(act.dtype), act)


class HFBackend:
    """Plain PyTorch forward hooks on a Hugging Face Llama-family model.

    ``hook_resid_pre`` is the input of ``model.layers[L]``, ``hook_resid_post`` its output and
    ``attn.hook_z`` the input of ``model.layers[L].self_attn.o_proj`` viewed as
    ``[batch, pos, n_heads, head_dim]``.
    """

    name = "hf"

    def __init__(self, handle: ModelHandle, *, attn: str | None = None):
        self.handle = handle
        self.model = handle.model
        self.n_heads = handle.n_heads
        self.attn = attn

    def _layer(self, layer: int) -> Any:
        return self.model.model.layers[layer]

    @contextlib.contextmanager
    def _hooks(self, masks: Mapping[str, torch.Tensor], sources: Mapping[str, torch.Tensor],
               cache: dict[str, torch.Tensor] | None, cache_hooks: Iterable[str],
               keep_graph: bool = False):
        handles = []
        want = set(cache_hooks)
        nh = self.n_heads

        def make(name: str, point: str) -> Callable:
            def edit(x: torch.Tensor) -> torch.Tensor:
                view = x.view(*x.shape[:-1], nh, -1) if point == "attn.hook_z" else x
                if name in masks:
                    view = _apply(view, masks[name], sources[name])
                if cache is not None and name in want:
                    cache[name] = view if keep_graph else view.detach().clone()
                return view.reshape(x.shape) if point == "attn.hook_z" else view

            if point == "hook_resid_post":
                def post(mod, args, out):
                    return (edit(out[0]), *out[1:]) if isinstance(out, tuple) else edit(out)
                return post

            def pre(mod, args, kwargs):
                if args:
                    return (edit(args[0]), *args[1:]), kwargs
                key = "hidden_states" if "hidden_states" in kwargs else next(iter(kwargs))
                return args, {**kwargs, key: edit(kwargs[key])}
            return pre

        try:
            for name in sorted(set(masks) | want, key=_hook_order):
                layer, point = parse_hook(name, self.handle.n_layers)
                blk = self._layer(layer)
                fn = make(name, point)
                if point == "hook_resid_post":
                    handles.append(blk.register_forward_hook(fn))
                elif point == "hook_resid_pre":
                    handles.append(blk.register_forward_pre_hook(fn, with_kwargs=True))
                else:
                    handles.append(blk.self_attn.o_proj.register_forward_pre_hook(
                        fn, with_kwargs=True))
            yield
        finally:
            for h in handles:
                h.remove()

    def forward(self, ids: torch.Tensor, *, masks: Mapping[str, torch.Tensor] | None = None,
                sources: Mapping[str, torch.Tensor] | None = None,
                cache_hooks: Iterable[str] = (), prefix: Any = None,
                inputs_embeds: torch.Tensor | None = None, keep_graph: bool = False,
                extra_hooks: Callable | None = None,
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Run ``ids`` ``[B, S]`` with patches; return last-position logits ``[B, vocab]`` and
        the cached activations (``[B, S, ...]``).

        ``prefix`` is a key/value cache of the positions before ``ids`` (batch 1; expanded).
        """
        cache: dict[str, torch.Tensor] = {}
        kwargs: dict[str, Any] = {"use_cache": prefix is not None, "logits_to_keep": 1}
        if prefix is not None:
            pk = copy.deepcopy(prefix)
            if ids.shape[0] > 1:
                pk.batch_repeat_interleave(ids.shape[0])
            kwargs["cache"] = pk
        ctx = _attn_ctx(self.handle, self.attn)
        with ctx, self._hooks(masks or {}, sources or {}, cache, cache_hooks, keep_graph), \
                (extra_hooks() if extra_hooks else contextlib.nullcontext()):
            if inputs_embeds is not None:
                out = self.model(inputs_embeds=inputs_embeds, **kwargs)
            else:
                out = self.model(input_ids=ids, **kwargs)
        return out.logits[:, -1, :], cache

    def prefix_cache(self, ids: torch.Tensor) -> Any:
        """Key/value cache of ``ids`` ``[1, P]`` (the shared unpatched prefix)."""
        with _attn_ctx(self.handle, self.attn), torch.no_grad():
            out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
        return out.cache if getattr(out, "cache", None) is not None else out.past_key_values


def _attn_ctx(handle: ModelHandle, attn: str | None):
    if not attn or handle.model.config._attn_implementation == attn:
        return contextlib.nullcontext()
    try:
        from interp.backends import attn_implementation
    except ImportError:  # pragma: no cover
        return contextlib.nullcontext()
    return attn_implementation(handle, attn)


class TLBackend:
    """TransformerLens ``TransformerBridge`` (``run_with_hooks`` on the same hook names)."""

    name = "transformer_lens"

    def __init__(self, handle: ModelHandle):
        from interp.backends import to_tlens

        self.handle = handle
        self.bridge = to_tlens(handle)

    def forward(self, ids, *, masks=None, sources=None, cache_hooks=(), prefix=None, **_):
        """As :meth:`HFBackend.forward` (no prefix cache)."""
        if prefix is not None:
            raise PatchingError("the transformer_lens backend runs full prompts (no prefix)")
        masks, sources, cache = masks or {}, sources or {}, {}

        def mk(name: str) -> Callable:
            def fn(x, hook):
                if name in masks:
                    x = _apply(x, masks[name], sources[name])
                if name in cache_hooks:
                    cache[name] = x.detach().clone()
                return x
            return fn

        hooks = [(n, mk(n)) for n in sorted(set(masks) | set(cache_hooks), key=_hook_order)]
        from interp.backends import attn_implementation

        with attn_implementation(self.handle, "eager"), torch.no_grad():
            logits = self.bridge.run_with_hooks(ids, fwd_hooks=hooks, return_type="logits")
        return logits[:, -1, :], cache


class NNsightBackend:
    """nnsight tracing: interventions assigned to module inputs/outputs in execution order."""

    name = "nnsight"

    def __init__(self, handle: ModelHandle):
        from interp.backends import to_nnsight

        self.handle = handle
        self.lm = to_nnsight(handle)
        self.n_heads = handle.n_heads

    def forward(self, ids, *, masks=None, sources=None, cache_hooks=(), prefix=None, **_):
        """As :meth:`HFBackend.forward` (no prefix cache)."""
        if prefix is not None:
            raise PatchingError("the nnsight backend runs full prompts (no prefix)")
        masks, sources = masks or {}, sources or {}
        saved: dict[str, Any] = {}
        names = sorted(set(masks) | set(cache_hooks), key=_hook_order)
        lm, nh = self.lm, self.n_heads
        with torch.no_grad(), lm.trace(ids):
            for name in names:
                layer, point = parse_hook(name, self.handle.n_layers)
                blk = lm.model.layers[layer]
                if point == "hook_resid_post":
                    x = blk.output
                    if name in masks:
                        x = _apply(x, masks[name], sources[name])
                        blk.output = x
                elif point == "hook_resid_pre":
                    x = blk.input
                    if name in masks:
                        x = _apply(x, masks[name], sources[name])
                        blk.input = x
                else:
                    raw = blk.self_attn.o_proj.input
                    x = raw.view(*raw.shape[:-1], nh, -1)
                    if name in masks:
                        x = _apply(x, masks[name], sources[name])
                        blk.self_attn.o_proj.input = x.reshape(raw.shape)
                if name in cache_hooks:
                    saved[name] = x.save()
            logits = lm.lm_head.output[:, -1, :].save()
        return logits.detach().clone(), {k: v.detach().clone() for k, v in saved.items()}


_BACKEND_CACHE: dict[tuple[int, str], Any] = {}


def get_backend(handle: ModelHandle, backend: str = "hf") -> Any:
    """The backend object for a handle (cached per model).

    Raises:
        PatchingError: an unknown backend name (lists the valid ones).
    """
    if backend not in BACKENDS:
        raise PatchingError(f"unknown backend {backend!r}; valid: {list(BACKENDS)}")
    key = (id(handle.model), backend)
    if key not in _BACKEND_CACHE or _BACKEND_CACHE[key].handle.model is not handle.model:
        cls = {"hf": HFBackend, "transformer_lens": TLBackend, "nnsight": NNsightBackend}[backend]
        _BACKEND_CACHE[key] = cls(handle)
    return _BACKEND_CACHE[key]


# ---------------------------------------------------------------------------------------------
# The patching engine
# ---------------------------------------------------------------------------------------------


def _as_ids(ids: Any, name: str) -> torch.Tensor:
    t = torch.as_tensor(ids, dtype=torch.long)
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1 or t.numel() == 0:
        raise PatchingError(f"{name} must be one prompt's token ids [seq] or [1, seq], got shape "
                            f"{tuple(t.shape)}")
    return t


def logit_diff(logits: torch.Tensor, ids: tuple[int, int]) -> torch.Tensor:
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
    patched: np.ndarray
    patches: list[Any] = field(default_factory=list)
    wall_s: float = 0.0
    clean_forward_s: float = float("nan")
    n_runs: int = 0

    @property
    def effect(self) -> np.ndarray:
        """Normalised effects ``(patched - corrupt) / (clean - corrupt)`` (NaN when the
        denominator is below 1e-6 nats)."""
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
        handle: the model.
        clean_ids, corrupt_ids: token ids ``[seq]`` of the clean and corrupt prompts.
        pos_map: for each corrupt position the clean position whose activation it takes, or
            -1 where nothing corresponds (default: identity, equal lengths required).
        start: first corrupt position whose activations can differ from the clean run or be
            patched; positions before it are run once as a shared prefix (``hf`` only).
        backend: ``hf``, ``transformer_lens`` or ``nnsight``.
        batch_size: patched rows per forward.
        prefix_cache: reuse the key/value cache of ``corrupt_ids[:start]`` (``hf`` only).

    Raises:
        PatchingError: ids of the wrong shape, unequal lengths without ``pos_map``.
    """

    def __init__(self, handle: ModelHandle, clean_ids: Any, corrupt_ids: Any, *,
                 pos_map: Sequence[int] | None = None, start: int = 0, backend: str = "hf",
                 batch_size: int = 16, prefix_cache: bool = True):
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
        self.batch_size = batch_size
        self.start = int(start) if (prefix_cache and backend == "hf") else 0
        self.start = min(self.start, n - 1)
        self.verdict_ids = verdict_token_ids(handle.tokenizer)
        self._clean_cache: dict[str, torch.Tensor] = {}
        self._prefix = None
        self.clean_ld, self.corrupt_ld = float("nan"), float("nan")
        self.clean_forward_s = float("nan")
        self._clean_logits = None

    # -- baselines ------------------------------------------------------------------------
    def ensure_clean(self, hooks: Iterable[str]) -> None:
        """Run the clean prompt once (more when new hook points are asked) and cache them."""
        need = [h for h in hooks if h not in self._clean_cache]
        for h in need:
            parse_hook(h, self.handle.n_layers)
        if need or self._clean_logits is None:
            t0 = time.perf_counter()
            with torch.no_grad():
                logits, cache = self.be.forward(self.clean_ids[None], cache_hooks=need)
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

    def source(self, hook: str) -> torch.Tensor:
        """Clean activation mapped onto corrupt positions ``[S_corrupt, ...]``."""
        act = self._clean_cache[hook]
        return act[self.pos_map.clamp(min=0).to(act.device)]

    # -- masks ----------------------------------------------------------------------------
    def _row_mask(self, p: Patch) -> torch.Tensor:
        _, point = parse_hook(p.hook, self.handle.n_layers)
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
        pos[: self.start] = False  # identical in both runs (module docstring, step 3)
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
                raise PatchingError(f"heads {bad} out of range; valid: 0..{self.handle.n_heads - 1}")
            h[list(p.heads)] = True
        return pos[:, None] & h[None, :]

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
        masks_all = []
        for r in rows:
            m: dict[str, torch.Tensor] = {}
            for p in r:
                mk = self._row_mask(p)
                m[p.hook] = m[p.hook] | mk if p.hook in m else mk
            masks_all.append({k: v[self.start:] for k, v in m.items() if v.any()})
        todo = [i for i, m in enumerate(masks_all) if m]
        suffix = self.corrupt_ids[self.start:]
        t0 = time.perf_counter()
        for s in range(0, len(todo), self.batch_size):
            chunk = todo[s:s + self.batch_size]
            b = len(chunk)
            masks: dict[str, torch.Tensor] = {}
            for h in hooks:
                shape = (b, len(suffix)) + ((self.handle.n_heads,) if "hook_z" in h else ())
                mk = torch.zeros(shape, dtype=torch.bool)
                for j, i in enumerate(chunk):
                    if h in masks_all[i]:
                        mk[j] = masks_all[i][h]
                if mk.any():
                    masks[h] = mk.to(self.handle.device)
            with torch.no_grad():
                logits, _ = self.be.forward(suffix[None].expand(b, -1), masks=masks,
                                            sources=sources, prefix=self._prefix)
            out[chunk] = logit_diff(logits, self.verdict_ids).double().cpu().numpy()
        wall = time.perf_counter() - t0
        return PatchResult(clean=self.clean_ld, corrupt=self.corrupt_ld, patched=out,
                           patches=rows, wall_s=wall, clean_forward_s=self.clean_forward_s,
                           n_runs=len(todo))

    def attribution(self, layers: Sequence[int] | None = None,
                    positions: Sequence[int] | None = None) -> dict[str, np.ndarray]:
        """Attribution patching (module step 4) on the ``hf`` backend, one backward pass.

        Args:
            layers: layers to score (default all).
            positions: corrupt positions whose differences count for the head scores (default:
                every mapped position from ``start``).

        Returns:
            ``resid`` ``[n_layers, S]``: ``sum_d (clean - corrupt) * dLD/da`` at
            ``hook_resid_pre`` per (layer, position); ``heads`` ``[n_layers, n_heads]``: the same
            at ``attn.hook_z`` summed over head_dim and ``positions``; both in nats (divide by
            ``clean - corrupt`` for normalised effects).
        """
        if not isinstance(self.be, HFBackend):
            raise PatchingError("attribution patching runs on the hf backend")
        nl = self.handle.n_layers
        layers = list(range(nl)) if layers is None else list(layers)
        hooks = [f"blocks.{layer}.{p}" for layer in layers
                 for p in ("hook_resid_pre", "attn.hook_z")]
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
            grads = torch.autograd.grad(ld, [cache[h] for h in hooks])
        g = dict(zip(hooks, grads))
        resid = np.zeros((nl, n))
        heads = np.zeros((nl, self.handle.n_heads))
        vm = valid.to(self.handle.device)
        sm = sel.to(self.handle.device)
        for layer in layers:
            h = f"blocks.{layer}.hook_resid_pre"
            diff = (self.source(h) - cache[h][0].detach()) * vm[:, None]
            resid[layer] = (diff * g[h][0]).sum(-1).cpu().numpy()
            h = f"blocks.{layer}.attn.hook_z"
            diff = (self.source(h) - cache[h][0].detach()) * sm[:, None, None]
            heads[layer] = (diff * g[h][0]).sum((0, 2)).cpu().numpy()
        return {"resid": resid, "heads": heads}


def patch(handle: ModelHandle, clean_ids: Any, corrupt_ids: Any, *, hook: str,
          positions: Sequence[int] | None = None, heads: Sequence[int] | None = None,
          backend: str = "hf", pos_map: Sequence[int] | None = None) -> PatchResult:
    """Patch one pair at one hook point (the notebook entry point).

    Example:
        >>> r = patch(h, clean_ids, corrupt_ids, hook="blocks.5.hook_resid_post",
        ...           positions=[-1])
        >>> r.effect[0]   # normalised effect; r.clean, r.corrupt, r.patched[0] in nats

    Args:
        handle: the model.
        clean_ids, corrupt_ids: token ids ``[seq]`` (same length unless ``pos_map``).
        hook: hook-point name (:func:`valid_hooks`).
        positions: corrupt positions to patch (None: all; negative counts from the end).
        heads: query heads (``attn.hook_z`` only).
        backend: ``hf``, ``transformer_lens`` or ``nnsight``.
        pos_map: corrupt position -> clean position (-1: none), for prompts of unequal length.

    Returns:
        :class:`PatchResult` with one patched run.

    Raises:
        PatchingError: unknown hook or layer (lists valid ones), bad positions or heads.
    """
    parse_hook(hook, handle.n_layers)
    n = len(_as_ids(corrupt_ids, "corrupt_ids"))
    pos = None if positions is None else tuple(int(p) % n for p in positions)
    p = Patcher(handle, clean_ids, corrupt_ids, pos_map=pos_map, backend=backend,
                prefix_cache=False)
    return p.run([Patch(hook, pos, None if heads is None else tuple(heads))])


# ---------------------------------------------------------------------------------------------
# Pairs from a run directory
# ---------------------------------------------------------------------------------------------


@dataclass
class PatchPair:
    """A clean/corrupt pair built from one record.

    Attributes:
        kind: ``candidate-swap`` or ``task-swap``.
        record_id, dataset: the record.
        clean, corrupt: rendered prompts (task-swap: clean = gen prompt, corrupt = eval prompt).
        pos_map: corrupt position -> clean position (-1 where nothing corresponds).
        start: first corrupt position that can differ or be patched.
        clean_answer, corrupt_answer, corrupt_source: the candidates (candidate-swap) and where
            the wrong one came from (``own``, ``hard_negative``, ``own_trimmed``, ``rotation``).
    """

    kind: str
    record_id: str
    dataset: str
    clean: RenderedPrompt
    corrupt: RenderedPrompt
    pos_map: list[int]
    start: int
    clean_answer: str = ""
    corrupt_answer: str = ""
    corrupt_source: str = ""

    @property
    def key(self) -> str:
        """File-safe identity ``dataset__id``."""
        return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self.dataset}__{self.record_id}")


def _norm(s: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", s.lower()).split())


def check_candidate_alignment(clean: RenderedPrompt, corrupt: RenderedPrompt,
                              record_id: str = "?") -> int:
    """Check the candidate-swap alignment rule; return the first differing position.

    Raises:
        PairError: lengths or candidate spans differ, or a token outside the candidate span
            differs (the message shows that position and both tokens).
    """
    cs, xs = clean.token_spans.get("candidate"), corrupt.token_spans.get("candidate")
    if len(clean) != len(corrupt) or cs != xs:
        raise PairError(f"record {record_id}: candidate spans {cs} (clean) and {xs} (corrupt), "
                        f"prompt lengths {len(clean)} and {len(corrupt)}: the candidates must "
                        f"have equal token length at the same positions")
    first = None
    for i, (a, b) in enumerate(zip(clean.input_ids, corrupt.input_ids)):
        if a != b:
            if not cs[0] <= i < cs[1]:
                raise PairError(f"record {record_id}: tokens differ outside the candidate span "
                                f"{cs} at position {i} ({a} vs {b}, labels "
                                f"{clean.labels[i]!r}/{corrupt.labels[i]!r})")
            first = i if first is None else first
    if first is None:
        raise PairError(f"record {record_id}: clean and corrupt prompts are identical")
    return first


def _template_for(run: RunDir) -> Any:
    cfg = run.manifest().get("config", {})
    return get_template(cfg.get("template", "default"), cfg.get("templates_path"))


def candidate_swap_pair(tokenizer: Any, template: Any, rec: Mapping[str, Any],
                        pool: Sequence[Mapping[str, Any]] = ()) -> PatchPair:
    """Build the candidate-swap pair of a record (module docstring, step 1).

    Args:
        tokenizer, template: as the run used them.
        rec: an ``ok`` record (needs ``answers``; ``answer`` and ``oracle_label`` for ``own``;
            optional ``hard_negative`` / ``hard_negatives``).
        pool: records of the same dataset whose gold answers serve for answer rotation.

    Raises:
        PairError: no gold answer, or no (gold, wrong) combination satisfies the alignment
            rule (the message shows the first differing position of the first combination).
    """
    golds = [a for a in rec.get("answers", []) if a.strip()]
    rid = str(rec.get("id"))
    if not golds:
        raise PairError(f"record {rid}: no gold answer (unanswerable?)")
    gold_norm = {_norm(g) for g in golds}
    wrongs: list[tuple[str, str]] = []
    if rec.get("oracle_label") is False and rec.get("answer"):
        wrongs.append((rec["answer"], "own"))
    for hn in ([rec["hard_negative"]] if rec.get("hard_negative") else []) + list(
            rec.get("hard_negatives") or []):
        wrongs.append((hn, "hard_negative"))
    if rec.get("oracle_label") is False and rec.get("answer"):
        # own answer cut to about the gold's token length (its first k tokens, decoded)
        own = tokenizer(rec["answer"], add_special_tokens=False)["input_ids"]
        for g in golds:
            k = len(tokenizer(" " + g, add_special_tokens=False)["input_ids"])
            for kk in (k, k - 1, k + 1):
                if 0 < kk < len(own):
                    wrongs.append((tokenizer.decode(own[:kk]).strip(), "own_trimmed"))
    ids = [str(r.get("id")) for r in pool]
    k = ids.index(rid) if rid in ids else -1
    for r in list(pool[k + 1:]) + list(pool[: max(k, 0)]):
        for a in r.get("answers", []):
            wrongs.append((a, "rotation"))
    wrongs = list(dict.fromkeys(wrongs))
    wrongs = [(w, s) for w, s in wrongs if w.strip() and _norm(w) not in gold_norm]
    if not wrongs:
        raise PairError(f"record {rid}: no wrong candidate (own answer correct, no hard "
                        f"negative, no other record to rotate from)")
    kw = {"context": rec["context"], "question": rec["question"], "reference": golds[0]}
    cache: dict[str, RenderedPrompt] = {}

    def rend(a: str) -> RenderedPrompt:
        if a not in cache:
            cache[a] = render(tokenizer, template, "eval", answer=a, **kw)
        return cache[a]

    first_err = None
    for w, src in wrongs:
        for g in golds:
            clean, corrupt = rend(g), rend(w)
            try:
                start = check_candidate_alignment(clean, corrupt, rid)
            except PairError as err:
                first_err = first_err or err
                continue
            return PatchPair("candidate-swap", rid, rec.get("dataset", ""), clean, corrupt,
                             list(range(len(corrupt))), start, g, w, src)
    raise PairError(f"no aligned candidate pair ({len(wrongs)} wrong x {len(golds)} gold "
                    f"candidates tried); first refusal: {first_err}")


def task_swap_pair(tokenizer: Any, template: Any, rec: Mapping[str, Any]) -> PatchPair:
    """Build the task-swap pair of a record: generator (clean) -> judge (corrupt).

    Raises:
        PairError: a prompt lacks a context span, the context spans differ in length, or a
            context token differs (the message shows the first differing context offset).
    """
    rid = str(rec.get("id"))
    ref = (rec.get("answers") or [""])[0]
    gen = render(tokenizer, template, "gen", context=rec["context"], question=rec["question"],
                 reference=ref)
    ev = render(tokenizer, template, "eval", context=rec["context"], question=rec["question"],
                answer=rec.get("answer", ""), reference=ref)
    if "context" not in gen.token_spans or "context" not in ev.token_spans:
        raise PairError(f"record {rid}: a prompt has no context span")
    (a, b), (c, d) = gen.token_spans["context"], ev.token_spans["context"]
    g_ids, e_ids = gen.input_ids[a:b], ev.input_ids[c:d]
    for i, (x, y) in enumerate(zip(g_ids, e_ids)):
        if x != y:
            raise PairError(f"record {rid}: context tokens differ at context offset {i} (gen "
                            f"position {a + i}: {x}, eval position {c + i}: {y})")
    if len(g_ids) != len(e_ids):
        raise PairError(f"record {rid}: context spans have {len(g_ids)} (gen) and {len(e_ids)} "
                        f"(eval) tokens; first differing context offset {min(len(g_ids), len(e_ids))}")
    pos_map = [-1] * len(ev)
    for i in range(d - c):
        pos_map[c + i] = a + i
    return PatchPair("task-swap", rid, rec.get("dataset", ""), gen, ev, pos_map, c,
                     corrupt_answer=rec.get("answer", ""), corrupt_source="own")


def build_pairs(run: RunDir, kind: str, tokenizer: Any, *, limit: int | None = None,
                max_tokens: int | None = None,
                log: Callable[[str], None] = print) -> tuple[list[PatchPair], list[dict]]:
    """Pairs of ``kind`` from a run's ``ok`` records, ``limit`` per dataset.

    Returns:
        ``(pairs, refused)`` where ``refused`` lists ``{"id", "dataset", "reason"}``.

    Raises:
        PatchingError: an unknown pair kind (lists the valid ones).
    """
    if kind not in PAIR_KINDS:
        raise PatchingError(f"unknown pair kind {kind!r}; valid: {list(PAIR_KINDS)}")
    template = _template_for(run)
    recs = run.read_records()
    by_ds: dict[str, list] = {}
    for r in recs:
        by_ds.setdefault(r["dataset"], []).append(r)
    pairs, refused = [], []
    for ds, rs in by_ds.items():
        n_ok = 0
        for r in rs:
            if limit is not None and n_ok >= limit:
                break
            try:
                p = (candidate_swap_pair(tokenizer, template, r, rs) if kind == "candidate-swap"
                     else task_swap_pair(tokenizer, template, r))
                if max_tokens and max(len(p.clean), len(p.corrupt)) > max_tokens:
                    raise PairError(f"record {r['id']}: {len(p.corrupt)} tokens > max_tokens "
                                    f"{max_tokens}")
            except PairError as err:
                refused.append({"id": r["id"], "dataset": ds, "reason": str(err)})
                log(f"[{ds}] refused {r['id']}: {err}")
                continue
            pairs.append(p)
            n_ok += 1
    return pairs, refused


# ---------------------------------------------------------------------------------------------
# Sweeps of one pair
# ---------------------------------------------------------------------------------------------


def _spans(p: RenderedPrompt) -> dict[str, list[int]]:
    out = {lab: p.span_positions(lab) for lab in dict.fromkeys(p.labels)}
    out["verdict"] = [len(p) - 1]
    out["all"] = list(range(len(p)))
    return out


def _tokens(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    return [tokenizer.decode([i]) for i in ids]


def sweep_resid(pt: Patcher, pair: PatchPair, *, layers: Sequence[int], hook: str,
                per_position: bool = True) -> tuple[list[dict], float]:
    """(layer, position) and (layer, span) activation patching at ``hook`` (a point name).

    Returns:
        ``(rows, wall_s)``: table rows with ``layer``, ``unit`` (``position``/``span``),
        ``position``, ``rel_position`` (position - length), ``span``, ``token``, ``ld``,
        ``effect``; the patched forwards' wall time.
    """
    n = len(pair.corrupt)
    toks = _tokens(pt.handle.tokenizer, pair.corrupt.input_ids)
    units: list[tuple[int, str, int, str]] = []
    patches: list[Patch] = []
    valid = [i for i in range(n) if pair.pos_map[i] >= 0 and i >= pair.start]
    for layer in layers:
        name = f"blocks.{layer}.{hook}"
        if per_position:
            for i in valid:
                units.append((layer, "position", i, pair.corrupt.labels[i]))
                patches.append(Patch(name, (i,)))
        for span, pos in _spans(pair.corrupt).items():
            units.append((layer, "span", -1, span))
            patches.append(Patch(name, tuple(pos)))
    res = pt.run(patches)
    eff = res.effect
    rows = [{"layer": u[0], "unit": u[1], "position": u[2],
             "rel_position": u[2] - n if u[2] >= 0 else 0, "span": u[3],
             "token": toks[u[2]] if u[2] >= 0 else "", "ld": float(ld), "effect": float(e)}
            for u, ld, e in zip(units, res.patched, eff)]
    return rows, res.wall_s


def sweep_heads(pt: Patcher, pair: PatchPair, *, layers: Sequence[int]) -> tuple[list[dict], float]:
    """(layer, head) patching of ``attn.hook_z`` at every mapped position from ``start``."""
    pos = tuple(i for i in range(len(pair.corrupt)) if pair.pos_map[i] >= 0 and i >= pair.start)
    units, patches = [], []
    for layer in layers:
        for h in range(pt.handle.n_heads):
            units.append((layer, h))
            patches.append(Patch(f"blocks.{layer}.attn.hook_z", pos, (h,)))
    res = pt.run(patches)
    rows = [{"layer": u[0], "head": u[1], "ld": float(ld), "effect": float(e)}
            for u, ld, e in zip(units, res.patched, res.effect)]
    return rows, res.wall_s


@contextlib.contextmanager
def _context_mass_recorder(handle: ModelHandle, span: tuple[int, int], layers: Sequence[int],
                           store: dict[int, torch.Tensor]):
    """Hooks ``self_attn`` (eager) and stores the last-token attention mass on ``span`` per
    layer, mean over heads: ``store[layer]`` ``[batch]``."""
    hs = []

    def mk(layer):
        def fn(mod, args, out):
            w = out[1]
            if w is not None:
                store[layer] = w[:, :, -1, span[0]:span[1]].sum(-1).mean(1).detach().cpu()
        return fn

    for layer in layers:
        hs.append(handle.model.model.layers[layer].self_attn.register_forward_hook(mk(layer)))
    try:
        yield
    finally:
        for h in hs:
            h.remove()


def sweep_task_layers(pt: Patcher, pair: PatchPair, *, layers: Sequence[int], hook: str,
                      band: Sequence[int]) -> tuple[list[dict], float]:
    """Task-swap per layer: patch every context position of ``hook`` at one layer per run.

    Returns rows with ``layer``, ``ld``, ``p_correct``, ``context_mass`` (judge's last-token
    attention on the context, mean over heads and ``band`` layers, with eager attention) and
    their changes ``d_*`` against the unpatched judge (``layer = -1`` row = the judge itself).
    """
    span = pair.corrupt.token_spans["context"]
    pos = tuple(range(*span))
    patches = [[]] + [[Patch(f"blocks.{layer}.{hook}", pos)] for layer in layers]
    pt.ensure_clean([f"blocks.{layer}.{hook}" for layer in layers])
    be = pt.be
    if not isinstance(be, HFBackend):
        raise PatchingError("task-swap sweeps run on the hf backend")
    hooks = sorted({p.hook for r in patches for p in r}, key=_hook_order)
    n = len(pair.corrupt)
    sources = {h: pt.source(h) for h in hooks}
    t0 = time.perf_counter()
    lds, mass = [], []
    bs = max(1, pt.batch_size // 2)
    from interp.backends import attn_implementation

    for s in range(0, len(patches), bs):
        chunk = patches[s:s + bs]
        masks = {}
        for h in hooks:
            mk = torch.zeros((len(chunk), n), dtype=torch.bool)
            for j, r in enumerate(chunk):
                for p in r:
                    if p.hook == h:
                        mk[j, list(p.positions)] = True
            masks[h] = mk.to(pt.handle.device)
        store: dict[int, torch.Tensor] = {}
        with attn_implementation(pt.handle, "eager"), torch.no_grad():
            logits, _ = be.forward(pt.corrupt_ids[None].expand(len(chunk), -1),
                                   masks=masks, sources=sources,
                                   extra_hooks=lambda: _context_mass_recorder(
                                       pt.handle, span, band, store))
        lds.append(logit_diff(logits, pt.verdict_ids).double().cpu())
        mass.append(torch.stack([store[layer] for layer in band]).mean(0).double())
    wall = time.perf_counter() - t0
    ld = torch.cat(lds).numpy()
    cm = torch.cat(mass).numpy()
    pc = 1 / (1 + np.exp(-ld))
    rows = []
    for j, layer in enumerate([-1, *layers]):
        rows.append({"layer": layer, "ld": float(ld[j]), "p_correct": float(pc[j]),
                     "context_mass": float(cm[j]), "d_ld": float(ld[j] - ld[0]),
                     "d_p_correct": float(pc[j] - pc[0]),
                     "d_context_mass": float(cm[j] - cm[0]),
                     "verdict_flip": bool((ld[j] > 0) != (ld[0] > 0))})
    return rows, wall


def _corr(a: np.ndarray, b: np.ndarray) -> dict[str, float | None]:
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return {"pearson": None, "spearman": None, "n": int(len(a))}
    from scipy.stats import pearsonr, spearmanr

    return {"pearson": float(pearsonr(a, b)[0]), "spearman": float(spearmanr(a, b)[0]),
            "n": int(len(a))}


# ---------------------------------------------------------------------------------------------
# The stage: pairs x kind over a run directory
# ---------------------------------------------------------------------------------------------


@dataclass
class PatchingConfig:
    """Settings of ``interp patch`` / the ``[patching]`` config table.

    Attributes:
        pairs: pair kinds to run (``candidate-swap``, ``task-swap``).
        kinds: sweeps (``resid``, ``heads``, ``attribution``).
        limit: pairs per dataset (None: all).
        layers: layers to sweep (None: all).
        layer_stride: sweep every k-th layer (after ``layers``).
        hook: residual hook point for ``resid`` and task-swap (``hook_resid_pre`` or
            ``hook_resid_post``).
        per_position: also sweep single positions (not only spans) in ``resid``.
        max_tokens: refuse pairs longer than this (CPU time).
        batch_size: patched rows per forward.
        backend: ``hf`` (the sweeps need it; the API accepts all three).
        prefix_cache: reuse the shared prefix's key/value cache.
        figures: draw the figures after the tables.
    """

    pairs: list[str] = field(default_factory=lambda: ["candidate-swap"])
    kinds: list[str] = field(default_factory=lambda: ["resid"])
    limit: int | None = 5
    layers: list[int] | None = None
    layer_stride: int = 1
    hook: str = "hook_resid_pre"
    per_position: bool = True
    max_tokens: int | None = 1024
    batch_size: int = 16
    backend: str = "hf"
    prefix_cache: bool = True
    figures: bool = True

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> PatchingConfig:
        """Build from a mapping, refusing unknown keys and values (lists the known ones)."""
        d = dict(d)
        for k in ("pairs", "kinds"):
            if isinstance(d.get(k), str):
                d[k] = [d[k]]
        cfg = config_from_table(cls, d, "patching")
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raises PatchingError on unknown pair kinds, sweep kinds, hooks or backends."""
        for p in self.pairs:
            if p not in PAIR_KINDS:
                raise PatchingError(f"unknown pair kind {p!r}; valid: {list(PAIR_KINDS)}")
        for k in self.kinds:
            if k not in SWEEP_KINDS:
                raise PatchingError(f"unknown kind {k!r}; valid: {list(SWEEP_KINDS)}")
        if self.hook not in ("hook_resid_pre", "hook_resid_post"):
            raise PatchingError(f"hook must be hook_resid_pre or hook_resid_post, not "
                                f"{self.hook!r}")
        if self.backend != "hf":
            raise PatchingError("sweeps run on the hf backend (use patch() for the others)")

    def layer_list(self, n_layers: int) -> list[int]:
        """The swept layers; raises PatchingError for layers out of range."""
        layers = list(range(n_layers)) if self.layers is None else list(self.layers)
        bad = [x for x in layers if not 0 <= x < n_layers]
        if bad:
            raise PatchingError(f"layers {bad} out of range; valid: 0..{n_layers - 1}")
        return layers[:: max(1, self.layer_stride)]


def _pair_meta(pair: PatchPair, pt: Patcher) -> dict[str, Any]:
    return {"id": pair.record_id, "dataset": pair.dataset, "pair": pair.kind,
            "n_tokens": len(pair.corrupt), "start": pair.start,
            "clean_answer": pair.clean_answer, "corrupt_answer": pair.corrupt_answer,
            "corrupt_source": pair.corrupt_source, "clean_ld": pt.clean_ld,
            "corrupt_ld": pt.corrupt_ld, "clean_forward_s": pt.clean_forward_s}


def run_pair(handle: ModelHandle, pair: PatchPair, kind: str, cfg: PatchingConfig,
             layers: Sequence[int], prior: Mapping[str, Mapping[str, Any]] | None = None
             ) -> dict[str, Any]:
    """All tables of one pair for one sweep kind (see :func:`run_patching`).

    ``prior`` maps a kind (``heads``, ``resid``) to this pair's finished sweep of that kind
    with the same layers; ``attribution`` then takes its exact-patching comparison from them
    instead of running the same sweeps again (``resid`` only when it used ``hook_resid_pre``
    per position, the units attribution scores).
    """
    prior = prior or {}
    pt = Patcher(handle, pair.clean.input_ids, pair.corrupt.input_ids, pos_map=pair.pos_map,
                 start=pair.start, batch_size=cfg.batch_size, prefix_cache=cfg.prefix_cache)
    pt.ensure_clean([])
    meta = _pair_meta(pair, pt)
    out: dict[str, Any] = {"meta": meta}
    band = list(range(max(0, handle.n_layers - 8), handle.n_layers))
    if pair.kind == "task-swap" and kind == "resid":
        rows, wall = sweep_task_layers(pt, pair, layers=layers, hook=cfg.hook, band=band)
        out["task_layers"] = rows
    elif kind == "resid":
        rows, wall = sweep_resid(pt, pair, layers=layers, hook=cfg.hook,
                                 per_position=cfg.per_position)
        out["resid"] = rows
    elif kind == "heads":
        rows, wall = sweep_heads(pt, pair, layers=layers)
        out["heads"] = rows
    else:  # attribution, with exact patching on the same pair for the comparison
        t0 = time.perf_counter()
        att = pt.attribution(layers)
        att_wall = time.perf_counter() - t0
        den = pt.clean_ld - pt.corrupt_ld
        reused = []
        if "heads" in prior:
            exact_h, w1 = prior["heads"]["heads"], prior["heads"]["meta"]["wall_s"]
            reused.append("heads")
        else:
            exact_h, w1 = sweep_heads(pt, pair, layers=layers)
        if pair.kind == "candidate-swap" and "resid" in prior and cfg.per_position \
                and cfg.hook == "hook_resid_pre":
            exact_r, w2 = prior["resid"]["resid"], prior["resid"]["meta"]["wall_s"]
            reused.append("resid")
        elif pair.kind == "task-swap":
            pos = list(range(*pair.corrupt.token_spans["context"]))
            exact_r, w2 = [], 0.0
            res = pt.run([Patch(f"blocks.{layer}.hook_resid_pre", tuple(pos)) for layer in layers])
            w2 = res.wall_s
            for layer, ld in zip(layers, res.patched):
                exact_r.append({"layer": layer, "unit": "span", "position": -1, "span": "context",
                                "ld": float(ld)})
        else:
            exact_r, w2 = sweep_resid(pt, pair, layers=layers, hook="hook_resid_pre",
                                      per_position=True)
        rows_h = []
        for r in exact_h:
            a = att["heads"][r["layer"], r["head"]]
            rows_h.append({**r, "unit": "head", "attr_ld": float(a),
                           "exact_d_ld": r["ld"] - pt.corrupt_ld,
                           "attr_effect": float(a / den) if abs(den) > 1e-6 else float("nan")})
        rows_r = []
        for r in exact_r:
            if r["unit"] == "position":
                a = att["resid"][r["layer"], r["position"]]
            elif r["span"] == "context" and pair.kind == "task-swap":
                a = att["resid"][r["layer"], list(range(*pair.corrupt.token_spans["context"]))
                                 ].sum()
            else:
                continue
            rows_r.append({"layer": r["layer"], "head": -1, "unit": r["unit"],
                           "position": r["position"], "ld": r["ld"], "attr_ld": float(a),
                           "exact_d_ld": r["ld"] - pt.corrupt_ld,
                           "attr_effect": float(a / den) if abs(den) > 1e-6 else float("nan"),
                           "effect": r.get("effect", float("nan"))})
        out["attribution"] = rows_h + rows_r
        wall = att_wall
        meta["exact_wall_s"] = w1 + w2
        meta["exact_reused_from"] = reused
    meta["wall_s"] = wall
    meta["cost_ratio"] = wall / pt.clean_forward_s
    return out


def _frame(rows: list[dict]) -> Any:
    import pandas as pd

    return pd.DataFrame(rows)


def _write_table(df: Any, path: Path) -> Path:
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)
    df.to_csv(path.with_suffix(".csv"), index=False)
    return path


def part_signature(cfg: PatchingConfig, kind: str, layers: Sequence[int],
                   handle: ModelHandle) -> str:
    """A short digest of everything that shapes one pair's sweep (model, kind, layers, hook,
    per-position); a stored part with another signature is recomputed, not reused."""
    key = {"model": handle.spec, "kind": kind, "layers": list(layers), "hook": cfg.hook,
           "per_position": cfg.per_position}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def run_patching(run: RunDir, cfg: PatchingConfig, handle: ModelHandle, *,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every (pair kind, sweep kind) of ``cfg`` on a run's records; write tables, summary
    and figures under ``DIR/patching/`` (resumable: finished pairs are read back).

    Layout: ``DIR/patching/{pairs}/{kind}/parts/{dataset}__{id}.json`` per pair, then
    ``effects.parquet`` (+ ``.csv``), ``pairs.parquet`` and ``summary.json`` per (pairs, kind),
    and ``DIR/patching/summary.json`` over all; figures in ``DIR/figures/patching_*.png``.

    Raises:
        PatchingError: bad config values (unknown kinds, layers out of range).
        interp.store.RunDirError: the run has no records.
    """
    cfg.validate()
    layers = cfg.layer_list(handle.n_layers)
    root = run.sub("patching")
    summary: dict[str, Any] = {}
    finished: dict[tuple[str, str, str], dict[str, Any]] = {}   # (pairs, pair, kind) -> part
    for pk in cfg.pairs:
        pairs, refused = build_pairs(run, pk, handle.tokenizer, limit=cfg.limit,
                                     max_tokens=cfg.max_tokens, log=log)
        for kind in cfg.kinds:
            d = root / pk / kind
            parts = d / "parts"
            results = []
            t0 = time.perf_counter()
            sig = part_signature(cfg, kind, layers, handle)
            for pair in pairs:
                f = parts / f"{pair.key}.json"
                if f.exists():
                    old = read_json(f)
                    if old.get("meta", {}).get("signature") == sig:
                        results.append(old)
                        finished[(pk, pair.key, kind)] = old
                        continue
                    log(f"[{pk}/{kind}] {pair.key}: stored sweep used other settings; redone")
                prior = {k: finished[(pk, pair.key, k)] for k in ("heads", "resid")
                         if (pk, pair.key, k) in finished} if kind == "attribution" else None
                res = run_pair(handle, pair, kind, cfg, layers, prior=prior)
                res["meta"]["signature"] = sig
                finished[(pk, pair.key, kind)] = res
                write_json(f, res)
                results.append(res)
                m = res["meta"]
                log(f"[{pk}/{kind}] {pair.dataset} {pair.record_id}: clean LD "
                    f"{m['clean_ld']:+.2f}, corrupt LD {m['corrupt_ld']:+.2f}, sweep "
                    f"{m['wall_s']:.1f} s = {m['cost_ratio']:.0f} clean forwards")
            s = summarise(d, pk, kind, results, refused, layers, handle)
            s["elapsed_s"] = time.perf_counter() - t0
            write_json(d / "summary.json", s)
            summary[f"{pk}/{kind}"] = s
            if not cfg.figures:
                continue
            try:
                from interp import plots

                plots.plot_patching(d, run.sub("figures"))
            except Exception as err:  # noqa: BLE001 - figures never block the tables
                log(f"[{pk}/{kind}] figure failed: {err}")
    write_json(root / "summary.json", {**(read_json(root / "summary.json")
                                          if (root / "summary.json").exists() else {}),
                                       **summary})
    return summary


def summarise(d: Path, pk: str, kind: str, results: list[dict], refused: list[dict],
              layers: Sequence[int], handle: ModelHandle, top: int = 5) -> dict[str, Any]:
    """Write the tables of one (pairs, kind) and return its summary (top layers/heads, cost,
    attribution correlations)."""
    metas = [r["meta"] for r in results]
    if metas:
        _write_table(_frame(metas), d / "pairs.parquet")
    s: dict[str, Any] = {"pairs": pk, "kind": kind, "n_pairs": len(results),
                         "n_refused": len(refused), "refused": refused[:20],
                         "layers": list(layers), "model": handle.spec}
    if not results:
        return s
    s["cost_ratio_mean"] = float(np.mean([m["cost_ratio"] for m in metas]))
    s["clean_forward_s_mean"] = float(np.mean([m["clean_forward_s"] for m in metas]))
    s["mean_clean_ld"] = float(np.mean([m["clean_ld"] for m in metas]))
    s["mean_corrupt_ld"] = float(np.mean([m["corrupt_ld"] for m in metas]))
    rows = []
    for r in results:
        key = {"id": r["meta"]["id"], "dataset": r["meta"]["dataset"]}
        for table in ("resid", "heads", "task_layers", "attribution"):
            for x in r.get(table, []):
                rows.append({**key, "table": table, **x})
    df = _frame(rows)
    _write_table(df, d / "effects.parquet")
    if kind == "resid" and pk == "candidate-swap":
        sp = df[df.unit == "span"].groupby(["layer", "span"]).effect.mean().unstack()
        s["span_effect_by_layer"] = {c: {int(k): float(v) for k, v in sp[c].items()}
                                     for c in sp.columns}
        pos = df[df.unit == "position"]
        if len(pos):
            lay = pos.groupby("layer").effect.apply(lambda e: float(np.nanmax(np.abs(e))))
            s["top_layers"] = [{"layer": int(k), "max_abs_position_effect": float(v)}
                               for k, v in lay.sort_values(ascending=False).head(top).items()]
            cell = pos.groupby(["layer", "rel_position"]).effect.mean()
            s["top_cells"] = [{"layer": int(k[0]), "rel_position": int(k[1]),
                               "mean_effect": float(v)}
                              for k, v in cell.abs().sort_values(ascending=False).head(top)
                              .items() for v in [cell[k]]]
    elif kind == "resid":
        g = df.groupby("layer")[["d_ld", "d_p_correct", "d_context_mass"]].mean()
        flips = df.groupby("layer").verdict_flip.mean()
        s["by_layer"] = {int(k): {**{c: float(v[c]) for c in g.columns},
                                  "flip_rate": float(flips[k])} for k, v in g.iterrows()}
        gl = g.drop(index=-1, errors="ignore")
        s["top_layers"] = [{"layer": int(k), "mean_d_ld": float(v)}
                           for k, v in gl.d_ld.abs().sort_values(ascending=False).head(top)
                           .items() for v in [gl.d_ld[k]]]
    elif kind == "heads":
        col = "effect" if pk == "candidate-swap" else "ld"
        if pk == "task-swap":
            base = {m["id"]: m["corrupt_ld"] for m in metas}
            df["d_ld"] = df.ld - df.id.map(base)
            col = "d_ld"
        hm = df.groupby(["layer", "head"])[col].mean()
        s["top_heads"] = [{"layer": int(k[0]), "head": int(k[1]), f"mean_{col}": float(hm[k])}
                          for k in hm.abs().sort_values(ascending=False).head(top).index]
    else:
        h = df[df.unit == "head"]
        r = df[df.unit != "head"]
        s["correlation_heads"] = _corr(h.attr_ld.to_numpy(), h.exact_d_ld.to_numpy())
        s["correlation_resid"] = _corr(r.attr_ld.to_numpy(), r.exact_d_ld.to_numpy())
        s["exact_cost_ratio_mean"] = float(np.mean(
            [m["exact_wall_s"] / m["clean_forward_s"] for m in metas]))
        per = [_corr(g.attr_ld.to_numpy(), g.exact_d_ld.to_numpy())["pearson"]
               for _, g in h.groupby("id")]
        per = [x for x in per if x is not None]
        s["correlation_heads_per_pair_mean_pearson"] = float(np.mean(per)) if per else None
    return s


# ---------------------------------------------------------------------------------------------
# CLI and config stage
# ---------------------------------------------------------------------------------------------


def run_stage(run: RunDir, section: dict, handle: ModelHandle) -> None:
    """``interp run CONFIG``: the ``[patching]`` table (keys of :class:`PatchingConfig`).

    Raises:
        ValueError: unknown keys in the section (the message lists the known ones).
    """
    cfg = PatchingConfig.from_mapping(section)
    run_patching(run, cfg, handle)


def register(app: Any) -> None:
    """Add ``interp patch`` to the typer app."""
    @app.command("patch")
    def patch_cmd(
        run: Annotated[Path, typer.Option(help="run directory (from `interp asymmetry`)")],
        pairs: Annotated[str, typer.Option(help="candidate-swap or task-swap (comma list)")] = (
            "candidate-swap"),
        kind: Annotated[str, typer.Option(help="resid, heads or attribution (comma list)")] = (
            "resid"),
        limit: Annotated[int | None, typer.Option(help="pairs per dataset")] = 5,
        layers: Annotated[str | None, typer.Option(help="e.g. '0-29' or '20,24,28'")] = None,
        layer_stride: int = 1,
        hook: str = "hook_resid_pre",
        per_position: bool = True,
        max_tokens: int = 1024,
        batch_size: int = 16,
        device: str | None = None,
    ) -> None:
        """Activation / attribution patching between the judge and the generator."""
        from interp.models import load_model

        rd = RunDir(run)
        manifest = rd.manifest()
        lay = None
        if layers:
            lay = []
            for part in layers.split(","):
                a, _, b = part.partition("-")
                lay += list(range(int(a), int(b) + 1)) if b else [int(a)]
        cfg = PatchingConfig.from_mapping({
            "pairs": [x.strip() for x in pairs.split(",")],
            "kinds": [x.strip() for x in kind.split(",")], "limit": limit, "layers": lay,
            "layer_stride": layer_stride, "hook": hook, "per_position": per_position,
            "max_tokens": max_tokens, "batch_size": batch_size})
        cfg_m = manifest.get("config", {})
        handle = load_model(cfg_m.get("model", "smollm2-135m-instruct"), device=device,
                            dtype=cfg_m.get("dtype"))
        summary = run_patching(rd, cfg, handle, log=typer.echo)
        for key, s in summary.items():
            typer.echo(f"== {key}: {s.get('n_pairs')} pairs, {s.get('n_refused')} refused, "
                       f"cost {s.get('cost_ratio_mean', float('nan')):.1f} clean forwards/pair")
            for k in ("top_layers", "top_heads", "correlation_heads", "correlation_resid"):
                if k in s:
                    typer.echo(f"   {k}: {s[k]}")
        typer.echo(f"wrote {rd.path / 'patching'} and {rd.path / 'figures'}/patching_*.png")
