"""Study 2 stage: attention recordings, span-mass tables, summary, heads and figures of a run.

Algorithm of :func:`run` (the method is :mod:`interp.attention`):

1. Records: the run's ``ok`` records, the first ``limit`` of each dataset
   (:func:`interp.store.records.limit_per_dataset`). The model must be the run's (sha256 check).
2. Record (:func:`record`): for each record, re-render both prompts
   (:func:`interp.prompts.record_prompts`), and unless its recording is fresh, run
   :func:`interp.hooks.recorder.record_rows` once per prompt and save the span masses
   ``mass.{gen,eval}`` ``[n_layers, n_heads, n_spans]`` (and with ``save_rows`` the rows
   ``rows.{task}`` ``[n_layers, n_heads, pos]``) to ``DIR/attention/records/<dataset>/<id>
   .safetensors``. A recording is fresh when its stored signature
   (:func:`interp.store.io.signature` of the model and its sha256, the prompts' token ids and the
   result-relevant runtime facts, :func:`interp.stages.common.stage_facts`) equals the one of
   now: an interrupted run resumes, and a recording made by another model, from other prompts
   (``interp asymmetry --overwrite`` with another template keeps the record ids) or under
   other settings is redone (other settings only with ``overwrite``, else refused). It is
   also redone when another backend made it (``--backend eager`` is a check of the ``hf``
   recordings, so it records again) or with ``recompute``. The asymmetry harness writes these
   recordings itself in its one pass (``one_pass``, :mod:`interp.stages.asymmetry`, with the
   ``hf`` backend and the same signature), so after it this step runs no model forward.
   With ``save_resid`` the activations of those layers go to ``DIR/activations/<dataset>/<id>
   .safetensors`` (``{task}.resid_pre``, ``resid_post``, ``z``, ``result_last``, with
   ``save_patterns`` ``pattern``; shapes in :mod:`interp.hooks.recorder`).
3. Tables (:func:`write_tables`, no model): ``DIR/attention/span_mass.parquet``,
   ``summary.json`` (:func:`interp.attention.summarize` over the band ``layers``),
   ``heads.json`` (:func:`interp.attention.top_heads`) and the figures.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from interp.attention import (
    SPANS,
    TASKS,
    format_summary,
    span_mass,
    span_mass_table,
    span_names,
    summarize,
    top_heads,
)
from interp.errors import AttentionError, RunDirError
from interp.hooks.recorder import BACKENDS, record_rows
from interp.inputs import config_from_table
from interp.layers import DEFAULT_BAND, parse_layers
from interp.models import ModelHandle
from interp.plots import attention as attention_plots
from interp.progress import tqdm
from interp.prompts import record_prompts
from interp.stages.common import ok_records, stage_facts
from interp.store.io import (
    is_fresh,
    read_json,
    safe_name,
    save_tensors,
    signature,
    write_json,
    write_table,
)
from interp.store.records import Record, limit_per_dataset
from interp.store.rundir import RunDir

__all__ = ["NAME", "SUMMARIES", "AttentionConfig", "Config", "activations_path",
           "format_summary", "load_masses", "read_summary", "record", "rows_path",
           "qa_record_signature", "recording_signature", "run", "save_recording",
           "write_tables"]

NAME = "attention"
SUMMARIES = {"attention/summary.json": "attention_summary.json"}
"""Run-dir tables that ``interp run`` copies next to the figures (source -> name)."""
RECORDING_VERSION = "1"
"""Part of every recording's signature: bump it when what a recording holds changes."""


