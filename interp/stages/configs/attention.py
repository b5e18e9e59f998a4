"""The attention stage's config (:class:`AttentionConfig`).

Light: it imports no torch, transformers or numpy, so the config is checked before the
stage's module loads (:mod:`interp.stages.configs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from interp.core.errors import StageError
from interp.core.layers import DEFAULT_BAND
from interp.core.options import StageConfig, option
from interp.core.vocab import attention_backend

__all__ = ["AttentionConfig"]

@dataclass
class AttentionConfig(StageConfig):
    """Settings of the attention stage (``[attention]`` table of a config).

    Attributes:
        backend: one of :data:`interp.hooks.backends.BACKENDS` (``hf`` default), or ``eager``:
            the ``hf`` backend under eager attention, a check of the exact recorder.
        band: band for the summary and head ranking (:func:`interp.core.layers.parse_layers`:
            ``last8``, ``24-31``, ``all``).
        limit: records per dataset (first N ok records; all or None: every one).
        save_rows: keep every record's rows ``[n_layers, n_heads, pos]``.
        save_resid: layer spec whose residual streams / head outputs to save (None: none).
        save_patterns: with ``save_resid``, also save full patterns of those layers.
        n_boot: bootstrap resamples for CIs.
        seed: seed of the bootstrap resamples.
        figures: draw the figures into ``DIR/figures``.
        top: heads listed per ranking in ``DIR/attention/heads.json``.
        recompute: record every selected record again, even when a fresh recording exists
            (e.g. the one the harness made in its one pass).
        progress: show a progress bar while recording.
    """

    backend: str = "hf"
    band: str = option(DEFAULT_BAND, kind="layers", was="layers")
    limit: int | None = option(None, kind="count")
    save_rows: bool = False
    save_resid: str | None = option(None, kind="layers")
    save_patterns: bool = False
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True
    top: int = option(10, kind="count")
    recompute: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        attention_backend(self.backend, StageError.of("attention"))
