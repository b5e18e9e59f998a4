"""The steering stage (``interp steer``): attention steering of the judge and the generator.

Algorithm of :func:`run` (methods: :mod:`interp.methods.steering`, intervention:
:mod:`interp.hooks.steering`):

1. Validate the config (alphas > 0, the band, the head set) before any model work; the head
   set ``top-diff:K`` reads ``DIR/attention/summary.json`` (``interp attention``).
2. For the first ``limit`` ok records of each dataset (of each dataset and oracle label with
   ``per_label``; records with prompts over ``max_tokens`` left out first,
   :func:`interp.store.records.limit_per_dataset`),
   render the run's prompts again (:func:`interp.judging.prompts.rerender`, checked against the
   stored spans) and, per record, reuse ``DIR/steering/parts/{dataset}__{id}.json`` when fresh
   (its signature covers the model, alphas, steered units, band, tasks, answer length and the
   prompts' token ids); else steer the judge (eval prompt with the record's own answer,
   :func:`interp.methods.steering.steer_judge`) and the generator (gen prompt,
   :func:`interp.methods.steering.steer_generator`; the steered answers graded by the run's oracle)
   for every alpha, and write the part (flushed per record; a progress bar shows the ETA).
3. Tables: ``DIR/steering/rows.parquet`` (+ csv), one row per (record, task, alpha).
4. Summary (:func:`summarise`), per task, alpha and dataset (and overall), each with a
   passage-cluster bootstrap 95% CI (:func:`interp.analysis.stats.cluster_bootstrap_mean`):
   judge: context mass reached, forced-choice EA (``logit_diff > 0`` against y*), acceptance
   (forced Correct) on oracle-correct and on oracle-incorrect answers, mean ``logit_diff``
   (nats), mean ``verdict_coverage``; generator: context mass reached, GA of the steered
   answers (graded by the oracle), the share of answers that differ from alpha = 1, and the
   share of alpha = 1 answers equal to the record's (a check of the replay). Every alpha but
   1 also gets ``vs_alpha1``: the paired per-record differences from alpha = 1 (judge:
   ``logit_diff``, EA_forced, acceptance on oracle-correct / oracle-incorrect answers;
   generator: GA), each with its passage-cluster CI, so an effect has an interval of its own;
   and the judge's ranking (:func:`_ranking`): its AUC at every alpha and, against alpha 1,
   the change of that AUC and of (acceptance of right - of wrong answers), which a pure
   threshold shift leaves at 0 (the deciding control of "steering makes it right more often").
5. The figure ``DIR/figures/steering.png`` (:func:`interp.plots.steering.plot_steering`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from interp.analysis.span_mass import top_heads
from interp.analysis.stats import (
    MIN_PASSAGES,
    ClusterBootstrap,
    ci_text,
    cluster_bootstrap_auc,
    degenerate_note,
    is_degenerate,
    mean_stat,
    passage_groups,
    passage_note,
    stratified_auc,
)
from interp.core.contract import stage_of
from interp.core.errors import StageError
from interp.core.inputs import write_result
from interp.core.io import is_fresh, read_json, signature, write_json, write_table
from interp.core.layers import parse_layers
from interp.core.progress import resumed, tqdm
from interp.hooks.steering import control_keys
from interp.judging.grading import extract_answer, make_oracle
from interp.judging.prompts import rerender
from interp.methods.steering import parse_heads, steer_generator, steer_judge
from interp.models.loading import ModelHandle
from interp.stages.common import ok_records, stage_facts
from interp.stages.configs import TASKS
from interp.stages.configs.steering import SteeringConfig
from interp.stages.stored import read_attention_summary
from interp.store.records import limit_per_dataset
from interp.store.rundir import RunDir

__all__ = ["SteeringConfig", "format_summary", "make_parts", "run", "summarise",
           "summarise_stored"]

SPEC = stage_of(__name__)
"""This stage's declared contract (:data:`interp.core.contract.SPECS`)."""


def _units(run_dir: RunDir, handle: ModelHandle, cfg: SteeringConfig
           ) -> tuple[list[int], dict[int, list[int] | None]]:
    band = parse_layers(cfg.band, handle.n_layers)
    ranked = None
    if cfg.heads.strip().lower().startswith("top-diff:"):
        ranked = top_heads(read_attention_summary(run_dir), top=handle.n_layers * handle.n_heads,
                           layers=band)["diff"]
    units = parse_heads(cfg.heads, band, handle.n_heads, ranked=ranked)
    if bad := [x for x in units if not 0 <= x < handle.n_layers]:
        raise StageError("steering",
                         f"heads on layers {bad}: valid layers 0..{handle.n_layers - 1}")
    return band, units


