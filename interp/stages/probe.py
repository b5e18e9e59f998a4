"""Probe stage: features, sweeps, the probe-vs-judge comparison and saved probes of a run.

Algorithm of :func:`run` (the methods are :mod:`interp.methods.probing`, numbered there):

1. Records: the run's ``ok`` records (checked: unique keys, an oracle label each, made by the
   loaded model, whose sha256 is the manifest's), the first ``limit`` of each dataset
   (:func:`interp.store.records.limit_per_dataset`); labels y* and one group per passage; the CV
   folds (:func:`interp.analysis.stats.make_folds`) shared by every probe and by the verbal judge.
2. Features (:func:`cached_features`): pooled ``resid_post`` of every layer, cached in
   ``DIR/probes/features_{task}.safetensors`` (``[n_records, n_layers, d_model]`` per pool).
   The cache is fresh when its signature (model, sha256, hook point, layers, version and the
   result-relevant runtime facts, :func:`interp.stages.common.stage_facts`) equals the one of
   now and it holds the pools asked for; a cached row is reused only while its record renders
   to the same prompt token ids (their signature is stored per row); records missing from it
   are computed and appended ``chunk`` at a time (resume by record key); an interrupt appends
   the records of the running chunk whose batches finished.
3. Sweep of the layers (``layers``: :func:`interp.core.layers.parse_layers`, default all), cached in
   ``DIR/probes/sweep_{task}.json`` under the signature of the settings, records, labels,
   groups and the features' signature; the permutation null likewise in
   ``permutation_{task}.json``, and while it runs each permutation's outcome in
   ``permutation_{task}.partial.json``, so an interrupted null resumes where it stopped; the
   nested selection (the cell chosen without each test fold) in ``nested_{task}.json``.
4. ``results.json``: the best cell, the probe vs the judge on the same folds (also with the
   cell chosen by nested cross-validation: ``vs_judge.nested``), the gen-prompt
   probe, cross-dataset transfer; the best probe of each kind refitted on all records and
   saved (``probe_{task}_{kind}.npz`` + ``.json``); the figure ``DIR/figures/probes.png``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from interp.analysis.stats import fit_note, make_folds, null_level, passage_groups
from interp.core.contract import stage_of
from interp.core.errors import StageError
from interp.core.io import is_fresh, read_json, signature, write_json
from interp.core.layers import parse_layers
from interp.judging.residual_features import (
    HOOK_POINT,
    HOOK_POINT_DOC,
    task_pools,
)
from interp.methods.probing import (
    METRICS,
    best_row,
    cross_dataset_transfer,
    cross_validate,
    fit_probe,
    judge_metrics,
    nested_selection,
    paired_auc,
    permutation_null,
    probe_vs_judge,
    sweep,
)
from interp.models.loading import ModelHandle
from interp.plots.probes import plot_probes
from interp.stages.common import check_run_model, refuse_reasoning_judge, stage_facts
from interp.stages.configs.probe import ProbeConfig
from interp.stages.stored import (
    FEATURES_VERSION,
    cached_features,
    features_path,
    store_features,
)
from interp.store.records import Record, limit_per_dataset, qa_key
from interp.store.rundir import RunDir

__all__ = ["SPEC", "ProbeConfig", "cached_features", "features_path", "format_summary",
           "load_probe_records", "run", "store_features"]

SPEC = stage_of(__name__)
"""This stage's declared contract (:data:`interp.core.contract.SPECS`)."""


def _key(rec: Record | Mapping[str, Any]) -> str:
    return "/".join(qa_key(rec))


