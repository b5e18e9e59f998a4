"""Safetensors files written tensor by tensor, so a recording never holds all of its layers.

:class:`TensorStreamWriter` writes ONE standard safetensors file (any safetensors reader opens
it) whose tensors arrive one slice at a time, in any order: ``interp record``
(:mod:`interp.stages.record`) sends each layer's attention pattern, residual stream and head
outputs to disk as the forward produces them (:func:`interp.hooks.recorder.record_stream`).
:func:`plan_shards` splits a list of tensors into shards of bounded size.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from interp.core.errors import RunDirError
from interp.core.io import tmp_path_for

__all__ = ["TensorStreamWriter", "nbytes", "plan_shards"]

_ST_DTYPES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32",
              torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
              torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


class TensorStreamWriter:
    """Write one safetensors file tensor by tensor, each slice to disk the moment it comes.

    Algorithm (the safetensors layout: 8-byte little-endian header length, JSON header with
    every tensor's dtype, shape and byte range, then the data):

    1. The names, shapes and dtypes are known before any value: the header (with
       ``metadata``) is written first, padded with spaces to 8 bytes, and the data region is
       sized; tensors lie in the order given, back to back.
    2. :meth:`write` puts a slice ``value = tensor[start : start + len(value)]`` (along the
       first axis) at its byte offset (``os.pwrite``); nothing is kept in memory.
    3. :meth:`close` checks that every index of every tensor's first axis was written once,
       fsyncs and renames the temporary file onto ``path`` (atomic, like
       :func:`interp.core.io.atomic_path`). :meth:`abort`, or leaving the ``with`` block by an
       exception, removes the temporary file; a killed process leaves only a temporary file
       (:func:`interp.core.io.is_tmp_path`), never a partial ``path``.

    Args:
        path: the file to create.
        specs: ``(name, shape, dtype)`` of every tensor, in file order.
        metadata: string metadata (``signature``, ...).

    Raises:
        RunDirError: a dtype safetensors cannot hold, a repeated name (here), or at
            :meth:`write` / :meth:`close` a slice of the wrong shape/dtype, a row written
            twice, or rows never written.
    """

    def __init__(self, path: str | Path, specs: Sequence[tuple[str, Sequence[int], Any]],
                 metadata: Mapping[str, str] | None = None):
        self.path = Path(path)
        header: dict[str, Any] = {"__metadata__": dict(metadata or {})} if metadata else {}
        self._specs: dict[str, tuple[tuple[int, ...], Any, int, int]] = {}
        offset = 0
        for name, shape, dtype in specs:
            if dtype not in _ST_DTYPES or name in self._specs or name == "__metadata__":
                raise RunDirError(f"{self.path.name}: cannot write {name!r} ({dtype}): a "
                                  f"repeated name or a dtype outside {list(_ST_DTYPES)}")
            shape = tuple(int(x) for x in shape)
            size = nbytes(shape, dtype)
            header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape),
                            "data_offsets": [offset, offset + size]}
            self._specs[name] = (shape, dtype, offset, size)
            offset += size
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        self._data = 8 + len(text)
        self.nbytes = self._data + offset
        self._rows = {n: bytearray(sp[0][0] if sp[0] else 1) for n, sp in self._specs.items()}
        self._tmp = tmp_path_for(self.path)
        self._fd: int | None = os.open(self._tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        os.write(self._fd, len(text).to_bytes(8, "little") + text)
        os.ftruncate(self._fd, self.nbytes)

    def __enter__(self) -> TensorStreamWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write(self, name: str, value: Any, start: int = 0) -> None:
        """Write ``value`` as ``tensor[start : start + len(value)]`` of tensor ``name``.

        ``value`` must have the declared dtype and the declared shape after its first axis
        (the whole tensor for a 0-d one); it may be on any device.
        """
        shape, dtype, offset, size = self._specs[name]
        v = value.detach()
        n = v.shape[0] if shape else 1
        if v.dtype != dtype or tuple(v.shape[1:]) != shape[1:] or not shape and v.ndim or (
                shape and start + n > shape[0]):
            raise RunDirError(f"{self.path.name}: {name} expects {dtype} {list(shape)}, got "
                              f"{v.dtype} {list(v.shape)} at {start}")
        rows = self._rows[name]
        if n == 0:
            return
        if any(rows[start:start + n]):
            raise RunDirError(f"{self.path.name}: rows {start}..{start + n - 1} of {name} "
                              f"written twice")
        buf = memoryview(v.cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
        pos = offset + (size // shape[0] * start if shape else 0)
        while len(buf):
            k = os.pwrite(self._fd, buf, self._data + pos)
            buf, pos = buf[k:], pos + k
        rows[start:start + n] = b"\x01" * n

    def close(self) -> Path:
        """Check completeness, fsync and rename onto ``path`` (step 3); returns ``path``."""
        if missing := [n for n, rows in self._rows.items() if not all(rows)]:
            self.abort()
            raise RunDirError(f"{self.path.name}: tensors {missing[:4]} were not fully written")
        assert self._fd is not None
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Close and remove the temporary file (no-op after :meth:`close`)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._tmp.unlink(missing_ok=True)


def nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    """Bytes of a tensor of ``shape`` and ``dtype``."""
    return math.prod(int(x) for x in shape) * torch.empty((), dtype=dtype).element_size()


def plan_shards(specs: Sequence[tuple[str, Sequence[int], torch.dtype]],
                max_bytes: int) -> list[list[tuple[str, Sequence[int], torch.dtype]]]:
    """Split tensors, in their order, into shards of at most ``max_bytes`` of data each.

    A tensor larger than ``max_bytes`` gets a shard of its own; tensors are never split.

    Returns:
        The shards, each a non-empty list of ``(name, shape, dtype)``.
    """
    shards: list[list[tuple[str, Sequence[int], torch.dtype]]] = []
    size = 0
    for spec in specs:
        b = nbytes(spec[1], spec[2])
        if not shards or size + b > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += b
    return shards