def _steer_one(handle: ModelHandle, rec: Mapping[str, Any], cfg: SteeringConfig, band: list[int],
               units: Mapping[int, Any], oracle: Any, prompts: Mapping[str, Any]) -> list[dict]:
    """Step 2 for one record: one row per (task, keys, alpha)."""
    rows = []
    base = {"id": rec["id"], "dataset": rec["dataset"], "y_star": bool(rec["oracle_label"])}
    for task in [t for t in TASKS if t in cfg.tasks]:
        p = prompts[task]
        ctx = tuple(p.token_spans["context"])
        for keys in cfg.keys:
            pos = control_keys(len(p.input_ids), ctx) if keys == "control" else None
            tag = {"keys": keys, "n_keys": len(pos) if pos is not None else ctx[1] - ctx[0]}
            if task == "eval":
                j = steer_judge(handle, p.input_ids, ctx, units, cfg.alphas, band=band,
                                positions=pos)
                rows += [{**base, "task": "eval", **tag, "alpha": a,
                          **{k: float(v[i]) for k, v in j.items()},
                          "verdict": bool(j["logit_diff"][i] > 0)}
                         for i, a in enumerate(cfg.alphas)]
                continue
            g = steer_generator(handle, p.input_ids, ctx, units, cfg.alphas, band=band,
                                max_new_tokens=cfg.max_new_tokens, positions=pos)
            for i, a in enumerate(cfg.alphas):
                ans = extract_answer(g["generations"][i])
                lab = oracle.grade(ans, rec["answers"], dataset=rec["dataset"],
                                   answerable=rec.get("answerable", True),
                                   extras={"context": rec["context"], "question": rec["question"]})
                rows.append({**base, "task": "gen", **tag, "alpha": a,
                             "context_mass": float(g["context_mass"][i]),
                             "steered_mass": float(g["steered_mass"][i]), "answer": ans,
                             "record_answer": rec.get("answer", ""), "correct": bool(lab.label)})
    return rows


def _group_summary(g: Any, task: str, rng: np.random.Generator, n_boot: int,
                   ref: Any, rank_rng: np.random.Generator | None = None) -> dict[str, Any]:
    """Step 4 for the rows of one (task, alpha, group).

    ``rank_rng``: the generator of the judge's AUC and ranking changes (:func:`_ranking`),
    apart from ``rng`` so that they moved no other interval.
    """
    grp = g.passage.tolist()
    n_p = int(g.passage.nunique())
    out: dict[str, Any] = {"n": int(len(g)), "n_passages": n_p,
                           "few_passages": n_p < MIN_PASSAGES,
                           "context_mass": mean_stat(g.context_mass, grp, rng, n_boot),
                           "n_keys": float(g.n_keys.mean()) if "n_keys" in g else None}
    if "keys" in g and (g["keys"] == "control").all():  # the context's is context_mass
        out["steered_mass"] = mean_stat(g.steered_mass, grp, rng, n_boot)
    if task == "eval":
        pred, y = g.verdict.to_numpy(bool), g.y_star.to_numpy(bool)
        out["ea_forced"] = mean_stat(pred == y, grp, rng, n_boot)
        for name, sel in (("accept_correct", y), ("accept_incorrect", ~y)):
            out[name] = mean_stat(pred[sel], [grp[i] for i in np.flatnonzero(sel)], rng, n_boot)
        out["logit_diff"] = mean_stat(g.logit_diff, grp, rng, n_boot)
        out["verdict_coverage"] = mean_stat(g.verdict_coverage, grp, rng, n_boot)
        if rank_rng is not None:  # the AUC of logit_diff against y*, within each dataset
            a = cluster_bootstrap_auc(y, g.logit_diff.to_numpy(float), grp, rank_rng, n_boot,
                                      strata=g.dataset.tolist())
            out["auc"] = {"mean": a["auc"], "ci": a["ci"], "n": a["n"], "n_passages": n_p,
                          "n_pos": a["n_pos"], "n_neg": a["n_neg"]}
    else:
        out["ga"] = mean_stat(g.correct.to_numpy(float), grp, rng, n_boot)
        r = ref.set_index("id").answer.reindex(g.id).to_numpy()
        out["changed_vs_alpha1"] = float(np.mean(g.answer.to_numpy() != r))
        out["alpha1_equals_record"] = float(np.mean(ref.answer == ref.record_answer))
    if len(ref) and float(g.alpha.iloc[0]) != 1.0:
        out["vs_alpha1"] = _paired(g, ref, task, rng, n_boot, rank_rng)
    return out


