"""Residual-stream features of rendered prompts: ``resid_post`` of every layer, pooled.

Steps 2-3 of :mod:`interp.methods.probing` (the probes fit these features):

1. :func:`residual_stream`: one forward pass per prompt (or left-padded batches, position ids
   ``cumsum(mask) - 1``), hook point ``resid_post`` of every layer L (TransformerLens
   ``blocks.L.hook_resid_post``: the output of decoder layer L, before the final norm), read
   with forward hooks (:func:`interp.hooks.capture.hooked`). Not transformers'
   ``hidden_states``: its LAST entry is after the final RMSNorm, not ``resid_post`` of the last
   layer.
2. :func:`pool_resid`: pools per layer over the prompt's real positions only (padding never
   enters a pool): ``last``, ``candidate`` (mean over the candidate span; an empty candidate
   falls back to ``last``), ``mean``, ``max`` and ``min`` (per dimension).
3. :func:`extract_features`: both for a list of rendered prompts, in left-padded batches. The
   one-pass harness pools inside its own prefill (:mod:`interp.judging.prefill`) with the same
   :func:`pool_resid`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.core.errors import Interrupted, StageError
from interp.core.progress import tqdm
from interp.core.vocab import POOLS
from interp.hooks.model import HookedModel
from interp.judging.prompts import RenderedPrompt
from interp.models.devices import stack_cpu
from interp.models.kv_cache import left_pad, pad_token_id, position_ids
from interp.models.loading import ModelHandle
from interp.models.points import hook_name

__all__ = ["HOOK_POINT", "HOOK_POINT_DOC", "POOLS", "extract_features", "pool_resid",
           "residual_stream", "task_pools"]

HOOK_POINT = "resid_post"
HOOK_POINT_DOC = ("resid_post (TransformerLens blocks.L.hook_resid_post): output of decoder "
                  "layer L before the final norm, read with a forward hook on every decoder "
                  "layer (transformers' hidden_states[-1] is after the final norm)")


@torch.inference_mode()
def residual_stream(handle: ModelHandle, input_ids: Int[Tensor, "batch seq"],
                    attention_mask: Int[Tensor, "batch seq"] | None = None
                    ) -> Float[Tensor, "batch layer seq d_model"]:
    """``resid_post`` of every layer for a (left-padded) batch.

    Args:
        handle: the model.
        input_ids: ``[batch, seq]`` token ids (left padding).
        attention_mask: ``[batch, seq]``, 1 for real tokens (None: all real).

    Returns:
        ``[batch, n_layers, seq, d_model]`` float32 on CPU; entry ``[:, L]`` is the output of
        decoder layer L (module docstring, step 2). Padded positions hold garbage. The forward
        runs in eval mode (:func:`interp.hooks.guard.inference_guard`, inside
        :func:`interp.hooks.capture.hooked`); the caller's training flags come back after.

    Raises:
        StageError: ids that are not ``[batch, seq]`` or a mask of another shape (before any
            hook is registered).
    """
    dev = handle.device
    if input_ids.dim() != 2 or (attention_mask is not None
                                and tuple(attention_mask.shape) != tuple(input_ids.shape)):
        raise StageError("probe",
                         f"input_ids must be [batch, seq] and attention_mask the same shape, got "
                         f"{list(input_ids.shape)} and "
                         f"{None if attention_mask is None else list(attention_mask.shape)}")
    input_ids = input_ids.to(dev)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = attention_mask.to(dev)
    names = [hook_name(layer, "hook_resid_post") for layer in range(handle.n_layers)]
    with HookedModel(handle).hooks(cache=names) as acts:
        handle.model(input_ids=input_ids, attention_mask=attention_mask,
                     position_ids=position_ids(attention_mask), use_cache=False, logits_to_keep=1)
    return stack_cpu([acts[n] for n in names], dim=1).float()  # layers may sit apart


def pool_resid(resid: Float[Tensor, "layer seq d_model"], candidate: Sequence[int] | None,
               pools: Sequence[str]) -> tuple[dict[str, Float[Tensor, "layer d_model"]], bool]:
    """Pool one prompt's residual stream (real positions only).

    Args:
        resid: ``[n_layers, seq, d_model]`` of ONE prompt without padding.
        candidate: ``(start, end)`` token span of the candidate (end exclusive), or None.
        pools: names from :data:`POOLS`.

    Returns:
        ``({pool: [n_layers, d_model]}, fell_back)``; ``fell_back`` is True when the candidate
        pool was asked for without a candidate span and the last position was used.

    Raises:
        StageError: an unknown pool.
    """
    out: dict[str, Tensor] = {}
    fell_back = False
    for p in pools:
        if p == "last":
            out[p] = resid[:, -1]
        elif p == "mean":
            out[p] = resid.mean(1)
        elif p == "max":
            out[p] = resid.amax(1)
        elif p == "min":
            out[p] = resid.amin(1)
        elif p == "candidate":
            if candidate is None or candidate[1] <= candidate[0]:
                out[p] = resid[:, -1]
                fell_back = True
            else:
                out[p] = resid[:, candidate[0]:candidate[1]].mean(1)
        else:
            raise StageError("probe", f"unknown pool {p!r}; known: {list(POOLS)}")
    return out, fell_back


def task_pools(task: str, pools: Sequence[str]) -> list[str]:
    """The pools that apply to a task (the gen prompt has no candidate)."""
    return [p for p in pools if not (task == "gen" and p == "candidate")]


def extract_features(handle: ModelHandle, prompts: Sequence[RenderedPrompt], *,
                     pools: Sequence[str] = POOLS, batch_size: int = 4, progress: bool = False
                     ) -> tuple[dict[str, Float[Tensor, "n layer d_model"]], list[bool]]:
    """Pooled ``resid_post`` features of rendered prompts (left-padded batches).

    Args:
        handle: the model.
        prompts: rendered prompts (``token_spans`` give the candidate span).
        pools: pool names.
        batch_size: prompts per forward; 1 runs one prompt at a time.
        progress: show a tqdm bar.

    Returns:
        ``({pool: [n_prompts, n_layers, d_model] float32}, fell_back per prompt)``. Left padding
        is cut off before pooling, so a padded batch gives the same features as one prompt at a
        time (to float tolerance).

    Raises:
        interp.core.errors.Interrupted: a Ctrl-C (or SIGTERM); its ``done`` is ``(indices,
            features, fell_back)`` of the prompts whose batch finished before it (indices
            ascending; features ``{pool: [len(indices), n_layers, d_model]}``, None when no
            batch finished).
    """
    pad_id = pad_token_id(handle.tokenizer)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    feats: dict[str, list[Tensor | None]] = {p: [None] * len(prompts) for p in pools}
    fell = [False] * len(prompts)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if progress:
        batches = tqdm(batches, desc="residual stream", unit="batch")
    finished: list[int] = []
    try:
        for idx in batches:
            ids, mask = left_pad([prompts[i].input_ids for i in idx], pad_id)
            resid = residual_stream(handle, ids, mask)
            width = ids.shape[1]
            for row, i in enumerate(idx):
                n = len(prompts[i])
                pooled, fb = pool_resid(resid[row, :, width - n:], prompts[i].token_spans.get(
                    "candidate"), pools)
                fell[i] = fb
                for p, v in pooled.items():
                    feats[p][i] = v.clone()
            finished.extend(idx)
    except KeyboardInterrupt as exc:  # the prompts of the finished batches, in input order
        done = sorted(finished)
        raise Interrupted((done, {p: torch.stack([v[i] for i in done]) if done else None
                                  for p, v in feats.items()},
                           [fell[i] for i in done])) from exc
    return {p: torch.stack(v) for p, v in feats.items()}, fell  # type: ignore[arg-type]
