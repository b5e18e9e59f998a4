"""Batched greedy decoding with left padding, and the verdict-position logits.

Algorithm:

1. Sort prompts by length (less padding), cut them into batches of ``batch_size``.
2. Left-pad each batch with the pad token; the attention mask zeroes the pads and the
   position ids are ``cumsum(mask) - 1`` (transformers' ``generate`` derives them from the
   mask), so a padded prompt sees exactly the positions it sees alone.
3. Greedy decoding (``do_sample=False``) until an end-of-turn token
   (:func:`interp.models.end_of_turn_ids`: the token the chat template puts after a reply,
   e.g. ``<|eot_id|>`` for Llama 3 whose EOS is another token, then the tokenizer's and the
   model's EOS ids), a stop string (default: a newline after at
   least one non-blank character) or ``max_new_tokens``; each sequence stops on its own.
4. Return the decoded continuation of every prompt in the caller's order, and (on request) the
   raw logits of the first generated step (the logits at the prompt's last position). The
   judge's verdict score is NOT read from these first-token logits ("Incorrect" often starts
   with the sub-token "In"): it is the whole-reply score of :mod:`interp.verdict`.

In float32, batched output equals one-at-a-time output (a test checks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from interp.models import ModelHandle, end_of_turn_ids


@dataclass
class Generation:
    """One decoded continuation.

    Attributes:
        text: decoded new tokens (special tokens removed), before answer extraction.
        token_ids: the new token ids, ``[n_new]``.
        first_logits: raw logits at the prompt's last position, ``[vocab]`` float32 on CPU,
            or None when not requested.
        stop: why decoding ended: ``"eos"``, ``"stop_string"`` or ``"max_new_tokens"``.
    """

    text: str
    token_ids: list[int]
    first_logits: torch.Tensor | None
    stop: str


class _StopOnString:
    """Per-sequence stopping: a stop string appears in the decoded continuation."""

    def __init__(self, tokenizer, prompt_len: int, stops: Sequence[str]):
        self.tok, self.prompt_len, self.stops = tokenizer, prompt_len, tuple(stops)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw) -> torch.Tensor:
        done = []
        for row in input_ids[:, self.prompt_len:]:
            text = self.tok.decode(row, skip_special_tokens=True)
            done.append(any(s in text.lstrip() for s in self.stops))
        return torch.tensor(done, device=input_ids.device)


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


@torch.inference_mode()
def generate(
    handle: ModelHandle,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int = 32,
    batch_size: int = 8,
    stop_strings: Sequence[str] = ("\n",),
    keep_first_logits: bool = False,
    progress: bool = False,
) -> list[Generation]:
    """Greedy-decode a list of tokenized prompts in left-padded batches (module docstring).

    Args:
        handle: the loaded model.
        prompts: token id lists, BOS already included where the model wants one.
        max_new_tokens: cap on new tokens per prompt.
        batch_size: prompts per forward; 1 decodes one at a time.
        stop_strings: a sequence stops once its continuation (leading whitespace ignored)
            contains one of these; the text is returned up to and including it.
        keep_first_logits: also return the logits of the first decoding step.
        progress: show a tqdm bar over batches.

    Returns:
        One :class:`Generation` per prompt, in input order.

    Raises:
        ValueError: an empty prompt, or ``batch_size < 1``.
    """
    from transformers import StoppingCriteriaList

    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt")
    tok = handle.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos_ids = set(end_of_turn_ids(tok, handle.model))
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[Generation | None] = [None] * len(prompts)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="generate", unit="batch")
    for idx in batches:
        ids, mask = left_pad([prompts[i] for i in idx], pad_id, handle.device)
        stopping = StoppingCriteriaList([_StopOnString(tok, ids.shape[1], stop_strings)]) \
            if stop_strings else None
        res = handle.model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
            pad_token_id=pad_id, eos_token_id=sorted(eos_ids), stopping_criteria=stopping,
            return_dict_in_generate=True, output_logits=keep_first_logits,
            temperature=None, top_p=None, top_k=None,
        )
        new = res.sequences[:, ids.shape[1]:].tolist()
        for row, i in enumerate(idx):
            toks, stop = [], "max_new_tokens"
            for t in new[row]:
                if t in eos_ids:
                    stop = "eos"
                    break
                toks.append(t)
            text = tok.decode(toks, skip_special_tokens=True)
            if stop != "eos" and any(s in text.lstrip() for s in stop_strings):
                stop = "stop_string"
            first = res.logits[0][row].float().cpu() if keep_first_logits else None
            out[i] = Generation(text=text, token_ids=toks, first_logits=first, stop=stop)
    return out  # type: ignore[return-value]
