"""Hook-point names and where they sit in a Hugging Face model: the only place module paths live.

Names follow TransformerLens (``blocks.{L}.hook_resid_pre``, ``blocks.{L}.attn.hook_z``, ...) so
that tensors recorded here load into TransformerLens-style code without renaming. Each point is
the input or the output of one module of decoder block ``L``:

==========================  ================================  ======  ===========================
point                       module (relative to block L)      io      shape
==========================  ================================  ======  ===========================
``hook_resid_pre``          the block itself                  input   ``[batch, pos, d_model]``
``attn.hook_k``             ``self_attn.k_proj``              output  ``[batch, pos, n_kv_heads,
                                                                      head_dim]`` (viewed)
``attn.hook_v``             ``self_attn.v_proj``              output  ``[batch, pos, n_kv_heads,
                                                                      head_dim]`` (viewed)
``attn.hook_z``             ``self_attn.o_proj``              input   ``[batch, pos, n_heads,
                                                                      head_dim]`` (viewed)
``hook_attn_out``           ``self_attn``                     output  ``[batch, pos, d_model]``
``hook_resid_mid``          ``post_attention_layernorm``      input   ``[batch, pos, d_model]``
``hook_mlp_out``            ``mlp``                           output  ``[batch, pos, d_model]``
``hook_resid_post``         the block itself                  output  ``[batch, pos, d_model]``
==========================  ================================  ======  ===========================

``attn.hook_k`` / ``attn.hook_v`` are the keys and values before rotary embedding and before
grouped-query attention repeats them (TransformerLens's ``hook_k`` / ``hook_v`` of a GQA model):
one entry per key/value head. Query head ``h`` reads key/value head :func:`kv_head` ``(h)`` =
``h // (n_heads // n_kv_heads)`` (transformers' ``repeat_kv``), so an edit of key/value head
``g`` reaches exactly the query heads :func:`query_heads` ``(g)`` at ``attn.hook_z`` of the same
block (Qwen2.5-Coder-0.5B: 14 query / 2 key/value heads, head 1 feeds query heads 7-13).

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
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from interp.core.errors import HookError, ModelSpecError
from interp.core.names import did_you_mean

__all__ = [
    "ALL_POINTS",
    "ARCHITECTURES",
    "HEAD_POINTS",
    "HOOK_POINTS",
    "PATTERN_POINT",
    "HookSite",
    "base_model",
    "check_architecture",
    "check_heads",
    "decoder_layers",
    "hook_error",
    "hook_name",
    "hook_site",
    "kv_head",
    "n_heads_at",
    "parse_hook",
    "query_heads",
    "resolve",
]

HOOK_POINTS: dict[str, tuple[str, str]] = {
    "hook_resid_pre": ("", "input"),
    "attn.hook_k": ("self_attn.k_proj", "output"),
    "attn.hook_v": ("self_attn.v_proj", "output"),
    "attn.hook_z": ("self_attn.o_proj", "input"),
    "hook_attn_out": ("self_attn", "output"),
    "hook_resid_mid": ("post_attention_layernorm", "input"),
    "hook_mlp_out": ("mlp", "output"),
    "hook_resid_post": ("", "output"),
}
"""Per-block hook point -> (module path relative to the block, ``input`` or ``output``), in
execution order within a block."""

HEAD_POINTS: dict[str, str] = {
    "attn.hook_k": "num_key_value_heads",
    "attn.hook_v": "num_key_value_heads",
    "attn.hook_z": "num_attention_heads",
}
"""Hook points viewed per head: point -> the config attribute that counts their heads."""

ARCHITECTURES: dict[str, str] = {
    "llama": "model.layers",
    "qwen2": "model.layers",
    "mistral": "model.layers",
    "qwen3": "model.layers",
}
"""``config.model_type`` -> path of the decoder block list from the ``*ForCausalLM`` model."""

PATTERN_POINT = "attn.hook_pattern"
"""The attention pattern's point: no module's input or output holds it under SDPA; it is
recorded inside the attention function (:mod:`interp.hooks.recorder`) and read through
:meth:`interp.hooks.model.HookedModel.run_with_cache`, not through module hooks."""

ALL_POINTS: tuple[str, ...] = (*HOOK_POINTS, PATTERN_POINT)
"""Every point of a block a name can hold (an activation cache's points)."""

_LAYERED = re.compile(r"^blocks\.(-?\d+)\.(.+)$")


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
        raise HookError(f"unknown hook point {point!r}{did_you_mean(point, HOOK_POINTS)}; known: "
                        f"{list(HOOK_POINTS)}")
    return f"blocks.{int(layer)}.{point}"


def parse_hook(name: str, n_layers: int, points: Iterable[str] = HOOK_POINTS
               ) -> tuple[int, str]:
    """Split ``blocks.{L}.{point}`` into ``(layer, point)``; negative ``L`` counts from the end.

    Args:
        name: a full hook name (``blocks.3.attn.hook_z``).
        n_layers: the model's depth.
        points: the points valid where the name is used (default :data:`HOOK_POINTS`, the
            module hook points; :data:`ALL_POINTS` adds the attention pattern).

    Raises:
        HookError: :func:`hook_error`: an unknown name (lists every valid point, suggests the
            closest full name) or a layer outside ``0 .. n_layers-1`` (names the user's hook).
    """
    points = tuple(points)
    m = _LAYERED.match(name) if isinstance(name, str) else None
    if m is None or m.group(2) not in points:
        raise hook_error(name, n_layers, points)
    layer = int(m.group(1))
    layer = layer + n_layers if layer < 0 else layer
    if not 0 <= layer < n_layers:
        raise hook_error(name, n_layers, points)
    return layer, m.group(2)


def hook_error(name: Any, n_layers: int, points: Iterable[str] = HOOK_POINTS) -> HookError:
    """The one-line error for a hook name that is not ``blocks.{L}.{point}`` of this model.

    Every place that checks a full hook name raises this error, so each says the same: a
    layer out of range names the user's own hook and the valid layers; an unknown point lists
    every valid point (per layer, compactly: ``blocks.{L}.{point}``) and suggests the closest
    full name (``did you mean 'blocks.2.attn.hook_pattern'?``,
    :func:`interp.core.names.did_you_mean`); a point that exists but not here
    (``attn.hook_pattern`` for a module hook) says so.

    Args:
        name: the name the user passed.
        n_layers: the model's depth.
        points: the points valid where the name is used.

    Returns:
        The :class:`interp.core.errors.HookError` to raise.
    """
    points = list(points)
    rng = f"0..{n_layers - 1}" if n_layers < 10**9 else "0, 1, ..."
    valid = f"valid: blocks.{{L}}.{{point}} with L in {rng} and point in {points}"
    m = _LAYERED.match(name) if isinstance(name, str) else None
    if m is not None and m.group(2) in points:
        return HookError(f"layer {m.group(1)} of {name!r} is out of range: the model has "
                         f"{n_layers} layers; valid layers: 0..{n_layers - 1} (or -{n_layers}..-1 "
                         f"from the end)")
    if m is not None and m.group(2) in ALL_POINTS:
        return HookError(f"{m.group(2)!r} of {name!r} is not a point here (the attention "
                         f"pattern is read by run_with_cache, not by module hooks); {valid}")
    if m is not None:
        layer = int(m.group(1))
        shown = m.group(1) if -n_layers <= layer < n_layers else "{L}"
        hint = did_you_mean(m.group(2), points)
        hint = hint.replace("'", f"'blocks.{shown}.", 1) if hint else ""
    else:
        tail = str(name).rsplit(".", 2)
        hint = did_you_mean(".".join(tail[-2:]), points) or did_you_mean(tail[-1], points)
        num = re.search(r"\.(-?\d+)\.", str(name))
        shown = num.group(1) if num and -n_layers <= int(num.group(1)) < n_layers else "{L}"
        hint = hint.replace("'", f"'blocks.{shown}.", 1) if hint else ""
    return HookError(f"unknown hook point {name!r}{hint}; {valid}")


def base_model(model: Any) -> Any:
    """The ``*ForCausalLM`` model under a PEFT wrapper (the model itself otherwise)."""
    if hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


def _blocks_path(model: Any) -> str:
    return ARCHITECTURES[check_architecture(model)]


def check_architecture(model: Any, what: str = "interp's hook points",
                       error: type[Exception] = HookError) -> str:
    """The ``model_type`` of ``model`` (PEFT unwrapped), refused unless in :data:`ARCHITECTURES`.

    Args:
        model: a ``*ForCausalLM`` model (or a PEFT model around one).
        what: what needs the architecture, named in the message (e.g. "the nnsight backend").
        error: the error class to raise.

    Raises:
        error: another architecture; the message names the supported ones.
    """
    m = base_model(model)
    mt = getattr(getattr(m, "config", None), "model_type", None)
    if mt not in ARCHITECTURES:
        raise error(f"{what}: supported architectures are {sorted(ARCHITECTURES)}, not "
                    f"{type(m).__name__} (model_type {mt!r})")
    return str(mt)


def check_heads(config_or_model: Any) -> None:
    """Refuse a model whose query heads are not a multiple of its key/value heads.

    Grouped-query attention gives query head ``h`` the key/value head ``h // (n_heads //
    n_kv_heads)``; with 6 query and 4 key/value heads there is no such grouping and transformers
    fails with a shape error inside the attention. Configs without head counts pass.

    Args:
        config_or_model: a transformers config, a model, or a PEFT model around one.

    Raises:
        ModelSpecError: ``num_attention_heads % num_key_value_heads != 0`` (names both).
    """
    obj = base_model(config_or_model)
    cfg = getattr(obj, "config", obj)
    n_heads = getattr(cfg, "num_attention_heads", None)
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    if isinstance(n_heads, int) and isinstance(n_kv, int) and n_kv > 0 and n_heads % n_kv:
        raise ModelSpecError(f"the model has {n_heads} query heads and {n_kv} key/value heads: "
                             f"query heads must be a multiple of key/value heads (grouped-query "
                             f"attention); interp cannot run it")


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


def n_heads_at(model: Any, point: str) -> int | None:
    """Heads of a per-head hook point (:data:`HEAD_POINTS`) of ``model``; None for other points.

    Args:
        model: a causal LM, a PEFT model around one, or a transformers config.
        point: a hook point such as ``attn.hook_z`` or ``attn.hook_v``.
    """
    if point not in HEAD_POINTS:
        return None
    obj = base_model(model)
    cfg = getattr(obj, "config", obj)
    n = getattr(cfg, HEAD_POINTS[point], None)
    return int(n if n else cfg.num_attention_heads)


def kv_head(h: int, n_heads: int, n_kv_heads: int) -> int:
    """The key/value head that query head ``h`` reads under grouped-query attention.

    ``h // (n_heads // n_kv_heads)``: transformers' ``repeat_kv`` repeats each key/value head
    for ``n_heads // n_kv_heads`` consecutive query heads (Ainslie et al. 2023, "GQA").

    Raises:
        ModelSpecError: ``n_heads`` not a multiple of ``n_kv_heads``.
        ValueError: ``h`` outside ``0 .. n_heads - 1``.
    """
    check_heads(_Heads(n_heads, n_kv_heads))
    if not 0 <= h < n_heads:
        raise ValueError(f"query head {h} out of range 0..{n_heads - 1}")
    return h // (n_heads // n_kv_heads)


def query_heads(g: int, n_heads: int, n_kv_heads: int) -> range:
    """The query heads that read key/value head ``g`` (the inverse of :func:`kv_head`).

    Raises:
        ModelSpecError: ``n_heads`` not a multiple of ``n_kv_heads``.
        ValueError: ``g`` outside ``0 .. n_kv_heads - 1``.
    """
    check_heads(_Heads(n_heads, n_kv_heads))
    if not 0 <= g < n_kv_heads:
        raise ValueError(f"key/value head {g} out of range 0..{n_kv_heads - 1}")
    group = n_heads // n_kv_heads
    return range(g * group, (g + 1) * group)


@dataclass(frozen=True)
class _Heads:
    """A stand-in config with head counts only (for :func:`check_heads`)."""

    num_attention_heads: int
    num_key_value_heads: int
