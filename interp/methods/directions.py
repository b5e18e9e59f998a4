"""One correctness direction or two: the generator's at its answer, the judge's at its verdict.

Two directions are fitted on the same records, with the same label ``y`` (the oracle's label
of the model's own answer):

* the generator's correctness direction, on ``resid_post`` of the generator's conversation
  (its prompt with its own reply as the assistant turn) at the reply's tokens: the mean over
  the reply's tokens (``pool = "mean"``) or its last token (``"last"``); the end-of-turn
  marker is not a reply token. Orgad et al. 2024 (arXiv 2410.02707) probe at the exact answer
  tokens; SmolLM2's replies are short answers, so the reply's tokens are its answer's;
* the judge's verdict direction, on ``resid_post`` of the fresh judge prompt (the eval prompt
  with the extracted answer) at its verdict position (its last position).

Each with two estimators: the mass-mean direction ``mu_right - mu_wrong`` (difference of
class means; Marks & Tegmark 2023, arXiv 2310.06824) and the unweighted logistic probe's
direction in raw residual space ``coef / scale``
(:func:`interp.methods.calibration.probe_direction`). Every direction is a unit vector that
points towards "right".

Three views (:func:`cross_decode`, :func:`direction_cosines`, :func:`steer_verdict`):

1. the cosine of the two directions per layer, against the band of two random directions
   (``+-1.96 / sqrt(d)``, :func:`interp.methods.calibration.random_cosine_band`) and against
   a label-permutation null (both directions fitted with the SAME shuffled labels: the two
   prompts share the passage, so their states co-vary over records and even noise directions
   of the two align; the random band ignores that);
2. cross-decoding: each direction, fitted on the training folds (by passage,
   :func:`interp.analysis.stats.make_folds`), read on the test fold's states of its own
   prompt and of the other prompt (a projection, centred and scaled by the training records'
   projections of the prompt read, which uses no test label), pooled out-of-fold;
3. the causal test (:func:`steer_verdict`): the generator's unit direction times a norm added
   to ``blocks.L.hook_resid_post`` at the judge's verdict position, against random unit
   directions of the same norm; the verdict replies scored from the edited run's key/value
   cache as :func:`interp.methods.calibration.patch_verdict_position` scores them. Adding
   the zero vector changes nothing (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from interp.analysis.stats import MIN_QUANTILE_PERMUTATIONS, make_folds, roc_auc
from interp.hooks.model import HookedModel
from interp.judging.prompts import RenderedPrompt
from interp.judging.verdict import VerdictReplies
from interp.methods.calibration import LastPositionVerdict, cosine, probe_direction

__all__ = ["METHODS", "POOLS", "answer_states", "choose_layer", "cross_decode",
           "direction_cosines", "fit_direction", "mass_mean_direction", "random_directions",
           "steer_verdict", "verdict_states"]

METHODS = ("mass_mean", "logistic")
"""The two estimators of a direction (module docstring)."""
POOLS = ("mean", "last")
"""How the generator's states at its reply's tokens become one vector per layer."""


# ---------------------------------------------------------------------------------------------
# States (the model)
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def answer_states(model: HookedModel, prompt: RenderedPrompt
                  ) -> dict[str, Float[Tensor, "layer d_model"]]:
    """``resid_post`` of every layer at the generator's reply tokens, mean and last.

    One forward of the generator's conversation up to the end of its reply (``prompt`` is
    :func:`interp.judging.prompts.render_self_check`'s: its ``candidate`` span is the reply
    the generator produced, the end-of-turn marker excluded).

    Args:
        model: the hooked model.
        prompt: a prompt with a non-empty ``candidate`` token span.

    Returns:
        ``{"mean": [n_layers, d_model], "last": [n_layers, d_model]}`` float32 on CPU: the
        mean over the reply's tokens and the reply's last token.

    Raises:
        ValueError: no or an empty ``candidate`` span.
    """
    a, b = prompt.token_spans.get("candidate", (0, 0))
    if b <= a:
        raise ValueError("the prompt has no non-empty candidate span (the generator's reply)")
    _, cache = model.run_with_cache(prompt.input_ids[:b], "resid_post", logits="last")
    X = torch.stack([cache["resid_post", L][0] for L in range(model.n_layers)]).float()
    return {"mean": X[:, a:b].mean(1).cpu(), "last": X[:, b - 1].cpu()}


@torch.no_grad()
def verdict_states(model: HookedModel, ids: Sequence[int]) -> Float[Tensor, "layer d_model"]:
    """``resid_post`` of every layer at the last position (the judge's verdict position).

    Returns:
        ``[n_layers, d_model]`` float32 on CPU.
    """
    _, cache = model.run_with_cache(list(ids), "resid_post", logits="last")
    return torch.stack([cache["resid_post", L][0, -1]
                        for L in range(model.n_layers)]).float().cpu()


@torch.no_grad()
def steer_verdict(model: HookedModel, ids: Sequence[int], layer: int,
                  vectors: Float[Tensor, "k d_model"], replies: VerdictReplies
                  ) -> dict[str, Any]:
    """The verdict's logit difference with each vector added at the verdict position.

    The positions before the last run once; each edited run is the last token alone from
    that key/value cache (cropped back after each run) with ``vectors[i]`` added to
    ``blocks.{layer}.hook_resid_post`` at that position (:meth:`HookedModel.hooks`), and the
    whole verdict replies scored from the edited run's cache (the later layers' keys and
    values at the verdict position carry the edit to the reply's later tokens). The unedited
    score goes the same path.

    Args:
        model: the hooked model.
        ids: ``[seq]`` the judge's eval prompt.
        layer: the edited layer.
        vectors: ``[k, d_model]`` what is added (norm included), one run each.
        replies: the verdict replies.

    Returns:
        ``{"base": logit difference unedited, "logit_diff": [k], "first_logit_diff": [k],
        "base_first": float}`` in nats (``log P(Correct) - log P(Incorrect)`` of the whole
        replies; the first tokens' logit difference).

    Raises:
        ValueError: a layer outside the model or vectors of the wrong width.
    """
    if not 0 <= layer < model.n_layers:
        raise ValueError(f"layer {layer} outside 0..{model.n_layers - 1}")
    if vectors.ndim != 2 or vectors.shape[1] != model.d_model:
        raise ValueError(f"vectors must be [k, d_model={model.d_model}], got "
                         f"{tuple(vectors.shape)}")
    score = LastPositionVerdict(model, ids, replies)
    point = f"blocks.{layer}.hook_resid_post"

    def one(v: Tensor | None) -> tuple[float, float]:
        if v is None:
            return score({})
        v = v.to(model.device, score.dtype)

        def edit(x: Tensor) -> Tensor:
            x = x.clone()
            x[:, -1] = x[:, -1] + v.to(x.dtype)
            return x
        return score({point: edit})

    base = one(None)
    got = [one(v) for v in vectors]
    return {"base": base[0], "base_first": base[1], "logit_diff": [x for x, _ in got],
            "first_logit_diff": [x for _, x in got]}


# ---------------------------------------------------------------------------------------------
# Directions (numpy)
# ---------------------------------------------------------------------------------------------


def mass_mean_direction(X: Float[np.ndarray, "n d"], y: Bool[np.ndarray, " n"]
                        ) -> Float[np.ndarray, " d"]:
    """``mu_right - mu_wrong`` at unit length (Marks & Tegmark's mass-mean direction).

    Raises:
        ValueError: one class only, or equal class means.
    """
    y = np.asarray(y, bool)
    if y.all() or not y.any():
        raise ValueError(f"a mass-mean direction needs both classes (n={len(y)}, "
                         f"right={int(y.sum())})")
    X = np.asarray(X, np.float64)
    w = X[y].mean(0) - X[~y].mean(0)
    norm = np.linalg.norm(w)
    if norm == 0:
        raise ValueError("the class means are equal: no direction")
    return w / norm


def fit_direction(X: Float[np.ndarray, "n d"], y: Bool[np.ndarray, " n"], method: str, *,
                  C: float = 1.0) -> Float[np.ndarray, " d"]:
    """A unit direction towards "right" by ``method`` (:data:`METHODS`).

    Raises:
        ValueError: an unknown method.
        ProbeError: one class only (logistic).
    """
    if method == "mass_mean":
        return mass_mean_direction(X, y)
    if method == "logistic":
        return probe_direction(np.asarray(X, np.float64), np.asarray(y, bool), C=C)
    raise ValueError(f"unknown direction method {method!r}; known: {list(METHODS)}")


def _read(w: np.ndarray, X_train: np.ndarray, X_test: np.ndarray) -> np.ndarray:
    """Projections of ``X_test`` on ``w``, centred and scaled by ``X_train``'s (no labels)."""
    p = X_train @ w
    s = p.std()
    return (X_test @ w - p.mean()) / (s if s > 0 else 1.0)


def cross_decode(G: Float[np.ndarray, "n layer d"], J: Float[np.ndarray, "n layer d"],
                 y: Bool[np.ndarray, " n"], groups: Sequence[Any], layers: Sequence[int], *,
                 folds: int = 5, seed: int = 0, C: float = 1.0,
                 methods: Sequence[str] = METHODS) -> dict[str, Any]:
    """Out-of-fold scores of each direction read on its own prompt and on the other one.

    Folds by passage (:func:`interp.analysis.stats.make_folds`): in each, both directions
    are fitted on the training records only and read on the test records' states of both
    prompts (module docstring, view 2).

    Args:
        G: ``[n, n_layers, d]`` the generator's states at its answer.
        J: ``[n, n_layers, d]`` the judge's states at its verdict position.
        y: ``[n]`` labels (True = the answer is right).
        groups: ``[n]`` passage ids.
        layers: the layers (indices into the second axis).
        folds: outer folds.
        seed: fold shuffling.
        C: the logistic direction's inverse regularisation.
        methods: estimators (:data:`METHODS`).

    Returns:
        ``{"folds": [(train, test) index lists], "scores": {method: {"gen_on_gen",
        "gen_on_judge", "judge_on_judge", "judge_on_gen": [n_layers_selected, n]}}}``
        (``gen_on_judge``: the generator's direction read on the judge's states).

    Raises:
        ProbeError: too few passages of a class for ``folds``.
    """
    y = np.asarray(y, bool)
    g = np.asarray([str(x) for x in groups])
    split = make_folds(y, folds, seed, groups=g, what="the correctness directions")
    kinds = ("gen_on_gen", "gen_on_judge", "judge_on_judge", "judge_on_gen")
    scores = {m: {k: np.full((len(layers), len(y)), np.nan) for k in kinds} for m in methods}
    for tr, te in split:
        for i, L in enumerate(layers):
            Gl, Jl = np.asarray(G[:, L], np.float64), np.asarray(J[:, L], np.float64)
            for m in methods:
                wg = fit_direction(Gl[tr], y[tr], m, C=C)
                wj = fit_direction(Jl[tr], y[tr], m, C=C)
                s = scores[m]
                s["gen_on_gen"][i, te] = _read(wg, Gl[tr], Gl[te])
                s["gen_on_judge"][i, te] = _read(wg, Jl[tr], Jl[te])
                s["judge_on_judge"][i, te] = _read(wj, Jl[tr], Jl[te])
                s["judge_on_gen"][i, te] = _read(wj, Gl[tr], Gl[te])
    return {"folds": [(tr.tolist(), te.tolist()) for tr, te in split], "scores": scores}


def direction_cosines(G: Float[np.ndarray, "n layer d"], J: Float[np.ndarray, "n layer d"],
                      y: Bool[np.ndarray, " n"], layers: Sequence[int], *, C: float = 1.0,
                      methods: Sequence[str] = METHODS, n_perm: int = 50, seed: int = 0
                      ) -> dict[str, Any]:
    """Per layer, the cosine of the generator's and the judge's directions (all records).

    With ``n_perm`` label permutations (the same shuffled labels for both prompts): the 95th
    percentile of ``|cos|`` under no label at all, the null a cosine must pass (module
    docstring, view 1).

    Returns:
        ``{method: [{"layer", "cos", "perm_q95", "perm_max", "perm_n", "perm_p"} per
        layer]}``: ``perm_p`` the share of permutations with ``|cos|`` at least the observed
        (plus one, over ``n_perm + 1``); ``perm_q95`` the 95th percentile of ``|cos|`` under
        the permutations, None below :data:`interp.analysis.stats.MIN_QUANTILE_PERMUTATIONS`
        of them (``perm_max``, their largest, is what a few give); all None without
        permutations.
    """
    y = np.asarray(y, bool)
    rng = np.random.default_rng(seed)
    perms = [rng.permutation(y) for _ in range(n_perm)]
    out: dict[str, Any] = {m: [] for m in methods}
    for L in layers:
        Gl, Jl = np.asarray(G[:, L], np.float64), np.asarray(J[:, L], np.float64)
        for m in methods:
            c = cosine(fit_direction(Gl, y, m, C=C), fit_direction(Jl, y, m, C=C))
            null = np.array([abs(cosine(fit_direction(Gl, p, m, C=C),
                                        fit_direction(Jl, p, m, C=C))) for p in perms])
            out[m].append({"layer": int(L), "cos": c,
                           "perm_q95": float(np.quantile(null, 0.95))
                           if n_perm >= MIN_QUANTILE_PERMUTATIONS else None,
                           "perm_max": float(null.max()) if n_perm else None,
                           "perm_n": n_perm,
                           "perm_p": float((1 + (null >= abs(c)).sum()) / (n_perm + 1))
                           if n_perm else None})
    return out


def choose_layer(G: Float[np.ndarray, "n layer d"], y: Bool[np.ndarray, " n"],
                 groups: Sequence[Any], layers: Sequence[int], *, folds: int = 3,
                 seed: int = 0) -> dict[str, Any]:
    """The layer where the generator's mass-mean direction reads correctness best.

    Cross-validated by passage on the records given (the caller passes a training part
    only): per layer, the mean over folds of the AUC of the direction fitted on the inner
    training records and read on the inner test records. Ties go to the earlier layer.

    Returns:
        ``{"layer", "auc": {layer: mean inner AUC}}``.

    Raises:
        ProbeError: too few passages of a class for ``folds``.
    """
    y = np.asarray(y, bool)
    split = make_folds(y, folds, seed, groups=[str(x) for x in groups],
                       what="the steering layer's choice")
    auc: dict[int, float] = {}
    for L in layers:
        X = np.asarray(G[:, L], np.float64)
        got = [roc_auc(y[te], X[te] @ mass_mean_direction(X[tr], y[tr])) for tr, te in split]
        auc[int(L)] = float(np.mean([a for a in got if a is not None] or [0.5]))
    best = max(auc, key=lambda L: (auc[L], -L))
    return {"layer": best, "auc": auc}


def random_directions(d: int, n: int, seed: int) -> Float[np.ndarray, "n d"]:
    """``n`` unit vectors uniformly on the sphere in ``d`` dims (normalised Gaussians)."""
    v = np.random.default_rng(seed).standard_normal((n, d))
    return v / np.linalg.norm(v, axis=1, keepdims=True)
