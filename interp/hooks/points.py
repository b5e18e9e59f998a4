"""Hook-point names and where they sit in a Hugging Face model: the only place module paths live.

Names follow TransformerLens (``blocks.{L}.hook_resid_pre``, ``blocks.{L}.attn.hook_z``, ...) so
that tensors recorded here load into TransformerLens-style code without renaming. Each point is
the input or the output of one module of decoder block ``L``:

==========================  ================================  ======  ===========================
point                       module (relative to block L)      io      shape
==========================  ================================  ======  ===========================
``hook_resid_pre``          the block itself                  input   ``[batch, pos, d_model]``
``attn.hook_z``             ``self_attn.o_proj``              input   ``[batch, pos, n_heads,
                                                                      head_dim]`` (viewed)
``hook_attn_out``           ``self_attn``                     output  ``[batch, pos, d_model]``
``hook_resid_mid``          ``post_attention_layernorm``      input   ``[batch, pos, d_model]``
``hook_mlp_out``            ``mlp``                           output  ``[batch, pos, d_model]``
``hook_resid_post``         the block itself                  output  ``[batch, pos, d_model]``
==========================  ================================  ======  ===========================

``attn.hook_pattern`` (the attention pattern) has no module whose input or output holds it under
SDPA; it is recorded inside the attention function (:mod:`interp.hooks.recorder`).

Off-by-one to keep in mind: transformers' ``output_hidden_states`` gives ``hidden_states[0]`` =
embeddings = ``blocks.0.hook_resid_pre`` and ``hidden_states[L + 1]`` = ``blocks.L.hook_resid_post``
for ``L < n_layers - 1``; the last entry is AFTER the final norm, not ``hook_resid_post`` of the
last block.

Supported architectures (decoder blocks at ``model.layers``, attention at ``self_attn`` with
``o_proj``): :data:`ARCHITECTURES`. A PEFT model is unwrapped to its base model first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from interp.errors import HookError

__all__ = [
    "ARCHITECTURES",
    "HOOK_POINTS",
    "HookSite",
    "base_model",
    "decoder_layers",
    "hook_name",
    "hook_site",
    "parse_hook",
    "resolve",
]

HOOK_POINTS: dict[str, tuple[str, str]] = {
    "hook_resid_pre": ("", "input"),
    "attn.hook_z": ("self_attn.o_proj", "input"),
    "hook_attn_out": ("self_attn", "output"),
    "hook_resid_mid": ("post_attention_layernorm", "input"),
    "hook_mlp_out": ("mlp", "output"),
    "hook_resid_post": ("", "output"),
}
"""Per-block hook point -> (module path relative to the block, ``input`` or ``output``), in
execution order within a block."""

ARCHITECTURES: dict[str, str] = {
    "llama": "model.layers",
    "qwen2": "model.layers",
    "mistral": "model.layers",
    "qwen3": "model.layers",
}
"""``config.model_type`` -> path of the decoder block list from the ``*ForCausalLM`` model."""

_NAME = re.compile(r"^blocks\.(-?\d+)\.(" + "|".join(re.escape(p) for p in HOOK_POINTS) + r")$")


@dataclass(frozen=True)
class HookSite:
    """Where one hook point sits.

    Attributes:
        name: ``blocks.{layer}.{point}``.
        layer: block index (0-based, non-negative).
        point: one of :data:`HOOK_POINTS`.
        module_path: dotted path of the module from the ``*ForCausalLM`` model
            (e.g. ``model.layers.5.self_attn.o_proj``).
        io: ``"input"`` (read/edited in a forward pre-hook) or ``"output"`` (a forward hook).
    """

    name: str
    layer: int
    point: str
    module_path: str
    io: str

    @property
    def order(self) -> tuple[int, int]:
        """Execution order key: (layer, position of the point within the block)."""
        return self.layer, list(HOOK_POINTS).index(self.point)


def hook_name(layer: int, point: str) -> str:
    """TransformerLens hook-point name, e.g. ``hook_name(3, "attn.hook_z")``.

    Raises:
        HookError: an unknown point (the message lists the known ones).
    """
    if point not in HOOK_POINTS:
        raise HookError(f"unknown hook point {point!r}; known: {list(HOOK_POINTS)}")
    return f"blocks.{int(layer)}.{point}"


def parse_hook(name: str, n_layers: int) -> tuple[int, str]:
    """Split ``blocks.{L}.{point}`` into ``(layer, point)``; negative ``L`` counts from the end.

    Raises:
        HookError: an unknown name or a layer outside ``0 .. n_layers-1`` (the message lists
            the valid points and layers).
    """
    m = _NAME.match(name)
    if not m:
        raise HookError(f"unknown hook point {name!r}; use blocks.{{L}}.{{point}} with point in "
                        f"{list(HOOK_POINTS)} and L in 0..{n_layers - 1}, e.g. "
                        f"'blocks.0.hook_resid_pre'")
    layer = int(m.group(1))
    layer = layer + n_layers if layer < 0 else layer
    if not 0 <= layer < n_layers:
        raise HookError(f"layer {m.group(1)} of {name!r} is out of range; valid layers: "
                        f"0..{n_layers - 1}")
    return layer, m.group(2)


def base_model(model: Any) -> Any:
    """The ``*ForCausalLM`` model under a PEFT wrapper (the model itself otherwise)."""
    if hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


def _blocks_path(model: Any) -> str:
    mt = getattr(getattr(model, "config", None), "model_type", None)
    if mt in ARCHITECTURES:
        return ARCHITECTURES[mt]
    raise HookError(f"{type(model).__name__} (model_type {mt!r}) is not a supported "
                    f"architecture; supported: {sorted(ARCHITECTURES)}")


def decoder_layers(model: Any) -> Any:
    """The decoder block list (``torch.nn.ModuleList``) of a causal LM or a PEFT model around one.

    Raises:
        HookError: an unsupported architecture (the message names the supported ones).
    """
    m = base_model(model)
    obj = m
    for part in _blocks_path(m).split("."):
        obj = getattr(obj, part)
    return obj


def hook_site(model: Any, name: str) -> HookSite:
    """Describe where the hook point ``name`` sits in ``model`` (checked against its depth).

    Raises:
        HookError: unknown point, layer out of range, or unsupported architecture.
    """
    m = base_model(model)
    layer, point = parse_hook(name, int(m.config.num_hidden_layers))
    rel, io = HOOK_POINTS[point]
    path = f"{_blocks_path(m)}.{layer}" + (f".{rel}" if rel else "")
    return HookSite(name=hook_name(layer, point), layer=layer, point=point, module_path=path,
                    io=io)


def resolve(model: Any, name: str) -> tuple[Any, HookSite]:
    """The module whose input or output holds hook point ``name``, and its :class:`HookSite`.

    Raises:
        HookError: as :func:`hook_site`.
    """
    site = hook_site(model, name)
    return base_model(model).get_submodule(site.module_path), site
