"""The calibration stage's config (:class:`CalibrationConfig`).

Light: it imports no torch, transformers or numpy, so the config is checked before the
stage's module loads (:mod:`interp.stages.configs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from interp.core.errors import StageError
from interp.core.options import StageConfig, option

__all__ = ["CalibrationConfig"]

@dataclass
class CalibrationConfig(StageConfig):
    """Settings of ``interp calibration`` / the ``[calibration]`` config table.

    Attributes:
        limit: records per dataset (None: every ok record; each costs two prompt forwards, a
            short greedy verdict and a single-token forward per patched layer).
        max_tokens: leave out records whose longer prompt has more tokens, before ``limit``.
        folds: outer cross-validation folds of the probe (by passage).
        inner_folds: inner folds that choose the probe's layer on each outer training part.
        probe_layers: the probe's candidate layers (:func:`interp.core.layers.parse_layers`).
        C: the probe's inverse L2 regularisation.
        n_bins: ECE bins (both binnings, equal-mass and equal-width, are reported).
        patch: patch the generator conversation's state after the answer into the fresh
            judge's verdict position, by layer, and (the control) the state after the answer
            of the ok record before it in the run's records (the last one's for the first).
        patch_layers: the patched layers (``blocks.L.hook_resid_pre``).
        block: block the self-check verdict position's attention to the first position after
            the answer (and to the control position).
        max_new_tokens: cap of the self-check's greedy verdict.
        card: the calibration card, the self-check and the cache test (False: only the
            ``directions`` part, which needs neither).
        directions: also fit the generator's correctness direction at its answer tokens and
            the judge's verdict direction at its verdict position, their cosine, cross-decoding
            and the causal steering test (:mod:`interp.stages.calibration_directions`).
        direction_pool: the generator's states over its answer tokens: ``mean`` or ``last``.
        direction_norms: the steering norms, in multiples of the median norm of the judge's
            resid_post at the chosen layer (training records).
        direction_seeds: random directions of equal norm (the steering control).
        direction_perms: label permutations of the cosine's null (0: none).
        n_boot: passage-cluster bootstrap resamples.
        seed: seed of the folds and the bootstrap.
        figures: draw the figures.
        progress: show progress bars.
    """

    limit: int | None = option(150, kind="count")
    max_tokens: int | None = option(None, kind="count")
    folds: int = option(5, kind="count")
    inner_folds: int = option(3, kind="count")
    probe_layers: str | list[int] = option("all", kind="layers")
    C: float = 1.0
    n_bins: int = option(10, kind="count")
    patch: bool = True
    patch_layers: str | list[int] = option("all", kind="layers")
    block: bool = True
    max_new_tokens: int = option(12, kind="count")
    card: bool = True
    directions: bool = False
    direction_pool: str = "mean"
    direction_norms: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0])
    direction_seeds: int = option(3, kind="count")
    direction_perms: int = 50
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True
    progress: bool = True

    def validate(self) -> None:
        """Raises StageError on too few folds or bins, or a C that is not > 0."""
        if self.folds < 2 or self.inner_folds < 2:
            raise StageError("calibration",
                             f"folds and inner_folds must be >= 2, got {self.folds} and "
                             f"{self.inner_folds}")
        if self.n_bins < 2:
            raise StageError("calibration", f"n_bins must be >= 2, got {self.n_bins}")
        if not self.C > 0:
            raise StageError("calibration", f"C must be > 0, got {self.C}")
        if self.max_new_tokens < 1:
            raise StageError("calibration", "max_new_tokens must be >= 1")
        if self.direction_pool not in ("mean", "last"):
            raise StageError("calibration", f"direction_pool must be 'mean' or 'last', got "
                                            f"{self.direction_pool!r}")
        if not self.direction_norms or not all(0 < float(x) < float("inf")
                                               for x in self.direction_norms):
            raise StageError("calibration", f"direction_norms must be positive numbers, got "
                                            f"{self.direction_norms}")
        if self.direction_perms < 0:
            raise StageError("calibration",
                             f"direction_perms must be >= 0, got {self.direction_perms}")
