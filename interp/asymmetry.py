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

Records are appended to ``DIR/records.jsonl`` batch by batch, so an interrupted run resumes and
a larger ``limit`` only adds the new examples.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from interp.data import QAExample, load_examples
from interp.generation import generate, verdict_scores
from interp.grading import BaseOracle, RuleOracle, extract_answer, parse_verdict
from interp.models import DEFAULT_MODEL, ModelHandle, load_model
from interp.prompts import PromptError, Template, get_template, render, verdict_token_ids
from interp.store import RunDir, config_from_table, record_key, write_json

KEY_FIELDS = ("model", "template", "templates_path", "oracle", "include_unanswerable", "split",
              "max_new_tokens", "verdict_max_new_tokens", "dtype", "from_hub")
"""Config fields that must match to reuse a run directory (others may change freely)."""


@dataclass
class AsymmetryConfig:
    """Configuration of one asymmetry run (one model, one or more datasets).

    Attributes:
        model: model spec (:func:`interp.models.load_model`).
        datasets: dataset names (``squad_v2``, ``drop``, ``hotpotqa``, ``musique``) or paths.
        limit: examples per dataset (first N after filtering; None for all).
        template: template variant name; ``templates_path`` a TOML file of variants.
        oracle: ``"rule"`` or ``"model:SPEC"`` (an LLM oracle).
        include_unanswerable: keep SQuAD 2.0 unanswerable questions (abstaining is correct).
        split: dataset split.
        max_new_tokens: answer length cap (tokens); ``verdict_max_new_tokens`` for verdicts.
        batch_size: prompts per forward pass.
        seed: seed of bootstrap resampling.
        device, dtype: where and in what precision to run.
        from_hub: read dataset names from the Hugging Face hub instead of the bundled files.
        n_boot: bootstrap resamples for CIs.
    """

    model: str = DEFAULT_MODEL
    datasets: list[str] = field(default_factory=lambda: ["squad_v2"])
    limit: int | None = 50
    template: str = "default"
    templates_path: str | None = None
    oracle: str = "rule"
    include_unanswerable: bool = False
    split: str = "validation"
    max_new_tokens: int = 48
    verdict_max_new_tokens: int = 12
    batch_size: int = 8
    seed: int = 0
    device: str | None = None
    dtype: str | None = None
    from_hub: bool = False
    n_boot: int = 2000

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> AsymmetryConfig:
        """Build from a mapping, refusing unknown keys (the error lists the known ones)."""
        return config_from_table(cls, d, "asymmetry")


def make_oracle(spec: str, *, template: Template | None = None, device: str | None = None,
                handle: ModelHandle | None = None) -> BaseOracle:
    """The oracle named by ``spec``: ``"rule"`` or ``"model:SPEC"``.

    Raises:
        ValueError: any other spec.
    """
    if spec == "rule":
        return RuleOracle()
    if spec.startswith("model:"):
        from interp.grading import ModelOracle

        return ModelOracle(handle or load_model(spec.removeprefix("model:"), device=device))
    raise ValueError(f"unknown oracle {spec!r}: use 'rule' or 'model:SPEC'")


