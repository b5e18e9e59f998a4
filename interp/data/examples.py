"""The in-context QA example (:class:`QAExample`) and the helpers every format shares."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from interp.core.errors import DataError
from interp.core.names import did_you_mean

__all__ = ["DATASETS", "QAExample"]

#: Dataset names understood by :func:`interp.data.load_examples` (bundled, hub).
DATASETS: tuple[str, ...] = ("squad_v2", "drop", "hotpotqa", "musique")

_SPLIT_ALIASES = {"dev": "validation", "val": "validation", "valid": "validation"}
_CORE_KEYS = ("id", "dataset", "split", "question", "context", "answers", "answerable")

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
    def from_dict(cls, d: Mapping[str, Any], *, split: str | None = None,
                  dataset: str | None = None) -> QAExample:
        """Build an example from one record of our JSONL format (or a bundled record).

        Extra keys may be given in an ``extras`` object or at the top level (as the bundled
        files do); both are accepted and merged, ``extras`` winning on a clash. The format's
        fields are listed in :mod:`interp.data`.

        Args:
            d: The record.
            split: Split to use when the record has no ``split`` key (default
                ``"validation"``).
            dataset: Dataset name to use when the record has no ``dataset`` key (the file
                loader passes the file's stem). Without either, ``dataset`` is required.

        Returns:
            The example.

        Raises:
            DataError: If ``d`` is not a mapping, a required field (``id``, ``question``,
                ``context``, ``answers``; ``dataset`` when no default is given) is missing,
                or a field is invalid. The error's ``field`` attribute names the field.
        """
        if not isinstance(d, Mapping):
            raise DataError(f"record must be a JSON object, got {type(d).__name__}")
        if d.get("dataset") is None and dataset is not None:
            d = {**d, "dataset": dataset}
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



def _unknown_dataset(name: str) -> DataError:
    return DataError(
        f"unknown dataset {name!r}{did_you_mean(name, DATASETS)}; known datasets: "
        f"{', '.join(DATASETS)}. "
        "A path to a data file (our JSONL, or an official SQuAD v2.0 / DROP / HotpotQA / "
        "MuSiQue file) is also accepted."
    )


def _locate(e: DataError, where: str | None, loc: str) -> DataError:
    return e.at(f"{where}: {loc}" if where else loc)
