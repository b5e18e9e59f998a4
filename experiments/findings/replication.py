"""The replication split: a fixed share of the findings records, by passage, read by no selection.

:func:`replication_ids` picks the records whose passage (:func:`interp.data.passage_key`)
hashes into the split (:data:`SHARE` of passages, sha256 of the key): a rule of the passage
alone, so both models and every run of the same records share it, and a question never sits
on both sides of it. The ids are committed (``experiments/findings/replication_ids.json``);
only this module reads that file: no selection (heads, probes' cells, learning rates) does.

:func:`redecide` recomputes Study 1's metrics on the split's records of each model's stored
runs (the default and the ``matched`` template, from the restored findings state) into
``figures/findings/replication/`` (and its ``matched/``), where the report's same rule
(:mod:`experiments.findings.rules`) decides the primary rows again. Rows whose stored state
keeps no per-record results the split can select (attention ratios are per record, but
transfer and the rest are summaries) are not re-decided::

    python -m experiments.findings.replication RUNS [--ids] FIG_DIR
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["IDS_FILE", "SHARE", "in_split", "redecide", "replication_ids"]

SHARE = 5
"""One passage in ``SHARE`` (20%) is in the replication split."""
IDS_FILE = Path(__file__).with_name("replication_ids.json")
"""The committed split: ``{"rule": ..., "ids": {dataset: [record id, ...]}}``."""


def in_split(passage: str) -> bool:
    """Whether a passage key lies in the replication split (sha256 of the key, mod SHARE)."""
    return int(hashlib.sha256(passage.encode()).hexdigest()[:8], 16) % SHARE == 0


def replication_ids(records: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The split's record ids per dataset, sorted."""
    from interp.data import passage_key

    out: dict[str, set[str]] = {}
    for r in records:
        if in_split(passage_key(r)):
            out.setdefault(r["dataset"], set()).add(str(r["id"]))
    return {d: sorted(v) for d, v in sorted(out.items())}


def redecide(runs: Path, fig_dir: Path, models: Sequence[str]) -> dict[str, Any]:
    """Study 1 on the committed split's records of each model's runs, published for the rule.

    Returns:
        ``{model: {sub: n records}}`` of what was written.
    """
    from interp.core.io import read_jsonl, write_json
    from interp.methods.asymmetry import compute_metrics

    ids = json.loads(IDS_FILE.read_text())["ids"]
    keep = {(d, i) for d, v in ids.items() for i in v}
    done: dict[str, Any] = {}
    for m in models:
        for sub, run in (("", "findings"), ("matched/", "findings_matched")):
            path = runs / run / m / "records.jsonl"
            if not path.is_file():
                continue
            recs = [r for r in read_jsonl(path) if (r["dataset"], str(r["id"])) in keep]
            out = fig_dir / "replication" / f"{sub}{m}__asymmetry_metrics.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            write_json(out, compute_metrics(recs))
            done.setdefault(m, {})[sub or "default"] = len(recs)
    return done


def main(argv: Sequence[str] | None = None) -> None:
    """``RUNS FIG_DIR``: re-decide; ``--ids RUNS``: write the split's ids (once)."""
    args = list(sys.argv[1:] if argv is None else argv)
    models = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]
    if args[:1] == ["--ids"]:
        from interp.core.io import read_jsonl

        recs = read_jsonl(Path(args[1]) / "findings" / models[0] / "records.jsonl")
        IDS_FILE.write_text(json.dumps({
            "rule": f"passage key's sha256, first 8 hex digits, mod {SHARE} == 0",
            "ids": replication_ids(recs)}, indent=1) + "\n")
        print(f"wrote {IDS_FILE}")
        return
    print(json.dumps(redecide(Path(args[0]), Path(args[1]), models)))


if __name__ == "__main__":
    main()
