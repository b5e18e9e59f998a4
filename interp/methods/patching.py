"""Activation patching and attribution patching: the engine (tensors and prompts in, numbers out).

Setting (paper section 3.2): the same model judges (eval prompt, T_eval) and generates (gen
prompt, T_gen). We ask which internal states move the judge's verdict. The clean/corrupt pairs
are built in :mod:`interp.methods.pairs`; the unit sweeps and the AtP* ranking are in
:mod:`interp.methods.patch_sweeps`; the stage that runs them over a run directory is
:mod:`interp.stages.patching`.

Metric: the judge's whole-reply verdict score (:mod:`interp.judging.verdict`; docs/measuring.md,
the verdict score): ``LD = log P("Correct") - log P("Incorrect")`` with the tokens the chat template
gives each reply, in nats, read from the patched forward; ``p_correct = sigmoid(LD)`` (the
forced choice) and ``coverage = P(Correct) + P(Incorrect)``. A reply of several tokens is
scored from the patched prompt's key/value cache; the reply positions themselves are not
patched (:meth:`interp.hooks.backends.Backend.score`). The normalised patch effect of one pair
is ``(LD_patched - LD_corrupt) / (LD_clean - LD_corrupt)`` (Wang et al. 2022, "Interpretability
in the wild", section 3; Heimersheim & Nanda 2024, "How to use and interpret activation
patching"): 0 = no change, 1 = the patch restores the clean verdict. Over pairs it is
aggregated as a ratio of sums (:func:`ratio_of_sums`), never as a mean of ratios.

Algorithm (:class:`Patcher`):

1. Alignment: corrupt position ``i`` takes the clean activation at ``pos_map[i]`` (-1: nothing
   corresponds, never patched). The shared prefix (:func:`interp.methods.pairs.shared_prefix`: the
   common tokens from the start, one model) has identical activations in both runs, so a
   position there that maps to itself is a no-op (:func:`interp.methods.pairs.patchable_positions`).
2. Refusal (docs/stages.md, patch): a patch request that would touch no activation (a position in
   the shared prefix, a position mapped to -1, a row with no position) raises
   :class:`~interp.core.errors.StageError` naming the position, before any forward.
3. Caching: one clean forward (on the ``donor`` model when there is one) stores the activations
   at the hook points a sweep needs and scores the clean prompt; the corrupt prompt is scored
   once, through the prefix cache of step 4 when there is one (so an unpatched row would read
   exactly the corrupt score).
4. Exact activation patching: each patched row replaces activations of the corrupt run by the
   clean ones at a hook point (:data:`PATCH_POINTS`) on a mask of positions (``resid``:
   ``blocks.L.hook_resid_pre`` / ``hook_resid_post``) or of (position, head) (``heads``:
   ``blocks.L.attn.hook_z``, the input of ``o_proj`` split into heads, so a head's contribution
   is replaced exactly). Rows are stacked along the batch, each with its own mask
   (:mod:`interp.hooks.backends`). Positions before the first patchable position are run once
   (``prefix_cache``, ``hf``) and their key/value cache is reused by every row.
5. Attribution patching (Nanda 2023, "Attribution patching"; Syed et al. 2023; Kramar et al.
   2024, "AtP*"): one forward and one backward pass of the corrupt run, the replies appended
   (:func:`interp.hooks.backends.reply_extensions`), give ``dLD/da`` of the SAME whole-reply
   ``LD`` at every hook point; the first-order estimate of patching ``a`` is
   ``(a_clean - a_corrupt) . dLD/da``, summed over ``d_model`` per (layer, position) and over
   ``head_dim`` and the patched positions per (layer, head).
6. Cost: wall time of the patched forwards divided by that of one clean forward.

The same engine patches between two models (``donor``): cross-model patching of the transfer
study (:func:`interp.methods.transfer.cross_model_patching`). Backends: ``hf`` (default),
``transformer_lens``, ``nnsight``; the invariants (patch every position = clean, refused
requests, backends agree) are tested in ``tests/equivalence/test_patching_equivalence.py``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.core.errors import StageError
from interp.core.vocab import MIN_GAP
from interp.hooks.backends import (
    HFBackend,
    extend_prompts,
    get_backend,
    reply_extensions,
    reply_logprobs,
)
from interp.hooks.backends import hook_order as _hook_order
from interp.hooks.guard import inference_guard
from interp.judging.verdict import VerdictReplies, verdict_replies
from interp.methods.pairs import patchable_positions, shared_prefix
from interp.models.loading import ModelHandle
from interp.models.points import hook_name, parse_hook

__all__ = [
    "PATCH_POINTS",
    "Patch",
    "PatchResult",
    "Patcher",
    "own_activation",
    "patch",
    "patch_pair",
    "ratio_of_sums",
    "patchable_positions",
    "shared_prefix",
]

PATCH_POINTS = ("hook_resid_pre", "attn.hook_z", "hook_resid_post")
"""Patchable hook points per block, in execution order."""
TokenIds = Int[Tensor, " seq"] | Int[Tensor, "1 seq"] | Sequence[int]
"""One prompt's token ids: ``[seq]`` or ``[1, seq]``."""


