"""Left-padded batches and the key/value cache: the helpers every forward pass shares.

A batch of prompts is left-padded (:func:`left_pad`): the attention mask zeroes the pads and the
position ids are ``cumsum(mask) - 1`` (:func:`position_ids`), so a padded prompt sees exactly the
positions it sees alone (transformers' ``generate`` derives them from the mask the same way). A
prefilled batch's key/value cache is extended by a continuation and cropped back afterwards
(:func:`continuation_logprobs`), under the keyword the installed transformers takes
(:func:`cache_kwarg`). This module imports nothing of ``interp``: generation, verdict scoring,
the one-pass prefill, probes, steering, transfer and the hook backends all build on it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.models.points import base_model

__all__ = ["cache_kwarg", "continuation_logprobs", "crop_cache", "left_pad", "output_cache",
           "pad_token_id", "position_ids"]


def left_pad(batch: Sequence[Sequence[int]], pad_id: int,
             device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token id lists.

    Returns:
        ``input_ids [batch, max_len]`` and ``attention_mask [batch, max_len]`` (1 = real token).
    """
    width = max(len(x) for x in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, x in enumerate(batch):
        ids[i, width - len(x):] = torch.tensor(list(x), dtype=torch.long)
        mask[i, width - len(x):] = 1
    return ids.to(device), mask.to(device)


def pad_token_id(tokenizer: Any) -> int:
    """The id that left-pads a batch: the tokenizer's pad token, else its EOS token.

    The pads are masked out (:func:`left_pad`), so which id fills them does not change a number.
    """
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def position_ids(attention_mask: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
    """Position ids of a left-padded batch: ``cumsum(mask) - 1``, the pads at 0.

    A padded prompt thus sees the positions it sees alone (transformers' ``generate`` derives
    them from the mask the same way).
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def cache_kwarg(model: Any) -> str:
    """The keyword under which ``model.forward`` takes a key/value cache.

    transformers 5.x renamed ``past_key_values`` to ``cache``; both are supported so that the
    same code runs on the versions a GPU machine may have. A peft ``PeftModel`` takes
    ``**kwargs`` and passes them to its base model, so the base model's signature decides
    (else every adapter forward would pass the deprecated name).
    """
    params = inspect.signature(base_model(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(out: Any) -> Any:
    """The key/value cache of a model output (``cache`` or ``past_key_values``)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def crop_cache(cache: Any, n_remove: int) -> None:
    """Remove the last ``n_remove`` positions from a transformers cache, in place.

    Handles both the current API (``crop(-n)``: remove ``n`` tokens) and the older one
    (``crop(max_length)``).
    """
    if n_remove <= 0:
        return
    try:
        cache.crop(-n_remove)
    except ValueError:  # older transformers: crop(max_length)
        cache.crop(cache.get_seq_length() - n_remove)


@torch.no_grad()
def continuation_logprobs(
    model: Any,
    last_logits: Float[Tensor, "batch vocab"],
    cache: Any,
    attention_mask: Int[Tensor, "batch pos"],
    continuations: Sequence[Sequence[int]],
) -> Float[Tensor, "batch n_cont"]:
    """``log P(continuation | prompt)`` for each prompt of a prefilled batch (steps 2-3).

    Args:
        model: the causal LM that produced ``cache``.
        last_logits: logits at the last prompt position (float32 recommended).
        cache: the prompt batch's key/value cache (a transformers ``Cache``); it is cropped
            back to the prompt length after each continuation, so the caller can keep using it.
        attention_mask: the prompt batch's mask (left padding: 1 = real token).
        continuations: token-id lists, the same for every prompt, each non-empty.

    Returns:
        Summed token log-probabilities ``[batch, len(continuations)]``, float32 (float64 for
        a float64 model).
    """
    lp0 = torch.log_softmax(last_logits.to(torch.promote_types(last_logits.dtype,
                                                             torch.float32)), dim=-1)
    b = attention_mask.shape[0]
    out = torch.zeros(b, len(continuations), dtype=lp0.dtype, device=lp0.device)
    for j, cont in enumerate(continuations):
        cont = list(cont)
        total = lp0[:, cont[0]].clone()
        if len(cont) > 1:
            k = len(cont) - 1
            ids = torch.tensor([cont[:-1]] * b, device=attention_mask.device)
            mask = torch.cat([attention_mask, attention_mask.new_ones(b, k)], dim=1)
            pos = attention_mask.long().sum(-1, keepdim=True) + torch.arange(
                k, device=attention_mask.device)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                           use_cache=True, **{cache_kwarg(model): cache}).logits
            crop_cache(cache, k)
            lp = torch.log_softmax(logits.to(lp0.dtype), dim=-1)
            nxt = torch.tensor(cont[1:], device=lp.device)
            total = total + lp.gather(-1, nxt.expand(b, -1)[..., None])[..., 0].sum(-1)
        out[:, j] = total
    return out
