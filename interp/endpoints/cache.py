"""The append-only request cache of a run directory: no request is paid for twice.

``DIR/requests.jsonl`` holds one line per answered request: ``{"key", "request",
"response", "time"}``. The key is the sha256 of the request's identity (:func:`request_key`:
base URL, model, messages, sampling parameters and prompt version); a request whose key is in
the file is answered from it, so a rerun, ``interp metrics`` and ``interp oracle-agreement``
make no request for work already done, and a killed run resumes with every answered request
kept. Lines are appended under a file lock (several processes may share a run directory),
flushed and fsynced; a line cut by a kill is dropped on the next read (its request is made
again). Failed requests are never stored. The API key is not part of a request and is never
written.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock

__all__ = ["CACHE_FILE", "RequestCache", "request_key"]

CACHE_FILE = "requests.jsonl"
"""The cache's file name in a run directory."""


def request_key(request: Mapping[str, Any]) -> str:
    """sha256 (hex) of a request's identity, stable across processes.

    Args:
        request: ``{"base_url", "model", "messages", "params", "prompt_version"}`` (JSON-safe;
            ``params`` are the sampling parameters and server options sent).
    """
    text = json.dumps(request, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class RequestCache:
    """Answered requests of one run directory (module docstring), or in memory only.

    Args:
        path: the JSONL file (``DIR/requests.jsonl``); None keeps answers in memory only.

    Attributes:
        hits: requests answered from the cache by this object.
        misses: requests it did not hold.
    """

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._rows: dict[str, dict[str, Any]] = {}
        self.hits = self.misses = 0
        if self.path is not None and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill: made again
                    continue
                self._rows[row["key"]] = row["response"]

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored response of ``key`` (counts a hit or a miss)."""
        with self._lock:
            row = self._rows.get(key)
            if row is None:
                self.misses += 1
            else:
                self.hits += 1
            return row

    def peek(self, key: str) -> dict[str, Any] | None:
        """The stored response of ``key``, not counted as a hit or miss."""
        with self._lock:
            return self._rows.get(key)

    def put(self, key: str, request: Mapping[str, Any], response: Mapping[str, Any], *,
            replace: bool = False) -> None:
        """Store an answered request: in memory, and appended to the file (flushed, fsynced).

        ``replace``: store it even when the key is stored (the later line wins on reading).
        """
        with self._lock:
            if key in self._rows and (not replace or self._rows[key] == dict(response)):
                return
            self._rows[key] = dict(response)
            if self.path is None:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps({"key": key, "request": request, "response": response,
                               "time": datetime.now(timezone.utc).isoformat(timespec="seconds")},
                              ensure_ascii=False)
            with FileLock(str(self.path) + ".lock"), open(self.path, "ab+") as f:
                f.seek(0, os.SEEK_END)
                if f.tell():  # a partial last line left by a kill is cut off first
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        data = self.path.read_bytes()
                        f.truncate(data.rfind(b"\n") + 1)
                f.seek(0, os.SEEK_END)
                f.write((line + "\n").encode())
                f.flush()
                os.fsync(f.fileno())