def _parse(name: str, n_layers: int) -> tuple[int, str]:
    """``(layer, point)`` of a patchable hook point.

    Raises:
        HookError: an unknown name or a layer out of range (lists the valid ones).
        StageError: a known point that is not patchable here (lists the patchable ones).
    """
    layer, point = parse_hook(name, n_layers)
    if point not in PATCH_POINTS:
        raise StageError("patching",
                         f"{name!r} is not patchable; valid points: {list(PATCH_POINTS)}")
    return layer, point


def ratio_of_sums(patched: Float[np.ndarray, " pairs"], clean: Float[np.ndarray, " pairs"],
                  corrupt: Float[np.ndarray, " pairs"]) -> float | None:
    """Normalised effect over pairs: ``sum s (patched - corrupt) / sum |clean - corrupt|``.

    ``s = sign(clean - corrupt)`` aligns pairs whose judge prefers the corrupt prompt; when
    every gap has the same sign this is ``sum(patched - corrupt) / sum(clean - corrupt)``.
    A ratio of sums, not a mean of per-pair ratios: pairs with small gaps weigh little instead
    of exploding (docs/measuring.md).

    Returns:
        The ratio, or None when there is no pair or every gap is 0.
    """
    p, c, x = (np.asarray(a, dtype=np.float64) for a in (patched, clean, corrupt))
    ok = np.isfinite(p) & np.isfinite(c) & np.isfinite(x)
    gap = (c - x)[ok]
    den = float(np.abs(gap).sum())
    if not ok.any() or den == 0.0:
        return None
    return float((np.sign(gap) * (p[ok] - x[ok])).sum() / den)


