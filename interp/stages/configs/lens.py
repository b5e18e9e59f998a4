"""The verdict-lens stage's config (:class:`LensConfig`).

Light: it imports no torch, transformers or numpy, so the config is checked before the
stage's module loads (:mod:`interp.stages.configs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from interp.core.errors import StageError
from interp.core.layers import DEFAULT_BAND
from interp.core.names import did_you_mean
from interp.core.options import StageConfig, option
from interp.data.examples import DATASETS

__all__ = ["LensConfig"]

@dataclass
class LensConfig(StageConfig):
    """Settings of ``interp lens`` / the ``[lens]`` config table.

    Attributes:
        limit: records per dataset (None: every ok record; each costs three forwards).
        max_tokens: leave out records whose longer prompt has more tokens, before ``limit``.
        band: the layers whose heads and MLPs the attribution summary ranks
            (:func:`interp.core.layers.parse_layers`; default the attention band ``last8``).
        tuned: train and read a tuned lens beside the logit lens.
        train_datasets: datasets whose bundled train split trains the tuned lens.
        train_limit: train-split examples per dataset.
        train_positions: positions per training prompt (half the last ones, half drawn).
        heldout: share of the training passages held out for the KL evaluation (0 < x < 1).
        ridge: ridge penalty of the least-squares start (relative to the input's mean square).
        kl_steps: Adam steps on the tuned lens's KL objective after the start.
        kl_batch: positions per KL step.
        lr: Adam's learning rate.
        n_boot: passage-cluster bootstrap resamples.
        seed: seed of the position draws, the KL steps and the bootstrap.
        figures: draw the figures.
        progress: show progress bars.
    """

    limit: int | None = option(20, kind="count")
    max_tokens: int | None = option(None, kind="count")
    band: str | list[int] = option(DEFAULT_BAND, kind="layers")
    tuned: bool = True
    train_datasets: list[str] = field(default_factory=lambda: ["squad_v2", "hotpotqa",
                                                               "musique"])
    train_limit: int = option(24, kind="count")
    train_positions: int = option(16, kind="count")
    heldout: float = 0.25
    ridge: float = 1e-2
    kl_steps: int = option(40, kind="count")
    kl_batch: int = option(32, kind="count")
    lr: float = 1e-3
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True
    progress: bool = True

    def validate(self) -> None:
        """Raises StageError on a bad held-out share, ridge, rate, sizes or dataset."""
        if not 0 < self.heldout < 1:
            raise StageError("lens",
                             f"heldout must lie strictly between 0 and 1, got {self.heldout}")
        if self.ridge < 0 or not self.lr > 0:
            raise StageError("lens", f"ridge must be >= 0 and lr > 0, got ridge {self.ridge}, lr "
                                     f"{self.lr}")
        if self.train_positions < 2 or self.kl_batch < 1 or self.train_limit < 2:
            raise StageError("lens",
                             "train_positions >= 2, train_limit >= 2 and kl_batch >= 1 needed")
        if self.tuned and (bad := [d for d in self.train_datasets if d not in DATASETS]):
            raise StageError("lens",
                             f"unknown train dataset {bad[0]!r}{did_you_mean(bad[0], DATASETS)};"
                             f" known: {', '.join(DATASETS)}")
