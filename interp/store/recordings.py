"""Recorded activations of ``interp record``: where a recording lies and how to load it.

A recording is the hook tensors of one QA record's prompts (:mod:`interp.stages.record`),
stored under ``DIR/record/<dataset>/<id>/``: shards and an ``index.json`` written last.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from interp.core.contract import spec
from interp.core.errors import RunDirError
from interp.core.io import finite, read_json
from interp.core.names import safe_name
from interp.store.rundir import RunDir

RECORDINGS_DIR = spec("record").folder
"""Folder of ``interp record`` in a run directory (:mod:`interp.stages.record`)."""


def recording_index_path(run: RunDir | str | Path, dataset: str, record_id: str) -> Path:
    """``DIR/record/<dataset>/<id>/index.json``: one record's index part (the contract's)."""
    root = run.path if isinstance(run, RunDir) else Path(run)
    return spec("record").parts[0].path(root, dataset, record_id)


@dataclass
class Activations:
    """One recorded hook point of one prompt, with what its axes mean.

    Attributes:
        hook: the TransformerLens name asked for (``blocks.5.attn.hook_pattern``), or a bare
            point (``hook_resid_post``) for all recorded layers stacked.
        tensor: ``[n_heads, n_query, pos]`` for ``attn.hook_pattern`` (rows sum to 1),
            ``[n_query, d_model]`` for ``hook_resid_pre`` / ``hook_resid_post``,
            ``[n_query, n_heads, head_dim]`` for ``attn.hook_z``; a bare point adds a leading
            ``[n_layers]`` axis (``layers``). ``n_query = len(positions)``.
        tokens: the prompt's token strings ``[pos]`` (each id decoded alone).
        labels: span label of every position ``[pos]`` (``context``, ``question``,
            ``candidate``, ``template``, ...).
        positions: the prompt positions of the query/position axis (``--positions``).
        layers: the layers of the tensor (one for a single hook).
        token_ids: the prompt's token ids ``[pos]``.
        token_spans: span -> ``[start, end)`` token range.
        n_layers: the depth of the model that was recorded.
    """

    hook: str
    tensor: torch.Tensor
    tokens: list[str]
    labels: list[str]
    positions: list[int]
    layers: list[int]
    token_ids: list[int]
    token_spans: dict[str, list[int]]
    n_layers: int = 0


def _find_part(root: Path, record_id: str, dataset: str | None) -> Path:
    """The index part of a record (step 1 of :func:`load_activations`)."""
    folder = safe_name(dataset) if dataset is not None else "*"  # safe names hold no glob
    parts = sorted((root / RECORDINGS_DIR).glob(f"{folder}/{safe_name(record_id)}/index.json"))
    if not parts:
        of = "" if dataset is None else f" of {dataset}"
        n = len(list((root / RECORDINGS_DIR).glob("*/*/index.json")))
        if not n:
            RunDir(root).require_run()
            raise RunDirError(f"{root} has no recording of record {record_id!r}{of}: run "
                              f"`interp record --run {root}` first")
        rd = RunDir(root)
        ok = rd.records_path.exists() and any(
            str(r.get("id")) == record_id and dataset in (None, r.get("dataset"))
            for r in rd.read_records())
        if not ok:
            raise RunDirError(f"{root} has no ok record {record_id!r}{of} (not in records.jsonl,"
                              f" or skipped by the harness): only ok records are recorded")
        raise RunDirError(f"record {record_id!r}{of} was not recorded: `interp record` recorded "
                          f"{n} records (the first --limit N ok records per dataset) and this "
                          f"one is outside them; run `interp record --run {root}` with a larger "
                          f"--limit, or none, to include it")
    if len(parts) > 1:
        raise RunDirError(f"record id {record_id!r} is recorded in several datasets "
                          f"({[p.parent.parent.name for p in parts]}): pass dataset=")
    return parts[0]


def load_activations(run: RunDir | str | Path, record_id: str, task: str, hook: str, *,
                     dataset: str | None = None) -> Activations:
    """Load a tensor that ``interp record`` wrote, by its TransformerLens hook name.

    Algorithm: 1. find the record's index part ``DIR/record/<dataset>/<id>/index.json`` (written
    after all of its shards, so it never names a missing one); 2. look the hook up in its
    ``tensors.<task>`` table; 3. read only those tensors from their shards (``safe_open``).

    Example:
        >>> a = load_activations("runs/smol", "56de0f", "eval", "blocks.20.attn.hook_pattern")
        >>> a.tensor.shape, a.tokens[-1], a.labels[a.positions[0]]

    Args:
        run: the run directory.
        record_id: the record's ``id``.
        task: ``"gen"`` or ``"eval"``.
        hook: ``blocks.{L}.attn.hook_pattern``, ``blocks.{L}.hook_resid_pre``,
            ``blocks.{L}.hook_resid_post``, ``blocks.{L}.attn.hook_z`` (``L`` may be negative:
            from the end of the model), or the point alone (``attn.hook_pattern``,
            ``hook_resid_post``, ...) for every recorded layer stacked on a first axis.
        dataset: the record's dataset, needed only when the id occurs in several.

    Returns:
        :class:`Activations` (shapes there), the tensor in the recorded dtype on CPU.

    Raises:
        RunDirError: nothing recorded for the record, an ambiguous id, an unknown task, or a
            hook that was not recorded (the message lists the recorded ones).
    """
    root = run.path if isinstance(run, RunDir) else Path(run)
    path = _find_part(root, str(record_id), dataset)
    part = read_json(path)
    if task not in part["tasks"]:
        raise RunDirError(f"unknown task {task!r}; recorded: {sorted(part['tasks'])}")
    table: dict[str, Any] = part["tensors"][task]
    n_layers = int(part["n_layers"])
    m = re.fullmatch(r"blocks\.(-?\d+)\.(.+)", hook)
    if m:
        layer = int(m.group(1)) + (n_layers if int(m.group(1)) < 0 else 0)
        names = [f"blocks.{layer}.{m.group(2)}"]
    else:
        names = [n for n in table if n.split(".", 2)[2] == hook]
    if not names or any(n not in table for n in names):
        known = sorted({n.split(".", 2)[2] for n in table})
        raise RunDirError(f"{hook!r} was not recorded for {record_id!r} ({task}); recorded "
                          f"points {known} at layers {part['layers']}")
    tensors = []
    for name in names:
        with safe_open(str(path.parent / table[name]["shard"]), "pt") as f:
            tensors.append(finite(f.get_tensor(name), path=path.parent / table[name]["shard"],
                                  name=name, record=f"{part.get('dataset', '?')}/{record_id}"))
    info = part["tasks"][task]
    return Activations(hook=hook, tensor=tensors[0] if m else torch.stack(tensors),
                       tokens=info["tokens"], labels=info["labels"],
                       positions=info["positions"],
                       layers=[int(n.split(".")[1]) for n in names],
                       token_ids=info["token_ids"], token_spans=info["token_spans"],
                       n_layers=n_layers)

