"""Study 1 (paper section 3.1): generation accuracy vs self-evaluation accuracy.

Algorithm, per example (c, q, a*):

1. T_gen: render the generation prompt and greedy-decode the answer ``a = L(c, q)``; extract
   the answer string (:func:`interp.grading.extract_answer`).
2. Oracle: ``y* = L*(c, q, a, a*)`` in {Correct, Incorrect} (rule oracle by default,
   :class:`interp.grading.RuleOracle`; or an LLM oracle, :class:`interp.grading.ModelOracle`).
3. T_eval: render the evaluation prompt with the model's OWN answer as candidate and
   greedy-decode the verdict; ``verdict`` is the parsed text (:func:`parse_verdict`, None when
   neither word) and ``p_correct`` the probability of the first token of "Correct" against
   "Incorrect" at the verdict position (the prompt's last position).
4. Metrics over the same examples: ``GA = P(y* = Correct)``, ``EA = P(y = y*)`` (an
   unparseable verdict counts as wrong and is reported apart), ``delta = EA - GA`` with paired
   bootstrap 95% CIs; acceptance rates on oracle-correct and oracle-incorrect answers (the
   acquiescence bias), McNemar's exact test of gen-correct vs eval-correct, and the ROC AUC of
   ``p_correct`` against y*.

This module holds the method (examples and records in, records and numbers out); the run
directory work (resume, manifest, ``metrics.json``) is :mod:`interp.stages.asymmetry`. Record
fields: :class:`interp.store.Record`. :func:`rerender` renders a record's prompts again for the
later studies and checks them against the stored spans.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from interp.data import QAExample
from interp.errors import ConfigError, PromptError, RunDirError
from interp.generation import generate, verdict_scores
from interp.grading import BaseOracle, ModelOracle, RuleOracle, extract_answer, parse_verdict
from interp.models import ModelHandle, load_model
from interp.prompts import RenderedPrompt, Template, get_template, render, verdict_token_ids
from interp.stats import mcnemar, percentile_ci, resample_indices, roc_auc, wilson_ci
from interp.store import Record

__all__ = ["compute_metrics", "evaluate_examples", "format_metrics", "group_metrics",
           "make_oracle", "record_prompts", "rerender"]


def make_oracle(spec: str, *, template: Template | None = None, device: str | None = None,
                handle: ModelHandle | None = None) -> BaseOracle:
    """The oracle named by ``spec``: ``"rule"`` or ``"model:SPEC"``.

    Raises:
        ConfigError: any other spec.
    """
    if spec == "rule":
        return RuleOracle()
    if spec.startswith("model:"):
        return ModelOracle(handle or load_model(spec.removeprefix("model:"), device=device))
    raise ConfigError(f"unknown oracle {spec!r}: use 'rule' or 'model:SPEC'")


def _example_fields(ex: QAExample) -> dict[str, Any]:
    return {"id": ex.id, "dataset": ex.dataset, "split": ex.split, "question": ex.question,
            "context": ex.context, "answers": list(ex.answers), "answerable": ex.answerable}


def _skipped(ex: QAExample, reason: str) -> Record:
    return {**_example_fields(ex), "status": "skipped", "reason": reason}  # type: ignore[typeddict-item]


def _render(handle: ModelHandle, template: Template, task: str, ex: QAExample,
            answer: str | None = None) -> RenderedPrompt:
    return render(handle.tokenizer, template, task, context=ex.context, question=ex.question,
                  answer=answer, reference=ex.answers[0] if ex.answers else "")


def evaluate_examples(
    handle: ModelHandle,
    examples: Sequence[QAExample],
    *,
    template: Template,
    oracle: BaseOracle,
    max_new_tokens: int = 48,
    verdict_max_new_tokens: int = 12,
    batch_size: int = 8,
    candidates: Sequence[str] | None = None,
) -> list[Record]:
    """Run steps 1-3 of the module algorithm on a list of examples; return their records.

    Args:
        handle: the model that generates AND judges (self-evaluation).
        examples: the examples.
        template: prompt variant.
        oracle: grades generated answers (step 2).
        max_new_tokens: answer length cap (tokens).
        verdict_max_new_tokens: verdict length cap (tokens).
        batch_size: prompts per forward.
        candidates: when given, judge these answers instead of the model's own (used by the
            transfer and patching studies; GA then describes the candidates).

    Returns:
        One :class:`interp.store.Record` per example (``status`` ``"ok"``, or ``"skipped"``
        with a ``reason`` when a prompt does not fit the model's context).
    """
    ids = verdict_token_ids(handle.tokenizer)  # refuses a tokenizer without two verdicts first
    room = handle.max_positions
    records: list[Record | None] = [None] * len(examples)
    gen_prompts: dict[int, RenderedPrompt] = {}
    for k, ex in enumerate(examples):
        try:
            p = _render(handle, template, "gen", ex)
        except PromptError as err:
            records[k] = _skipped(ex, str(err))
            continue
        if len(p) + max_new_tokens > room:
            records[k] = _skipped(ex, f"generation prompt has {len(p)} tokens; with "
                                      f"{max_new_tokens} new tokens it exceeds the model's "
                                      f"{room} positions")
            continue
        gen_prompts[k] = p
    if candidates is None:
        gens = generate(handle, [p.input_ids for p in gen_prompts.values()],
                        batch_size=batch_size, max_new_tokens=max_new_tokens)
        raw = {k: g.text for k, g in zip(gen_prompts, gens)}
        answers = {k: extract_answer(t) for k, t in raw.items()}
    else:
        raw = answers = {k: candidates[k] for k in gen_prompts}
    eval_prompts: dict[int, RenderedPrompt] = {}
    for k in gen_prompts:
        try:
            ep = _render(handle, template, "eval", examples[k], answers[k])
        except PromptError as err:
            records[k] = _skipped(examples[k], str(err))
            continue
        if len(ep) + verdict_max_new_tokens > room:
            records[k] = _skipped(examples[k], f"evaluation prompt has {len(ep)} tokens; it "
                                               f"exceeds the model's {room} positions")
            continue
        eval_prompts[k] = ep
    verdicts = generate(handle, [ep.input_ids for ep in eval_prompts.values()],
                        batch_size=batch_size, max_new_tokens=verdict_max_new_tokens,
                        keep_first_logits=True)
    for (k, ep), v in zip(eval_prompts.items(), verdicts):
        records[k] = _ok_record(handle, examples[k], oracle, raw[k], answers[k], v,
                                gen_prompts[k], ep, ids)
    return records  # type: ignore[return-value]


def _ok_record(handle: ModelHandle, ex: QAExample, oracle: BaseOracle, raw: str, answer: str,
               verdict: Any, gp: RenderedPrompt, ep: RenderedPrompt,
               ids: tuple[int, int]) -> Record:
    """Step 2 (grade) and the record of one fully evaluated example."""
    graded = oracle.grade(answer, ex.answers, dataset=ex.dataset, answerable=ex.answerable,
                          extras={**ex.extras, "context": ex.context, "question": ex.question})
    diff, p_correct = verdict_scores(verdict.first_logits, *ids)
    return {  # type: ignore[typeddict-item]
        **_example_fields(ex), "status": "ok", "model": handle.spec,
        "generation": raw, "answer": answer,
        "oracle_label": bool(graded.label),
        "oracle": {"name": oracle.name, "em": graded.em, "f1": graded.f1, "rule": graded.rule},
        "verdict": parse_verdict(verdict.text), "verdict_text": verdict.text,
        "p_correct": p_correct, "logit_diff": diff,
        "prompts": {"gen": gp.to_record(), "eval": ep.to_record()},
    }


# ---------------------------------------------------------------------------------------------
# Records -> prompts (for the studies that read a run)
# ---------------------------------------------------------------------------------------------


def rerender(record: Record | Mapping[str, Any], task: str, tokenizer: Any, *,
             templates_path: str | None = None) -> RenderedPrompt:
    """Render a record's ``task`` prompt again, exactly as the harness did, and check it.

    The eval prompt's candidate is the record's extracted ``answer``; the reference (templates
    with ``{reference}``) is the first gold answer, as in :func:`evaluate_examples`.

    Args:
        record: an ``ok`` record of ``records.jsonl``.
        task: ``"gen"`` or ``"eval"``.
        tokenizer: the model's tokenizer.
        templates_path: the run's template file (manifest ``config.templates_path``; None for
            the bundled templates).

    Returns:
        The :class:`interp.prompts.RenderedPrompt`.

    Raises:
        RunDirError: the record lacks a field or its ``prompts.{task}``, its prompt cannot be
            rendered, or the token spans / length differ from the stored ones (the run was made
            with another tokenizer, template or template file); the message names the record.
    """
    rid = f"{record.get('dataset')}/{record.get('id')}"
    stored = (record.get("prompts") or {}).get(task)
    if not stored:
        raise RunDirError(f"record {rid} has no prompts.{task} (not an ok asymmetry record?); "
                          f"re-run `interp asymmetry`")
    try:
        tpl = get_template(record.get("template") or "default", templates_path)
        answers = record.get("answers") or []
        rp = render(tokenizer, tpl, task, context=record["context"], question=record["question"],
                    answer=record["answer"] if task == "eval" else None,
                    reference=answers[0] if answers else "")
    except KeyError as err:
        raise RunDirError(f"record {rid} lacks the field {err}") from err
    except PromptError as err:
        raise RunDirError(f"record {rid}: cannot render its {task} prompt ({err})") from err
    mine = {k: list(v) for k, v in rp.token_spans.items()}
    theirs = {k: list(v) for k, v in stored["token_spans"].items()}
    if mine != theirs or len(rp) != stored["n_tokens"]:
        raise RunDirError(
            f"record {rid}: the re-rendered {task} prompt ({len(rp)} tokens, spans {mine}) does "
            f"not match the record ({stored['n_tokens']} tokens, spans {theirs}); the run was "
            f"made with another tokenizer, template {record.get('template')!r} or template file")
    return rp


def record_prompts(record: Record | Mapping[str, Any], tokenizer: Any, *,
                   templates_path: str | None = None) -> dict[str, RenderedPrompt]:
    """Both prompts of a record, ``{"gen": ..., "eval": ...}`` (:func:`rerender` each).

    Raises:
        RunDirError: as :func:`rerender`.
    """
    return {t: rerender(record, t, tokenizer, templates_path=templates_path)
            for t in ("gen", "eval")}


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def group_metrics(records: Sequence[Record] | Sequence[Mapping[str, Any]], *, n_boot: int = 2000,
                  seed: int = 0) -> dict[str, Any]:
    """GA, EA, Delta and the judge's diagnostics over one group of ``ok`` records.

    Args:
        records: records with ``oracle_label`` (bool), ``verdict`` (bool or None) and
            ``p_correct`` (float).
        n_boot: paired bootstrap resamples (examples resampled with replacement; GA, EA and
            Delta computed on the same resample, :mod:`interp.stats`).
        seed: bootstrap seed.

    Returns:
        ``n``, ``GA``, ``EA``, ``delta`` and ``*_ci`` (95% percentile intervals),
        ``acceptance_rate_correct`` = P(verdict Correct | y* Correct) and
        ``acceptance_rate_incorrect`` = P(verdict Correct | y* Incorrect) with Wilson CIs,
        ``invalid_verdicts``, ``mcnemar`` ({``b``: gen right & judge wrong, ``c``: gen wrong &
        judge right, ``p_value``: exact binomial}), ``auc_p_correct`` (None with one class).
    """
    n = len(records)
    if n == 0:
        return {"n": 0}
    y = np.array([bool(r["oracle_label"]) for r in records])
    v = [r["verdict"] for r in records]
    accepted = np.array([x is True for x in v])
    right = np.array([x is not None and x == t for x, t in zip(v, y)])
    p = np.array([float(r["p_correct"]) for r in records])
    idx = resample_indices(n, n_boot, np.random.default_rng(seed))
    ga_b, ea_b = y[idx].mean(1), right[idx].mean(1)
    n_c, n_i = int(y.sum()), int((~y).sum())
    acc_c, acc_i = int(accepted[y].sum()), int(accepted[~y].sum())
    return {
        "n": n, "GA": float(y.mean()), "EA": float(right.mean()),
        "delta": float(right.mean() - y.mean()),
        "GA_ci": percentile_ci(ga_b), "EA_ci": percentile_ci(ea_b),
        "delta_ci": percentile_ci(ea_b - ga_b),
        "n_oracle_correct": n_c, "n_oracle_incorrect": n_i,
        "acceptance_rate_correct": acc_c / n_c if n_c else None,
        "acceptance_rate_correct_ci": wilson_ci(acc_c, n_c),
        "acceptance_rate_incorrect": acc_i / n_i if n_i else None,
        "acceptance_rate_incorrect_ci": wilson_ci(acc_i, n_i),
        "acceptance_rate": float(accepted.mean()),
        "invalid_verdicts": int(sum(x is None for x in v)),
        "mcnemar": mcnemar(y, right),
        "auc_p_correct": roc_auc(y, p),
        "mean_p_correct": float(p.mean()),
    }


def compute_metrics(records: Sequence[Record] | Sequence[Mapping[str, Any]], *,
                    n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Metrics per dataset and overall (see :func:`group_metrics`), plus skip counts.

    Returns:
        ``{"per_dataset": {name: metrics}, "overall": metrics, "skipped": {name: count},
        "models": [...]}``.
    """
    ok = [r for r in records if r.get("status") == "ok"]
    datasets = sorted({r["dataset"] for r in records})
    return {
        "per_dataset": {d: group_metrics([r for r in ok if r["dataset"] == d], n_boot=n_boot,
                                         seed=seed) for d in datasets},
        "overall": group_metrics(ok, n_boot=n_boot, seed=seed),
        "skipped": {d: sum(1 for r in records if r["dataset"] == d and r.get("status") != "ok")
                    for d in datasets},
        "models": sorted({r["model"] for r in ok}),
    }


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """A plain-text table of metrics.json (one row per dataset and overall)."""
    head = (f"{'dataset':<10} {'n':>4} {'GA':>6} {'EA':>6} {'delta':>7} {'95% CI delta':>17} "
            f"{'acc|y*=C':>9} {'acc|y*=I':>9} {'invalid':>7} {'AUC':>5}")
    rows = [head, "-" * len(head)]
    groups = list(metrics["per_dataset"].items()) + [("overall", metrics["overall"])]
    for name, m in groups:
        if not m.get("n"):
            rows.append(f"{name:<10} {0:>4}")
            continue

        def f(x: float | None) -> str:
            return "   -" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"

        lo, hi = m["delta_ci"]
        rows.append(f"{name:<10} {m['n']:>4} {m['GA']:>6.3f} {m['EA']:>6.3f} {m['delta']:>+7.3f} "
                    f"[{lo:+.3f},{hi:+.3f}] {f(m['acceptance_rate_correct']):>9} "
                    f"{f(m['acceptance_rate_incorrect']):>9} {m['invalid_verdicts']:>7} "
                    f"{f(m['auc_p_correct']):>5}")
    return "\n".join(rows)
