"""Batched greedy decoding with left padding, and the verdict-position logits.

Algorithm:

1. Sort prompts by length (less padding), cut them into batches of ``batch_size``.
2. Left-pad each batch with the pad token; the attention mask zeroes the pads and the
   position ids are ``cumsum(mask) - 1`` (transformers' ``generate`` derives them from the
   mask), so a padded prompt sees exactly the positions it sees alone.
3. Greedy decoding (``do_sample=False``) from the prefill's key/value cache
   (:func:`interp.judging.prefill.run_prompts`) until EOS, a stop string (default: a newline after
   at least one non-blank character) or ``max_new_tokens``; each sequence stops on its own.
4. Return the decoded continuation of every prompt in the caller's order, and (on request) the
   raw logits of the first generated step (the logits at the prompt's last position). The
   judge's verdict score is NOT read from these first-token logits ("Incorrect" often starts
   with the sub-token "In"): it is the whole-reply score of :mod:`interp.judging.verdict`.

In float32, batched output equals one-at-a-time output (a test checks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from interp.judging.prefill import run_prompts
from interp.models.loading import ModelHandle


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

    The decoding loop is :func:`interp.judging.prefill.run_prompts` (one prefill per batch with
    logits only at the last position, then greedy steps from its key/value cache); its tokens
    equal transformers' ``generate(do_sample=False)`` on the same batches (tests/unit).

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
    got = run_prompts(handle, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                      stop_strings=stop_strings, keep_first_logits=keep_first_logits,
                      progress="generate" if progress else None)
    return [Generation(text=g.text, token_ids=g.token_ids, first_logits=g.first_logits,
                       stop=g.stop) for g in got]
