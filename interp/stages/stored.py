"""Stored parts that more than one stage reads or writes: recordings, feature caches, metrics.

The attention stage (:mod:`interp.stages.attention`), the probe stage
(:mod:`interp.stages.probe`) and the calibration stage (:mod:`interp.stages.calibration`,
through :func:`cached_features`) read these parts; the asymmetry harness writes them too, in its one
pass (:mod:`interp.stages.asymmetry`, ``one_pass``, :func:`store_one_pass`), under the same
signatures, so that the stages find them fresh and run no forward. The attention recorder
(:func:`record_attention`) is here too: the audit stage (:mod:`interp.stages.audit`) uses it
and :func:`store_one_pass` on the runs it judges. Their
paths are the ones the stage contract declares (:data:`interp.core.contract.SPECS`: the
attention stage's and the probe stage's ``parts``); no stage module imports another.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from interp.analysis.span_mass import SPANS, TASKS, span_mass, span_names
from interp.core.contract import spec
from interp.core.errors import Interrupted, RunDirError, StageError
from interp.core.io import (
    finite,
    is_fresh,
    load_tensors,
    read_json,
    save_tensors,
    signature,
)
from interp.core.layers import parse_layers
from interp.core.progress import tqdm
from interp.core.vocab import attention_backend
from interp.hooks.recorder import record_rows
from interp.judging.prefill import Capture
from interp.judging.prompts import record_prompts, rerender
from interp.judging.residual_features import HOOK_POINT, POOLS, extract_features, task_pools
from interp.models.loading import ModelHandle
from interp.stages.common import ok_records, stage_facts
from interp.store.records import Record, limit_per_dataset, qa_key
from interp.store.rundir import RunDir

__all__ = ["FEATURES_VERSION", "RECORDING_VERSION", "activations_path", "cached_features",
           "features_path",
           "load_masses", "read_attention_summary", "record_attention", "rows_path",
           "qa_record_signature", "recording_signature", "save_recording", "store_features",
           "store_one_pass"]

RECORDING_VERSION = "1"
"""Part of every recording's signature: bump it when what a recording holds changes."""
FEATURES_VERSION = "2"
"""Part of the features and sweep signatures; 2: rows keyed on their prompt's token ids."""

_ATTENTION = spec("attention")
_PROBE = spec("probe")


def rows_path(run: RunDir, rec: Record | Mapping[str, Any]) -> Path:
    """``DIR/attention/records/<dataset>/<id>.safetensors`` of a record (the contract's part)."""
    return _ATTENTION.parts[0].path(run.path, rec["dataset"], rec["id"])


def activations_path(run: RunDir, rec: Record | Mapping[str, Any]) -> Path:
    """``DIR/activations/<dataset>/<id>.safetensors`` of a record (the contract's part)."""
    return _ATTENTION.parts[1].path(run.path, rec["dataset"], rec["id"])


def features_path(run: RunDir, task: str) -> Path:
    """``DIR/probes/features_<task>.safetensors`` (the contract's part of the probe stage)."""
    return _PROBE.parts[0].path(run.path, task=task)


def read_attention_summary(run: RunDir) -> dict[str, Any]:
    """``DIR/attention/summary.json`` (the attention stage's declared table).

    Raises:
        RunDirError: it does not exist (names the command that writes it).
    """
    path = run.path / _ATTENTION.table("summary.json")
    if not path.exists():
        if any(run.path.glob("*/manifest.json")):  # a grid folder: name its runs instead
            run.require_run()
        raise RunDirError(f"{path} does not exist: run `interp attention --run {run.path}` first")
    return read_json(path)


