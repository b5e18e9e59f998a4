"""The run directory: manifest, records, tables and tensors, written atomically, resumable.

Layout (every command reads and writes one)::

    DIR/manifest.json     config, model provenance, package versions, seed, git commit
    DIR/records.jsonl     one line per (example): prompt spans, generation, oracle label, verdict
    DIR/metrics.json      GA, EA, Delta with CIs, acceptance rates, per dataset
    DIR/attention/ DIR/activations/ DIR/patching/ DIR/transfer/ DIR/probes/ DIR/figures/

JSON files are written to a temporary file and renamed (atomic). ``records.jsonl`` is appended
line by line with a flush and fsync after each batch; a line cut by a crash is reported and
dropped on the next read, so that record is simply redone.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import subprocess
import sys
import warnings
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

_PACKAGES = ("interp", "torch", "transformers", "transformer-lens", "nnsight", "peft",
             "datasets", "numpy", "scikit-learn")


class RunDirError(ValueError):
    """A run directory that is missing what a command needs, or was made with another config."""


def config_from_table(cls: Any, table: Mapping[str, Any], section: str,
                      error: type[Exception] = ValueError) -> Any:
    """Build the dataclass ``cls`` from a config table (``[section]`` of a TOML file).

    Raises:
        error: ``table`` has keys that are not fields of ``cls``; the message names the section,
            the unknown keys and the known ones, so a typo is fixed in one look.
    """
    known = set(cls.__dataclass_fields__)
    if unknown := set(table) - known:
        raise error(f"[{section}]: unknown config keys {sorted(unknown)}; known: "
                    f"{sorted(known)}")
    return cls(**dict(table))


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write text to ``path`` through a temporary file in the same folder and a rename.

    The temporary file is created with mode 0666 less the umask, like any file the user writes
    (``tempfile.mkstemp`` would make it 0600 and results are meant to be shared).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | Path, obj: Any) -> Path:
    """Atomically write ``obj`` as indented JSON (NaN written as null)."""
    return atomic_write_text(path, json.dumps(_nan_to_none(obj), indent=2, sort_keys=False) + "\n")


def read_json(path: str | Path) -> Any:
    """Read a JSON file."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, Mapping):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    return obj


def save_tensors(path: str | Path, tensors: Mapping[str, Any],
                 metadata_: Mapping[str, str] | None = None) -> Path:
    """Atomically save a dict of tensors as safetensors (contiguous CPU copies)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp),
              metadata=dict(metadata_ or {}))
    os.replace(tmp, path)
    return path


def load_tensors(path: str | Path) -> dict[str, Any]:
    """Load a safetensors file into CPU tensors."""
    from safetensors.torch import load_file

    return load_file(str(path))


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages that decide results."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str | None:
    """The commit of the checkout interp runs from, when it is a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


class RunDir:
    """A run directory (module docstring).

    Args:
        path: the folder; created on first write.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # -- manifest -------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        """``DIR/manifest.json``."""
        return self.path / "manifest.json"

    def manifest(self) -> dict[str, Any]:
        """The manifest.

        Raises:
            RunDirError: there is none (the message says to run ``interp asymmetry`` first).
        """
        if not self.manifest_path.exists():
            raise RunDirError(f"{self.path} has no manifest.json: run `interp asymmetry --out "
                              f"{self.path} ...` first")
        return read_json(self.manifest_path)

    def init_manifest(self, config: Mapping[str, Any], *, model_info: Mapping[str, Any],
                      overwrite: bool = False, key_fields: Iterable[str] = (),
                      merge_fields: Iterable[str] = ("datasets",)) -> dict[str, Any]:
        """Create the manifest, or check that an existing one has the same config.

        Args:
            config: the run's configuration (JSON-safe).
            model_info: :attr:`interp.models.ModelHandle.info`.
            overwrite: replace a manifest (and its records) made with another config.
            key_fields: config keys that must match an existing manifest; others (``limit``,
                ``datasets``, ``batch_size``) may change between invocations.
            merge_fields: list-valued keys that accumulate over invocations (ordered union):
                a run extended with another dataset still reports on all of its datasets.

        Raises:
            RunDirError: an existing manifest differs in a key field and not ``overwrite``.
        """
        keys = list(key_fields) or list(config)
        if self.manifest_path.exists():
            old = read_json(self.manifest_path)
            diff = {k: (old["config"].get(k), config.get(k)) for k in keys
                    if old["config"].get(k) != config.get(k)}
            if diff and not overwrite:
                lines = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
                raise RunDirError(f"{self.path} was made with another config ({lines}). Use "
                                  f"another --out, or --overwrite to discard it.")
            if diff and overwrite:
                for p in (self.records_path, self.path / "metrics.json"):
                    p.unlink(missing_ok=True)
            elif not diff:
                merged = {k: list(dict.fromkeys([*old["config"].get(k, []), *config[k]]))
                          for k in merge_fields
                          if isinstance(config.get(k), list)
                          and isinstance(old["config"].get(k, []), list)}
                old["config"].update({k: v for k, v in config.items() if k not in keys})
                old["config"].update(merged)
                old.setdefault("invocations", []).append(_now())
                write_json(self.manifest_path, old)
                return old
        manifest = {
            "created": _now(), "config": dict(config), "model": dict(model_info),
            "versions": package_versions(), "git_commit": git_commit(),
            "platform": platform.platform(), "argv": sys.argv, "invocations": [_now()],
        }
        write_json(self.manifest_path, manifest)
        return manifest

    # -- records --------------------------------------------------------------------------
    @property
    def records_path(self) -> Path:
        """``DIR/records.jsonl``."""
        return self.path / "records.jsonl"

    def read_records(self, *, status: str | None = "ok") -> list[dict[str, Any]]:
        """Records of the run, optionally only those with a given ``status``.

        A last line cut by a crash is dropped with a warning (it will be redone).

        Raises:
            RunDirError: the run has no records.jsonl, or a line other than the last is
                malformed (names the line).
        """
        if not self.records_path.exists():
            raise RunDirError(f"{self.path} has no records.jsonl: run `interp asymmetry --out "
                              f"{self.path} ...` first")
        lines = self.records_path.read_text(encoding="utf-8").splitlines()
        out = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                if n == len(lines):
                    warnings.warn(f"{self.records_path}:{n}: incomplete last line dropped "
                                  f"(an interrupted write); it will be redone", stacklevel=2)
                    continue
                raise RunDirError(f"{self.records_path}:{n}: malformed JSON ({err})") from err
            if status is None or rec.get("status") == status:
                out.append(rec)
        return out

    def append_records(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append records as JSON lines, then flush and fsync."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._repair_tail()
        with open(self.records_path, "a", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(_nan_to_none(rec), ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _repair_tail(self) -> None:
        """Cut a partial last line (no trailing newline) left by a killed writer."""
        p = self.records_path
        if not p.exists() or p.stat().st_size == 0:
            return
        with open(p, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
            data = p.read_bytes()
            f.truncate(data.rfind(b"\n") + 1)

    # -- sub-folders ----------------------------------------------------------------------
    def sub(self, name: str) -> Path:
        """``DIR/name/``, created."""
        p = self.path / name
        p.mkdir(parents=True, exist_ok=True)
        return p


def record_key(rec: Mapping[str, Any]) -> tuple[str, str]:
    """The identity of a record: ``(dataset, id)``."""
    return (rec["dataset"], rec["id"])


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