def _deltas(g: Any, ref: Any, task: str) -> Any:
    """Per record ``x(alpha) - x(1)`` of one task's rows (step 4).

    Columns ``d_correct`` (gen) or ``d_logit_diff``, ``d_right`` (forced-choice correctness)
    and ``d_accept`` (eval) and the two logit differences themselves (``ld`` at alpha,
    ``ld_1`` at 1: the ranking statistics of :func:`_ranking` need them, not their
    difference), beside ``dataset``, ``id``, ``passage`` and ``y_star``.
    """
    m = g.merge(ref, on=["dataset", "id"], suffixes=("", "_1"))
    out = m[["dataset", "id", "passage", "y_star"]].copy()
    if task == "gen":
        out["d_correct"] = m.correct.to_numpy(float) - m.correct_1.to_numpy(float)
        return out
    y = m.y_star.to_numpy(bool)
    v, v1 = m.verdict.to_numpy(float), m.verdict_1.to_numpy(float)
    out["d_logit_diff"] = (m.logit_diff - m.logit_diff_1).to_numpy(float)
    out["ld"], out["ld_1"] = m.logit_diff.to_numpy(float), m.logit_diff_1.to_numpy(float)
    out["d_right"] = (v == y) - (v1 == y).astype(float)
    out["d_accept"] = v - v1
    return out


def _ranking(d: Any, rng: np.random.Generator, n_boot: int) -> dict[str, Any]:
    """Whether steering makes the judge RANK right above wrong answers better (step 4).

    ``auc``: the change of the AUC of ``logit_diff`` against y* from alpha = 1 to alpha,
    ``AUC(ld) - AUC(ld_1)`` on the same records; with the control's columns (``ld_c``,
    ``ld_1_c``, :func:`_context_minus_control`) minus the control's change. ``accept_gap``:
    the change of (acceptance of right answers - acceptance of wrong answers), the forced
    choice's balanced form, ``mean(d_accept | y*) - mean(d_accept | not y*)``. A judge that
    only shifts its threshold (accepting everything a little less) moves neither, while it
    moves EA_forced on a sample where most answers are wrong: these are the deciding controls
    of a "steering makes the judge right more often" claim. Each with a passage-cluster
    percentile CI, every statistic read on the same resamples (:class:`ClusterBootstrap`).
    ``auc`` also carries ``auc_alpha`` and ``auc_alpha1`` (the context's, without the control).
    """
    y = d.y_star.to_numpy(bool)
    grp, n, n_p = [str(g) for g in d.passage], int(len(d)), int(d.passage.nunique())
    bs = ClusterBootstrap(grp, n_boot, rng)
    strata = d.dataset.tolist()  # within a dataset: pooled, a base rate alone would score
    scores = [(+1, "ld"), (-1, "ld_1")] + ([(-1, "ld_c"), (+1, "ld_1_c")] if "ld_c" in d else [])
    value, samples, aucs = 0.0, 0.0, {}
    for sign, col in scores:
        x = d[col].to_numpy(float)
        aucs[col] = auc = stratified_auc(y, x, strata)
        value = None if value is None or auc is None else value + sign * auc
        boot = bs.aucs(y, x, strata)
        samples = None if samples is None or boot is None else samples + sign * boot
    base = {"n": n, "n_passages": n_p}
    out = {"auc": {"mean": value, "ci": bs.interval(samples) if value is not None else None,
                   "auc_alpha": aucs["ld"], "auc_alpha1": aucs["ld_1"], **base}}
    acc = d.d_accept.to_numpy(float)
    gap = float(acc[y].mean() - acc[~y].mean()) if y.any() and (~y).any() else None
    ci = None
    if gap is not None and bs.weights is not None:
        w = bs.weights
        with np.errstate(all="ignore"):
            boot = (w[:, y] @ acc[y]) / w[:, y].sum(1) - (w[:, ~y] @ acc[~y]) / w[:, ~y].sum(1)
        ci = bs.interval(boot)
    out["accept_gap"] = {"mean": gap, "ci": ci, **base}
    return out