def load_probe_records(run: RunDir, handle: ModelHandle | None = None) -> list[Record]:
    """The run's ``ok`` records, checked for probing.

    Raises:
        interp.core.errors.RunDirError: no records.jsonl (names ``interp asymmetry``).
        StageError: no ok records, duplicate record keys, records without an oracle label, or
            records made by another model than ``handle``.
    """
    records = run.read_records(status="ok")
    if not records:
        raise StageError("probe",
                         f"{run.path} has no ok records: run `interp asymmetry --out {run.path}`"
                         f" first")
    keys = [_key(r) for r in records]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})[:5]
        raise StageError("probe", f"{run.path}/records.jsonl repeats records {dup}")
    if missing := [_key(r) for r in records if r.get("oracle_label") is None][:5]:
        raise StageError("probe", f"records without oracle_label (y*): {missing}")
    if handle is not None:
        models = sorted({r.get("model") for r in records})
        if models != [handle.spec]:
            raise StageError("probe", f"the records were made by {models}, the loaded model is "
                                      f"{handle.spec!r}: probe with the model that made them")
    return records


@dataclass
class _Data:
    """What every task of one probe run shares (step 1)."""

    records: list[Record]
    layers: list[int]
    y: np.ndarray
    ds: np.ndarray
    groups: np.ndarray
    folds: list[tuple[np.ndarray, np.ndarray]]
    judge: dict[str, Any]
    facts: dict[str, Any] | None = None


SWEEP_FREE = ("n_boot", "permute_within")
"""Settings left out of the sweep's signature (they change what is reported of it, not it)."""


def _sweep_cached(run: RunDir, cfg: ProbeConfig, data: _Data, task: str,
                  feats: Mapping[str, np.ndarray], features_sig: str,
                  log: Callable[[str], None]) -> tuple[list[dict[str, Any]], str]:
    """Step 3: the sweep rows of one task (reused when the cache is fresh) and its signature.

    The signature covers the settings, records, labels, groups and the features themselves
    (``features_sig``: model, hook point, runtime facts and every record's prompt token ids).
    """
    # the sweep does not depend on the permutation count; the permutation null does
    settings = {k: v for k, v in asdict(cfg).items() if k not in SWEEP_FREE}
    sig = signature({"cfg": {**settings, "permutations": None, "recompute": None, "n_jobs": None},
                     "layers": data.layers,
                     "keys": [_key(r) for r in data.records], "task": task,
                     "y": data.y.tolist(), "v": FEATURES_VERSION,
                     "groups": data.groups.tolist(), "features": features_sig})
    cache = run.sub("probes") / f"sweep_{task}.json"
    if is_fresh(cache, sig):
        log(f"[probe] {task}: sweep reused from {cache.name}")
        return read_json(cache)["rows"], sig
    rows = sweep(feats, data.y, data.layers, data.folds, probes=cfg.probes,
                 select_by=cfg.select_by, top_k=cfg.top_k, sweep_all=cfg.sweep_all,
                 fit_kw=cfg.fit_kw(), log=log, n_jobs=cfg.n_jobs)
    write_json(cache, {"signature": sig, "rows": rows})
    return rows, sig


def _permutation_cached(run: RunDir, cfg: ProbeConfig, data: _Data, task: str,
                        feats: Mapping[str, np.ndarray], rows: Sequence[Mapping[str, Any]],
                        sweep_sig: str, log: Callable[[str], None]) -> dict[str, Any]:
    cache = run.sub("probes") / f"permutation_{task}.json"
    within = {"within": cfg.permute_within} if cfg.permute_within else {}
    sig = signature({"sweep": sweep_sig, "permutations": cfg.permutations, **within})
    if is_fresh(cache, sig):
        return read_json(cache)["result"]
    # permutations finished by an interrupted call, under the same sweep (any count: the
    # first k permutations do not depend on how many follow)
    partial = cache.with_name(f"permutation_{task}.partial.json")
    part_sig = signature({"sweep": sweep_sig, **within})
    done = read_json(partial)["outcomes"] if is_fresh(partial, part_sig) else []
    if done:
        log(f"[probe] {task}: {len(done)} permutations of an interrupted null kept")
    first_best = best_row(rows, cfg.select_by, cfg.probes[0])
    result = permutation_null(
        feats, data.y, data.layers, float(first_best[cfg.select_by] or 0.0),
        n_permutations=cfg.permutations, folds=cfg.folds, seed=cfg.seed, probe=cfg.probes[0],
        select_by=cfg.select_by, fit_kw=cfg.fit_kw(), groups=data.groups, done=done,
        strata=data.ds if cfg.permute_within else None,
        on_step=lambda out: write_json(partial, {"signature": part_sig, "outcomes": out}),
        log=log, n_jobs=cfg.n_jobs)
    write_json(cache, {"signature": sig, "result": result})
    return result


