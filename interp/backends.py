"""Hooked views of a loaded model: TransformerLens ``TransformerBridge`` and nnsight, offline.

Both wrap the ``PreTrainedModel`` a :class:`interp.models.ModelHandle` holds, offline (no hub
access):

1. :func:`to_tlens` boots ``TransformerBridge.boot_transformers(path, hf_model=model,
   tokenizer=tok)``. Booting replaces the wrapped model's submodules with bridge components
   and forces eager attention (so that ``blocks.L.attn.hook_pattern`` fires), so by default it
   wraps a deep copy and the handle's model is left as it was. The bridge prepends BOS only
   when given a STRING; feed it token ids (``bridge.run_with_cache(ids)``) to run exactly the
   prompt interp rendered.
2. :func:`to_nnsight` wraps the model in nnsight's ``TransformersModel`` (the successor of the
   deprecated ``LanguageModel``; the latter is used on older nnsight). Modules must be read in
   the order they execute inside a trace.
3. Hook-point names follow TransformerLens (:func:`hook_name`): ``blocks.{L}.hook_resid_pre``,
   ``blocks.{L}.attn.hook_pattern``, ``blocks.{L}.attn.hook_z``, ... and
   :func:`hf_module_path` gives the matching Hugging Face module path for plain hooks/nnsight.

Wrappers are cached per model object, so repeated calls are cheap. GQA convention everywhere:
query head ``h`` reads key/value head ``h // (n_heads // n_kv_heads)`` (``repeat_kv``).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

from interp.errors import BackendError
from interp.models import ModelHandle

_TLENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_NNSIGHT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

HOOK_POINTS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "attn.hook_pattern",
               "attn.hook_attn_scores", "attn.hook_z", "attn.hook_result", "attn.hook_q",
               "attn.hook_k", "attn.hook_v", "hook_attn_out", "hook_mlp_out")
"""Per-block TransformerLens hook points that :func:`hook_name` accepts."""

_HF_PATHS = {"hook_resid_pre": "model.layers.{L}", "hook_resid_post": "model.layers.{L}",
             "attn.hook_pattern": "model.layers.{L}.self_attn",
             "attn.hook_z": "model.layers.{L}.self_attn.o_proj",
             "hook_attn_out": "model.layers.{L}.self_attn",
             "hook_mlp_out": "model.layers.{L}.mlp"}


def hook_name(layer: int, point: str) -> str:
    """TransformerLens hook-point name, e.g. ``hook_name(3, "attn.hook_pattern")``.

    Args:
        layer: block index (0-based).
        point: one of :data:`HOOK_POINTS`.

    Returns:
        ``"blocks.{layer}.{point}"``.

    Raises:
        ValueError: an unknown hook point (the message lists the known ones).
    """
    if point not in HOOK_POINTS:
        raise ValueError(f"unknown hook point {point!r}; known: {list(HOOK_POINTS)}")
    return f"blocks.{int(layer)}.{point}"


def hf_module_path(layer: int, point: str) -> str:
    """Hugging Face (Llama-family) module path whose input/output holds a hook point.

    ``hook_resid_pre`` is the INPUT of ``model.layers.L``; ``hook_resid_post`` its OUTPUT;
    ``attn.hook_z`` the input of ``o_proj`` (``[batch, pos, n_heads * head_dim]``);
    ``attn.hook_pattern`` the second output of ``self_attn`` under eager attention.

    Raises:
        ValueError: a hook point without a plain module equivalent.
    """
    if point not in _HF_PATHS:
        raise ValueError(f"no Hugging Face module for {point!r}; have: {sorted(_HF_PATHS)}")
    return _HF_PATHS[point].format(L=int(layer))


@contextlib.contextmanager
def attn_implementation(handle: ModelHandle, name: str) -> Iterator[None]:
    """Temporarily run ``handle.model`` with another attention kernel (``eager``, ``sdpa``, ...).

    The previous implementation is restored on exit, also after an exception.
    """
    model = handle.model
    old = model.config._attn_implementation
    if old != name:
        _set_attn(model, name)
    try:
        yield
    finally:
        if model.config._attn_implementation != old:
            _set_attn(model, old)


def _set_attn(model: Any, name: str) -> None:
    try:
        model.set_attn_implementation(name)
    except (ValueError, KeyError, AttributeError):
        # custom names registered in AttentionInterface that set_attn_implementation refuses
        for mod in model.modules():
            cfg = getattr(mod, "config", None)
            if cfg is not None and hasattr(cfg, "_attn_implementation"):
                cfg._attn_implementation = name
    if model.config._attn_implementation != name:  # pragma: no cover - defensive
        model.config._attn_implementation = name


def to_tlens(handle: ModelHandle, *, copy: bool = True) -> Any:
    """Wrap the handle's model in a TransformerLens ``TransformerBridge`` (offline, cached).

    Booting a bridge REPLACES submodules of the model it wraps with bridge components (and
    forces eager attention), so by default it wraps a deep copy: the handle's model keeps its
    own modules, kernel and ``AttentionInterface`` dispatch (twice the weight memory while
    the bridge lives). ``copy=False`` wraps the handle's model itself; afterwards use the
    bridge, not ``handle.model``, for hooked forwards.

    Args:
        handle: the loaded model.
        copy: wrap a deep copy (default) instead of the model itself.

    Returns:
        ``transformer_lens.model_bridge.TransformerBridge``; run it on token ids
        (``bridge.run_with_cache(ids[None])``) so no BOS is prepended.

    Raises:
        BackendError: transformer-lens is missing or the architecture is unsupported.
    """
    model = handle.model
    if model in _TLENS:
        return _TLENS[model]
    target = model
    if copy:
        import copy as _copy

        target = _copy.deepcopy(model)
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError as err:  # pragma: no cover
        raise BackendError("the tlens backend needs transformer-lens>=4.3") from err
    name = (handle.info.get("cached_checkpoint") or handle.info.get("path")
            or getattr(model.config, "_name_or_path", None) or handle.spec)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bridge = TransformerBridge.boot_transformers(
                str(name), hf_model=target, tokenizer=handle.tokenizer, device=str(handle.device),
                dtype=next(model.parameters()).dtype)
    except Exception as err:  # noqa: BLE001 - report any boot failure the same way
        raise BackendError(f"TransformerBridge could not wrap {handle.spec!r}: {err}") from err
    _TLENS[model] = bridge
    return bridge


def to_nnsight(handle: ModelHandle) -> Any:
    """Wrap the handle's model for nnsight tracing (offline, cached, shares the weights).

    Returns:
        ``nnsight.modeling.transformers.TransformersModel`` (task ``text-generation``), or a
        ``nnsight.LanguageModel`` on nnsight versions without it. Inside ``with lm.trace(ids):``
        read modules in execution order, e.g. ``lm.model.layers[L].self_attn.output[1].save()``
        (the attention pattern ``[batch, n_heads, pos, pos]`` under eager attention).

    Raises:
        BackendError: nnsight is missing.
    """
    model = handle.model
    if model in _NNSIGHT:
        return _NNSIGHT[model]
    try:
        from nnsight.modeling.transformers import TransformersModel

        lm = TransformersModel(model, task="text-generation", tokenizer=handle.tokenizer)
    except ImportError:
        try:
            from nnsight import LanguageModel
        except ImportError as err:  # pragma: no cover
            raise BackendError("the nnsight backend needs nnsight>=0.8") from err
        lm = LanguageModel(model, tokenizer=handle.tokenizer)
    _NNSIGHT[model] = lm
    return lm
