"""Study 1 stage: run the harness into a run directory, resumably, and write ``metrics.json``.

Algorithm of :func:`run`:

0. Check the inputs before any model loads (:func:`check_inputs`): counts >= 1, the template,
   the oracle spec, and every dataset (names, files, fields; none may come out empty). A
   directory this call creates is removed again if it fails before the first record is kept
   (:func:`interp.core.inputs.new_run_dir`).
1. Open the run directory: create ``manifest.json``, or check that the existing one was made
   with the same :data:`KEY_FIELDS` and the same result-relevant runtime facts
   (:func:`interp.models.loading.result_facts`: attention kernel, device, dtype, torch/transformers
   versions, TF32 and determinism flags; another model, template, oracle, decoding or any of
   these is refused unless ``overwrite``), and that the model's fingerprint (``sha256``:
   weights, config and tokenizer files, :func:`interp.stages.common.check_run_model`) is the
   run's; list datasets accumulate over invocations. The manifest stores the full
   :func:`interp.models.loading.runtime_facts` as ``runtime`` and the token ids and strings of the
   two whole verdict replies every score compares (``model.verdict_replies``).
2. For each dataset: load the examples (first ``limit`` after filtering), skip those already
   in ``records.jsonl`` (resume; a larger ``limit`` only adds the new ones) unless the record
   is stale (:func:`stale_records`: its example's question, context or answers, or its
   generation prompt's length and spans, changed since; refused unless ``overwrite``, which
   drops and redoes them), and run
   :func:`interp.methods.asymmetry.evaluate_examples` on the rest in chunks of ``batch_size``,
   appending each chunk's records (flushed and fsynced) before the next; an interrupt
   (Ctrl-C, SIGTERM: :class:`interp.core.errors.Interrupted`) appends the records of the
   running chunk that finished before it (those whose judge batch ended): no finished record
   is lost, only the work of unfinished ones (the chunk's generations, if it stopped before
   the judging began, or the judge batch it stopped).
   With ``answers_from`` (cross-judging, :mod:`interp.methods.cross_judge`) the model judges the
   source run's answers instead (:func:`interp.methods.cross_judge.judge_from_source`): the source
   is checked in step 0, and a finished record whose source answer changed is stale too.
3. ``metrics.json`` (:func:`interp.methods.asymmetry.compute_metrics`) over every dataset run into
   the directory, and the asymmetry figure; a cross-judged run adds ``answer_sources``
   (:func:`interp.methods.cross_judge.source_metrics`).

A served model (``model = "openai:MODEL"``) runs the same harness on the replies of
:class:`interp.endpoints.study.ServedReplies` (:func:`_run_served`: no weights, so no one-pass
parts and no tokenizer check of stale records). With a shard (:mod:`interp.launch`) the steps
run on the shard's records into ``OUT/shards/I-of-N``, and under torchrun rank 0 merges the
shards (:mod:`interp.stages.merge`) once every process is done (:func:`run`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from interp.core.contract import stage_of
from interp.core.costs import CPU_S_PER_UNIT, SOURCE, format_cpu, wall_prior_s
from interp.core.errors import ConfigError, EndpointError, Interrupted, RunDirError, ShardError
from interp.core.inputs import new_run_dir
from interp.core.io import read_jsonl, write_json, write_jsonl
from interp.core.progress import Share, tqdm
from interp.data import DATASETS, QAExample
from interp.endpoints.cache import CACHE_FILE
from interp.endpoints.client import RequestFailed, is_endpoint_spec
from interp.endpoints.oracle import endpoint_for
from interp.endpoints.study import ServedReplies, oracle_facts, served_model_info
from interp.judging.grading import BaseOracle, RuleOracle, make_oracle, parse_oracle_spec
from interp.judging.prefill import Capture
from interp.judging.prompts import Template, get_template, render
from interp.judging.residual_features import POOLS
from interp.judging.verdict import verdict_replies
from interp.launch import Shard, assign, barrier, check_count, heartbeat, selection_sha256
from interp.methods.agreement import oracle_agreement as grade_agreement
from interp.methods.asymmetry import evaluate_examples, format_metrics, judge_records
from interp.methods.balanced import balanced_candidates
from interp.methods.cross_judge import (
    judge_from_source,
    load_answer_source,
)
from interp.models.loading import (
    ModelHandle,
    load_model,
    placement,
    result_facts,
    runtime_facts,
)
from interp.stages.common import check_run_model, stage_facts, stored_negatives
from interp.stages.configs.asymmetry import ASYMMETRY_KEY_FIELDS, AsymmetryConfig
from interp.stages.merge import merge_shards
from interp.stages.run_metrics import BALANCED_RECORDS, write_metrics
from interp.stages.stored import store_one_pass
from interp.store.records import Record, limit_per_dataset, qa_key
from interp.store.rundir import RunDir

__all__ = ["KEY_FIELDS", "AsymmetryConfig", "check_inputs", "format_oracle_agreement",
           "format_summary", "oracle_agreement", "run", "judge_balanced", "stale_records",
           "store_one_pass", "write_metrics"]

SPEC = stage_of(__name__)
"""This stage's declared contract (:data:`interp.core.contract.SPECS`)."""
KEY_FIELDS = ASYMMETRY_KEY_FIELDS
"""Config fields that must match to reuse a run directory (others may change freely)."""


