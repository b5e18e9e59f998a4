"""Study 2 stage: attention recordings, span-mass tables, summary, heads and figures of a run.

Algorithm of :func:`run` (the method is :mod:`interp.analysis.span_mass`):

1. Records: the run's ``ok`` records, the first ``limit`` of each dataset
   (:func:`interp.store.records.limit_per_dataset`). The model must be the run's (sha256 check).
2. Record (:func:`record`, i.e. :func:`interp.stages.stored.record_attention`): for each
   record, re-render both prompts
   (:func:`interp.judging.prompts.record_prompts`), and unless its recording is fresh, run
   :func:`interp.hooks.recorder.record_rows` once per prompt and save the span masses
   ``mass.{gen,eval}`` ``[n_layers, n_heads, n_spans]`` (and with ``save_rows`` the rows
   ``rows.{task}`` ``[n_layers, n_heads, pos]``) to ``DIR/attention/records/<dataset>/<id>
   .safetensors``. A recording is fresh when its stored signature
   (:func:`interp.core.io.signature` of the model and its sha256, the prompts' token ids and the
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
   ``summary.json`` (:func:`interp.analysis.span_mass.summarize` over the band ``layers``),
   ``heads.json`` (:func:`interp.analysis.span_mass.top_heads`) and the figures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from interp.analysis.span_mass import (
    format_summary,
    span_mass_table,
    summarize,
    top_heads,
)
from interp.core.contract import stage_of
from interp.core.io import (
    write_json,
    write_table,
)
from interp.core.layers import parse_layers
from interp.models.loading import ModelHandle
from interp.plots import attention as attention_plots
from interp.stages.configs.attention import AttentionConfig
from interp.stages.stored import (
    activations_path,
    load_masses,
    qa_record_signature,
    recording_signature,
    rows_path,
    save_recording,
)
from interp.stages.stored import read_attention_summary as read_summary
from interp.stages.stored import record_attention as record
from interp.store.rundir import RunDir

__all__ = ["SPEC", "AttentionConfig", "activations_path", "format_summary", "load_masses",
           "read_summary", "record", "rows_path", "qa_record_signature", "recording_signature",
           "run", "save_recording", "write_tables"]

SPEC = stage_of(__name__)
"""This stage's declared contract (:data:`interp.core.contract.SPECS`)."""


def write_tables(run: RunDir, cfg: AttentionConfig | None = None, *,
                 n_layers: int | None = None) -> dict[str, Any]:
    """Step 3: span_mass.parquet, summary.json, heads.json and figures from recordings.

    Raises:
        RunDirError: nothing recorded yet.
        interp.core.errors.LayerSpecError: the band lies outside the recorded layers.
    """
    cfg = cfg or AttentionConfig()
    records, mass, spans, backends = load_masses(run, limit=cfg.limit)
    band = parse_layers(cfg.band, n_layers or mass["gen"].shape[1])
    out = run.sub("attention")
    write_table(span_mass_table(records, mass, spans), out / "span_mass.parquet", csv=False)
    summary = summarize(records, mass, spans, band, n_boot=cfg.n_boot, seed=cfg.seed)
    summary.update(layers_spec=cfg.band, backends=backends,
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

