"""Does the judge know what the generator knew? Confidence signals, the self-check, the cache.

Four confidence signals of one record, each a probability that the model's answer is right
(the calibration card of :mod:`interp.analysis.calibration` reads them):

* ``judge``: the fresh judge's whole-reply forced choice ``p_correct = sigmoid(log P(Correct)
  - log P(Incorrect))`` on the eval prompt (stored in the run's records,
  :mod:`interp.judging.verdict`).
* ``probe``: a residual-stream probe's out-of-fold probability (:func:`oof_probe`): an
  unweighted logistic regression (:func:`interp.methods.probing.fit_probe`, ``balanced =
  False``, so ``sigmoid(decision)`` estimates ``P(y | x)`` at the data's base rate) on the
  ``resid_post`` features of a prompt's last position, folds by passage, the layer chosen in
  each outer fold by inner cross-validated AUC on that fold's training records alone.
* ``answer_prob``: the generator's own answer probability, length-normalised: ``exp`` of the
  mean per-token log-probability of its reply's tokens (the assistant turn as the chat
  template renders it, end-of-turn marker excluded) given the generation prompt
  (teacher-forced; :func:`self_check`). A geometric-mean token probability, not a
  probability of being right: its ECE says how far it is from being one.
* ``p_true``: P(True) asked in the generator's own conversation (Kadavath et al. 2022, arXiv
  2207.05221): the self-check prompt (:func:`interp.judging.prompts.render_self_check`: the
  verdict question as a new user turn after the generator's answer) scored with the same two
  whole replies as the judge.

The cache test (Kumaran et al. 2026, arXiv 2603.17839: confidence gathered from the answer
tokens is cached at the first position after the answer and read from there when asked):

* :func:`self_check` also keeps the residual stream ``blocks.L.hook_resid_pre`` of every
  layer at the first position after the answer (``token_spans["candidate"][1]``), and blocks
  attention from the self-check's verdict position to that position in every layer
  (:func:`block_verdict_attention`: ``log alpha`` with ``alpha`` = :data:`BLOCK_ALPHA` added to
  that key's score at the last query row, :mod:`interp.hooks.steering`), with a control that
  blocks as many other answer-adjacent positions (the one after it, else the one before the
  answer). Only the verdict position's row is blocked: later positions still read the cached
  state and can carry it on, and the verdict reply's later tokens (for "Incorrect" = "In" +
  "correct") are scored unblocked; the first-token logit difference is reported too.
* :func:`patch_verdict_position` writes that state, layer by layer, into the FRESH judge's
  eval prompt at its verdict position (``blocks.L.hook_resid_pre``, the last position only;
  one single-token forward per layer from the eval prompt's key/value cache) and reads the
  verdict's logit difference. Patching a prompt's own state changes nothing, and blocking no
  key changes nothing (tested).

The angle between the probe's direction and the verdict's readout (:func:`verdict_direction`):
the unembedding difference ``W_U[Correct[0]] - W_U[Incorrect[0]]`` of the replies' FIRST
tokens (the later tokens of a multi-token reply are not one direction), and the same times
the final norm's weight (the direction a residual vector is read along, up to the norm's
per-position scale), against the probe's direction in raw residual space ``coef / scale``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from interp.analysis.stats import make_folds, roc_auc
from interp.hooks.model import HookedModel
from interp.hooks.steering import Steer, steering
from interp.judging.parsing import parse_verdict
from interp.judging.prompts import RenderedPrompt
from interp.judging.verdict import VerdictReplies
from interp.methods.lens import readout
from interp.methods.probing import fit_probe
from interp.models.kv_cache import cache_kwarg, continuation_logprobs, crop_cache, output_cache
from interp.models.loading import ModelHandle

__all__ = ["BLOCK_ALPHA", "LastPositionVerdict", "block_verdict_attention", "control_positions",
           "cosine", "oof_probe", "patch_verdict_position", "probe_direction", "random_cosine_band",
           "self_check", "states_after_answer", "verdict_direction"]

BLOCK_ALPHA = 1e-300
"""The steering factor that blocks a key: ``log(1e-300) = -690.8`` added to its score, so its
attention weight underflows to exactly 0 in float32."""


def _ld(lp: Tensor) -> Float[Tensor, " batch"]:
    return (lp[:, 0] - lp[:, 1]).double()


class LastPositionVerdict:
    """The verdict's logit difference of one prompt with its last position edited, over a prefix.

    The prompt's KV prefix (every position but the last) is computed once; each call runs the
    last position alone over it, with ``edits`` (hook name -> function of the hook's value
    ``[batch, 1, ...]``) at that position (:meth:`interp.hooks.model.HookedModel.hooks`), scores
    both whole replies (:func:`interp.models.kv_cache.continuation_logprobs`) and crops the
    prefix back, so the calls are independent. Shared by the cache patching test
    (:func:`patch_verdict_position`) and the direction steering test
    (:func:`interp.methods.directions.steer_verdict`).

    Args:
        model: the hooked model.
        ids: ``[seq]`` the prompt (the judge's eval prompt).
        replies: the verdict replies.
    """

    def __init__(self, model: HookedModel, ids: Sequence[int], replies: VerdictReplies):
        handle = model.handle
        self.model, self.handle, self.replies, self.n = model, handle, replies, len(ids)
        self.t = torch.tensor([list(ids)], device=handle.device)
        self.prefix = output_cache(handle.model(input_ids=self.t[:, :-1], use_cache=True))
        self.mask = torch.ones(1, self.n, dtype=torch.long, device=handle.device)
        self.dtype = next(handle.model.parameters()).dtype

    def __call__(self, edits: Mapping[str, Callable[[Tensor], Tensor]]) -> tuple[float, float]:
        """``(logit difference of the whole replies, of their first tokens)``, nats."""
        m = self.handle.model
        try:
            with self.model.hooks(edits=dict(edits)):
                out = m(input_ids=self.t[:, -1:], use_cache=True,
                        **{cache_kwarg(m): self.prefix})
            last = out.logits[:, -1].float()
            lp = continuation_logprobs(m, last, output_cache(out), self.mask, self.replies.ids)
        finally:
            crop_cache(self.prefix, self.prefix.get_seq_length() - (self.n - 1))
        return (float(_ld(lp)[0]),
                float(last[0, self.replies.correct[0]] - last[0, self.replies.incorrect[0]]))


def control_positions(prompt: RenderedPrompt, n: int = 1) -> list[int]:
    """The control of the blocking test: ``n`` answer-adjacent positions other than the cache.

    The positions after the first position after the answer (never the verdict position),
    then, if too few, those before the answer.

    Raises:
        ValueError: a prompt without a candidate span.
    """
    if "candidate" not in prompt.token_spans:
        raise ValueError("the prompt has no candidate span")
    a, b = prompt.token_spans["candidate"]
    last = len(prompt) - 1
    after = [p for p in range(b + 1, last)][:n]
    before = [p for p in range(a - 1, 0, -1)][:n - len(after)]
    return sorted(after + before)


def _greedy(handle: ModelHandle, last_logits: Tensor, cache: Any, n_prompt: int,
            max_new_tokens: int) -> str:
    """Greedy reply from a prompt's cache (stops at EOS or a newline); the cache is cropped back."""
    tok = handle.tokenizer
    cfg_eos = getattr(getattr(handle.model, "generation_config", None), "eos_token_id", None)
    eos = {tok.eos_token_id, *(cfg_eos if isinstance(cfg_eos, list) else [cfg_eos])} - {None}
    out: list[int] = []
    logits = last_logits
    for _ in range(max_new_tokens):
        nxt = int(logits.argmax(-1))
        if nxt in eos:
            break
        out.append(nxt)
        if "\n" in tok.decode(out).lstrip():
            break
        res = handle.model(input_ids=torch.tensor([[nxt]], device=handle.device),
                           use_cache=True, **{cache_kwarg(handle.model): cache})
        logits = res.logits[0, -1]
    crop_cache(cache, cache.get_seq_length() - n_prompt)
    return tok.decode(out, skip_special_tokens=True).strip()


@torch.no_grad()
def block_verdict_attention(handle: ModelHandle, ids: Sequence[int], keys: Sequence[int],
                            replies: VerdictReplies, *, prefix: Any = None,
                            layers: Sequence[int] | None = None) -> dict[str, float]:
    """The verdict score with the verdict position's attention to ``keys`` blocked.

    The prompt's positions before the last run once (or come from ``prefix``, their key/value
    cache, cropped back to them afterwards), then the last position alone with
    :data:`BLOCK_ALPHA` on ``keys`` in ``layers`` (module docstring). ``keys = []`` blocks
    nothing and goes through the same attention function: the unblocked score by the same
    path.

    Args:
        handle: the model.
        ids: ``[seq]`` the prompt's token ids.
        keys: key positions to block (each ``< seq - 1``).
        replies: the verdict replies.
        prefix: the key/value cache of ``ids[:-1]`` (None: computed here).
        layers: blocked layers (None: every layer).

    Returns:
        ``{"logit_diff", "first_logit_diff", "p_correct"}``: the whole replies' and the first
        tokens' logit differences (nats).

    Raises:
        ValueError: a key at or past the last position.
    """
    n = len(ids)
    if any(not 0 <= k < n - 1 for k in keys):
        raise ValueError(f"blocked keys {list(keys)} must lie in 0..{n - 2}")
    t = torch.tensor([list(ids)], device=handle.device)
    if prefix is None:
        prefix = output_cache(handle.model(input_ids=t[:, :-1], use_cache=True))
    units = {L: None for L in (range(handle.n_layers) if layers is None else layers)} \
        if keys else {}
    st = Steer(units=units, keys=(0, 1), alphas=[BLOCK_ALPHA], keep_rows=False,
               positions=list(keys) or [0])
    try:
        with steering(handle, st):
            out = handle.model(input_ids=t[:, -1:], use_cache=True,
                               **{cache_kwarg(handle.model): prefix})
        last = out.logits[:, -1].float()
        lp = continuation_logprobs(handle.model, last, output_cache(out),
                                   torch.ones(1, n, dtype=torch.long, device=handle.device),
                                   replies.ids)
    finally:                                   # the prefix cache is the caller's again
        crop_cache(prefix, prefix.get_seq_length() - (n - 1))
    ld = float(_ld(lp)[0])
    first = float(last[0, replies.correct[0]] - last[0, replies.incorrect[0]])
    return {"logit_diff": ld, "first_logit_diff": first, "p_correct": 1 / (1 + math.exp(-ld))}


@torch.no_grad()
def self_check(handle: ModelHandle, prompt: RenderedPrompt, replies: VerdictReplies, *,
               max_new_tokens: int = 12, block: bool = True) -> dict[str, Any]:
    """One self-check prompt: P(True), the greedy verdict, the answer's probability, the cache.

    One forward of the whole prompt (every position's logits; ``blocks.L.hook_resid_pre`` of
    every layer cached), then from its key/value cache the verdict replies' log-probabilities
    and the greedy verdict; with ``block``, :func:`block_verdict_attention` on the first
    position after the answer, on :func:`control_positions` and on no key.

    Args:
        handle: the model.
        prompt: :func:`interp.judging.prompts.render_self_check`'s prompt.
        replies: the verdict replies.
        max_new_tokens: cap of the greedy verdict.
        block: run the blocking test.

    Returns:
        ``{"logit_diff", "first_logit_diff", "p_correct", "verdict_coverage", "verdict_text",
        "verdict", "answer_logprob_mean" (nats per token), "answer_logprob_sum",
        "answer_tokens", "after": position, "states": [n_layers, d_model] float32 tensor
        (resid_pre of every layer at ``after``), "block": {"none", "cache", "control":
        {"logit_diff", ...}, "control_positions"}}``.

    Raises:
        ValueError: a prompt without a candidate span or with nothing after the answer.
    """
    if "candidate" not in prompt.token_spans:
        raise ValueError("the self-check prompt has no candidate span")
    a, b = prompt.token_spans["candidate"]
    n = len(prompt)
    if b >= n - 1:
        raise ValueError("nothing follows the answer in the self-check prompt")
    ids = torch.tensor([prompt.input_ids], device=handle.device)
    hooks = [f"blocks.{L}.hook_resid_pre" for L in range(handle.n_layers)]
    with HookedModel(handle).hooks(cache=hooks) as acts:
        out = handle.model(input_ids=ids, use_cache=True)
    states = torch.stack([acts[h][0, b] for h in hooks]).float().cpu()
    logits = out.logits[0].float()
    tgt = ids[0, a:b]
    tok_lp = torch.log_softmax(logits[a - 1:b - 1], -1).gather(-1, tgt[:, None])[:, 0].double()
    cache = output_cache(out)
    mask = torch.ones(1, n, dtype=torch.long, device=handle.device)
    lp = continuation_logprobs(handle.model, logits[-1:], cache, mask, replies.ids)
    ld = float(_ld(lp)[0])
    text = _greedy(handle, logits[-1], cache, n, max_new_tokens)
    res: dict[str, Any] = {
        "logit_diff": ld, "p_correct": 1 / (1 + math.exp(-ld)),
        "first_logit_diff": float(logits[-1, replies.correct[0]]
                                  - logits[-1, replies.incorrect[0]]),
        "verdict_coverage": float(lp[0].double().exp().sum()),
        "verdict_text": text, "verdict": parse_verdict(text),
        "answer_logprob_mean": float(tok_lp.mean()), "answer_logprob_sum": float(tok_lp.sum()),
        "answer_tokens": int(b - a), "after": int(b), "states": states}
    if block:
        crop_cache(cache, 1)                       # the prefix: every position but the last
        ctrl = control_positions(prompt)
        res["block"] = {"none": block_verdict_attention(handle, prompt.input_ids, [], replies,
                                                        prefix=cache),
                        "cache": block_verdict_attention(handle, prompt.input_ids, [b], replies,
                                                         prefix=cache),
                        "control": block_verdict_attention(handle, prompt.input_ids, ctrl,
                                                           replies, prefix=cache),
                        "control_positions": ctrl}
    return res


@torch.no_grad()
def states_after_answer(handle: ModelHandle, prompt: RenderedPrompt
                        ) -> Float[Tensor, "layer d_model"]:
    """``blocks.L.hook_resid_pre`` of every layer at the first position after the answer.

    One forward of the self-check prompt up to that position (what :func:`self_check` keeps
    as ``states``), float32 on CPU.
    """
    b = prompt.token_spans["candidate"][1]
    hooks = [f"blocks.{L}.hook_resid_pre" for L in range(handle.n_layers)]
    with HookedModel(handle).hooks(cache=hooks) as acts:
        handle.model(input_ids=torch.tensor([prompt.input_ids[:b + 1]], device=handle.device),
                     use_cache=False, logits_to_keep=1)
    return torch.stack([acts[h][0, b] for h in hooks]).float().cpu()


@torch.no_grad()
def patch_verdict_position(handle: ModelHandle, ids: Sequence[int],
                           states: Float[Tensor, "layer d_model"], replies: VerdictReplies, *,
                           layers: Sequence[int] | None = None,
                           control: Float[Tensor, "layer d_model"] | None = None
                           ) -> dict[str, Any]:
    """Write ``states[L]`` into ``blocks.L.hook_resid_pre`` at the last position, per layer.

    The positions before the last run once; each patched run is then the last token alone
    from that key/value cache (cropped back after each run), the verdict replies scored from
    the patched run's cache (module docstring). ``control``: the same patch with another
    state (the stage's: another record's state after its answer), which moves the verdict
    by any foreign state as much but carries nothing about THIS answer.

    Args:
        handle: the model.
        ids: ``[seq]`` the target prompt (the fresh judge's eval prompt).
        states: ``[n_layers, d_model]`` the residual stream to write, row ``L`` at layer ``L``.
        replies: the verdict replies.
        layers: the patched layers (None: every layer), one patched run each.
        control: ``[n_layers, d_model]`` a control state, patched the same way (None: none).

    Returns:
        ``{"layers", "logit_diff": [per layer], "first_logit_diff": [per layer], "base":
        {"logit_diff", "first_logit_diff"} (the unpatched prompt by the same path)}``, with
        ``control_logit_diff`` and ``control_first_logit_diff`` for a ``control``.

    Raises:
        ValueError: ``states`` of the wrong shape or a layer outside the model.
    """
    layers = list(range(handle.n_layers)) if layers is None else list(layers)
    for st in (states, control):
        if st is not None and (st.ndim != 2 or st.shape[0] != handle.n_layers):
            raise ValueError(f"states must be [n_layers={handle.n_layers}, d_model], got "
                             f"{tuple(st.shape)}")
    if any(not 0 <= L < handle.n_layers for L in layers):
        raise ValueError(f"layers {layers} outside 0..{handle.n_layers - 1}")
    score = LastPositionVerdict(HookedModel(handle), ids, replies)

    def one(states: Tensor | None, L: int | None) -> tuple[float, float]:
        if states is None:
            return score({})
        v = states[L].to(handle.device, score.dtype)

        def edit(x: Tensor) -> Tensor:
            x = x.clone()
            x[:, -1] = v.to(x.dtype)
            return x
        return score({f"blocks.{L}.hook_resid_pre": edit})

    base = one(None, None)
    out: dict[str, Any] = {"layers": layers,
                           "base": {"logit_diff": base[0], "first_logit_diff": base[1]}}
    for name, st in (("", states), ("control_", control)):
        if st is None:
            continue
        got = [one(st, L) for L in layers]
        out[f"{name}logit_diff"] = [x for x, _ in got]
        out[f"{name}first_logit_diff"] = [x for _, x in got]
    return out


# ---------------------------------------------------------------------------------------------
# The probe signal and its direction (numpy)
# ---------------------------------------------------------------------------------------------


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.tanh(0.5 * x))


