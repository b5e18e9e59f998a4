"""Study 1 (paper section 3.1) of a model served behind a chat endpoint (``--model openai:M``).

The same algorithm as :func:`interp.methods.asymmetry.evaluate_examples`, with the model's replies
from the endpoint instead of local forwards, per example (c, q, a*):

1. T_gen: the generation prompt's chat messages (:func:`interp.judging.prompts.chat_messages`; the
   server applies its own chat template) at ``temperature = 0``, at most ``max_new_tokens``
   tokens, stopped at the first newline (the local harness stops at a newline after the
   answer's first non-blank text); the answer is :func:`interp.judging.grading.extract_answer` of
   it.
2. Oracle: ``y* = L*(c, q, a, a*)``, any oracle of :func:`interp.judging.grading.make_oracle` (rule,
   a local model, another endpoint).
3. T_eval: the evaluation prompt with the model's own answer as candidate, at most
   ``verdict_max_new_tokens`` tokens; the verdict is
   :func:`interp.methods.asymmetry.parse_record_verdict` of the reply. Where the server scores whole
   replies (:func:`interp.endpoints.scoring.score_replies`) the record gets
   ``logprob_correct``, ``logprob_incorrect``, ``logit_diff``, ``p_correct`` and
   ``verdict_coverage`` exactly as in-process (:class:`interp.judging.verdict.VerdictScores`);
   otherwise none of them and ``verdict_score: "unavailable"``, so ``EA_forced`` is reported
   as unavailable, never as 0 (:func:`interp.methods.asymmetry.group_metrics`).

Records carry no ``prompts`` (no tokens are seen), so the stages that read a model's
internals refuse such a run (:func:`interp.stages.common.load_run_model`). Every request goes
through the run directory's cache (:mod:`interp.endpoints.cache`): a rerun or a resumed run
makes no request twice. Examples whose requests failed are left undone (a rerun does them);
the run stops with one line past ``max_error_rate``, after appending every finished record.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

import torch

from interp.core.errors import EndpointError
from interp.core.progress import tqdm
from interp.data import QAExample
from interp.endpoints.cache import CACHE_FILE
from interp.endpoints.client import Endpoint, RequestFailed
from interp.endpoints.oracle import endpoint_for
from interp.endpoints.scoring import score_replies
from interp.judging.grading import BaseOracle, extract_answer, make_oracle
from interp.judging.prompts import Template, chat_messages, get_template
from interp.judging.verdict import VerdictScores
from interp.methods.asymmetry import _example_fields, parse_record_verdict
from interp.store.records import Record, qa_key
from interp.store.rundir import RunDir

__all__ = ["evaluate_served", "oracle_facts", "prompt_version", "run_served",
           "served_model_info"]


def prompt_version(template: Template) -> str:
    """The template's version in the request cache's keys: its name and a digest of its text."""
    text = "\x1f".join((template.gen_system, template.gen_user, template.eval_system,
                        template.eval_user))
    return f"{template.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def first_line(text: str) -> str:
    """``text`` up to and including its first newline after the first non-blank character.

    The generation stop rule of the in-process harness (:func:`interp.judging.prefill.run_prompts`,
    a newline stop checked on the left-stripped text), applied to a served reply
    that was generated without a server-side stop: leading blank lines are kept and skipped,
    as there.
    """
    lead = len(text) - len(text.lstrip())
    cut = text.find("\n", lead)
    return text if cut < 0 else text[:cut + 1]


def served_model_info(endpoint: Endpoint) -> dict[str, Any]:
    """The manifest's ``model`` entry of a served model (no key)."""
    return {"spec": endpoint.spec, "source": "openai-endpoint", "path": endpoint.base_url,
            "sha256": None, "revision": None, "endpoint": endpoint.config.public(),
            "server": endpoint.known_facts()}