def run(
    run_dir: RunDir | str | Path,
    handle: ModelHandle | None = None,
    cfg: AsymmetryConfig | None = None,
    *,
    overwrite: bool = False,
    log: Callable[[str], None] = print,
    chunk: int | None = None,
    shard: Shard | None = None,
) -> dict[str, Any] | None:
    """Run Study 1 into a run directory, resuming finished work; return metrics.json's content.

    The stage contract's signature (:mod:`interp.core.contract`), plus this process's
    ``shard`` (:mod:`interp.launch`: ``--shard I/N``, torchrun, a SLURM array). With one,
    only the shard's records are run, into ``run_dir/shards/I-of-N`` (an ordinary resumable
    run whose manifest says which records it owns; ``run_dir`` may not hold shards of another
    count); under torchrun every process then waits for the others
    (:func:`interp.launch.barrier`) and rank 0 merges them into ``run_dir``
    (:func:`interp.stages.merge.merge_shards`; the shards' writer locks are released by then).

    Args:
        run_dir: run directory (created when missing).
        handle: an already loaded model (None: ``cfg.model`` is loaded, after the checks).
        cfg: the run's configuration (None: the defaults).
        overwrite: discard a run directory made with another config.
        log: where progress lines go.
        chunk: examples per appended chunk of records (default ``chunk_batches *
            batch_size``; the examples of a chunk are sorted by prompt length into batches).
        shard: run only this shard's records (:func:`interp.launch.assign`).

    Returns:
        ``metrics.json`` of ``run_dir`` (unsharded, or torchrun's rank 0 after the merge);
        None for a process that only wrote its shard (the other ranks, and ``--shard`` /
        SLURM shards, which ``interp merge`` joins once all are finished).

    Raises:
        interp.core.errors.ConfigError: a count below 1 or an unknown oracle spec (before any
            model loads, as every error of :func:`check_inputs`).
        interp.core.errors.RunDirError: ``run_dir`` holds a run with another config or other
            result facts, or stale records (:func:`stale_records`), and not overwrite; or
            another process is writing it (:meth:`interp.store.rundir.RunDir.writer`).
        interp.core.errors.DataError: unknown dataset, malformed file.
        interp.core.errors.ShardError: a served model with a shard, ``run_dir`` holds shards
            of another count, or the merge is refused.
    """
    out = run_dir.path if isinstance(run_dir, RunDir) else Path(run_dir)
    if shard is None:
        return _run_process(out, handle, cfg, overwrite=overwrite, log=log, chunk=chunk)
    check_count(out, shard)
    heartbeat(out, shard)   # the others waiting at the barrier see this process is alive
    _run_process(out, handle, cfg, overwrite=overwrite, log=log, chunk=chunk, shard=shard)
    if not shard.joined:
        log(f"[shard {shard.name}] done in {shard.dir(out)}; when all {shard.count} are, "
            f"join them: interp merge {out / 'shards'}/*-of-{shard.count} --out {out}")
        return None
    barrier(shard, what=f"its records in {shard.dir(out)}")
    if shard.index != 0:
        return None
    return merge_shards([Shard(i, shard.count).dir(out) for i in range(shard.count)], out,
                        overwrite=overwrite, log=log)


