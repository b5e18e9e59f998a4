"""One prefill per prompt: greedy decode, verdict scores, attention rows and pooled residuals.

The harness (:func:`interp.methods.asymmetry.evaluate_examples`) runs every prompt through the model
ONCE and takes from that one forward everything the studies read (docs/architecture.md, one pass):

1. Batches are formed by length: the prompts are sorted by token count and cut into batches
   of ``batch_size``, so a batch pads little. Each batch is left-padded; the attention mask
   zeroes the pads and the position ids are ``cumsum(mask) - 1``, so a padded prompt sees
   exactly the positions it sees alone.
2. Prefill: one forward of the batch with the key/value cache on and logits ONLY at the last
   position (``logits_to_keep=1``: the prompt's other positions are never read). In the same
   forward, on request:

   * the exact last-row attention of every layer and query head
     (:func:`interp.hooks.recorder.batch_rows`: the recording attention function, about the
     cost of a plain SDPA forward), each prompt's padding cut off: ``[n_layers, n_heads, n]``;
   * the pooled ``resid_post`` of every layer (:func:`interp.judging.residual_features.pool_resid`
     applied inside a forward hook on each decoder layer, over the prompt's real positions,
     so no ``[layer, pos, d_model]`` stack is kept): ``{pool: [n_layers, d_model]}``.

3. Verdict score (on request): ``log P(reply | prompt)`` of each continuation from the prefill's
   last logits and cache (:func:`interp.models.kv_cache.continuation_logprobs`: one forward of
   ``reply[:-1]`` per multi-token reply, then the cache is cropped back).
4. Greedy decode from the same cache (do_sample=False): each step feeds the argmax token of
   every sequence (a finished sequence is fed the pad token, as transformers' ``generate``
   does, so the batch keeps its shape and its numbers), until each sequence has hit an
   end-of-turn id, a stop string (its continuation, leading whitespace ignored, contains one)
   or ``max_new_tokens``. In float32 the tokens equal transformers' ``generate`` on the same
   batch (tests/equivalence).

Prompt length: this module runs what it is given; the harness refuses prompts that do not fit
the model's context with their reason (records with ``status: "skipped"``, counted in
``metrics.json["skipped"]``), never truncates them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from interp.core.errors import Interrupted
from interp.core.progress import advance, tqdm
from interp.hooks.guard import inference_guard
from interp.hooks.model import HookedModel
from interp.hooks.recorder import batch_rows
from interp.judging.residual_features import pool_resid
from interp.models.kv_cache import (
    cache_kwarg,
    continuation_logprobs,
    left_pad,
    output_cache,
    pad_token_id,
    position_ids,
)
from interp.models.loading import ModelHandle, stop_ids
from interp.models.points import hook_name

__all__ = ["Capture", "PromptPass", "eos_ids", "run_prompts"]


@dataclass
class PromptPass:
    """What one prompt's pass gave (fields not asked for are None).

    Attributes:
        text: decoded new tokens (special tokens removed).
        token_ids: the new token ids (end-of-turn id excluded).
        stop: ``"eos"``, ``"stop_string"`` or ``"max_new_tokens"``.
        first_logits: raw logits at the prompt's last position ``[vocab]`` float32 on CPU.
        logprobs: ``log P(continuation | prompt)`` ``[n_continuations]`` float64 on CPU (nats).
        tail_logprob: ``log P(prompt[-tail:] | prompt[:-tail])`` of the prompt's own last
            ``tail`` tokens (nats; :func:`run_prompts` with ``tail``).
        rows: last-token attention rows ``[n_layers, n_heads, n_tokens]`` float32 on CPU.
        pooled: ``{pool: [n_layers, d_model]}`` float32 on CPU.
        fell_back: the candidate pool fell back to the last position (no candidate span).
    """

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    stop: str = "max_new_tokens"
    first_logits: Tensor | None = None
    logprobs: Tensor | None = None
    tail_logprob: float | None = None
    rows: Float[Tensor, "layer head pos"] | None = None
    pooled: dict[str, Float[Tensor, "layer d_model"]] | None = None
    fell_back: bool = False


@dataclass
class Capture:
    """What the harness should record in its prefill forwards, and what it recorded.

    Attributes:
        rows: record the last-token attention rows (Study 2).
        pools: pools of ``resid_post`` to keep (the probe stage's features; ``candidate`` is
            skipped for the gen prompt).
        got: filled by :func:`interp.methods.asymmetry.evaluate_examples`: example index ->
            ``{"gen": (RenderedPrompt, PromptPass), "eval": (...)}`` for every ok record.
    """

    rows: bool = True
    pools: tuple[str, ...] = ()
    got: dict[int, dict[str, tuple[Any, PromptPass]]] = field(default_factory=dict)


def eos_ids(handle: ModelHandle) -> set[int]:
    """The ids that end a reply: :func:`interp.models.loading.stop_ids`.

    The token the chat template puts after an assistant reply (``<|im_end|>``, Llama 3's
    ``<|eot_id|>``, which is not the EOS of every Llama 3 checkpoint), the tokenizer's EOS,
    the generation config's EOS ids and every other special token (the next turn's header).
    """
    return set(stop_ids(handle.tokenizer, handle.model))


@contextlib.contextmanager
def _pooling(handle: ModelHandle, lengths: Sequence[int], width: int,
             spans: Sequence[tuple[int, int] | None], pools: Sequence[str]
             ) -> Iterator[list[dict[int, tuple[dict[str, Tensor], bool]]]]:
    """Forward hooks that pool each row's ``resid_post`` per layer (module docstring, step 2)."""
    got: list[dict[int, tuple[dict[str, Tensor], bool]]] = [{} for _ in lengths]
    if not pools:
        yield got
        return

    def make(layer: int) -> Callable[[Tensor], Tensor]:
        def pool(x: Tensor) -> Tensor:
            for row, n in enumerate(lengths):
                res = x[row, width - n:].detach().float()[None]  # [1, n, d_model]
                p, fb = pool_resid(res, spans[row], pools)
                got[row][layer] = ({k: v[0].cpu() for k, v in p.items()}, fb)
            return x
        return pool

    edits = {hook_name(x, "hook_resid_post"): make(x) for x in range(handle.n_layers)}
    with HookedModel(handle).hooks(edits=edits):
        yield got