def _delta_stats(d: Any, task: str, rng: np.random.Generator, n_boot: int,
                 rank_rng: np.random.Generator | None = None) -> dict[str, Any]:
    """The paired effects of :func:`_deltas` (or of a difference of two), each with its CI.

    ``rank_rng``: the generator of the judge's ranking statistics (:func:`_ranking`), kept
    apart from ``rng`` so that adding them moved no other interval; None: without them.
    """
    grp = d.passage.tolist()
    if task == "gen":
        return {"ga": mean_stat(d.d_correct, grp, rng, n_boot)}
    y = d.y_star.to_numpy(bool)
    out = {"logit_diff": mean_stat(d.d_logit_diff, grp, rng, n_boot),
           "ea_forced": mean_stat(d.d_right, grp, rng, n_boot)}
    # by the oracle's label (the right way: logit_diff up on right answers, down on wrong ones)
    for stat, col in (("accept", d.d_accept), ("logit_diff", d.d_logit_diff)):
        for label, sel in (("correct", y), ("incorrect", ~y)):
            out[f"{stat}_{label}"] = mean_stat(col.to_numpy(float)[sel],
                                           [grp[i] for i in np.flatnonzero(sel)], rng, n_boot)
    if rank_rng is not None:
        out.update(_ranking(d, rank_rng, n_boot))
    return out


def _paired(g: Any, ref: Any, task: str, rng: np.random.Generator, n_boot: int,
            rank_rng: np.random.Generator | None = None) -> dict[str, Any]:
    """Paired effects of one alpha against alpha = 1 on the same records (step 4).

    Per record ``x(alpha) - x(1)``, averaged with a passage-cluster CI: the judge's
    ``logit_diff`` (nats), forced-choice correctness (EA_forced), acceptance on
    oracle-correct and oracle-incorrect answers and ``logit_diff`` on each
    (``logit_diff_correct``, ``logit_diff_incorrect``: steering that helps the judge raises
    the first and lowers the second); the generator's correctness (GA); with ``rank_rng`` the
    judge's ranking statistics (:func:`_ranking`: ``auc``, ``accept_gap``).
    """
    return _delta_stats(_deltas(g, ref, task), task, rng, n_boot, rank_rng)


def _context_minus_control(df: Any, cfg: SteeringConfig, rng: np.random.Generator,
                           rank_rng: np.random.Generator | None = None) -> dict[str, Any]:
    """The context keys' paired effect minus the control's, per record (step 4).

    For each record, ``[x_context(alpha) - x_context(1)] - [x_control(alpha) - x_control(1)]``
    (both steered on the same record), averaged with a passage-cluster CI: whether steering
    the context moves the judge more than steering as many other keys, with the interval of
    that difference rather than of each side. With ``rank_rng``, the judge's ranking changes
    too (:func:`_ranking`): the context's change of AUC minus the control's, and of
    (acceptance of right - of wrong answers).
    """
    out: dict[str, Any] = {}
    for task in cfg.tasks:
        t = df[df.task == task]
        side = {k: t[t["keys"] == k] for k in ("context", "control")}
        out[task] = {}
        for a in [a for a in cfg.alphas if a != 1.0]:
            d = [_deltas(s[s.alpha == a], s[s.alpha == 1.0], task) for s in side.values()]
            m = d[0].merge(d[1], on=["dataset", "id"], suffixes=("", "_c"))
            for col in [c for c in d[0].columns if c.startswith("d_")]:
                m[col] = m[col] - m[f"{col}_c"]
            groups = [(ds, g) for ds, g in m.groupby("dataset")] + [("overall", m)]
            out[task][str(a)] = {ds: {"n": int(len(g)), "n_passages": int(g.passage.nunique()),
                                      **_delta_stats(g, task, rng, cfg.n_boot, rank_rng)}
                                 for ds, g in groups if len(g)}
    return out