@dataclass(frozen=True)
class Patch:
    """One intervention of a patched run: copy clean activations into the corrupt run.

    Attributes:
        hook: hook-point name, ``blocks.{L}.{point}`` with a point of
            :data:`interp.models.points.HOOK_POINTS`.
        positions: corrupt-run positions to patch (None: every patchable position).
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
        raise StageError("patching",
                         f"{name} must be one prompt's token ids [seq] or [1, seq], got shape "
                         f"{tuple(t.shape)}")
    return t


@dataclass
class PatchResult:
    """Whole-reply verdict scores of a list of patched runs of one pair (module docstring).

    Attributes:
        clean, corrupt: ``LD`` of the clean and corrupt runs (nats).
        patched: ``LD`` of each patched run, ``[n_rows]``.
        logprob_correct, logprob_incorrect: ``log P(reply)`` of each patched run, ``[n_rows]``.
        patches: the rows (each a list of :class:`Patch`).
        wall_s: seconds of the patched forwards; ``clean_forward_s`` of one clean forward.
        n_runs: patched rows run.
        last_logits: the patched runs' logits at the verdict position ``[n_rows, vocab]``
            (only with ``keep_logits``).
    """

    clean: float
    corrupt: float
    patched: Float[np.ndarray, " n_rows"]
    logprob_correct: Float[np.ndarray, " n_rows"]
    logprob_incorrect: Float[np.ndarray, " n_rows"]
    patches: list[Any] = field(default_factory=list)
    wall_s: float = 0.0
    clean_forward_s: float = float("nan")
    n_runs: int = 0
    last_logits: Tensor | None = None
    min_gap: float = 0.0

    @property
    def gap(self) -> float:
        """``clean - corrupt`` (nats): what a patch can restore; its sign orients the effect."""
        return self.clean - self.corrupt

    @property
    def measurable(self) -> bool:
        """Whether ``|gap| >= min_gap`` (and above 1e-6 nats): the pair can measure an effect."""
        return abs(self.gap) >= max(self.min_gap, 1e-6)

    @property
    def effect(self) -> Float[np.ndarray, " n_rows"]:
        """Normalised effects ``sign(gap) (patched - corrupt) / |gap|`` of this pair.

        The same number as ``(patched - corrupt) / (clean - corrupt)``, oriented so that 1
        means the patch restored the clean score whichever of the two is higher (a pair whose
        clean score is below its corrupt one reads the same way as any other). NaN when the
        pair is not :attr:`measurable` (a 0.36-nat gap would turn a 4.5-nat change into an
        "effect" of -12.5). The aggregate over pairs is :func:`ratio_of_sums`, over pairs kept
        by the same rule.
        """
        if not self.measurable:
            return np.full_like(self.patched, np.nan)
        return np.sign(self.gap) * (self.patched - self.corrupt) / abs(self.gap)

    @property
    def note(self) -> str:
        """One line on what the effect can mean for this pair ("" when nothing to say)."""
        if not self.measurable:
            return (f"|gap| {abs(self.gap):.2f} < min_gap {self.min_gap} nats (clean "
                    f"{self.clean:+.2f}, corrupt {self.corrupt:+.2f}): too small to measure an "
                    f"effect; effect is NaN (pass min_gap=0 to read the raw ratio)")
        if self.gap < 0:
            return (f"the clean score is below the corrupt one (gap {self.gap:+.2f} nats): "
                    f"effects are oriented by sign(gap), 1 = the clean score restored")
        return ""

    @property
    def p_correct(self) -> Float[np.ndarray, " n_rows"]:
        """``sigmoid(LD)``: the forced choice between the two replies."""
        return 1.0 / (1.0 + np.exp(-self.patched))

    @property
    def coverage(self) -> Float[np.ndarray, " n_rows"]:
        """``P(Correct) + P(Incorrect)`` of each patched run."""
        return np.exp(self.logprob_correct) + np.exp(self.logprob_incorrect)


class Patcher:
    """Clean/corrupt runs of one pair and batched patched runs on a backend.

    Args:
        handle: the model of the corrupt (and patched) runs.
        clean_ids: token ids ``[seq]`` of the clean prompt.
        corrupt_ids: token ids ``[seq]`` of the corrupt prompt.
        pos_map: for each corrupt position the clean position whose activation it takes, or
            -1 where nothing corresponds (default: identity, equal lengths required).
        backend: ``hf``, ``transformer_lens`` or ``nnsight``.
        batch_size: patched rows per forward.
        prefix_cache: run the positions before the first patchable one once and reuse their
            key/value cache (``hf`` only).
        donor: the model of the clean run (default ``handle``): cross-model patching.
        replies: the verdict replies' tokens (default:
            :func:`interp.judging.verdict.verdict_replies`).
        held: hook -> activation ``[S_corrupt, ...]`` that a patch of that hook puts in place
            of the clean run's. With the corrupt run's own activation
            (:func:`own_activation`) a patch holds the unit still while other patches act:
            every path through it is blocked (path patching in its blocking form, Wang et
            al. 2022 section 3.1; ``experiments/findings/path_test.py``).

    Attributes:
        shared: length of the shared prefix (module step 1); 0 with another donor model.
        start: first patchable position (:func:`patchable_positions`).

    Raises:
        StageError: ids of the wrong shape, unequal lengths without ``pos_map``, a bad
            ``pos_map``.
        BackendError: an unknown backend.
        PromptError: a tokenizer whose verdict replies cannot be separated.
    """

    def __init__(self, handle: ModelHandle, clean_ids: TokenIds, corrupt_ids: TokenIds, *,
                 pos_map: Sequence[int] | None = None, backend: str = "hf",
                 batch_size: int = 16, prefix_cache: bool = True,
                 donor: ModelHandle | None = None, replies: VerdictReplies | None = None,
                 held: Mapping[str, Tensor] | None = None):
        self.handle = handle
        self.clean_ids = _as_ids(clean_ids, "clean_ids").to(handle.device)
        self.corrupt_ids = _as_ids(corrupt_ids, "corrupt_ids").to(handle.device)
        n = len(self.corrupt_ids)
        if pos_map is None:
            if len(self.clean_ids) != n:
                raise StageError("patching",
                                 f"clean and corrupt prompts have {len(self.clean_ids)} and "
                                 f"{n} tokens; pass pos_map to align them")
            pos_map = list(range(n))
        self.pos_map = torch.as_tensor(list(pos_map), dtype=torch.long)
        if len(self.pos_map) != n or int(self.pos_map.max()) >= len(self.clean_ids) \
                or int(self.pos_map.min()) < -1:
            raise StageError("patching",
                             "pos_map must have one entry per corrupt position, each < the "
                             "clean length or -1")
        self.be = get_backend(handle, backend)
        same = donor is None or donor is handle
        self.donor_be = self.be if same else get_backend(donor, backend)
        self.shared = shared_prefix(self.clean_ids.tolist(), self.corrupt_ids.tolist()) \
            if same else 0
        self._patchable = patchable_positions(self.clean_ids.tolist(),
                                              self.corrupt_ids.tolist(), self.pos_map.tolist(),
                                              same_model=same)
        self.start = self._patchable[0] if self._patchable else n
        self.batch_size = batch_size
        self.use_prefix = prefix_cache and isinstance(self.be, HFBackend) and 0 < self.start < n
        self.replies = replies or verdict_replies(handle.tokenizer)
        self.held = dict(held or {})
        for h, v in self.held.items():
            if v.shape[0] != n:
                raise StageError("patching",
                                 f"held {h}: {v.shape[0]} positions, the corrupt prompt has "
                                 f"{n}")
        self._clean_cache: dict[str, Tensor] = {}
        self._attribution: dict[tuple, dict[str, np.ndarray]] = {}
        self._prefix = None
        self.clean_lp: Float[Tensor, "1 2"] | None = None
        self.corrupt_lp: Float[Tensor, "1 2"] | None = None
        self.clean_logits: Float[Tensor, " vocab"] | None = None
        self.corrupt_logits: Float[Tensor, " vocab"] | None = None
        self.clean_forward_s = float("nan")

    # -- baselines ------------------------------------------------------------------------
    @property
    def clean_ld(self) -> float:
        """``LD`` of the clean run (nats; NaN before :meth:`ensure_clean`)."""
        return float("nan") if self.clean_lp is None else float(self.clean_lp[0, 0]
                                                                  - self.clean_lp[0, 1])

    @property
    def corrupt_ld(self) -> float:
        """``LD`` of the corrupt run (nats; NaN before :meth:`ensure_clean`)."""
        return float("nan") if self.corrupt_lp is None else float(self.corrupt_lp[0, 0]
                                                                    - self.corrupt_lp[0, 1])

    def scores(self) -> dict[str, dict[str, float]]:
        """Clean and corrupt ``logit_diff``, ``p_correct``, ``verdict_coverage`` (JSON-safe)."""
        out = {}
        for name, lp in (("clean", self.clean_lp), ("corrupt", self.corrupt_lp)):
            c, i = (float(x) for x in lp[0])
            out[name] = {"logit_diff": c - i, "p_correct": 1 / (1 + math.exp(i - c)),
                         "verdict_coverage": math.exp(c) + math.exp(i)}
        return out

    def ensure_clean(self, hooks: Iterable[str], *,
                     extra_hooks: Mapping[str, Callable[[], Any]] | None = None) -> None:
        """Score the clean and the corrupt prompt once (module step 3).

        The clean forward runs again when hook points not cached yet are asked for.

        Args:
            hooks: hook points whose clean activations the patched rows take.
            extra_hooks: ``"clean"`` and/or ``"corrupt"`` -> a context-manager factory entered
                around that run's prompt forward (``hf`` only; not the replies' tokens), for
                the runs this call makes: what else a caller reads of the two runs (an
                attribution, the attention rows) comes from these forwards instead of its own.
                With the prefix cache the corrupt forward is the prompt from :attr:`start` on
                over the cached prefix (module step 4). The last-position logits ``[vocab]``
                of both runs are kept as :attr:`clean_logits` and :attr:`corrupt_logits`.

        Raises:
            StageError: an extra hook of another run than ``clean`` or ``corrupt``.
        """
        extra = dict(extra_hooks or {})
        if bad := sorted(set(extra) - {"clean", "corrupt"}):
            raise StageError("patching",
                             f"extra_hooks for {bad}: only 'clean' and 'corrupt' runs exist")
        need = [h for h in hooks if h not in self._clean_cache]
        for h in need:
            _parse(h, self.handle.n_layers)
        if need or self.clean_lp is None:
            t0 = time.perf_counter()
            with torch.no_grad():
                lp, last, acts = self.donor_be.score(self.clean_ids[None], self.replies.ids,
                                                     cache_hooks=need,
                                                     extra_hooks=extra.get("clean"))
            dt = time.perf_counter() - t0
            self.clean_forward_s = dt if math.isnan(self.clean_forward_s) else min(
                dt, self.clean_forward_s)
            self.clean_lp = lp.double().cpu()
            self.clean_logits = last[0]
            self._clean_cache.update({k: v[0] for k, v in acts.items()})
        if self.corrupt_lp is None:
            # with the prefix cache, the corrupt run is scored as every patched row is: the
            # cached prefix, then the suffix (an unpatched row reads exactly corrupt_ld)
            off = self._offset()
            with torch.no_grad():
                lp, last, _ = self.be.score(self.corrupt_ids[None, off:], self.replies.ids,
                                            prefix=self._prefix_cache(),
                                            extra_hooks=extra.get("corrupt"))
            self.corrupt_lp = lp.double().cpu()
            self.corrupt_logits = last[0]

    def _prefix_cache(self) -> Any:
        """Module step 4's key/value cache of the corrupt prompt before ``start``, run once.

        None without ``prefix_cache``.
        """
        if self.use_prefix and self._prefix is None:
            self._prefix = self.be.prefix_cache(self.corrupt_ids[None, :self._offset()])
        return self._prefix

    def source(self, hook: str) -> Float[Tensor, "pos ..."]:
        """Clean activation mapped onto corrupt positions ``[S_corrupt, ...]`` (or the held one)."""
        if hook in self.held:
            return self.held[hook].to(self.handle.device)
        act = self._clean_cache[hook]
        return act[self.pos_map.clamp(min=0).to(act.device)]

    # -- masks ----------------------------------------------------------------------------
    def patchable(self) -> list[int]:
        """Corrupt positions a patch can change (:func:`patchable_positions`)."""
        return list(self._patchable)

    def _positions(self, p: Patch) -> Bool[Tensor, " pos"]:
        """Module step 2: the positions of one patch, refusing those that touch nothing."""
        n = len(self.corrupt_ids)
        pos = torch.zeros(n, dtype=torch.bool)
        if p.positions is None:
            pos[self.patchable()] = True
            if not pos.any():
                raise StageError("patching", f"{p.hook}: no position to patch (shared prefix 0.."
                                             f"{self.shared - 1}, no other mapped position)")
            return pos
        if not p.positions:
            raise StageError("patching", f"{p.hook}: an empty position list patches nothing")
        for q in p.positions:
            i = int(q) + n if int(q) < 0 else int(q)
            if not 0 <= i < n:
                raise StageError("patching", f"{p.hook}: position {q} outside the corrupt prompt "
                                             f"(0..{n - 1}, or negative from the end)")
            if i < self.shared and self.pos_map[i] == i:
                raise StageError("patching",
                                 f"{p.hook}: position {i} lies in the shared prefix "
                                 f"0..{self.shared - 1}: its activations are identical in "
                                 f"both runs, so patching it changes nothing")
            if self.pos_map[i] < 0:
                raise StageError("patching", f"{p.hook}: position {i} has no clean counterpart "
                                             f"(pos_map -1): there is nothing to patch it with")
            pos[i] = True
        return pos

    def _row_mask(self, p: Patch) -> Bool[Tensor, " pos *heads"]:
        _, point = _parse(p.hook, self.handle.n_layers)
        pos = self._positions(p)
        if point != "attn.hook_z":
            if p.heads is not None:
                raise StageError("patching", f"heads= only applies to attn.hook_z, not {p.hook!r}")
            return pos
        h = torch.zeros(self.handle.n_heads, dtype=torch.bool)
        if p.heads is None:
            h[:] = True
        else:
            bad = [x for x in p.heads if not 0 <= x < self.handle.n_heads]
            if bad or not p.heads:
                raise StageError("patching", f"heads {list(p.heads)} out of range or empty; valid: "
                                             f"0..{self.handle.n_heads - 1}")
            h[list(p.heads)] = True
        return pos[:, None] & h[None, :]

    def _masks(self, rows: list[list[Patch]]) -> list[dict[str, Tensor]]:
        """Per row: hook -> mask over the positions from ``start`` (module step 2)."""
        out = []
        for k, r in enumerate(rows):
            if not r:
                raise StageError("patching", f"row {k} patches nothing (the corrupt run is "
                                             f"PatchResult.corrupt)")
            m: dict[str, Tensor] = {}
            for p in r:
                mk = self._row_mask(p)
                m[p.hook] = m[p.hook] | mk if p.hook in m else mk
            out.append({k2: v[self._offset():] for k2, v in m.items()})
        return out

    def _offset(self) -> int:
        return self.start if self.use_prefix else 0

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

    # -- patched runs ---------------------------------------------------------------------
    def run(self, rows: Sequence[Patch | Sequence[Patch]], *, keep_logits: bool = False,
            extra_hooks: Callable[[int], Any] | None = None,
            progress: Callable[[int, int], None] | None = None) -> PatchResult:
        """Run patched forwards, one per row (a row is one patch or several at once).

        Args:
            rows: the rows.
            keep_logits: also return each row's verdict-position logits.
            extra_hooks: ``batch -> context manager`` entered around each batch's prompt
                forward (``hf`` only; e.g. the attention recorder).
            progress: called with ``(rows done in the batch, rows in all)`` after each batch.

        Returns:
            :class:`PatchResult` with the whole-reply scores of every row.

        Raises:
            StageError: a row that touches no activation (module step 2), bad heads.
        """
        rows = [[r] if isinstance(r, Patch) else list(r) for r in rows]
        masks_all = self._masks(rows)   # refuses before any forward
        hooks = sorted({p.hook for r in rows for p in r}, key=_hook_order)
        self.ensure_clean(hooks)
        off = self._offset()
        sources = {h: self.source(h)[off:] for h in hooks}
        suffix = self.corrupt_ids[off:]
        lps, logits = [], []
        t0 = time.perf_counter()
        for s in range(0, len(rows), self.batch_size):
            chunk = list(range(s, min(s + self.batch_size, len(rows))))
            masks = self._batch_masks(hooks, chunk, masks_all, len(suffix))
            extra = (lambda b=len(chunk): extra_hooks(b)) if extra_hooks else None
            with torch.no_grad():
                lp, last, _ = self.be.score(suffix[None].expand(len(chunk), -1),
                                            self.replies.ids, masks=masks, sources=sources,
                                            prefix=self._prefix_cache(),
                                            extra_hooks=extra)
            lps.append(lp.double().cpu())
            if keep_logits:
                logits.append(last.float().cpu())
            if progress:
                progress(len(chunk), len(rows))
        wall = time.perf_counter() - t0
        lp = torch.cat(lps).numpy()
        return PatchResult(clean=self.clean_ld, corrupt=self.corrupt_ld,
                           patched=lp[:, 0] - lp[:, 1], logprob_correct=lp[:, 0],
                           logprob_incorrect=lp[:, 1], patches=rows,
                           wall_s=wall, clean_forward_s=self.clean_forward_s, n_runs=len(rows),
                           last_logits=torch.cat(logits) if keep_logits else None)

    # -- attribution ----------------------------------------------------------------------
    def attribution(self, layers: Sequence[int] | None = None, *,
                    resid_hook: str = "hook_resid_pre",
                    positions: Sequence[int] | None = None
                    ) -> dict[str, Float[np.ndarray, "layer _"]]:
        """Attribution patching of the whole-reply ``LD`` (module step 5), ``hf`` backend.

        Args:
            layers: layers to score (default all).
            resid_hook: ``hook_resid_pre`` or ``hook_resid_post``: the residual point scored.
            positions: corrupt positions whose differences count for the head scores
                (default: every patchable position).

        Returns:
            ``resid`` ``[n_layers, S]``: ``sum_d (clean - corrupt) * dLD/da`` at ``resid_hook``
            per (layer, position); ``heads`` ``[n_layers, n_heads]``: the same at
            ``attn.hook_z`` summed over head_dim and ``positions``; both in nats (estimates of
            ``LD_patched - LD_corrupt``). Positions that cannot be patched and layers not
            scored are 0. Computed once per (layers, hook, positions) and kept.

        Raises:
            StageError: another backend than ``hf``; positions that cannot be patched.
        """
        if not isinstance(self.be, HFBackend):
            raise StageError("patching", "attribution patching runs on the hf backend")
        nl, n = self.handle.n_layers, len(self.corrupt_ids)
        layers = list(range(nl)) if layers is None else list(layers)
        key = (tuple(layers), resid_hook, None if positions is None else tuple(positions))
        if key in self._attribution:
            return self._attribution[key]
        hooks = [hook_name(layer, p) for layer in layers for p in (resid_hook, "attn.hook_z")]
        self.ensure_clean(hooks)
        valid = torch.zeros(n, dtype=torch.bool)
        valid[self.patchable()] = True
        sel = valid if positions is None else self._positions(
            Patch(hooks[0], tuple(positions)))
        grads, acts = self._grads(hooks)
        resid, heads = np.zeros((nl, n)), np.zeros((nl, self.handle.n_heads))
        vm, sm = valid.to(self.handle.device), sel.to(self.handle.device)
        for layer in layers:
            h = hook_name(layer, resid_hook)
            # float32 products and sums: a bfloat16 model's activations and gradients are
            # bfloat16 (numpy has no such type, and a bf16 sum over d_model loses digits)
            diff = (self.source(h).float() - acts[h].float()) * vm[:, None].to(acts[h].device)
            resid[layer] = (diff * grads[h].float()).sum(-1).cpu().numpy()
            h = hook_name(layer, "attn.hook_z")
            diff = (self.source(h).float() - acts[h].float()) * sm[:, None, None].to(acts[h].device)
            heads[layer] = (diff * grads[h].float()).sum((0, 2)).cpu().numpy()
        self._attribution[key] = {"resid": resid, "heads": heads}
        return self._attribution[key]

    def _grads(self, hooks: list[str]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """``dLD/da`` and ``a`` of the corrupt run at the prompt positions, per hook."""
        n = len(self.corrupt_ids)
        exts = reply_extensions(self.replies.ids)
        width = max(len(e) for e in exts)
        tok = self.handle.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        ids = extend_prompts(self.corrupt_ids[None], exts, pad)
        emb = self.handle.model.get_input_embeddings()(ids).detach()
        emb.requires_grad_(True)
        with torch.enable_grad():
            out = self.be.forward(ids, cache_hooks=hooks, inputs_embeds=emb, keep_graph=True,
                                  logits_to_keep=width + 1)
            lp = reply_logprobs(out.logits, self.replies.ids, exts, 1)
            ld = lp[0, 0] - lp[0, 1]
            g = torch.autograd.grad(ld, [out.acts[h] for h in hooks])
        grads = {h: x.sum(0)[:n] for h, x in zip(hooks, g)}
        acts = {h: out.acts[h][0, :n].detach() for h in hooks}
        return grads, acts


def own_activation(handle: ModelHandle, ids: TokenIds, hook: str, *,
                   backend: str = "hf") -> Float[Tensor, "seq ..."]:
    """``hook``'s activation in the plain forward of ``ids``: ``[seq, ...]``.

    What :class:`Patcher`'s ``held`` takes to hold a unit at the corrupt run's own value.

    Raises:
        HookError / LayerSpecError: an unknown hook point or layer.
    """
    p = Patcher(handle, ids, ids, backend=backend, prefix_cache=False)
    p.ensure_clean([hook])
    return p.source(hook)


def patch(handle: ModelHandle, clean_ids: TokenIds, corrupt_ids: TokenIds, *, hook: str,
          positions: Sequence[int] | None = None, heads: Sequence[int] | None = None,
          backend: str = "hf", pos_map: Sequence[int] | None = None,
          min_gap: float = MIN_GAP) -> PatchResult:
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
        hook: hook-point name, ``blocks.{L}.{point}`` with a point of
            :data:`interp.models.points.HOOK_POINTS`.
        positions: corrupt positions to patch (None: every patchable one; negative counts
            from the end).
        heads: query heads (``attn.hook_z`` only).
        backend: ``hf``, ``transformer_lens`` or ``nnsight``.
        pos_map: corrupt position -> clean position (-1: none), for prompts of unequal length.
        min_gap: the command line's gap rule (``interp patch --min-gap``, default
            :data:`MIN_GAP` nats): a pair whose ``|clean - corrupt|`` is under it gets NaN
            effects and a :attr:`PatchResult.note`; effects are oriented by ``sign(gap)``.

    Returns:
        :class:`PatchResult` with one patched run; ``r.note`` says when the pair is too small
        to measure or its clean score is below its corrupt one.

    Raises:
        HookError: unknown hook or layer (lists valid ones).
        StageError: a point that is not patchable, bad heads, or positions that touch no
            activation (named in the message).
        ModelSpecError: query heads not a multiple of key/value heads.

    Every forward runs in eval mode (:func:`interp.hooks.guard.inference_guard`); the model
    gets its training flags and hooks back afterwards, whatever raises.
    """
    if getattr(corrupt_ids, "task", None) == "gen" or getattr(clean_ids, "task", None) == "gen":
        raise StageError("patching",
                         "patch() scores the corrupt prompt with the judge's verdict "
                         "replies; a generator prompt is not a judge prompt: patch a pair "
                         "of the CLI's kinds with patch_pair(case_pair(case, 'gen-to-eval'"
                         " or 'eval-to-gen'), ...)")
    clean_ids = getattr(clean_ids, "input_ids", clean_ids)
    corrupt_ids = getattr(corrupt_ids, "input_ids", corrupt_ids)
    _parse(hook, handle.n_layers)
    with inference_guard(handle):
        p = Patcher(handle, clean_ids, corrupt_ids, pos_map=pos_map, backend=backend,
                    prefix_cache=False)
        res = p.run([Patch(hook, None if positions is None else tuple(int(x) for x in positions),
                           None if heads is None else tuple(heads))])
    res.min_gap = float(min_gap)
    return res


