"""The probe stage's config (:class:`ProbeConfig`).

Light: it imports no torch, transformers or numpy, so the config is checked before the
stage's module loads (:mod:`interp.stages.configs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from interp.core.errors import StageError
from interp.core.layers import parse_layers
from interp.core.options import StageConfig, option, split_list
from interp.core.vocab import POOLS, PROBES
from interp.stages.configs import TASKS

__all__ = ["ProbeConfig"]

@dataclass
class ProbeConfig(StageConfig):
    """Settings of ``interp probe`` and of the ``[probe]`` stage of ``interp run``.

    Attributes:
        folds: k of the stratified k-fold cross-validation.
        layers: layers to probe (:func:`interp.core.layers.parse_layers`: ``last8``, ``0,8,12-20``,
            a list; None: all); features are always cached for all layers.
        probes: probe kinds, the first sweeps the whole (layer, pool) grid.
        pools: poolings (``candidate`` is skipped for the gen prompt).
        tasks: prompts to probe: ``eval`` (judge prompt) and/or ``gen`` (generation prompt).
        batch_size: prompts per forward pass (left-padded).
        seed: seed of the folds and of the MLP.
        select_by: ``auc`` or ``f1``: the CV metric that picks the best layer and pooling.
        top_k: (layer, pool) cells, best first by the first probe, at which the other probes run.
        sweep_all: run every probe on every cell instead.
        C: inverse L2 strength of logreg and svm (on standardised features).
        mlp_hidden: hidden units of the one-hidden-layer MLP.
        mlp_alpha: L2 penalty of the MLP.
        transfer_min_per_class: fewest examples of each class a dataset needs to take part in
            the cross-dataset transfer table.
        limit: use only the first N ok records of each dataset (all or None: every one); the
            cost is about two forward passes per record (eval + gen prompt).
        permutations: label permutations for the selection-aware null of the best cell
            (:func:`interp.methods.probing.permutation_null`; 0 = off); each costs one sweep of the
            first probe.
        recompute: compute the features again even when cached (e.g. by the harness's one
            pass).
        n_jobs: processes that cross-validate the (layer, pool) cells at once, in the sweep
            and in every permutation of the null (:func:`interp.methods.probing.sweep`); the results
            are those of one process, so stored sweeps and permutations stay valid.
        permute_within: ``dataset`` permutes the null's labels within each dataset
            (:func:`interp.methods.probing.permutation_null` ``strata``): the null then keeps each
            dataset's base rate, which a probe can read off the prompt; None: across all
            records.
        n_boot: passage-cluster bootstrap resamples of the paired probe-vs-judge AUC CIs
            (:func:`interp.methods.probing.probe_vs_judge`; 0: none); not part of the sweep's
            signature.
    """

    folds: int = 5
    layers: str | list[int] | None = option(None, kind="layers")
    probes: list[str] = field(default_factory=lambda: list(PROBES))
    pools: list[str] = field(default_factory=lambda: list(POOLS))
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    batch_size: int = option(4, kind="count")
    seed: int = 0
    select_by: str = "auc"
    top_k: int = option(5, kind="count")
    sweep_all: bool = False
    C: float = 1.0
    mlp_hidden: int = option(64, kind="count")
    mlp_alpha: float = 1e-2
    transfer_min_per_class: int = 2
    limit: int | None = option(None, kind="count")
    permutations: int = 0
    recompute: bool = False
    n_jobs: int = option(1, kind="count")
    n_boot: int = option(2000, kind="count")
    permute_within: str | None = None

    def __post_init__(self) -> None:
        self.probes, self.pools, self.tasks = (split_list(self.probes), split_list(self.pools),
                                               split_list(self.tasks))
        for name, vals, known in (("probe", self.probes, PROBES), ("pool", self.pools, POOLS),
                                  ("task", self.tasks, TASKS)):
            if not vals:
                raise StageError("probe", f"no {name}s given; choose from {list(known)}")
            if bad := [v for v in vals if v not in known]:
                raise StageError("probe", f"unknown {name}(s) {bad}; known: {list(known)}")
        if self.layers is not None:  # the grammar now; the range against the model at run time
            parse_layers(self.layers, 1 << 20)
        if self.permute_within not in (None, "dataset"):
            raise StageError("probe", f"permute_within must be 'dataset' or absent, not "
                                      f"{self.permute_within!r}")
        if self.select_by not in ("auc", "f1"):
            raise StageError("probe", f"select_by must be 'auc' or 'f1', not {self.select_by!r}")
        if self.folds < 2:
            raise StageError("probe", f"folds must be >= 2, not {self.folds}")
        if self.batch_size < 1:
            raise StageError("probe", "batch_size must be >= 1")

    def fit_kw(self) -> dict[str, Any]:
        """Keyword arguments of :func:`interp.methods.probing.fit_probe`."""
        return {"C": self.C, "mlp_hidden": self.mlp_hidden, "mlp_alpha": self.mlp_alpha,
                "seed": self.seed}
