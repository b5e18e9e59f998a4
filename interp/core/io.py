"""Atomic writers and readers of a run directory's files, and the signatures of stored parts.

JSON files are written to a temporary file and renamed (atomic): a reader never sees a
half-written file, and a crash leaves the previous version (or nothing) in place. Every
resumable part stores the :func:`signature` of what produced it; :func:`is_fresh` compares it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from interp.core.errors import RunDirError
from interp.core.jsonl import JsonlLineError, JsonlRead, json_lines, parse_jsonl

_UMASK = os.umask(0)
os.umask(_UMASK)
"""The process's file-creation mask, read once at import (os.umask can only be read by
setting it)."""


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it onto ``path`` (atomic).

    The one mechanism behind every writer of the run directory: a reader never sees a
    half-written file, and a crash leaves the previous version (or nothing) in place. The
    temporary file is removed if the body raises. Writers that create the file themselves
    (pandas, numpy, safetensors, torch.save) write to the yielded path.
    """
    path = Path(path)
    tmp = tmp_path_for(path)
    try:
        yield tmp
        # the modes a plain open() gives (some writers, safetensors among them, create 0600):
        # results are meant to be shared
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def tmp_path_for(path: Path) -> Path:
    """A fresh temporary name next to ``path`` (its folder created): ``.NAME.PID.HEX.tmpSUFFIX``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp{path.suffix}"


def is_tmp_path(path: str | Path) -> bool:
    """Whether ``path`` is a temporary file of :func:`atomic_path` (a killed writer's leftover)."""
    name = Path(path).name
    return name.startswith(".") and ".tmp" in name


def unwritable(folder: str | Path) -> OSError | None:
    """Why files cannot be created in ``folder`` (a read-only file system, its modes), or None.

    Tried for real (a temporary file created and removed), as the OS decides: root ignores
    file modes but not a read-only mount. A folder that does not exist yet is judged by its
    nearest existing parent.
    """
    p = Path(folder)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        probe = tmp_path_for(p / ".write-check")
        probe.touch()
        probe.unlink()
    except OSError as err:
        return err
    return None


def check_writable(folder: str | Path, what: str) -> None:
    """Refuse, in one line and before any work, a write into a folder that cannot be written.

    Args:
        folder: where the command would write.
        what: what it would write there, for the message.

    Raises:
        RunDirError: ``folder`` is read-only (the message names the OS reason and what can be
            done: read the run, or write elsewhere).
    """
    if (err := unwritable(folder)) is not None:
        raise RunDirError(f"{folder} cannot be written ({err.strerror or err}): {what} needs a "
                          f"writable folder; a finished run there can still be read (interp "
                          f"metrics prints its table, interp view and interp merge read it "
                          f"with --out elsewhere), or copy it to a writable folder")


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write text to ``path`` through a temporary file in the same folder and a rename.

    The temporary file is created with mode 0666 less the umask, like any file the user writes
    (``tempfile.mkstemp`` would make it 0600 and results are meant to be shared).
    """
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_json(path: str | Path, obj: Any) -> Path:
    """Atomically write ``obj`` as indented JSON (NaN written as null)."""
    return atomic_write_text(path, json.dumps(nan_to_none(obj), indent=2, sort_keys=False) + "\n")


def read_json(path: str | Path) -> Any:
    """Read a JSON file."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Atomically write rows as JSON lines, the whole file at once.

    :meth:`RunDir.append_records` is the append-as-you-go record log instead.
    """
    return atomic_write_text(path, json_lines(nan_to_none(r) for r in rows))


def write_jsonl_once(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> bool:
    """Write rows as JSON lines to ``path`` only if no file is there yet; whether it wrote.

    Like :func:`write_jsonl`, but the temporary file is hard-linked onto ``path``, which
    fails when ``path`` exists: of processes that make the same file at once, the first
    writer's whole file stays and the others' are dropped (never a mix, never overwritten).
    """
    path = Path(path)
    tmp = tmp_path_for(path)
    atomic_write_text(tmp, json_lines(nan_to_none(r) for r in rows))
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file (:func:`interp.core.jsonl.parse_jsonl`; blank lines skipped).

    A torn last line (a write cut by a kill) is left out with a warning naming it; every
    whole line is returned.

    Raises:
        RunDirError: a line before the last is malformed (names the file and line).
    """
    got = _parse(Path(path))
    return [row for _, row in got.rows]


def _parse(path: Path, redo: str = "rerun the stage that wrote it: it redoes that line's "
                                   "work and keeps every other line") -> JsonlRead:
    """:func:`interp.core.jsonl.parse_jsonl` of a file; a torn last line is warned about.

    A damaged line before the last is an error that says how to recover: which line to delete,
    and ``redo`` (what makes that line again).
    """
    try:
        got = parse_jsonl(path.read_bytes())
    except JsonlLineError as err:
        n = err.lineno
        raise RunDirError(f"{path}:{n}: {err.reason}; line {n} is damaged (not a cut last "
                          f"line): delete it (sed -i '{n}d' {path}) and {redo}") from err
    if got.torn is not None:
        warnings.warn(f"{path}:{got.torn}: incomplete last line dropped (an interrupted "
                      f"write: {got.torn_reason}); it will be redone", stacklevel=3)
    return got


def write_table(df: Any, path: str | Path, *, csv: bool = True) -> Path:
    """Atomically write a ``pandas.DataFrame`` as parquet (and the same table as ``.csv``)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)
    if csv:
        with atomic_path(path.with_suffix(".csv")) as tmp:
            df.to_csv(tmp, index=False)
    return path

def nan_to_none(obj: Any) -> Any:
    """``obj`` with every float NaN (in nested mappings and lists) replaced by None (JSON null)."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, Mapping):
        return {k: nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [nan_to_none(v) for v in obj]
    return obj


def save_tensors(path: str | Path, tensors: Mapping[str, Any],
                 metadata_: Mapping[str, str] | None = None) -> Path:
    """Atomically save a dict of tensors as safetensors (contiguous CPU copies)."""
    with atomic_path(path) as tmp:
        from safetensors.torch import save_file  # torch: imported when tensors are saved

        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp),
                  metadata=dict(metadata_ or {}))
    return Path(path)


