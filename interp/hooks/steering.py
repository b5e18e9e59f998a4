"""Attention steering: scale the attention the last query position pays to a span of keys.

The causal test of the mechanism of paper section 3.2 (docs/stages.md, steer): the judge's verdict
position reads the context less than the generator's answer position does; multiply that
reading by ``alpha`` and see what the verdict does.

Algorithm (:func:`steering`, :meth:`Steer.score_hooks`; the backends run them:
:meth:`interp.hooks.backends.HFBackend.steered_score`,
:meth:`interp.hooks.backends.TLBackend.steered_score`):

1. A :class:`Steer` names the steered layers (and per layer the query heads, or all), the
   steered keys (the span ``[start, end)``, e.g. the prompt's context, or instead a list of
   key positions such as the non-context control of :func:`control_keys`), and one
   ``alpha > 0`` per batch row.
2. ``hf`` (the reference): inside the context manager every attention call goes through
   ``interp_steer``, a function registered with transformers' ``AttentionInterface`` (and
   SDPA's mask function), in the same way as the last-row recorder
   (:mod:`interp.hooks.recorder`). It first runs SDPA exactly as the model's own kernel does.
   Then, for the LAST query position of the forward (the verdict position when the forward
   ends at the prompt's end; every new token while generating), it computes that row as the
   recorder does (:func:`interp.hooks.recorder.last_row`: post-RoPE query times every key,
   GQA groups expanded, the layer's mask) with ``log(alpha)`` added to the pre-softmax scores
   of the span's keys for the steered heads; the softmax renormalises, so the span's mass
   becomes ``alpha m / (alpha m + 1 - m)`` from ``m``. The output of that position is
   ``row @ V`` (float32, cast back) for the (row, head) pairs whose bias is not zero; every
   other output is SDPA's, bit for bit, so ``alpha = 1`` reproduces the unsteered forward
   exactly. With ``keep_rows``, the (steered) last row of EVERY layer is kept
   (:attr:`Steer.rows`): the attention actually reached.
3. ``transformer_lens`` (the check): TransformerBridge runs its own eager attention; a hook on
   ``blocks.L.attn.hook_attn_scores`` (pre-softmax scores ``[batch, head, query, key]``) adds
   the same ``log(alpha)`` at one query position (the verdict position) and the span's keys.
   The two agree to 1e-4 (tests/equivalence).

Source: attention steering as in PASTA (Zhang et al. 2024, "Tell your model where to attend",
which scales attention on emphasised spans in chosen heads); here the bias is ``log(alpha)``
added before the softmax, on the last query row only.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from interp.core.errors import StageError
from interp.hooks.recorder import last_row, register_attention, sdpa_forward
from interp.hooks.wrappers import attn_implementation
from interp.models.loading import ModelHandle

__all__ = ["IMPLEMENTATION", "Steer", "control_keys", "key_mask", "register_steering", "steering"]


def key_mask(span: tuple[int, int], n_keys: int, positions: Sequence[int] | None = None,
             device: torch.device | str = "cpu") -> Float[Tensor, " key"]:
    """``[n_keys]`` float32: 1 on the steered keys below ``n_keys``, 0 elsewhere.

    Args:
        span: ``(start, end)``, end exclusive (used when ``positions`` is None).
        n_keys: keys of the forward (positions at or past it are dropped).
        positions: the steered key positions one by one instead of the span.
        device: where the mask lives.
    """
    m = torch.zeros(n_keys, dtype=torch.float32, device=device)
    if positions is None:
        m[span[0]:min(span[1], n_keys)] = 1.0
    else:
        idx = [k for k in positions if 0 <= k < n_keys]
        m[torch.tensor(idx, dtype=torch.long, device=device)] = 1.0
    return m


def control_keys(n_prompt: int, context: tuple[int, int]) -> list[int]:
    """The non-context control of steering: as many non-context keys as the context has.

    The candidates are the prompt's positions outside ``[start, end)`` except the first (the
    BOS / attention-sink position, whose mass dwarfs every other key's) and the last (the
    steered query itself): the template, the question and, for the judge, the candidate
    answer. When there are more of them than context tokens, ``end - start`` of them evenly
    spaced over the candidates are taken (deterministic); when fewer, all of them (the stage
    reports the count per record). Steering these by the same ``alpha`` separates "more
    attention on the CONTEXT changes the verdict" from "any shift of attention changes it".

    Args:
        n_prompt: prompt length in tokens.
        context: the context span ``[start, end)``.

    Returns:
        Sorted key positions (possibly fewer than ``end - start``).

    Raises:
        StageError: the context span is empty or outside the prompt.
    """
    s, e = context
    if not 0 <= s < e <= n_prompt:
        raise StageError("steering",
                         f"the context span {tuple(context)} must be inside a prompt of "
                         f"{n_prompt} tokens")
    cand = [k for k in range(1, n_prompt - 1) if not s <= k < e]
    if len(cand) <= e - s:
        return cand
    pick = sorted({round(i * (len(cand) - 1) / max(e - s - 1, 1)) for i in range(e - s)})
    return [cand[i] for i in pick]

IMPLEMENTATION = "interp_steer"
"""Name under which the steering attention function is registered with transformers."""


@dataclass
class Steer:
    """One steering intervention (module docstring, step 1).

    Attributes:
        units: steered layer -> query heads (None: every head of that layer).
        keys: the key span ``[start, end)`` whose scores get ``log(alpha)``.
        alphas: one factor per batch row, ``[batch]``, each > 0.
        keep_rows: keep the (steered) last row of every layer in :attr:`rows`.
        positions: the steered key positions one by one instead of ``keys`` (the control
            of :func:`control_keys`); None: the span.
        rows: filled during a forward: layer -> ``[batch, n_heads, n_keys]`` float32.
    """

    units: Mapping[int, Sequence[int] | None]
    keys: tuple[int, int]
    alphas: Sequence[float]
    keep_rows: bool = True
    positions: Sequence[int] | None = None
    rows: dict[int, Tensor] = field(default_factory=dict)

    def check(self, handle: ModelHandle) -> None:
        """Refuse bad layers, heads, spans and alphas before any forward.

        Raises:
            StageError: alphas not finite and > 0, layers or heads outside the model, an
                empty span or bad key positions.
        """
        _check(handle, self)

    def attention(self, handle: ModelHandle) -> contextlib.AbstractContextManager[Steer]:
        """The ``hf`` way (module step 2): :func:`steering` of ``handle`` with this intervention."""
        return steering(handle, self)

    def score_hooks(self, handle: ModelHandle, query: int
                    ) -> list[tuple[str, Callable[[Tensor, Any], Tensor]]]:
        """The ``transformer_lens`` way (module step 3): forward hooks on the bridge's scores.

        Each hook adds ``log(alpha)`` (one alpha per batch row) to the pre-softmax scores
        ``blocks.L.attn.hook_attn_scores`` ``[batch, head, query, key]`` of the steered heads
        at query position ``query`` and the steered keys (``keep_rows`` does not apply: no
        rows are kept).

        Args:
            handle: the model (its layers and heads check the intervention).
            query: the steered query position (the verdict position, ``n - 1`` of the prompt).

        Returns:
            ``[(hook name, hook fn)]`` for TransformerLens ``run_with_hooks(fwd_hooks=...)``.

        Raises:
            StageError: as :meth:`check`, or ``query`` < 0.
        """
        _check(handle, self)
        if query < 0:
            raise StageError("steering", f"query position {query} outside the prompt")

        def mk(layer: int) -> Callable[[Tensor, Any], Tensor]:
            heads = self.units[layer]

            def fn(scores: Tensor, hook: Any) -> Tensor:
                la = self.log_alpha(scores.device)
                hs = list(range(scores.shape[1])) if heads is None else list(heads)
                m = key_mask(self.keys, scores.shape[-1], self.positions, scores.device)
                scores = scores.clone()
                scores[:, hs, query, :] += (la[:, None, None] * m).to(scores.dtype)
                return scores
            return fn

        return [(f"blocks.{layer}.attn.hook_attn_scores", mk(layer)) for layer in self.units]

    def log_alpha(self, device: torch.device) -> Float[Tensor, " batch"]:
        """``log(alpha)`` per row (float32)."""
        return torch.tensor([math.log(a) for a in self.alphas], dtype=torch.float32,
                            device=device)

    def bias(self, layer: int, batch: int, n_heads: int, n_keys: int,
             device: torch.device) -> Float[Tensor, "batch head key"] | None:
        """The additive score bias of ``layer`` (None when the layer is not steered)."""
        if layer not in self.units:
            return None
        if batch != len(self.alphas):
            raise StageError("steering",
                             f"the forward has {batch} rows but {len(self.alphas)} alphas")
        out = torch.zeros(batch, n_heads, n_keys, dtype=torch.float32, device=device)
        heads = self.units[layer]
        hs = list(range(n_heads)) if heads is None else list(heads)
        m = key_mask(self.keys, n_keys, self.positions, device)
        out[:, hs, :] = self.log_alpha(device)[:, None, None] * m
        return out


_ACTIVE: contextvars.ContextVar[Steer | None] = contextvars.ContextVar("interp_steer",
                                                                       default=None)


def _additive(mask: Tensor | None, n_keys: int) -> Tensor | float:
    """The layer's mask for the last query row as an additive float tensor ``[b, 1|h, 1, k]``."""
    if mask is None:
        return 0.0
    m = mask[:, :, -1:, :n_keys]
    if m.dtype == torch.bool:
        return torch.zeros(m.shape, dtype=torch.float32, device=m.device).masked_fill(
            ~m, float("-inf"))
    return m.float()


