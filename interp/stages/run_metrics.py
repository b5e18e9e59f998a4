"""A run's ``metrics.json``: the one writer, used by every stage that makes records.

The asymmetry stage (:mod:`interp.stages.asymmetry`, its ``tables_only``), the merge of shards
(:mod:`interp.stages.merge`) and the audit of a judged file (:mod:`interp.stages.audit`) write it
with :func:`write_metrics`. It lives apart from :mod:`interp.stages.stored` because it needs
the cross-judge metrics (:func:`interp.methods.cross_judge.source_metrics`), whose module reaches
the probe stage and through it the stored parts.
"""

from __future__ import annotations

from typing import Any

from interp.core.io import read_jsonl, write_json
from interp.data import DATASETS
from interp.methods.asymmetry import compute_metrics
from interp.methods.balanced import compute_balanced
from interp.methods.cross_judge import source_metrics
from interp.plots.asymmetry import plot_asymmetry
from interp.store.rundir import RunDir

__all__ = ["BALANCED_RECORDS", "write_metrics"]

BALANCED_RECORDS = "balanced/records.jsonl"
"""The balanced judge set's judged candidates (:mod:`interp.methods.balanced`), under the run
directory; its first line holds the set's counts per dataset (``{"counts": ...}``)."""


def write_metrics(run: RunDir, config: Any = None, *, write: bool = True) -> dict[str, Any]:
    """Recompute ``metrics.json`` from the records and draw the asymmetry figure.

    ``write`` False computes them only (a run on a read-only file system is read, not
    written).

    With a config (:class:`interp.stages.asymmetry.AsymmetryConfig`: ``datasets``, ``seed``,
    ``n_boot``), only the configured datasets' records count (unless a dataset is given as a
    file path, whose records carry their own dataset names).

    When the run holds a judged balanced set (:data:`BALANCED_RECORDS`, ``interp metrics
    --balanced``), ``metrics["balanced"]`` is its :func:`interp.methods.balanced.
    compute_balanced` over the same datasets.
    """
    records = run.read_records(status=None)
    if config is not None:
        names = {d for d in config.datasets if d in DATASETS}
        paths = [d for d in config.datasets if d not in DATASETS]
        if not paths:
            records = [r for r in records if r["dataset"] in names]
    seed = config.seed if config else 0
    n_boot = config.n_boot if config else 2000
    metrics = compute_metrics(records, n_boot=n_boot, seed=seed)
    if any(r.get("answer_source") for r in records):  # cross-judged: metrics per source
        metrics["answer_sources"] = source_metrics(records, n_boot=n_boot, seed=seed)
    if (bal := run.path / BALANCED_RECORDS).is_file():  # judged by `interp metrics --balanced`
        rows = read_jsonl(bal)
        keep = {r["dataset"] for r in records}
        metrics["balanced"] = compute_balanced(
            [r for r in rows if r.get("balanced_role") and r["dataset"] in keep],
            {d: c for d, c in (next((r["counts"] for r in rows if "counts" in r), {})).items()
             if d in keep}, n_boot=n_boot, seed=seed)
    if write:
        write_json(run.path / "metrics.json", metrics)
        plot_asymmetry(metrics, run.sub("figures"))
    return metrics
