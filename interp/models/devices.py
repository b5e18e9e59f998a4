"""Where a module computes, for models spread over several devices (a ``device_map``).

A model loaded with a device map (:func:`interp.models.loading.load_model` ``device_map=...``,
through transformers' big-model loading and accelerate's dispatch) may run its blocks on different
GPUs, on the CPU, or from an offload folder on disk: an offloaded module keeps its parameters
on the ``meta`` device and accelerate's hook (``module._hf_hook``, an ``AlignDevicesHook``)
loads them onto its *execution device* for each forward. Hooks therefore see each block's
tensors on that block's execution device. The rule every hook of :mod:`interp.hooks` follows:

1. a tensor a hook puts into the model (a patch source, a mask, a steering bias) is moved to
   the device and dtype of the activation it edits (:func:`like`);
2. results gathered over several layers are brought to the CPU before they are combined
   (:func:`stack_cpu`), so a layer on another device changes nothing but speed;
3. weights read outside a forward go through :func:`module_weight`, which loads an offloaded
   weight from accelerate's weights map instead of reading a ``meta`` tensor;
4. inputs go to the execution device of the input embeddings (:func:`input_device`).

Source: accelerate's big-model inference guide
(https://huggingface.co/docs/accelerate/usage_guides/big_modeling) and transformers'
``from_pretrained(device_map=..., max_memory=..., offload_folder=...)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["execution_device", "input_device", "like", "module_weight", "stack_cpu"]


def execution_device(module: Any) -> torch.device:
    """The device ``module`` computes on.

    accelerate's hook's ``execution_device`` when the module is dispatched (device map),
    else the device of its first parameter or buffer that is not on ``meta``; CPU when it has
    none.
    """
    hook = getattr(module, "_hf_hook", None)
    dev = getattr(hook, "execution_device", None)
    if dev is not None:
        return torch.device(dev if not isinstance(dev, int) else f"cuda:{dev}")
    for t in (*module.parameters(), *module.buffers()):
        if t.device.type != "meta":
            return t.device
    return torch.device("cpu")


def input_device(model: Any) -> torch.device:
    """Where a model's input ids go: the execution device of its input embeddings."""
    return execution_device(model.get_input_embeddings())


def module_weight(module: Any, name: str = "weight") -> Tensor:
    """A parameter of ``module`` as a real tensor on its execution device.

    An offloaded module (device map with ``cpu`` or ``disk`` entries) holds ``meta`` tensors
    between forwards; its weights live in accelerate's ``weights_map`` (a CPU dict or a
    memory-mapped offload folder) and are read from there.

    Raises:
        AttributeError: the module has no parameter ``name``.
    """
    t = getattr(module, name)
    if t.device.type != "meta":
        return t
    hook = getattr(module, "_hf_hook", None)
    weights = getattr(hook, "weights_map", None)
    if weights is None:
        raise AttributeError(f"{type(module).__name__}.{name} is on the meta device and no "
                             f"accelerate hook holds its weights")
    return weights[name].to(execution_device(module), t.dtype)


def like(t: Tensor, ref: Tensor, *, dtype: bool = True) -> Tensor:
    """``t`` on the device of ``ref`` (and in its dtype unless ``dtype=False``); no copy if so."""
    return t.to(device=ref.device, dtype=ref.dtype if dtype else t.dtype)


def stack_cpu(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """``torch.stack`` of tensors that may lie on different devices, on the CPU."""
    return torch.stack([t.cpu() for t in tensors], dim=dim)