def evaluate_served(endpoint: Endpoint, ex: QAExample, *, template: Template,
                    oracle: BaseOracle, max_new_tokens: int = 48,
                    verdict_max_new_tokens: int = 12) -> Record:
    """Steps 1-3 of the module algorithm for one example; its ``ok`` record.

    Raises:
        interp.endpoints.client.RequestFailed: a request failed after its retries.
        interp.core.errors.EndpointError: as :meth:`interp.endpoints.client.Endpoint.chat`.
    """
    pv = prompt_version(template)
    ref = ex.answers[0] if ex.answers else ""
    gen = chat_messages(template, "gen", context=ex.context, question=ex.question,
                        reference=ref)
    # the in-process stop rule (interp.judging.prefill): a newline ends the answer only after its
    # first non-blank text; a server's stop=["\n"] would cut "\nParis\n" to ""
    raw = first_line(endpoint.chat(gen, prompt_version=pv, max_tokens=max_new_tokens
                                   )["content"] or "")
    answer = extract_answer(raw)
    graded = oracle.grade(answer, ex.answers, dataset=ex.dataset, answerable=ex.answerable,
                          extras={**ex.extras, "context": ex.context, "question": ex.question})
    ev = chat_messages(template, "eval", context=ex.context, question=ex.question,
                       answer=answer, reference=ref)
    verdict_text = endpoint.chat(ev, prompt_version=pv,
                                 max_tokens=verdict_max_new_tokens)["content"]
    verdict, source = parse_record_verdict(verdict_text, answer)
    sc = score_replies(endpoint, ev, prompt_version=pv)
    scores: dict[str, Any]
    if sc is None or "unavailable" in sc:  # no method, or values that are not log-probs
        scores = {"verdict_score": "unavailable"}
        if sc is not None:
            scores["verdict_score_reason"] = sc["unavailable"]
    else:
        scores = VerdictScores(torch.tensor([sc["logprob_correct"]], dtype=torch.float64),
                               torch.tensor([sc["logprob_incorrect"]], dtype=torch.float64)
                               ).rows()[0]
    return {  # type: ignore[typeddict-item]
        **_example_fields(ex), "status": "ok", "model": endpoint.spec, "generation": raw,
        "answer": answer, "oracle_label": bool(graded.label),
        "oracle": {"name": oracle.name, "em": graded.em, "f1": graded.f1, "rule": graded.rule},
        "verdict": verdict, "verdict_source": source, "verdict_text": verdict_text, **scores,
    }


def run_served(config: Any, rd: RunDir, loaded: Mapping[str, list[QAExample]], *,
               overwrite: bool, log: Callable[[str], None], chunk: int | None,
               key_fields: Sequence[str], stale: Callable[..., Mapping[Any, str]],
               finish: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """Steps 1-3 of :func:`interp.stages.asymmetry.run` for ``model = "openai:MODEL"``.

    Args:
        config: the :class:`interp.stages.asymmetry.AsymmetryConfig`.
        rd: the run directory.
        loaded: the checked examples per dataset.
        overwrite: as the stage's.
        log: progress lines.
        chunk: examples per appended chunk.
        key_fields: the stage's config fields that must match a stored run.
        stale: the stage's check of finished records against their examples
            (:func:`interp.stages.asymmetry.stale_records`, called with no tokenizer).
        finish: writes ``metrics.json`` (:func:`interp.stages.asymmetry.write_metrics`).

    Returns:
        ``metrics.json``'s content (:func:`interp.stages.asymmetry.write_metrics`).

    Raises:
        interp.core.errors.EndpointError: the preflight fails (before any local oracle model
            loads), or the failures pass ``max_error_rate`` (finished records kept).
        interp.core.errors.RunDirError: another config or server, or stale records.
    """
    template = get_template(config.template, config.templates_path)
    endpoint = endpoint_for(config.model, config.endpoint_table("model"), rd,
                            "asymmetry.model_endpoint")
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
        key_fields=key_fields, runtime=facts, result_facts=facts)
    done = set(finished)
    chunk = chunk or config.chunk_batches * config.batch_size
    for ds in config.datasets:
        examples = loaded[ds]
        done -= rd.redo_stale(stale(finished, examples, None, template), ds,
                              overwrite=overwrite)
        todo = [ex for ex in examples if (ex.dataset, ex.id) not in done]
        log(f"[{ds}] {len(examples)} examples, {len(examples) - len(todo)} already done")
        t0, failed = time.perf_counter(), 0
        bar = tqdm(total=len(todo), desc=ds, unit="ex", disable=not todo)
        for s in range(0, len(todo), chunk):
            part = todo[s:s + chunk]
            got = endpoint.map(lambda ex: evaluate_served(
                endpoint, ex, template=template, oracle=oracle,
                max_new_tokens=config.max_new_tokens,
                verdict_max_new_tokens=config.verdict_max_new_tokens), part)
            recs = [{**r, "template": config.template} for r in got if isinstance(r, dict)]
            rd.append_records(recs)
            done.update(qa_key(r) for r in recs)
            bar.update(len(part))
            errs = [r for r in got if not isinstance(r, dict)]
            failed += sum(isinstance(e, RequestFailed) for e in errs)
            if stop := next((e for e in errs if isinstance(e, EndpointError)), None):
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
    log(f"requests: {endpoint.requests} sent, {endpoint.cache.hits} served from "
        f"{rd.path / CACHE_FILE}, {endpoint.failed} failed")
    every = manifest["config"].get("datasets", config.datasets)
    return finish(rd, replace(config, datasets=list(every)))


def oracle_facts(oracle: BaseOracle) -> dict[str, Any]:
    """Result facts of a served oracle (``oracle_*``), empty for any other oracle."""
    ep = getattr(oracle, "endpoint", None)
    return {f"oracle_{k}": v for k, v in ep.result_facts().items()} if ep is not None else {}