def _run_process(out: Path, handle: ModelHandle | None, cfg: AsymmetryConfig | None, *,
                 overwrite: bool, log: Callable[[str], None], chunk: int | None,
                 shard: Shard | None = None) -> dict[str, Any]:
    """Steps 0-3 of the module docstring in this process: the whole run, or its shard's.

    A shard's run goes into ``out/shards/I-of-N`` and writes no ``metrics.json`` (``{}`` is
    returned: the merge writes it).
    """
    config = cfg or AsymmetryConfig()
    loaded = check_inputs(config)
    owned = None
    if shard is not None:
        if is_endpoint_spec(config.model):
            raise ShardError(f"a served model ({config.model}) is not sharded: run it in one "
                             f"process and raise [asymmetry.model_endpoint] concurrency")
        data_sha256 = selection_sha256(loaded)        # of the global selection
        loaded, positions, total = assign(loaded, shard)
        keys = ["/".join((ex.dataset, ex.id)) for exs in loaded.values() for ex in exs]
        owned = shard.provenance(keys, positions, total, data_sha256)
        out = shard.dir(out)
        config = replace(config, device=shard.device(config.device))
    if not overwrite:  # another model, template, ... is refused before the model loads
        RunDir(out).check_same_config(asdict(config), KEY_FIELDS)
    with new_run_dir(out), RunDir(out).writer():  # a second writer is refused here, at once
        n = sum(map(len, loaded.values()))
        cpu = CPU_S_PER_UNIT.get(config.model, {}).get("asymmetry")
        cost = "" if cpu is None else (f"; {format_cpu(n * cpu)} if none is done yet ({cpu:g} "
                                       f"CPU-s per record measured, {SOURCE})")
        log(f"Study 1: {config.model} answers and judges "
            f"{', '.join(f'{len(v)} {k}' for k, v in loaded.items())} records into {out} "
            f"(if interrupted, the same command resumes){cost}")
        if is_endpoint_spec(config.model):  # a served model: its replies, no internals
            return _run_served(config, RunDir(out), loaded, overwrite=overwrite, log=log,
                               chunk=chunk)
        return _run_local(config, RunDir(out), loaded, overwrite=overwrite, handle=handle,
                          log=log, chunk=chunk, shard=owned)


def check_inputs(config: AsymmetryConfig) -> dict[str, list[QAExample]]:
    """Step 0: check a config and load its examples, before any model is loaded.

    Returns:
        ``{dataset: examples}`` (:func:`interp.data.load_examples` with the config's split,
        limit and filter).

    Raises:
        interp.core.errors.ConfigError: a count below 1, no dataset, an unknown oracle spec
            (:func:`interp.judging.grading.parse_oracle_spec`: ``rule``, ``model:SPEC``,
            ``openai:MODEL``), a bad endpoint table, or an ``answers_from`` run made with
            another template or oracle.
        interp.core.errors.RunDirError: an ``answers_from`` run that lacks a selected example or
            holds another version of it (:func:`interp.judging.answer_source.check_answer_source`).
        interp.core.errors.PromptError: an unknown template.
        interp.core.errors.DataError: an unknown dataset, a missing or malformed file, a missing
            field, or a dataset with no examples left after filtering.
    """
    return config.check_inputs()


