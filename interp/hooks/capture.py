"""Read and edit activations at hook points with plain PyTorch hooks.

One implementation for every study: attention's saved activations, probe features, activation
patching, cross-model patching.

Algorithm of :func:`hooked`:

1. Resolve every requested hook-point name to its module and side (input / output) with
   :func:`interp.models.points.resolve`; an unknown point or a layer outside the model raises
   :class:`interp.core.errors.HookError` BEFORE any hook is registered.
2. Register one forward pre-hook (input side) or forward hook (output side) per name. At run
   time the hook takes the tensor (``args[0]`` or the ``hidden_states`` keyword; ``output[0]``
   when a module returns a tuple), views ``attn.hook_z`` as ``[batch, pos, n_heads, head_dim]``
   and ``attn.hook_k`` / ``attn.hook_v`` as ``[batch, pos, n_kv_heads, head_dim]``,
   applies the caller's edit function if one is given for that name (activation patching), stores
   the (edited) value when the name is to be cached -- or, with ``stream``, hands it to the
   caller's function at once and keeps nothing (``interp record`` writes it to disk, so memory
   does not grow with the number of hook points) -- and hands the tensor back to the module.
3. Remove every hook in a ``finally`` block, whatever raises, so the model is left with exactly
   the hooks it had before. The whole context runs inside
   :func:`interp.hooks.guard.inference_guard`: the model is in eval mode (dropout off) for its
   duration and gets its own training flags back afterwards.

Stored tensors keep the batch dimension and are detached copies, unless ``keep_graph=True``
(attribution patching differentiates through them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from jaxtyping import Float
from torch import Tensor

from interp.hooks.guard import inference_guard
from interp.models.points import n_heads_at, resolve

__all__ = ["Edit", "Stream", "hooked"]

Edit = Callable[[Tensor], Tensor]
"""An edit of one hook point's activation: takes ``[batch, pos, ...]`` and returns a tensor of
the same shape (``[batch, pos, n_heads, head_dim]`` for ``attn.hook_z``, ``[batch, pos,
n_kv_heads, head_dim]`` for ``attn.hook_k`` and ``attn.hook_v``)."""

Stream = Callable[[str, Tensor], None]
"""Receives ``(name, value)`` of a cached hook point the moment it is computed: ``value`` is
``[batch, pos, ...]`` (detached, NOT a copy: copy or write it before returning)."""


@contextlib.contextmanager
def hooked(model: Any, *, cache: Iterable[str] = (), edits: Mapping[str, Edit] | None = None,
           keep_graph: bool = False, stream: Stream | None = None,
           ) -> Iterator[dict[str, Float[Tensor, "batch pos ..."]]]:
    """Run forwards of ``model`` inside this context to read and edit hook points.

    Example:
        >>> with hooked(model, cache=["blocks.3.hook_resid_post"]) as acts:
        ...     model(input_ids=ids)
        >>> acts["blocks.3.hook_resid_post"].shape   # [batch, pos, d_model]

    Args:
        model: a supported ``*ForCausalLM`` (or a PEFT model around one).
        cache: hook-point names whose value (after any edit) to store.
        edits: hook-point name -> function applied to the activation (module docstring).
        keep_graph: store the live tensors (for gradients) instead of detached copies.
        stream: instead of storing, call ``stream(name, value)`` for every cached name as its
            value is computed (:data:`Stream`); the yielded dict then stays empty.

    Yields:
        The dict that receives the cached activations under the names given, filled during
        the forward: ``name ->
        [batch, pos, d_model]`` (``[batch, pos, n_heads, head_dim]`` for ``attn.hook_z``).
        A later forward in the same context overwrites an entry.

    Raises:
        HookError: an unknown hook point or a layer outside the model (nothing registered).
        ModelSpecError: query heads not a multiple of key/value heads (nothing registered).
    """
    edits = dict(edits or {})
    want = set(cache)
    sites = {name: resolve(model, name) for name in sorted(want | set(edits))}
    store: dict[str, Tensor] = {}

    def make(name: str, point: str) -> Callable[[Tensor], Tensor]:
        nh = n_heads_at(model, point)

        def apply(x: Tensor) -> Tensor:
            view = x.view(*x.shape[:-1], nh, -1) if nh else x
            if name in edits:
                view = edits[name](view)
            if name in want and stream is not None:
                stream(name, view.detach())
            elif name in want:
                store[name] = view if keep_graph else view.detach().clone()
            return view.reshape(x.shape) if nh else view
        return apply

    handles = []
    with inference_guard(model):
        try:
            for name, (module, site) in sites.items():
                handles.append(_register(module, site.io, make(name, site.point)))
            yield store
        finally:
            for h in handles:
                h.remove()


def _register(module: Any, io: str, fn: Callable[[Tensor], Tensor]) -> Any:
    """A forward hook (``io == "output"``) or forward pre-hook applying ``fn``; its handle."""
    if io == "output":
        def post(mod: Any, args: Any, out: Any) -> Any:
            if isinstance(out, tuple):
                return (fn(out[0]), *out[1:])
            return fn(out)
        return module.register_forward_hook(post)

    def pre(mod: Any, args: tuple, kwargs: dict) -> Any:
        if args:
            return (fn(args[0]), *args[1:]), kwargs
        key = "hidden_states" if "hidden_states" in kwargs else next(iter(kwargs))
        return args, {**kwargs, key: fn(kwargs[key])}
    return module.register_forward_pre_hook(pre, with_kwargs=True)
