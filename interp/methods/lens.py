"""The verdict lens: at which layer the judge's verdict (and the generator's answer) is readable.

Three standard readouts of the residual stream at one position, each read at every layer:

* **Logit lens** (nostalgebraist 2020, "interpreting GPT: the logit lens"; TransformerLens
  ``ActivationCache.accumulated_resid(apply_ln=True)``): the residual stream after block ``L``
  (``blocks.L.hook_resid_post``; index 0 is the embeddings, ``blocks.0.hook_resid_pre``), then
  the model's final norm with the norm's scale taken from THAT vector (per position and per
  layer), then the unembedding the model actually uses.
* **Tuned lens** (Belrose et al. 2023, "Eliciting latent predictions from transformers with the
  tuned lens", arXiv 2303.08112): the same readout after one affine translator per layer,
  ``T_L(h) = h + A_L h + b_L``, trained so that the lens distribution matches the model's final
  distribution (:class:`TunedLens`, :func:`fit_tuned_lens`).
* **Direct logit attribution** (Elhage et al. 2021, "A mathematical framework for transformer
  circuits"; TransformerLens ``cache.logit_attrs``): the final residual stream at the verdict
  position is the sum of the embeddings, every head's output and every MLP's output; with the
  final norm's scale frozen at its value on that position, the first-token logit difference is
  the sum of each component's projection on the difference of the two unembedding rows
  (:func:`direct_logit_attribution`), with the norm folded as TransformerLens folds it
  (:meth:`Readout.fold`: an RMSNorm's gain; a LayerNorm's centering, gain and bias). Any other
  final norm is refused in one line (:func:`norm_kind`).

What is scored:

* the judge: the logit difference of the WHOLE verdict replies, ``log P(Correct) - log P(
  Incorrect)`` (nats), teacher-forced: "Incorrect" is two tokens for the bundled tokenizers
  (``In`` + ``correct``), so the lens reads the prompt's last position for every reply's first
  token and the position of each earlier reply token for the next (:func:`reply_lens`). At the
  last layer it equals :func:`interp.judging.verdict.score_verdicts`' ``logit_diff``;
* the generator: the logit difference at the generation prompt's last position between the
  gold answer's first token (as the chat template renders the reply) and the best distractor:
  the token the model ranks highest at its last layer other than that one
  (:func:`token_lens`).

Pitfalls, each covered by a test (``tests/unit/methods/test_lens.py``):

1. Each layer is normalised with its own statistics. TransformerLens once folded every layer
   of an accumulated stack with the final layer's scale, which makes early layers look flat;
   here the norm module is applied to each vector (RMSNorm is scale-invariant, so a lens
   reading is unchanged by rescaling the residual stream).
2. transformers' last ``hidden_states`` entry is already after the final norm; the lens reads
   ``hook_resid_post`` of the last block with a forward hook instead, and normalises it once.
3. Tied and untied unembeddings: SmolLM2 ties its unembedding to its embedding, Qwen2.5's
   checkpoint does not; the lens reads ``model.get_output_embeddings()``, the matrix the
   forward pass uses, in both cases.
4. The tuned-lens library (``tuned-lens`` on PyPI) supports neither Qwen2 models nor
   GGUF-loaded checkpoints, so the translators are trained here, with the paper's
   parameterisation (identity plus a learned affine map, the last layer the identity) and
   objective (KL from the final distribution), after a closed-form least-squares start
   (Din et al. 2023, "Jump to conclusions: short-cutting transformers with linear
   transformations", arXiv 2303.09435), because a CPU affords few KL steps.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from interp.core.errors import StageError
from interp.core.io import load_tensors, save_tensors
from interp.hooks.model import HookedModel
from interp.hooks.recorder import batch_rows
from interp.models.readout import (
    NORM_KINDS,
    Readout,
    attribution_names,
    logit_attribution,
    norm_kind,
    readout,
)

__all__ = ["LOGIT_CHUNK_BYTES", "NORM_KINDS", "Readout", "TunedLens", "attribution_reader",
           "direct_logit_attribution",
           "first_agreeing_layer", "fit_tuned_lens", "lens_kl", "lens_logits", "norm_kind",
           "position_chunks", "readout", "reply_lens", "residual_stack", "stack_names",
           "token_lens"]

LOGIT_CHUNK_BYTES = 256 * 2**20
"""Float32 lens logits ``[layers, positions, vocab]`` of one chunk at most: a readout of many
positions through every layer is computed a chunk of positions at a time
(:func:`position_chunks`), so its peak memory is a few chunks (the logits, their log-softmax),
whatever the number of positions; at Llama 3.1's 128,256 tokens and 33 readouts one position
alone is 17 MiB, so a chunk holds 15 positions."""


def position_chunks(n: int, n_layers: int, vocab: int,
                    budget: int | None = None) -> list[tuple[int, int]]:
    """``(start, end)`` chunks of ``n`` positions whose float32 lens logits fit ``budget``.

    Args:
        n: positions.
        n_layers: readouts per position (``n_layers + 1`` for a residual stack).
        vocab: the unembedding's rows.
        budget: bytes of ``[n_layers, chunk, vocab]`` float32 (None: :data:`LOGIT_CHUNK_BYTES`,
            read at call time); at least one position per chunk.
    """
    budget = LOGIT_CHUNK_BYTES if budget is None else budget
    step = max(1, int(budget) // max(1, n_layers * vocab * 4))
    return [(s, min(n, s + step)) for s in range(0, n, step)]


def stack_names(n_layers: int) -> list[str]:
    """Hook points of the lens's layers: the embeddings, then each block's residual output.

    ``["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", ..., "blocks.{n-1}.
    hook_resid_post"]``: ``n_layers + 1`` names; index ``L + 1`` is block ``L``'s output.
    """
    return ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(n_layers)]


@torch.no_grad()
def residual_stack(handle: Any, ids: Sequence[int], positions: Sequence[int]
                   ) -> tuple[Float[Tensor, "layer pos d_model"], Float[Tensor, "pos vocab"]]:
    """The residual stream at ``positions`` after every layer, and the model's own logits there.

    One forward of ``ids``; the hook points of :func:`stack_names` are read as they are
    computed and only the rows at ``positions`` are kept.

    Args:
        handle: a :class:`interp.models.loading.ModelHandle`.
        ids: ``[seq]`` token ids.
        positions: indices into ``ids`` (negative counts from the end).

    Returns:
        ``(stack, logits)``: ``[n_layers + 1, len(positions), d_model]`` (float32, CPU) and
        ``[len(positions), d_vocab]`` (float32, CPU).

    Raises:
        StageError: an empty ``ids`` or a position outside it.
    """
    n = len(ids)
    pos = [p + n if p < 0 else p for p in positions]
    if not n or any(not 0 <= p < n for p in pos):
        raise StageError("lens", f"positions {list(positions)} outside a prompt of {n} tokens")
    names = stack_names(handle.n_layers)
    keep = torch.tensor(pos)
    rows: dict[str, Tensor] = {}

    def stream(name: str, value: Tensor) -> None:
        rows[name] = value[0, keep].float().cpu()

    x = torch.tensor([list(ids)], device=handle.device)
    tail = n - min(pos)
    with HookedModel(handle).hooks(cache=names, stream=stream):
        out = handle.model(input_ids=x, use_cache=False, logits_to_keep=tail)
    return (torch.stack([rows[k] for k in names]),
            out.logits[0, keep - (n - tail)].float().cpu())


def lens_logits(ro: Readout, stack: Float[Tensor, "layer pos d_model"],
                lens: TunedLens | None) -> Float[Tensor, "layer pos vocab"]:
    """Lens logits of a residual stack: through ``lens`` (None: the logit lens), then readout.

    ``stack`` is :func:`residual_stack`'s (embeddings first); the readout applies the final
    norm with each position's own scale and the unembedding the model uses (float32 out).
    """
    if lens is not None:
        stack = lens.translate(stack)
    return ro.logits(stack).float()


@torch.no_grad()
def reply_lens(handle: Any, prompt: Sequence[int], replies: Sequence[Sequence[int]], *,
               lens: TunedLens | None | Mapping[str, TunedLens | None] = None
               ) -> dict[str, Any]:
    """Log-probabilities of whole replies read at every layer, teacher-forced (module docstring).

    For each reply ``r``, one forward of ``prompt + r[:-1]``; the lens distribution at the
    prompt's last position scores ``r[0]``, the one at ``r[j-1]``'s position scores ``r[j]``;
    ``log P_L(r)`` is the sum.

    Args:
        handle: a :class:`interp.models.loading.ModelHandle`.
        prompt: ``[seq]`` token ids of the prompt (chat template applied).
        replies: two or more token-id lists (``VerdictReplies.ids``: Correct, Incorrect).
        lens: a :class:`TunedLens` to read through (None: the logit lens), or a mapping of
            names to lenses, all read from the same forwards.

    Returns:
        ``{"logprobs": [n_replies, n_layers + 1] (nats), "model": [n_replies]}``: the lens's
        log-probability of each reply at each layer, and the model's own (its logits). The
        logit difference of the first two replies is ``logprobs[0] - logprobs[1]``.
        ``first_logprobs`` (same shape) scores each reply's first token only: its difference
        is the first-token logit difference, the target of :func:`direct_logit_attribution`.
        With a mapping ``lens``, both map each name to its ``[n_replies, n_layers + 1]``.

    Raises:
        StageError: an empty prompt or reply.
    """
    if not prompt or not replies or any(not r for r in replies):
        raise StageError("lens", "reply_lens needs a prompt and non-empty replies")
    ro = readout(handle.model)
    named = dict(lens) if isinstance(lens, Mapping) else {"": lens}
    per: dict[str, list[Tensor]] = {k: [] for k in named}
    first: dict[str, list[Tensor]] = {k: [] for k in named}
    own = []
    for r in replies:
        seq = list(prompt) + list(r[:-1])
        pos = list(range(len(prompt) - 1, len(seq)))
        stack, logits = residual_stack(handle, seq, pos)
        tok = torch.tensor(list(r))
        chunks = position_chunks(len(r), stack.shape[0], ro.weight.shape[0])
        for k, t in named.items():
            total = torch.zeros(stack.shape[0], dtype=torch.float32)
            for s, e in chunks:  # [layer, chunk, vocab] at a time (LOGIT_CHUNK_BYTES)
                lp = lens_logits(ro, stack[:, s:e], t).log_softmax(-1)
                picked = lp[:, torch.arange(e - s), tok[s:e]]   # [layer, chunk]
                total += picked.sum(-1)
                if s == 0:
                    first[k].append(picked[:, 0].clone())
                del lp
            per[k].append(total)
        own.append(logits.log_softmax(-1)[torch.arange(len(r)), tok].sum())
    out = {k: torch.stack(v).double() for k, v in per.items()}
    one = {k: torch.stack(v).double() for k, v in first.items()}
    return {"logprobs": out if isinstance(lens, Mapping) else out[""],
            "first_logprobs": one if isinstance(lens, Mapping) else one[""],
            "model": torch.stack(own).double()}


@torch.no_grad()
def token_lens(handle: Any, prompt: Sequence[int], target: int, *,
               lens: TunedLens | None | Mapping[str, TunedLens | None] = None
               ) -> dict[str, Any]:
    """The logit difference of ``target`` against the best distractor at every layer.

    The distractor is the token with the highest final logit other than ``target`` (fixed from
    the last layer and read at every layer), at the prompt's last position.

    Args:
        handle: a :class:`interp.models.loading.ModelHandle`.
        prompt: ``[seq]`` token ids (the generation prompt).
        target: the token id scored (the gold answer's first reply token).
        lens: a :class:`TunedLens` (None: the logit lens), or a mapping of names to lenses,
            all read from the same forward (``logit_diff`` is then a mapping too).

    Returns:
        ``{"logit_diff": [n_layers + 1] (nats), "model": float, "distractor": int, "rank":
        int}``: lens logits of target minus distractor per layer; the model's own; the
        distractor's id; the target's rank in the model's own logits (0: the model's top token).

    Raises:
        StageError: an empty prompt, or a target outside the vocabulary.
    """
    ro = readout(handle.model)
    if not 0 <= target < ro.weight.shape[0]:
        raise StageError("lens",
                         f"target token {target} outside the vocabulary of {ro.weight.shape[0]}")
    stack, logits = residual_stack(handle, list(prompt), [-1])
    final = logits[0].clone()
    rank = int((final > final[target]).sum())
    final[target] = -math.inf
    distractor = int(final.argmax())
    named = dict(lens) if isinstance(lens, Mapping) else {"": lens}
    diff = {}
    for k, t in named.items():
        lg = lens_logits(ro, stack, t)[:, 0]
        diff[k] = (lg[:, target] - lg[:, distractor]).double()
    return {"logit_diff": diff if isinstance(lens, Mapping) else diff[""],
            "model": float(logits[0, target] - logits[0, distractor]),
            "distractor": distractor, "rank": rank}


def first_agreeing_layer(curve: Sequence[float], skip: int = 0) -> int:
    """The first layer index from which the sign of ``curve`` stays the last layer's.

    ``curve`` is a lens logit difference per layer (index 0 the embeddings). Returns
    ``len(curve) - 1`` when only the last layer has the final sign; a value of 0 means every
    layer agrees. Zero counts as its own sign (never agreeing with a non-zero final). This is
    the "prediction depth" of Baldock et al. 2021 (the first layer from which an early read-out
    keeps the final prediction), read through a lens as Belrose et al. 2023 do, for a two-token
    contrast.

    ``skip``: how many later layers may disagree with the final sign (default 0, the strict
    reading). With ``skip=1`` the result is the first agreeing layer from which at most one
    later layer disagrees: a depth that one layer's reading (one translator of a tuned lens,
    say) sets alone moves a lot between ``skip=0`` and ``skip=1``.

    Raises:
        StageError: an empty curve or a negative ``skip``.
    """
    if not len(curve):
        raise StageError("lens", "empty lens curve")
    if skip < 0:
        raise StageError("lens", f"skip must be >= 0, got {skip}")

    def sign(x: float) -> float:
        return math.copysign(1.0, x) if x else 0.0

    final = sign(curve[-1])
    best, wrong = len(curve) - 1, 0
    for i in range(len(curve) - 2, -1, -1):
        if sign(curve[i]) != final:
            wrong += 1
            if wrong > skip:
                break
        else:
            best = i
    return best


@torch.no_grad()
def direct_logit_attribution(handle: Any, prompt: Sequence[int], a: int, b: int, *,
                             stack: bool = False, rows: bool = False) -> dict[str, Any]:
    """Each head's and MLP's direct contribution to ``logit[a] - logit[b]`` at the last position.

    With ``h`` the final residual stream at the prompt's last position and the final norm
    folded at ``h``'s scale (frozen: "the folded norm", :meth:`Readout.fold`: RMSNorm's gain;
    LayerNorm's centering, gain and bias), the model's logit difference is ``h . direction +
    norm_bias + lm_bias`` with ``direction = C(s * gamma * (W_U[a] - W_U[b]))``; ``h`` is the
    embedding plus, for every block, the attention output (the sum of each head's ``z_h W_O[h]``
    and the output projection's bias) plus the MLP's output, so

    ``logit[a] - logit[b] = sum over components c of c . direction + norm_bias + lm_bias``

    exactly (up to float rounding): the attributions sum to the total. The norm's scale is NOT
    linear in ``h``, so an attribution says what a component adds at the scale the model ran
    at, not what removing it would do (that is activation patching).

    Args:
        handle: a :class:`interp.models.loading.ModelHandle`.
        prompt: ``[seq]`` token ids.
        a: the token scored up (the first token of "Correct").
        b: the token scored down (the first token of "Incorrect").
        stack: also return ``"stack"``, the residual stream at the last position before
            block 0 and after every block, ``[n_layers + 1, d_model]`` (float64), summed from
            the same components (what :func:`residual_stack` reads, from this one forward).
        rows: also return ``"rows"``, the last position's attention rows ``[n_layers, n_heads,
            seq]`` float32 (:func:`interp.hooks.recorder.batch_rows`, exact rows of the SDPA
            forward) from this one forward.

    Returns:
        ``{"heads": [n_layers, n_heads], "mlp": [n_layers], "attn_bias": [n_layers],
        "embed": float, "lm_bias": float, "norm_bias": float, "total": float, "sum": float}``
        (nats; ``norm_bias``: a LayerNorm's bias on the direction, 0 for RMSNorm): ``sum`` is
        the sum of every attribution and ``total`` the model's own logit difference; with
        ``stack`` and ``rows`` also those.

    Raises:
        StageError: an unsupported model or final norm (see :func:`readout`,
            :meth:`Readout.fold`).
    """
    x = torch.tensor([list(prompt)], device=handle.device)
    with attribution_reader(handle, rows=rows) as result:
        out = handle.model(input_ids=x, use_cache=False, logits_to_keep=1)
    return result(out.logits[0, -1], a, b, stack=stack)


@contextlib.contextmanager
def attribution_reader(handle: Any, *, rows: bool = False
                       ) -> Iterator[Callable[..., dict[str, Any]]]:
    """Read what :func:`direct_logit_attribution` needs from a forward run inside the block.

    The hook points of :func:`interp.models.readout.attribution_names` are streamed at the
    last position of the forward's input (the prompt's last token, also when the forward runs
    that token alone over a key/value cache of the earlier ones) and nothing else is kept; with
    ``rows`` the forward runs under the attention recorder
    (:func:`interp.hooks.recorder.batch_rows`). So the attribution comes from a forward that
    the caller runs for its own ends (the pairwise judge's scored forwards,
    :func:`interp.methods.pairwise.measure_pair`) instead of one of its own.

    Yields:
        ``result(last_logits, a, b, *, stack=False)``: the dict of
        :func:`direct_logit_attribution` from the LAST forward inside the block, with
        ``last_logits`` that forward's logits at its last position ``[vocab]`` (``total`` is
        ``last_logits[a] - last_logits[b]`` in float64) and, with ``rows``, ``"rows"``
        ``[n_layers, n_heads, key_len]`` float32 of batch row 0.

    Raises:
        StageError: (from ``result``) an unsupported model or final norm, or (with ``rows``) a
            layer the recorder did not see.
    """
    names = attribution_names(handle.n_layers)
    last: dict[str, Tensor] = {}

    def stream(name: str, value: Tensor) -> None:
        last[name] = value[0, -1].double().cpu()

    with (batch_rows(handle) if rows else contextlib.nullcontext()) as read_rows, \
            HookedModel(handle).hooks(cache=names, stream=stream):

        def result(last_logits: Tensor, a: int, b: int, *, stack: bool = False
                   ) -> dict[str, Any]:
            extra: dict[str, Any] = {"rows": read_rows()[0]} if rows else {}
            attrs = logit_attribution(last, handle.model, a, b, stack=stack)
            total = float(last_logits[a].double() - last_logits[b].double())
            return {**attrs, "total": total, **extra}

        yield result


class TunedLens(torch.nn.Module):
    """One affine translator per layer, ``T_L(h) = h + h A_L^T + b_L`` (Belrose et al. 2023).

    Layer indices follow :func:`stack_names` (0: the embeddings; ``n_layers``: the last block's
    output, whose translator is fixed to the identity, so the tuned lens's last layer is the
    model's own readout).

    Args:
        n_layers: the model's blocks.
        d_model: its residual width.
    """

    def __init__(self, n_layers: int, d_model: int) -> None:
        super().__init__()
        self.n_layers, self.d_model = n_layers, d_model
        self.weight = torch.nn.Parameter(torch.zeros(n_layers, d_model, d_model))
        self.bias = torch.nn.Parameter(torch.zeros(n_layers, d_model))

    def translate(self, stack: Float[Tensor, "layer ... d_model"]
                  ) -> Float[Tensor, "layer ... d_model"]:
        """``T_L`` applied to ``stack[L]`` for every layer (the last one unchanged)."""
        if stack.shape[0] != self.n_layers + 1:
            raise StageError("lens", f"a stack of {stack.shape[0]} layers for a tuned lens of "
                                     f"{self.n_layers + 1}")
        head = stack[:-1].float()
        shape = head.shape
        flat = head.reshape(self.n_layers, -1, self.d_model)
        moved = flat + torch.baddbmm(self.bias[:, None, :], flat, self.weight.transpose(1, 2))
        return torch.cat([moved.reshape(shape), stack[-1:].float()])

    def save(self, path: str | Path, metadata: Mapping[str, str] | None = None) -> Path:
        """Write the translators as safetensors (``weight``, ``bias``) with ``metadata``."""
        return save_tensors(path, {"weight": self.weight, "bias": self.bias}, metadata)

    @classmethod
    def load(cls, path: str | Path) -> TunedLens:
        """Read translators written by :meth:`save`.

        Raises:
            StageError: a file without ``weight`` and ``bias`` of matching shapes.
        """
        t = load_tensors(path)
        if set(t) != {"weight", "bias"} or t["weight"].shape[:1] != t["bias"].shape[:1]:
            raise StageError("lens", f"{path} is not a tuned lens (tensors {sorted(t)})")
        lens = cls(t["weight"].shape[0], t["weight"].shape[-1])
        with torch.no_grad():
            lens.weight.copy_(t["weight"])
            lens.bias.copy_(t["bias"])
        return lens


def lens_kl(ro: Readout, stack: Float[Tensor, "layer n d_model"],
            final_logits: Float[Tensor, "n vocab"], lens: TunedLens | None = None, *,
            chunk: int | None = None) -> Float[Tensor, " layer"]:
    """Mean ``KL(final || lens)`` per layer (nats): how far each layer's readout is from the output.

    The tuned-lens paper's evaluation (Belrose et al. 2023, Fig. 2): a translator is worth its
    parameters where it lowers this below the logit lens's. Computed ``chunk`` positions at a
    time (None: as many as :data:`LOGIT_CHUNK_BYTES` of ``[layer, chunk, vocab]`` allow).
    """
    total = torch.zeros(stack.shape[0], dtype=torch.float64)
    n = stack.shape[1]
    spans = (position_chunks(n, stack.shape[0], ro.weight.shape[0]) if chunk is None
             else [(s, min(n, s + chunk)) for s in range(0, n, chunk)])
    with torch.no_grad():
        for s, e in spans:
            p = final_logits[s:e].float().log_softmax(-1)             # [c, vocab]
            q = lens_logits(ro, stack[:, s:e], lens).log_softmax(-1)  # [L, c, vocab]
            total += (p.exp() * (p - q)).sum(-1).sum(-1).double()
    return total / stack.shape[1]


def fit_tuned_lens(ro: Readout, stack: Float[Tensor, "layer n d_model"],
                   final_logits: Float[Tensor, "n vocab"], *, ridge: float = 1e-2,
                   kl_steps: int = 0, batch: int = 32, lr: float = 1e-3, seed: int = 0,
                   on_step: Callable[[int, float], None] | None = None) -> TunedLens:
    """Train a :class:`TunedLens` on residual stacks of training positions.

    1. Start (Din et al. 2023): for each layer ``L < n_layers``, the ridge least-squares affine
       map from ``stack[L]`` to the last layer's residual stream ``stack[-1]`` (in the
       residual basis, standardised by the input's RMS), written as ``I + A_L`` and ``b_L``.
    2. Refine (Belrose et al. 2023, objective of Sec. 3): ``kl_steps`` Adam steps (learning
       rate ``lr``) on ``KL(final || tuned lens)`` summed over layers, each on ``batch``
       positions drawn with ``seed``. The paper trains far longer (250 SGD steps of 2^18
       tokens); a CPU affords few steps of few positions, so the start does most of the work:
       the held-out :func:`lens_kl` shows whether the translators beat the logit lens.

    Args:
        ro: the model's :func:`readout`.
        stack: ``[n_layers + 1, n, d_model]`` residual streams of ``n`` training positions.
        final_logits: ``[n, d_vocab]`` the model's own logits at those positions.
        ridge: the ridge penalty, relative to the mean squared input (dimensionless).
        kl_steps: KL refinement steps (0: the least-squares start alone).
        batch: positions per step.
        lr: Adam's learning rate.
        seed: the position sampler's seed.
        on_step: called with ``(step, loss)`` after every KL step (progress).

    Returns:
        The trained lens (its parameters frozen).

    Raises:
        StageError: fewer positions than ``d_model / 8`` (the least-squares start is then
            underdetermined beyond what the ridge penalty fixes) or a bad setting.
    """
    n_layers = stack.shape[0] - 1
    d, n = stack.shape[-1], stack.shape[1]
    if n < max(8, d // 8):
        raise StageError("lens",
                         f"{n} training positions for a residual width of {d}: need at least "
                         f"{max(8, d // 8)} (raise the tuned lens's train_limit)")
    if ridge < 0 or kl_steps < 0 or batch < 1 or lr <= 0:
        raise StageError("lens",
                         "tuned lens: ridge >= 0, kl_steps >= 0, batch >= 1 and lr > 0 needed")
    lens = TunedLens(n_layers, d)
    y = stack[-1].double()
    with torch.no_grad():
        for i in range(n_layers):
            x = stack[i].double()
            mu_x, mu_y = x.mean(0), y.mean(0)
            xc, yc = x - mu_x, y - mu_y
            lam = ridge * float(xc.pow(2).mean()) * n
            m = torch.linalg.solve(xc.T @ xc + lam * torch.eye(d, dtype=x.dtype), xc.T @ yc)
            a = m.T - torch.eye(d, dtype=x.dtype)                      # T(h) = h + A h + b
            lens.weight[i] = a.float()
            lens.bias[i] = (mu_y - mu_x @ m).float()
    if kl_steps:
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.Adam(lens.parameters(), lr=lr)
        target = final_logits.float().log_softmax(-1)
        for step in range(kl_steps):
            idx = torch.randint(0, n, (min(batch, n),), generator=gen)
            q = lens_logits(ro, stack[:, idx], lens)[:-1].log_softmax(-1)   # [L, b, vocab]
            p = target[idx]
            loss = (p.exp() * (p - q)).sum(-1).mean(-1).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if on_step is not None:
                on_step(step, float(loss.detach()))
    lens.requires_grad_(False)
    return lens