def patch_pair(handle: Any, pair: Any, *, hook: str, unit: str | None = None,
               positions: Sequence[int] | None = None, heads: Sequence[int] | None = None,
               backend: str | None = None, min_gap: float = MIN_GAP) -> PatchResult:
    """Patch one pair of the command line's kinds at one hook point, with its gap rule.

    Example:
        >>> c = case(model.tokenizer, record)
        >>> r = patch_pair(model, case_pair(c, "gen-to-eval"), hook="blocks.20.hook_resid_post")
        >>> r.effect[0], r.note

    Args:
        handle: the model (a :class:`interp.hooks.model.HookedModel` or a handle).
        pair: a :class:`interp.methods.pairs.PatchPair` (:func:`interp.methods.pairs.case_pair`
            or :func:`interp.methods.pairs.build_pairs`).
        hook: the hook point.
        unit: a span unit of the pair (``verdict``, ``context``, ``candidate``, ``all``, ...:
            :meth:`PatchPair.span_units`) instead of ``positions``.
        positions: corrupt positions (None with no ``unit``: every patchable one).
        heads: query heads (``attn.hook_z`` only).
        backend: ``hf``, ``transformer_lens`` or ``nnsight`` (None: a HookedModel's own,
            else ``hf``); an unknown name is refused.
        min_gap: the gap rule (:func:`patch`).

    Returns:
        :class:`PatchResult`: NaN effects and a note when ``|gap| < min_gap``; effects oriented
        by ``sign(gap)``.

    Raises:
        StageError: a unit the pair does not have (names the ones it has), or as
            :func:`patch`.
    """
    backend = backend or getattr(handle, "backend_name", "hf")
    handle = getattr(handle, "handle", handle)
    if unit is not None:
        units = pair.span_units()
        if unit not in units:
            raise StageError("patching",
                             f"the pair has no unit {unit!r}; its units: {sorted(units)}")
        positions = units[unit]
    return patch(handle, pair.clean.input_ids, pair.corrupt.input_ids, hook=hook,
                 positions=positions, heads=heads, backend=backend, pos_map=pair.pos_map,
                 min_gap=min_gap)
