"""The studies as run-directory stages: one module per study, declared in one contract.

:data:`interp.core.contract.SPECS` declares every stage (name, command, config, the files it
writes, what it needs and keeps, how its parts are keyed); each stage module provides
``run(run_dir, handle, cfg, *, overwrite, log)`` and ``format_summary(summary)``.

* :mod:`interp.stages.asymmetry` creates a run (Study 1) and writes ``metrics.json``, or this
  process's shard of it (:mod:`interp.launch`), which :mod:`interp.stages.merge` joins;
* every stage in :data:`STAGES` (the specs after ``asymmetry``, as modules) reads a finished
  run, or (``transfer``) may start in an empty folder.

:func:`load_run_model` is the one way to load a run's model (it checks the manifest's sha256).
:mod:`interp.run.pipeline` runs an experiment config through these stages, :mod:`interp.cli` has
one command per stage, built from its config. Importing this package imports no stage: the
modules and :data:`STAGES` load when first used (so the command line starts without torch).
"""

from __future__ import annotations

import importlib
from typing import Any

from interp.core.contract import SPECS

_COMMON = ("check_run_model", "load_run_model")

__all__ = ["STAGES", *_COMMON, *(s.name for s in SPECS)]
"""Every stage of the contract by name, so a new stage is listed here with its spec."""


def __getattr__(name: str) -> Any:
    """``STAGES``, the stage modules and :mod:`interp.stages.common`'s names, loaded on use."""
    if name == "STAGES":
        stages = {s.name: s.load() for s in SPECS if s.name != "asymmetry"}
        globals()["STAGES"] = stages
        return stages
    if name in _COMMON:
        return getattr(importlib.import_module("interp.stages.common"), name)
    if stage := next((s for s in SPECS if s.name == name), None):
        return stage.load()
    raise AttributeError(f"module 'interp.stages' has no attribute {name!r}")
