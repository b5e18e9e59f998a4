"""``interp record``: full attention patterns, residual streams and head outputs on disk.

Algorithm of :func:`run` (the tensors come from :func:`interp.hooks.recorder.record_stream`):

1. Records: the run's ``ok`` records, the first ``limit`` of each dataset; the model must be
   the run's (sha256 check). Settings are checked before any forward (``what``,
   ``positions``, ``dtype``, layers against the model).
2. For each record, both prompts are re-rendered and checked against the record
   (:func:`interp.judging.prompts.record_prompts`). A record is fresh when its index part
   ``DIR/record/<dataset>/<id>/index.json`` carries the signature of now (model, prompt token
   ids, settings) and every shard it names exists with its size; fresh records are kept.
3. Otherwise its folder is emptied (the part first, so no part ever names a deleted shard;
   then old shards and temporary files a killed run left) and each prompt is recorded with ONE
   forward: the tensors of every chosen layer, in execution order -- ``blocks.L.hook_resid_pre``
   ``[n_query, d_model]``, ``blocks.L.attn.hook_pattern`` ``[n_heads, n_query, pos]``,
   ``blocks.L.attn.hook_z`` ``[n_query, n_heads, head_dim]``, ``blocks.L.hook_resid_post``
   ``[n_query, d_model]`` -- are planned into shards of at most ``shard_mb``
   (:func:`interp.store.shards.plan_shards`; ``<task>-00001-of-0000N.safetensors``) whose headers
   are written first; each tensor is cast to ``dtype`` and written to its shard the moment the
   forward produces it (:class:`interp.store.shards.TensorStreamWriter`), so peak memory does not
   grow with the number of layers. ``n_query`` rows are the ``positions``: ``all``, ``last``
   (the verdict position), or ``spans`` (positions of the labelled fields -- context,
   question, candidate, reference -- and the last). A float16 cast that overflows is refused.
4. From each full pattern (all query rows, float32, before the cast) the span-to-span masses
   :func:`interp.analysis.span_mass.span_to_span` ``[n_layers, n_heads, n_spans + 1, n_spans]`` go
   to ``span_to_span.safetensors``; then the part (signature, settings, token strings, token ids,
   span labels, token spans, the positions, and per task every tensor's shard, shape, dtype)
   is written atomically: the commit point of the record.
5. Tables (:func:`write_tables`, no model): ``DIR/record/index.json`` (settings, one entry per
   record and its part), ``DIR/record/index.parquet`` (one row per tensor: id, dataset, task,
   hook, layer, shape, dtype, shard), ``span_to_span.parquet`` (id, dataset, task, layer,
   head, query_span, key_span, mass), ``span_to_span.json``
   (:func:`interp.analysis.span_mass.summarize_span_to_span` over the band) and the figure
   ``figures/record_span_to_span.png``.

Loading: :func:`interp.store.load_activations` / :func:`interp.hooks.cache.load_cache` (an
:class:`interp.hooks.cache.ActivationCache`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file

from interp.analysis.span_mass import TASKS, query_span_names, span_names, span_to_span
from interp.analysis.span_mass import summarize_span_to_span as _summarize
from interp.core.contract import stage_of
from interp.core.errors import ConfigError, RunDirError
from interp.core.io import read_json, save_tensors, signature, write_json, write_table
from interp.core.layers import parse_layers
from interp.core.progress import tqdm
from interp.core.tokens import token_strings
from interp.hooks.recorder import PATTERN_POINT, record_stream
from interp.judging.prompts import RenderedPrompt, record_prompts
from interp.models.loading import ModelHandle
from interp.plots.record import plot_span_to_span
from interp.stages.common import ok_records
from interp.stages.configs.record import POSITIONS, RecordConfig
from interp.store.recordings import RECORDINGS_DIR, recording_index_path
from interp.store.records import Record, limit_per_dataset
from interp.store.rundir import RunDir
from interp.store.shards import TensorStreamWriter, plan_shards

__all__ = ["RecordConfig", "format_summary", "query_positions", "record", "record_prompt", "run",
           "write_tables"]

SPEC = stage_of(__name__)
"""This stage's declared contract (:data:`interp.core.contract.SPECS`)."""
RECORD_VERSION = "1"
"""Part of every record's signature: bump it when what a recording holds changes."""
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
S2S_FILE = "span_to_span.safetensors"