def _nested_cached(run: RunDir, cfg: ProbeConfig, data: _Data, task: str,
                   feats: Mapping[str, np.ndarray], sweep_sig: str,
                   log: Callable[[str], None]) -> dict[str, Any]:
    """The probe against the judge with the cell chosen without the test fold (nested CV).

    :func:`interp.methods.probing.nested_selection` on the sweep's own outer folds, cached in
    ``DIR/probes/nested_{task}.json`` under the sweep's signature; then the paired AUCs of its
    out-of-fold scores against the judge's ``logit_diff`` (:func:`paired_auc`). The inner
    folds are ``folds``, or fewer where an outer training part has fewer passages of a class;
    with fewer than 2 possible, ``{"skipped": reason}``.
    """
    counts = [min(len(set(data.groups[tr][data.y[tr]].tolist())),
                  len(set(data.groups[tr][~data.y[tr]].tolist()))) for tr, _ in data.folds]
    inner = min(cfg.folds, *counts)
    if inner < 2:
        return {"skipped": f"an outer training part has {min(counts)} passage(s) of a class: "
                           f"too few for inner folds"}
    cache = run.sub("probes") / f"nested_{task}.json"
    sig = signature({"sweep": sweep_sig, "inner_folds": inner, "version": 1})
    if is_fresh(cache, sig):
        res = read_json(cache)["result"]
    else:
        res = nested_selection(feats, data.y, data.layers, data.folds, data.groups,
                               inner_folds=inner, seed=cfg.seed, probes=cfg.probes,
                               select_by=cfg.select_by, top_k=cfg.top_k,
                               sweep_all=cfg.sweep_all, fit_kw=cfg.fit_kw(), n_jobs=cfg.n_jobs,
                               log=log)
        res["oof"] = res["oof"].tolist()
        write_json(cache, {"signature": sig, "result": res})
    return {"chosen": res["chosen"], "n_distinct": res["n_distinct"],
            "inner_folds": res["inner_folds"],
            "note": "each outer fold's (probe, layer, pool) chosen by the sweep on that fold's "
                    "training records alone, so these AUCs are not optimistic by the selection",
            **paired_auc(np.asarray(res["oof"]), data.y, data.records, groups=data.groups,
                         n_boot=cfg.n_boot, seed=cfg.seed)}


