"""The reasoning-judge stage's config (:class:`ReasoningConfig`).

Light: it imports no torch, transformers or numpy, so the config is checked before the
stage's module loads (:mod:`interp.stages.configs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from interp.core.layers import DEFAULT_BAND
from interp.core.options import StageConfig, option
from interp.core.vocab import MAX_REASONING_TOKENS

__all__ = ["ReasoningConfig"]

@dataclass
class ReasoningConfig(StageConfig):
    """Settings of the reasoning-judge stage (``[reasoning]`` table of a config).

    Attributes:
        template: the reasoning judge's template variant (``judge = "reasoning"``).
        templates_path: a TOML file of variants (None: the bundled ones).
        limit: records per dataset (first N ok records; None for all).
        max_reasoning_tokens: token budget of a reasoning reply (:mod:`interp.judging.reasoning`).
        batch_size: prompts per forward (and records per saved chunk).
        band: band of the span-mass means (:func:`interp.core.layers.parse_layers`).
        reasoning_attention: also record the attention while reasoning (one more forward
            per record with full patterns).
        n_boot: bootstrap resamples for CIs.
        seed: bootstrap seed.
        figures: draw the figure into ``DIR/figures``.
    """

    template: str = "reasoning"
    templates_path: str | None = None
    limit: int | None = option(None, kind="count")
    max_reasoning_tokens: int = option(MAX_REASONING_TOKENS, kind="count")
    batch_size: int = option(8, kind="count")
    band: str = option(DEFAULT_BAND, kind="layers", was="layers")
    reasoning_attention: bool = True
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True