def query_positions(labels: Sequence[str], mode: str) -> list[int]:
    """Prompt positions kept for ``positions`` = ``mode`` (module docstring, step 3).

    Raises:
        ConfigError: an unknown mode.
    """
    n = len(labels)
    if mode == "all":
        return list(range(n))
    if mode == "last":
        return [n - 1]
    if mode == "spans":
        return [i for i, lab in enumerate(labels) if lab != "template" or i == n - 1]
    raise ConfigError(f"positions must be one of {list(POSITIONS)}, not {mode!r}")


def _plan(handle: ModelHandle, layers: Sequence[int], what: Sequence[str], n_query: int,
          n_pos: int, dtype: torch.dtype) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """Every tensor of one prompt, in the order the forward produces them."""
    d_model = int(handle.model.config.hidden_size)
    head_dim = d_model // handle.n_heads
    head_dim = int(getattr(handle.model.config, "head_dim", None) or head_dim)
    specs = []
    for x in layers:
        if "resid" in what:
            specs.append((f"blocks.{x}.hook_resid_pre", (n_query, d_model), dtype))
        if "attention" in what:
            specs.append((f"blocks.{x}.{PATTERN_POINT}", (handle.n_heads, n_query, n_pos),
                          dtype))
        if "z" in what:
            specs.append((f"blocks.{x}.attn.hook_z", (n_query, handle.n_heads, head_dim), dtype))
        if "resid" in what:
            specs.append((f"blocks.{x}.hook_resid_post", (n_query, d_model), dtype))
    return specs


class _Sink:
    """Step 3-4 for one prompt: select rows, cast, write; span-to-span from full patterns."""

    def __init__(self, writers: Mapping[str, TensorStreamWriter], positions: list[int],
                 n_pos: int, labels: Sequence[str], spans: Sequence[str], layers: Sequence[int],
                 n_heads: int, dtype: torch.dtype, where: str):
        self.writers, self.labels, self.spans, self.dtype = writers, labels, spans, dtype
        self.index = None if len(positions) == n_pos else torch.tensor(positions)
        self.layer_row = {x: i for i, x in enumerate(layers)}
        self.s2s = torch.full((len(layers), n_heads, len(spans) + 1, len(spans)), float("nan"))
        self.where = where

    def __call__(self, name: str, start: int, value: torch.Tensor) -> None:
        axis, pattern = 0, name.endswith(PATTERN_POINT)
        if pattern:
            layer = self.layer_row[int(name.split(".")[1])]
            self.s2s[layer, start:start + len(value)] = span_to_span(value, self.labels,
                                                                     self.spans)
            axis = 1
        if self.index is not None:
            value = value.index_select(axis, self.index.to(value.device))
        out = value.to(self.dtype)
        # a pattern is a softmax, in [0, 1]: no cast of it overflows, and checking would cost a
        # tenth of the streamed recording's time
        if not pattern and self.dtype != torch.float32 and not bool(
                torch.isfinite(out).all()) and bool(torch.isfinite(value).all()):
            raise RunDirError(f"{name} of {self.where} overflows {self.dtype} (max |x| = "
                              f"{float(value.abs().max()):.4g}): use --dtype bfloat16 or float32")
        self.writers[name].write(name, out, start)


