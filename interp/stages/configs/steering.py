"""The steering stage's config (:class:`SteeringConfig`) and its key sets.

Light: it imports no torch, transformers or numpy, so the config is checked before the
stage's module loads (:mod:`interp.stages.configs`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from interp.core.errors import StageError
from interp.core.layers import DEFAULT_BAND, parse_heads, parse_layers, top_diff_k
from interp.core.options import StageConfig, option
from interp.core.vocab import ALPHAS
from interp.stages.configs import TASKS

__all__ = ["KEYS", "SteeringConfig"]

KEYS = ("context", "control")
"""Steering's key sets: the context, and as many non-context keys (the control)."""


@dataclass
class SteeringConfig(StageConfig):
    """Settings of ``interp steer`` / the ``[steering]`` config table.

    Attributes:
        alphas: attention factors on the context keys (each > 0; 1 = unsteered).
        band: the steered band (:func:`interp.core.layers.parse_layers`; default the attention
            band ``last8``); also the band of the context mass.
        heads: ``all``, ``top-diff:K`` (top gen-minus-eval heads of ``interp heads``) or
            ``L.H,L.H`` (:func:`interp.core.layers.parse_heads`).
        tasks: ``eval`` (the judge) and/or ``gen`` (the generator).
        keys: the steered keys: ``context`` (the causal test) and/or ``control`` (as many
            non-context keys, :func:`interp.hooks.steering.control_keys`: does steering ANY
            keys move the verdict, or only the context's?).
        limit: records per dataset (all or None: every ok record; each costs a forward per alpha).
        per_label: ``limit`` records per dataset and oracle label y*, so that acceptance of
            oracle-correct and of oracle-incorrect answers are both measured where a dataset
            has both (:func:`interp.store.records.limit_per_dataset`).
        max_tokens: leave out records whose longer prompt has more tokens (CPU time; None:
            every length), before ``limit`` counts.
        max_new_tokens: length cap of the steered answers (None: the run's Study 1 cap, so the
            generator's unsteered answer at alpha 1 replays the record's answer; a shorter cap
            grades cut answers, and GA at alpha 1 then differs from Study 1's).
        oracle: grades the steered answers (None: the run's oracle).
        n_boot: passage-cluster bootstrap resamples.
        seed: bootstrap seed.
        figures: draw the figure.
        progress: show a progress bar.
    """

    alphas: list[float] = field(default_factory=lambda: list(ALPHAS))
    band: str | list[int] = option(DEFAULT_BAND, kind="layers", was="layers")
    heads: str = "all"
    tasks: list[str] = field(default_factory=lambda: ["eval", "gen"])
    keys: list[str] = field(default_factory=lambda: ["context"])
    limit: int | None = option(10, kind="count")
    per_label: bool = False
    max_tokens: int | None = option(None, kind="count")
    max_new_tokens: int | None = option(None, kind="count")
    oracle: str | None = None
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True
    progress: bool = True

    def validate(self) -> None:
        """Raises StageError on alphas not > 0, no alpha 1, unknown tasks or keys."""
        if not self.alphas or any(not (a > 0 and math.isfinite(a)) for a in self.alphas):
            raise StageError("steering", f"alphas must be finite numbers > 0, got {self.alphas}")
        if 1.0 not in [float(a) for a in self.alphas]:
            raise StageError("steering", "alphas must include 1 (the unsteered reference)")
        if not self.tasks or set(self.tasks) - set(TASKS):
            raise StageError("steering", f"tasks must be among {list(TASKS)}, got {self.tasks}")
        if not self.keys or set(self.keys) - set(KEYS) or len(set(self.keys)) < len(self.keys):
            raise StageError("steering",
                             f"keys must be among {list(KEYS)} (each once), got {self.keys}")


    def check(self, n_layers: int, n_heads: int | None = None) -> None:
        """Check the band and an explicit head spec against a model's shape.

        ``top-diff:K`` needs the attention ranking; here only ``K`` is checked (an int >= 1).

        Raises:
            interp.core.errors.LayerSpecError: the band lies outside the model.
            StageError: an unparseable head spec, a head outside ``0..n_heads-1`` or a layer
                outside the model.
        """
        band = parse_layers(self.band, n_layers)
        s = self.heads.strip().lower()
        if s.startswith("top-diff:"):
            top_diff_k(self.heads)
        elif n_heads is not None:
            units = parse_heads(self.heads, band, n_heads)
            if bad := [x for x in units if not 0 <= x < n_layers]:
                raise StageError("steering",
                                 f"heads on layers {bad}: valid layers 0..{n_layers - 1}")
