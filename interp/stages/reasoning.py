"""Reasoning-judge stage: a judge-only rerun of a run's answers, side by side with its judge.

Algorithm of :func:`run` (the method: :mod:`interp.judging.reasoning`,
:mod:`interp.methods.reasoning_compare`):

1. Records: the run's ``ok`` records (first ``limit`` per dataset), made by a one-word judge
   (the run's template has ``judge = "word"``), and their verdict-position span masses from
   the run's attention recordings (:func:`interp.stages.stored.load_masses`: the harness
   writes them in its one pass, or ``interp attention``).
2. Judge-only rerun (:func:`interp.methods.asymmetry.judge_records`): the run's model judges the
SAME
   candidate answers with the reasoning template, in chunks of ``batch_size``; each chunk's
   records go to ``DIR/reasoning/records.jsonl`` (with ``judge_signature``: model, sha256,
   template, budget, the record's answer and prompt) and their span masses (``mass.verdict``
   and ``mass.reasoning``, ``[n_layers, n_heads, n_spans]``, spans in the metadata) to
   ``DIR/reasoning/attention/<dataset>/<id>.safetensors`` (the parts the stage contract
   declares, :data:`interp.core.contract.SPECS`). A record whose signature matches is kept
   (resume) unless its stored reply, read by the verdict rule of now
   (:func:`interp.judging.reasoning.parse_final_verdict`), gives another verdict or another split
   of its reasoning (a record judged under an earlier rule); others are judged again.
3. Side by side (:func:`interp.methods.reasoning_compare.side_by_side` over the band ``layers``):
   ``DIR/reasoning/side_by_side.json`` and ``.md``, and the figure
   ``DIR/figures/reasoning_side_by_side.png``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from safetensors import safe_open

from interp.core.contract import stage_of
from interp.core.errors import ConfigError
from interp.core.io import atomic_write_text, finite, save_tensors, signature, write_json
from interp.core.layers import parse_layers
from interp.core.progress import tqdm
from interp.judging.prompts import get_template
from interp.judging.reasoning import REASONING_SPANS, parse_final_verdict
from interp.methods.asymmetry import judge_records
from interp.methods.reasoning_compare import format_side_by_side, side_by_side
from interp.models.loading import ModelHandle
from interp.stages.common import ok_records
from interp.stages.configs.reasoning import ReasoningConfig
from interp.stages.stored import load_masses
from interp.store import RunDir
from interp.store.records import qa_key as record_key

__all__ = ["SPEC", "ReasoningConfig", "format_summary", "run"]

SPEC = stage_of(__name__)
"""This stage's declared contract (:data:`interp.core.contract.SPECS`)."""


def _mass_path(rd: RunDir, rec: Mapping[str, Any]) -> Any:
    """``DIR/reasoning/attention/<dataset>/<id>.safetensors`` (the contract's part)."""
    return SPEC.parts[1].path(rd.path, rec["dataset"], rec["id"])


def _signature(handle: ModelHandle, cfg: ReasoningConfig, rec: Mapping[str, Any]) -> str:
    return signature({"model": handle.spec, "sha256": handle.info.get("sha256"),
                      "template": cfg.template, "templates_path": cfg.templates_path,
                      "budget": cfg.max_reasoning_tokens, "answer": rec.get("answer"),
                      "question": rec.get("question"), "context": rec.get("context"),
                      "reasoning_attention": cfg.reasoning_attention})


def _reparsed(rec: Mapping[str, Any]) -> bool:
    """The stored reply reads otherwise under the verdict rule of now (verdict or split)."""
    text = rec.get("verdict_text") or ""
    fv = parse_final_verdict(text)
    start = len(text) if fv.start is None else fv.start
    return fv.verdict != rec.get("verdict") or start != len(rec.get("reasoning") or "")