def _steering_attention(module: Any, query: Tensor, key: Tensor, value: Tensor,
                        attention_mask: Tensor | None, scaling: float | None = None,
                        dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, None]:
    """SDPA, then the steered last query row (module docstring, step 2)."""
    out, layer, scale = sdpa_forward(module, query, key, value, attention_mask, scaling, dropout,
                                     kwargs)
    st = _ACTIVE.get()
    if st is None:
        return out, None
    b, n_heads, _, _ = query.shape
    n_keys = key.shape[2]
    bias = st.bias(layer, b, n_heads, n_keys, query.device)
    if bias is None and not st.keep_rows:
        return out, None
    add = _additive(attention_mask, n_keys)
    if bias is not None:
        add = add + bias[:, :, None, :]
    row = last_row(query, key, add if torch.is_tensor(add) else None, scale)  # [b, h, k]
    if st.keep_rows:
        st.rows[layer] = row.detach()
    if bias is not None:
        apply = (bias != 0).any(-1)  # [b, h]
        if bool(apply.any()):
            v = value.float().repeat_interleave(n_heads // value.shape[1], dim=1)
            o = torch.einsum("bhk,bhkd->bhd", row, v).to(out.dtype)
            out = out.clone()
            out[:, -1] = torch.where(apply[..., None], o, out[:, -1])
    return out, None


def register_steering() -> str:
    """Register the steering attention function; returns :data:`IMPLEMENTATION`."""
    return register_attention(IMPLEMENTATION, _steering_attention)


def _check(handle: ModelHandle, st: Steer) -> None:
    """Refuse bad layers, heads, spans and alphas before any forward."""
    if not st.alphas or any(not (a > 0 and math.isfinite(a)) for a in st.alphas):
        raise StageError("steering",
                         f"every alpha must be a finite number > 0, got {list(st.alphas)}")
    bad = [x for x in st.units if not 0 <= x < handle.n_layers]
    if bad:
        raise StageError("steering",
                         f"steered layers {bad} out of range; valid: 0..{handle.n_layers - 1}")
    for layer, heads in st.units.items():
        if heads is not None and (not heads or any(not 0 <= h < handle.n_heads for h in heads)):
            raise StageError("steering",
                             f"layer {layer}: heads {list(heads)} out of range; valid: "
                             f"0..{handle.n_heads - 1}")
    s, e = st.keys
    if not 0 <= s < e:
        raise StageError("steering",
                         f"the steered key span must be [start, end) with 0 <= start < end, "
                         f"got {st.keys}")
    if st.positions is not None and (not st.positions or min(st.positions) < 0):
        raise StageError("steering",
                         f"the steered key positions must be a non-empty list of positions "
                         f">= 0, got {list(st.positions)[:8]}")


@contextlib.contextmanager
def steering(handle: ModelHandle, st: Steer) -> Iterator[Steer]:
    """Run ``handle.model`` with the steering attention of ``st`` (module docstring, step 2).

    Example:
        >>> st = Steer(units={l: None for l in range(22, 30)}, keys=(5, 120), alphas=[0.5, 2])
        >>> with steering(handle, st):
        ...     out = handle.model(input_ids=ids.expand(2, -1), use_cache=False)
        >>> st.rows[29][:, :, 5:120].sum(-1)   # context mass reached, [2, n_heads]

    Args:
        handle: the model (its attention goes through ``AttentionInterface``).
        st: the intervention; ``st.rows`` is filled by each forward inside.

    Yields:
        ``st``.

    Raises:
        StageError: alphas not > 0, layers or heads outside the model, an empty span.
    """
    _check(handle, st)
    token = _ACTIVE.set(st)
    try:
        with attn_implementation(handle, register_steering()):
            yield st
    finally:
        _ACTIVE.reset(token)
