"""Cross-judging: a model judges ANOTHER run's answers on the same records, same templates.

The paper (section 3.1) measures self-evaluation only, so it cannot say whether the judge is
bad at judging its own answers or at judging at all. Here a judge model J reads the candidate
answers of a source run S (made by model G) instead of generating its own.

Algorithm (:func:`judge_answers`, the one harness function that judges given answers; the
run-directory work is :mod:`interp.stages.asymmetry` with ``answers_from``):

1. Source (:func:`interp.judging.answer_source.load_answer_source`, before any model
   loads): the source run's manifest and records; its template, template file and oracle
   must be the judge run's (the same eval prompt text, the same meaning of y*). Every
   example the judge run selects must have a record in the source with the same question,
   context and gold answers (:func:`check_answer_source`); with the rule oracle every source
   label is graded again and must be the stored one (a label from another oracle version is
   refused). An LLM oracle's labels are taken as stored (not graded again).
2. Judge (:func:`judge_answers`): :func:`interp.methods.asymmetry.evaluate_examples` with the
source's
   extracted answers as candidates (J prefills its generation prompt but decodes no answer),
   the verdict, the whole-reply verdict score and, on request, the one-pass recordings; the
   oracle fields are the source record's (:class:`GivenOracle`), the raw ``generation`` is
   the source's, and every record names ``answer_source = {"model": G, "run": S}`` (a source
   that was itself cross-judged passes on its own ``answer_source``).
3. Metrics per answer source (:func:`source_metrics`):
:func:`interp.methods.asymmetry.group_metrics`
   on the records of each answer source: GA is then the SOURCE model's generation accuracy on
   these records, EA / EA_forced / the acceptance rates are the judge's, Δ = EA(J) - GA(G).
4. Matrix (:func:`judge_matrix`): judge x answer-source cells; per judge, "self minus other"
   (EA on its own answers minus EA on another model's answers) on the records both runs have,
   with a paired percentile bootstrap over passages (the same resampled passages for both
   terms, :class:`interp.analysis.stats.ClusterBootstrap`); per answer source likewise "self-judge
   minus other judge" on the same answers.
5. Representation as a judge across models
   (:func:`interp.run.cross_grid.cross_probe`): the probe stage's per-layer
   sweep of J's residual stream on the eval prompts of G's answers, next to J's verbal judge
   and G's self-judge on the same records and the same folds.

Source: the paper's "Study 1" (templates, oracle, GA/EA/Δ) and "Related seed:
representation-as-a-judge"; ``docs/cross_judging.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from interp.analysis.stats import MIN_PASSAGES, ClusterBootstrap, passage_groups, passage_note
from interp.core.errors import ConfigError, Interrupted, RunDirError
from interp.data import QAExample
from interp.judging.answer_source import (
    AnswerSource,
    GivenAnswer,
    Key,
    check_answer_source,
    load_answer_source,
)
from interp.judging.grading import BaseOracle, OracleResult
from interp.judging.prefill import Capture
from interp.judging.prompts import Template
from interp.methods.asymmetry import evaluate_examples, group_metrics
from interp.models.loading import ModelHandle
from interp.store import Record, RunDir
from interp.store.records import qa_key

__all__ = ["MATRIX_DEFINITIONS", "SOURCE_KEYS", "AnswerSource", "GivenAnswer", "GivenOracle",
           "answer_source_of", "check_answer_source", "format_matrix", "ok_by_key",
           "judge_answers", "judge_from_source", "judge_matrix", "load_answer_source",
           "source_label", "source_metrics"]


class GivenOracle(BaseOracle):
    """An oracle that returns the stored grade of a given answer (no grading).

    Keyed by (question, context, answer): :func:`interp.methods.asymmetry.evaluate_examples` passes
    the question and context in ``extras``.

    Args:
        given: ``{(question, context, answer): GivenAnswer}``.
        name: the name the records' ``oracle.name`` keeps (the source's oracle).

    Raises:
        RunDirError: (from :meth:`grade`) an answer that was not given.
    """

    def __init__(self, given: Mapping[tuple[str, str, str], GivenAnswer], name: str) -> None:
        self.given = dict(given)
        self.name = name

    def grade(self, prediction: str, answers: Sequence[str], *, dataset: str,
              answerable: bool = True, extras: Mapping | None = None) -> OracleResult:
        """The stored grade of ``prediction`` for the question and context in ``extras``."""
        ex = extras or {}
        g = self.given.get((ex.get("question"), ex.get("context"), prediction))
        if g is None:
            raise RunDirError(f"{dataset}: no given grade for the answer {prediction!r}")
        o = g.oracle
        return OracleResult(label=bool(g.label), em=float(o.get("em", 0.0)),
                            f1=float(o.get("f1", 0.0)), rule=str(o.get("rule", "given")))


def judge_answers(handle: ModelHandle, examples: Sequence[QAExample],
                  given: Sequence[GivenAnswer], *, template: Template,
                  max_new_tokens: int = 48, verdict_max_new_tokens: int = 12,
                  batch_size: int = 8, capture: Capture | None = None,
                  progress: str | None = None) -> list[Record]:
    """Judge given answers with ``handle`` (module algorithm, step 2): the one harness call.

    Args:
        handle: the judge model.
        examples: the examples (context, question, gold answers).
        given: one :class:`GivenAnswer` per example, in the same order.
        template: the prompt variant (the source's).
        max_new_tokens: the generation length cap the source used (only for the room check of
            the generation prompt, which the judge prefills but does not decode).
        verdict_max_new_tokens: verdict length cap (tokens).
        batch_size: prompts per forward.
        capture: the one-pass recordings (:class:`interp.judging.prefill.Capture`), as in
            :func:`interp.methods.asymmetry.evaluate_examples`.
        progress: a tqdm description (None: no bars).

    Returns:
        One :class:`interp.store.Record` per example, as the harness writes them, with the
        given grade (``oracle_label``, ``oracle``), the given raw ``generation`` and
        ``answer_source``; ``model`` is the judge.

    Raises:
        ConfigError: ``given`` and ``examples`` differ in length.
        interp.core.errors.Interrupted: as :func:`interp.methods.asymmetry.evaluate_examples`
            (its records sourced as here).
    """
    if len(given) != len(examples):
        raise ConfigError(f"{len(given)} given answers for {len(examples)} examples")
    names = {str(g.oracle.get("name", "given")) for g in given}
    oracle = GivenOracle({(ex.question, ex.context, g.answer): g
                          for ex, g in zip(examples, given)},
                         names.pop() if len(names) == 1 else "given")
    try:
        recs = evaluate_examples(handle, examples, template=template, oracle=oracle,
                                 max_new_tokens=max_new_tokens,
                                 verdict_max_new_tokens=verdict_max_new_tokens,
                                 batch_size=batch_size, candidates=[g.answer for g in given],
                                 capture=capture, progress=progress)
    except Interrupted as exc:  # the finished ones (None: not finished), sourced as below
        _sourced(exc.done, given)
        raise
    return _sourced(recs, given)


def _sourced(recs: list[Any], given: Sequence[GivenAnswer]) -> list[Record]:
    """Each judged record (None: not finished) with its answer's source, in place."""
    for rec, g in zip(recs, given):
        if rec is None:
            continue
        rec["answer_source"] = dict(g.source)
        if rec.get("status") == "ok":
            rec["generation"] = g.generation
            rec["oracle"] = dict(g.oracle)  # type: ignore[typeddict-item]
    return recs


# ---------------------------------------------------------------------------------------------
# Step 1: the source run
# ---------------------------------------------------------------------------------------------


def judge_from_source(handle: ModelHandle, examples: Sequence[QAExample],
                      source: AnswerSource, **kw: Any) -> list[Record]:
    """:func:`judge_answers` on the source's answers to ``examples``, in their order.

    An example whose source record was skipped gets a skipped record saying so (the judge has
    no answer to judge); ``kw`` goes to :func:`judge_answers`. A ``capture`` is keyed by the
    position in ``examples``, as :func:`interp.methods.asymmetry.evaluate_examples` keys it.
    """
    keys = [(ex.dataset, ex.id) for ex in examples]
    todo = [i for i, k in enumerate(keys) if source.records[k].get("status") == "ok"]
    cap = kw.pop("capture", None)
    sub = Capture(rows=cap.rows, pools=cap.pools) if cap is not None else None
    out: list[Record | None] = [None] * len(examples)
    try:
        judged = judge_answers(handle, [examples[i] for i in todo],
                               [source.given(keys[i]) for i in todo], capture=sub, **kw)
    except Interrupted as exc:  # the finished ones, at their positions in ``examples``
        for i, rec in zip(todo, exc.done):
            out[i] = rec
        if cap is not None and sub is not None:
            cap.got.update({todo[j]: got for j, got in sub.got.items()})
        raise Interrupted(out) from exc
    for i, rec in zip(todo, judged):
        out[i] = rec
    if cap is not None and sub is not None:
        cap.got.update({todo[j]: got for j, got in sub.got.items()})
    for i, rec in enumerate(out):
        if rec is None:
            r = source.records[keys[i]]
            out[i] = {**{k: r.get(k) for k in ("id", "dataset", "split", "question", "context",
                                               "answers", "answerable")},
                      "status": "skipped", "reason": f"the source run {source.run} skipped it: "
                                                     f"{r.get('reason')}"}  # type: ignore[misc]
    return out  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Step 3: metrics per answer source
# ---------------------------------------------------------------------------------------------


def answer_source_of(record: Mapping[str, Any], run: str | None = None) -> dict[str, str]:
    """The record's ``answer_source``; a self-judged record is its own model's (run ``run``)."""
    src = record.get("answer_source")
    if src:
        return {"model": str(src.get("model")), "run": str(src.get("run"))}
    return {"model": str(record.get("model")), "run": run or "self"}


def source_label(src: Mapping[str, str]) -> str:
    """``model @ run`` of an answer source."""
    return f"{src['model']} @ {src['run']}"


SOURCE_KEYS = ("n", "n_passages", "few_passages", "note", "GA", "GA_ci", "EA", "EA_ci",
               "EA_forced", "EA_forced_ci", "delta", "delta_ci", "delta_forced",
               "acceptance_rate_correct", "acceptance_rate_correct_ci",
               "acceptance_rate_incorrect", "acceptance_rate_incorrect_ci",
               "n_oracle_correct", "n_oracle_incorrect", "verdicts", "auc_logit_diff")
"""The keys of :func:`interp.methods.asymmetry.group_metrics` a per-source block and a cell keep."""


def source_metrics(records: Sequence[Mapping[str, Any]], *, n_boot: int = 2000,
                   seed: int = 0) -> dict[str, Any]:
    """Metrics per answer source (module step 3) over ok records.

    Returns:
        ``{source_label: {"answer_source", "judge", **SOURCE_KEYS}}``; ``GA`` is the source
        model's accuracy on these records, ``delta`` = the judge's EA - that GA.
    """
    ok = [r for r in records if r.get("status") == "ok"]
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in ok:
        groups.setdefault(source_label(answer_source_of(r)), []).append(r)
    out = {}
    for label, rs in groups.items():
        m = group_metrics(rs, n_boot=n_boot, seed=seed)
        out[label] = {"answer_source": answer_source_of(rs[0]),
                      "judge": sorted({str(r.get("model")) for r in rs}),
                      **{k: m.get(k) for k in SOURCE_KEYS}}
    return out


# ---------------------------------------------------------------------------------------------
# Step 4: the judge x answer-source matrix
# ---------------------------------------------------------------------------------------------


MATRIX_DEFINITIONS = {
    "cells[judge][source]": "the judge's metrics on the source model's answers (the source's "
                            "GA, the judge's EA / EA_forced / acceptance rates, delta = EA - "
                            "GA); the diagonal is self-evaluation",
    "self_minus_other[judge][source]": "EA (and EA_forced) of the judge on its own answers "
                                       "minus on the source's answers, over the records both "
                                       "runs have ok; the two terms judge DIFFERENT answers "
                                       "(another GA), so read it with both cells' GA",
    "self_judge_minus_other[source][judge]": "EA of the source model judging its own answers "
                                             "minus EA of the other judge on the SAME answers "
                                             "(same records, same y*)",
    "_ci": "95% percentile bootstrap over passages, paired: the same resampled passages for "
           "both terms (interp.analysis.stats.ClusterBootstrap); None with fewer than 2 passages",
}
"""What the keys of :func:`judge_matrix` mean (copied into ``cross_judge.json``)."""


def ok_by_key(run: RunDir) -> dict[Key, Mapping[str, Any]]:
    """A run's records by :func:`interp.store.records.qa_key` (its last record of each key)."""
    return {qa_key(r): r for r in run.read_records()}


def _paired(a: Mapping[Key, Mapping[str, Any]], b: Mapping[Key, Mapping[str, Any]],
            n_boot: int, seed: int) -> dict[str, Any]:
    """EA and EA_forced of ``a`` minus ``b`` on their shared keys, paired passage bootstrap."""
    keys = [k for k in a if k in b]
    out: dict[str, Any] = {"n": len(keys)}
    if not keys:
        return out

    def right(recs: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        y = np.array([bool(r["oracle_label"]) for r in recs])
        v = [r.get("verdict") for r in recs]
        ea = np.array([x is not None and x == t for x, t in zip(v, y)], dtype=float)
        ef = np.array([(float(r["p_correct"]) > 0.5) == t for r, t in zip(recs, y)], dtype=float)
        return ea, ef

    ra, rb = [a[k] for k in keys], [b[k] for k in keys]
    (ea_a, ef_a), (ea_b, ef_b) = right(ra), right(rb)
    bs = ClusterBootstrap(passage_groups(ra), n_boot, np.random.default_rng(seed))
    out.update(n_passages=bs.n_clusters, few_passages=bs.n_clusters < MIN_PASSAGES,
               note=passage_note(bs.n_clusters))
    for name, x, y in (("EA", ea_a, ea_b), ("EA_forced", ef_a, ef_b)):
        out[f"{name}_diff"] = float((x - y).mean())
        out[f"{name}_diff_ci"] = bs.interval(bs.means(x - y))
    out["GA_self"] = float(np.mean([bool(r["oracle_label"]) for r in ra]))
    out["GA_other"] = float(np.mean([bool(r["oracle_label"]) for r in rb]))
    return out


def judge_matrix(runs: Mapping[str, Mapping[str, str | Path]], *, n_boot: int = 2000,
                 seed: int = 0) -> dict[str, Any]:
    """The judge x answer-source matrix (module step 4) from run directories.

    Args:
        runs: ``{judge spec: {source spec: run directory}}``; ``runs[m][m]`` is ``m``'s
            self-evaluation run, ``runs[j][s]`` the run in which ``j`` judged ``s``'s answers.
        n_boot: bootstrap resamples of passages.
        seed: bootstrap seed.

    Returns:
        ``{"judges", "sources", "cells", "self_minus_other", "self_judge_minus_other",
        "definitions", "n_boot", "seed"}`` (:data:`MATRIX_DEFINITIONS`).

    Raises:
        RunDirError: a run directory without records.
    """
    recs = {j: {s: ok_by_key(RunDir(p)) for s, p in row.items()} for j, row in runs.items()}
    judges = list(runs)
    sources = list(dict.fromkeys(s for row in runs.values() for s in row))
    cells: dict[str, dict[str, Any]] = {}
    for j in judges:
        cells[j] = {}
        for s, rs in recs[j].items():
            m = group_metrics(list(rs.values()), n_boot=n_boot, seed=seed)
            cells[j][s] = {k: m.get(k) for k in SOURCE_KEYS} | {"run": str(runs[j][s])}
    smo = {j: {s: _paired(recs[j][j], recs[j][s], n_boot, seed)
               for s in recs[j] if s != j} for j in judges if j in recs[j]}
    sjmo = {s: {j: _paired(recs[s][s], recs[j][s], n_boot, seed)
                for j in judges if j != s and s in recs[j]}
            for s in sources if s in recs and s in recs[s]}
    return {"judges": judges, "sources": sources, "cells": cells, "self_minus_other": smo,
            "self_judge_minus_other": sjmo, "definitions": MATRIX_DEFINITIONS,
            "n_boot": n_boot, "seed": seed}


def format_matrix(matrix: Mapping[str, Any]) -> str:
    """The matrix as text: one row per judge, EA [CI] (GA of the answers) per source."""

    def ci(c: Sequence[float] | None) -> str:
        return "" if not c else f" [{c[0]:+.2f},{c[1]:+.2f}]"

    lines = ["EA of each judge (rows) on each model's answers (columns); (GA of the answers)"]
    for j in matrix["judges"]:
        cells = []
        for s in matrix["sources"]:
            c = matrix["cells"][j].get(s)
            cells.append("-" if c is None or not c.get("n") else
                         f"{s}: EA {c['EA']:.2f} (GA {c['GA']:.2f}, n {c['n']})")
        lines.append(f"judge {j}: " + "; ".join(cells))
    for j, row in matrix["self_minus_other"].items():
        for s, d in row.items():
            if d.get("n"):
                star = "*" if d.get("few_passages") else ""
                lines.append(f"self minus other, judge {j} vs {s}'s answers: EA "
                             f"{d['EA_diff']:+.2f}{ci(d['EA_diff_ci'])}, EA_forced "
                             f"{d['EA_forced_diff']:+.2f}{ci(d['EA_forced_diff_ci'])} "
                             f"({d['n']} records, {d['n_passages']}{star} passages)")
    return "\n".join(lines)