def load_masses(run: RunDir, *, limit: int | None = None
                ) -> tuple[list[Record], dict[str, np.ndarray], list[str], list[str]]:
    """Load the recorded span masses of a run's ok records (no model).

    Returns:
        ``(records, mass, spans, backends)``: the ok records that have a recording, ``mass`` =
        ``{"gen": [n_rec, n_layers, n_heads, n_spans], "eval": ...}`` (spans aligned to the
        union ``spans``), and the backends that recorded them.

    Raises:
        RunDirError: no records, none recorded yet, or a recording made from another version
            of its record (run ``interp attention``).
    """
    records = limit_per_dataset(run.read_records(), limit)
    have, per, spans, backends = [], [], list(SPANS), set()
    for r in records:
        p = rows_path(run, r)
        if not p.exists():
            continue
        with safe_open(str(p), "pt") as f:
            meta = f.metadata() or {}
            if meta.get("record", qa_record_signature(r)) != qa_record_signature(r):
                raise RunDirError(f"{p} was recorded from another version of record "
                                  f"{r['dataset']}/{r['id']} (its prompts changed): run "
                                  f"`interp attention --run {run.path}` to redo it")
            s = json.loads(meta.get("spans", json.dumps(list(SPANS))))
            backends.add(meta.get("backend", "?"))
            per.append((s, {t: finite(f.get_tensor(f"mass.{t}").numpy(), path=p,
                                      name=f"mass.{t}", record=f"{r['dataset']}/{r['id']}")
                            for t in TASKS}))
        spans += [x for x in s if x not in spans]
        have.append(r)
    if not have:
        run.require_run()
        raise RunDirError(f"{run.path} has no attention recordings: run `interp attention --run "
                          f"{run.path}` first")
    mass = {}
    for t in TASKS:
        n_l, n_h = per[0][1][t].shape[:2]
        arr = np.zeros((len(per), n_l, n_h, len(spans)), dtype=np.float32)
        for i, (s, m) in enumerate(per):
            for j, name in enumerate(s):
                arr[i, :, :, spans.index(name)] = m[t][:, :, j]
        mass[t] = arr
    return have, mass, spans, sorted(backends)


def qa_record_signature(rec: Record | Mapping[str, Any]) -> str:
    """Signature of what a record's prompts are made from (no model needed to compute it).

    Stored with each recording, so that tables built from recordings without a model
    (:func:`load_masses`) refuse a recording of an older version of the record (same id, other
    template or answer, e.g. after ``interp asymmetry --overwrite`` with another template).
    """
    return signature({k: rec.get(k) for k in ("template", "question", "context", "answer",
                                              "answers", "prompts")})


def recording_signature(handle: ModelHandle, facts: Mapping[str, Any],
                        ids: Mapping[str, Sequence[int]]) -> str:
    """Signature of a recording: model, sha256, version, runtime facts, both prompts' ids."""
    return signature({"spec": handle.spec, "sha256": handle.info.get("sha256"),
                      "v": RECORDING_VERSION, "runtime": facts,
                      "ids": {t: list(v) for t, v in ids.items()}})


def save_recording(run: RunDir, handle: ModelHandle, rec: Record | Mapping[str, Any],
                   prompts: Mapping[str, Any], rows: Mapping[str, torch.Tensor], *,
                   backend: str, sig: str, save_rows: bool = False) -> Path:
    """Save one record's span masses (and rows) to :func:`rows_path` (step 2).

    The one writer of recordings: the stage (:func:`record_attention`) and the harness's one-pass
    prefill (:mod:`interp.stages.asymmetry`) both call it, so a recording is the same file
    whoever made it.

    Args:
        run: the run directory.
        handle: the model (its layer and head counts go into the metadata).
        rec: the record (its :func:`qa_record_signature` is stored).
        prompts: ``{"gen": RenderedPrompt, "eval": RenderedPrompt}``.
        rows: ``{task: [n_layers, n_heads, n_tokens]}`` last-token attention rows.
        backend: which backend recorded them.
        sig: :func:`recording_signature`.
        save_rows: keep the rows too.

    Returns:
        The path written.
    """
    spans = span_names([lab for p in prompts.values() for lab in p.labels])
    tensors: dict[str, torch.Tensor] = {}
    for task, p in prompts.items():
        tensors[f"mass.{task}"] = span_mass(rows[task], p.labels, spans)
        if save_rows:
            tensors[f"rows.{task}"] = rows[task]
    return save_tensors(rows_path(run, rec), tensors,
                        {**recording_meta(handle, rec, prompts, spans, backend), "signature": sig})


