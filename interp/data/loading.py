"""Loading in-context QA examples: SQuAD 2.0, DROP, HotpotQA and MuSiQue.

Every loader returns :class:`QAExample` objects: one question, one context string and every
gold answer string. Examples come from three kinds of source:

* **Bundled records** (``interp/bundled/<dataset>/<split>.jsonl``, described in
  ``interp/bundled/SOURCES.md``): small, pinned samples of the real datasets that work
  offline. ``load_examples("squad_v2")`` reads one of them.
* **Files** in our JSONL format or in the datasets' official formats (SQuAD v2.0 json,
  DROP json, HotpotQA json, MuSiQue jsonl, and IRCoT's processed jsonl). The format is
  detected from the content, not from the file name.
* **The Hugging Face Hub** (``from_hub=True``), through ``datasets.load_dataset`` with the
  ids in :data:`HUB_IDS`.

Context strings are built the same way for every source, exactly as ``SOURCES.md`` says:

* SQuAD and DROP: the paragraph or passage as is (SQuAD ``answer_start`` offsets still work).
* HotpotQA: one ``"Title: " + "".join(sentences)`` block per paragraph (the original
  sentences carry their own leading spaces), blocks joined by a blank line (``"\\n\\n"``).
* MuSiQue and IRCoT-format records: one ``"Title: paragraph_text"`` block per paragraph,
  joined by a blank line.
* In these multi-paragraph formats each paragraph's text is stripped of leading and
  trailing whitespace, as in the bundled records (this matters for a handful of paragraphs).

Answers are every gold string, duplicates removed in order:

* SQuAD: every annotator answer; ``[]`` for unanswerable SQuAD 2.0 questions.
* DROP: the original ``answer`` first, then each ``validated_answers`` entry. A number gives
  its string, a multi-span answer its spans joined with ``", "``, and a date the form in which
  it occurs in the passage (``Month D, YYYY``, ``D Month YYYY``, ...) or else
  ``"day month year"`` with empty parts left out.
* HotpotQA: ``answer``. MuSiQue: ``answer`` followed by ``answer_aliases``.

Our JSONL format (written by :func:`save_examples`, read by :func:`load_examples`) has one JSON
object per line with the keys ``id``, ``dataset``, ``split``, ``question``, ``context``,
``answers`` (list of str), ``answerable`` (bool), and ``extras`` (an object). On reading,
any other top-level key (as in the bundled files: ``source``, ``raw_format``, ``raw``,
``paragraph_key``, ``type``, ...) is also put into ``extras``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interp.errors import DataError

__all__ = [
    "BUNDLED_DIR",
    "DATASETS",
    "DataError",
    "HUB_IDS",
    "QAExample",
    "bundled_path",
    "bundled_splits",
    "detect_format",
    "drop_answer_text",
    "example_from_hotpotqa",
    "example_from_hub_row",
    "example_from_ircot",
    "example_from_musique",
    "examples_from_drop",
    "examples_from_squad_v2",
    "load_examples",
    "save_examples",
]

#: Dataset names understood by :func:`load_examples`.
DATASETS: tuple[str, ...] = ("squad_v2", "drop", "hotpotqa", "musique")

#: Hugging Face Hub ids used when ``from_hub=True``: a repository id, or
#: ``(repository id, config name)``.
#:
#: * ``rajpurkar/squad_v2``: SQuAD 2.0 (splits ``train``, ``validation``); columns ``id``,
#:   ``title``, ``context``, ``question``, ``answers{text, answer_start}``.
#: * ``ucinlp/drop``: DROP (``train``, ``validation``); columns ``section_id``, ``query_id``,
#:   ``passage``, ``question``, ``answers_spans{spans, types}``.
#: * ``hotpotqa/hotpot_qa``, config ``distractor``: HotpotQA distractor setting (``train``,
#:   ``validation``); columns ``id``, ``question``, ``answer``, ``type``, ``level``,
#:   ``supporting_facts{title, sent_id}``, ``context{title, sentences}``.
#: * ``dgslibisey/MuSiQue``: MuSiQue-Ans (``train``, ``validation``); the official jsonl
#:   columns (``id``, ``paragraphs``, ``question``, ``answer``, ``answer_aliases``,
#:   ``answerable``, ...).
HUB_IDS: dict[str, str | tuple[str, str]] = {
    "squad_v2": "rajpurkar/squad_v2",
    "drop": "ucinlp/drop",
    "hotpotqa": ("hotpotqa/hotpot_qa", "distractor"),
    "musique": "dgslibisey/MuSiQue",
}

#: Directory holding the bundled records (``<dataset>/<split>.jsonl``).
BUNDLED_DIR: Path = Path(__file__).resolve().parent / "bundled"

_SPLIT_ALIASES = {"dev": "validation", "val": "validation", "valid": "validation"}
_CORE_KEYS = ("id", "dataset", "split", "question", "context", "answers", "answerable")
_PARAGRAPH_SEP = "\n\n"


# --------------------------------------------------------------------------------------------
# QAExample
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QAExample:
    """One in-context QA item.

    Attributes:
        id: The dataset's own id (DROP: ``query_id``; HotpotQA: ``_id``).
        dataset: Dataset name, normally one of :data:`DATASETS`.
        context: The context string given to the model (see the module docstring for how
            each dataset's context is built).
        question: The question.
        answers: Every gold answer string, duplicates removed in order. Empty only for
            unanswerable examples.
        answerable: False for SQuAD 2.0 unanswerable questions (and MuSiQue-full
            unanswerable ones).
        split: ``"validation"`` or ``"train"`` (or whatever split the source used).
        extras: Dataset-specific fields, JSON-serialisable (SQuAD: ``title``,
            ``paragraph_key``, ``plausible_answers``; DROP: ``primary_answer``,
            ``answer_type``, ``answer_spans``, ``answer_date``, ``passage_id``; HotpotQA:
            ``type``, ``level``, ``supporting_facts``, ``supporting_titles``; MuSiQue:
            ``hops``, ``supporting_titles``; bundled records also ``source``, ``raw_format``
            and ``raw``). Not part of the hash.

    Raises:
        DataError: On construction, if ``id``, ``dataset``, ``context`` or ``question`` is
            not a non-empty string, ``answers`` is not a list/tuple of strings, or an
            answerable example has no answers.
    """

    id: str
    dataset: str
    context: str
    question: str
    answers: tuple[str, ...]
    answerable: bool = True
    split: str = "validation"
    extras: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        ident = self.id
        if isinstance(ident, int) and not isinstance(ident, bool):
            ident = str(ident)
            object.__setattr__(self, "id", ident)
        for name in ("id", "dataset", "context", "question", "split"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise DataError(
                    f"field {name!r} must be a string, got {type(value).__name__}", field=name
                )
            if not value.strip():
                raise DataError(f"field {name!r} is empty", field=name)
        answers = self.answers
        if isinstance(answers, (str, bytes)) or not isinstance(answers, (list, tuple)):
            raise DataError(
                f"field 'answers' must be a list of strings, got {type(answers).__name__}",
                field="answers",
            )
        for a in answers:
            if not isinstance(a, str):
                raise DataError(
                    f"field 'answers' must be a list of strings, found {type(a).__name__} "
                    f"{a!r}",
                    field="answers",
                )
        object.__setattr__(self, "answers", tuple(answers))
        if not isinstance(self.answerable, bool):
            raise DataError(
                f"field 'answerable' must be a bool, got {type(self.answerable).__name__}",
                field="answerable",
            )
        if self.answerable and not self.answers:
            raise DataError(
                "field 'answers' is empty but 'answerable' is true (id "
                f"{self.id!r}); give at least one gold answer or set answerable to false",
                field="answers",
            )
        if not isinstance(self.extras, Mapping):
            raise DataError(
                f"field 'extras' must be a mapping, got {type(self.extras).__name__}",
                field="extras",
            )
        object.__setattr__(self, "extras", dict(self.extras))

    def to_dict(self) -> dict[str, Any]:
        """Return the example as a JSON-serialisable dict in our JSONL format.

        Returns:
            ``{"id", "dataset", "split", "question", "context", "answers" (list),
            "answerable", "extras" (dict)}``.
        """
        return {
            "id": self.id,
            "dataset": self.dataset,
            "split": self.split,
            "question": self.question,
            "context": self.context,
            "answers": list(self.answers),
            "answerable": self.answerable,
            "extras": dict(self.extras),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, split: str | None = None) -> QAExample:
        """Build an example from one record of our JSONL format (or a bundled record).

        Extra keys may be given in an ``extras`` object or at the top level (as the bundled
        files do); both are accepted and merged, ``extras`` winning on a clash.

        Args:
            d: The record.
            split: Split to use when the record has no ``split`` key (default
                ``"validation"``).

        Returns:
            The example.

        Raises:
            DataError: If ``d`` is not a mapping, a required field (``id``, ``dataset``,
                ``question``, ``context``, ``answers``) is missing, or a field is invalid.
                The error's ``field`` attribute names the field.
        """
        if not isinstance(d, Mapping):
            raise DataError(f"record must be a JSON object, got {type(d).__name__}")
        for name in ("id", "dataset", "question", "context", "answers"):
            if name not in d or d[name] is None:
                raise DataError(f"missing required field {name!r}", field=name)
        answers = d["answers"]
        if not isinstance(answers, (list, tuple)):
            raise DataError(
                f"field 'answers' must be a list of strings, got {type(answers).__name__}",
                field="answers",
            )
        answerable = d.get("answerable")
        if answerable is None:
            answerable = bool(answers)
        extras: dict[str, Any] = {k: v for k, v in d.items() if k not in _CORE_KEYS}
        nested = extras.pop("extras", None)
        if nested is not None:
            if not isinstance(nested, Mapping):
                raise DataError(
                    f"field 'extras' must be an object, got {type(nested).__name__}",
                    field="extras",
                )
            extras.update(nested)
        return cls(
            id=d["id"],
            dataset=d["dataset"],
            context=d["context"],
            question=d["question"],
            answers=tuple(answers),
            answerable=answerable,
            split=d.get("split") or split or "validation",
            extras=extras,
        )


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _dedup(items: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for s in items:
        if s and s not in seen:
            seen.add(s)
            out.append(s)
    return out


def _req(rec: Mapping[str, Any], key: str, *, what: str = "record") -> Any:
    if not isinstance(rec, Mapping):
        raise DataError(f"{what} must be a JSON object, got {type(rec).__name__}")
    if key not in rec or rec[key] is None:
        raise DataError(f"missing required field {key!r} in {what}", field=key)
    return rec[key]


def _norm_split(split: str) -> str:
    return _SPLIT_ALIASES.get(split, split)


def _block(title: str, text: str) -> str:
    # The paragraph text is stripped, as in the bundled records (a few HotpotQA/IRCoT
    # paragraphs end with a space or start with several).
    return f"{title}: {text.strip()}"


# --------------------------------------------------------------------------------------------
# Official-format converters
# --------------------------------------------------------------------------------------------


def examples_from_squad_v2(
    data: Mapping[str, Any], *, split: str = "validation", where: str | None = None
) -> list[QAExample]:
    """Convert an official SQuAD v2.0 (or v1.1) json object into examples.

    Source format (``train-v2.0.json`` / ``dev-v2.0.json``)::

        {"version": ..., "data": [{"title": ..., "paragraphs": [{"context": ...,
          "qas": [{"id", "question", "answers": [{"text", "answer_start"}],
                   "is_impossible", "plausible_answers"}]}]}]}

    Args:
        data: The parsed json object.
        split: Split name stored on the examples.
        where: File name used in error messages.

    Returns:
        Every question in file order, unanswerable ones included (``answerable`` False,
        ``answers`` empty). ``extras``: ``title``, ``paragraph_key`` (``title#index``),
        ``answer_starts`` and, for unanswerable ones, ``plausible_answers``.

    Raises:
        DataError: If a required field is missing; the message gives the record's position
            (``data[i].paragraphs[j].qas[k]``).
    """
    out: list[QAExample] = []
    articles = _req(data, "data", what="SQuAD json")
    for i, article in enumerate(articles):
        loc = f"data[{i}]"
        try:
            title = article.get("title", "") if isinstance(article, Mapping) else ""
            paragraphs = _req(article, "paragraphs", what=loc)
            for j, para in enumerate(paragraphs):
                loc = f"data[{i}].paragraphs[{j}]"
                context = _req(para, "context", what=loc)
                for k, qa in enumerate(_req(para, "qas", what=loc)):
                    loc = f"data[{i}].paragraphs[{j}].qas[{k}]"
                    out.append(_squad_qa(qa, context, title, j, split, loc))
        except DataError as e:
            raise _locate(e, where, loc) from None
    return out


def _squad_qa(
    qa: Mapping[str, Any], context: str, title: str, para_idx: int, split: str, loc: str
) -> QAExample:
    qid = _req(qa, "id", what=loc)
    question = _req(qa, "question", what=loc)
    raw_answers = qa.get("answers") or []
    texts = [_req(a, "text", what=f"{loc}.answers") for a in raw_answers]
    impossible = qa.get("is_impossible")
    answerable = bool(texts) if impossible is None else not bool(impossible)
    extras: dict[str, Any] = {
        "title": title,
        "paragraph_key": f"{title}#{para_idx}",
        "answer_starts": [a.get("answer_start") for a in raw_answers],
    }
    if "plausible_answers" in qa:
        extras["plausible_answers"] = _dedup(a.get("text", "") for a in qa["plausible_answers"])
    return QAExample(
        id=qid,
        dataset="squad_v2",
        context=context,
        question=question,
        answers=tuple(_dedup(texts)) if answerable else (),
        answerable=answerable,
        split=split,
        extras=extras,
    )


_DATE_FORMS_DMY = ("{m} {d}, {y}", "{d} {m} {y}", "{m} {d} {y}", "{d} {m}, {y}", "{m}. {d}, {y}")
_DATE_FORMS_MY = ("{m} {y}", "{m}, {y}")
_DATE_FORMS_DM = ("{m} {d}", "{d} {m}")


def drop_answer_text(answer: Mapping[str, Any], passage: str = "") -> tuple[str, str | None]:
    """Turn one DROP answer object into a gold string.

    Follows the official DROP evaluation's priority: ``number`` if non-empty, else ``spans``
    (joined with ``", "``), else ``date``. A date is written the way it occurs in ``passage``
    if one of the usual forms (``Month D, YYYY``, ``D Month YYYY``, ``Month YYYY``, ...) is
    found there, else as ``"day month year"`` with empty parts left out.

    Args:
        answer: ``{"number": str, "date": {"day", "month", "year"}, "spans": [str]}``.
        passage: The passage, used to pick a date's surface form.

    Returns:
        ``(text, answer_type)`` with ``answer_type`` in ``"number" | "spans" | "date"``, or
        ``("", None)`` for an empty answer.
    """
    if not isinstance(answer, Mapping):
        return "", None
    number = answer.get("number")
    if number not in (None, ""):
        return str(number).strip(), "number"
    spans = [str(s) for s in (answer.get("spans") or []) if str(s)]
    if spans:
        return ", ".join(spans), "spans"
    date = answer.get("date") or {}
    d, m, y = (str(date.get(k) or "").strip() for k in ("day", "month", "year"))
    if not (d or m or y):
        return "", None
    forms: tuple[str, ...] = ()
    if d and m and y:
        forms = _DATE_FORMS_DMY
    elif m and y and not d:
        forms = _DATE_FORMS_MY
    elif d and m and not y:
        forms = _DATE_FORMS_DM
    for form in forms:
        cand = form.format(d=d, m=m, y=y)
        if cand in passage:
            return cand, "date"
    return " ".join(p for p in (d, m, y) if p), "date"


def _drop_qa(
    qa: Mapping[str, Any], passage: str, passage_id: str, split: str, loc: str
) -> QAExample:
    qid = _req(qa, "query_id", what=loc)
    question = _req(qa, "question", what=loc)
    original = _req(qa, "answer", what=loc)
    candidates = [original] + list(qa.get("validated_answers") or [])
    strings: list[str] = []
    primary, answer_type = "", None
    for cand in candidates:
        text, kind = drop_answer_text(cand, passage)
        if text and not primary:
            primary, answer_type = text, kind
        strings.append(text)
    orig_type = drop_answer_text(original, passage)[1]
    date = original.get("date") if isinstance(original, Mapping) else None
    extras = {
        "primary_answer": primary,
        "answer_type": orig_type or answer_type,
        "answer_spans": list(original.get("spans") or []) if isinstance(original, Mapping) else [],
        "answer_date": dict(date) if orig_type == "date" and date else None,
        "passage_id": passage_id,
    }
    return QAExample(
        id=qid,
        dataset="drop",
        context=passage,
        question=question,
        answers=tuple(_dedup(strings)),
        answerable=True,
        split=split,
        extras=extras,
    )


def examples_from_drop(
    data: Mapping[str, Any], *, split: str = "validation", where: str | None = None
) -> list[QAExample]:
    """Convert an official DROP json object into examples.

    Source format (``drop_dataset_dev.json`` / ``drop_dataset_train.json``)::

        {passage_id: {"passage": ..., "qa_pairs": [{"question", "query_id",
          "answer": {"number", "date": {"day", "month", "year"}, "spans"},
          "validated_answers": [...]}], "wiki_url": ...}}

    Args:
        data: The parsed json object.
        split: Split name stored on the examples.
        where: File name used in error messages.

    Returns:
        Every question in file order. ``answers`` holds the original answer's string first,
        then each validated answer's (see :func:`drop_answer_text`), duplicates removed.
        ``extras``: ``primary_answer``, ``answer_type``, ``answer_spans``, ``answer_date``
        and ``passage_id``.

    Raises:
        DataError: If a required field is missing; the message gives the passage id and the
            question index.
    """
    if not isinstance(data, Mapping):
        raise DataError(f"{where or 'DROP json'}: expected an object keyed by passage id")
    out: list[QAExample] = []
    for passage_id, entry in data.items():
        loc = f"[{passage_id!r}]"
        try:
            passage = _req(entry, "passage", what=loc)
            for k, qa in enumerate(_req(entry, "qa_pairs", what=loc)):
                loc = f"[{passage_id!r}].qa_pairs[{k}]"
                out.append(_drop_qa(qa, passage, str(passage_id), split, loc))
        except DataError as e:
            raise _locate(e, where, loc) from None
    return out


def _hotpot_supporting_titles(supporting_facts: Any) -> list[str]:
    return _dedup(str(sf[0]) for sf in supporting_facts or [] if sf)


def example_from_hotpotqa(record: Mapping[str, Any], *, split: str = "validation") -> QAExample:
    """Convert one record of the official HotpotQA json (a list of such records).

    Source format (``hotpot_dev_distractor_v1.json``, ``hotpot_train_v1.1.json``)::

        {"_id", "question", "answer", "type", "level", "supporting_facts": [[title, sent_id]],
         "context": [[title, [sentence, ...]], ...]}

    The context is one ``"Title: " + "".join(sentences).strip()`` block per paragraph, joined
    by a blank line.

    Args:
        record: One record.
        split: Split name stored on the example.

    Returns:
        The example, ``answers == (answer,)``. ``extras``: ``type``, ``level``,
        ``supporting_facts`` and ``supporting_titles``.

    Raises:
        DataError: If a required field (``_id``, ``question``, ``answer``, ``context``) is
            missing or the context is malformed.
    """
    qid = record.get("_id", record.get("id")) if isinstance(record, Mapping) else None
    if qid is None:
        raise DataError("missing required field '_id' in HotpotQA record", field="_id")
    question = _req(record, "question", what="HotpotQA record")
    answer = _req(record, "answer", what="HotpotQA record")
    blocks = []
    for n, para in enumerate(_req(record, "context", what="HotpotQA record")):
        if not (isinstance(para, (list, tuple)) and len(para) == 2):
            raise DataError(
                f"HotpotQA context[{n}] must be [title, [sentences]], got {para!r:.80}",
                field="context",
            )
        title, sentences = para
        blocks.append(_block(title, "".join(sentences)))
    sfs = [list(sf) for sf in record.get("supporting_facts") or []]
    return QAExample(
        id=qid,
        dataset="hotpotqa",
        context=_PARAGRAPH_SEP.join(blocks),
        question=question,
        answers=tuple(_dedup([answer])),
        answerable=True,
        split=split,
        extras={
            "type": record.get("type"),
            "level": record.get("level"),
            "supporting_facts": sfs,
            "supporting_titles": _hotpot_supporting_titles(sfs),
        },
    )


def _infer_ircot_dataset(qid: str) -> str:
    return "musique" if "hop" in qid.split("__", 1)[0] and "__" in qid else "hotpotqa"


def example_from_ircot(
    record: Mapping[str, Any], *, split: str = "validation", dataset: str | None = None
) -> QAExample:
    """Convert one record of IRCoT's processed jsonl format (Trivedi et al., 2023).

    Source format (e.g. ``processed_data/hotpotqa/dev_subsampled.jsonl``)::

        {"question_id", "question_text", "answers_objects": [{"number", "date", "spans"}],
         "contexts": [{"idx"/"id", "title", "paragraph_text", "is_supporting"}]}

    The context is one ``"Title: paragraph_text"`` block per paragraph (text stripped), joined
    by a blank line; each answer object gives one gold string as in DROP (:func:`drop_answer_text`).

    Args:
        record: One record.
        split: Split name stored on the example.
        dataset: Dataset name; if None, ``"musique"`` for MuSiQue-style ids
            (``2hop__...``), else ``"hotpotqa"``.

    Returns:
        The example. ``extras``: ``type`` and ``level`` (None: IRCoT drops them) and
        ``supporting_titles``.

    Raises:
        DataError: If a required field is missing.
    """
    what = "IRCoT record"
    qid = str(_req(record, "question_id", what=what))
    question = _req(record, "question_text", what=what)
    answers = [drop_answer_text(a)[0] for a in _req(record, "answers_objects", what=what)]
    contexts = _req(record, "contexts", what=what)
    blocks = [
        _block(_req(c, "title", what=f"{what} contexts"), _req(c, "paragraph_text", what=what))
        for c in contexts
    ]
    return QAExample(
        id=qid,
        dataset=dataset or _infer_ircot_dataset(qid),
        context=_PARAGRAPH_SEP.join(blocks),
        question=question,
        answers=tuple(_dedup(answers)),
        answerable=True,
        split=split,
        extras={
            "type": None,
            "level": None,
            "supporting_titles": [c["title"] for c in contexts if c.get("is_supporting")],
        },
    )


def example_from_musique(record: Mapping[str, Any], *, split: str = "validation") -> QAExample:
    """Convert one record of the official MuSiQue jsonl (also the Hub's row schema).

    Source format (``musique_ans_v1.0_dev.jsonl`` etc.)::

        {"id", "paragraphs": [{"idx", "title", "paragraph_text", "is_supporting"}],
         "question", "question_decomposition", "answer", "answer_aliases", "answerable"}

    The context is one ``"Title: paragraph_text"`` block per paragraph (text stripped), in the
    given order, joined by a blank line.

    Args:
        record: One record.
        split: Split name stored on the example.

    Returns:
        The example, ``answers`` = ``answer`` then ``answer_aliases``, ``answerable`` from
        the record (default True). ``extras``: ``hops`` (the id's prefix, e.g. ``"2hop"``)
        and ``supporting_titles``.

    Raises:
        DataError: If a required field is missing.
    """
    what = "MuSiQue record"
    qid = str(_req(record, "id", what=what))
    question = _req(record, "question", what=what)
    answer = _req(record, "answer", what=what)
    paragraphs = _req(record, "paragraphs", what=what)
    blocks = [
        _block(_req(p, "title", what=f"{what} paragraph"), _req(p, "paragraph_text", what=what))
        for p in paragraphs
    ]
    aliases = record.get("answer_aliases") or []
    answerable = record.get("answerable")
    return QAExample(
        id=qid,
        dataset="musique",
        context=_PARAGRAPH_SEP.join(blocks),
        question=question,
        answers=tuple(_dedup([answer, *aliases])),
        answerable=True if answerable is None else bool(answerable),
        split=split,
        extras={
            "hops": qid.split("__", 1)[0] if "__" in qid else None,
            "supporting_titles": [p["title"] for p in paragraphs if p.get("is_supporting")],
        },
    )


# --------------------------------------------------------------------------------------------
# Hub rows
# --------------------------------------------------------------------------------------------


def example_from_hub_row(dataset: str, row: Mapping[str, Any], *, split: str) -> QAExample:
    """Convert one Hugging Face Hub row (schemas of :data:`HUB_IDS`) into an example.

    Args:
        dataset: One of :data:`DATASETS`.
        row: The row as ``datasets`` yields it (sequence features as dicts of lists).
        split: Split name stored on the example.

    Returns:
        The example. ``squad_v2``: ``answers`` from ``answers.text`` (``answerable`` False
        when empty). ``drop``: ``answers`` from ``answers_spans.spans`` (the Hub flattens
        multi-span answers into separate entries, so each span is an alternative);
        ``extras`` ``primary_answer`` (first span), ``answer_type`` (from the first type;
        ``span`` becomes ``spans``), ``answer_spans``, ``answer_date`` (None), ``passage_id``
        (``section_id``). ``hotpotqa``: as :func:`example_from_hotpotqa`. ``musique``: as
        :func:`example_from_musique`.

    Raises:
        DataError: If ``dataset`` is unknown or a required column is missing.
    """
    what = f"{dataset} hub row"
    if dataset == "squad_v2":
        answers = _req(row, "answers", what=what)
        texts = list(answers.get("text") or [])
        title = row.get("title") or ""
        return QAExample(
            id=_req(row, "id", what=what),
            dataset="squad_v2",
            context=_req(row, "context", what=what),
            question=_req(row, "question", what=what),
            answers=tuple(_dedup(texts)),
            answerable=bool(texts),
            split=split,
            extras={"title": title, "answer_starts": list(answers.get("answer_start") or [])},
        )
    if dataset == "drop":
        spans_obj = _req(row, "answers_spans", what=what)
        spans = [str(s) for s in spans_obj.get("spans") or []]
        types = list(spans_obj.get("types") or [])
        first_type = types[0] if types else None
        answer_type = "spans" if first_type in ("span", "spans") else first_type
        return QAExample(
            id=_req(row, "query_id", what=what),
            dataset="drop",
            context=_req(row, "passage", what=what),
            question=_req(row, "question", what=what),
            answers=tuple(_dedup(spans)),
            answerable=True,
            split=split,
            extras={
                "primary_answer": spans[0] if spans else "",
                "answer_type": answer_type,
                "answer_spans": [s for s, t in zip(spans, types) if t in ("span", "spans")],
                "answer_date": None,
                "passage_id": row.get("section_id"),
            },
        )
    if dataset == "hotpotqa":
        ctx = _req(row, "context", what=what)
        if isinstance(ctx, Mapping):
            ctx = [list(p) for p in zip(ctx.get("title") or [], ctx.get("sentences") or [])]
        sf = row.get("supporting_facts") or []
        if isinstance(sf, Mapping):
            sf = [list(p) for p in zip(sf.get("title") or [], sf.get("sent_id") or [])]
        rec = {
            "_id": _req(row, "id", what=what),
            "question": _req(row, "question", what=what),
            "answer": _req(row, "answer", what=what),
            "type": row.get("type"),
            "level": row.get("level"),
            "supporting_facts": sf,
            "context": ctx,
        }
        return example_from_hotpotqa(rec, split=split)
    if dataset == "musique":
        rec = dict(row)
        paragraphs = rec.get("paragraphs")
        if isinstance(paragraphs, Mapping):  # columnar form, in case a dump flattens it
            keys = list(paragraphs)
            rec["paragraphs"] = [dict(zip(keys, vals)) for vals in zip(*paragraphs.values())]
        return example_from_musique(rec, split=split)
    raise _unknown_dataset(dataset)


def _load_hub(dataset: str, split: str) -> Iterator[QAExample]:
    try:
        import datasets  # noqa: PLC0415  (lazy: heavy import, optional network use)
    except ImportError as e:  # pragma: no cover - datasets is a dependency
        raise DataError(
            "from_hub=True needs the 'datasets' package (pip install datasets)"
        ) from e
    hub = HUB_IDS[dataset]
    args = hub if isinstance(hub, tuple) else (hub,)
    try:
        rows = datasets.load_dataset(*args, split=split)
    except Exception as e:  # noqa: BLE001 - network, auth and split errors all land here
        raise DataError(
            f"could not load {dataset!r} split {split!r} from the Hugging Face Hub "
            f"({', '.join(args)}): {type(e).__name__}: {e}"
        ) from e
    for n, row in enumerate(rows):
        try:
            yield example_from_hub_row(dataset, row, split=split)
        except DataError as e:
            raise e.at(f"hub:{'/'.join(args)}[{split}][{n}]") from None


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def _locate(e: DataError, where: str | None, loc: str) -> DataError:
    return e.at(f"{where}: {loc}" if where else loc)


def _record_kind(rec: Any) -> str:
    """Classify one JSON record (a line of a JSONL file or an item of a JSON list)."""
    if not isinstance(rec, Mapping):
        return "unknown"
    if "question_text" in rec and "contexts" in rec:
        return "ircot"
    if "paragraphs" in rec and "question" in rec:
        return "musique"
    if "_id" in rec or ("supporting_facts" in rec and "context" in rec):
        return "hotpotqa"
    if "passage" in rec and "answers_spans" in rec:
        return "hub_drop"
    if isinstance(rec.get("answers"), Mapping) and "context" in rec:
        return "hub_squad_v2"
    return "jsonl"


def _convert_record(rec: Any, kind: str, split: str) -> QAExample:
    if kind == "ircot":
        return example_from_ircot(rec, split=split)
    if kind == "musique":
        return example_from_musique(rec, split=split)
    if kind == "hotpotqa":
        return example_from_hotpotqa(rec, split=split)
    if kind == "hub_drop":
        return example_from_hub_row("drop", rec, split=split)
    if kind == "hub_squad_v2":
        return example_from_hub_row("squad_v2", rec, split=split)
    return QAExample.from_dict(rec, split=split)


_WHOLE_KINDS = {"squad_v2_json", "drop_json"}


def _classify_whole(obj: Any) -> str:
    if isinstance(obj, Mapping):
        if isinstance(obj.get("data"), list):
            return "squad_v2_json"
        if obj and all(isinstance(v, Mapping) and "qa_pairs" in v for v in obj.values()):
            return "drop_json"
        return "record"
    if isinstance(obj, list):
        return "list"
    return "unknown"


def detect_format(path: str | os.PathLike[str]) -> str:
    """Detect a file's format from its content (the extension is ignored).

    Args:
        path: The file.

    Returns:
        ``"squad_v2_json"``, ``"drop_json"``, ``"hotpotqa_json"`` (a JSON list of HotpotQA
        records), ``"musique_jsonl"``, ``"ircot_jsonl"``, ``"jsonl"`` (our format), or
        ``"json_list"`` (a JSON list of our records); JSONL files are classified by their
        first record.

    Raises:
        DataError: If the file is missing, empty or not JSON/JSONL.
    """
    p = Path(path)
    obj, lines = _parse_file(p)
    if lines is not None:
        for _lineno, rec in lines:
            kind = _record_kind(rec)
            return {"musique": "musique_jsonl", "ircot": "ircot_jsonl"}.get(kind, "jsonl")
        raise DataError(f"{p}: file has no records")
    kind = _classify_whole(obj)
    if kind == "list":
        first = _record_kind(obj[0]) if obj else "jsonl"
        return {"hotpotqa": "hotpotqa_json", "musique": "musique_json", "ircot": "ircot_json"}.get(
            first, "json_list"
        )
    if kind == "record":
        return _record_format(obj)
    return kind


def _record_format(rec: Mapping[str, Any]) -> str:
    kind = _record_kind(rec)
    return {"musique": "musique_jsonl", "ircot": "ircot_jsonl"}.get(kind, "jsonl")


def _iter_jsonl(p: Path, text: str) -> Iterator[tuple[int, Any]]:
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(
                f"malformed JSON line: {e.msg} (column {e.colno})", location=f"{p}:{lineno}"
            ) from None


def _parse_file(p: Path) -> tuple[Any, Iterator[tuple[int, Any]] | None]:
    """Return ``(whole_object, None)`` for a JSON document or ``(None, lines)`` for JSONL."""
    if not p.exists():
        raise DataError(f"no such file: {p}")
    if p.is_dir():
        raise DataError(f"{p} is a directory, not a data file")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{p}: not UTF-8 text ({e})") from None
    stripped = text.lstrip()
    if not stripped:
        raise DataError(f"{p}: file is empty")
    # JSONL if the first non-blank line is a complete JSON object on its own.
    first_line = stripped.split("\n", 1)[0].strip()
    first_obj: Any = None
    try:
        first_obj = json.loads(first_line)
    except json.JSONDecodeError:
        first_obj = None
    if isinstance(first_obj, dict):
        rest = stripped[len(stripped.split("\n", 1)[0]) :].strip()
        if rest or _classify_whole(first_obj) == "record":
            return None, _iter_jsonl(p, text)
        return first_obj, None  # a one-line SQuAD/DROP json
    if first_line.startswith("{") or first_line.startswith("["):
        try:
            return json.loads(text), None
        except json.JSONDecodeError as e:
            if first_line.startswith("{") and e.msg == "Extra data":
                return None, _iter_jsonl(p, text)
            raise DataError(
                f"malformed JSON: {e.msg} (column {e.colno})", location=f"{p}:{e.lineno}"
            ) from None
    # Something else on the first line: report it as a malformed JSONL line.
    return None, _iter_jsonl(p, text)


def _iter_file(p: Path, split: str) -> Iterator[QAExample]:
    obj, lines = _parse_file(p)
    if lines is not None:
        for lineno, rec in lines:
            try:
                yield _convert_record(rec, _record_kind(rec), split)
            except DataError as e:
                raise e.at(f"{p}:{lineno}") from None
        return
    kind = _classify_whole(obj)
    if kind == "squad_v2_json":
        yield from examples_from_squad_v2(obj, split=split, where=str(p))
    elif kind == "drop_json":
        yield from examples_from_drop(obj, split=split, where=str(p))
    elif kind == "list":
        for n, rec in enumerate(obj):
            try:
                yield _convert_record(rec, _record_kind(rec), split)
            except DataError as e:
                raise e.at(f"{p}: [{n}]") from None
    elif kind == "record":
        try:
            yield _convert_record(obj, _record_kind(obj), split)
        except DataError as e:
            raise e.at(f"{p}:1") from None
    else:
        raise DataError(
            f"{p}: unrecognised data format (expected our JSONL, SQuAD v2.0 json, DROP json, "
            "HotpotQA json, MuSiQue jsonl or IRCoT jsonl)"
        )


# --------------------------------------------------------------------------------------------
# Bundled records and the public loader
# --------------------------------------------------------------------------------------------


def _unknown_dataset(name: str) -> DataError:
    return DataError(
        f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}. "
        "A path to a data file (our JSONL, or an official SQuAD v2.0 / DROP / HotpotQA / "
        "MuSiQue file) is also accepted."
    )


def bundled_splits(dataset: str) -> list[str]:
    """Return the splits bundled for ``dataset`` (e.g. ``["train", "validation"]``).

    Raises:
        DataError: If ``dataset`` is not one of :data:`DATASETS`.
    """
    if dataset not in DATASETS:
        raise _unknown_dataset(dataset)
    d = BUNDLED_DIR / dataset
    return sorted(f.stem for f in d.glob("*.jsonl")) if d.is_dir() else []


def bundled_path(dataset: str, split: str = "validation") -> Path:
    """Return the path of a bundled record file.

    Args:
        dataset: One of :data:`DATASETS`.
        split: ``"validation"`` (alias ``"dev"``) or ``"train"``.

    Returns:
        ``interp/bundled/<dataset>/<split>.jsonl``.

    Raises:
        DataError: If the dataset is unknown or that split is not bundled (DROP has no
            bundled train split).
    """
    split = _norm_split(split)
    available = bundled_splits(dataset)
    path = BUNDLED_DIR / dataset / f"{split}.jsonl"
    if split not in available or not path.is_file():
        raise DataError(
            f"no bundled {split!r} split for {dataset!r} (bundled splits: "
            f"{', '.join(available) or 'none'}); use from_hub=True or pass a file path. "
            "See interp/bundled/SOURCES.md."
        )
    return path


def load_examples(
    source: str | os.PathLike[str],
    *,
    split: str = "validation",
    limit: int | None = None,
    include_unanswerable: bool = False,
    from_hub: bool = False,
) -> list[QAExample]:
    """Load QA examples from a bundled dataset, a file, or the Hugging Face Hub.

    Args:
        source: A dataset name from :data:`DATASETS` (reads the bundled records in
            ``interp/bundled/<name>/<split>.jsonl``, or the Hub with ``from_hub=True``) or a
            path to a file in one of these formats, detected from the content: our JSONL
            (also the bundled files), official SQuAD v2.0 json, official DROP json, official
            HotpotQA json, official MuSiQue jsonl, or IRCoT processed jsonl.
        split: Which split of a named dataset (``"validation"``, alias ``"dev"``, or
            ``"train"``). For files, the split stored on examples whose record has none.
        limit: Keep only the first ``limit`` examples after filtering, in source order.
        include_unanswerable: Keep examples with ``answerable`` False (SQuAD 2.0
            unanswerable questions); by default they are dropped.
        from_hub: Load a named dataset with ``datasets.load_dataset`` using
            :data:`HUB_IDS` (needs network access or a warm cache).

    Returns:
        The examples, in source order.

    Raises:
        DataError: If the dataset name is unknown (the message lists the known names and
            says paths are accepted), the split is not bundled, the file is missing or in an
            unknown format, a JSONL line is malformed (message gives ``path:line``), a
            required field is missing (message names it), or the Hub load fails.
        ValueError: If ``limit`` is negative.
    """
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")
    split = _norm_split(split)
    name = os.fspath(source)
    if name in DATASETS:
        if from_hub:
            it: Iterator[QAExample] = _load_hub(name, split)
        else:
            it = _iter_file(bundled_path(name, split), split)
    else:
        p = Path(name).expanduser()
        if from_hub:
            raise DataError(
                f"from_hub=True needs a dataset name ({', '.join(DATASETS)}), got {name!r}"
            )
        if not p.exists():
            if os.sep in name or "/" in name or p.suffix:
                raise DataError(f"no such file: {p}")
            raise _unknown_dataset(name)
        it = _iter_file(p, split)
    out: list[QAExample] = []
    if limit == 0:
        return out
    for ex in it:
        if not include_unanswerable and not ex.answerable:
            continue
        out.append(ex)
        if limit is not None and len(out) >= limit:
            break
    return out


def save_examples(examples: Iterable[QAExample], path: str | os.PathLike[str]) -> Path:
    """Write examples to ``path`` in our JSONL format (UTF-8, one object per line).

    Args:
        examples: The examples.
        path: Output file; parent directories are created.

    Returns:
        The path written.

    Raises:
        DataError: If an example's ``extras`` is not JSON-serialisable.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for ex in examples:
        try:
            lines.append(json.dumps(ex.to_dict(), ensure_ascii=False))
        except (TypeError, ValueError) as e:
            raise DataError(f"example {ex.id!r} is not JSON-serialisable: {e}") from None
    p.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return p
