"""The exact last-row attention recorder, full attention patterns, and one-prompt recordings.

Algorithm of :func:`record_rows` (paper section 3.2: the attention the model pays from the
position that predicts the first output token):

1. Run the model ONCE on the prompt (batch 1, no padding, no KV cache, ``logits_to_keep=1``).
2. ``hf`` (default): the forward runs with the attention implementation ``interp_last_row``, a
   function registered with transformers' ``AttentionInterface`` (and SDPA's mask function). It
   calls SDPA for the layer output and, on the side, computes the exact last-query row
   ``softmax(q_last . K^T * scaling + mask_last)`` in float32 from the post-RoPE query of the
   last position and all keys. GQA: query head ``h`` reads key/value head
   ``h // (n_heads / n_kv_heads)`` (transformers' ``repeat_kv``), so every query head reports
   its own row. Cost: about one plain SDPA forward (``benchmarks/attention_recorder.py``);
   eager attention with ``output_attentions=True`` costs 3.3x that at 2048 tokens.
3. Check paths, each a backend's ``patterns`` (:mod:`interp.hooks.backends`): ``hf`` with
   ``attn="eager"`` (``output_attentions=True``), ``transformer_lens`` (TransformerBridge
   ``blocks.L.attn.hook_pattern``) and ``nnsight`` (the attention module's second output under
   eager attention) give the same rows (tests/equivalence).
4. Optional activations of chosen layers (``hf`` only), read in the same forward through
   :func:`interp.hooks.capture.hooked`: ``resid_pre``, ``resid_post`` ``[n_sel, pos, d_model]``
   (``blocks.L.hook_resid_pre`` / ``hook_resid_post``), ``z`` ``[n_sel, pos, n_heads,
   head_dim]`` (``attn.hook_z``), ``result_last`` ``[n_sel, n_heads, d_model]`` (each head's
   output at the last position projected by its slice of ``W_O``, TransformerLens
   ``hook_result``), and with ``patterns`` the full pattern ``[n_sel, n_heads, pos, pos]``
   (``hook_pattern``), computed inside the attention function once per layer: in float32 the
   layer's output is computed FROM it (:func:`pattern_attention`, as eager attention does,
   in place, so no second pass beside SDPA), written into one tensor allocated before the
   forward (no stacked copy: peak memory is the patterns plus the forward's own). A
   half-precision model keeps SDPA's output (so that recording changes no other number) and
   computes each head's pattern beside it.
5. Streaming (:func:`record_stream`, used by ``interp record``): the same forward, but every
   tensor goes to the caller's ``sink`` the moment it is computed and nothing is kept: the full
   pattern of a layer in chunks of query heads (at most :data:`PATTERN_CHUNK_BYTES` of float32
   scores per chunk; in float32 each chunk also gives its heads' output, as in step 4), the
   residual streams and ``attn.hook_z`` through :func:`interp.hooks.capture.hooked` with
   ``stream``. Peak memory is one chunk plus the
   forward's own, whatever the number of layers recorded.
6. Context mass (:func:`context_mass`): of recorded last rows, the attention mass on a span
   (the context), mean over query heads and over a band of layers; the one definition that
   patching, steering and the task-swap sweeps report.

Module paths come from :mod:`interp.models.points` only.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from interp.core.errors import StageError
from interp.core.layers import parse_layers
from interp.core.vocab import BACKEND_OFFERS, check_backend
from interp.hooks.backends import get_backend
from interp.hooks.capture import hooked
from interp.hooks.guard import inference_guard
from interp.hooks.wrappers import attn_implementation
from interp.models.devices import module_weight, stack_cpu
from interp.models.loading import ModelHandle
from interp.models.points import hook_name, hook_site, resolve

__all__ = ["IMPLEMENTATION", "PATTERN_CHUNK_BYTES", "PATTERN_POINT", "Recording",
           "STREAM_POINTS", "Sink", "batch_rows", "context_mass", "full_pattern", "last_row",
           "pattern_attention", "sdpa_forward",
           "record_rows",
           "record_stream", "recording", "register_attention", "register_recorder"]

IMPLEMENTATION = "interp_last_row"
"""Name under which the recording attention function is registered with transformers."""
PATTERN_POINT = "attn.hook_pattern"
"""TransformerLens name of the attention pattern (``blocks.L.attn.hook_pattern``)."""
PATTERN_CHUNK_BYTES = 64 * 2**20
"""Float32 scores of one streamed pattern chunk at most (a chunk holds at least one head)."""

Sink = Callable[[str, int, Tensor], None]
"""Receives ``(hook_name, start, value)`` during :func:`record_stream`: ``value`` is the
slice ``[start : start + len(value)]`` along the first axis of the hook point's tensor
(``[n_heads, pos, pos]`` float32 for ``attn.hook_pattern``, sent in head chunks;
``[pos, d_model]`` / ``[pos, n_heads, head_dim]`` whole, ``start = 0``, in the model's dtype
and on its device for the others). It must copy or write ``value`` before returning."""


@dataclass
class Recording:
    """What one forward pass recorded.

    Attributes:
        rows: last-token attention rows ``[n_layers, n_heads, pos]`` float32 on CPU; every row
            sums to 1.
        acts: activations of ``layers`` keyed ``resid_pre``, ``resid_post``, ``z``,
            ``result_last``, ``pattern`` (module docstring), in the model's dtype on CPU.
        layers: the layers of ``acts`` (ascending).
    """

    rows: Float[Tensor, "layer head pos"]
    acts: dict[str, Tensor] = field(default_factory=dict)
    layers: list[int] = field(default_factory=list)


@dataclass
class _Capture:
    """Filled by the attention function during one recorded forward."""

    pattern_layers: set[int]
    rows: dict[int, Tensor] = field(default_factory=dict)
    pattern: Tensor | None = None  # [n_pattern_layers, n_heads, q, k] float32, preallocated
    pattern_index: dict[int, int] = field(default_factory=dict)  # layer -> row of ``pattern``
    sink: Sink | None = None


_ACTIVE: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("interp_capture",
                                                                         default=None)


def last_row(query: Float[Tensor, "batch head q d"], key: Float[Tensor, "batch kv_head k d"],
             mask: Tensor | None, scaling: float) -> Float[Tensor, "batch head k"]:
    """The exact attention row of the last query position, float32.

    Args:
        query: post-RoPE queries (only the last position is used).
        key: post-RoPE keys; query head ``h`` reads key head ``h // (head / kv_head)``.
        mask: the attention mask the layer got (bool: True = attend; float: additive), or None.
        scaling: the score scale (``head_dim ** -0.5`` for Llama).
    """
    b, n_heads, _, d = query.shape
    n_kv, k_len = key.shape[1], key.shape[2]
    q = query[:, :, -1, :].float().reshape(b, n_kv, n_heads // n_kv, d)
    scores = torch.einsum("bngd,bnkd->bngk", q, key.float()).reshape(b, n_heads, k_len)
    scores = scores * scaling
    if mask is not None:
        m = mask[:, :, -1, :k_len]
        if m.dtype == torch.bool:
            scores = scores.masked_fill(~m, float("-inf"))
        else:
            scores = scores + m.float()
    return torch.softmax(scores, dim=-1)


def full_pattern(query: Float[Tensor, "batch head q d"], key: Float[Tensor, "batch kv_head k d"],
                 mask: Tensor | None, scaling: float) -> Float[Tensor, "batch head q k"]:
    """The full attention pattern, float32 (causal when ``mask`` is None).

    Args:
        query: post-RoPE queries.
        key: post-RoPE keys (GQA as in :func:`last_row`).
        mask: the layer's attention mask (bool or additive), or None for a causal mask.
        scaling: the score scale.
    """
    b, n_heads, q_len, d = query.shape
    n_kv, k_len = key.shape[1], key.shape[2]
    q = query.float().reshape(b, n_kv, n_heads // n_kv, q_len, d)
    scores = torch.einsum("bngqd,bnkd->bngqk", q, key.float()).reshape(b, n_heads, q_len, k_len)
    scores = scores * scaling
    if mask is None:
        causal = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(
            k_len - q_len)
        scores = scores.masked_fill(~causal, float("-inf"))
    elif mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask[..., :k_len], float("-inf"))
    else:
        scores = scores + mask[..., :k_len].float()
    return torch.softmax(scores, dim=-1)


def sdpa_forward(module: Any, query: Tensor, key: Tensor, value: Tensor,
                 attention_mask: Tensor | None, scaling: float | None, dropout: float,
                 kwargs: dict[str, Any]) -> tuple[Tensor, int, float]:
    """The model's own SDPA attention, run first by every attention function registered here.

    Returns:
        The attention output (as transformers' ``sdpa_attention_forward`` gives it), the
        module's layer index and the softmax scale (``scaling``, else ``head_dim ** -0.5``).
    """
    kwargs.pop("output_attentions", None)
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                    scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return out, int(module.layer_idx), scale


_UNFUSED_KWARGS = ("position_bias", "softcap", "s_aux", "sinks")
"""Attention arguments the fused pattern path (:func:`pattern_attention`) does not implement:
a layer that gets one computes its output with SDPA and its pattern beside it."""


def _fusable(module: Any, query: Tensor, dropout: float, kwargs: Mapping[str, Any]) -> bool:
    """Whether a layer's output may come from its float32 pattern (:func:`pattern_attention`).

    Only in float32: there the output differs from SDPA's by float32 rounding (about 1e-6);
    a half-precision model keeps SDPA's output, so that recording a pattern changes no other
    number of the forward, and computes the pattern beside it.
    """
    return (query.dtype == torch.float32 and query.shape[0] == 1
            and not (dropout and module.training)
            and all(kwargs.get(k) is None for k in _UNFUSED_KWARGS))


def pattern_attention(query: Float[Tensor, "1 head q d"], key: Float[Tensor, "1 kv_head k d"],
                      value: Float[Tensor, "1 kv_head k dv"], mask: Tensor | None,
                      scaling: float, emit: Callable[[int, Tensor], None], *,
                      into: Tensor | None = None,
                      chunk_bytes: int | None = None) -> Float[Tensor, "1 q head dv"]:
    """Attention whose output is computed from its full pattern, each head's pattern once.

    The eager algorithm (Vaswani et al. 2017; transformers' ``eager_attention_forward``):
    ``A_h = softmax(q_h K_g^T * scaling + mask)``, ``out_h = A_h V_g`` with query head ``h``
    reading key/value head ``g = h // (n_heads / n_kv_heads)``, in float32 and in place: the
    scores of a chunk of query heads are written into one buffer, scaled, masked and
    softmaxed there, then multiplied by the values and handed to ``emit``. Nothing but the
    chunk is allocated at ``[heads, q, k]`` size, so recording the pattern costs no second pass
    beside the model's own attention and no copy.

    Args:
        query: post-RoPE queries of one prompt (batch 1).
        key: post-RoPE keys (GQA as in :func:`last_row`).
        value: values.
        mask: the layer's attention mask (bool: True = attend; float: additive), or None for a
            causal mask.
        scaling: the score scale.
        emit: called as ``emit(h0, pattern)`` for each chunk, ``pattern`` ``[n, q, k]`` float32
            of query heads ``h0 .. h0 + n - 1``, every row summing to 1. The buffer is reused
            for the next chunk: copy or write it before returning.
        into: ``[n_heads, q, k]`` float32 to fill with the whole pattern (one chunk; no buffer
            of its own) when it lies on the query's device; elsewhere the chunks are computed
            on the query's device and ``emit`` moves them.
        chunk_bytes: at most this many bytes of scores per chunk without ``into`` (at least one
            head; None: :data:`PATTERN_CHUNK_BYTES`, read at call time).

    Returns:
        The attention output ``[1, q, n_heads, dv]`` in the query's dtype (the layout
        transformers' attention functions return).
    """
    n_heads, q_len = query.shape[1], query.shape[2]
    k_len = key.shape[2]
    group = n_heads // key.shape[1]
    dev = query.device
    q, k_t, v = query[0].float(), key[0].float().transpose(-1, -2), value[0].float()
    out = torch.empty(n_heads, q_len, v.shape[-1], dtype=torch.float32, device=dev)
    whole = into is not None and into.device == dev
    budget = PATTERN_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    step = n_heads if whole else max(1, budget // (q_len * k_len * 4))
    step = min(step, n_heads)
    buf = None if whole else torch.empty(step, q_len, k_len, dtype=torch.float32, device=dev)
    if mask is None:
        blocked: Tensor | None = torch.ones(q_len, k_len, dtype=torch.bool, device=dev).triu(
            k_len - q_len + 1)
    elif mask.dtype == torch.bool:
        blocked = ~mask[0, :, :, :k_len]  # [1 or n_heads, q, k]
    else:
        blocked = None
    for h0 in range(0, n_heads, step):
        h1 = min(n_heads, h0 + step)
        a = into[h0:h1] if whole else buf[:h1 - h0]
        for h in range(h0, h1):
            torch.matmul(q[h], k_t[h // group], out=a[h - h0])
        a.mul_(scaling)
        if blocked is not None:
            a.masked_fill_(blocked if blocked.shape[0] == 1 or blocked.ndim == 2
                           else blocked[h0:h1], float("-inf"))
        else:
            add = mask[0, :, :, :k_len]
            a.add_((add if add.shape[0] == 1 else add[h0:h1]).float())
        torch.ops.aten._softmax.out(a, -1, False, out=a)  # in place: the kernel works by row
        for h in range(h0, h1):
            torch.matmul(a[h - h0], v[h // group], out=out[h])
        emit(h0, a)
    return out.transpose(0, 1)[None].contiguous().to(query.dtype)


def _recording_attention(module: Any, query: Tensor, key: Tensor, value: Tensor,
                         attention_mask: Tensor | None, scaling: float | None = None,
                         dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, None]:
    """SDPA attention that also records the last-token row (registered as ``interp_last_row``).

    A layer whose full pattern is asked for computes its output from that pattern instead
    (:func:`pattern_attention`): the pattern is computed once, as eager attention does.
    """
    cap = _ACTIVE.get()
    layer = int(module.layer_idx)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if cap is None or layer not in cap.pattern_layers or not _fusable(module, query, dropout,
                                                                       kwargs):
        out, layer, scale = sdpa_forward(module, query, key, value, attention_mask, scaling,
                                         dropout, kwargs)
        if cap is not None:
            cap.rows[layer] = last_row(query, key, attention_mask, scale)
            if layer in cap.pattern_layers:
                _pattern_beside(cap, layer, query, key, attention_mask, scale)
        return out, None
    cap.rows[layer] = last_row(query, key, attention_mask, scale)
    if cap.sink is not None:
        name, sink = f"blocks.{layer}.{PATTERN_POINT}", cap.sink
        out = pattern_attention(query, key, value, attention_mask, scale,
                                lambda h0, a: sink(name, h0, a))
    else:
        into = cap.pattern[cap.pattern_index[layer]]  # on the CPU; the layer's device may differ

        def emit(h0: int, a: Tensor) -> None:
            if a.device != into.device:
                into[h0:h0 + len(a)].copy_(a)

        out = pattern_attention(query, key, value, attention_mask, scale, emit, into=into)
    return out, None


def _pattern_beside(cap: _Capture, layer: int, query: Tensor, key: Tensor, mask: Tensor | None,
                    scale: float) -> None:
    """The full pattern of a layer whose output SDPA computed (arguments the fused path lacks)."""
    if cap.sink is not None:
        _stream_pattern(cap.sink, layer, query, key, mask, scale)
        return
    into = cap.pattern[cap.pattern_index[layer]]
    for h0 in range(query.shape[1]):  # one head at a time: no [n_heads, q, k] temporary
        into[h0].copy_(full_pattern(query[:, h0:h0 + 1],
                                    key[:, h0 // (query.shape[1] // key.shape[1])][:, None],
                                    mask, scale)[0, 0])


def _stream_pattern(sink: Sink, layer: int, query: Tensor, key: Tensor, mask: Tensor | None,
                    scale: float) -> None:
    """Step 5: the full pattern of one layer, sent to ``sink`` in chunks of query heads."""
    n_heads, q_len, k_len = query.shape[1], query.shape[2], key.shape[2]
    group = n_heads // key.shape[1]
    step = max(1, PATTERN_CHUNK_BYTES // (q_len * k_len * 4))
    name = f"blocks.{layer}.{PATTERN_POINT}"
    for h0 in range(0, n_heads, step):
        heads = torch.arange(h0, min(n_heads, h0 + step), device=key.device)
        sink(name, h0, full_pattern(query[:, heads], key[:, heads // group], mask, scale)[0])


_REGISTERED: set[str] = set()


def register_attention(name: str, fn: Callable[..., Any]) -> str:
    """Register a custom attention function under ``name`` (with the SDPA mask), once.

    The recorder and the steering intervention (:mod:`interp.hooks.steering`) both run as
    transformers ``AttentionInterface`` functions selected by name.

    Returns:
        ``name``.
    """
    if name not in _REGISTERED:
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, sdpa_mask)
        _REGISTERED.add(name)
    return name


def register_recorder() -> str:
    """Register the recording attention function; returns :data:`IMPLEMENTATION`."""
    return register_attention(IMPLEMENTATION, _recording_attention)


@contextlib.contextmanager
def batch_rows(handle: ModelHandle) -> Iterator[Callable[[], Float[Tensor, "batch layer head k"]]]:
    """Record the last-row attention of every prompt of the batched forwards inside it.

    The model runs with the recording attention function (module docstring, step 2) for the
    duration; the forward inside may be left-padded (a padded key gets probability exactly 0,
    the real keys sum to 1). Used by the harness's one-pass prefill
    (:mod:`interp.judging.prefill`), which cuts each prompt's padding off.

    Yields:
        A function returning the rows of the LAST forward run inside the context,
        ``[batch, n_layers, n_heads, key_len]`` float32 on the CPU (the layers of a
        device-mapped model may compute on several devices, :mod:`interp.models.devices`).

    Raises:
        StageError: (from the returned function) a layer saw no attention call.
    """
    cap = _Capture(pattern_layers=set())
    token = _ACTIVE.set(cap)

    def rows() -> Tensor:
        if missing := [x for x in range(handle.n_layers) if x not in cap.rows]:
            raise StageError("attention",
                             f"the recorder saw no attention call in layers {missing}: "
                             f"{type(handle.model).__name__} does not use "
                             f"AttentionInterface")
        return stack_cpu([cap.rows[x] for x in range(handle.n_layers)], dim=1)

    try:
        with attn_implementation(handle, register_recorder()):
            yield rows
    finally:
        _ACTIVE.reset(token)


def _as_ids(input_ids: Sequence[int] | Tensor, device: torch.device) -> Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.ndim != 1 or ids.numel() == 0:
        raise StageError("attention",
                         f"input_ids must be one non-empty sequence, got shape "
                         f"{tuple(ids.shape)}")
    return ids[None].to(device)


def _act_names(layer: int) -> dict[str, str]:
    return {k: hook_name(layer, p) for k, p in
            (("resid_pre", "hook_resid_pre"), ("resid_post", "hook_resid_post"),
             ("z", "attn.hook_z"))}


def _forward(handle: ModelHandle, ids: Tensor, cap: _Capture, names: Sequence[str],
             stream: Callable[[str, Tensor], None] | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
    """One recorded forward: last rows ``[n_layers, n_heads, pos]`` and the hooked store."""
    model = handle.model
    token = _ACTIVE.set(cap)
    try:
        with attn_implementation(handle, register_recorder()), \
                hooked(model, cache=names, stream=stream) as store:
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
    finally:
        _ACTIVE.reset(token)
    missing = [layer for layer in range(handle.n_layers) if layer not in cap.rows]
    if missing:
        raise StageError("attention",
                         f"the recorder saw no attention call in layers {missing}: "
                         f"{type(model).__name__} does not use AttentionInterface")
    return stack_cpu([cap.rows[layer][0] for layer in range(handle.n_layers)]), store


def _record_hf(handle: ModelHandle, ids: Tensor, layers: list[int],
               patterns: bool) -> Recording:
    """Step 2 and 4 of the module algorithm (one forward)."""
    model = handle.model
    cap = _Capture(pattern_layers=set(layers) if patterns else set())
    if patterns and layers:  # one tensor, filled layer by layer: no stacked second copy
        n = ids.shape[1]
        cap.pattern = torch.empty(len(layers), handle.n_heads, n, n, dtype=torch.float32)
        cap.pattern_index = {x: i for i, x in enumerate(layers)}
    # each activation copied once, as it is computed, into one CPU tensor per kind (no clone
    # kept per hook point and stacked after: that was a second copy of every residual stream)
    where = {_act_names(x)[k]: (k, i) for i, x in enumerate(layers)
             for k in ("resid_pre", "resid_post", "z")}
    bufs: dict[str, Tensor] = {}

    def put(name: str, value: Tensor) -> None:
        key, i = where[name]
        if key not in bufs:
            bufs[key] = torch.empty((len(layers), *value.shape[1:]), dtype=value.dtype)
        bufs[key][i].copy_(value[0])

    rows, _ = _forward(handle, ids, cap, list(where), stream=put if layers else None)
    acts: dict[str, Tensor] = {}
    if layers:
        res = []
        for i, x in enumerate(layers):  # on the layer's own device (a device map may spread)
            w_o = module_weight(resolve(model, hook_name(x, "attn.hook_z"))[0])  # [d_model, H*d]
            z_last = bufs["z"][i, -1].to(w_o.device)  # [n_heads, head_dim]
            n_h, d_h = z_last.shape
            res.append(torch.einsum("hd,mhd->hm", z_last, w_o.view(-1, n_h, d_h).to(z_last)))
        acts.update(bufs)
        acts["result_last"] = stack_cpu(res)
        if patterns:
            acts["pattern"] = cap.pattern
    return Recording(rows=rows.float().cpu(), acts={k: v.cpu() for k, v in acts.items()},
                     layers=layers)


@torch.no_grad()
def context_mass(rows: Mapping[int, Tensor] | Tensor, band: Sequence[int],
                 span: tuple[int, int], positions: Sequence[int] | None = None
                 ) -> np.ndarray:
    """Last-row attention mass on ``span``, mean over query heads and the layers of ``band``.

    ``mean_{L in band} mean_h sum_{k in [start, end)} A_L[..., h, k]`` (paper section 3.2: the
    context mass of the verdict position), each layer's mean over heads taken in the rows'
    dtype, the mean over layers in float64.

    Args:
        rows: layer -> last rows ``[..., n_heads, pos]``: a mapping such as
            :attr:`interp.hooks.steering.Steer.rows` (``[batch, n_heads, pos]``) or a tensor
            ``[n_layers, n_heads, pos]`` of :func:`record_rows`.
        band: the layers averaged.
        span: ``(start, end)`` key positions, end exclusive.
        positions: the key positions one by one instead of the span.

    Returns:
        float64 array of the leading shape ``[...]`` (``[batch]``; 0-d for one prompt).
    """
    if positions is None:
        per_layer = [rows[layer][..., span[0]:span[1]].sum(-1).mean(-1).double().cpu()
                     for layer in band]
    else:  # the steering control's keys (interp.hooks.steering.control_keys)
        idx = torch.tensor(list(positions), dtype=torch.long)
        per_layer = [rows[layer][..., idx.to(rows[layer].device)].sum(-1).mean(-1).double()
                     .cpu() for layer in band]
    return torch.stack(per_layer).mean(0).numpy()


def record_rows(handle: ModelHandle, input_ids: Sequence[int] | Int[Tensor, " pos"], *,
                backend: str = "hf", attn: str | None = None, act_layers: Sequence[int] = (),
                patterns: bool = False) -> Recording:
    """Record the last-token attention row of every layer and query head for one prompt.

    Args:
        handle: the model (any device/dtype; rows come back float32 on CPU).
        input_ids: token ids ``[pos]``, fed exactly (no BOS added by any backend).
        backend: one of :data:`interp.hooks.backends.BACKENDS` (module docstring, steps 2-3):
            ``hf`` records with the exact recorder, the others (their ``patterns``) check it.
        attn: ``eager``: the ``hf`` backend's check path instead, eager attention's
            ``output_attentions`` (None: the exact recorder).
        act_layers: layers whose residual streams / per-head outputs to keep (the exact
            recorder only).
        patterns: also keep full patterns ``[n_heads, pos, pos]`` of ``act_layers``.

    Returns:
        A :class:`Recording`; ``rows`` ``[n_layers, n_heads, pos]`` float32.

    The model runs in eval mode (:func:`interp.hooks.guard.inference_guard`); every argument
    is checked before any hook is registered or kernel swapped, and whatever raises, the model
    is left with the hooks, attention kernel and training flags it had.

    Raises:
        StageError: an unknown backend (``eager``: names ``backend="hf", attn="eager"``),
            an ``attn`` other than ``eager`` or with a backend other than ``hf``, activations
            requested from another path than the exact recorder, or a model whose attention
            does not go through ``AttentionInterface``.
        interp.core.errors.LayerSpecError: an ``act_layers`` entry outside the model (names the
            valid range).
        interp.core.errors.ModelSpecError: query heads not a multiple of key/value heads.
        interp.core.errors.BackendError: an architecture the ``nnsight`` / ``transformer_lens``
            backend cannot wrap (names the supported ones).
    """
    check_backend(backend, StageError.of("attention"), attn=attn)
    if attn not in (None, "eager"):
        raise StageError("attention",
                         f"attn={attn!r}: the recorder's check path is attn='eager' "
                         "(output_attentions); leave attn out for the exact recorder")
    exact = attn is None and "exact_rows" in BACKEND_OFFERS[backend]
    if act_layers and not exact:
        raise StageError("attention",
                         "residual streams / head outputs are recorded by the exact "
                         f"recorder only (backend='hf' without attn), not backend="
                         f"{backend!r}{f', attn={attn!r}' if attn else ''}")
    layers = parse_layers(list(act_layers), handle.n_layers) if len(act_layers) else []
    ids = _as_ids(input_ids, handle.device)
    with inference_guard(handle.model):
        if exact:
            return _record_hf(handle, ids, layers, patterns)
        # the check paths: a library's attention weights (an unsupported architecture fails)
        pats = get_backend(handle, backend, attn=attn).patterns(ids, range(handle.n_layers))
        rows = torch.stack([pats[x][0, :, -1, :] for x in range(handle.n_layers)])
        return Recording(rows=rows.float().cpu())


STREAM_POINTS = ("hook_resid_pre", "attn.hook_z", "hook_resid_post")
"""Hook points :func:`record_stream` can send besides ``attn.hook_pattern``."""


@torch.no_grad()
def record_stream(handle: ModelHandle, input_ids: Sequence[int] | Int[Tensor, " pos"], sink: Sink,
                  *, layers: Sequence[int], patterns: bool = True,
                  points: Sequence[str] = STREAM_POINTS) -> Float[Tensor, "layer head pos"]:
    """Record one prompt, sending full patterns and activations of ``layers`` to ``sink``.

    Step 5 of the module algorithm: one forward (batch 1, no padding, no KV cache); nothing
    but the last-token rows is kept, so memory does not grow with ``len(layers)``.

    Args:
        handle: the model (any device/dtype).
        input_ids: token ids ``[pos]``, fed exactly.
        sink: receives every tensor as it is computed (:data:`Sink`), in execution order
            (layer by layer: ``hook_resid_pre``, pattern chunks, ``attn.hook_z``,
            ``hook_resid_post``).
        layers: the layers to send.
        patterns: send ``blocks.L.attn.hook_pattern`` ``[n_heads, pos, pos]`` (float32, every
            row sums to 1; the same numbers as :func:`full_pattern`).
        points: hook points of :data:`STREAM_POINTS` to send (``[pos, d_model]`` residuals,
            ``[pos, n_heads, head_dim]`` for ``attn.hook_z``).

    Returns:
        The last-token rows ``[n_layers, n_heads, pos]`` float32 on CPU (as
        :func:`record_rows`).

    Raises:
        StageError: a point outside :data:`STREAM_POINTS`, or a model whose attention does
            not go through ``AttentionInterface``.
        interp.core.errors.HookError: a layer outside the model.
    """
    if bad := set(points) - set(STREAM_POINTS):
        raise StageError("attention",
                         f"record_stream cannot send {sorted(bad)}; use points of "
                         f"{list(STREAM_POINTS)}")
    # a layer outside the model fails before the forward; negative layers count from the end
    layers = sorted({hook_site(handle.model, hook_name(x, "hook_resid_pre")).layer
                     for x in layers})
    ids = _as_ids(input_ids, handle.device)
    names = [hook_name(x, p) for x in layers for p in points]
    cap = _Capture(pattern_layers=set(layers) if patterns else set(), sink=sink)
    with inference_guard(handle.model):
        rows, _ = _forward(handle, ids, cap, names, stream=lambda n, v: sink(n, 0, v[0]))
    return rows.float().cpu()


@contextlib.contextmanager
def recording(handle: ModelHandle, pattern_layers: Sequence[int] = (), n_pos: int = 0
              ) -> Iterator[_Capture]:
    """Run every forward inside with the recording attention function (module docstring).

    The forward must be ONE prompt (batch 1, no padding). After it, the yielded capture holds
    ``rows[layer]`` ``[1, n_heads, pos]`` (the last position's exact attention rows, float32)
    for every layer, and ``pattern[pattern_index[layer]]`` ``[n_heads, pos, pos]`` (float32,
    one tensor allocated before the forward, each layer's pattern computed once) for each
    layer of ``pattern_layers``; ``n_pos`` is the prompt's length. Used by
    :meth:`interp.hooks.model.HookedModel.run_with_cache`.

    Raises:
        StageError: (on exit) a layer saw no attention call: a model whose attention does
            not go through ``AttentionInterface``.
    """
    layers = sorted(set(pattern_layers))
    cap = _Capture(pattern_layers=set(layers))
    if layers:
        cap.pattern = torch.empty(len(layers), handle.n_heads, n_pos, n_pos, dtype=torch.float32)
        cap.pattern_index = {x: i for i, x in enumerate(layers)}
    token = _ACTIVE.set(cap)
    try:
        with attn_implementation(handle, register_recorder()):
            yield cap
    finally:
        _ACTIVE.reset(token)
    if missing := [x for x in range(handle.n_layers) if x not in cap.rows]:
        raise StageError("attention",
                         f"the recorder saw no attention call in layers {missing}: "
                         f"{type(handle.model).__name__} does not use AttentionInterface")
