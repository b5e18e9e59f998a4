"""Reading examples: bundled records, files in any supported format, the Hugging Face Hub."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from interp.core.errors import DataError
from interp.core.jsonl import json_line
from interp.core.names import did_you_mean
from interp.data import formats
from interp.data.examples import (
    DATASETS,
    QAExample,
    _norm_split,
    _unknown_dataset,
)

__all__ = [
    "BUNDLED_DIR",
    "HUB_IDS",
    "bundled_path",
    "bundled_splits",
    "detect_format",
    "load_examples",
    "load_study_split",
    "passage_key",
    "passage_turns",
    "round_robin",
    "save_examples",
]

T = TypeVar("T")

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
BUNDLED_DIR: Path = Path(__file__).resolve().parent.parent / "bundled"


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
            yield formats.example_from_hub_row(dataset, row, split=split)
        except DataError as e:
            raise e.at(f"hub:{'/'.join(args)}[{split}][{n}]") from None


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def _row_kind(rec: Any) -> str:
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


def _convert_row(rec: Any, kind: str, split: str, dataset: str | None = None) -> QAExample:
    if kind == "ircot":
        return formats.example_from_ircot(rec, split=split)
    if kind == "musique":
        return formats.example_from_musique(rec, split=split)
    if kind == "hotpotqa":
        return formats.example_from_hotpotqa(rec, split=split)
    if kind == "hub_drop":
        return formats.example_from_hub_row("drop", rec, split=split)
    if kind == "hub_squad_v2":
        return formats.example_from_hub_row("squad_v2", rec, split=split)
    return QAExample.from_dict(rec, split=split, dataset=dataset)


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
            kind = _row_kind(rec)
            return {"musique": "musique_jsonl", "ircot": "ircot_jsonl"}.get(kind, "jsonl")
        raise DataError(f"{p}: file has no records")
    kind = _classify_whole(obj)
    if kind == "list":
        first = _row_kind(obj[0]) if obj else "jsonl"
        return {"hotpotqa": "hotpotqa_json", "musique": "musique_json", "ircot": "ircot_json"}.get(
            first, "json_list"
        )
    if kind == "record":
        return _row_format(obj)
    return kind


def _row_format(rec: Mapping[str, Any]) -> str:
    kind = _row_kind(rec)
    return {"musique": "musique_jsonl", "ircot": "ircot_jsonl"}.get(kind, "jsonl")


def _iter_jsonl(p: Path, text: str) -> Iterator[tuple[int, Any]]:
    # "\n" only: str.splitlines also splits on U+2028/U+2029/U+0085, legal inside strings
    for lineno, line in enumerate(text.split("\n"), start=1):
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
    """The examples of a data file, refusing an id that two records share.

    Raises:
        DataError: as :func:`_parse_file` and the converters, or two records with the same
            id (the message names the file, the id and both lines or record numbers): a run
            keys its records, recordings and parts by (dataset, id), so a duplicate would
            share them.
    """
    seen: dict[str, str] = {}
    for where, ex in _iter_file_at(p, split):
        if (first := seen.setdefault(ex.id, where)) != where:
            raise DataError(f"{p}: duplicate id {ex.id!r} ({first} and {where}): give every "
                            f"record its own id")
        yield ex


def _iter_file_at(p: Path, split: str) -> Iterator[tuple[str, QAExample]]:
    """``(where, example)`` for each record of a file (``line N`` or ``record N``)."""
    obj, lines = _parse_file(p)
    if lines is not None:
        for lineno, rec in lines:
            try:
                ex = _convert_row(rec, _row_kind(rec), split, p.stem)
            except DataError as e:
                raise e.at(f"{p}:{lineno}") from None
            yield f"line {lineno}", ex
        return
    kind = _classify_whole(obj)
    if kind == "squad_v2_json":
        it = formats.examples_from_squad_v2(obj, split=split, where=str(p))
        yield from ((f"question {n + 1}", ex) for n, ex in enumerate(it))
    elif kind == "drop_json":
        it = formats.examples_from_drop(obj, split=split, where=str(p))
        yield from ((f"question {n + 1}", ex) for n, ex in enumerate(it))
    elif kind == "list":
        for n, rec in enumerate(obj):
            try:
                ex = _convert_row(rec, _row_kind(rec), split, p.stem)
            except DataError as e:
                raise e.at(f"{p}: [{n}]") from None
            yield f"record [{n}]", ex
    elif kind == "record":
        try:
            ex = _convert_row(obj, _row_kind(obj), split, p.stem)
        except DataError as e:
            raise e.at(f"{p}:1") from None
        yield "line 1", ex
    else:
        raise DataError(
            f"{p}: unrecognised data format (expected our JSONL, SQuAD v2.0 json, DROP json, "
            "HotpotQA json, MuSiQue jsonl or IRCoT jsonl)"
        )


# --------------------------------------------------------------------------------------------
# Bundled records and the public loader
# --------------------------------------------------------------------------------------------


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
            f"{', '.join(available) or 'none'}); load it from the hub (--from-hub; config key "
            "from_hub = true; from_hub=True in Python) or pass a file path. "
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
        limit: Keep only ``limit`` examples after filtering: the first ``limit`` of the
            round-robin order (:func:`round_robin`; one question per passage before any
            passage gives a second). None keeps all.
        include_unanswerable: Keep examples with ``answerable`` False (SQuAD 2.0
            unanswerable questions); by default they are dropped.
        from_hub: Load a named dataset with ``datasets.load_dataset`` using
            :data:`HUB_IDS` (needs network access or a warm cache).

    Returns:
        The examples in round-robin passage order (:func:`round_robin`): the first question
        of every passage in order of first appearance, then every passage's second, and so
        on. Deterministic; the sample for a smaller ``limit`` is a prefix of the sample for a
        larger one.

    Raises:
        DataError: If the dataset name is unknown (the message lists the known names and
            says paths are accepted), the split is not bundled, the file is missing or in an
            unknown format, a JSONL line is malformed (message gives ``path:line``), a
            required field is missing (message names it), or the Hub load fails.
        DataError: If ``limit`` is negative or not an int (a ``ValueError``).
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                              or limit < 0):
        raise DataError(f"limit must be a non-negative int or None, got {limit!r}")
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
                f"--from-hub (from_hub) needs a dataset name ({', '.join(DATASETS)}), got {name!r}"
            )
        if not p.exists():
            if os.sep in name or "/" in name or p.suffix:
                raise DataError(f"no such file: {p}{did_you_mean(name, DATASETS)}; the bundled "
                                f"datasets are {', '.join(DATASETS)} (a name, not a path)")
            raise _unknown_dataset(name)
        it = _iter_file(p, split)
    if limit == 0:
        return []
    return round_robin([ex for ex in it if include_unanswerable or ex.answerable], limit)


def passage_key(item: QAExample | Mapping[str, Any]) -> str:
    """The passage an example (or a run record) belongs to: its dataset plus a context hash.

    Args:
        item: A :class:`QAExample` or a mapping with ``dataset`` and ``context``.

    Returns:
        ``"<dataset>:<first 12 hex digits of sha1(context)>"``, the same key as
        :func:`interp.methods.probing.passage_groups` gives a run record.
    """
    if isinstance(item, QAExample):
        dataset, context = item.dataset, item.context
    else:
        dataset, context = item.get("dataset"), str(item.get("context", ""))
    return f"{dataset}:{hashlib.sha1(context.encode()).hexdigest()[:12]}"


def passage_turns(items: Iterable[Any], count: int,
                  key: Callable[[Any], Hashable] = passage_key) -> list[int]:
    """The share (``0..count-1``) of each item when whole passages are dealt out in turn.

    Passages in order of first appearance; passage ``k`` goes to share ``k mod count``. The
    one rule of every split of a run over processes: Study 1's shards
    (:func:`interp.launch.assign`) and the parts phase of a stage
    (:func:`interp.stages.common.own_share`), so a passage never spans two shares and the
    passage-cluster bootstrap of a merged run sees it whole.

    Args:
        items: Examples or run records, in the order the unsharded run selects them.
        count: The number of shares (>= 1).
        key: The passage of an item (default :func:`passage_key`).

    Returns:
        One share index per item.

    Raises:
        DataError: If ``count`` < 1.
    """
    if count < 1:
        raise DataError(f"count must be >= 1, got {count!r}")
    order: dict[Hashable, int] = {}
    return [order.setdefault(key(it), len(order)) % count for it in items]


def load_study_split(source: str | os.PathLike[str], split: str, *, limit: int | None = None,
                     from_hub: bool = False) -> list[QAExample]:
    """The records of one side of a train/validation study, disjoint from the other by passage.

    A named dataset (:data:`interp.data.DATASETS`) has its own splits: this is
    :func:`load_examples` of ``split``. A file holds one set of records, which
    :func:`load_examples` returns whatever split is asked, so training on ``split="train"``
    and evaluating on ``split="validation"`` of the same file would evaluate on the records
    trained on. Here its passages are dealt out in turn (:func:`passage_turns`, 2 shares): the
    1st, 3rd, 5th ... passage (share 0) are the validation side, the 2nd, 4th ... (share 1)
    the train side, so no passage is on both sides and a file of one record per passage is
    cut in half.

    Args:
        source: A dataset name or a file (as :func:`load_examples`).
        split: ``"train"`` or ``"validation"`` (alias ``"dev"``).
        limit: Keep the first ``limit`` of this side, in round-robin order (None: all).
        from_hub: As :func:`load_examples` (named datasets only).

    Returns:
        The examples of this side, in round-robin passage order.

    Raises:
        DataError: as :func:`load_examples`; an unknown split.
    """
    split = _norm_split(split)
    if os.fspath(source) in DATASETS:
        return load_examples(source, split=split, limit=limit, from_hub=from_hub)
    if split not in ("train", "validation"):
        raise DataError(f"a file's study split is 'train' or 'validation', got {split!r}")
    every = load_examples(source, split=split, from_hub=from_hub)
    side = 0 if split == "validation" else 1
    kept = [ex for ex, turn in zip(every, passage_turns(every, 2), strict=True) if turn == side]
    return kept if limit is None else kept[:limit]


def round_robin(items: Sequence[T], limit: int | None = None,
                key: Callable[[T], Hashable] = passage_key) -> list[T]:
    """Order items round-robin across passages and keep the first ``limit``.

    Passages are taken in order of first appearance; the result holds the first item of
    every passage, then the second item of every passage that has one, and so on, each
    passage's items in their given order. Example: passages A (a1, a2, a3), B (b1), C (c1,
    c2) in file order a1 a2 a3 b1 c1 c2 give a1 b1 c1 a2 c2 a3; ``limit=4`` gives a1 b1 c1
    a2. Deterministic (no seed); idempotent; the result for a smaller limit is a prefix of
    the result for a larger one.

    Args:
        items: Examples or run records.
        limit: How many to keep (None: all, reordered).
        key: The passage of an item (default :func:`passage_key`).

    Returns:
        The reordered (and truncated) list.

    Raises:
        DataError: If ``limit`` is negative.
    """
    if limit is not None and limit < 0:
        raise DataError(f"limit must be a non-negative int or None, got {limit!r}")
    groups: dict[Hashable, list[T]] = {}
    for it in items:
        groups.setdefault(key(it), []).append(it)
    n = len(items) if limit is None else min(limit, len(items))
    out: list[T] = []
    depth = 0
    while len(out) < n:
        out.extend(g[depth] for g in groups.values() if depth < len(g))
        depth += 1
    return out[:n]


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
            lines.append(json_line(ex.to_dict()))
        except (TypeError, ValueError) as e:
            raise DataError(f"example {ex.id!r} is not JSON-serialisable: {e}") from None
    p.write_text("".join(lines), encoding="utf-8")
    return p
