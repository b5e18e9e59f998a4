"""The run directory: manifest, records, tables and tensors, written atomically, resumable.

Layout (every command reads and writes one)::

    DIR/manifest.json     config, model provenance, package versions, seed, git commit
    DIR/records.jsonl     one line per (example): prompt spans, generation, oracle label, verdict
    DIR/metrics.json      GA, EA, Delta with CIs, acceptance rates, per dataset
    DIR/requests.jsonl    the request cache of a served model or LLM oracle (openai:MODEL)
    DIR/attention/ DIR/probes/ DIR/transfer/ DIR/patching/ DIR/steering/ DIR/lens/
    DIR/calibration/ DIR/pairwise/ DIR/record/ DIR/audit/ DIR/reasoning/
                          one folder per stage (``StageSpec.folder``, interp.core.contract)
    DIR/activations/      residual streams of ``interp attention --save-resid``
    DIR/figures/ DIR/view/ (interp view) DIR/shards/I-of-N/ (each shard of a sharded run)

JSON files are written to a temporary file and renamed (atomic). ``records.jsonl`` is appended
line by line with a flush and fsync after each batch; a line cut by a crash is reported and
dropped on the next read, so that record is simply redone.

One concern a module: :mod:`interp.core.io` (atomic writers, readers, signatures of stored
parts), :mod:`interp.store.records` (the QA record schema), :mod:`interp.store.rundir`
(:class:`RunDir`: the manifest and the record log) and :mod:`interp.store.recordings` (loading
what ``interp record`` wrote). The names below are the public API of the run directory.
"""

from typing import Any

from interp.store.records import Record
from interp.store.rundir import RunDir

__all__ = ["Activations", "Record", "RunDir", "load_activations"]

_RECORDINGS = ("Activations", "load_activations")


def __getattr__(name: str) -> Any:
    """The recordings' names, imported on first use (they need torch; the rest does not)."""
    if name in _RECORDINGS:
        from interp.store import recordings

        return getattr(recordings, name)
    raise AttributeError(f"module 'interp.store' has no attribute {name!r}")
