"""Run a model in eval mode for the duration of an interpretability call, then give it back.

Every interpretability entry point of the toolkit (the attention recorder, activation and
attribution patching, steering, probes' feature capture, cross-model patching) runs its
forwards inside :func:`inference_guard`. It is entered inside :func:`interp.hooks.capture.hooked`
and every backend forward (:mod:`interp.hooks.backends`), so any hooked forward is covered,
and again around the whole work of the public entry points (nesting is cheap and exact).

Algorithm of :func:`inference_guard` (docs/measuring.md, eval mode):

1. Check each model before anything changes (:func:`interp.models.points.check_heads`: query
   heads must be a multiple of key/value heads), so an unusable model is a one-line
   :class:`interp.core.errors.ModelSpecError`, not a torch shape error inside the attention.
2. Remember every module's ``training`` flag.
3. Put every model in eval mode (dropout off: a patched run and its baseline see the same
   network, so clean == corrupt gives exactly equal logit differences).
4. On exit, whatever raised, give each module back its own ``training`` flag (a model in a
   mixed mode gets exactly that mode back).

Why not refuse a model in training mode: the caller may be in the middle of training (a LoRA
run) and only want a measurement; switching for the duration and restoring costs nothing.

Hooks are not touched here: whoever registers a hook removes it in its own ``finally``
(:func:`interp.hooks.capture.hooked`, :func:`interp.hooks.steering.steering`). A guard
cannot tell a leftover hook from one a library installs for good (transformers installs its
output-capturing hooks lazily, on the first ``output_attentions=True`` forward, and keeps
them). :func:`hook_counts` is the check the tests use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from interp.models.loading import ModelHandle
from interp.models.points import check_heads

__all__ = ["HOOK_DICTS", "hook_counts", "inference_guard"]

HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
"""The per-module hook registries :func:`hook_counts` counts (``torch.nn.Module`` attributes)."""


def _modules(models: tuple[Any, ...]) -> list[Any]:
    """The distinct ``torch.nn.Module`` objects behind models / handles (None skipped)."""
    out, seen = [], set()
    for m in models:
        m = m.model if isinstance(m, ModelHandle) else m
        if m is None or id(m) in seen or not isinstance(m, torch.nn.Module):
            continue
        seen.add(id(m))
        out.append(m)
    return out


def hook_counts(model: Any) -> dict[str, tuple[int, ...]]:
    """Hooks per module: ``{module name: (n per registry of HOOK_DICTS)}`` (modules with any).

    Args:
        model: a ``torch.nn.Module`` or a :class:`interp.models.loading.ModelHandle`.
    """
    model = model.model if isinstance(model, ModelHandle) else model
    out = {}
    for name, mod in model.named_modules():
        n = tuple(len(getattr(mod, d, {}) or {}) for d in HOOK_DICTS)
        if any(n):
            out[name] = n
    return out


@contextlib.contextmanager
def inference_guard(*models: Any) -> Iterator[None]:
    """Run the body with every model in eval mode; restore each module's mode on exit.

    Example:
        >>> with inference_guard(handle, donor):
        ...     logits = handle.model(input_ids=ids).logits

    Args:
        *models: ``torch.nn.Module`` objects or :class:`interp.models.loading.ModelHandle` s
            (None is skipped: an optional donor model).

    Raises:
        ModelSpecError: a model whose query heads are not a multiple of its key/value heads
            (raised before anything changes).
    """
    mods = _modules(models)
    for m in mods:
        check_heads(m)
    state = [(sub, sub.training) for m in mods for sub in m.modules()]
    try:
        for m in mods:
            m.eval()
        yield
    finally:
        for sub, training in state:
            sub.training = training
