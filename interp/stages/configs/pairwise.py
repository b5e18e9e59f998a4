"""The pairwise-judge stage's config (:class:`PairwiseConfig`).

Light: it imports no torch, transformers or numpy, so the config is checked before the
stage's module loads (:mod:`interp.stages.configs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from interp.core.errors import StageError
from interp.core.layers import DEFAULT_BAND
from interp.core.names import did_you_mean
from interp.core.options import StageConfig, option
from interp.judging.prompts import get_pairwise_template

__all__ = ["PairwiseConfig"]

@dataclass
class PairwiseConfig(StageConfig):
    """Settings of ``interp pairwise`` / the ``[pairwise]`` config table.

    Attributes:
        limit: pairs per dataset (None: every pair that builds; each costs about eight
            forwards and one patched sweep of the verdict position).
        max_tokens: leave out records whose eval prompt has more tokens, before ``limit``.
        sources: kinds of pair, in order per record: ``hard_negative`` (the patching stage's
            closed-book hard negatives, ``DIR/patching/hard_negatives.jsonl``) and ``model``
            (the model's own answer graded Incorrect).
        band: layers of the attention masses and of the attribution summary (default
            ``last8``).
        template: the pairwise template's name.
        templates_path: the TOML file of pairwise templates (None: the bundled
            ``templates/pairwise.toml``).
        top_k: heads chosen on the selection passages and tested on the others.
        batch_size: patched rows per forward.
        behaviour_only: measure the behaviour alone (both orders' scores, the outcomes,
            content and position terms: one forward per order,
            :func:`interp.methods.pairwise.score_orders`) and skip patching, attribution,
            attention and the lens.
        n_boot: passage-cluster bootstrap resamples.
        seed: seed of the bootstrap.
        figures: draw the figures.
        progress: show progress bars.
    """

    limit: int | None = option(60, kind="count")
    max_tokens: int | None = option(None, kind="count")
    sources: list[str] = field(default_factory=lambda: ["hard_negative", "model"])
    band: str | list[int] = option(DEFAULT_BAND, kind="layers")
    template: str = "pairwise"
    templates_path: str | None = None
    top_k: int = option(5, kind="count")
    batch_size: int = option(16, kind="count")
    behaviour_only: bool = False
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True
    progress: bool = True

    def validate(self) -> None:
        """Refuse a bad setting before any model work.

        Raises:
            StageError: an unknown or empty ``sources``, a missing ``templates_path``.
            PromptError: an unknown ``template``.
        """
        known = ("hard_negative", "model")
        if not self.sources:
            raise StageError("pairwise", f"sources is empty; use some of {list(known)}")
        if bad := [s for s in self.sources if s not in known]:
            raise StageError("pairwise",
                             f"unknown pair source {bad[0]!r}{did_you_mean(bad[0], known)};"
                             f" use {list(known)}")
        if self.templates_path is not None and not Path(self.templates_path).is_file():
            raise StageError("pairwise", f"templates_path {self.templates_path!r} is not a file")

        get_pairwise_template(self.template, self.templates_path)