def _run_local(config: AsymmetryConfig, rd: RunDir, loaded: Mapping[str, list[QAExample]], *,
         overwrite: bool, handle: ModelHandle | None, log: Callable[[str], None],
         chunk: int | None, shard: dict[str, Any] | None = None) -> dict[str, Any]:
    """Steps 1-3 of :func:`run` (the module docstring) on checked inputs.

    ``shard``: the manifest's ``shard`` entry of a shard's run (:meth:`interp.launch.Shard.
    provenance`): stored, and no ``metrics.json`` is written (the merge writes it).
    """
    template = get_template(config.template, config.templates_path)
    served = None  # an endpoint oracle is preflighted before the model loads
    if is_endpoint_spec(config.oracle):
        served = make_oracle(config.oracle, run=rd, endpoint=config.endpoint_table("oracle"))
        served.endpoint.known_facts()  # type: ignore[attr-defined]  # cached: no request
    handle = handle or load_model(config.model, device=config.device, dtype=config.dtype,
                                  **placement(config))
    facts = runtime_facts(handle)
    if not overwrite and rd.manifest_path.exists():  # resuming with another checkpoint: refuse
        check_run_model(rd, handle)
    replies = verdict_replies(handle.tokenizer).to_record()  # the scored tokens, by name
    before = rd.manifest()["config"].get("datasets", []) if rd.manifest_path.exists() else []
    if added := [d for d in config.datasets if before and d not in before]:
        log(f"{rd.path} holds a run on {', '.join(before)}: adding {', '.join(added)} to it "
            f"(metrics.json will cover all of them; use another --out for a separate run)")
    manifest = rd.init_manifest(asdict(config), overwrite=overwrite,
                                model_info={**handle.info, "verdict_replies": replies},
                                key_fields=KEY_FIELDS, runtime=facts,
                                result_facts={**result_facts(facts), **oracle_facts(served)})
    if shard is not None:
        manifest["shard"] = shard
        write_json(rd.manifest_path, manifest)
        rd.path.mkdir(parents=True, exist_ok=True)
        rd.records_path.touch()  # a shard that owns no record is finished too
    # cross-judged: the source run's oracle labels, no oracle of its own
    oracle = None if config.answers_from else served or make_oracle(
        config.oracle, device=config.device, dtype=config.dtype, run_model=handle)
    facts = None
    # the stages' own checks: refuse their work made under other settings
    if config.one_pass and template.judge == "word":
        facts = stage_facts(rd, handle, "attention", overwrite=overwrite)
        stage_facts(rd, handle, "probe", overwrite=overwrite)
    finished = {qa_key(r): r for r in (rd.read_records(status=None)
                                           if rd.records_path.exists() else [])}
    source = load_answer_source(config.answers_from) if config.answers_from else None

    def stale(examples: Sequence[QAExample]) -> dict[tuple[str, str], str]:
        out = stale_records(finished, examples, handle.tokenizer, template)
        if source is not None:  # a judged answer the source has since replaced
            out.update({k: "its source answer changed" for k, r in finished.items()
                        if k not in out and r.get("status") == "ok"
                        and k in source.records and r.get("answer") != (
                            source.records[k].get("answer"))})
        return out

    def chunk_records(part: list[QAExample], bar: Any) -> tuple[list[Record], int, None]:
        # a reasoning judge's verdict position lies after its reasoning: no one-pass
        cap = Capture(rows=True, pools=POOLS) if config.one_pass and \
            template.judge == "word" else None
        kw = dict(template=template, max_new_tokens=config.max_new_tokens,
                  verdict_max_new_tokens=config.verdict_max_new_tokens,
                  batch_size=config.batch_size, capture=cap)
        with Share(bar, len(part), prompts_per_example=1 if source is not None else 2) as share:
            try:
                recs = (judge_from_source(handle, part, source, **kw) if source is not None
                        else evaluate_examples(
                            handle, part, oracle=oracle,
                            max_reasoning_tokens=config.max_reasoning_tokens, **kw))
            except Interrupted as exc:  # keep the chunk's finished records, then stop
                if isinstance(exc.done, list):
                    _keep(rd, handle, config, exc.done, cap, facts)
                raise
        kept = _keep(rd, handle, config, recs, cap, facts)
        share.done()
        return kept, 0, None

    _each_chunk(config, rd, loaded, finished, overwrite=overwrite, log=log, chunk=chunk,
                stale=stale, chunk_records=chunk_records,
                prior_s=wall_prior_s(handle.spec, "asymmetry", torch.get_num_threads()))
    if shard is not None:
        return {}
    # metrics.json describes the whole run directory: every dataset run into it
    every = manifest["config"].get("datasets", config.datasets)
    return write_metrics(rd, replace(config, datasets=list(every)))