@dataclass
class AttentionConfig:
    """Settings of the attention stage (``[attention]`` table of a config).

    Attributes:
        backend: one of :data:`interp.hooks.recorder.BACKENDS` (``hf`` default).
        layers: band for the summary and head ranking (:func:`interp.layers.parse_layers`:
            ``last8``, ``24-31``, ``all``).
        limit: records per dataset (first N ok records; None for all).
        save_rows: keep every record's rows ``[n_layers, n_heads, pos]``.
        save_resid: layer spec whose residual streams / head outputs to save (None: none).
        save_patterns: with ``save_resid``, also save full patterns of those layers.
        n_boot: bootstrap resamples for CIs.
        seed: seed of the bootstrap resamples.
        figures: draw the figures into ``DIR/figures``.
        top: heads listed per ranking in ``DIR/attention/heads.json``.
        recompute: record every selected record again, even when a fresh recording exists
            (e.g. the one the harness made in its one pass).
    """

    backend: str = "hf"
    layers: str = DEFAULT_BAND
    limit: int | None = None
    save_rows: bool = False
    save_resid: str | None = None
    save_patterns: bool = False
    n_boot: int = 1000
    seed: int = 0
    figures: bool = True
    top: int = 10
    recompute: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise AttentionError(f"unknown backend {self.backend!r}; use one of "
                                 f"{list(BACKENDS)}")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> AttentionConfig:
        """Build from a config table.

        Raises:
            interp.errors.ConfigError: unknown keys (the message lists the known ones).
            AttentionError: an unknown backend.
        """
        return config_from_table(cls, d, NAME)


Config = AttentionConfig


def rows_path(run: RunDir, rec: Record | Mapping[str, Any]) -> Path:
    """``DIR/attention/records/<dataset>/<id>.safetensors`` of a record."""
    folder = run.path / "attention" / "records" / safe_name(rec["dataset"])
    return folder / f"{safe_name(rec['id'])}.safetensors"


def activations_path(run: RunDir, rec: Record | Mapping[str, Any]) -> Path:
    """``DIR/activations/<dataset>/<id>.safetensors`` of a record."""
    folder = run.path / "activations" / safe_name(rec["dataset"])
    return folder / f"{safe_name(rec['id'])}.safetensors"


def qa_record_signature(rec: Record | Mapping[str, Any]) -> str:
    """Signature of what a record's prompts are made from (no model needed to compute it).

    Stored with each recording, so that tables built from recordings without a model
    (:func:`load_masses`) refuse a recording of an older version of the record (same id, other
    template or answer, e.g. after ``interp asymmetry --overwrite`` with another template).
    """
    return signature({k: rec.get(k) for k in ("template", "question", "context", "answer",
                                              "answers", "prompts")})


def _has_rows(path: Path) -> bool:
    with safe_open(str(path), "pt") as f:
        return "rows.gen" in f.keys()


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

    The one writer of recordings: the stage (:func:`record`) and the harness's one-pass
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
                        {**_meta(handle, rec, prompts, spans, backend), "signature": sig})


def _meta(handle: ModelHandle, rec: Record | Mapping[str, Any], prompts: Mapping[str, Any],
          spans: Sequence[str], backend: str) -> dict[str, str]:
    return {"id": str(rec["id"]), "dataset": rec["dataset"], "spans": json.dumps(spans),
            "record": qa_record_signature(rec), "backend": backend,
            "n_layers": str(handle.n_layers), "n_heads": str(handle.n_heads),
            "n_tokens": json.dumps({t: len(p) for t, p in prompts.items()})}


def _record_one(run: RunDir, handle: ModelHandle, rec: Record, prompts: Mapping[str, Any],
                cfg: AttentionConfig, act_layers: list[int], sigs: tuple[str, str]) -> None:
    """Step 2 for one record: record both prompts and save masses (and rows, activations)."""
    rows: dict[str, torch.Tensor] = {}
    acts: dict[str, torch.Tensor] = {}
    for task, p in prompts.items():
        got = record_rows(handle, p.input_ids, backend=cfg.backend, act_layers=act_layers,
                          patterns=cfg.save_patterns)
        rows[task] = got.rows
        acts.update({f"{task}.{k}": v for k, v in got.acts.items()})
    if acts:
        spans = span_names([lab for p in prompts.values() for lab in p.labels])
        save_tensors(activations_path(run, rec), acts,
                     {**_meta(handle, rec, prompts, spans, cfg.backend),
                      "layers": json.dumps(act_layers), "signature": sigs[1]})
    save_recording(run, handle, rec, prompts, rows, backend=cfg.backend, sig=sigs[0],
                   save_rows=cfg.save_rows)