def record_prompt(handle: ModelHandle, p: RenderedPrompt, cfg: RecordConfig,
                  layers: Sequence[int], spans: Sequence[str], folder: Path, task: str,
                  sig: str = "", where: str = "") -> tuple[dict[str, Any], dict[str, int],
                                                           torch.Tensor]:
    """Steps 3-4 for one prompt: one forward, its shards written into ``folder``.

    Args:
        handle: the model.
        p: the rendered prompt (token ids and span labels).
        cfg: settings (``what``, ``positions``, ``dtype``, ``shard_mb``).
        layers: the layers to record (non-negative, ascending).
        spans: key spans of the span-to-span masses.
        folder: where the shards go (``<task>-0000k-of-0000N.safetensors``).
        task: ``gen`` or ``eval`` (shard names).
        sig: signature stored in every shard's metadata.
        where: names the prompt in an overflow error.

    Returns:
        ``(tensors, shard_bytes, span_to_span)``: hook name -> ``{shard, shape, dtype}``,
        shard file -> size in bytes, and ``[n_layers, n_heads, n_spans + 1, n_spans]``
        float32 (NaN without ``attention``).

    Raises:
        RunDirError: a cast to ``dtype`` overflows (nothing of the prompt is left on disk).
    """
    dtype = DTYPES[cfg.dtype]
    positions = query_positions(p.labels, cfg.positions)
    specs = _plan(handle, layers, cfg.what, len(positions), len(p), dtype)
    shards = plan_shards(specs, int(cfg.shard_mb * 2**20))
    names = [f"{task}-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    writers: dict[str, TensorStreamWriter] = {}
    table: dict[str, Any] = {}
    try:
        for fname, shard in zip(names, shards):
            w = TensorStreamWriter(folder / fname, shard, {"signature": sig, "task": task})
            for name, shape, _ in shard:
                writers[name] = w
                table[name] = {"shard": fname, "shape": list(shape), "dtype": cfg.dtype}
        sink = _Sink(writers, positions, len(p), p.labels, spans, layers, handle.n_heads,
                     dtype, where)
        points = [pt for w, pts in (("resid", ("hook_resid_pre", "hook_resid_post")),
                                    ("z", ("attn.hook_z",))) if w in cfg.what for pt in pts]
        record_stream(handle, p.input_ids, sink, layers=layers,
                      patterns="attention" in cfg.what, points=points)
        sizes = {}
        for w in dict.fromkeys(writers.values()):
            sizes[w.path.name] = w.nbytes
            w.close()
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    return table, sizes, sink.s2s


def _clear(folder: Path) -> None:
    """Step 3: the part first, then every other file (old shards, temporary files)."""
    (folder / "index.json").unlink(missing_ok=True)
    if folder.exists():
        for f in folder.iterdir():
            if f.is_file():
                f.unlink()


def _is_done(part_path: Path, sig: str) -> bool:
    """Step 2: the part carries ``sig`` and every file it names exists with its size."""
    try:
        part = read_json(part_path)
    except (OSError, ValueError):
        return False
    if part.get("signature") != sig:
        return False
    files = dict(part.get("shards", {}))
    return all((part_path.parent / f).is_file() and (part_path.parent / f).stat().st_size == b
               for f, b in files.items())


def _record_one(run: RunDir, handle: ModelHandle, rec: Record,
                prompts: Mapping[str, RenderedPrompt], cfg: RecordConfig, layers: list[int],
                sig: str) -> None:
    """Steps 3-4 for one record."""
    part_path = recording_index_path(run, rec["dataset"], rec["id"])
    folder = part_path.parent
    _clear(folder)
    folder.mkdir(parents=True, exist_ok=True)
    spans = span_names([lab for p in prompts.values() for lab in p.labels])
    part: dict[str, Any] = {
        "signature": sig, "id": str(rec["id"]), "dataset": rec["dataset"],
        "settings": cfg.settings(layers), "layers": layers, "n_layers": handle.n_layers,
        "n_heads": handle.n_heads, "tasks": {}, "tensors": {}, "shards": {}}
    s2s = {}
    for task, p in prompts.items():
        where = f"{rec['dataset']}/{rec['id']} ({task})"
        table, sizes, s2s[task] = record_prompt(handle, p, cfg, layers, spans, folder, task,
                                                sig, where)
        part["tensors"][task] = table
        part["shards"].update(sizes)
        part["tasks"][task] = {
            "n_tokens": len(p), "token_ids": list(map(int, p.input_ids)),
            "tokens": token_strings(handle.tokenizer, p.input_ids), "labels": list(p.labels),
            "token_spans": {k: list(v) for k, v in p.token_spans.items()},
            "positions": query_positions(p.labels, cfg.positions)}
    if "attention" in cfg.what:
        path = save_tensors(folder / S2S_FILE, s2s, {"signature": sig})
        part["shards"][S2S_FILE] = path.stat().st_size
        part["span_to_span"] = {"file": S2S_FILE, "query_spans": query_span_names(spans),
                                "key_spans": spans, "layers": layers}
    write_json(part_path, part)


def record(run: RunDir, handle: ModelHandle, cfg: RecordConfig | None = None, *,
           overwrite: bool = False, log: Callable[[str], None] = print) -> int:
    """Steps 1-4 of the module algorithm for every selected record that is not fresh.

    Args:
        run: a finished asymmetry run directory.
        handle: the run's model.
        cfg: settings (default :class:`RecordConfig`).
        overwrite: as :func:`run` (the stage contract's ``parts_only`` signature): a part is
            redone whenever its signature differs.
        log: where progress lines go.

    Returns:
        Number of records recorded now.

    Raises:
        RunDirError: no manifest / ok records, another model than the run's, a record whose
            prompts do not match it (names the record), a float16 overflow.
        interp.core.errors.LayerSpecError: ``layers`` or ``band`` outside the model.
    """
    cfg = cfg or RecordConfig()
    manifest, records = ok_records(run, handle, cfg.limit, stage=SPEC.name)
    layers = parse_layers(cfg.layers, handle.n_layers)
    parse_layers(cfg.band, handle.n_layers)  # a bad band fails before the slow work
    tpath = manifest.get("config", {}).get("templates_path")
    model_id = {"spec": handle.spec, "sha256": handle.info.get("sha256"), "v": RECORD_VERSION}
    todo = []
    for rec in records:
        prompts = record_prompts(rec, handle.tokenizer, templates_path=tpath)
        sig = signature({**model_id, "settings": cfg.settings(layers),
                         "ids": {t: p.input_ids for t, p in prompts.items()}})
        if not _is_done(recording_index_path(run, rec["dataset"], rec["id"]), sig):
            todo.append((rec, prompts, sig))
    log(f"[record] {len(records)} records, {len(records) - len(todo)} already recorded; "
        f"{','.join(cfg.what)} at {len(layers)} layers, positions {cfg.positions}, {cfg.dtype}")
    for rec, prompts, sig in tqdm(todo, desc="record", unit="rec", disable=not todo):
        _record_one(run, handle, rec, prompts, cfg, layers, sig)
    return len(todo)


def _parts(run: RunDir, cfg: RecordConfig) -> list[tuple[Record, dict[str, Any]]]:
    """The selected records that have a part, with their parts."""
    out = []
    for rec in limit_per_dataset(run.read_records(), cfg.limit):
        path = recording_index_path(run, rec["dataset"], rec["id"])
        if path.exists():
            out.append((rec, read_json(path)))
    if not out:
        run.require_run()
        raise RunDirError(f"{run.path} has no recordings: run `interp record --run {run.path}` "
                          f"first")
    return out


def _index_rows(part: Mapping[str, Any], rel: str) -> list[dict[str, Any]]:
    return [{"id": part["id"], "dataset": part["dataset"], "task": task, "hook": name,
             "layer": int(name.split(".")[1]), "shape": "x".join(map(str, t["shape"])),
             "dtype": t["dtype"], "shard": f"{rel}/{t['shard']}",
             "n_tokens": part["tasks"][task]["n_tokens"]}
            for task, table in part["tensors"].items() for name, t in table.items()]


def _s2s_rows(part: Mapping[str, Any], s2s: Mapping[str, torch.Tensor]) -> pd.DataFrame:
    info = part["span_to_span"]
    frames = []
    for task in TASKS:
        m = s2s[task].numpy()
        idx = np.indices(m.shape).reshape(4, -1)  # layer, head, query span, key span
        frames.append(pd.DataFrame({
            "id": part["id"], "dataset": part["dataset"], "task": task,
            "layer": np.asarray(info["layers"], dtype=np.int16)[idx[0]],
            "head": idx[1].astype(np.int16),
            "query_span": np.asarray(info["query_spans"])[idx[2]],
            "key_span": np.asarray(info["key_spans"])[idx[3]], "mass": m.reshape(-1)}))
    return pd.concat(frames, ignore_index=True)


def write_tables(run: RunDir, cfg: RecordConfig | None = None, *,
                 n_layers: int | None = None) -> dict[str, Any]:
    """Step 5: index, span-to-span tables and figure from the recorded parts (no model).

    Raises:
        RunDirError: nothing recorded yet.
    """
    cfg = cfg or RecordConfig()
    parts = _parts(run, cfg)
    out = run.sub(RECORDINGS_DIR)
    rows, frames, s2s_recs, s2s = [], [], [], {t: [] for t in TASKS}
    total = 0
    for rec, part in parts:
        folder = recording_index_path(run, rec["dataset"], rec["id"]).parent
        rel = folder.relative_to(out).as_posix()
        rows += _index_rows(part, rel)
        total += sum(part["shards"].values()) + (folder / "index.json").stat().st_size
        if "span_to_span" in part:
            got = load_file(str(folder / S2S_FILE))  # NaN by design: a span with no keys
            frames.append(_s2s_rows(part, got))
            s2s_recs.append((rec, part))
            for t in TASKS:
                s2s[t].append(got[t].numpy())
    write_json(out / "index.json", {
        "settings": parts[-1][1]["settings"], "n_records": len(parts),
        "records": [{"id": p["id"], "dataset": p["dataset"],
                     "part": recording_index_path(run, p["dataset"], p["id"]).relative_to(out)
                     .as_posix()} for _, p in parts]})
    write_table(pd.DataFrame(rows), out / "index.parquet", csv=False)
    summary: dict[str, Any] = {"n_records": len(parts), "bytes": total,
                               "bytes_per_record": total / len(parts),
                               "settings": parts[-1][1]["settings"], "span_to_span": None}
    if s2s_recs:
        summary["span_to_span"] = _s2s_summary(run, cfg, s2s_recs, s2s, frames, n_layers)
    write_json(out / "summary.json", summary)
    return summary


def _s2s_summary(run: RunDir, cfg: RecordConfig, recs: list[tuple[Record, dict[str, Any]]],
                 s2s: Mapping[str, list[np.ndarray]], frames: list[pd.DataFrame],
                 n_layers: int | None) -> dict[str, Any]:
    """Step 5: span_to_span.parquet, .json and the figure."""
    out = run.sub(RECORDINGS_DIR)
    write_table(pd.concat(frames, ignore_index=True), out / "span_to_span.parquet", csv=False)
    first = recs[0][1]["span_to_span"]
    layers, spans = first["layers"], first["key_spans"]
    if any((p["span_to_span"]["layers"], p["span_to_span"]["key_spans"]) != (layers, spans)
           for _, p in recs):
        raise RunDirError(f"{out}: records were recorded at different layers or with other "
                          f"spans (templates); re-run `interp record` with one --layers")
    aligned = {t: np.stack(s2s[t]) for t in TASKS}
    band = parse_layers(cfg.band, n_layers or recs[0][1]["n_layers"])
    summary = _summarize([r for r, _ in recs], aligned, layers, band, spans)
    summary["model"] = run.manifest().get("model", {}).get("spec")
    write_json(out / "span_to_span.json", summary)
    if cfg.figures:
        plot_span_to_span(summary, run.sub("figures"))
    return summary


def format_summary(summary: Mapping[str, Any]) -> str:
    """Bytes per record and the band's span-to-span matrices (overall) as text."""
    lines = [f"{summary['n_records']} records recorded, {summary['bytes'] / 2**20:.1f} MiB "
             f"({summary['bytes_per_record'] / 2**20:.2f} MiB per record); settings "
             f"{json.dumps(summary['settings'])}"]
    s = summary.get("span_to_span")
    if s:
        g = s["overall"]
        lines.append(f"span-to-span attention, band layers {s['band'][0]}-{s['band'][-1]}, mean "
                     f"over heads (n={g['n']}, {g['n_passages']} passages); rows: query span, "
                     f"columns: key span")
        for t in TASKS:
            lines.append(f"  {t:<10}" + "".join(f"{k:>10}" for k in s["key_spans"]))
            for q, row in zip(s["query_spans"], g[t]["mean"]):
                cells = "".join(f"{'-' if v is None or math.isnan(v) else f'{v:.3f}':>10}"
                                for v in row)
                lines.append(f"  {q:<10}{cells}")
    return "\n".join(lines)


def run(run_dir: RunDir, handle: ModelHandle, cfg: RecordConfig | None = None, *,
        overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Record every selected record of a run (resuming), then write the index and tables.

    Args:
        run_dir: asymmetry run directory.
        handle: the run's model (:func:`interp.stages.load_run_model`).
        cfg: settings.
        overwrite: accepted as every stage's ``run`` is (``interp run --overwrite``); a recorded
            part is redone whenever its signature differs, so there is nothing to refuse.
        log: progress lines.

    Returns:
        ``DIR/record/summary.json``'s content: ``n_records``, ``bytes``, ``bytes_per_record``,
        ``settings`` and ``span_to_span`` (``span_to_span.json``, or None without attention).
    """
    cfg = cfg or RecordConfig()
    record(run_dir, handle, cfg, log=log)
    return write_tables(run_dir, cfg, n_layers=handle.n_layers)