def run(run_dir: RunDir, handle: ModelHandle, cfg: ReasoningConfig | None = None, *,
        overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Judge a run's answers with the reasoning judge and compare (module docstring).

    The stage contract's signature (:mod:`interp.core.contract`).

    Args:
        run_dir: a finished asymmetry run of a one-word judge, with attention recordings.
        handle: the run's model.
        cfg: settings.
        overwrite: accepted for the contract: a judgment whose signature is not the one of
            now is always judged again, nothing else is stored.
        log: progress lines.

    Returns:
        ``side_by_side.json``'s content (plus ``model`` and ``band``).

    Raises:
        interp.core.errors.ConfigError: the template is not a reasoning judge, or the run's is not
            a one-word judge (before any model forward).
        interp.core.errors.RunDirError: no ok record, another model than the run's, or no
            attention recordings (:func:`interp.stages.attention.load_masses`).
    """
    del overwrite
    rd, cfg = run_dir, cfg or ReasoningConfig()
    template = get_template(cfg.template, cfg.templates_path)
    if template.judge != "reasoning":
        raise ConfigError(f"[reasoning] template {cfg.template!r} is not a reasoning judge "
                          f"(judge = {template.judge!r}); use template = \"reasoning\"")
    manifest, records = ok_records(rd, handle, cfg.limit, stage=SPEC.name)
    band = parse_layers(cfg.band, handle.n_layers)
    recorded, mass, spans, _ = load_masses(rd, limit=cfg.limit)
    out = RunDir(rd.sub(SPEC.folder))
    done = {record_key(r): r for r in out.read_records(status=None)} \
        if out.records_path.exists() else {}

    def stale(r: Mapping[str, Any]) -> bool:
        d = done.get(record_key(r))
        return d is None or d.get("judge_signature") != _signature(handle, cfg, r) or (
            d.get("status") == "ok" and (not _mass_path(rd, r).exists() or _reparsed(d)))

    todo = [r for r in records if stale(r)]
    log(f"[reasoning] {len(records)} records, {len(records) - len(todo)} already judged")
    bar = tqdm(total=len(todo), desc="reasoning judge", unit="rec", disable=not todo)
    for s in range(0, len(todo), cfg.batch_size):
        part = todo[s:s + cfg.batch_size]
        recs, passes = judge_records(handle, part, template=template, rows=True,
                                     max_reasoning_tokens=cfg.max_reasoning_tokens,
                                     batch_size=cfg.batch_size,
                                     reasoning_attention=cfg.reasoning_attention)
        for src, rec, j in zip(part, recs, passes):
            rec["judge_signature"] = _signature(handle, cfg, src)
            if j is not None:
                tensors = {"mass.verdict": j.verdict_mass}
                if j.reasoning_mass is not None:
                    tensors["mass.reasoning"] = j.reasoning_mass
                save_tensors(_mass_path(rd, rec), tensors, {"spans": json.dumps(REASONING_SPANS)})
        if stale_keys := [record_key(r) for r in recs if record_key(r) in done]:
            out.drop_records(stale_keys)
        out.append_records(recs)
        bar.update(len(part))
    bar.close()
    reason = out.read_records(status=None)
    masses: dict[str, dict[tuple[str, str], np.ndarray]] = {"word": {}, "verdict": {},
                                                            "reasoning": {}}
    for r, m in zip(recorded, mass["eval"]):
        masses["word"][record_key(r)] = m[band].mean(axis=(0, 1))
    for r in reason:
        p = _mass_path(rd, r)
        if r.get("status") != "ok" or not p.exists():
            continue
        with safe_open(str(p), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                m = finite(f.get_tensor(name).numpy(), path=p, name=name,
                           record=f"{r['dataset']}/{r['id']}")
                masses[name.split(".")[1]][record_key(r)] = m[band].mean(axis=(0, 1))
    res = side_by_side(records, reason, masses, spans, n_boot=cfg.n_boot, seed=cfg.seed)
    res.update(model=handle.spec, band=band, max_reasoning_tokens=cfg.max_reasoning_tokens,
               template=cfg.template)
    write_json(out.path / "side_by_side.json", res)
    atomic_write_text(out.path / "side_by_side.md", format_side_by_side(res, handle.spec) + "\n")
    if cfg.figures:
        from interp.plots.reasoning import plot_reasoning_side_by_side

        plot_reasoning_side_by_side(res, rd.sub("figures"))
    return res


def format_summary(summary: Mapping[str, Any]) -> str:
    """The side by side as the markdown table of ``side_by_side.md``."""
    return format_side_by_side(summary, summary.get("model", ""))