def _example_fields(ex: QAExample) -> dict[str, Any]:
    return {"id": ex.id, "dataset": ex.dataset, "split": ex.split, "question": ex.question,
            "context": ex.context, "answers": list(ex.answers), "answerable": ex.answerable}


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
) -> list[dict[str, Any]]:
    """Run steps 1-3 of the module algorithm on a list of examples; return their records.

    Args:
        handle: the model that generates AND judges (self-evaluation).
        examples: the examples.
        template: prompt variant.
        oracle: grades generated answers (step 2).
        max_new_tokens, verdict_max_new_tokens: decoding caps.
        batch_size: prompts per forward.
        candidates: when given, judge these answers instead of the model's own (used by the
            transfer and patching studies; GA then describes the candidates).

    Returns:
        One record per example (``status`` ``"ok"``, or ``"skipped"`` with a ``reason`` when a
        prompt does not fit the model's context); the fields are listed in README.md.
    """
    c_id, i_id = verdict_token_ids(handle.tokenizer)
    room = handle.max_positions
    records: list[dict[str, Any] | None] = [None] * len(examples)
    gen_prompts, gen_idx = [], []
    for k, ex in enumerate(examples):
        try:
            p = render(handle.tokenizer, template, "gen", context=ex.context,
                       question=ex.question, reference=ex.answers[0] if ex.answers else "")
        except PromptError as err:
            records[k] = {**_example_fields(ex), "status": "skipped", "reason": str(err)}
            continue
        if len(p) + max_new_tokens > room:
            records[k] = {**_example_fields(ex), "status": "skipped",
                          "reason": f"generation prompt has {len(p)} tokens; with "
                                    f"{max_new_tokens} new tokens it exceeds the model's "
                                    f"{room} positions"}
            continue
        gen_prompts.append(p)
        gen_idx.append(k)
    if candidates is None:
        gens = generate(handle, [p.input_ids for p in gen_prompts], batch_size=batch_size,
                        max_new_tokens=max_new_tokens)
        raw = {k: g.text for k, g in zip(gen_idx, gens)}
    else:
        raw = {k: candidates[k] for k in gen_idx}
    eval_prompts, eval_idx, answers = [], [], {}
    for k, gp in zip(gen_idx, gen_prompts):
        ex = examples[k]
        answers[k] = extract_answer(raw[k]) if candidates is None else raw[k]
        try:
            ep = render(handle.tokenizer, template, "eval", context=ex.context,
                        question=ex.question, answer=answers[k],
                        reference=ex.answers[0] if ex.answers else "")
        except PromptError as err:
            records[k] = {**_example_fields(ex), "status": "skipped", "reason": str(err)}
            continue
        if len(ep) + verdict_max_new_tokens > room:
            records[k] = {**_example_fields(ex), "status": "skipped",
                          "reason": f"evaluation prompt has {len(ep)} tokens; it exceeds the "
                                    f"model's {room} positions"}
            continue
        eval_prompts.append((k, gp, ep))
        eval_idx.append(k)
    verdicts = generate(handle, [ep.input_ids for _, _, ep in eval_prompts],
                        batch_size=batch_size, max_new_tokens=verdict_max_new_tokens,
                        keep_first_logits=True)
    for (k, gp, ep), v in zip(eval_prompts, verdicts):
        ex = examples[k]
        graded = oracle.grade(answers[k], ex.answers, dataset=ex.dataset,
                              answerable=ex.answerable,
                              extras={**ex.extras, "context": ex.context,
                                      "question": ex.question})
        diff, p_correct = verdict_scores(v.first_logits, c_id, i_id)
        records[k] = {
            **_example_fields(ex), "status": "ok", "model": handle.spec,
            "generation": raw[k], "answer": answers[k],
            "oracle_label": bool(graded.label),
            "oracle": {"name": oracle.name, "em": graded.em, "f1": graded.f1,
                       "rule": graded.rule},
            "verdict": parse_verdict(v.text), "verdict_text": v.text,
            "p_correct": p_correct, "logit_diff": diff,
            "prompts": {"gen": gp.to_record(), "eval": ep.to_record()},
        }
    return records  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def _wilson(k: int, n: int) -> list[float] | None:
    if n == 0:
        return None
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return [float(ci.low), float(ci.high)]