def summarise(df: Any, cfg: SteeringConfig, band: list[int], units: Mapping[int, Any],
              model: str) -> dict[str, Any]:
    """Step 4 of the module algorithm from the rows table.

    Returns:
        ``{"model", "alphas", "band", "heads", "units", "n_records", "n_passages",
        "few_passages", "note", "keys", "eval": {alpha: {group: ...}}, "gen": {alpha: {group:
        ...}}}`` for the context keys, and with ``control`` among ``keys`` the same under
        ``"control": {"eval": ..., "gen": ...}`` for the non-context control
        with ``group`` each dataset and ``overall`` (each with ``n``, ``n_passages`` and
        ``few_passages``), and then ``"context_minus_control": {task: {alpha: {group:
        ...}}}``, the per-record difference of the two paired effects
        (:func:`_context_minus_control`); every statistic is ``{"mean", "ci", "n",
        "n_passages"}`` (a subgroup's, e.g. the passages of the right answers only).
        ``few_passages`` is true under :data:`interp.analysis.stats.MIN_PASSAGES` passages, and
        ``note`` then says so (:func:`interp.analysis.stats.passage_note`; None otherwise).
    """
    rng = np.random.default_rng(cfg.seed)
    rank_rng = np.random.default_rng([cfg.seed, 1])  # the ranking statistics' own stream
    s: dict[str, Any] = {"model": model, "alphas": list(cfg.alphas), "band": band,
                         "heads": cfg.heads, "units": {str(k): v for k, v in units.items()},
                         "n_records": int(df.id.nunique()) if len(df) else 0,
                         "n_passages": int(df.passage.nunique()) if len(df) else 0,
                         "metric": "whole-reply logit_diff = log P(Correct) - log P(Incorrect), "
                                   "nats; forced verdict = logit_diff > 0"}
    s["few_passages"] = s["n_passages"] < MIN_PASSAGES
    s["note"] = passage_note(s["n_passages"])
    s["keys"] = list(cfg.keys)
    if len(df) and "keys" not in df:  # rows of a table written before the control
        df = df.assign(keys="context")
    for keys in cfg.keys:
        dest = s if keys == "context" else s.setdefault("control", {})
        for task in cfg.tasks:
            t = df[(df.task == task) & (df["keys"] == keys)] if len(df) else df
            ref = t[t.alpha == 1.0] if len(t) else t
            dest[task] = {}
            for a in cfg.alphas if len(t) else []:
                ta = t[t.alpha == a]
                groups = [(d, g) for d, g in ta.groupby("dataset")] + [("overall", ta)]
                dest[task][str(a)] = {d: _group_summary(g, task, rng, cfg.n_boot,
                                                        ref[ref.dataset == d] if d != "overall"
                                                        else ref, rank_rng)
                                      for d, g in groups if len(g)}
    if len(df) and {"context", "control"} <= set(cfg.keys):
        s["context_minus_control"] = _context_minus_control(df, cfg, rng, rank_rng)
    return s


def _table_rows(part: list[dict[str, Any]], context: Mapping[str, Any], passage: str
                ) -> list[dict[str, Any]]:
    """A record's stored rows as rows of the table, with its passage.

    A part written before the control has no ``keys``: its rows steered the context's keys
    (``n_keys`` the context span's length in that task's prompt, ``context`` its
    ``(start, end)``; None without the prompt), and their ``steered_mass`` is the context mass.
    """
    return [{"keys": "context", "n_keys": context[r["task"]][1] - context[r["task"]][0]
             if r["task"] in context else None, "steered_mass": r["context_mass"], **r,
             "passage": passage} for r in part]


def _steer_records(run_dir: RunDir, handle: ModelHandle, cfg: SteeringConfig, *,
                   overwrite: bool) -> tuple[Any, ...]:
    """Steps 1-2 of the module algorithm: ``(records, rows, band, units, made now)``."""
    cfg.validate()
    manifest, records = ok_records(run_dir, handle, cfg.limit, stage=SPEC.name,
                                   per_label=cfg.per_label, max_tokens=cfg.max_tokens)
    mcfg = manifest.get("config", {})
    if cfg.max_new_tokens is None:  # the run's own cap: alpha 1 replays the record's answer
        cfg = replace(cfg, max_new_tokens=int(mcfg.get("max_new_tokens") or 32))
    facts = stage_facts(run_dir, handle, SPEC.name, overwrite=overwrite)
    band, units = _units(run_dir, handle, cfg)
    oracle = make_oracle(cfg.oracle or mcfg.get("oracle") or "rule", device=str(handle.device),
                         dtype=mcfg.get("dtype"), run_model=handle)
    rows, made = [], 0
    with tqdm(total=len(records), desc="steer", unit="record",
              disable=not cfg.progress or not records) as bar:
        for rec, passage in zip(records, passage_groups(records)):
            prompts = {t: rerender(rec, t, handle.tokenizer,
                                   templates_path=mcfg.get("templates_path")) for t in TASKS}
            sig = signature({"model": handle.spec, "sha256": handle.info.get("sha256"), **facts,
                             "alphas": cfg.alphas, "units": {str(k): v for k, v in units.items()},
                             "band": band, "tasks": cfg.tasks, "max_new_tokens": cfg.max_new_tokens,
                             **({"keys": cfg.keys} if cfg.keys != ["context"] else {}),
                             "oracle": getattr(oracle, "name", "?"),
                             "ids": {t: p.input_ids for t, p in prompts.items()}})
            f = SPEC.parts[0].path(run_dir.path, rec["dataset"], rec["id"])
            if is_fresh(f, sig):
                part = read_json(f)["rows"]
                resumed(bar)
            else:
                part = _steer_one(handle, rec, cfg, band, units, oracle, prompts)
                write_json(f, {"signature": sig, "rows": part})
                made += 1
                bar.update(1)
            rows += _table_rows(part, {t: p.token_spans["context"] for t, p in prompts.items()},
                                passage)
    return records, rows, band, units, made


