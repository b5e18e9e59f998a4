"""The patching stage's config (:class:`PatchingConfig`) and its sweep kinds.

Light: it imports no torch, transformers or numpy, so the config is checked before the
stage's module loads (:mod:`interp.stages.configs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from interp.core.errors import StageError
from interp.core.layers import DEFAULT_BAND, parse_layers
from interp.core.options import StageConfig, option
from interp.core.vocab import EXACT_MODES, MIN_GAP, PAIR_KINDS, check_backend

__all__ = ["PatchingConfig", "SWEEP_KINDS"]

SWEEP_KINDS = ("resid", "heads", "attribution")
"""Patching sweeps: residual stream per layer, every head, attribution patching."""


@dataclass
class PatchingConfig(StageConfig):
    """Settings of ``interp patch`` / the ``[patching]`` config table.

    Attributes:
        pairs: pair kinds to run (:data:`interp.methods.pairs.PAIR_KINDS`).
        kinds: sweeps: ``resid``, ``heads``, ``attribution`` (AtP* against the full exact
            sweep of both, with agreement and cost).
        limit: built pairs per dataset (all or None: every one; each pair costs many forwards).
        limit_kept: ``limit`` counts kept pairs (``|gap| >= min_gap``) instead of built ones:
            each built pair is scored first (its clean and corrupt forwards, or a stored
            sweep's gap or ``DIR/patching/{pairs}/gaps.jsonl``), and one under ``min_gap`` is
            skipped (reason ``small_gap``, its gap listed) without a sweep, until ``limit``
            pairs per dataset are kept or the records run out.
        layers: layers to sweep, a spec of :func:`interp.core.layers.parse_layers` (None: all).
        layer_stride: sweep every k-th layer (after ``layers``).
        hook: residual hook point (``hook_resid_pre`` or ``hook_resid_post``).
        per_position: also sweep single positions (not only spans) in ``resid``.
        exact: ``topk`` (AtP*: attribution ranks every unit, the ``top_k`` are patched
            exactly) or ``all`` (every unit exactly).
        top_k: units patched exactly per pair and sweep with ``exact = "topk"``.
        min_gap: pairs whose ``|LD_clean - LD_corrupt|`` (nats) is below it are left out of
            the headline ratio of sums (and listed with their gaps).
        band: layers averaged for the judge's context attention mass.
        oracle: grades candidate-swap answers (None: the run's oracle; ``rule`` or
            ``model:SPEC``).
        mine: mine closed-book hard negatives for records without a wrong answer.
        equal_length: candidate-swap: prefer wrong answers with as many tokens as the gold
            (the model's own, a stored or a mined one; the miner samples on until one has the
            gold's length, else keeps its first), so the candidate span corresponds position
            by position and is measured as a unit; off: the first usable wrong answer.
        hard_negative_*: the miner's settings (as in the transfer study).
        seed: seeds the miner (per record) and the bootstrap.
        n_boot: cluster-bootstrap resamples for the summary's CIs.
        max_tokens: skip pairs longer than this (CPU time).
        batch_size: patched rows per forward.
        backend: ``hf`` (the sweeps need it; :func:`interp.methods.patching.patch` takes all three).
        prefix_cache: run the positions before the first patchable one once.
        figures: draw the figures after the tables.
        progress: show progress bars.
    """

    pairs: list[str] = field(default_factory=lambda: ["candidate-swap"])
    kinds: list[str] = option(["resid"], flag="kind")
    limit: int | None = option(5, kind="count")
    limit_kept: bool = False
    layers: str | list[int] | None = option(None, kind="layers")
    layer_stride: int = option(1, kind="count")
    hook: str = "hook_resid_pre"
    per_position: bool = True
    exact: str = "topk"
    top_k: int = option(16, kind="count")
    min_gap: float = MIN_GAP
    band: str | list[int] = option(DEFAULT_BAND, kind="layers")
    oracle: str | None = None
    mine: bool = True
    equal_length: bool = False
    hard_negative_template: str = "closed_book"
    hard_negative_attempts: int = option(5, kind="count")
    hard_negative_temperature: float = 0.7
    hard_negative_top_p: float = 0.9
    hard_negative_max_new_tokens: int = option(16, kind="count")
    hard_negative_max_words: int = 12
    seed: int = 0
    n_boot: int = option(1000, kind="count")
    max_tokens: int | None = option(1024, kind="count")
    batch_size: int = option(16, kind="count")
    backend: str = "hf"
    prefix_cache: bool = True
    figures: bool = True
    progress: bool = True

    def validate(self) -> None:
        """Raises StageError on unknown kinds, hooks, modes, backends or bad numbers."""
        for p in self.pairs:
            if p not in PAIR_KINDS:
                raise StageError("patching", f"unknown pair kind {p!r}; valid: {list(PAIR_KINDS)}")
        for k in self.kinds:
            if k not in SWEEP_KINDS:
                raise StageError("patching", f"unknown kind {k!r}; valid: {list(SWEEP_KINDS)}")
        if self.hook not in ("hook_resid_pre", "hook_resid_post"):
            raise StageError("patching", f"hook must be hook_resid_pre or hook_resid_post, not "
                                         f"{self.hook!r}")
        if self.exact not in EXACT_MODES:
            raise StageError("patching",
                             f"exact must be one of {list(EXACT_MODES)}, not {self.exact!r}")
        if self.top_k < 1 or self.min_gap < 0 or self.batch_size < 1:
            raise StageError("patching", f"top_k and batch_size must be >= 1 and min_gap >= 0, got "
                                         f"{self.top_k}, {self.batch_size}, {self.min_gap}")
        check_backend(self.backend, StageError.of("patching"), needs="gradients",
                      what="the sweeps (attribution patching; patch() takes every backend)")

    def layer_list(self, n_layers: int) -> list[int]:
        """The swept layers.

        Raises:
            LayerSpecError: a bad spec or a layer out of range (names the valid range).
        """
        layers = parse_layers(self.layers, n_layers, default="all")
        return layers[:: max(1, self.layer_stride)]
