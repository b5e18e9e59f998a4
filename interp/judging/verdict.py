"""The judge's verdict score: its own preference between the two whole verdict replies.

The eval prompt asks for exactly "Correct" or "Incorrect". The score of a prompt is how much
more probable the model makes the whole reply "Correct" than the whole reply "Incorrect", with
the tokens the chat template gives those replies (docs/measuring.md, the verdict score). Comparing
first tokens instead is wrong: "Incorrect" is ``In`` + ``correct`` for many tokenizers, so a
first-token score compares "Correct" with the sub-token "In".

Algorithm:

1. Reply tokens (:func:`verdict_replies`). For each word ``w``, render a one-turn chat
   ``[user: "X"]`` with the generation prompt, and the same chat with the assistant reply ``w``.
   The reply's tokens are the tokens of the second rendering that follow the first rendering's
   tokens, cut where the reply text ends (the end-of-turn marker and what follows are not part
   of the reply). So leading-space and merge conventions are the tokenizer's own, for every
   family. A template whose first rendering's tokens are not a prefix of the second's (the
   boundary merges) is refused.
2. One forward of each eval prompt (left-padded batches; logits only at the last position)
   gives the log-probability of each reply's FIRST token and the key/value cache.
3. For each reply longer than one token, one more forward of ``reply[:-1]`` from that cache
   (batched over prompts; the cache is cropped back afterwards) gives the log-probabilities of
   its other tokens. ``log P(w | prompt)`` is the sum over the reply's tokens.
4. ``logit_diff = log P(Correct) - log P(Incorrect)`` (nats), ``p_correct = sigmoid(logit_diff)
   = P(Correct) / (P(Correct) + P(Incorrect))`` (the forced choice between the two replies) and
   ``verdict_coverage = P(Correct) + P(Incorrect)`` in ``(0, 1]``: how much of the judge's
   probability the two replies hold (low coverage means the judge mostly wanted to say
   something else, e.g. "The answer is ...").

Every user of a verdict score calls this module: the harness, patching, steering, probes'
judge baseline, transfer and the LLM oracle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from interp.core.errors import PromptError
from interp.core.vocab import VERDICT_WORDS
from interp.models.kv_cache import (
    continuation_logprobs,
    left_pad,
    output_cache,
    pad_token_id,
    position_ids,
)

__all__ = [
    "VERDICT_WORDS",
    "VerdictReplies",
    "VerdictScores",
    "reply_tokens",
    "score_verdicts",
    "verdict_replies",
]


@dataclass(frozen=True)
class VerdictReplies:
    """Token ids of the two verdict replies as the chat template renders them.

    Attributes:
        correct: tokens of the reply "Correct" (no end-of-turn marker).
        incorrect: tokens of the reply "Incorrect".
        tokens: the token strings of each, for reports (``{"Correct": [...], ...}``).
    """

    correct: tuple[int, ...]
    incorrect: tuple[int, ...]
    tokens: dict[str, list[str]]

    @property
    def ids(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(correct, incorrect)``."""
        return self.correct, self.incorrect

    def id_lists(self) -> dict[str, list[int]]:
        """``{"Correct": [ids], "Incorrect": [ids]}``: what a record names as its scored tokens."""
        return {w: list(r) for w, r in zip(VERDICT_WORDS, self.ids)}

    def to_record(self) -> dict[str, dict[str, list[Any]]]:
        """JSON-safe ``{word: {"ids": [...], "tokens": [...]}}`` for a run's manifest."""
        return {w: {"ids": ids, "tokens": list(self.tokens[w])}
                for w, ids in self.id_lists().items()}


def _reply_tokens(tokenizer: Any, word: str) -> list[int]:
    msgs = [{"role": "user", "content": "X"}]
    if not getattr(tokenizer, "chat_template", None):
        return tokenizer(" " + word, add_special_tokens=False)["input_ids"]
    head = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(msgs + [{"role": "assistant", "content": word}],
                                         tokenize=False)
    start = full.find(word, len(head)) if full.startswith(head) else -1
    if not full.startswith(head) or start < 0:
        raise PromptError(f"the chat template does not render the reply {word!r} after its "
                          f"generation prompt; cannot score verdicts with it")
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    n_head = len(tokenizer(head, add_special_tokens=False)["input_ids"])
    if ids[:n_head] != tokenizer(head, add_special_tokens=False)["input_ids"]:
        raise PromptError(f"the reply {word!r} merges with the chat template's generation "
                          f"prompt into other tokens; cannot separate the reply's tokens")
    end = start + len(word)
    reply = [t for t, (s, e) in zip(ids[n_head:], offsets[n_head:]) if s < end]
    if not reply or tokenizer.decode(reply).strip() != word:
        raise PromptError(f"the reply {word!r} does not tokenize on its own in this chat "
                          f"template (got {tokenizer.convert_ids_to_tokens(reply)})")
    return reply


