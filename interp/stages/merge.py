"""Finished shards (:mod:`interp.launch`) become one run directory, as an unsharded run leaves it.

Algorithm of :func:`merge_shards` (``interp merge SHARD_DIR... --out DIR``; under torchrun
rank 0 calls it by itself, :func:`interp.stages.asymmetry.run` with a shard):

1. **Check, writing nothing** (a refused merge changes no input and no output): every
   directory is a shard (its manifest has ``shard``); one count ``N``, each index ``0..N-1``
   exactly once; the same config (every key but the device and the model placement,
   :data:`PROCESS_FIELDS`), the same model (spec and sha256), the same result-relevant
   runtime facts (:func:`interp.models.loading.result_facts`, of the run and of every stage both
   shards ran) and the same global selection (``total``); every shard finished (its
   ``records.jsonl`` holds each record it owns once); no record in two shards and none
   missing; the same data (the content fingerprint of the global selection,
   :func:`interp.launch.selection_sha256`: an edited gold answer in a file of the same path,
   ids and count differs); ``DIR`` is no input shard and lies inside none (it may hold them, as
   ``OUT/shards/I-of-N``), and when it already holds a run, that run was made with the same
   config. Each refusal is one line naming the shard and the difference.
2. **Copy the parts** the stages keep per record (every :class:`interp.core.contract.Part`
   of :data:`interp.core.contract.SPECS`, by its ``keyed``): the ``lines`` of
   ``records.jsonl`` in the order an unsharded run writes (the global
   selection's), every per-record file or folder copied, the rows of files that key many
   records (probe feature caches) concatenated in that order, their signatures checked equal.
3. **Manifest**: shard 0's, with ``shards`` (each shard's name, folder, launcher, records,
   creation, runtime facts and commit) and ``merged`` (when); no ``shard`` entry.
4. **Tables once**: ``metrics.json`` and the asymmetry figure over all records
   (:func:`interp.stages.run_metrics.write_metrics`). Stage tables (attention summary, probe
   sweeps, patching and steering summaries) come from running the stage on the merged run,
   which finds its parts fresh and runs no forward for them (``interp run`` does it next).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from interp.core.contract import SPECS, Part
from interp.core.errors import ShardError
from interp.core.io import (
    is_tmp_path,
    load_tensors,
    read_json,
    save_tensors,
    write_json,
    write_jsonl,
)
from interp.stages.configs.asymmetry import ASYMMETRY_KEY_FIELDS, AsymmetryConfig
from interp.stages.run_metrics import write_metrics
from interp.store.records import qa_key
from interp.store.rundir import RunDir

__all__ = ["PROCESS_FIELDS", "merge_shards"]

PROCESS_FIELDS = ("device", "device_map", "max_memory", "offload_folder", "shard")
"""Config keys that may differ between shards: where a process computes, not what."""


def _parts() -> list[Part]:
    """Every stage's declared parts (:data:`interp.core.contract.SPECS`), step 2's list."""
    return [p for s in SPECS for p in s.parts]


def _unit(part: Part, root: Path, f: Path) -> Path:
    """What one record's part is: the file, or the folder named by ``{id}`` holding it."""
    depth = next((i for i, piece in enumerate(Path(part.pattern).parts) if "{id}" in piece),
                 None)
    pieces = f.relative_to(root).parts
    return root.joinpath(*pieces[:depth + 1]) if depth is not None else f


def _refuse(msg: str) -> None:
    raise ShardError(f"merge refused: {msg}; nothing was changed")


def _disjoint(dirs: Sequence[Path], out: Path) -> None:
    """Step 1: ``out`` is no input shard and lies inside none (it may hold them: OUT/shards/)."""
    o = out.resolve()
    for d in dirs:
        r = d.resolve()
        if o == r or r in o.parents:
            _refuse(f"--out {out} {'is' if o == r else 'lies inside'} the input shard {d}; "
                    f"give the run directory that holds the shards (e.g. "
                    f"{r.parent.parent if r.parent.name == 'shards' else r.parent}) or "
                    f"another folder")


