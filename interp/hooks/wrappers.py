"""The model under another library or kernel: TransformerLens and nnsight wrappers, attention.

* :func:`to_tlens`: a TransformerLens ``TransformerBridge`` booted offline on a deep copy of the
  model (booting replaces the wrapped model's submodules), cached weakly per model.
* :func:`to_nnsight`: an nnsight wrapper sharing the model's weights (not cached).
* :func:`attn_implementation`: run the model with another attention kernel for a while.

Nothing here keeps a model alive (the bridge cache is a :class:`weakref.WeakKeyDictionary`).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

from interp.core.errors import BackendError
from interp.models.loading import ModelHandle
from interp.models.points import check_architecture

__all__ = ["attn_implementation", "envoy", "to_nnsight", "to_tlens"]

_TLENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
    """Wrap the handle's model in a TransformerLens ``TransformerBridge`` (offline).

    Booting a bridge REPLACES submodules of the model it wraps with bridge components (and
    forces eager attention), so by default it wraps a deep copy: the handle's model keeps its
    own modules, kernel and ``AttentionInterface`` dispatch; the copy SHARES the weights
    (:func:`_deepcopy`), so an edit of a weight through either is seen by both (do not run
    TransformerLens's weight processing, ``process_weights``, on it). The bridge of a copy is
    cached per model (weakly: it dies with the model). ``copy=False`` wraps the handle's model
    itself (not cached); afterwards use the bridge, not ``handle.model``, for hooked forwards.

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
    check_architecture(model, "the transformer_lens backend", BackendError)
    if copy and model in _TLENS:
        return _TLENS[model]
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError as err:  # pragma: no cover
        raise BackendError("the transformer_lens backend needs transformer-lens>=4.3") from err
    target = _deepcopy(model) if copy else model
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
    if copy:
        _TLENS[model] = bridge
    return bridge


def _deepcopy(model: Any) -> Any:
    """A copy of ``model``'s modules that shares its parameters (same tensors, no new weights).

    Booting a bridge replaces modules of the model it wraps, so it gets its own module tree;
    the weights stay the handle's (``deepcopy`` with every parameter memoised as itself), so
    the bridge costs buffers and module objects, not a second copy of the weights.
    """
    return copy.deepcopy(model, {id(p): p for p in model.parameters()})


def to_nnsight(handle: ModelHandle) -> Any:
    """Wrap the handle's model for nnsight tracing (offline, shares the weights).

    Not cached: the wrapper holds the model, so a cache keyed on the model would keep every
    wrapped model alive; wrapping costs milliseconds.

    Returns:
        ``nnsight.modeling.transformers.TransformersModel`` (task ``text-generation``), or a
        ``nnsight.LanguageModel`` on nnsight versions without it. Inside ``with lm.trace(ids):``
        read and assign module inputs/outputs in execution order; the envoy of a hook point
        is at its module path (:func:`interp.models.points.hook_site`).

    Raises:
        BackendError: nnsight is missing, or an architecture interp has no module paths for
            (the message names :data:`interp.models.points.ARCHITECTURES`).
    """
    check_architecture(handle.model, "the nnsight backend", BackendError)
    try:
        from nnsight.modeling.transformers import TransformersModel

        return TransformersModel(handle.model, task="text-generation", tokenizer=handle.tokenizer)
    except ImportError:
        try:
            from nnsight import LanguageModel
        except ImportError as err:  # pragma: no cover
            raise BackendError("the nnsight backend needs nnsight>=0.8") from err
        return LanguageModel(handle.model, tokenizer=handle.tokenizer)


def envoy(lm: Any, path: str) -> Any:
    """The nnsight envoy of the module at a dotted path (list indices as integers).

    Args:
        lm: an nnsight wrapper (:func:`to_nnsight`).
        path: a module path from the causal LM (:func:`interp.models.points.hook_site`'s
            ``module_path``, e.g. ``model.layers.5.self_attn``).
    """
    obj = lm
    for part in path.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj
