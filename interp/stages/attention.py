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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from interp.attention import (
    format_summary,
    span_mass_table,
    span_names,
    summarize,
    top_heads,
)
from interp.errors import AttentionError
from interp.hooks.recorder import BACKENDS, record_rows
from interp.layers import DEFAULT_BAND, parse_layers
from interp.models import ModelHandle
from interp.options import config_from_table, option
from interp.plots import attention as attention_plots
from interp.progress import tqdm
from interp.prompts import record_prompts
from interp.stages.common import ok_records, stage_facts
from interp.stages.contract import spec
from interp.stages.stored import (
    activations_path,
    load_masses,
    qa_record_signature,
    recording_meta,
    recording_signature,
    rows_path,
    save_recording,
)
from interp.stages.stored import read_attention_summary as read_summary
from interp.store.io import (
    is_fresh,
    save_tensors,
    signature,
    write_json,
    write_table,
)
from interp.store.records import Record
from interp.store.rundir import RunDir

__all__ = ["NAME", "SPEC", "SUMMARIES", "AttentionConfig", "Config", "activations_path",
           "format_summary", "load_masses", "read_summary", "record", "rows_path",
           "qa_record_signature", "recording_signature", "run", "save_recording",
           "write_tables"]

SPEC = spec("attention")
"""This stage's declared contract (:data:`interp.stages.contract.SPECS`)."""
NAME = SPEC.name
SUMMARIES = SPEC.summaries
"""Run-dir tables that ``interp run`` copies next to the figures (source -> name)."""


@dataclass
class AttentionConfig:
    """Settings of the attention stage (``[attention]`` table of a config).

    Attributes:
        backend: one of :data:`interp.hooks.recorder.BACKENDS` (``hf`` default).
        layers: band for the summary and head ranking (:func:`interp.layers.parse_layers`:
            ``last8``, ``24-31``, ``all``).
        limit: records per dataset (first N ok records; all or None: every one).
        save_rows: keep every record's rows ``[n_layers, n_heads, pos]``.
        save_resid: layer spec whose residual streams / head outputs to save (None: none).
        save_patterns: with ``save_resid``, also save full patterns of those layers.
        n_boot: bootstrap resamples for CIs.
        seed: seed of the bootstrap resamples.
        figures: draw the figures into ``DIR/figures``.
        top: heads listed per ranking in ``DIR/attention/heads.json``.
        recompute: record every selected record again, even when a fresh recording exists
            (e.g. the one the harness made in its one pass).
        progress: show a progress bar while recording.
    """

    backend: str = "hf"
    layers: str = option(DEFAULT_BAND, kind="layers")
    limit: int | None = option(None, kind="count")
    save_rows: bool = False
    save_resid: str | None = option(None, kind="layers")
    save_patterns: bool = False
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True
    top: int = option(10, kind="count")
    recompute: bool = False
    progress: bool = True

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


def _has_rows(path: Path) -> bool:
    with safe_open(str(path), "pt") as f:
        return "rows.gen" in f.keys()


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
                     {**recording_meta(handle, rec, prompts, spans, cfg.backend),
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
        interp.errors.ConfigError: the run was judged by a reasoning template
            (:func:`interp.stages.common.refuse_reasoning_judge`).
    """
    cfg = cfg or AttentionConfig()
    manifest, records = ok_records(run, handle, cfg.limit, stage=NAME)
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
    bar = tqdm(todo, desc="attention", unit="rec", disable=not todo or not cfg.progress)
    for rec, prompts, sigs in bar:
        _record_one(run, handle, rec, prompts, cfg, act_layers, sigs)
    return len(todo)


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


def run(run_dir: RunDir, handle: ModelHandle, cfg: AttentionConfig | None = None, *,
        overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Record every selected record of a run (resuming), then write the tables and figures.

    Args:
        run_dir: asymmetry run directory.
        handle: the run's model (:func:`interp.stages.load_run_model`).
        cfg: settings.
        overwrite: redo recordings made under other result-relevant runtime facts.
        log: progress lines.

    Returns:
        ``summary.json``'s content.
    """
    record(run_dir, handle, cfg, overwrite=overwrite, log=log)
    return write_tables(run_dir, cfg, n_layers=handle.n_layers)

