"""The findings study (docs/findings.md): an experiment written against interp, not part of it.

:mod:`experiments.findings.report` writes the claims table, :mod:`experiments.findings.claims`
reads each claim, :mod:`experiments.findings.rules` decides every row by one rule,
:mod:`experiments.findings.replication` re-decides the primary rows on a held-out split,
:mod:`experiments.findings.state` keeps the resumable state (a checksummed archive per
stage and model, ``experiments/findings/state.parts``). Run as ``python -m experiments.findings``.
"""

from experiments.findings.report import (
    BEGIN,
    END,
    Cell,
    claims,
    collect,
    main,
    render,
    restore_archived,
    save_archived,
    update_doc,
)

__all__ = ["BEGIN", "END", "Cell", "claims", "collect", "main", "render", "restore_archived",
           "save_archived", "update_doc"]
