"""Converters from the datasets' official formats and Hub rows into :class:`QAExample`.

SQuAD v2.0 json, DROP json, HotpotQA json, MuSiQue jsonl, IRCoT's processed jsonl and the
Hugging Face Hub rows of :data:`interp.data.HUB_IDS`. How each builds the context and the gold
answers is described in :mod:`interp.data`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from interp.core.errors import DataError
from interp.data.examples import QAExample, _dedup, _locate, _req, _unknown_dataset

__all__ = [
    "drop_answer_text",
    "example_from_hotpotqa",
    "example_from_hub_row",
    "example_from_ircot",
    "example_from_musique",
    "examples_from_drop",
    "examples_from_squad_v2",
]

_PARAGRAPH_SEP = "\n\n"


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
    convert = _HUB_CONVERTERS.get(dataset)
    if convert is None:
        raise _unknown_dataset(dataset)
    return convert(row, split, f"{dataset} hub row")


def _hub_squad_v2(row: Mapping[str, Any], split: str, what: str) -> QAExample:
    answers = _req(row, "answers", what=what)
    texts = list(answers.get("text") or [])
    return QAExample(
        id=_req(row, "id", what=what),
        dataset="squad_v2",
        context=_req(row, "context", what=what),
        question=_req(row, "question", what=what),
        answers=tuple(_dedup(texts)),
        answerable=bool(texts),
        split=split,
        extras={"title": row.get("title") or "",
                "answer_starts": list(answers.get("answer_start") or [])},
    )


def _hub_drop(row: Mapping[str, Any], split: str, what: str) -> QAExample:
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


def _hub_hotpotqa(row: Mapping[str, Any], split: str, what: str) -> QAExample:
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


def _hub_musique(row: Mapping[str, Any], split: str, what: str) -> QAExample:
    rec = dict(row)
    paragraphs = rec.get("paragraphs")
    if isinstance(paragraphs, Mapping):  # columnar form, in case a dump flattens it
        keys = list(paragraphs)
        rec["paragraphs"] = [dict(zip(keys, vals)) for vals in zip(*paragraphs.values())]
    return example_from_musique(rec, split=split)


_HUB_CONVERTERS = {"squad_v2": _hub_squad_v2, "drop": _hub_drop, "hotpotqa": _hub_hotpotqa,
                   "musique": _hub_musique}