def recording_meta(handle: ModelHandle, rec: Record | Mapping[str, Any], prompts: Mapping[str, Any],
          spans: Sequence[str], backend: str) -> dict[str, str]:
    return {"id": str(rec["id"]), "dataset": rec["dataset"], "spans": json.dumps(spans),
            "record": qa_record_signature(rec), "backend": backend,
            "n_layers": str(handle.n_layers), "n_heads": str(handle.n_heads),
            "n_tokens": json.dumps({t: len(p) for t, p in prompts.items()})}


def read_features(path: Path, sig: str, pools: Sequence[str], log: Callable[[str], None]
                ) -> tuple[dict[str, torch.Tensor], list[str], list[str], list[str]]:
    """(tensors, keys, prompt signatures, candidate fallbacks) of a fresh cache, else empty."""
    if not path.exists():
        return {}, [], [], []
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    if is_fresh(path, sig) and set(pools) <= set(json.loads(meta.get("pools", "[]"))):
        keys = json.loads(meta["keys"])
        return (load_tensors(path, rows=keys), keys, json.loads(meta["prompt_sigs"]),
                json.loads(meta.get("candidate_fallback", "[]")))
    log(f"[probe] {path.name} was made with another model, hook point, pools or runtime "
        f"settings: recomputing it")
    return {}, [], [], []


def drop_stale_features(have: dict[str, torch.Tensor], keys: list[str], sigs: list[str],
                fallback: list[str], now: Mapping[str, str]) -> tuple[dict, list, list, list]:
    """Rows whose record's prompt changed since they were cached are removed."""
    keep = [i for i, (k, s) in enumerate(zip(keys, sigs)) if now.get(k, s) == s]
    if len(keep) == len(keys):
        return have, keys, sigs, fallback
    kept = {keys[i] for i in keep}
    idx = torch.tensor(keep, dtype=torch.long)
    return ({p: t[idx] for p, t in have.items()}, [keys[i] for i in keep],
            [sigs[i] for i in keep], [k for k in fallback if k in kept])


def features_ident(handle: ModelHandle, facts: Mapping[str, Any] | None) -> dict[str, str]:
    """What a features cache is made by (its signature is of this)."""
    return {"model_sha256": str(handle.info.get("sha256")), "model": handle.spec,
            "hook_point": HOOK_POINT, "n_layers": str(handle.n_layers),
            "version": FEATURES_VERSION, "runtime": json.dumps(facts, sort_keys=True)}


def write_features(path: Path, have: Mapping[str, torch.Tensor], ident: Mapping[str, str],
                 keys: list[str], sigs: list[str], pools: Sequence[str],
                 fallback: list[str]) -> None:
    save_tensors(path, have, {**ident, "signature": signature(ident), "keys": json.dumps(keys),
                              "prompt_sigs": json.dumps(sigs), "pools": json.dumps(list(pools)),
                              "candidate_fallback": json.dumps(fallback)})


