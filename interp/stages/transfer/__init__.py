"""Study 3 (paper section 3.3): LoRA transfer between generation and self-evaluation, the stage.

Algorithm (:func:`run`; every step writes under ``DIR/transfer/`` and is skipped when its
output already exists, so an interrupted run resumes; :func:`reconcile_config` first discards the
outputs a changed setting invalidates, or refuses a changed training setting; the settings
include the :func:`provenance` of the outputs: model sha256, result-relevant runtime facts,
template texts and the token ids of the training and evaluation prompts):

1. **Training pool** (:func:`interp.methods.transfer.training_pool`).
2. **Hard negatives** (``hard_negatives.jsonl``,
:func:`interp.methods.transfer.mine_hard_negatives`):
   every closed-book attempt with the reason it was kept or rejected, and the fallback.
3. **Training sets** (``train_sets/<adapter>.jsonl``,
:func:`interp.methods.transfer.build_training_sets`).
4. **Training** (``adapters/<adapter>/``, checkpoints in ``checkpoints/<adapter>/``):
   :func:`interp.methods.lora.train_adapter` for LoRA-Gen, LoRA-Eval and LoRA-Both, or the
   ones ``adapters`` names (every later step reads only those; an adapter's training does not
   depend on which others are chosen, so one trained before is kept and reused). With
   ``lr_grid`` the
   learning rate is chosen on held-out TRAIN records first
   (:func:`interp.stages.transfer.selection.select_learning_rates`, :mod:`interp.methods.transfer`
   step 4): per
   candidate rate, the chosen adapters are trained on the pool less its last ``select_holdout``
   records (``select/lr_<rate>/``) and run Study 1 on those held-out records
   (``select/lr_<rate>/heldout/<adapter>.jsonl``, the base model's in
   ``select/heldout_base.jsonl``); each adapter's best candidate is copied to
   ``adapters/<adapter>/`` and every candidate's held-out score is in ``select.json``. The
   validation records are never used to choose.
5. **Evaluation** (``eval/<model>__<dataset>.jsonl``): ``base`` and each adapter run Study 1
   unchanged (:func:`interp.methods.asymmetry.evaluate_examples`: T_gen, the oracle, T_eval on its
   OWN answers) on the first ``eval_limit`` validation records of each dataset; additionally each
   adapter judges the BASE model's answers (``..__judge_base_answers.jsonl``), which separates a
   change of judge from a change of the answers being judged. Adapters are loaded onto a fresh
   copy of the base model and checked against its fingerprint
   (:func:`interp.methods.lora.load_adapter`).
6. **Table** (``table.json``, :func:`build_table`): per model and dataset
   :func:`interp.methods.asymmetry.group_metrics` (``GA``, ``EA``, ``delta``, acceptance rates on
   oracle-correct and oracle-incorrect answers, bootstrap / Wilson 95% CIs), the same for
   ``judge_base_answers``, training seconds and the hard-negative fallback rate.
7. **Patching across models** (``patching.json``): on the base model's eval prompts of the
   first ``patch_examples`` ok records, :func:`interp.methods.transfer.cross_model_patching` per
   adapter (resid_post at ``patch_layers``, ``patch_positions`` = ``all`` or ``last``); an
   adapter already patched on the same prompts is kept, so a changed ``adapters`` patches only
   the new ones.
8. **Figures** (``figures/transfer_matrix.png``, ``transfer_acceptance.png``,
   ``transfer_patching.png``) drawn from ``table.json`` / ``patching.json``; ``summary.json``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from interp.core.contract import stage_of
from interp.core.errors import StageError
from interp.core.inputs import read_toml
from interp.core.io import (
    read_json,
    read_jsonl,
    signature,
    write_json,
    write_jsonl,
    write_jsonl_once,
)
from interp.core.layers import parse_layers
from interp.core.names import safe_name
from interp.core.progress import tqdm
from interp.data import QAExample, load_study_split
from interp.judging.grading import BaseOracle, make_oracle
from interp.judging.prompts import Template, get_template, render
from interp.methods.asymmetry import evaluate_examples
from interp.methods.lora import check_in_memory, load_adapter
from interp.methods.transfer import (
    cross_model_patching,
    mine_hard_negatives,
    training_pool,
)
from interp.models.loading import ModelHandle, result_facts, runtime_facts
from interp.stages.common import current_share, stage_facts
from interp.stages.configs.transfer import (
    ADAPTERS,
    EVAL_FIELDS,
    KEY_FIELDS,
    PATCH_FIELDS,
    SELECT_FIELDS,
    TransferConfig,
)
from interp.stages.transfer.selection import (
    _eval_kw,
    _Selection,
    _train,
    chosen_sets,
    select_learning_rates,
    selection_candidates,
)
from interp.stages.transfer.table import build_table, format_table
from interp.store.rundir import RunDir

MODELS = ("base",) + ADAPTERS
"""Every model the stage can evaluate: the base model, then each adapter of :data:`ADAPTERS`
(a run evaluates the base model and ``adapters``)."""
SPEC = stage_of(__name__)
"""This stage's declared contract (:data:`interp.core.contract.SPECS`)."""

# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------


_ALL_OUTPUTS = ("hard_negatives.jsonl", "train_sets", "adapters", "checkpoints", "select",
                "select.json", "eval", "table.json", "patching.json", "summary.json")
"""Everything the stage writes under ``DIR/transfer/`` (removed when a training setting
changes)."""


def _heldout(tdir: Path) -> list[str]:
    """The held-out record files of the learning-rate selection, relative to ``tdir``."""
    return [str(p.relative_to(tdir)) for p in sorted((tdir / "select").glob("**/*.jsonl"))
            if p.parent.name == "heldout" or p.name.startswith("heldout_base")]


def _remove(tdir: Path, subs: Sequence[str]) -> None:
    for sub in subs:
        p = tdir / sub
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def provenance(handle: ModelHandle, config: TransferConfig, template: Template,
               pool: Sequence[QAExample], val: Mapping[str, Sequence[QAExample]]
               ) -> dict[str, Any]:
    """What the stored outputs were made from, besides the config (flat, JSON-safe).

    ``model_sha256``, ``runtime.<fact>`` (:func:`interp.models.loading.result_facts`), ``templates``
    (signature of the study's and the closed-book template's texts), ``train_prompts`` (token
    ids of the pool's gen and closed-book prompts and their gold answers) and
    ``eval_prompts`` (the same for the validation records): a new tokenizer, template text or
    data file with the same record ids changes them.
    """
    closed = get_template(config.hard_negative_template, config.templates_path)

    def prompts(exs: Sequence[QAExample]) -> str:
        return signature([(ex.dataset, ex.id, ex.answers,
                           render(handle.tokenizer, template, "gen", context=ex.context,
                                  question=ex.question).input_ids,
                           render(handle.tokenizer, closed, "gen", context=ex.context,
                                  question=ex.question).input_ids) for ex in exs])

    facts = result_facts(runtime_facts(handle))
    return {"model_sha256": handle.info.get("sha256"),
            **{f"runtime.{k}": v for k, v in facts.items()},
            "templates": signature([asdict(template), asdict(closed)]),
            "train_prompts": prompts(pool),
            "eval_prompts": prompts([ex for exs in val.values() for ex in exs])}


EVAL_PROVENANCE = ("eval_prompts",)
"""Provenance keys whose change redoes the evaluation only; every other one is a training
setting (refused unless ``overwrite``)."""


def reconcile_config(tdir: Path, config: TransferConfig, overwrite: bool,
                 prov: Mapping[str, Any] | None = None) -> None:
    """Compare ``config`` (and ``prov``) with those stored in ``tdir/config.json``, then store.

    A changed evaluation setting (:data:`EVAL_FIELDS`, :data:`EVAL_PROVENANCE`) discards the
    evaluation, table and patching; a changed patching setting (:data:`PATCH_FIELDS`) the
    patching; a changed training setting (:data:`KEY_FIELDS`, any other :func:`provenance`
    key: model sha256, runtime facts, template texts, training prompts) everything, but only
    with ``overwrite``. Provenance stored by an older version (absent) is not compared.

    Raises:
        StageError: a training setting changed and not ``overwrite`` (the message lists the
            changes and names ``--overwrite``).
    """
    path = tdir / "config.json"
    cfg = asdict(config)
    new_prov = dict(prov or {})
    if path.exists():
        old = read_json(path)
        old_prov = old.get("provenance") or {}
        changed = {k for k in new_prov if k in old_prov and old_prov[k] != new_prov[k]}
        for fields, outs in ((EVAL_FIELDS, ("eval", "table.json", "patching.json")),
                             (PATCH_FIELDS, ("patching.json",)),
                             (SELECT_FIELDS, ("select.json", *_heldout(tdir)))):
            if any(old.get(k) != cfg.get(k) for k in fields) or (
                    fields is EVAL_FIELDS and changed & set(EVAL_PROVENANCE)):
                _remove(tdir, outs)
        diff = {k: (old.get(k), cfg.get(k)) for k in KEY_FIELDS if old.get(k) != cfg.get(k)}
        diff.update({f"provenance.{k}": (old_prov[k], new_prov[k])
                     for k in sorted(changed - set(EVAL_PROVENANCE))})
        if diff and not overwrite:
            lines = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
            raise StageError("transfer",
                             f"{tdir} was made with another transfer config ({lines}); use "
                             f"another --out or --overwrite")
        if diff:
            _remove(tdir, _ALL_OUTPUTS)
    write_json(path, {**cfg, "provenance": new_prov} if prov is not None else cfg)