def _decode(handle: ModelHandle, logits: Tensor, cache: object, mask: Tensor, *,
            max_new_tokens: int, stop_strings: Sequence[str], eos: set[int], pad_id: int,
            on_step: Callable[[], None] = lambda: None) -> list[tuple[list[int], str]]:
    """Step 4: greedy decoding of a prefilled batch; ``(tokens, stop)`` per row.

    ``on_step`` is called after each decoding forward (progress inside a batch).
    """
    model, tok = handle.model, handle.tokenizer
    b = mask.shape[0]
    toks: list[list[int]] = [[] for _ in range(b)]
    stop = ["max_new_tokens"] * b
    done = [False] * b
    kw = cache_kwarg(model)
    for step in range(max_new_tokens):
        nxt = logits.float().argmax(-1).tolist()
        for i in range(b):
            if done[i]:
                nxt[i] = pad_id
                continue
            if nxt[i] in eos:
                done[i], stop[i] = True, "eos"
                continue
            toks[i].append(nxt[i])
            if stop_strings and any(s in tok.decode(toks[i], skip_special_tokens=True).lstrip()
                                    for s in stop_strings):
                done[i], stop[i] = True, "stop_string"
        if all(done) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, mask.new_ones(b, 1)], dim=1)
        pos = mask.long().sum(-1, keepdim=True) - 1
        ids = torch.tensor(nxt, device=mask.device)[:, None]
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                    **{kw: cache})
        logits = out.logits[:, -1]
        on_step()
    return list(zip(toks, stop))