def store_features(run: RunDir, handle: ModelHandle, task: str,
                   items: Sequence[tuple[str, Sequence[int], Mapping[str, torch.Tensor], bool]],
                   *, facts: Mapping[str, Any] | None) -> Path:
    """Add features computed elsewhere (the harness's one pass) to the task's cache.

    The rows go where :func:`cached_features` reads them, under the same signature, so the
    probe stage finds them fresh and runs no forward for them. A row already cached under the
    same record key is replaced (a record redone after a kill is stored once); a cache made
    under another signature or without these pools is started anew.

    Args:
        run: the run directory.
        handle: the model that computed them.
        task: ``eval`` or ``gen``.
        items: per record ``(key "dataset/id", prompt token ids, {pool: [n_layers, d_model]},
            candidate fell back)``; every item has the same pools.
        facts: :func:`interp.models.loading.result_facts` (the probe stage's, :func:`stage_facts`).

    Returns:
        The cache's path.
    """
    path = features_path(run, task)
    if not items:
        return path
    pools = sorted(items[0][2])
    ident = features_ident(handle, facts)
    have, keys, sigs, fallback = read_features(path, signature(ident), pools, lambda s: None)
    new = {k for k, *_ in items}
    if have and set(have) != set(pools):  # a cache with other pools: keep only these
        have = {p: have[p] for p in pools}
    keep = [i for i, k in enumerate(keys) if k not in new]
    if have and len(keep) < len(keys):
        idx = torch.tensor(keep, dtype=torch.long)
        have = {p: t[idx] for p, t in have.items()}
        keys, sigs = [keys[i] for i in keep], [sigs[i] for i in keep]
        fallback = [k for k in fallback if k not in new]
    for p in pools:
        rows = torch.stack([f[p] for _, _, f, _ in items]).float()
        have[p] = torch.cat([have[p], rows]) if p in have and keys else rows
    keys += [k for k, *_ in items]
    sigs += [signature(list(ids)) for _, ids, _, _ in items]
    fallback += [k for k, _, _, fb in items if fb]
    write_features(path, have, ident, keys, sigs, pools, fallback)
    return path


def _has_rows(path: Path) -> bool:
    with safe_open(str(path), "pt") as f:
        return "rows.gen" in f.keys()


def _record_one(run: RunDir, handle: ModelHandle, rec: Record, prompts: Mapping[str, Any],
                cfg: Any, act_layers: list[int], sigs: tuple[str, str]) -> None:
    """Step 2 for one record: record both prompts and save masses (and rows, activations).

    The recording is labelled with ``cfg.backend`` as written (``eager``: the ``hf`` backend
    under eager attention), so a check recording is never taken for an exact one.
    """
    backend, attn = attention_backend(cfg.backend, StageError.of("attention"))
    rows: dict[str, torch.Tensor] = {}
    acts: dict[str, torch.Tensor] = {}
    for task, p in prompts.items():
        got = record_rows(handle, p.input_ids, backend=backend, attn=attn,
                          act_layers=act_layers, patterns=cfg.save_patterns)
        rows[task] = got.rows
        acts.update({f"{task}.{k}": v for k, v in got.acts.items()})
    if acts:
        spans = span_names([lab for p in prompts.values() for lab in p.labels])
        save_tensors(activations_path(run, rec), acts,
                     {**recording_meta(handle, rec, prompts, spans, cfg.backend),
                      "layers": json.dumps(act_layers), "signature": sigs[1]})
    save_recording(run, handle, rec, prompts, rows, backend=cfg.backend, sig=sigs[0],
                   save_rows=cfg.save_rows)


def _recorded_by(path: Path) -> str | None:
    with safe_open(str(path), "pt") as f:
        return (f.metadata() or {}).get("backend")


