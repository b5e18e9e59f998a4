"""Attention steering of the judge and of the generator: the causal test of the mechanism.

Paper section 3.2 reports that the judge's verdict position reads the context 3-5x less than
the generator's answer position. If that is WHY the judge misses wrong answers, raising the
verdict position's context attention should make the judge reject wrong answers more often,
and lowering the generator's should lower its accuracy (docs/stages.md, steer). The intervention is
:mod:`interp.hooks.steering`; the stage is :mod:`interp.stages.steering`.

Algorithm, one record and a grid of ``alpha`` (all alphas at once, one batch row each):

1. Judge (:func:`steer_judge`): the eval prompt with the record's own answer. ``hf``: every
   position but the last is run once, unsteered (its key/value cache is the same for every
   alpha); then one forward of the last position (the verdict position) for all alphas under
   :func:`interp.hooks.steering.steering`: in the steered layers (default the attention band),
   ``log(alpha)`` is added to the verdict position's pre-softmax scores on the context keys
   (all heads, or a head set). The recorded last rows give the context mass actually reached
   (mean over heads and the band). The replies' later tokens are scored from each row's cache
   WITHOUT steering (:func:`interp.models.kv_cache.continuation_logprobs`): ``logit_diff`` (nats),
   ``p_correct``, ``verdict_coverage``, and the forced verdict ``logit_diff > 0``.
   ``transformer_lens``: the same on TransformerBridge (:func:`interp.hooks.steering.
   tl_steered_logits`), the replies appended (:func:`interp.hooks.backends.reply_extensions`),
   steering only the verdict position's query; it agrees with ``hf`` to 1e-4.
2. Generator (:func:`steer_generator`): the gen prompt; the same single-position forward gives
   the generator's context mass at the position that predicts the answer's first token; then
   the answer is decoded greedily under steering (every new token's query steered on the
   context keys; the stop rules of :func:`interp.judging.generation.generate`), from the unsteered
   prompt prefix computed once, so that it can be graded by the oracle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from jaxtyping import Float

from interp.core.errors import StageError
from interp.core.vocab import ALPHAS
from interp.hooks.backends import extend_prompts, reply_extensions, reply_logprobs
from interp.hooks.recorder import context_mass
from interp.hooks.steering import Steer, steering, tl_steered_logits
from interp.judging.verdict import VerdictReplies, verdict_replies
from interp.models.kv_cache import cache_kwarg, continuation_logprobs, output_cache
from interp.models.loading import ModelHandle, stop_ids

__all__ = ["ALPHAS", "parse_heads", "steer_generator", "steer_judge", "top_diff_k"]


Units = Mapping[int, Sequence[int] | None]


def top_diff_k(spec: str) -> int:
    """The ``K`` of a ``top-diff:K`` head spec.

    Raises:
        StageError: ``K`` is not a whole number >= 1.
    """
    k = spec.strip().split(":", 1)[1]
    if not k.isdigit() or int(k) < 1:
        raise StageError("steering", f"heads {spec!r}: K of top-diff:K must be a whole number >= 1")
    return int(k)


def parse_heads(spec: str | Sequence[str], band: Sequence[int], n_heads: int, *,
                ranked: Sequence[Mapping[str, Any]] | None = None) -> dict[int, list[int] | None]:
    """The steered (layer -> heads) from a head spec.

    Args:
        spec: ``"all"`` (every head of every band layer), ``"top-diff:K"`` (the ``K`` heads with
            the largest gen-minus-eval context mass, ``ranked`` from ``interp heads``), or
            ``"L.H,L.H,..."`` (explicit layer.head pairs).
        band: the steered layers of ``"all"``.
        n_heads: query heads per layer.
        ranked: :func:`interp.analysis.span_mass.top_heads` ``["diff"]`` rows (for ``top-diff:K``).

    Returns:
        ``{layer: None}`` for every band layer, or ``{layer: [heads]}``.

    Raises:
        StageError: an unparseable spec, a head out of range, or ``top-diff`` without a
            ranking (run ``interp attention`` first).
    """
    if not isinstance(spec, str):
        spec = ",".join(spec)
    s = spec.strip().lower()
    if s == "all":
        return {int(layer): None for layer in band}
    pairs: list[tuple[int, int]] = []
    if s.startswith("top-diff:"):
        if ranked is None:
            raise StageError("steering",
                             "heads 'top-diff:K' needs the attention summary's head ranking; "
                             "run `interp attention` on the run first")
        pairs = [(int(r["layer"]), int(r["head"])) for r in list(ranked)[:top_diff_k(spec)]]
    else:
        try:
            pairs = [(int(a), int(b)) for a, b in (x.split(".") for x in s.split(",") if x)]
        except ValueError as err:
            raise StageError("steering",
                             f"heads {spec!r}: use 'all', 'top-diff:K' or 'L.H,L.H'") from err
    if not pairs or any(not 0 <= h < n_heads for _, h in pairs):
        raise StageError("steering", f"heads {spec!r}: empty, or a head outside 0..{n_heads - 1}")
    out: dict[int, list[int] | None] = {}
    for layer, h in pairs:
        out.setdefault(layer, []).append(h)  # type: ignore[union-attr]
    return out


@torch.no_grad()
def _last_forward(handle: ModelHandle, ids: Sequence[int], st: Steer) -> tuple[Any, Any, int]:
    """Step 1 (``hf``): the unsteered prefix once, the last position for every alpha."""
    model = handle.model
    t = torch.tensor([list(ids)], device=handle.device)
    b = len(st.alphas)
    kw: dict[str, Any] = {"use_cache": True, "logits_to_keep": 1}
    if t.shape[1] > 1:
        pre = output_cache(model(input_ids=t[:, :-1], use_cache=True, logits_to_keep=1))
        if b > 1:
            pre.batch_repeat_interleave(b)
        kw[cache_kwarg(model)] = pre
    with steering(handle, st):
        out = model(input_ids=t[:, -1:].expand(b, -1), **kw)
    return out.logits[:, -1], output_cache(out), t.shape[1]


@torch.no_grad()
def steer_judge(handle: ModelHandle, ids: Sequence[int], context: tuple[int, int],
                units: Units, alphas: Sequence[float], *, band: Sequence[int],
                backend: str = "hf", replies: VerdictReplies | None = None,
                positions: Sequence[int] | None = None
                ) -> dict[str, Float[np.ndarray, " alpha"]]:
    """The judge's verdict score and context mass under steering (module step 1).

    Args:
        handle: the model.
        ids: the eval prompt's token ids ``[pos]``.
        context: its context span ``[start, end)`` (the steered keys unless ``positions``).
        units: steered layer -> heads (None: all), e.g. :func:`parse_heads`.
        alphas: the factors (one batch row each).
        band: layers averaged for the context mass (``hf``).
        backend: ``hf`` or ``transformer_lens`` (no context mass: NaN).
        replies: verdict replies (default: from the tokenizer).
        positions: steer these key positions instead of the context (the non-context
            control, :func:`interp.hooks.steering.control_keys`).

    Returns:
        Arrays ``[n_alpha]``: ``logprob_correct``, ``logprob_incorrect``, ``logit_diff``,
        ``p_correct``, ``verdict_coverage``, ``context_mass`` (always on the context) and
        ``steered_mass`` (on the steered keys: the context mass again without
        ``positions``).

    Raises:
        StageError: an unknown backend, alphas not > 0, layers or heads out of range.
    """
    replies = replies or verdict_replies(handle.tokenizer)
    if backend == "hf":
        st = Steer(units=units, keys=context, alphas=list(alphas), keep_rows=True,
                   positions=positions)
        last, kv, n = _last_forward(handle, ids, st)
        mask = torch.ones(len(alphas), n, dtype=torch.long, device=handle.device)
        lp = continuation_logprobs(handle.model, last, kv, mask, replies.ids)
        mass = context_mass(st.rows, band, context)
        steered = context_mass(st.rows, band, context, positions)
    elif backend == "transformer_lens":
        exts = reply_extensions(replies.ids)
        width = max(len(e) for e in exts)
        tok = handle.tokenizer
        t = torch.tensor([list(ids)] * len(alphas), device=handle.device)
        ext = extend_prompts(t, exts, tok.pad_token_id or 0)
        st = Steer(units=units, keys=context, alphas=list(alphas) * len(exts), keep_rows=False,
                   positions=positions)
        logits = tl_steered_logits(handle, ext, st, query=len(ids) - 1,
                                   logits_to_keep=width + 1)
        lp = reply_logprobs(logits, replies.ids, exts, len(alphas))
        mass = steered = np.full(len(alphas), np.nan)
    else:
        raise StageError("steering",
                         f"steering runs on 'hf' or 'transformer_lens', not {backend!r}")
    lp = lp.double().cpu().numpy()
    ld = lp[:, 0] - lp[:, 1]
    return {"logprob_correct": lp[:, 0], "logprob_incorrect": lp[:, 1], "logit_diff": ld,
            "p_correct": 1 / (1 + np.exp(-ld)),
            "verdict_coverage": np.exp(lp[:, 0]) + np.exp(lp[:, 1]), "context_mass": mass,
            "steered_mass": steered}


@torch.no_grad()
def steer_generator(handle: ModelHandle, ids: Sequence[int], context: tuple[int, int],
                    units: Units, alphas: Sequence[float], *, band: Sequence[int],
                    max_new_tokens: int = 32, positions: Sequence[int] | None = None
                    ) -> dict[str, Any]:
    """The generator's context mass and greedy answer under steering (module step 2).

    Decoding follows :func:`interp.judging.generation.generate` (greedy; a row stops at an
    end-of-sequence token or once its text, leading blanks ignored, holds a newline; the text
    keeps that newline), from the unsteered prompt prefix computed once for every alpha.

    Args:
        handle: the model.
        ids: the gen prompt's token ids ``[pos]``.
        context: its context span (the steered keys unless ``positions``).
        units: steered layer -> heads (None: all).
        alphas: the factors.
        band: layers averaged for the context mass.
        max_new_tokens: answer length cap.
        positions: steer these key positions instead of the context (the control).

    Returns:
        ``context_mass`` and ``steered_mass`` ``[n_alpha]`` (at the position predicting the
        first answer token; as :func:`steer_judge`) and ``generations``: the decoded
        continuation of each alpha (before answer extraction).
    """
    tok, model = handle.tokenizer, handle.model
    eos = set(stop_ids(tok, model))  # Llama 3: <|eot_id|> is not the EOS token
    st = Steer(units=units, keys=context, alphas=list(alphas), keep_rows=True,
               positions=positions)
    logits, kv, n = _last_forward(handle, ids, st)
    mass = context_mass(st.rows, band, context)
    steered = context_mass(st.rows, band, context, positions)
    st.keep_rows = False
    b = len(alphas)
    new: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b
    for step in range(max_new_tokens):
        nxt = logits.argmax(-1).tolist()
        for i, t in enumerate(nxt):
            if done[i]:
                continue
            if t in eos:
                done[i] = True
                continue
            new[i].append(t)
            done[i] = "\n" in tok.decode(new[i], skip_special_tokens=True).lstrip()
        if all(done) or step == max_new_tokens - 1:
            break
        with steering(handle, st):
            out = model(input_ids=torch.tensor(nxt, device=handle.device)[:, None],
                        use_cache=True, logits_to_keep=1, **{cache_kwarg(model): kv})
        logits, kv = out.logits[:, -1], output_cache(out)
    return {"context_mass": mass, "steered_mass": steered,
            "generations": [tok.decode(x, skip_special_tokens=True) for x in new]}
