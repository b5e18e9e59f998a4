"""Attention steering of the judge and of the generator: the causal test of the mechanism.

Paper section 3.2 reports that the judge's verdict position reads the context 3-5x less than
the generator's answer position. If that is WHY the judge misses wrong answers, raising the
verdict position's context attention should make the judge reject wrong answers more often,
and lowering the generator's should lower its accuracy (docs/stages.md, steer). The intervention is
:mod:`interp.hooks.steering`; the stage is :mod:`interp.stages.steering`.

Algorithm, one record and a grid of ``alpha`` (all alphas at once, one batch row each):

1. Judge (:func:`steer_judge`): the eval prompt with the record's own answer, on a backend
   that offers steering (:data:`interp.core.vocab.BACKEND_OFFERS`; the backend object does
   the forward). ``hf`` (:meth:`interp.hooks.backends.HFBackend.steered_score`): every
   position but the last is run once, unsteered (its key/value cache is the same for every
   alpha); then one forward of the last position (the verdict position) for all alphas under
   :func:`interp.hooks.steering.steering`: in the steered layers (default the attention band),
   ``log(alpha)`` is added to the verdict position's pre-softmax scores on the context keys
   (all heads, or a head set). The recorded last rows give the context mass actually reached
   (mean over heads and the band). The replies' later tokens are scored from each row's cache
   WITHOUT steering (:func:`interp.models.kv_cache.continuation_logprobs`): ``logit_diff`` (nats),
   ``p_correct``, ``verdict_coverage``, and the forced verdict ``logit_diff > 0``.
   ``transformer_lens`` (:meth:`interp.hooks.backends.TLBackend.steered_score`): the same on
   TransformerBridge (:meth:`interp.hooks.steering.Steer.score_hooks`), the replies appended
   (:func:`interp.hooks.backends.reply_extensions`), steering only the verdict position's
   query; it agrees with ``hf`` to 1e-4 and keeps no rows (context mass NaN).
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
from interp.core.layers import parse_heads, top_diff_k
from interp.core.vocab import ALPHAS, check_backend
from interp.hooks.backends import get_backend
from interp.hooks.recorder import context_mass
from interp.hooks.steering import Steer, steering
from interp.judging.verdict import VerdictReplies, verdict_replies
from interp.models.kv_cache import cache_kwarg, output_cache
from interp.models.loading import ModelHandle, stop_ids

__all__ = ["ALPHAS", "parse_heads", "steer_generator", "steer_judge", "top_diff_k"]


Units = Mapping[int, Sequence[int] | None]


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
        backend: a backend offering ``steering`` (:data:`interp.core.vocab.BACKEND_OFFERS`):
            ``hf``, or ``transformer_lens`` (it keeps no steered rows: context mass NaN).
        replies: verdict replies (default: from the tokenizer).
        positions: steer these key positions instead of the context (the non-context
            control, :func:`interp.hooks.steering.control_keys`).

    Returns:
        Arrays ``[n_alpha]``: ``logprob_correct``, ``logprob_incorrect``, ``logit_diff``,
        ``p_correct``, ``verdict_coverage``, ``context_mass`` (always on the context) and
        ``steered_mass`` (on the steered keys: the context mass again without
        ``positions``).

    Raises:
        StageError: an unknown backend or one without steering (``nnsight``), alphas not
            > 0, layers or heads out of range (all before any forward).
    """
    check_backend(backend, StageError.of("steering"), needs="steering")  # before any forward
    replies = replies or verdict_replies(handle.tokenizer)
    st = Steer(units=units, keys=context, alphas=list(alphas), keep_rows=True,
               positions=positions)
    st.check(handle)
    be = get_backend(handle, backend)
    lp, rows = be.steered_score(torch.tensor([list(ids)], device=handle.device), replies.ids, st)
    if rows is None:  # a backend that keeps no steered rows (transformer_lens): no mass
        mass = steered = np.full(len(alphas), np.nan)
    else:
        mass = context_mass(rows, band, context)
        steered = context_mass(rows, band, context, positions)
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
    first = get_backend(handle, "hf").steered(torch.tensor([list(ids)], device=handle.device), st)
    logits, kv = first.logits[:, -1], first.kv
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