def reply_tokens(tokenizer: Any, text: str) -> list[int]:
    """The tokens the chat template gives the assistant reply ``text`` (module docstring, step 1).

    Raises:
        PromptError: a reply that cannot be separated from the template or does not tokenize
            on its own.
    """
    return _reply_tokens(tokenizer, text)


def verdict_replies(tokenizer: Any) -> VerdictReplies:
    """Token ids of the replies "Correct" and "Incorrect" (module docstring, step 1).

    Args:
        tokenizer: a Hugging Face tokenizer (with a chat template; without one the words are
            taken with a leading space).

    Returns:
        The :class:`VerdictReplies`.

    Raises:
        PromptError: a reply that cannot be separated from the template, or two identical
            replies.
    """
    c, i = (_reply_tokens(tokenizer, w) for w in VERDICT_WORDS)
    if c == i:
        raise PromptError("'Correct' and 'Incorrect' render to the same tokens")
    toks = {w: tokenizer.convert_ids_to_tokens(r) for w, r in zip(VERDICT_WORDS, (c, i))}
    return VerdictReplies(correct=tuple(c), incorrect=tuple(i), tokens=toks)


@dataclass
class VerdictScores:
    """Verdict scores of a batch of eval prompts (module docstring, step 4), all ``[batch]``.

    Attributes:
        logprob_correct: ``log P("Correct" | prompt)`` in nats.
        logprob_incorrect: ``log P("Incorrect" | prompt)`` in nats.
    """

    logprob_correct: Float[Tensor, " batch"]
    logprob_incorrect: Float[Tensor, " batch"]

    @property
    def logit_diff(self) -> Float[Tensor, " batch"]:
        """``log P(Correct) - log P(Incorrect)`` in nats."""
        return self.logprob_correct - self.logprob_incorrect

    @property
    def p_correct(self) -> Float[Tensor, " batch"]:
        """``sigmoid(logit_diff)``: P(Correct) in the forced choice between the two replies."""
        return torch.sigmoid(self.logit_diff)

    @property
    def coverage(self) -> Float[Tensor, " batch"]:
        """``P(Correct) + P(Incorrect)``: the judge's probability the two replies hold."""
        return self.logprob_correct.exp() + self.logprob_incorrect.exp()

    def rows(self) -> list[dict[str, float]]:
        """One JSON-safe dict per prompt.

        Keys: ``logprob_correct``, ``logprob_incorrect``, ``logit_diff``, ``p_correct``,
        ``verdict_coverage``.
        """
        cols = {"logprob_correct": self.logprob_correct,
                "logprob_incorrect": self.logprob_incorrect, "logit_diff": self.logit_diff,
                "p_correct": self.p_correct, "verdict_coverage": self.coverage}
        cols = {k: v.double().cpu().tolist() for k, v in cols.items()}
        return [{k: v[b] for k, v in cols.items()} for b in range(len(self.logprob_correct))]


@torch.no_grad()
def score_verdicts(handle: Any, prompts: Sequence[Sequence[int]], *, batch_size: int = 8,
                   replies: VerdictReplies | None = None) -> VerdictScores:
    """Verdict scores of tokenized eval prompts (the whole algorithm of the module).

    Args:
        handle: an :class:`interp.models.loading.ModelHandle`.
        prompts: token-id lists (chat template applied, BOS included where it belongs).
        batch_size: prompts per forward (left-padded; sorted by length to pad little).
        replies: precomputed :func:`verdict_replies` (default: from the handle's tokenizer).

    Returns:
        :class:`VerdictScores` in the order of ``prompts`` (on CPU).

    Raises:
        PromptError: the replies cannot be rendered (:func:`verdict_replies`).
        ValueError: an empty prompt or ``batch_size < 1``.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt")
    replies = replies or verdict_replies(handle.tokenizer)
    pad = pad_token_id(handle.tokenizer)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out = torch.zeros(len(prompts), 2, dtype=torch.float64)
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        ids, mask = left_pad([prompts[i] for i in idx], pad, handle.device)
        res = handle.model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                           use_cache=True, logits_to_keep=1)
        lp = continuation_logprobs(handle.model, res.logits[:, -1], output_cache(res), mask,
                                   replies.ids)
        out[idx] = lp.cpu().double()
    return VerdictScores(logprob_correct=out[:, 0], logprob_incorrect=out[:, 1])