def signature(obj: Any) -> str:
    """A short, stable digest (16 hex) of a JSON-able description of how something was made.

    Every cache and resumable part of a run directory stores the signature of what produced it
    (model sha256, prompt token ids, hook point, layers, settings); a stored part is reused only
    when its signature equals the one computed now (:func:`is_fresh`), otherwise it is redone.
    """
    text = json.dumps(nan_to_none(obj), sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stored_signature(path: str | Path) -> str | None:
    """The signature stored in a part, or None when absent or unreadable.

    Read from a JSON file's top-level or ``meta`` ``"signature"`` key, or from a safetensors
    file's ``signature`` metadata.
    """
    path = Path(path)
    if not path.exists():
        return None
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt") as f:
                return (f.metadata() or {}).get("signature")
        obj = read_json(path)
    except (OSError, ValueError):
        return None
    if not isinstance(obj, Mapping):
        return None
    return obj.get("signature") or (obj.get("meta") or {}).get("signature")


def is_fresh(path: str | Path, sig: str) -> bool:
    """Whether the part at ``path`` exists and was made under signature ``sig``."""
    return stored_signature(path) == sig


def finite(values: Any, *, path: str | Path, name: str, record: str | None = None,
           rows: Sequence[str] | None = None) -> Any:
    """A stored tensor read back, refused when it holds a NaN or an infinity.

    Every reader of stored tensors (recordings, feature caches, probes, lenses) passes what it
    read through this, so a non-finite value is named where it lies instead of turning into a
    null statistic or a dropped row downstream.

    Args:
        values: a ``torch.Tensor`` or a numpy array (any shape; integer ones always pass).
        path: the file it was read from.
        name: the tensor's name in the file (its hook point, e.g. ``mass.eval``,
            ``blocks.5.hook_resid_post``).
        record: the record it belongs to (``dataset/id``), when the file holds one record.
        rows: the record of each row (first axis), when the file holds many.

    Returns:
        ``values``, unchanged.

    Raises:
        RunDirError: one line naming the file, the tensor, the record, how many values are not
            finite, and how to make the part again.
    """
    import numpy as np

    arr = values.detach().cpu().float().numpy() if hasattr(values, "detach") else \
        np.asarray(values)
    if not np.issubdtype(arr.dtype, np.floating):
        return values
    bad = ~np.isfinite(arr)
    if not bad.any():
        return values
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    if rows is not None and first:
        record = rows[first[0]] if first[0] < len(rows) else record
    which = f" of record {record}" if record else ""
    kind = "NaN" if np.isnan(arr[first]) else "Inf"
    raise RunDirError(f"{path}: {name}{which} holds {int(bad.sum())} non-finite value(s) "
                      f"({kind} first, at index {list(first)}): a damaged or diverged part; "
                      f"delete {path} and rerun the stage that wrote it to make it again")


def load_tensors(path: str | Path, rows: Sequence[str] | None = None) -> dict[str, Any]:
    """Load a safetensors file into CPU tensors, each checked finite (:func:`finite`).

    Args:
        path: the file.
        rows: the record of each row of its tensors, for the message (feature caches).

    Raises:
        RunDirError: a tensor holds a NaN or an infinity.
    """
    from safetensors.torch import load_file

    return {k: finite(v, path=path, name=k, rows=rows) for k, v in load_file(str(path)).items()}


