"""The audit stage's config (:class:`AuditConfig`).

Light: it imports no torch, transformers or numpy, so the config is checked before the
stage's module loads (:mod:`interp.stages.configs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from interp.core.errors import ConfigError
from interp.core.layers import DEFAULT_BAND, parse_layers
from interp.core.options import StageConfig, option
from interp.core.vocab import DETECTOR_FEATURES

__all__ = ["AuditConfig"]

@dataclass
class AuditConfig(StageConfig):
    """Settings of ``interp audit`` and of the ``[audit]`` stage of ``interp run``.

    Attributes:
        band: layers of the band means (:func:`interp.core.layers.parse_layers`; paper: the last 8).
        detector_layers: layers whose heads feed the detector (``all`` by default).
        detector_features: per-head features of the detector
            (:data:`interp.methods.audit.DETECTOR_FEATURES`; Lookback Lens uses the ratio alone).
        folds: k of the passage-grouped CV of the detector (fewer when a class has fewer
            passages; none below 2).
        fpr: the false-positive rate (share of RIGHT verdicts flagged) the flags are set at.
        C: inverse L2 strength of the detector's logistic regression.
        limit: first N ok records per dataset (None: all).
        n_boot: bootstrap resamples of passages for the AUC CIs.
        seed: seed of the folds and the bootstrap.
        figures: draw ``DIR/figures/audit_roc.png``.
    """

    band: str = option(DEFAULT_BAND, kind="layers")
    detector_layers: str = option("all", kind="layers")
    detector_features: list[str] = field(default_factory=lambda: ["lookback_ratio"])
    folds: int = 5
    fpr: float = 0.1
    C: float = 1.0
    limit: int | None = option(None, kind="count")
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.detector_features, str):
            self.detector_features = [f.strip() for f in self.detector_features.split(",")
                                      if f.strip()]
        if bad := [f for f in self.detector_features if f not in DETECTOR_FEATURES]:
            raise ConfigError(f"[audit] detector_features {bad}: choose from "
                              f"{list(DETECTOR_FEATURES)}")
        if not self.detector_features:
            raise ConfigError("[audit] detector_features is empty")
        if not 0.0 < float(self.fpr) < 1.0:
            raise ConfigError(f"[audit] fpr must lie strictly between 0 and 1, not {self.fpr}")
        if self.folds < 2:
            raise ConfigError(f"[audit] folds must be >= 2, not {self.folds}")

    def check(self, n_layers: int, n_heads: int | None = None) -> None:
        """Refuse detector layers outside the model (``band`` is checked as a layer field).

        Raises:
            interp.core.errors.LayerSpecError: ``detector_layers`` outside ``n_layers``.
        """
        parse_layers(self.detector_layers, n_layers, default="all")