def _run_task(run: RunDir, handle: ModelHandle, cfg: ProbeConfig, data: _Data, task: str,
              templates_path: str | None, log: Callable[[str], None]
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Steps 2-4 for one prompt (``eval`` or ``gen``): the task's results and saved weights."""
    feats, info = cached_features(run, handle, data.records, task, pools=cfg.pools,
                                  batch_size=cfg.batch_size, templates_path=templates_path,
                                  facts=data.facts, recompute=cfg.recompute, log=log)
    rows, sig = _sweep_cached(run, cfg, data, task, feats, info["signature"], log)
    best = best_row(rows, cfg.select_by)
    best_by_probe = {k: best_row(rows, cfg.select_by, k) for k in cfg.probes}
    tres: dict[str, Any] = {"pools": task_pools(task, cfg.pools), "grid": rows, "best": best,
                            "best_by_probe": best_by_probe,
                            "candidate_fallback": info["candidate_fallback"]}
    if cfg.permutations > 0:
        tres["permutation"] = _permutation_cached(run, cfg, data, task, feats, rows, sig, log)
    # probe vs judge on the same records and folds: out-of-fold predictions of the best cell
    X = feats[best["pool"]][:, best["layer"]]
    _, oof = cross_validate(X, data.y, data.folds, best["probe"], **cfg.fit_kw())
    tres["vs_judge"] = probe_vs_judge(best, oof, data.y, data.records, data.judge["folds"],
                                      groups=data.groups, n_boot=cfg.n_boot, seed=cfg.seed)
    tres["vs_judge"]["nested"] = _nested_cached(run, cfg, data, task, feats, sig, log)
    if task == "eval":
        tres["transfer"] = cross_dataset_transfer(
            X, data.y, data.ds, best["probe"], folds=cfg.folds, seed=cfg.seed,
            min_per_class=cfg.transfer_min_per_class, fit_kw=cfg.fit_kw(), groups=data.groups)
    weights = {}
    for kind, row in best_by_probe.items():  # the best cell of each kind refitted on all records
        fp = fit_probe(feats[row["pool"]][:, row["layer"]], data.y, kind, **cfg.fit_kw())
        fp.meta = {"task": task, "layer": row["layer"], "pool": row["pool"],
                   "hook_point": HOOK_POINT, "model": handle.spec,
                   "n_records": len(data.records), "cv": {m: row[m] for m in METRICS},
                   "label": "True = y* Correct"}
        npz, js = fp.save(run.sub("probes") / f"probe_{task}_{kind}")
        weights[f"{task}/{kind}"] = {"npz": str(npz.relative_to(run.path)),
                                     "json": str(js.relative_to(run.path))}
    return tres, weights


def run(run_dir: RunDir, handle: ModelHandle, cfg: ProbeConfig | None = None, *,
        overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the whole probe study on a run directory (module docstring); return results.json.

    Args:
        run_dir: an asymmetry run directory.
        handle: the model that made the records (:func:`interp.stages.load_run_model`).
        cfg: probe settings (default :class:`ProbeConfig`).
        overwrite: recompute features made under other result-relevant runtime facts (else
            they are refused, :func:`interp.stages.common.stage_facts`).
        log: progress lines.

    Returns:
        The content written to ``DIR/probes/results.json``.

    Raises:
        interp.core.errors.RunDirError: no manifest or records (names what to run first), another
            model than the run's, records that do not match their prompts, features computed
            under other runtime facts and not ``overwrite``.
        interp.core.errors.LayerSpecError: layers outside the model.
        StageError: too few examples of a class for the folds (with counts), records made by
            another model.
    """
    cfg = cfg or ProbeConfig()
    manifest = run_dir.manifest()
    check_run_model(run_dir, handle, manifest)
    refuse_reasoning_judge(run_dir, manifest, SPEC.name)
    records = limit_per_dataset(load_probe_records(run_dir, handle), cfg.limit)
    layers = parse_layers(cfg.layers, handle.n_layers, default="all")
    y = np.array([bool(r["oracle_label"]) for r in records])
    groups = np.array(passage_groups(records))
    folds = make_folds(y, cfg.folds, cfg.seed, groups=groups)
    facts = stage_facts(run_dir, handle, SPEC.name, overwrite=overwrite)
    data = _Data(records, layers, y, np.array([r["dataset"] for r in records]), groups, folds,
                 judge_metrics(records, folds), facts)
    results = _header(cfg, handle, data)
    for task in cfg.tasks:
        tres, weights = _run_task(run_dir, handle, cfg, data, task,
                                  manifest.get("config", {}).get("templates_path"), log)
        results["weights"].update(weights)
        results["tasks"][task] = tres
    if "eval" in results["tasks"]:
        results["best"] = results["tasks"]["eval"]["best"]
    if "gen" in results["tasks"]:
        g = results["tasks"]["gen"]
        results["gen_probe"] = {
            "question": "does the generation prompt's residual stream predict whether the "
                        "model's own answer will be right (y*)?",
            "best": g["best"], "vs_judge": g["vs_judge"]}
    if "eval" in results["tasks"]:
        results["transfer"] = results["tasks"]["eval"]["transfer"]
    write_json(run_dir.path / SPEC.table("results.json"), results)
    png = plot_probes(results, run_dir.sub("figures"))
    log(f"[probe] wrote {run_dir.path / SPEC.table('results.json')} and {png}")
    return results


def _header(cfg: ProbeConfig, handle: ModelHandle, data: _Data) -> dict[str, Any]:
    """The first fields of results.json: what was probed, on what, and how."""
    y, ds = data.y, data.ds
    return {
        "hook_point": HOOK_POINT, "hook_point_doc": HOOK_POINT_DOC,
        "label": "y* = oracle_label; positive class = Correct",
        "model": handle.spec, "n_layers": handle.n_layers, "d_model": handle.info.get("d_model"),
        "n_records": len(data.records), "n_passages": len(set(data.groups.tolist())),
        "cv": f"StratifiedGroupKFold, groups = passages (dataset + context hash), "
              f"{cfg.folds} folds, seed {cfg.seed}",
        "datasets": {str(d): int((ds == d).sum()) for d in sorted(set(ds.tolist()))},
        "class_counts": {"correct": int(y.sum()), "incorrect": int((~y).sum())},
        "majority_baseline_accuracy": float(max(y.mean(), 1 - y.mean())),
        "config": asdict(cfg), "layers": data.layers, "folds": cfg.folds, "seed": cfg.seed,
        "select_by": cfg.select_by,
        "selection_note": f"best (probe, layer, pool) = highest mean {cfg.select_by.upper()} "
                          f"over the CV test folds; the selection itself is not cross-validated "
                          f"(optimistic by the number of cells tried)",
        "judge": data.judge, "tasks": {}, "weights": {},
    }


def format_summary(results: Mapping[str, Any]) -> str:
    """A short plain-text summary of results.json.

    A fit on too few records (:func:`interp.analysis.stats.fit_note`) gets a ``*`` on its best cells
    and the note under the first line.
    """
    j = results["judge"]["overall"]
    note = fit_note(results["n_records"], results.get("class_counts"))
    star = "*" if note else ""
    lines = [f"records: {results['n_records']} {results['datasets']}; y*: "
             f"{results['class_counts']}; selection by CV {results['select_by'].upper()}"
             + (f"\n* {note}" if note else ""),
             f"verbal judge: EA {j['EA']:.3f}  F1 {j['f1']:.3f}  balanced acc "
             f"{j['balanced_accuracy'] or float('nan'):.3f}  AUC(logit_diff) "
             f"{j['auc'] if j['auc'] is not None else float('nan'):.3f}"]
    for task, t in results["tasks"].items():
        b = t["best"]
        lines.append(
            f"{task} prompt best: {b['probe']} layer {b['layer']} pool {b['pool']}: "
            f"AUC {b['auc']:.3f}±{b['auc_std']:.3f}{star}  F1 {b['f1']:.3f}±{b['f1_std']:.3f}  "
            f"acc {b['accuracy']:.3f}  balanced acc {b['balanced_accuracy']:.3f}")
        for k, r in t["best_by_probe"].items():
            lines.append(f"   {k:<6} layer {r['layer']:>2} {r['pool']:<9} AUC {r['auc']:.3f} "
                         f"F1 {r['f1']:.3f} bal.acc {r['balanced_accuracy']:.3f}")
        if pm := t.get("permutation"):
            lines.append(f"   permutation null of the best {pm['probe']} cell ({pm['n']} label "
                         f"permutations): {pm['metric'].upper()} observed {pm['observed']:.3f}, "
                         f"null mean {pm['null_mean']:.3f}, {_null_words(pm)}, "
                         f"p = {pm['p_value']:.3f}")
    tr = results.get("transfer")
    if tr and tr["possible"]:
        for p in tr["pairs"]:
            if p["train"] != p["test"]:
                auc = p["auc"]
                lines.append(f"transfer {p['train']} -> {p['test']}: AUC "
                             f"{auc if auc is None else round(auc, 3)} F1 {p['f1']:.3f}")
    elif tr:
        lines.append(f"transfer: not possible (needs >= 2 datasets with both classes; eligible "
                     f"{tr['datasets']}, excluded {tr['excluded']})")
    return "\n".join(lines)


def _null_words(pm: Mapping[str, Any]) -> str:
    """``95th pct 0.612`` (or ``largest of 2 perms ... 0.598``): the null's level in words."""
    if not pm.get("null"):
        return "no permutation fitted"
    level, what = null_level(pm["null"], pm.get("null_q95"))
    return f"{what} {level:.3f}"