def oof_probe(feats: Float[np.ndarray, "n layer d"], y: Bool[np.ndarray, " n"],
              groups: Sequence[Any], layers: Sequence[int], *, folds: int = 5,
              inner_folds: int = 3, seed: int = 0, C: float = 1.0) -> dict[str, Any]:
    """Out-of-fold probabilities of an unweighted logistic probe, its layer chosen per fold.

    Outer folds by passage (:func:`interp.analysis.stats.make_folds`); in each, every layer of
    ``layers`` is cross-validated on the fold's training records alone (``inner_folds`` by
    passage, their AUC averaged), the best layer is fitted on all of them and scores the test
    fold: no record is both selected on and tested on.

    Args:
        feats: ``[n, n_layers, d]`` features of one pool.
        y: ``[n]`` labels (True = right).
        groups: ``[n]`` passage ids.
        layers: candidate layers (indices into ``feats``'s second axis).
        folds: outer folds.
        inner_folds: inner folds (fewer where a training part has fewer passages of a class).
        seed: fold shuffling.
        C: inverse regularisation.

    Returns:
        ``{"p": [n] probabilities, "chosen": [layer per outer fold], "inner_auc": [per fold,
        {layer: mean inner AUC}]}``.

    Raises:
        StageError: too few passages of a class for ``folds`` (from ``make_folds``).
    """
    y = np.asarray(y, bool)
    g = np.asarray([str(x) for x in groups])
    p = np.full(len(y), np.nan)
    chosen, inner_aucs = [], []
    for tr, te in make_folds(y, folds, seed, groups=g, what="the calibration probe"):
        ytr, gtr = y[tr], g[tr]
        k = min(inner_folds, len(set(gtr[ytr])), len(set(gtr[~ytr])))
        scores: dict[int, float] = {}
        if k >= 2 and len(layers) > 1:
            inner = make_folds(ytr, k, seed, groups=gtr)
            for L in layers:
                X = feats[tr, L]
                aucs = [roc_auc(ytr[b], fit_probe(X[a], ytr[a], "logreg", C=C, balanced=False)
                                .decision(X[b])) for a, b in inner]
                scores[int(L)] = float(np.mean([x for x in aucs if x is not None] or [0.5]))
            best = max(scores, key=lambda L: (scores[L], -L))
        else:
            best = int(layers[-1])
        pr = fit_probe(feats[tr, best], ytr, "logreg", C=C, balanced=False)
        p[te] = _sigmoid(pr.decision(feats[te, best]))
        chosen.append(best)
        inner_aucs.append(scores)
    return {"p": p, "chosen": chosen, "inner_auc": inner_aucs}


