"""A finished run's answers for another model to judge, read and checked without a model.

Step 1 of cross-judging (:mod:`interp.methods.cross_judge`): the source run's manifest and
records (:func:`load_answer_source`) and the checks that it holds the judge run's records,
templates and oracle (:func:`check_answer_source`). Light (no torch, transformers or numpy), so
``--answers-from`` is checked with the config, before any heavy library loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interp.core.errors import ConfigError, RunDirError
from interp.data import QAExample
from interp.judging.grading import RuleOracle
from interp.store import RunDir
from interp.store.records import qa_key

__all__ = ["AnswerSource", "GivenAnswer", "Key", "check_answer_source", "load_answer_source"]

Key = tuple[str, str]
"""A record's ``(dataset, id)``."""


@dataclass(frozen=True)
class GivenAnswer:
    """A candidate answer made elsewhere, with its oracle grade.

    Attributes:
        answer: the extracted answer the judge sees as candidate.
        label: y* of that answer (True = Correct).
        generation: the raw generated text it was extracted from.
        oracle: ``{"name", "em", "f1", "rule"}`` of the grade (the record's ``oracle``).
        source: ``{"model", "run"}``: who generated it and in which run directory.
    """

    answer: str
    label: bool
    generation: str
    oracle: Mapping[str, Any]
    source: Mapping[str, str]


@dataclass
class AnswerSource:
    """The answers of a finished run, for another model to judge.

    Attributes:
        run: the source run directory.
        model: its model spec.
        config: its manifest config (``template``, ``templates_path``, ``oracle``, ...).
        records: every record (ok and skipped) by ``(dataset, id)``.
    """

    run: Path
    model: str
    config: dict[str, Any]
    records: dict[Key, Mapping[str, Any]]

    def given(self, key: Key) -> GivenAnswer:
        """The :class:`GivenAnswer` of the ok source record ``key``."""
        r = self.records[key]
        src = r.get("answer_source") or {"model": r.get("model", self.model),
                                         "run": str(self.run)}
        return GivenAnswer(answer=r["answer"], label=bool(r["oracle_label"]),
                           generation=r.get("generation", r["answer"]),
                           oracle=dict(r.get("oracle") or {"name": self.config.get("oracle")}),
                           source=dict(src))


def load_answer_source(path: str | Path) -> AnswerSource:
    """Read a finished run as an answer source (no model).

    Raises:
        RunDirError: no manifest, no records or no ok record (names ``interp asymmetry``).
    """
    rd = RunDir(path)
    if not rd.manifest_path.exists() or not rd.records_path.exists():
        raise RunDirError(f"--answers-from {path}: not a finished run directory (no "
                          f"manifest.json / records.jsonl); run `interp asymmetry --out {path}`")
    manifest = rd.manifest()
    records = {qa_key(r): r for r in rd.read_records(status=None)}
    if not any(r.get("status") == "ok" for r in records.values()):
        raise RunDirError(f"--answers-from {path}: the run has no ok record")
    model = manifest.get("model", {}).get("spec") or manifest.get("config", {}).get("model")
    return AnswerSource(run=rd.path, model=str(model), config=dict(manifest.get("config", {})),
                        records=records)


def check_answer_source(source: AnswerSource, examples: Mapping[str, Sequence[QAExample]], *,
                        template: str, templates_path: str | None, oracle: str) -> int:
    """Step 1: refuse a source that is not the same records, templates and oracle.

    Args:
        source: the answer source.
        examples: ``{dataset: examples}`` the judge run selects.
        template: the judge run's template variant.
        templates_path: its template file.
        oracle: its oracle spec.

    Returns:
        The number of labels graded again and found equal (rule oracle; 0 otherwise).

    Raises:
        ConfigError: another template, template file or oracle than the source's.
        RunDirError: an example the source has no record of, or whose question, context or
            gold answers differ from the source record's, or a label the rule oracle now
            grades otherwise (the message names the first and the count).
    """
    for name, mine in (("template", template), ("templates_path", templates_path),
                       ("oracle", oracle)):
        theirs = source.config.get(name, "default" if name == "template" else None)
        if theirs != mine:
            raise ConfigError(f"--answers-from {source.run} was made with {name} {theirs!r}, "
                              f"this run asks for {mine!r}: judge with the source's {name} "
                              f"(the same eval prompt and the same y*)")
    missing, changed, regraded = [], [], []
    rule = RuleOracle() if oracle == "rule" else None
    for exs in examples.values():
        for ex in exs:
            r = source.records.get((ex.dataset, ex.id))
            if r is None:
                missing.append(f"{ex.dataset}/{ex.id}")
                continue
            for k, now in (("question", ex.question), ("context", ex.context),
                           ("answers", list(ex.answers))):
                if r.get(k) != now:
                    changed.append(f"{ex.dataset}/{ex.id} ({k})")
                    break
            else:
                if rule is not None and r.get("status") == "ok":
                    g = rule.grade(r["answer"], ex.answers, dataset=ex.dataset,
                                   answerable=ex.answerable,
                                   extras={**ex.extras, "context": ex.context,
                                           "question": ex.question})
                    (regraded if bool(g.label) == bool(r["oracle_label"]) else changed).append(
                        f"{ex.dataset}/{ex.id} (oracle_label)")
    for what, items in (("has no record of", missing), ("differs from", changed)):
        if items:
            raise RunDirError(f"--answers-from {source.run} {what} {len(items)} selected "
                              f"example(s) (first: {items[0]}): judge the same records "
                              f"(its datasets and --limit) or re-run the source")
    return len(regraded)