def _run_served(config: AsymmetryConfig, rd: RunDir, loaded: Mapping[str, list[QAExample]], *,
                overwrite: bool, log: Callable[[str], None], chunk: int | None
                ) -> dict[str, Any]:
    """Steps 1-3 of :func:`run` for a served model (``model = "openai:MODEL"``).

    The same harness (:func:`interp.methods.asymmetry.evaluate_examples`) on the replies of
    :class:`interp.endpoints.study.ServedReplies`, one example per call, ``concurrency`` calls
    at a time (:meth:`interp.endpoints.client.Endpoint.map`; ``--concurrency``), the bar moving
    as each example finishes. A chunk (at least ``concurrency`` examples) is appended in the
    examples' order, whichever finished first, so the records equal a one-at-a-time run's on
    the same replies. Examples whose requests failed are left undone (a rerun does them); the
    run stops with one line past ``max_error_rate`` or at a refused request, after appending
    every finished record.

    Raises:
        interp.core.errors.EndpointError: the preflight fails (before any local oracle model
            loads), or the failures pass ``max_error_rate`` (finished records kept).
        interp.core.errors.RunDirError: another config or server, or stale records.
    """
    template = get_template(config.template, config.templates_path)
    endpoint = endpoint_for(config.model, config.endpoint_table("model"), rd,
                            "asymmetry.model_endpoint")
    source = ServedReplies(endpoint)
    finished = {qa_key(r): r for r in (rd.read_records(status=None)
                                           if rd.records_path.exists() else [])}
    todo_all = [ex for exs in loaded.values() for ex in exs
                if (ex.dataset, ex.id) not in finished]
    facts = endpoint.result_facts() if todo_all or not rd.manifest_path.exists() else None
    oracle = make_oracle(config.oracle, device=config.device, dtype=config.dtype, run=rd,
                         endpoint=config.endpoint_table("oracle"),
                         served={endpoint.spec: endpoint})
    if facts is not None:
        facts = {**facts, **oracle_facts(oracle)}
    manifest = rd.init_manifest(
        asdict(config), model_info=served_model_info(endpoint) if facts else
        {"spec": endpoint.spec, "source": "openai-endpoint"}, overwrite=overwrite,
        key_fields=KEY_FIELDS, runtime=facts, result_facts=facts)
    kw = dict(template=template, oracle=oracle, max_new_tokens=config.max_new_tokens,
              verdict_max_new_tokens=config.verdict_max_new_tokens,
              max_reasoning_tokens=config.max_reasoning_tokens)

    def chunk_records(part: list[QAExample], bar: Any
                 ) -> tuple[list[Record], int, EndpointError | None]:
        got = endpoint.map(lambda ex: evaluate_examples(source, [ex], **kw)[0], part,
                           done=lambda: bar.update(1))
        recs = [{**r, "template": config.template} for r in got if isinstance(r, dict)]
        rd.append_records(recs)
        errs = [r for r in got if not isinstance(r, dict)]
        return recs, sum(isinstance(e, RequestFailed) for e in errs), next(
            (e for e in errs if isinstance(e, EndpointError)), None)

    # a chunk holds at least one example per request in flight: none waits for a chunk's tail
    chunk = chunk or max(config.chunk_batches * config.batch_size, endpoint.config.concurrency)
    _each_chunk(config, rd, loaded, finished, overwrite=overwrite, log=log, chunk=chunk,
                stale=lambda examples: stale_records(finished, examples, None, template),
                chunk_records=chunk_records)
    log(f"requests: {endpoint.requests} sent, {endpoint.cache.hits} served from "
        f"{rd.path / CACHE_FILE}, {endpoint.failed} failed")
    every = manifest["config"].get("datasets", config.datasets)
    return write_metrics(rd, replace(config, datasets=list(every)))