def group_metrics(records: Sequence[Mapping[str, Any]], *, n_boot: int = 2000,
                  seed: int = 0) -> dict[str, Any]:
    """GA, EA, Delta and the judge's diagnostics over one group of ``ok`` records.

    Args:
        records: records with ``oracle_label`` (bool), ``verdict`` (bool or None) and
            ``p_correct`` (float).
        n_boot: paired bootstrap resamples (examples resampled with replacement; GA, EA and
            Delta computed on the same resample).
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
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    ga_b, ea_b = y[idx].mean(1), right[idx].mean(1)

    def ci(a: np.ndarray) -> list[float]:
        return [float(np.percentile(a, 2.5)), float(np.percentile(a, 97.5))]

    b = int(np.sum(y & ~right))
    c = int(np.sum(~y & right))
    from scipy.stats import binomtest

    p_mc = float(binomtest(b, b + c, 0.5).pvalue) if b + c else 1.0
    auc = None
    if 0 < y.sum() < n:
        from sklearn.metrics import roc_auc_score

        auc = float(roc_auc_score(y, p))
    n_c, n_i = int(y.sum()), int((~y).sum())
    acc_c, acc_i = int(accepted[y].sum()), int(accepted[~y].sum())
    return {
        "n": n, "GA": float(y.mean()), "EA": float(right.mean()),
        "delta": float(right.mean() - y.mean()),
        "GA_ci": ci(ga_b), "EA_ci": ci(ea_b), "delta_ci": ci(ea_b - ga_b),
        "n_oracle_correct": n_c, "n_oracle_incorrect": n_i,
        "acceptance_rate_correct": acc_c / n_c if n_c else None,
        "acceptance_rate_correct_ci": _wilson(acc_c, n_c),
        "acceptance_rate_incorrect": acc_i / n_i if n_i else None,
        "acceptance_rate_incorrect_ci": _wilson(acc_i, n_i),
        "acceptance_rate": float(accepted.mean()),
        "invalid_verdicts": int(sum(x is None for x in v)),
        "mcnemar": {"b": b, "c": c, "p_value": p_mc},
        "auc_p_correct": auc,
        "mean_p_correct": float(p.mean()),
    }


def compute_metrics(records: Sequence[Mapping[str, Any]], *, n_boot: int = 2000,
                    seed: int = 0) -> dict[str, Any]:
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


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def run_asymmetry(
    config: AsymmetryConfig,
    out: str | Path,
    *,
    overwrite: bool = False,
    handle: ModelHandle | None = None,
    log: Callable[[str], None] = print,
    chunk: int | None = None,
) -> dict[str, Any]:
    """Run Study 1 into a run directory, resuming finished work; return metrics.json's content.

    Args:
        config: the run's configuration.
        out: run directory.
        overwrite: discard a run directory made with another config.
        handle: an already loaded model (else ``config.model`` is loaded).
        log: where progress lines go.
        chunk: examples per appended batch of records (default ``2 * batch_size``).

    Raises:
        interp.store.RunDirError: ``out`` holds a run with another config and not overwrite.
        interp.data.DataError: unknown dataset, malformed file.
    """
    run = RunDir(out)
    template = get_template(config.template, config.templates_path)
    handle = handle or load_model(config.model, device=config.device, dtype=config.dtype)
    cfg = asdict(config)
    manifest = run.init_manifest(cfg, model_info=handle.info, overwrite=overwrite,
                                 key_fields=KEY_FIELDS)
    oracle = make_oracle(config.oracle, device=config.device)
    done = {record_key(r) for r in (run.read_records(status=None)
                                    if run.records_path.exists() else [])}
    chunk = chunk or 2 * config.batch_size
    from tqdm.auto import tqdm

    for ds in config.datasets:
        examples = load_examples(ds, split=config.split, limit=config.limit,
                                 include_unanswerable=config.include_unanswerable,
                                 from_hub=config.from_hub)
        todo = [ex for ex in examples if (ex.dataset, ex.id) not in done]
        log(f"[{ds}] {len(examples)} examples, {len(examples) - len(todo)} already done")
        t0 = time.perf_counter()
        bar = tqdm(total=len(todo), desc=ds, unit="ex", disable=not todo)
        for s in range(0, len(todo), chunk):
            part = todo[s:s + chunk]
            recs = evaluate_examples(
                handle, part, template=template, oracle=oracle,
                max_new_tokens=config.max_new_tokens,
                verdict_max_new_tokens=config.verdict_max_new_tokens,
                batch_size=config.batch_size)
            for r in recs:
                r["template"] = config.template
                r.setdefault("model", handle.spec)
            run.append_records(recs)
            done.update(record_key(r) for r in recs)
            bar.update(len(part))
            for r in recs:
                if r["status"] != "ok":
                    log(f"[{ds}] skipped {r['id']}: {r['reason']}")
        bar.close()
        if todo:
            dt = time.perf_counter() - t0
            log(f"[{ds}] {len(todo)} examples in {dt:.1f} s "
                f"({60 * len(todo) / dt:.1f} examples/minute)")
    # metrics.json describes the whole run directory: every dataset run into it so far
    every = manifest["config"].get("datasets", config.datasets)
    return write_metrics(run, replace(config, datasets=list(every)))


def write_metrics(run: RunDir, config: AsymmetryConfig | None = None) -> dict[str, Any]:
    """Recompute ``metrics.json`` from the records (only the configured datasets' records
    when a config is given), and draw the asymmetry figure."""
    records = run.read_records(status=None)
    if config is not None:
        from interp.data import DATASETS

        names = {d for d in config.datasets if d in DATASETS}
        paths = [d for d in config.datasets if d not in DATASETS]
        if not paths:
            records = [r for r in records if r["dataset"] in names]
    seed = config.seed if config else 0
    n_boot = config.n_boot if config else 2000
    metrics = compute_metrics(records, n_boot=n_boot, seed=seed)
    write_json(run.path / "metrics.json", metrics)
    from interp.plots import plot_asymmetry

    plot_asymmetry(metrics, run.sub("figures"))
    return metrics


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