def make_parts(run_dir: RunDir | str | Path, handle: ModelHandle, cfg: SteeringConfig, *,
               overwrite: bool = False, log: Callable[[str], None] = print) -> int:
    """Steps 1-2 only: steer every selected record whose part is not fresh; no table.

    The stage contract's ``parts_only`` (:mod:`interp.core.contract`): under torchrun each
    process steers its share of the records (:func:`interp.stages.common.share_of_records`)
    before rank 0 runs :func:`run`, which then steers nothing.

    ``log`` is the contract's signature; nothing is logged but the progress bar.

    Returns:
        The parts made now (fresh parts are kept).

    Raises:
        As :func:`run`.
    """
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    return _steer_records(run_dir, handle, cfg, overwrite=overwrite)[-1]


def run(run_dir: RunDir | str | Path, handle: ModelHandle, cfg: SteeringConfig, *,
        overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Steer the judge and the generator on a run's records (module docstring).

    ``overwrite``: redo parts stored under other result-relevant runtime facts (attention
    kernel, dtype, device, versions; :func:`interp.stages.common.stage_facts`) instead of
    refusing; a part is redone whenever its signature differs.

    Returns:
        The summary (also ``DIR/steering/summary.json``).

    Raises:
        StageError: bad alphas, tasks, band or heads.
        RunDirError: the run has no manifest or records; another model than the run's;
            parts stored under other runtime facts and not ``overwrite``; ``top-diff`` without
            an attention summary; a record whose prompts no longer render as stored.
    """
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    records, rows, band, units, _ = _steer_records(run_dir, handle, cfg, overwrite=overwrite)
    return _publish(run_dir, rows, cfg, band, units, handle.spec, len(records), log)


def _publish(run_dir: RunDir, rows: list[dict[str, Any]], cfg: SteeringConfig, band: list[int],
             units: Mapping[int, Any], model: str, n: int, log: Callable[[str], None]
             ) -> dict[str, Any]:
    """Steps 3-5 of the module algorithm: the rows table, the summary and the figure."""
    import pandas as pd

    root = run_dir.sub(SPEC.folder)
    df = pd.DataFrame(rows)
    if len(df):
        write_table(df, root / "rows.parquet")
    s = summarise(df, cfg, band, units, model)
    write_result(root / "summary.json", s, n=n, log=log)
    if cfg.figures and len(df):
        try:
            from interp.plots.steering import plot_steering

            plot_steering(s, run_dir.sub("figures"))
        except Exception as err:  # noqa: BLE001 - figures never block the tables
            log(f"[steering] figure failed: {err}")
    return s


def summarise_stored(run_dir: RunDir | str | Path, cfg: SteeringConfig, *,
                     log: Callable[[str], None] = print) -> dict[str, Any]:
    """Steps 3-5 again from the stored parts, without a model: a new statistic, no new forward.

    Every part of the selected records (step 2's selection, from ``DIR/records.jsonl``) is
    read as stored, whatever the runtime facts it was made under (its signature is not
    checked: nothing is steered); the band, the steered units and the model come from the
    stage's previous ``summary.json``, and the context's key counts from the records' stored
    token spans. Use it after a change to :func:`summarise` (the published summaries of a long
    study get the new statistic from the same rows); steering again needs :func:`run`.

    Returns:
        The summary (also ``DIR/steering/summary.json``, with ``rows.parquet`` and the figure).

    Raises:
        StageError: bad config; no previous summary; a selected record without its part, or
            a part without a row for one of ``cfg.alphas`` / ``cfg.keys`` / ``cfg.tasks``.
        RunDirError: the run has no manifest or records.
    """
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    cfg.validate()
    prev_path = run_dir.sub(SPEC.folder) / "summary.json"
    if not prev_path.exists():
        raise StageError(SPEC.name, f"{prev_path} does not exist: run the stage with its model "
                                    "once; only a summarised run is summarised again")
    prev = read_json(prev_path)
    run_dir.manifest()
    records = limit_per_dataset(run_dir.read_records(), cfg.limit, per_label=cfg.per_label,
                                max_tokens=cfg.max_tokens)
    want = {(t, k, float(a)) for t in cfg.tasks for k in cfg.keys for a in cfg.alphas}
    rows: list[dict[str, Any]] = []
    for rec, passage in zip(records, passage_groups(records)):
        f = SPEC.parts[0].path(run_dir.path, rec["dataset"], rec["id"])
        if not f.exists():
            raise StageError(SPEC.name, f"{f} is missing: steer that record first (run the "
                                        "stage with its model)")
        part = _table_rows(read_json(f)["rows"],
                           {t: p["token_spans"]["context"]
                            for t, p in (rec.get("prompts") or {}).items()}, passage)
        if lack := want - {(r["task"], r["keys"], float(r["alpha"])) for r in part}:
            raise StageError(SPEC.name, f"{f} has no rows for (task, keys, alpha) "
                                        f"{sorted(lack)}: steer it again with this config")
        rows += [r for r in part if (r["task"], r["keys"], float(r["alpha"])) in want]
    return _publish(run_dir, rows, cfg, prev["band"],
                    {int(k): v for k, v in (prev.get("units") or {}).items()}, prev["model"],
                    len(records), log)


def format_summary(summary: Mapping[str, Any]) -> str:
    """Per alpha, overall: context mass, EA, acceptance, logit_diff, coverage; GA.

    A summary on fewer than :data:`interp.analysis.stats.MIN_PASSAGES` passages gets a ``*`` on its
    passage count and the note under the lines.
    """
    def f(x: Mapping[str, Any] | None, p: str = ".2f") -> str:
        if not x or x.get("mean") is None:
            return "-"
        ci = x.get("ci")
        degenerate.append(is_degenerate(ci))
        return f"{x['mean']:{p}}" + (f" {ci_text(ci, p)}" if ci else "")

    degenerate: list[bool | None] = []

    star = "*" if summary.get("few_passages") else ""
    lines = [f"steering {summary.get('heads')} heads, band {summary.get('band')}: "
             f"{summary.get('n_records')} records, {summary.get('n_passages')} passages{star}"]
    control = summary.get("control") or {}
    for tag, part, mass in (("", summary, "context_mass"), ("control ", control, "steered_mass")):
        for a, groups in (part.get("eval") or {}).items():
            o = groups.get("overall", {})
            keys = f" ({o.get('n_keys', 0):.0f} non-context keys)" if tag else ""
            lines.append(f"{tag}judge alpha {a:>5}{keys}: {'mass' if tag else 'ctx'} "
                         f"{f(o.get(mass), '.3f')}  EA {f(o.get('ea_forced'))}  acc|C "
                         f"{f(o.get('accept_correct'))}  acc|I {f(o.get('accept_incorrect'))}  "
                         f"LD {f(o.get('logit_diff'))}  cov {f(o.get('verdict_coverage'))}")
        for a, groups in (part.get("gen") or {}).items():
            o = groups.get("overall", {})
            lines.append(f"{tag}gen   alpha {a:>5}: {'mass' if tag else 'ctx'} "
                         f"{f(o.get(mass), '.3f')}  GA {f(o.get('ga'))}"
                         + ("" if tag else f"  changed "
                            f"{o.get('changed_vs_alpha1', float('nan')):.2f}"))
    if star:
        lines.append(f"* {summary.get('note') or passage_note(summary['n_passages'])}; the "
                     "CIs above rest on these few passages")
    if any(degenerate):
        lines.append(degenerate_note(summary.get("n_passages")))
    return "\n".join(lines)