# ---------------------------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------------------------


def _hard_negatives(tdir: Path, handle: ModelHandle, pool: list[QAExample], oracle: BaseOracle,
                    config: TransferConfig, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Step 2, read back when ``hard_negatives.jsonl`` exists for the same pool.

    Mined only when the file is missing; written only when it is still missing then
    (:func:`interp.core.io.write_jsonl_once`), so processes that mine at once use one file.
    """
    path = tdir / "hard_negatives.jsonl"
    if not path.exists():
        # first writer wins: processes that mine together (make_parts) all use one file
        write_jsonl_once(path, mine_hard_negatives(handle, pool, oracle, config, log=log))
    negatives = read_jsonl(path)
    if [r["id"] for r in negatives] != [ex.id for ex in pool]:
        raise StageError("transfer", f"{path} does not match the training pool; delete it or use "
                                     f"--overwrite")
    return negatives


def _eval_paths(tdir: Path, mname: str, ds: str) -> tuple[Path, Path]:
    """Step 5's stored records of one model on one dataset: ``(self, judge_base_answers)``."""
    name = safe_name(ds)  # a dataset given as a file path stays one file name
    return (tdir / "eval" / f"{mname}__{name}.jsonl",
            tdir / "eval" / f"{mname}__{name}__judge_base_answers.jsonl")


def _evaluate_model(tdir: Path, handle: ModelHandle, mname: str, val: Mapping[str, list],
                    base_answers: dict[str, list], config: TransferConfig, kw: Mapping,
                    timings: dict[str, float], log: Callable[[str], None]
                    ) -> tuple[list[dict], list[dict]]:
    """Step 5 for one model: ``(self records, judge_base_answers records)`` over datasets."""
    h = handle if mname == "base" else None
    own, judged = [], []
    need_fix = config.judge_base_answers and mname != "base"
    for ds, exs in val.items():
        p_self, p_fix = _eval_paths(tdir, mname, ds)
        if not p_self.exists() or (need_fix and not p_fix.exists()):
            h = h or load_adapter(handle, tdir / "adapters" / mname, name=mname)
            t0 = time.perf_counter()
            for path, cands in ((p_self, None), (p_fix, base_answers.get(ds))):
                if path.exists() or (path is p_fix and not need_fix):
                    continue
                cands = None if cands is None else [a if a is not None else "" for a in cands]
                recs = evaluate_examples(h, exs, candidates=cands, **kw)
                for r in recs:
                    r["transfer_model"], r["template"] = mname, config.template
                write_jsonl(path, recs)
            timings[f"eval_{mname}_{ds}_s"] = time.perf_counter() - t0
            log(f"[eval] {mname} on {ds}: {len(exs)} records in "
                f"{timings[f'eval_{mname}_{ds}_s']:.1f} s")
        recs = read_jsonl(p_self)
        own += recs
        if mname == "base":
            base_answers[ds] = [r.get("answer") for r in recs]
            judged += recs
        elif need_fix:
            judged += read_jsonl(p_fix)
    return own, judged


def _evaluate(tdir: Path, handle: ModelHandle, template: Template, oracle: BaseOracle,
              val: Mapping[str, list], config: TransferConfig, timings: dict[str, float],
              log: Callable[[str], None]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Step 5: ``{"self": {model: records}, "judge_base_answers": {model: records}}``.

    The models: ``base``, then each adapter of ``config.adapters``.
    """
    evals: dict[str, dict[str, list[dict[str, Any]]]] = {"self": {}, "judge_base_answers": {}}
    kw = _eval_kw(template, oracle, config)
    base_answers: dict[str, list[str | None]] = {}

    # one bar over the models (base and each adapter), each evaluated on every dataset
    for mname in tqdm(["base", *config.adapters], desc="transfer eval", unit="model",
                      leave=False):
        evals["self"][mname], evals["judge_base_answers"][mname] = _evaluate_model(
            tdir, handle, mname, val, base_answers, config, kw, timings, log)
    return evals


def _patched(path: Path) -> dict[str, Any]:
    """``patching.json``'s content (``{}`` when it is not there yet)."""
    return read_json(path) if path.exists() else {}


def _cross_model(tdir: Path, handle: ModelHandle, template: Template,
                 base_recs: Sequence[Mapping[str, Any]], val: Mapping[str, list],
                 config: TransferConfig) -> tuple[dict[str, Any], list[str]]:
    """Step 7: cross-model patching of each chosen adapter on the base model's eval prompts.

    An adapter already in ``patching.json`` on the same prompts, positions and layers is kept
    as it is, so only the adapters of ``config.adapters`` missing there are patched; the file
    keeps every adapter patched on these prompts (in :data:`ADAPTERS` order), the figure draws
    the chosen ones.

    Returns:
        ``(patching.json's new content, the adapters patched now)``.
    """
    by_id = {(ex.dataset, ex.id): ex for exs in val.values() for ex in exs}
    recs = [r for r in base_recs if r.get("status") == "ok"][: config.patch_examples]
    prompts = []
    for r in recs:
        ex = by_id[(r["dataset"], r["id"])]
        prompts.append(render(handle.tokenizer, template, "eval", context=ex.context,
                              question=ex.question, answer=r["answer"]).input_ids)
    layers = parse_layers(config.patch_layers, handle.n_layers, default="all")
    out = {"positions": config.patch_positions, "n_prompts": len(prompts),
           "ids": [r["id"] for r in recs], "adapters": {}}
    old = _patched(tdir / "patching.json")
    kept = {n: res for n, res in (old.get("adapters") or {}).items()
            if all(old.get(k) == out[k] for k in ("positions", "n_prompts", "ids"))
            and res.get("layers") == list(layers)}
    made = [n for n in config.adapters if n not in kept]
    for name in made:
        ah = load_adapter(handle, tdir / "adapters" / name, name=name)
        kept[name] = cross_model_patching(handle, ah, prompts, positions=config.patch_positions,
                                          layers=layers)
        del ah
    out["adapters"] = {n: kept[n] for n in ADAPTERS if n in kept}
    return out, made


def _figures(run_dir: RunDir, table: Mapping[str, Any], patch_path: Path,
             model: str | None = None, adapters: Sequence[str] = ADAPTERS) -> list[Path]:
    """Step 8 (``model``: the base model's name, for the titles).

    ``adapters``: the chosen adapters, the only ones of ``patching.json`` drawn.
    """
    from interp.plots.transfer import (
        plot_transfer_acceptance,
        plot_transfer_matrix,
        plot_transfer_patching,
    )

    figs = run_dir.sub("figures")
    paths = [plot_transfer_matrix(table, figs, model=model),
             plot_transfer_acceptance(table, figs, model=model)]
    patching = _patched(patch_path)
    drawn = {n: r for n, r in (patching.get("adapters") or {}).items() if n in adapters}
    if drawn:
        paths.append(plot_transfer_patching({**patching, "adapters": drawn}, figs,
                                            model=model))
    return paths


def _summary(config: TransferConfig, pool: list, negatives: list[dict], table: Mapping,
             sets: Mapping[str, list], timings: Mapping[str, float], wall: float,
             paths: list[Path]) -> dict[str, Any]:
    keys = ("n", "GA", "EA", "delta", "acceptance_rate_correct", "acceptance_rate_incorrect")
    return {
        "pool": len(pool), "datasets": config.datasets,
        "hard_negative_fallback_rate": table["hard_negative_fallback_rate"],
        "hard_negative_sources": {s: sum(r["source"] == s for r in negatives)
                                  for s in ("closed_book", "rotation")},
        "train_seconds": table["train_seconds"],
        "train_cpu_seconds": table["train_cpu_seconds"],
        "train_items": {n: len(s) for n, s in sets.items()},
        "timings_s": dict(timings), "wall_s_this_call": wall,
        "headline": {m: {d: {k: v.get(k) for k in keys} for d, v in per.items()}
                     for m, per in table["self"].items()},
        "figures": [str(p) for p in paths],
    }


# ---------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------


@dataclass
class _Prepared:
    """Steps 1-2 and the checks, shared by :func:`run` and :func:`make_parts`."""

    run_dir: RunDir
    cfg: TransferConfig
    tdir: Path
    template: Template
    pool: list[QAExample]
    val: dict[str, list[QAExample]]
    oracle: BaseOracle
    negatives: list[dict[str, Any]]
    hard_negatives_s: float


def _prepare(run_dir: RunDir | str | Path, handle: ModelHandle, cfg: TransferConfig,
             overwrite: bool, log: Callable[[str], None]) -> _Prepared:
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    cfg = replace(cfg, model=handle.spec)  # the base model is the one given
    tdir = run_dir.sub("transfer")
    parse_layers(cfg.patch_layers, handle.n_layers, default="all")  # fail before slow work
    check_in_memory(handle, "the transfer stage (LoRA training)")
    template = get_template(cfg.template, cfg.templates_path)
    pool = training_pool(cfg, handle.tokenizer, template, log=log)
    val = {ds: load_study_split(ds, "validation", limit=cfg.eval_limit, from_hub=cfg.from_hub)
           for ds in cfg.datasets}
    reconcile_config(tdir, cfg, overwrite, provenance(handle, cfg, template, pool, val))
    if run_dir.manifest_path.exists():  # the full runtime facts, per stage (checked above)
        stage_facts(run_dir, handle, SPEC.name, overwrite=True)
    oracle = make_oracle(cfg.oracle, device=cfg.device, dtype=cfg.dtype)
    t0 = time.perf_counter()
    negatives = _hard_negatives(tdir, handle, pool, oracle, cfg, log)
    return _Prepared(run_dir, cfg, tdir, template, pool, val, oracle, negatives,
                     time.perf_counter() - t0)


def make_parts(run_dir: RunDir | str | Path, handle: ModelHandle, cfg: TransferConfig, *,
               overwrite: bool = False, log: Callable[[str], None] = print) -> int:
    """The stage contract's ``parts_only``: this process's share of the training.

    Within :func:`interp.stages.common.share_of_records` ``(index, count)`` (the parts phase
    of :func:`interp.run.pipeline.run_config` under torchrun), steps 1-2 as :func:`run` does them,
    then: with ``lr_grid``, the :func:`selection_candidates` ``k`` with ``k mod count ==
    index`` (each trained into ``select/lr_<rate>/`` and run on the held-out records); without
    it, the adapters of ``adapters`` dealt out the same way (``adapters/<adapter>/``).
    Rank 0 then runs :func:`run`, which finds them made and trains nothing again. Outside a
    share, every part. Each part is resumable like :func:`run`'s.

    Every process mines the hard negatives when ``hard_negatives.jsonl`` is missing; the
    first file written is kept and used by all (:func:`_hard_negatives`).

    Returns:
        The number of parts this process owns (made now or found made).

    Raises:
        StageError: as :func:`run`, before any training.
    """
    index, count = current_share() or (0, 1)
    p = _prepare(run_dir, handle, cfg, overwrite, log)
    if p.cfg.lr_grid:
        sel = _Selection(p.tdir, handle, p.template, p.oracle, p.pool, p.negatives, p.cfg,
                         log)
        mine = selection_candidates(p.cfg)[index::count]
        for lr, name in mine:
            sel.score(lr, name)
        log(f"[select] share {index} of {count}: {len(mine)} candidates made")
        return len(mine)
    mine_names = list(p.cfg.adapters[index::count])
    if mine_names:
        _train(p.tdir, handle, p.template, chosen_sets(p.pool, p.negatives, p.cfg), p.cfg, log,
               names=mine_names)
    return len(mine_names)


def run(run_dir: RunDir | str | Path, handle: ModelHandle, cfg: TransferConfig, *,
        overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run Study 3 into ``DIR/transfer/`` (module docstring), resuming finished steps.

    Args:
        run_dir: run directory (an asymmetry run directory, or a fresh folder).
        handle: the base model.
        cfg: the study's configuration.
        overwrite: discard ``DIR/transfer`` work made with another training config.
        log: progress lines.

    Returns:
        ``summary.json``'s content: pool size, fallback rate, training seconds per adapter,
        the table's headline numbers and file paths.

    Raises:
        StageError: unknown dataset split, config or provenance (model sha256, runtime
            facts, template texts, training prompts) mismatch with stored work and not
            ``overwrite``.
        LayerSpecError: bad ``patch_layers``.
    """
    t_start = time.perf_counter()
    p = _prepare(run_dir, handle, cfg, overwrite, log)
    run_dir, cfg, tdir, template, pool, val, oracle, negatives = (
        p.run_dir, p.cfg, p.tdir, p.template, p.pool, p.val, p.oracle, p.negatives)
    timings: dict[str, float] = {"hard_negatives_s": p.hard_negatives_s}
    fallback_rate = sum(r["fallback"] for r in negatives) / len(negatives)
    log(f"[hard negatives] {len(negatives)} records, fallback (answer rotation) rate "
        f"{fallback_rate:.2f}")
    selection = None
    if cfg.lr_grid:
        def need_weights(name: str) -> bool:  # an adapter's weights are still to be used
            kept = [p_self.exists() and (p_fix.exists() or not cfg.judge_base_answers)
                    for p_self, p_fix in (_eval_paths(tdir, name, ds) for ds in val)]
            patched = cfg.patch_examples == 0 or name in (
                _patched(tdir / "patching.json").get("adapters") or {})
            return not (all(kept) and patched)

        selection, metas = select_learning_rates(tdir, handle, template, oracle, pool,
                                                 negatives, cfg, log, need_weights)
        sets = {n: read_jsonl(tdir / "train_sets" / f"{n}.jsonl") for n in cfg.adapters}
    else:
        sets = chosen_sets(pool, negatives, cfg)
        metas = _train(tdir, handle, template, sets, cfg, log)
    evals = _evaluate(tdir, handle, template, oracle, val, cfg, timings, log)
    table = build_table(evals, n_boot=cfg.n_boot, seed=cfg.seed)
    table["train_seconds"] = {n: m["train_seconds"] for n, m in metas.items()}
    table["train_cpu_seconds"] = {n: m.get("train_cpu_seconds") for n, m in metas.items()}
    table["hard_negative_fallback_rate"] = fallback_rate
    table["lr"] = {n: m.get("config", {}).get("lr", cfg.lr) for n, m in metas.items()}
    if selection is not None:
        table["lr_selection"] = {k: selection[k] for k in (
            "rule_text", "n_train", "base", "candidates", "chosen", "chosen_by",
            "all_collapsed", "train_seconds")}
    write_json(tdir / "table.json", table)
    patch_path = tdir / "patching.json"
    if cfg.patch_examples > 0 and set(cfg.adapters) - set(
            _patched(patch_path).get("adapters") or {}):
        t0 = time.perf_counter()
        patching, made = _cross_model(tdir, handle, template, evals["self"]["base"], val, cfg)
        write_json(patch_path, patching)
        timings["patching_s"] = time.perf_counter() - t0
        log(f"[patching] {patching['n_prompts']} prompts x {len(made)} adapters in "
            f"{timings['patching_s']:.1f} s")
    paths = _figures(run_dir, table, patch_path, cfg.model, cfg.adapters)
    summary = _summary(cfg, pool, negatives, table, sets, timings,
                       time.perf_counter() - t_start, paths)
    write_json(tdir / "summary.json", summary)
    return summary


def format_summary(summary: Mapping[str, Any]) -> str:
    """The headline table (self-evaluation, per model and dataset) and the training facts."""
    table = {"self": summary["headline"]}
    return "\n".join([
        format_table(table),
        f"hard-negative fallback rate {summary['hard_negative_fallback_rate']:.2f}; "
        f"training seconds {summary['train_seconds']}"])


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The transfer settings of a TOML file: its ``[transfer]`` table, else the whole file.

    In a full experiment config (with ``[asymmetry]`` etc.) only ``[transfer]`` is read.

    Raises:
        interp.core.errors.ConfigError: the file is missing or not TOML.
    """
    data = read_toml(path)
    return dict(data[SPEC.name]) if SPEC.name in data else data
