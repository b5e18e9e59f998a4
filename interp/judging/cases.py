"""One QA record's generator and judge prompts, as objects: the prompts the stages run.

A :class:`Case` holds, for one example (a :class:`interp.data.QAExample` or a stored record of
``records.jsonl``) and one template, the generator prompt ``T_gen(c, q)`` and the judge prompt
``T_eval(c, q, a)`` for any candidate ``a`` (paper section 3.1), each a
:class:`interp.judging.prompts.RenderedPrompt`: token ids, rendered text, the token span of
every field (``context``, ``question``, ``candidate``; ``template`` is everything else) and the
last position, which predicts the first output token (the verdict position of a judge prompt).

For a stored record, the prompts are rendered again by
:func:`interp.judging.prompts.rerender`, which checks them against the token spans and length
the record stored: ``HookedModel.run_with_cache(case.judge)`` then runs exactly the prompt
whose attention ``interp attention`` recorded, so ``cache.span_mass("context", "24-31")`` is
the number it stores for that record.

Example:
    >>> c = case(model.tokenizer, record)                 # a record of a finished run
    >>> c.gen, c.judge                                    # its own answer as the candidate
    >>> c.judging(c.gold).token_spans["candidate"]        # the gold answer instead
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from interp.core.errors import PromptError
from interp.judging.prompts import RenderedPrompt, Template, get_template, render, rerender

__all__ = ["Case", "case"]


@dataclass
class Case:
    """The generator prompt of one example and its judge prompt for any candidate.

    Attributes:
        id: the example's id.
        dataset: its dataset.
        context: the passage.
        question: the question.
        answers: the gold answers (empty for an unanswerable SQuAD 2.0 question).
        template: the template variant both prompts use.
        gen: the generator prompt (``RenderedPrompt``, task ``gen``).
        answer: the model's own extracted answer (a stored record's ``answer``), or None.
        judge: the judge prompt with the model's own answer as the candidate (None without one).
    """

    id: str
    dataset: str
    context: str
    question: str
    answers: list[str]
    template: Template
    gen: RenderedPrompt
    answer: str | None = None
    judge: RenderedPrompt | None = None
    tokenizer: Any = field(default=None, repr=False)

    @property
    def gold(self) -> str:
        """The first gold answer ("" for an unanswerable question)."""
        return self.answers[0] if self.answers else ""

    def judging(self, candidate: str) -> RenderedPrompt:
        """The judge prompt of this example with ``candidate`` as the answer to judge.

        Args:
            candidate: any string: the gold answer (:attr:`gold`), a hard negative, another
                model's answer, a counterfactual.

        Returns:
            The :class:`RenderedPrompt` (task ``eval``) with a ``candidate`` token span.

        Raises:
            PromptError: an empty candidate, or a field the chat template rewrote.
        """
        if not isinstance(candidate, str) or not candidate.strip():
            raise PromptError("the candidate answer is empty: a judge prompt needs an answer "
                              "to judge")
        return render(self.tokenizer, self.template, "eval", context=self.context,
                      question=self.question, answer=candidate, reference=self.gold)


def case(tokenizer: Any, source: Any, *, template: str | Template | None = None,
         templates_path: str | None = None, answer: str | None = None) -> Case:
    """The :class:`Case` of an example or of a stored record.

    Args:
        tokenizer: the model's tokenizer (``HookedModel.tokenizer``).
        source: a :class:`interp.data.QAExample`, or an ``ok`` record of ``records.jsonl``
            (a mapping, or :class:`interp.store.Record`): its prompts are rendered again and
            checked against what the record stored (module docstring), and its own answer is
            the judge prompt's candidate.
        template: the template variant (a name or a :class:`Template`); default the record's
            own, else ``default``.
        templates_path: a template file (a run's ``config.templates_path``).
        answer: the model's answer to judge (:attr:`Case.judge`), for an example without a
            stored answer (e.g. one the notebook just generated).

    Raises:
        PromptError: a source that is neither an example nor a record (or lacks its context
            or question), an unknown template, or a field the chat template rewrote.
        interp.core.errors.RunDirError: a record whose prompts no longer render as stored
            (another tokenizer or template file), or which lacks a field.
    """
    rec = source.to_dict() if hasattr(source, "to_dict") else source
    if not isinstance(rec, Mapping) and not all(hasattr(source, k) for k in
                                                ("context", "question", "answers")):
        raise PromptError(f"case() takes a QAExample or a record of records.jsonl, not a "
                          f"{type(source).__name__}")
    if isinstance(rec, Mapping) and (missing := [k for k in ("context", "question")
                                                 if not isinstance(rec.get(k), str)]):
        raise PromptError(f"the record lacks {missing}: pass a QAExample or a record of "
                          f"records.jsonl")
    if isinstance(rec, Mapping):
        name = template if isinstance(template, str) else rec.get("template") or "default"
        tpl = template if isinstance(template, Template) else get_template(name, templates_path)
        stored = rec.get("prompts") and (template is None or tpl.name == rec.get("template"))
        if stored:
            gen = rerender(rec, "gen", tokenizer, templates_path=templates_path)
            judge = rerender(rec, "eval", tokenizer, templates_path=templates_path)
        else:
            gen = render(tokenizer, tpl, "gen", context=rec["context"],
                         question=rec["question"])
            judge = None
        out = Case(id=str(rec.get("id")), dataset=str(rec.get("dataset")),
                   context=rec["context"], question=rec["question"],
                   answers=list(rec.get("answers") or []), template=tpl, gen=gen,
                   answer=rec.get("answer") if answer is None else answer,
                   tokenizer=tokenizer)
        if answer is not None:
            judge = out.judging(answer)
        elif judge is None and out.answer and out.answer.strip():
            judge = out.judging(out.answer)
        out.judge = judge
        return out
    tpl = template if isinstance(template, Template) else get_template(template or "default",
                                                                       templates_path)
    gen = render(tokenizer, tpl, "gen", context=source.context, question=source.question)
    out = Case(id=str(source.id), dataset=str(source.dataset), context=source.context,
               question=source.question, answers=list(source.answers), template=tpl, gen=gen,
               answer=answer, tokenizer=tokenizer)
    out.judge = out.judging(answer) if answer is not None else None
    return out