def record_attention(run: RunDir, handle: ModelHandle, cfg: Any, *, overwrite: bool = False,
                     log: Callable[[str], None] = print) -> int:
    """Record the attention of every selected record whose recording is stale.

    Steps 1-2 of :mod:`interp.stages.attention` (its ``record``); the audit stage calls it
    too, so a recording is made by one recorder whichever stage asks for it.

    Args:
        run: a finished asymmetry run directory.
        handle: the run's model.
        cfg: the attention stage's settings (:class:`interp.stages.attention.AttentionConfig`:
            ``limit``, ``band``, ``backend``, ``save_rows``, ``save_resid``,
            ``save_patterns``, ``recompute``, ``progress``).
        overwrite: redo recordings made under other result-relevant runtime facts (else
            they are refused).
        log: where progress lines go.

    Returns:
        Number of records recorded now (fresh recordings are kept: resume; with
        ``cfg.recompute`` every selected record is recorded again).

    Raises:
        RunDirError: no manifest / records, no ok record, another model than the run's, a
            record whose prompts do not match it (names the record), or recordings computed
            under other runtime facts and not ``overwrite``.
        interp.core.errors.LayerSpecError: ``layers`` or ``save_resid`` outside the model.
        interp.core.errors.ConfigError: the run was judged by a reasoning template
            (:func:`interp.stages.common.refuse_reasoning_judge`).
    """
    manifest, records = ok_records(run, handle, cfg.limit, stage=_ATTENTION.name)
    parse_layers(cfg.band, handle.n_layers)
    act_layers = parse_layers(cfg.save_resid, handle.n_layers) if cfg.save_resid else []
    tpath = manifest.get("config", {}).get("templates_path")
    facts = stage_facts(run, handle, _ATTENTION.name, overwrite=overwrite)
    todo = []
    for rec in records:
        prompts = record_prompts(rec, handle.tokenizer, templates_path=tpath)
        sig = recording_signature(handle, facts, {t: p.input_ids for t, p in prompts.items()})
        act_sig = signature({"record": sig, "layers": act_layers, "patterns": cfg.save_patterns})
        path = rows_path(run, rec)
        fresh = not cfg.recompute and is_fresh(path, sig) and (
            _recorded_by(path) == cfg.backend) and (not cfg.save_rows or _has_rows(path)) and (
            not act_layers or is_fresh(activations_path(run, rec), act_sig))
        if not fresh:
            todo.append((rec, prompts, (sig, act_sig)))
    log(f"[attention] {len(records)} records, {len(records) - len(todo)} already recorded "
        f"(by this backend, e.g. in the harness's one pass), {len(todo)} to record with "
        f"backend {cfg.backend}")
    bar = tqdm(todo, desc="attention", unit="rec", disable=not todo or not cfg.progress)
    for rec, prompts, sigs in bar:
        _record_one(run, handle, rec, prompts, cfg, act_layers, sigs)
    return len(todo)


def store_one_pass(run: RunDir, handle: ModelHandle, records: Sequence[Record],
                   capture: Capture, facts: Mapping[str, Any] | None) -> int:
    """Write what the harness recorded in its one pass where the stages read it.

    The writers are the stages' own (:func:`save_recording` and :func:`store_features`),
    under the stages' signatures; the asymmetry harness and the audit of a judged file call
    it.

    Args:
        run: the run directory.
        handle: the model.
        records: the records of the chunk (``template`` set), in the order given to
            :func:`interp.methods.asymmetry.evaluate_examples`.
        capture: what it recorded.
        facts: the stages' result facts (:func:`interp.stages.common.stage_facts`).

    Returns:
        Records written.
    """
    feats: dict[str, list] = {"gen": [], "eval": []}
    for k, got in sorted(capture.got.items()):
        rec = records[k]
        prompts = {t: rp for t, (rp, _) in got.items()}
        sig = recording_signature(
            handle, facts or {}, {t: p.input_ids for t, p in prompts.items()})
        save_recording(run, handle, rec, prompts,
                                       {t: ps.rows for t, (_, ps) in got.items()},
                                       backend="hf", sig=sig)
        for t, (rp, ps) in got.items():
            feats[t].append(("/".join(qa_key(rec)), rp.input_ids, ps.pooled, ps.fell_back))
    for t, items in feats.items():
        store_features(run, handle, t, items, facts=facts)
    return len(capture.got)


def _record_key(rec: Record | Mapping[str, Any]) -> str:
    return "/".join(qa_key(rec))


