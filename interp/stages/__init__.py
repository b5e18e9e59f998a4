"""The studies as run-directory stages: one module per study, listed explicitly.

* :mod:`interp.stages.asymmetry` creates a run (Study 1) and writes ``metrics.json``;
* every stage in :data:`STAGES` reads a finished run and follows the :class:`Stage` protocol
  (:mod:`interp.stages.common`): ``NAME``, ``SUMMARIES``, ``Config``, ``run(run_dir, handle,
  cfg)`` and ``format_summary(summary)``.

:func:`load_run_model` is the one way to load a run's model (it checks the manifest's sha256).
:mod:`interp.pipeline` runs an experiment config through these stages, :mod:`interp.cli` has
one thin command per stage.
"""

from __future__ import annotations

from interp.stages import (
    asymmetry,
    attention,
    audit,
    patching,
    probe,
    record,
    steering,
    transfer,
)
from interp.stages.common import Stage, check_run_model, load_run_model

__all__ = ["STAGES", "Stage", "asymmetry", "attention", "audit", "check_run_model",
           "load_run_model", "patching", "probe", "record", "steering", "transfer"]

STAGES: dict[str, Stage] = {
    attention.NAME: attention,  # type: ignore[dict-item]
    probe.NAME: probe,  # type: ignore[dict-item]
    transfer.NAME: transfer,  # type: ignore[dict-item]
    patching.NAME: patching,  # type: ignore[dict-item]
    steering.NAME: steering,  # type: ignore[dict-item]
    record.NAME: record,  # type: ignore[dict-item]
    audit.NAME: audit,  # type: ignore[dict-item]
}
"""Stages that read a finished asymmetry run, by config-table name, in the order they run."""