def _each_chunk(config: AsymmetryConfig, rd: RunDir, loaded: Mapping[str, list[QAExample]],
                finished: Mapping[tuple[str, str], Mapping[str, Any]], *, overwrite: bool,
                log: Callable[[str], None], chunk: int | None,
                stale: Callable[[Sequence[QAExample]], Mapping[tuple[str, str], str]],
                chunk_records: Callable[[list[QAExample], Any],
                                   tuple[list[Record], int, Exception | None]],
                prior_s: float | None = None) -> None:
    """Step 2 of the module docstring for any model: per dataset, the records left, by chunk.

    Stale records are dropped and redone (refused unless ``overwrite``); each chunk of the
    rest goes to ``chunk_records(part, bar)``, which appends its finished records and returns
    them, how many examples were left undone after failed requests, and an error that stops
    the run (raised after the chunk's records are kept).
    """
    done = set(finished)
    chunk = chunk or config.chunk_batches * config.batch_size
    for ds in config.datasets:
        examples = loaded[ds]
        done -= rd.redo_stale(dict(stale(examples)), ds, overwrite=overwrite)
        todo = [ex for ex in examples if (ex.dataset, ex.id) not in done]
        log(f"[{ds}] {len(examples)} examples, {len(examples) - len(todo)} already done")
        t0, failed = time.perf_counter(), 0
        bar = tqdm(total=len(todo), desc=ds, unit="ex", disable=not todo, prior_s=prior_s)
        for s in range(0, len(todo), chunk):
            recs, n_failed, stop = chunk_records(todo[s:s + chunk], bar)
            done.update(qa_key(r) for r in recs)
            failed += n_failed
            for r in recs:
                if r["status"] != "ok":
                    log(f"[{ds}] {r['status'].replace('_', ' ')} {r['id']}: {r['reason']}")
            if stop is not None:
                bar.close()
                raise stop
        bar.close()
        if todo:
            dt = time.perf_counter() - t0
            log(f"[{ds}] {len(todo) - failed} examples in {dt:.1f} s "
                f"({60 * len(todo) / dt:.1f} examples/minute); {failed} left undone after "
                f"failed requests (run again to do them)" if failed else
                f"[{ds}] {len(todo)} examples in {dt:.1f} s "
                f"({60 * len(todo) / dt:.1f} examples/minute)")


def _keep(rd: RunDir, handle: ModelHandle, config: AsymmetryConfig,
          recs: Sequence[Record | None], cap: Capture | None,
          facts: Mapping[str, Any] | None) -> list[Record]:
    """Step 2's append of one chunk's finished records (None: not finished) and their pass."""
    for r in recs:
        if r is not None:
            r["template"] = config.template
            r.setdefault("model", handle.spec)
    if cap is not None:  # before the records: a kill in between redoes the records,
        store_one_pass(rd, handle, recs, cap, facts)  # whose outputs are then replaced
    kept = [r for r in recs if r is not None]
    rd.append_records(kept)
    return kept