def _manifests(dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """Step 1: every shard's manifest, sorted by index, one count, every index once."""
    out = []
    for d in dirs:
        if not (d / "manifest.json").exists():
            _refuse(f"{d} has no manifest.json (not a run directory)")
        m = read_json(d / "manifest.json")
        if "shard" not in m:
            _refuse(f"{d} is not a shard (its manifest has no 'shard'; write shards with "
                    f"--shard I/N or a launcher)")
        out.append({**m, "_dir": d})
    counts = sorted({m["shard"]["count"] for m in out})
    if len(counts) > 1:
        _refuse(f"shards of different counts {counts}")
    n = counts[0]
    seen: dict[int, Path] = {}
    for m in out:
        i = m["shard"]["index"]
        if i in seen:
            _refuse(f"shard {i}-of-{n} given twice ({seen[i]} and {m['_dir']})")
        seen[i] = m["_dir"]
    if missing := sorted(set(range(n)) - set(seen)):
        _refuse(f"shard {missing[0]}-of-{n} is missing (given: "
                f"{', '.join(f'{i}-of-{n}' for i in sorted(seen))})")
    return sorted(out, key=lambda m: m["shard"]["index"])


def _same(ms: Sequence[Mapping[str, Any]]) -> None:
    """Step 1: one config, model and result facts across shards."""
    first = ms[0]
    name0 = first["shard"]["name"]
    for m in ms[1:]:
        name = m["shard"]["name"]
        a, b = first["config"], m["config"]
        if diff := [k for k in sorted(set(a) | set(b))
                    if k not in PROCESS_FIELDS and a.get(k) != b.get(k)]:
            k = diff[0]
            _refuse(f"shard {name} was made with another config than {name0} ({k}: "
                    f"{a.get(k)!r} vs {b.get(k)!r})")
        for k in ("spec", "sha256"):
            if first["model"].get(k) != m["model"].get(k):
                _refuse(f"shard {name} was made with another model than {name0} (model {k}: "
                        f"{first['model'].get(k)!r} vs {m['model'].get(k)!r})")
        facts = [("run", first.get("result_facts"), m.get("result_facts"))]
        for st in sorted(set(first.get("stages") or {}) & set(m.get("stages") or {})):
            facts.append((f"{st} stage", first["stages"][st].get("result_facts"),
                          m["stages"][st].get("result_facts")))
        for where, fa, fb in facts:
            fa, fb = fa or {}, fb or {}
            if diff := [k for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]:
                k = diff[0]
                _refuse(f"shard {name} computed under other settings than {name0} ({where}: "
                        f"{k} {fa.get(k)!r} vs {fb.get(k)!r})")
        da, db = first["shard"].get("data_sha256"), m["shard"].get("data_sha256")
        if da != db:
            _refuse(f"shard {name} was made from other data than {name0} (content sha256 "
                    f"{str(db)[:12]} vs {str(da)[:12]}: a data file edited between the shards?);"
                    f" rerun shard {name} on the data the others used, or every shard on the "
                    f"new data")
        if m["shard"]["total"] != first["shard"]["total"]:
            _refuse(f"shard {name} selected {m['shard']['total']} records in all, {name0} "
                    f"{first['shard']['total']}")


def _records(ms: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Step 1: every shard finished, no record twice or missing; records in global order."""
    placed: dict[int, dict[str, Any]] = {}
    where: dict[tuple[str, str], str] = {}
    for m in ms:
        sh, name = m["shard"], m["shard"]["name"]
        pos = dict(zip((tuple(k.split("/", 1)) for k in sh["keys"]), sh["positions"]))
        rd = RunDir(m["_dir"])
        recs = rd.read_records(status=None) if rd.records_path.exists() else []
        got: dict[tuple[str, str], dict[str, Any]] = {}
        for r in recs:
            k = qa_key(r)
            if k in got:
                _refuse(f"shard {name} holds record {'/'.join(k)} twice")
            if k in where:
                _refuse(f"record {'/'.join(k)} is in shards {where[k]} and {name}")
            if k not in pos:
                _refuse(f"shard {name} holds record {'/'.join(k)}, which it does not own")
            got[k], where[k] = r, name
        if len(got) < len(pos):
            first = next(k for k in pos if k not in got)
            _refuse(f"shard {name} is unfinished: {len(got)} of its {len(pos)} records (first "
                    f"missing: {'/'.join(first)}); rerun its command, it resumes")
        for k, r in got.items():
            if pos[k] in placed:
                _refuse(f"records {'/'.join(k)} and {'/'.join(qa_key(placed[pos[k]]))} "
                        f"claim one position")
            placed[pos[k]] = r
    total = ms[0]["shard"]["total"]
    if missing := sorted(set(range(total)) - set(placed)):
        _refuse(f"{len(missing)} of {total} records are in no shard (first: position "
                f"{missing[0]})")
    return [placed[i] for i in range(total)]


def _part_files(root: Path, part: Part) -> list[Path]:
    return [p for p in part.files(root) if not is_tmp_path(p)]


def _plan_parts(ms: Sequence[Mapping[str, Any]]) -> tuple[list[tuple[Path, Path]],
                                                         dict[str, list[Path]]]:
    """Step 2, checked before anything is written: ``(copies, rows files by relative path)``."""
    copies: list[tuple[Path, Path]] = []
    rows: dict[str, list[Path]] = {}
    owner: dict[Path, str] = {}
    for m in ms:
        root, name = Path(m["_dir"]), m["shard"]["name"]
        for part in _parts():
            if part.keyed in ("lines", "step"):
                continue  # lines: the records, joined by _records; steps are not sharded
            for f in _part_files(root, part):
                rel = f.relative_to(root)
                if part.keyed == "rows":
                    rows.setdefault(str(rel), []).append(f)
                    continue
                src = _unit(part, root, f)
                rel = src.relative_to(root)
                if rel in owner:
                    _refuse(f"{rel} is in shards {owner[rel]} and {name}")
                owner[rel] = name
                copies.append((src, rel))
    return copies, rows


def _merge_rows(files: Sequence[Path], order: Mapping[str, int]) -> tuple[dict, dict]:
    """Rows of several shards' copies of one rows-keyed part, in ``order`` (step 2).

    Metadata entries that are JSON lists as long as ``keys`` in every shard are per row and
    concatenated; other lists (keys of a subset, such as ``candidate_fallback``) are joined;
    every other entry (the signature, pools, model) must be the same in every shard.
    """
    metas, tensors = [], []
    for f in files:
        with safe_open(str(f), "pt") as fh:
            meta = dict(fh.metadata() or {})
        metas.append({k: json.loads(v) if k == "keys" or (v[:1] == "[" and k != "pools") else v
                      for k, v in meta.items()})
        tensors.append(load_tensors(f))
    lists = {k for m in metas for k, v in m.items() if isinstance(v, list) and k != "keys"}
    per_row = {k for k in lists if all(len(m.get(k, [])) == len(m["keys"]) for m in metas)}
    keys = [k for m in metas for k in m["keys"]]
    if len(set(keys)) != len(keys):
        _refuse(f"{files[0].name}: a record's row is in two shards")
    idx = sorted(range(len(keys)), key=lambda i: (order.get(keys[i], len(order)), i))
    out: dict[str, str] = {"keys": json.dumps([keys[i] for i in idx])}
    for k in sorted(lists):
        vals = [x for m in metas for x in m.get(k, [])]
        out[k] = json.dumps([vals[i] for i in idx] if k in per_row else list(dict.fromkeys(vals)))
    for f, m in zip(files, metas):
        for k, v in m.items():
            if k not in lists and k != "keys" and out.setdefault(k, v) != v:
                _refuse(f"{f.name} of the shards differ in {k} ({out[k][:40]!r} vs "
                        f"{v[:40]!r}): they were made under other settings")
    names = set(tensors[0])
    if any(set(t) != names for t in tensors):
        _refuse(f"{files[0].name} of the shards hold different tensors")
    return {n: torch.cat([t[n] for t in tensors])[idx] for n in names}, out


def _write(rd: RunDir, ms: Sequence[Mapping[str, Any]], records: list[dict[str, Any]],
           copies: Sequence[tuple[Path, Path]], merged_rows: Mapping[str, tuple[dict, dict]]
           ) -> dict[str, Any]:
    """Steps 2-4 of :func:`merge_shards` on checked shards: parts, manifest, tables."""
    rd.path.mkdir(parents=True, exist_ok=True)
    write_jsonl(rd.records_path, records)
    for src, rel in copies:
        dest = rd.path / rel
        if src.is_dir():
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(src, dest, ignore=lambda d, names: [n for n in names
                                                                if is_tmp_path(n)])
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
    for rel, (tensors, meta) in merged_rows.items():
        save_tensors(rd.path / rel, tensors, meta)
    # step 3
    first = ms[0]
    manifest = {k: v for k, v in first.items() if k not in ("shard", "_dir")}
    # where the shards computed (cuda:0, cuda:1, ...): kept when they agree, else the default
    manifest["config"] = {**first["config"], **{
        k: first["config"].get(k) if all(m["config"].get(k) == first["config"].get(k)
                                         for m in ms) else None for k in PROCESS_FIELDS}}
    manifest["shards"] = [{"name": m["shard"]["name"], "dir": str(m["_dir"]),
                           "launcher": m["shard"]["launcher"], "records": len(m["shard"]["keys"]),
                           "created": m.get("created"), "git_commit": m.get("git_commit"),
                           "runtime": m.get("runtime"),
                           "result_facts": m.get("result_facts")} for m in ms]
    manifest["merged"] = {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "shards": len(ms),
                          "records": len(records)}
    write_json(rd.manifest_path, manifest)
    # step 4
    cfg = AsymmetryConfig.from_mapping(
        {k: v for k, v in first["config"].items()
         if k in AsymmetryConfig.__dataclass_fields__ and k not in PROCESS_FIELDS})
    metrics = write_metrics(rd, cfg)
    return metrics


def merge_shards(shard_dirs: Sequence[str | Path], out: str | Path, *,
                 overwrite: bool = False, log: Callable[[str], None] = print
                 ) -> dict[str, Any]:
    """Merge finished shards into one run directory (module docstring).

    Args:
        shard_dirs: the shards' run directories (``OUT/shards/I-of-N``), every one of them.
        out: the merged run directory (created; an existing run there must have the same
            config unless ``overwrite``).
        overwrite: replace a run in ``out`` made with another config.
        log: progress lines.

    Returns:
        ``metrics.json``'s content over the merged records.

    Raises:
        ShardError: a refused merge (step 1), one line; nothing is written.
    """
    t0 = time.perf_counter()
    dirs = [Path(d) for d in shard_dirs]
    if not dirs:
        _refuse("no shard directories given")
    _disjoint(dirs, Path(out))
    ms = _manifests(dirs)
    _same(ms)
    records = _records(ms)
    copies, rows = _plan_parts(ms)
    order = {"/".join(qa_key(r)): i for i, r in enumerate(records)}
    merged_rows = {rel: _merge_rows(files, order) for rel, files in rows.items()}
    rd = RunDir(out)
    if rd.manifest_path.exists() and not overwrite:
        old = read_json(rd.manifest_path).get("config", {})
        new = ms[0]["config"]
        if diff := [k for k in ASYMMETRY_KEY_FIELDS if old.get(k) != new.get(k)]:
            _refuse(f"{out} holds a run made with another config ({diff[0]}: "
                    f"{old.get(diff[0])!r} vs {new.get(diff[0])!r}); use --overwrite or "
                    f"another --out")
    # step 2: nothing was written before this line; the merged run's writer lock is held
    # (the shards under OUT/shards/ hold their own, released when each finished)
    with rd.writer():
        metrics = _write(rd, ms, records, copies, merged_rows)
    log(f"[merge] {len(ms)} shards, {len(records)} records, {len(copies)} parts copied, "
        f"{len(rows)} row files joined into {out} in {time.perf_counter() - t0:.1f} s")
    return metrics