def cached_features(run: RunDir, handle: ModelHandle, records: Sequence[Record], task: str, *,
                    pools: Sequence[str] = POOLS, batch_size: int = 4,
                    templates_path: str | None = None, chunk: int = 32,
                    facts: Mapping[str, Any] | None = None, recompute: bool = False,
                    log: Callable[[str], None] = print) -> tuple[dict[str, np.ndarray], dict]:
    """Features of ``records`` for ``task``, read from / appended to the run's cache (step 2).

    The cache's signature covers the model (spec, sha256), hook point, depth, version and the
    result-relevant runtime facts; each cached row also stores the signature of its prompt's
    token ids, and a row whose record now renders to other token ids (same record id, e.g.
    after ``interp asymmetry --overwrite`` with another template) is recomputed. The harness
    fills this cache in its one pass (:func:`store_features`), so after it no forward runs.

    Args:
        run: the run directory.
        handle: the model that made the records.
        records: ``ok`` records.
        task: ``eval`` or ``gen``.
        pools: pools wanted (a cache missing one is recomputed).
        batch_size: prompts per forward.
        templates_path: the run's template file.
        chunk: records per cache write.
        facts: :func:`interp.models.loading.result_facts` of this call (None: not keyed on them).
        recompute: ignore the cache and compute every record's features again.
        log: progress lines.

    Returns:
        ``({pool: [n_records, n_layers, d_model] float32 array in records' order}, info)`` with
        ``info = {"candidate_fallback": [record keys], "n_computed": int, "signature": str}``
        (``signature``: of the cache and of every record's prompt, in order).

    Raises:
        interp.core.errors.RunDirError: a record whose re-rendered prompt does not match it.
    """
    pools = task_pools(task, pools)
    path = features_path(run, task)
    ident = features_ident(handle, facts)
    sig = signature(ident)
    prompts = {_record_key(r): rerender(r, task, handle.tokenizer, templates_path=templates_path)
               for r in records}
    now = {k: signature(p.input_ids) for k, p in prompts.items()}
    cache = ({}, [], [], []) if recompute else read_features(path, sig, pools, log)
    have, keys, sigs, fallback = drop_stale_features(*cache, now=now)
    known = set(keys)
    todo = [r for r in records if _record_key(r) not in known]
    if todo:
        log(f"[probe] {task} prompt: {len(records) - len(todo)} records cached, "
            f"{len(todo)} to extract")
    all_pools = sorted(set(pools) | set(have)) if have else list(pools)
    t0 = time.perf_counter()
    for s in range(0, len(todo), chunk):
        part = todo[s:s + chunk]
        try:
            feats, fell = extract_features(handle, [prompts[_record_key(r)] for r in part],
                                           pools=all_pools, batch_size=batch_size)
        except Interrupted as exc:  # keep the features of the chunk's finished batches
            idx, feats, fell = exc.done
            if idx:
                part = [part[i] for i in idx]
                _append(have, keys, sigs, fallback, feats, fell, part, now, all_pools)
                write_features(path, have, ident, keys, sigs, all_pools, fallback)
            raise
        _append(have, keys, sigs, fallback, feats, fell, part, now, all_pools)
        write_features(path, have, ident, keys, sigs, all_pools, fallback)
        log(f"[probe] {task}: {len(keys)} / {len(records)} records "
            f"({time.perf_counter() - t0:.0f} s)")
    pos = {k: i for i, k in enumerate(keys)}
    idx = [pos[_record_key(r)] for r in records]
    out = {p: have[p][idx].numpy() for p in pools}
    want = {_record_key(r) for r in records}
    return out, {"candidate_fallback": [k for k in fallback if k in want],
                 "n_computed": len(todo),
                 "signature": signature({"cache": sig,
                                         "prompts": [now[_record_key(r)] for r in records],
                                         "pools": list(pools)})}


def _append(have: dict[str, torch.Tensor], keys: list[Any], sigs: list[Any],
            fallback: list[Any], feats: Mapping[str, torch.Tensor], fell: Sequence[bool],
            part: Sequence[Record], now: Mapping[Any, Any], pools: Sequence[str]) -> None:
    """Add the features of ``part`` (in its order) to the cache's rows, in place."""
    for p in pools:
        have[p] = torch.cat([have[p], feats[p]]) if p in have and len(keys) else feats[p]
    keys += [_record_key(r) for r in part]
    sigs += [now[_record_key(r)] for r in part]
    fallback += [_record_key(r) for r, fb in zip(part, fell) if fb]