def probe_direction(X: Float[np.ndarray, "n d"], y: Bool[np.ndarray, " n"], *,
                    C: float = 1.0) -> Float[np.ndarray, " d"]:
    """The unweighted logistic probe's direction in raw residual space, ``coef / scale``.

    The probe reads ``coef . (x - mean) / scale``, so ``coef / scale`` is the direction along
    which ``x`` itself is read (unit length returned).
    """
    pr = fit_probe(X, y, "logreg", C=C, balanced=False)
    w = pr.coef / pr.scale
    return w / np.linalg.norm(w)


def verdict_direction(handle: ModelHandle, replies: VerdictReplies) -> dict[str, Any]:
    """The verdict's unembedding difference of the replies' first tokens (module docstring).

    Returns:
        ``{"unembed": [d] W_U[c0] - W_U[i0], "read": [d] the same times the final norm's
        weight, "tokens": [first token of "Correct", of "Incorrect"]}`` (numpy float64).
    """
    ro = readout(handle.model)
    W = ro.weight.detach().double().cpu()
    u = (W[replies.correct[0]] - W[replies.incorrect[0]]).numpy()
    gamma = getattr(ro.norm, "weight", None)
    read = u * gamma.detach().double().cpu().numpy() if gamma is not None else u
    toks = handle.tokenizer.convert_ids_to_tokens([replies.correct[0], replies.incorrect[0]])
    return {"unembed": u, "read": read, "tokens": list(toks)}


def cosine(a: Float[np.ndarray, " d"], b: Float[np.ndarray, " d"]) -> float:
    """``a . b / (|a| |b|)``."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def random_cosine_band(d: int, level: float = 0.95) -> float:
    """Half-width of the ``level`` interval of the cosine of two random directions in ``d`` dims.

    About ``z / sqrt(d)``: an angle inside it is no evidence of alignment.
    """
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2) / math.sqrt(d))

