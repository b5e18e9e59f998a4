"""Steps 3-4 of the transfer stage: training, and the learning rate chosen on held-out records.

Paper section 3.3; the stage is :mod:`interp.stages.transfer`, the rule
:mod:`interp.methods.transfer`. :func:`select_learning_rates` runs the whole selection in
one process; :func:`selection_candidates` lists its parts so that
:func:`interp.stages.transfer.make_parts` can deal them out to processes
(:class:`_Selection` makes one candidate's files, which no other part writes).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from interp.core.errors import StageError
from interp.core.io import read_json, read_jsonl, write_json, write_jsonl
from interp.data import QAExample
from interp.judging.grading import BaseOracle
from interp.judging.prompts import Template
from interp.methods.asymmetry import evaluate_examples
from interp.methods.lora import encode_example, load_adapter, train_adapter
from interp.methods.transfer import (
    SELECTION_RULE,
    build_training_sets,
    choose_learning_rates,
    holdout_split,
    selection_score,
)
from interp.models.loading import ModelHandle, end_of_turn_ids
from interp.stages.configs.transfer import KEY_FIELDS, TransferConfig


def _train(tdir: Path, handle: ModelHandle, template: Template,
           sets: Mapping[str, list[dict[str, Any]]], config: TransferConfig,
           log: Callable[[str], None], names: Sequence[str] | None = None
           ) -> dict[str, dict[str, Any]]:
    """Steps 3-4: write the training sets, train (or read back) each adapter of ``names``.

    ``sets``: the training sets of the chosen adapters (``config.adapters``), each written to
    ``train_sets/<adapter>.jsonl``; ``names`` (default ``config.adapters``): those trained here.
    """
    eot = end_of_turn_ids(handle.tokenizer)[0]
    for name, items in sets.items():
        write_jsonl(tdir / "train_sets" / f"{name}.jsonl", items)
    metas = {}
    for name in config.adapters if names is None else names:
        enc = [encode_example(handle.tokenizer, template, it, eot_id=eot) for it in sets[name]]
        metas[name] = train_adapter(handle, enc, config, tdir / "adapters" / name,
                                    checkpoint_dir=tdir / "checkpoints" / name, name=name,
                                    meta_config={k: getattr(config, k) for k in KEY_FIELDS},
                                    log=log)
        log(f"[{name}] trained on {metas[name]['n_examples']} items in "
            f"{metas[name]['train_seconds']:.1f} s (final loss {metas[name]['losses'][-1]:.3f})")
    return metas


def _eval_kw(template: Template, oracle: BaseOracle, config: TransferConfig) -> dict[str, Any]:
    """The Study 1 settings every evaluation of the stage uses (held-out and validation)."""
    return dict(template=template, oracle=oracle, max_new_tokens=config.max_new_tokens,
                verdict_max_new_tokens=config.verdict_max_new_tokens,
                batch_size=config.batch_size)


def selection_candidates(config: TransferConfig) -> list[tuple[float | None, str]]:
    """The parts of the learning-rate selection, in the order :func:`select_learning_rates` runs.

    The base model's held-out records ``(None, "base")``, then every ``(rate, adapter)`` of
    ``lr_grid`` x ``config.adapters`` (rate-major; by default all three adapters of
    :data:`interp.stages.configs.transfer.ADAPTERS`);
    :func:`interp.stages.transfer.make_parts` deals them out in turn. Each adapter's score
    reads only its own held-out records (:data:`interp.methods.transfer.SELECTION_RULE`:
    LoRA-Both's is the mean of its own GA and its own judge's balanced accuracy), so a subset
    is chosen as it would be among all three.
    """
    return [(None, "base")] + [(lr, name) for lr in config.lr_grid or ()
                               for name in config.adapters]


def chosen_sets(pool: Sequence[QAExample], negatives: Sequence[Mapping[str, Any]],
                config: TransferConfig) -> dict[str, list[dict[str, Any]]]:
    """The training sets of ``config.adapters``.

    All three are built together (:func:`interp.methods.transfer.build_training_sets`, one
    seeded draw), so an adapter's set does not depend on which others are chosen.
    """
    every = build_training_sets(pool, negatives, seed=config.seed)
    return {n: every[n] for n in config.adapters}


class _Selection:
    """The held-out split, training sets and per-candidate held-out records of the selection.

    :meth:`score` reads a candidate's held-out records, or trains it (``select/lr_<rate>/``,
    resumable) and runs them first; every part is its own files, so processes that make
    different candidates never write the same file.
    """

    def __init__(self, tdir: Path, handle: ModelHandle, template: Template,
                 oracle: BaseOracle, pool: Sequence[QAExample],
                 negatives: Sequence[Mapping[str, Any]], config: TransferConfig,
                 log: Callable[[str], None]):
        train_idx, held_idx = holdout_split(len(pool), config.select_holdout)
        if len(train_idx) < config.train_batch_size:
            raise StageError(
                "transfer", f"the training pool has {len(pool)} records, too few to hold out "
                f"select_holdout = {config.select_holdout} and train on train_batch_size = "
                f"{config.train_batch_size}; lower select_holdout or raise max_train_examples")
        self.handle, self.template, self.config, self.log = handle, template, config, log
        self.train = [pool[i] for i in train_idx]
        self.held = [pool[i] for i in held_idx]
        self.sets = chosen_sets(self.train, [negatives[i] for i in train_idx], config)
        # what every judge is scored on: each held-out record's gold answer and hard negative
        self.judged_exs = self.held + self.held
        self.judged_answers = ([ex.answers[0] for ex in self.held]
                               + [negatives[i]["hard_negative"] for i in held_idx])
        self.kw, self.sdir = _eval_kw(template, oracle, config), tdir / "select"

    def trained(self, lr: float, name: str) -> dict[str, Any]:
        """Train (or read back) candidate ``(lr, name)``; its training metadata."""
        return _train(self.sdir / f"lr_{lr:g}", self.handle, self.template, self.sets,
                      replace(self.config, lr=lr), self.log, names=[name])[name]

    def _held_out(self, path: Path, name: str, load: Callable[[], ModelHandle],
                  judge: bool) -> list[dict[str, Any]]:
        if not path.exists():
            model = load()  # trains the candidate first when it must: not in the timing
            t0 = time.perf_counter()
            recs = (evaluate_examples(model, self.judged_exs, candidates=self.judged_answers,
                                      **self.kw)
                    if judge else evaluate_examples(model, self.held, **self.kw))
            write_jsonl(path, recs)
            self.log(f"[select] {name}: {'judged' if judge else 'Study 1 on'} {len(recs)} "
                     f"held-out {'answers' if judge else 'records'} in "
                     f"{time.perf_counter() - t0:.1f} s")
        return read_jsonl(path)

    def files(self, lr: float | None, name: str) -> dict[str, Path]:
        """The held-out record files of candidate ``(lr, name)`` (``lr`` None: the base)."""
        if lr is None:
            sub, stem, rule = self.sdir, "heldout_base", SELECTION_RULE["lora_both"]
        else:
            sub, stem = self.sdir / f"lr_{lr:g}" / "heldout", name
            rule = SELECTION_RULE.get(name, ("GA", "judge_balanced_accuracy"))
        return {**({"own": sub / f"{stem}.jsonl"} if "GA" in rule else {}),
                **({"judged": sub / f"{stem}__judge.jsonl"}
                   if "judge_balanced_accuracy" in rule else {})}

    def score(self, lr: float | None, name: str) -> dict[str, Any]:
        """Candidate ``(lr, name)``'s held-out score, its records made first when missing.

        :func:`interp.methods.transfer.selection_score`; the base model (``lr`` None) is
        scored by LoRA-Both's rule.
        """
        loaded: list[ModelHandle] = []

        def load() -> ModelHandle:
            if lr is None:
                return self.handle
            if not loaded:
                self.trained(lr, name)
                loaded.append(load_adapter(self.handle,
                                           self.sdir / f"lr_{lr:g}" / "adapters" / name,
                                           name=name))
            return loaded[0]

        label = "base" if lr is None else f"{name} lr {lr:g}"
        sc = selection_score("lora_both" if lr is None else name, **{
            k: self._held_out(p, label, load, k == "judged")
            for k, p in self.files(lr, name).items()})
        if lr is not None:
            self.log(f"[select] {label}: score {sc['score']} (GA {sc['GA']}, judge balanced "
                     f"accuracy {sc['judge_balanced_accuracy']}, accepts "
                     f"{sc['accept_share']}{', collapsed' if sc['collapsed'] else ''})")
        return sc


def select_learning_rates(tdir: Path, handle: ModelHandle, template: Template,
                          oracle: BaseOracle, pool: Sequence[QAExample],
                          negatives: Sequence[Mapping[str, Any]], config: TransferConfig,
                          log: Callable[[str], None] = print,
                          need_weights: Callable[[str], bool] = lambda name: True
                          ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Step 4 with ``lr_grid``: each adapter's learning rate, chosen on held-out TRAIN records.

    :func:`interp.methods.transfer.holdout_split` holds ``select_holdout`` pool records out; for
    every rate of ``lr_grid`` each adapter of ``config.adapters`` trains on the rest
    (``select/lr_<rate>/``, resumable like step 4) and is scored
    (:func:`interp.methods.transfer.selection_score`) from its records on the held-out ones,
    stored in ``select/lr_<rate>/heldout/``: ``<adapter>.jsonl``, Study 1 on
    its own answers (LoRA-Gen, LoRA-Both), and ``<adapter>__judge.jsonl``, its verdicts on
    each held-out record's gold answer and hard negative (LoRA-Eval, LoRA-Both); the base
    model's are ``select/heldout_base[__judge].jsonl``.
    :func:`interp.methods.transfer.choose_learning_rates` picks, and the chosen candidate is copied
    to ``adapters/<adapter>/`` (kept when it is already there, so a resume with stored held-out
    records trains nothing). A candidate is trained only while its held-out records are
    missing, or to be copied. The chosen adapter's training metadata is also kept in
    ``select/chosen/<adapter>.json``: when ``need_weights(adapter)`` is false (its
    validation records and the cross-model patching are stored) and the weights are gone (a
    study's saved state keeps its JSON, not its adapters), that metadata stands for it and
    nothing is trained again.

    Returns:
        ``(select.json's content, {adapter: the chosen adapter's training metadata})``;
        ``select.json`` holds the rule, the held-out ids, the base model's held-out score,
        every candidate's score (``candidates[rate][adapter]``), ``chosen`` (rates),
        ``chosen_by``, ``all_collapsed`` (every candidate's judge gave one reply to every
        judged answer; LoRA-Eval and LoRA-Both where chosen) and ``train_seconds`` of every
        candidate trained in this folder (also of an adapter chosen by an earlier call only).

    Raises:
        StageError: a pool too small to hold out ``select_holdout`` records and still train
            on ``train_batch_size`` (before any training).
    """
    sel = _Selection(tdir, handle, template, oracle, pool, negatives, config, log)
    base = sel.score(None, "base")
    scores: dict[float, dict[str, dict[str, Any]]] = {}
    for lr, name in selection_candidates(config)[1:]:
        scores.setdefault(lr, {})[name] = sel.score(lr, name)
    train, held, sets, sdir = sel.train, sel.held, sel.sets, sel.sdir
    trained = sel.trained
    chosen = choose_learning_rates(scores)
    metas = {}
    for name, ch in chosen.items():
        dst, lr, note = tdir / "adapters" / name, ch["lr"], sdir / "chosen" / f"{name}.json"
        kept = read_json(dst / "interp_adapter.json") if (
            (dst / "interp_adapter.json").exists()
            and (dst / "adapter_model.safetensors").exists()) else None
        if kept is None and note.exists() and not need_weights(name):
            kept = read_json(note)
        if kept is None or kept.get("config", {}).get("lr") != lr:
            kept = trained(lr, name)
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(sdir / f"lr_{lr:g}" / "adapters" / name, dst)
        metas[name] = kept
        write_json(note, kept)
    for name, items in sets.items():
        write_jsonl(tdir / "train_sets" / f"{name}.jsonl", items)
    result = {
        "rule": {a: list(m) for a, m in SELECTION_RULE.items()},
        "rule_text": "LoRA-Gen: held-out GA (own answers); LoRA-Eval: the judge's balanced "
                     "accuracy on each held-out record's gold answer and hard negative; "
                     "LoRA-Both: their mean; a judge giving one reply to all ranks last; "
                     "ties to the smaller rate",
        "n_train": len(train), "holdout_ids": [ex.id for ex in held], "base": base,
        "candidates": {f"{lr:g}": per for lr, per in scores.items()},
        "chosen": {a: ch["lr"] for a, ch in chosen.items()},
        "chosen_by": {a: ch["by"] for a, ch in chosen.items()},
        "all_collapsed": {a: all(scores[lr][a]["collapsed"] is True for lr in scores)
                          for a in ("lora_eval", "lora_both") if a in config.adapters},
        # every candidate trained here; kept from the last select.json when its weights are
        # gone (a saved state keeps no adapter)
        "train_seconds": {**(read_json(tdir / "select.json").get("train_seconds", {})
                             if (tdir / "select.json").exists() else {}),
                          **{p.parent.parent.parent.name + "/" + p.parent.name:
                             read_json(p).get("train_seconds")
                             for p in sorted(sdir.glob("lr_*/adapters/*/interp_adapter.json"))}},
    }
    write_json(tdir / "select.json", result)
    return result, metas
