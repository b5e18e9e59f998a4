r"""JSON lines that survive a kill and any text: the one writer and reader of every JSONL file.

Writing (:func:`json_line`): one JSON document per line, UTF-8, ``ensure_ascii=False``, and the
three Unicode line separators that are legal inside JSON strings (U+2028, U+2029, U+0085)
written as ``\u`` escapes, so that no reader, however it splits lines, cuts a record.

Reading (:func:`parse_jsonl`): the bytes are split on ``\n`` only (never
``str.splitlines``, which also splits on U+2028, U+2029, U+0085, U+001C-U+001E, ``\v`` and
``\f``, all legal inside a JSON string), and each line is decoded as UTF-8 on its own. The
last line is the only one a killed writer can leave torn: when it is complete JSON without its
newline it is kept; when it is cut (inside a document, or inside a multi-byte UTF-8 character)
it is reported as torn and left out, with every finished line kept. A malformed line before
the last is an error naming the line.

See https://jsonlines.org/ and RFC 8259 section 7 (U+2028 and U+2029 need no escape in JSON).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JsonlRead", "json_line", "json_lines", "parse_jsonl"]

_SEPARATORS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}


def json_line(obj: Any) -> str:
    r"""One JSONL line (with its ``\n``) for ``obj`` (module docstring).

    Raises:
        TypeError, ValueError: ``obj`` is not JSON-serialisable (as ``json.dumps``).
    """
    text = json.dumps(obj, ensure_ascii=False)
    for ch, esc in _SEPARATORS.items():
        if ch in text:  # json.dumps emits them only inside strings: the escape is exact
            text = text.replace(ch, esc)
    return text + "\n"


def json_lines(rows: Iterable[Any]) -> str:
    """The JSONL text of ``rows`` (:func:`json_line` each)."""
    return "".join(json_line(r) for r in rows)


@dataclass
class JsonlRead:
    r"""What :func:`parse_jsonl` read.

    Attributes:
        rows: ``(line number, document)`` of every whole line, in order.
        torn: the 1-based number of a torn last line (left out), or None.
        torn_reason: why it is torn (the decode or JSON error).
        ends_without_newline: the last whole line lacks its ``\n`` (a writer killed after
            the document and before the newline): an appender must add it first.
        torn_offset: byte offset where a torn last line starts (what to cut to repair).
    """

    rows: list[tuple[int, Any]] = field(default_factory=list)
    torn: int | None = None
    torn_reason: str = ""
    ends_without_newline: bool = False
    torn_offset: int | None = None


class JsonlLineError(ValueError):
    """A malformed line that is not the last (the file is damaged, not torn)."""

    def __init__(self, lineno: int, reason: str):
        super().__init__(f"line {lineno}: {reason}")
        self.lineno, self.reason = lineno, reason


def parse_jsonl(data: bytes, *, bom: bool = False) -> JsonlRead:
    """Parse JSONL bytes (module docstring).

    Args:
        data: the file's bytes.
        bom: strip a leading UTF-8 byte-order mark (user data files).

    Returns:
        A :class:`JsonlRead`.

    Raises:
        JsonlLineError: a line other than the last is not UTF-8 or not JSON.
    """
    if bom and data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    out = JsonlRead()
    parts = data.split(b"\n")
    offset = 0
    for n, raw in enumerate(parts, 1):
        start, offset = offset, offset + len(raw) + 1
        if not raw.strip():
            continue
        last = n == len(parts)  # no newline after it
        try:
            out.rows.append((n, json.loads(raw.decode("utf-8"))))
        except UnicodeDecodeError as err:
            reason = f"not UTF-8 ({err.reason} at byte {err.start})"
        except json.JSONDecodeError as err:
            reason = f"malformed JSON ({err.msg}, column {err.colno})"
        else:
            out.ends_without_newline = last
            continue
        if not last:
            raise JsonlLineError(n, reason)
        out.torn, out.torn_reason, out.torn_offset = n, reason, start
    return out