def judge_balanced(rd: RunDir, config: AsymmetryConfig, *, handle: ModelHandle | None = None,
                   log: Callable[[str], None] = print, chunk: int = 8) -> int:
    """Judge the run's balanced judge set, resumably (``interp metrics --balanced``).

    For each ``ok`` record with a gold answer, the run's judge (its model and template) scores
    the gold answer and one wrong answer: the record's mined hard negative
    (:func:`interp.stages.common.stored_negatives`), else its own answer when the oracle graded
    it Incorrect (:func:`interp.methods.balanced.balanced_candidates`). Cost: two judge passes
    (a verdict decode and the whole-reply score) per kept record, about twice the judge's share
    of the run. Candidates are appended per chunk to :data:`interp.stages.run_metrics.
    BALANCED_RECORDS` (its first line the set's counts); a rerun judges only the rest, and a
    candidate that changed (another hard negative) is judged again. Nothing is mined here: a
    record with no hard negative and a right answer is left out and counted.

    Returns:
        How many candidates were judged now.

    Raises:
        RunDirError: a cross-judged run (its judge scores another model's answers; judge the
            source run instead).
    """
    if config.answers_from:
        raise RunDirError(f"{rd.path} is cross-judged (answers from {config.answers_from}); "
                          f"run `interp metrics --balanced` on the source run")
    names = {d for d in config.datasets}
    records = [r for r in rd.read_records() if r["dataset"] in names or not (
        names & set(DATASETS))]
    cands, counts = [], {}
    for ds in sorted({r["dataset"] for r in records}):
        mine = [r for r in records if r["dataset"] == ds]
        c, counts[ds] = balanced_candidates(mine, stored_negatives(rd.path, mine))
        cands += c
    path = rd.path / BALANCED_RECORDS
    key = lambda r: (r["dataset"], str(r["id"]), r["balanced_role"], r["answer"])  # noqa: E731
    old = [r for r in read_jsonl(path) if r.get("balanced_role")] if path.is_file() else []
    wanted = {key(c) for c in cands}
    kept = [r for r in old if key(r) in wanted]  # a changed candidate is judged again
    done = {key(r) for r in kept}
    write_jsonl(path, [{"counts": counts}, *kept])
    todo = [c for c in cands if key(c) not in done]
    log(f"[balanced] {counts and sum(c['n_pairs'] for c in counts.values())} records with a "
        f"gold and a wrong answer: {len(todo)} of {len(cands)} candidates to judge")
    if not todo:
        return 0
    template = get_template(config.template, config.templates_path)
    handle = handle or load_model(config.model, device=config.device, dtype=config.dtype,
                                  **placement(config))
    check_run_model(rd, handle)
    bar = tqdm(total=len(todo), desc="balanced", unit="answer")
    for s in range(0, len(todo), chunk):
        part = todo[s:s + chunk]
        judged, _ = judge_records(handle, part, template=template,
                                  verdict_max_new_tokens=config.verdict_max_new_tokens,
                                  max_reasoning_tokens=config.max_reasoning_tokens,
                                  batch_size=config.batch_size)
        rows = [{**{k: v for k, v in j.items() if k != "prompts"},
                 "balanced_role": src["balanced_role"],
                 "negative_source": src["negative_source"]}
                for src, j in zip(part, judged)]
        with path.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
            f.flush()
            os.fsync(f.fileno())
        bar.update(len(part))
    bar.close()
    return len(todo)


def _limit(config: AsymmetryConfig, dataset: str) -> int | None:
    """The ``limit`` of one dataset (an int applies to every dataset)."""
    if isinstance(config.limit, Mapping):
        return config.limit.get(dataset)
    return config.limit


def stale_records(finished: Mapping[tuple[str, str], Mapping[str, Any]],
                  examples: Sequence[QAExample], tokenizer: Any, template: Template
                  ) -> dict[tuple[str, str], str]:
    """Finished records whose source changed since they were made: ``{key: what changed}``.

    A record is keyed by (dataset, id); it is stale when the example now loaded under that key
    has another question, context or answers, or (``ok`` records) when its generation prompt
    now renders to another length or other token spans (a new tokenizer or template text;
    not checked with ``tokenizer=None``, a served model's run).
    """
    out = {}
    for ex in examples:
        rec = finished.get((ex.dataset, ex.id))
        if rec is None:
            continue
        for k, now in (("question", ex.question), ("context", ex.context),
                       ("answers", list(ex.answers))):
            if rec.get(k) != now:
                out[(ex.dataset, ex.id)] = f"its {k} changed"
                break
        else:
            if tokenizer is not None and rec.get("status") == "ok" and (
                    rec.get("prompts") or {}).get("gen") != render(
                    tokenizer, template, "gen", context=ex.context, question=ex.question,
                    reference=ex.answers[0] if ex.answers else "").to_record():
                out[(ex.dataset, ex.id)] = "its generation prompt renders differently"
    return out


