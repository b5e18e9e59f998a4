"""``interp record``'s config (:class:`RecordConfig`) and what it can store.

Light: it imports no torch, transformers or numpy, so the config is checked before the
stage's module loads (:mod:`interp.stages.configs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from interp.core.errors import ConfigError
from interp.core.layers import DEFAULT_BAND
from interp.core.options import StageConfig, option, split_list

__all__ = ["DTYPE_NAMES", "POSITIONS", "RecordConfig", "WHAT"]

WHAT = ("attention", "resid", "z")
"""What ``interp record`` can store: attention patterns, residual streams, head outputs."""
POSITIONS = ("all", "last", "spans")
"""The query positions ``interp record`` keeps."""
DTYPE_NAMES = ("float16", "bfloat16", "float32")
"""The storage dtypes of ``interp record``."""


@dataclass
class RecordConfig(StageConfig):
    """Settings of ``interp record`` (``[record]`` table of a config).

    Attributes:
        what: any of ``attention`` (``attn.hook_pattern``), ``resid`` (``hook_resid_pre`` and
            ``hook_resid_post``), ``z`` (``attn.hook_z``); a list or a comma string.
        layers: layers to record (:func:`interp.core.layers.parse_layers`; default ``all``).
        positions: query rows / positions kept: ``all``, ``last`` or ``spans`` (module
            docstring, step 3). Span-to-span masses always use every query row.
        dtype: ``float16``, ``bfloat16`` or ``float32`` on disk.
        limit: records per dataset (first N ok records; all or None: every one).
        shard_mb: largest shard in MiB (a bigger tensor gets a shard of its own).
        band: layers of the span-to-span summary and figure (default the last eight; only
            recorded layers count, and all recorded layers when none of the band is).
        figures: draw ``figures/record_span_to_span.png``.
    """

    what: list[str] = field(default_factory=lambda: list(WHAT))
    layers: str = option("all", kind="layers")
    positions: str = "all"
    dtype: str = "float16"
    limit: int | None = option(None, kind="count")
    shard_mb: float = 512.0
    band: str = option(DEFAULT_BAND, kind="layers")
    figures: bool = True

    def __post_init__(self) -> None:
        self.what = split_list(self.what)
        if not self.what or set(self.what) - set(WHAT):
            raise ConfigError(f"record: what must be a non-empty subset of {list(WHAT)}, not "
                              f"{self.what}")
        if self.positions not in POSITIONS:
            raise ConfigError(f"record: positions must be one of {list(POSITIONS)}, not "
                              f"{self.positions!r}")
        if self.dtype not in DTYPE_NAMES:
            raise ConfigError(f"record: dtype must be one of {list(DTYPE_NAMES)}, not "
                              f"{self.dtype!r}")
        if not self.shard_mb > 0:
            raise ConfigError(f"record: shard_mb must be > 0, not {self.shard_mb}")

    def settings(self, layers: Sequence[int]) -> dict[str, Any]:
        """What decides the recorded bytes (part of the signature)."""
        return {"what": sorted(self.what), "layers": list(layers), "positions": self.positions,
                "dtype": self.dtype, "shard_mb": self.shard_mb}