@torch.inference_mode()
def run_prompts(
    handle: ModelHandle,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int = 32,
    batch_size: int = 8,
    stop_strings: Sequence[str] = ("\n",),
    continuations: Sequence[Sequence[int]] | None = None,
    rows: bool = False,
    pools: Sequence[str] = (),
    candidate_spans: Sequence[tuple[int, int] | None] | None = None,
    keep_first_logits: bool = False,
    tail: int = 0,
    progress: str | None = None,
) -> list[PromptPass]:
    """Prefill each prompt once and take everything asked for from it (module docstring).

    Args:
        handle: the loaded model.
        prompts: token id lists (BOS included where the model wants one), each non-empty.
        max_new_tokens: cap on decoded tokens per prompt (0: no decoding).
        batch_size: prompts per forward.
        stop_strings: a sequence stops once its continuation (leading whitespace ignored)
            contains one of these.
        continuations: token id lists to score after every prompt (step 3), each non-empty.
        rows: record the last-token attention rows (step 2).
        pools: pools of ``resid_post`` to keep (:data:`interp.judging.residual_features.POOLS`;
            step 2).
        candidate_spans: per prompt the ``(start, end)`` candidate span for the ``candidate``
            pool (None: that prompt has none and falls back to ``last``).
        keep_first_logits: keep the logits at each prompt's last position.
        tail: also score each prompt's own last ``tail`` tokens from the same prefill (logits
            at its last ``tail + 1`` positions): ``PromptPass.tail_logprob``. Each prompt
            must be longer than ``tail``.
        progress: a tqdm description (None: no bar).

    Returns:
        One :class:`PromptPass` per prompt, in input order.

    Raises:
        ValueError: an empty prompt or continuation, or ``batch_size < 1``.
        interp.core.errors.Interrupted: a Ctrl-C (or SIGTERM); its ``done`` holds
            ``{prompt index: PromptPass}`` of every batch that finished before it.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt")
    if continuations is not None and any(len(c) == 0 for c in continuations):
        raise ValueError("empty continuation")
    if tail and any(len(p) <= tail for p in prompts):
        raise ValueError(f"a prompt of at most tail={tail} tokens")
    tok = handle.tokenizer
    pad_id = pad_token_id(tok)
    eos = eos_ids(handle)
    spans = list(candidate_spans) if candidate_spans is not None else [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if progress:
        batches = tqdm(batches, desc=progress, unit="batch", leave=False)
    out: list[PromptPass] = [PromptPass() for _ in prompts]
    finished: list[int] = []
    try:
        _run_batches(handle, prompts, batches, out, finished, tok=tok, pad_id=pad_id, eos=eos,
                     spans=spans, max_new_tokens=max_new_tokens, stop_strings=stop_strings,
                     continuations=continuations, rows=rows, pools=pools,
                     keep_first_logits=keep_first_logits, tail=tail)
    except KeyboardInterrupt as exc:
        if isinstance(exc, Interrupted):
            raise
        raise Interrupted({i: out[i] for i in finished}) from exc
    return out


def _run_batches(handle: ModelHandle, prompts: Sequence[Sequence[int]], batches: Any,
                 out: list[PromptPass], finished: list[int], *, tok: Any, pad_id: int,
                 eos: Any, spans: Sequence[tuple[int, int] | None], max_new_tokens: int,
                 stop_strings: Sequence[str], continuations: Sequence[Sequence[int]] | None,
                 rows: bool, pools: Sequence[str], keep_first_logits: bool, tail: int) -> None:
    """The batches of :func:`run_prompts`: fills ``out`` and lists each finished prompt."""
    with inference_guard(handle.model):
        for idx in batches:
            ids, mask = left_pad([prompts[i] for i in idx], pad_id, handle.device)
            width, lengths = ids.shape[1], [len(prompts[i]) for i in idx]
            rec = batch_rows(handle) if rows else contextlib.nullcontext(None)
            with rec as get_rows, _pooling(handle, lengths, width, [spans[i] for i in idx],
                                           pools) as pooled:
                res = handle.model(input_ids=ids, attention_mask=mask,
                                   position_ids=position_ids(mask), use_cache=True,
                                   logits_to_keep=tail + 1)
                got_rows = get_rows().float().cpu() if rows else None
            last, cache = res.logits[:, -1], output_cache(res)
            n, first = len(idx), (0.3 if max_new_tokens > 0 else 1.0)
            advance(first * n)  # the enclosing stage's bar moves within the batch
            steps = [0]

            def on_step(n: int = n, steps: list[int] = steps) -> None:
                steps[0] += 1
                advance(0.7 * n / max(max_new_tokens - 1, 1))
            tails = None if not tail else torch.log_softmax(
                res.logits[:, :-1].float(), dim=-1).gather(
                -1, ids[:, -tail:, None])[..., 0].double().sum(-1).cpu()
            lp = None if continuations is None else continuation_logprobs(
                handle.model, last, cache, mask, continuations).double().cpu()
            dec = _decode(handle, last, cache, mask, max_new_tokens=max_new_tokens,
                          stop_strings=stop_strings, eos=eos, pad_id=pad_id, on_step=on_step) \
                if max_new_tokens > 0 else [([], "max_new_tokens")] * len(idx)
            if max_new_tokens > 0:  # a batch that stopped early: the rest of its share
                advance(0.7 * n * (1 - steps[0] / max(max_new_tokens - 1, 1)))
            for row, i in enumerate(idx):
                p = out[i]
                p.token_ids, p.stop = dec[row]
                p.text = tok.decode(p.token_ids, skip_special_tokens=True)
                if keep_first_logits:
                    p.first_logits = last[row].float().cpu()
                if lp is not None:
                    p.logprobs = lp[row]
                if tails is not None:
                    p.tail_logprob = float(tails[row])
                if got_rows is not None:
                    p.rows = got_rows[row, :, :, width - lengths[row]:].clone()
                if pools:
                    per = pooled[row]
                    p.pooled = {k: torch.stack([per[x][0][k] for x in range(handle.n_layers)])
                                for k in pools}
                    p.fell_back = any(fb for _, fb in per.values())
            finished.extend(idx)