def oracle_agreement(run: RunDir, oracle: str | BaseOracle, *, limit: int | None = None,
                     device: str | None = None, endpoint: Mapping[str, Any] | None = None
                     ) -> dict[str, Any]:
    """Agreement of the rule oracle and an LLM oracle on a run's records.

    Both oracles grade every ok record's extracted answer (:func:`interp.judging.grading.
    oracle_agreement`: Cohen's kappa, the confusion table, every disagreement); the result
    is written to ``DIR/oracle_agreement.json``.

    Args:
        run: an asymmetry run directory.
        oracle: ``"model:SPEC"``, ``"openai:MODEL"`` (its requests cached in the run
            directory, so a rerun makes none) or an oracle object (side ``b``; the rule
            oracle is ``a``).
        limit: the first N ok records per dataset (None: all).
        device: where to load the oracle model.
        endpoint: an ``openai:`` oracle's table (:class:`interp.endpoints.EndpointConfig`).

    Returns:
        The written dict: :func:`interp.methods.agreement.oracle_agreement`'s keys plus ``run``,
        ``stored_oracle`` (the run's own oracle) and ``oracle_b_counts`` (how often the LLM
        oracle's reply decided and how often its forced choice did, when it counts them).

    Raises:
        ConfigError: ``oracle`` is ``rule`` or not an oracle spec
            (:func:`interp.judging.grading.parse_oracle_spec`).
        RunDirError: the run has no ok records (before any model is loaded).
    """
    if isinstance(oracle, str) and parse_oracle_spec(oracle).kind == "rule":
        raise ConfigError(f"--oracle must be model:SPEC or openai:MODEL (the rule oracle is "
                          f"the other side), not {oracle!r}")
    records = limit_per_dataset(run.read_records(), limit)
    if not records:
        raise RunDirError(f"{run.path} has no ok records to grade; run `interp asymmetry` first")
    other = make_oracle(oracle, device=device, run=run, endpoint=endpoint) \
        if isinstance(oracle, str) else oracle
    res = grade_agreement(records, RuleOracle(), other, max_examples=len(records))
    res = {"run": str(run.path),
           "stored_oracle": run.manifest().get("config", {}).get("oracle"), **res,
           "oracle_b_counts": getattr(other, "counts", None)}
    write_json(run.path / "oracle_agreement.json", res)
    return res


def format_oracle_agreement(res: Mapping[str, Any]) -> str:
    """Kappa, raw agreement and the confusion table of :func:`oracle_agreement` as text."""
    c = res["confusion"]
    return "\n".join([
        f"{res['oracle_a']} vs {res['oracle_b']} on {res['n']} records: agreement "
        f"{res['agreement']:.3f}, Cohen's kappa {res['kappa']:.3f}"
        + (f" ({res['kappa_note']})" if res.get("kappa_note") else ""),
        f"{'':>18}{'b Correct':>11}{'b Incorrect':>13}",
        f"{'a (rule) Correct':>18}{c['a_correct_b_correct']:>11}{c['a_correct_b_incorrect']:>13}",
        f"{'a (rule) Incorr.':>18}{c['a_incorrect_b_correct']:>11}"
        f"{c['a_incorrect_b_incorrect']:>13}",
        f"{res['n_disagreements']} disagreements; LLM oracle decided by: "
        f"{res.get('oracle_b_counts')}"])


format_summary = format_metrics
"""The stage's summary as text (:func:`interp.methods.asymmetry.format_metrics`)."""