def _recorded_by(path: Path) -> str | None:
    with safe_open(str(path), "pt") as f:
        return (f.metadata() or {}).get("backend")


def record(run: RunDir, handle: ModelHandle, cfg: AttentionConfig | None = None, *,
           overwrite: bool = False, log: Callable[[str], None] = print) -> int:
    """Steps 1-2 of the module algorithm for every selected record whose recording is stale.

    Args:
        run: a finished asymmetry run directory.
        handle: the run's model.
        cfg: settings (default :class:`AttentionConfig`).
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
        interp.errors.LayerSpecError: ``layers`` or ``save_resid`` outside the model.
    """
    cfg = cfg or AttentionConfig()
    manifest, records = ok_records(run, handle, cfg.limit)
    parse_layers(cfg.layers, handle.n_layers)
    act_layers = parse_layers(cfg.save_resid, handle.n_layers) if cfg.save_resid else []
    tpath = manifest.get("config", {}).get("templates_path")
    facts = stage_facts(run, handle, NAME, overwrite=overwrite)
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
    for rec, prompts, sigs in tqdm(todo, desc="attention", unit="rec", disable=not todo):
        _record_one(run, handle, rec, prompts, cfg, act_layers, sigs)
    return len(todo)


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
            per.append((s, {t: f.get_tensor(f"mass.{t}").numpy() for t in TASKS}))
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


def write_tables(run: RunDir, cfg: AttentionConfig | None = None, *,
                 n_layers: int | None = None) -> dict[str, Any]:
    """Step 3: span_mass.parquet, summary.json, heads.json and figures from recordings.

    Raises:
        RunDirError: nothing recorded yet.
        interp.errors.LayerSpecError: the band lies outside the recorded layers.
    """
    cfg = cfg or AttentionConfig()
    records, mass, spans, backends = load_masses(run, limit=cfg.limit)
    band = parse_layers(cfg.layers, n_layers or mass["gen"].shape[1])
    out = run.sub("attention")
    write_table(span_mass_table(records, mass, spans), out / "span_mass.parquet", csv=False)
    summary = summarize(records, mass, spans, band, n_boot=cfg.n_boot, seed=cfg.seed)
    summary.update(layers_spec=cfg.layers, backends=backends,
                   model=run.manifest().get("model", {}).get("spec"))
    write_json(out / "summary.json", summary)
    heads = {"band": band, "overall": top_heads(summary, top=cfg.top),
             "per_dataset": {d: top_heads(summary, dataset=d, top=cfg.top)
                             for d in summary["per_dataset"]}}
    write_json(out / "heads.json", heads)
    if cfg.figures:
        figs = run.sub("figures")
        attention_plots.plot_span_mass_layerwise(summary, figs)
        attention_plots.plot_head_context_heatmaps(summary, figs)
        attention_plots.plot_context_ratio(summary, figs)
    return summary


def read_summary(run: RunDir) -> dict[str, Any]:
    """``DIR/attention/summary.json``.

    Raises:
        RunDirError: it does not exist (names the command that writes it).
    """
    path = run.path / "attention" / "summary.json"
    if not path.exists():
        run.require_run()  # a grid folder: name its runs, never advise writing into it
        raise RunDirError(f"{path} does not exist: run `interp attention --run {run.path}` first")
    return read_json(path)


def run(run: RunDir, handle: ModelHandle, cfg: AttentionConfig | None = None, *,
        overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Record every selected record of a run (resuming), then write the tables and figures.

    Args:
        run: asymmetry run directory.
        handle: the run's model (:func:`interp.stages.load_run_model`).
        cfg: settings.
        overwrite: redo recordings made under other result-relevant runtime facts.
        log: progress lines.

    Returns:
        ``summary.json``'s content.
    """
    record(run, handle, cfg, overwrite=overwrite, log=log)
    return write_tables(run, cfg, n_layers=handle.n_layers)

