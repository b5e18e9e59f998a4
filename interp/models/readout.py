"""The model's own final norm and unembedding: how a residual-stream vector becomes logits.

One home for the readout that the logit lens, direct logit attribution and the activation
cache's ``accumulated_resid(apply_ln=True)`` share (:mod:`interp.methods.lens`,
:mod:`interp.hooks.cache`). Pitfalls (each tested in ``tests/unit/methods/test_lens.py``):

1. Each vector is normalised with its OWN statistics (the norm module applied per vector), not
   with the final layer's scale folded into every layer.
2. Tied and untied unembeddings: the readout is ``model.get_output_embeddings()``, the matrix
   the forward pass uses (SmolLM2 ties it to the embedding, Qwen2.5's checkpoint does not).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from interp.core.errors import StageError
from interp.models.points import base_model

__all__ = ["NORM_KINDS", "Readout", "attribution_names", "logit_attribution", "norm_kind",
           "readout"]


NORM_KINDS = ("rms", "layer")
"""Final norms the attribution folds: RMSNorm (Zhang & Sennrich 2019; ``*RMSNorm`` modules of
transformers, ``torch.nn.RMSNorm``) and LayerNorm (Ba et al. 2016; ``torch.nn.LayerNorm``, with
or without its gain and bias)."""


def norm_kind(norm: Any) -> str:
    """Which of :data:`NORM_KINDS` a final norm module is.

    Args:
        norm: the final norm module.

    Returns:
        ``"rms"`` or ``"layer"``.

    Raises:
        StageError: another norm (the lens would fold it wrongly).
    """
    if isinstance(norm, torch.nn.LayerNorm):
        return "layer"
    if isinstance(norm, getattr(torch.nn, "RMSNorm", ())) or type(norm).__name__.endswith(
            "RMSNorm"):
        return "rms"
    raise StageError("lens",
                     f"the final norm is a {type(norm).__name__}; the lens folds only RMSNorm "
                     f"and LayerNorm final norms")


@dataclass(frozen=True)
class Readout:
    """The model's own final norm and unembedding (module docstring, pitfall 2).

    Attributes:
        norm: the final norm module (``model.model.norm``), one of :data:`NORM_KINDS`.
        weight: ``[d_vocab, d_model]``, the output embedding's weight: the embedding matrix
            itself when the model ties them.
        bias: ``[d_vocab]`` or None.
        tied: whether the output embedding IS the input embedding (same tensor).
        kind: the norm's kind (:func:`norm_kind`).
    """

    norm: Any
    weight: Float[Tensor, "vocab d_model"]
    bias: Float[Tensor, " vocab"] | None
    tied: bool
    kind: str = "rms"

    def logits(self, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... vocab"]:
        """The lens logits of residual vectors: final norm (each vector's own scale), unembed."""
        w = self.weight
        h = self.norm(resid.to(w.dtype))
        out = h @ w.T
        return out + self.bias if self.bias is not None else out

    def normalized(self, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The final norm applied to each vector with its own statistics (pitfall 1)."""
        return self.norm(resid.to(self.weight.dtype))

    def _eps(self, x: Tensor) -> float:
        eps = getattr(self.norm, "variance_epsilon", getattr(self.norm, "eps", None))
        return torch.finfo(x.dtype).eps if eps is None else float(eps)

    def scale(self, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... 1"]:
        """The final norm's scale of each vector (float32).

        RMSNorm: ``1 / sqrt(mean(x^2) + eps)``; LayerNorm: ``1 / sqrt(var(x) + eps)`` (the
        biased variance, as ``torch.nn.LayerNorm`` computes it).
        """
        x = resid.float()
        if self.kind == "layer":
            x = x - x.mean(-1, keepdim=True)
        return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self._eps(x))

    def fold(self, h: Float[Tensor, " d_model"], du: Float[Tensor, " d_model"]
             ) -> tuple[Float[Tensor, " d_model"], float]:
        """The final norm folded into an unembedding direction at ``h``'s frozen scale.

        With ``s`` the norm's scale of ``h`` (frozen), ``g`` its gain (ones when none), ``b`` its
        bias (zero when none) and ``C`` the centering ``x -> x - mean(x)`` (LayerNorm; the
        identity for RMSNorm), ``norm(h) . du = (s g * C h) . du + b . du = h . direction + b .
        du`` with ``direction = C(s g * du)`` (``C`` is symmetric), so every component ``c`` of
        ``h = sum c`` is attributed ``c . direction``, and the attributions plus ``b . du`` sum
        to ``norm(h) . du``. TransformerLens folds a LayerNorm the same way (``fold_ln``:
        gain and bias into the unembedding, centering into the weights writing to the residual
        stream).

        Args:
            h: ``[d_model]``, the residual stream the norm reads (float64).
            du: ``[d_model]``, an unembedding direction, e.g. ``W_U[a] - W_U[b]`` (float64).

        Returns:
            ``(direction [d_model] float64, bias term float)``.

        Raises:
            StageError: the module's own output on ``h`` is not the folded norm's (a norm of
                another kind behind a supported name, e.g. a gain stored as ``w - 1``).
        """
        gain = getattr(self.norm, "weight", None)
        g = gain.double().cpu() if gain is not None else torch.ones_like(h)
        beta = getattr(self.norm, "bias", None) if self.kind == "layer" else None
        b = beta.double().cpu() if beta is not None else torch.zeros_like(h)
        s = self.scale(h).double()
        centre = (lambda v: v - v.mean(-1, keepdim=True)) if self.kind == "layer" else (
            lambda v: v)
        p = next(iter(self.norm.parameters()), self.weight)
        own = self.norm(h.to(device=p.device, dtype=p.dtype)[None]).double().cpu()[0]
        folded = s * g * centre(h) + b
        tol = max(1e-3, 4 * torch.finfo(p.dtype).eps)  # the module computes in its dtype
        if not torch.allclose(own, folded, rtol=tol, atol=tol * float(own.abs().max()) + 1e-6):
            raise StageError("lens",
                             f"the final norm {type(self.norm).__name__} does not compute a "
                             f"{self.kind} norm (max difference "
                             f"{float((own - folded).abs().max()):.3g}); the lens cannot fold it")
        return centre(s * g * du), float(b @ du)


def readout(model: Any) -> Readout:
    """The final norm and the unembedding ``model`` uses (a PEFT model is unwrapped).

    Raises:
        StageError: the model has no ``model.norm`` or no output embedding, or its final norm is
            neither RMSNorm nor LayerNorm (:func:`norm_kind`).
    """
    base = base_model(model)
    inner = getattr(base, "model", None)
    norm = getattr(inner, "norm", None)
    out = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if norm is None or out is None:
        raise StageError("lens",
                         f"{type(base).__name__} has no final norm at model.norm or no output "
                         f"embedding; the lens supports decoder-only *ForCausalLM models")
    emb = base.get_input_embeddings()
    tied = emb is not None and out.weight.data_ptr() == emb.weight.data_ptr()
    return Readout(norm=norm, weight=out.weight, bias=getattr(out, "bias", None), tied=tied,
                   kind=norm_kind(norm))


def attribution_names(n_layers: int) -> list[str]:
    """Hook points :func:`logit_attribution` reads: embeddings, final residual, heads, MLPs."""
    return (["blocks.0.hook_resid_pre", f"blocks.{n_layers - 1}.hook_resid_post"]
            + [f"blocks.{i}.attn.hook_z" for i in range(n_layers)]
            + [f"blocks.{i}.hook_mlp_out" for i in range(n_layers)])


def logit_attribution(acts: Mapping[str, Tensor], model: Any, a: int, b: int, *,
                      stack: bool = False) -> dict[str, Any]:
    """Direct logit attribution of ``logit[a] - logit[b]`` at one position, from activations.

    Elhage et al. 2021, "A mathematical framework for transformer circuits" (TransformerLens
    ``cache.logit_attrs``): the final residual stream ``h`` is the embedding plus, for every
    block, each head's ``z_h W_O[h]``, the output projection's bias and the MLP's output; with
    the final norm folded at ``h``'s frozen scale (:meth:`Readout.fold`: RMSNorm's gain;
    LayerNorm's centering, gain and bias), ``logit[a] - logit[b] = sum over components c of
    c . direction + norm_bias + lm_bias``, so the attributions sum to the model's own logit
    difference up to float rounding.

    Args:
        acts: the activations of :func:`attribution_names` at ONE position: ``[d_model]`` for
            the residuals and MLP outputs, ``[n_heads, head_dim]`` for ``attn.hook_z``.
        model: the causal LM the activations came from (PEFT unwrapped).
        a: the token scored up.
        b: the token scored down.
        stack: also return ``"stack"``: the residual stream before block 0 and after every
            block, ``[n_layers + 1, d_model]`` float64, summed from the same components.

    Returns:
        ``{"heads": [n_layers, n_heads], "mlp": [n_layers], "attn_bias": [n_layers],
        "embed": float, "lm_bias": float, "norm_bias": float, "sum": float}`` in nats
        (float64; ``norm_bias``: a LayerNorm's bias on the direction, 0 for RMSNorm); ``sum``
        is the sum of every attribution.

    Raises:
        StageError: an unsupported model or final norm (see :func:`readout`,
            :meth:`Readout.fold`).
        KeyError: an activation of :func:`attribution_names` missing from ``acts``.
    """
    base = base_model(model)
    ro = readout(model)
    layers = base.model.layers
    n = len(layers)
    last = {k: v.double().cpu() for k, v in acts.items()}
    h = last[f"blocks.{n - 1}.hook_resid_post"]
    # the two unembedding rows only: a float64 copy of the whole unembedding would be
    # vocab x d_model x 8 bytes (4.2 GB at Llama 3.1's 128,256 x 4,096)
    w_ab = ro.weight[[a, b]].double().cpu()
    direction, norm_bias = ro.fold(h, w_ab[0] - w_ab[1])              # [d_model], float
    heads = torch.zeros(n, int(base.config.num_attention_heads), dtype=torch.float64)
    mlp = torch.zeros(n, dtype=torch.float64)
    attn_bias = torch.zeros(n, dtype=torch.float64)
    resid = [last["blocks.0.hook_resid_pre"]]
    for i, layer in enumerate(layers):
        o = layer.self_attn.o_proj
        wo = o.weight.double().cpu()                                  # [d_model, heads*hd]
        z = last[f"blocks.{i}.attn.hook_z"]                           # [heads, hd]
        hd = z.shape[-1]
        per_head = torch.einsum("hk,dhk->hd", z, wo.view(wo.shape[0], -1, hd))
        heads[i] = per_head @ direction
        if o.bias is not None:
            attn_bias[i] = o.bias.double().cpu() @ direction
        mlp[i] = last[f"blocks.{i}.hook_mlp_out"] @ direction
        if stack:
            out_i = per_head.sum(0) + (o.bias.double().cpu() if o.bias is not None else 0.0)
            resid.append(resid[-1] + out_i + last[f"blocks.{i}.hook_mlp_out"])
    embed = float(last["blocks.0.hook_resid_pre"] @ direction)
    lm_bias = float(ro.bias[a] - ro.bias[b]) if ro.bias is not None else 0.0
    s = float(heads.sum() + mlp.sum() + attn_bias.sum()) + embed + lm_bias + norm_bias
    return {"heads": heads, "mlp": mlp, "attn_bias": attn_bias, "embed": embed,
            "lm_bias": lm_bias, "norm_bias": norm_bias, "sum": s,
            **({"stack": torch.stack(resid)} if stack else {})}
