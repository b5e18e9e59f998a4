"""The run directory: its manifest (config, provenance, runtime facts) and its record log.

``DIR/records.jsonl`` is appended line by line with a flush and fsync after each batch; a line
cut by a crash is reported and dropped on the next read, so that record is simply redone.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from interp.core.errors import RunDirError
from interp.core.io import _parse, check_writable, nan_to_none, read_json, write_json, write_jsonl
from interp.core.jsonl import json_line, parse_jsonl
from interp.store.records import Record, qa_key

_PACKAGES = ("interp", "torch", "transformers", "transformer-lens", "nnsight", "peft",
             "datasets", "numpy", "scikit-learn")


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


_LOCKS: dict[str, Any] = {}
"""One ``FileLock`` per run directory in this process (so :meth:`RunDir.writer` nests)."""


def _add_commit(manifest: dict[str, Any]) -> None:
    """Add this checkout's commit to ``manifest["git_commits"]``: every commit that wrote.

    ``git_commit`` stays the first one (the run's creation); a resumed or extended run, or a
    later stage, made by another checkout appends its commit once, in order.
    """
    commits = manifest.setdefault("git_commits", [manifest.get("git_commit")])
    if (now := git_commit()) not in commits:
        commits.append(now)


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
            RunDirError: there is none (the message says to run ``interp asymmetry`` first,
                or, for a folder of run directories such as ``interp run`` writes, names
                them).
        """
        if not self.manifest_path.exists():
            self._missing("manifest.json")
        return read_json(self.manifest_path)

    def require_run(self) -> None:
        """Refuse a folder that is not a run (no manifest), before advising a command on it.

        Raises:
            RunDirError: as :meth:`manifest` (a grid of runs: its model folders named).
        """
        if not self.manifest_path.exists():
            self._missing("manifest.json")

    def _missing(self, name: str) -> None:
        """Refuse a run directory without ``name``; a grid of runs is told to name a run.

        A folder that ``interp run`` filled with one run directory per model is not a run:
        advice to run ``interp asymmetry --out`` into it would write a run into the grid, so
        the message names its model folders instead.

        Raises:
            RunDirError: always.
        """
        runs = sorted(p.parent for p in self.path.glob("*/manifest.json"))
        if runs:
            raise RunDirError(f"{self.path} is a grid of runs: pass one of "
                              f"{', '.join(str(p) for p in runs)}")
        raise RunDirError(f"{self.path} has no {name}: run `interp asymmetry --out "
                          f"{self.path} ...` first")

    def init_manifest(self, config: Mapping[str, Any], *, model_info: Mapping[str, Any],
                      overwrite: bool = False, key_fields: Iterable[str] = (),
                      merge_fields: Iterable[str] = ("datasets",),
                      runtime: Mapping[str, Any] | None = None,
                      result_facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Create the manifest, or check that an existing one has the same config and runtime.

        Args:
            config: the run's configuration (JSON-safe).
            model_info: :attr:`interp.models.loading.ModelHandle.info`.
            overwrite: replace a manifest (and its records) made with another config.
            key_fields: config keys that must match an existing manifest; others (``limit``,
                ``datasets``, ``batch_size``) may change between invocations.
            merge_fields: list-valued keys that accumulate over invocations (ordered union):
                a run extended with another dataset still reports on all of its datasets.
            runtime: :func:`interp.models.loading.runtime_facts` now (stored as ``runtime``).
            result_facts: its result-relevant part (:func:`interp.models.loading.result_facts`),
                stored as ``result_facts`` and compared like a key field: a run made under
                another attention kernel, device, dtype, torch/transformers version, TF32 or
                determinism setting is refused unless ``overwrite`` (a manifest made before
                these were stored is not compared).

        Raises:
            RunDirError: an existing manifest differs in a key field or a result fact and not
                ``overwrite`` (the message names each difference and ``--overwrite``).
        """
        keys = list(key_fields) or list(config)
        if self.manifest_path.exists():
            old = read_json(self.manifest_path)
            diff = _key_diff(old["config"], config, keys)
            diff.update(_fact_diff(old.get("result_facts"), result_facts))
            if diff and not overwrite:
                self._refuse(diff)
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
                _add_commit(old)
                write_json(self.manifest_path, old)
                return old
        manifest = {
            "created": _now(), "config": dict(config), "model": dict(model_info),
            "versions": package_versions(), "git_commit": git_commit(),
            "platform": platform.platform(), "argv": sys.argv, "invocations": [_now()],
        }
        _add_commit(manifest)
        if runtime is not None:
            manifest["runtime"] = dict(runtime)
        if result_facts is not None:
            manifest["result_facts"] = dict(result_facts)
        write_json(self.manifest_path, manifest)
        return manifest

    def check_same_config(self, config: Mapping[str, Any], key_fields: Iterable[str]) -> None:
        """Refuse, before a model loads, a config whose key fields differ from the manifest's.

        The part of :meth:`init_manifest`'s check that needs no model (the model spec,
        template, oracle, dtype, ...; the result facts are compared there, once the model is
        loaded). Nothing to check when there is no manifest yet.

        Raises:
            RunDirError: the same one-line message as :meth:`init_manifest` (names each
                difference, another ``--out`` and ``--overwrite``).
        """
        if not self.manifest_path.exists():
            return
        if diff := _key_diff(read_json(self.manifest_path).get("config", {}), config,
                             key_fields):
            self._refuse(diff)

    def _refuse(self, diff: Mapping[str, tuple[Any, Any]]) -> None:
        lines = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
        raise RunDirError(f"{self.path} was made with another config ({lines}). Use "
                          f"another --out, or --overwrite to discard it.")

    def check_stage(self, stage: str, *, runtime: Mapping[str, Any],
                    result_facts: Mapping[str, Any], overwrite: bool = False,
                    record: bool = True) -> dict[str, Any]:
        """Refuse to reuse a stage's work made under other result facts; record the new ones.

        The manifest keeps, per stage, the runtime facts of its last call (``stages.<stage>``:
        ``runtime``, ``result_facts``, package ``versions``, ``git_commit``, ``updated``), so two
        runs, or two calls of one stage, that computed under different settings are told apart
        from the manifest alone. Every stored part of a stage also carries the result facts in
        its signature, so with ``overwrite`` the parts made under the old facts are redone.

        Args:
            stage: the stage name (``attention``, ``probe``, ``patching``, ``transfer``).
            runtime: :func:`interp.models.loading.runtime_facts` now.
            result_facts: :func:`interp.models.loading.result_facts` of it.
            overwrite: allow the change (the stage redoes its parts).
            record: write the new entry; False: only check (a process of a launcher making
                its share of the parts, :func:`interp.stages.common.share_of_records`).

        Returns:
            The manifest's new entry for the stage.

        Raises:
            RunDirError: no manifest, or the stage last ran under other result facts and not
                ``overwrite`` (names each differing setting and ``--overwrite``).
        """
        manifest = self.manifest()
        old = (manifest.get("stages") or {}).get(stage) or {}
        diff = _fact_diff(old.get("result_facts"), result_facts)
        if diff and not overwrite:
            lines = "; ".join(f"{k.removeprefix('runtime.')}={a!r}, now {b!r}"
                              for k, (a, b) in diff.items())
            raise RunDirError(f"{self.path}: the {stage} stage's stored work was computed with "
                              f"{lines}; rerun with the same settings, or pass --overwrite to "
                              f"redo it")
        entry = {"runtime": dict(runtime), "result_facts": dict(result_facts),
                 "versions": package_versions(), "git_commit": git_commit(), "updated": _now()}
        if record:
            manifest.setdefault("stages", {})[stage] = entry
            _add_commit(manifest)
            write_json(self.manifest_path, manifest)
        return entry

    # -- one writer at a time --------------------------------------------------------------
    @contextlib.contextmanager
    def writer(self) -> Iterator[None]:
        """Hold the run directory's writer lock for the body (one writer at a time).

        An OS file lock (``filelock.FileLock`` on ``DIR/.writer.lock``: ``fcntl``/``msvcrt``)
        that the kernel releases when its process dies, so a lock left by a killed or
        crashed writer is never stale; the holder's pid, host, command and start time are
        written to ``DIR/.writer.json`` for the message a second writer gets. Re-entrant in
        one process. See https://py-filelock.readthedocs.io/.

        Raises:
            RunDirError: another process holds the lock (one line naming it), or the folder
                cannot be written (a read-only mount: :func:`interp.core.io.check_writable`).
        """
        from filelock import FileLock, Timeout

        check_writable(self.path, "writing this run")
        self.path.mkdir(parents=True, exist_ok=True)
        lock = _LOCKS.setdefault(str(self.path.resolve()),
                                 FileLock(str(self.path / ".writer.lock"), timeout=0))
        owner = self.path / ".writer.json"
        try:
            lock.acquire()
        except Timeout:
            try:
                who = read_json(owner)
                held = (f"pid {who.get('pid')} on {who.get('host')} "
                        f"({who.get('argv')!r}, since {who.get('since')})")
            except (OSError, ValueError):
                held = "another process"
            raise RunDirError(f"{self.path} is being written by {held}: wait for it to "
                              f"finish, or use another --out") from None
        try:
            if lock.lock_counter == 1:
                write_json(owner, {"pid": os.getpid(), "host": platform.node(),
                                   "argv": " ".join(sys.argv), "since": _now()})
            yield
        finally:
            lock.release()

    # -- records --------------------------------------------------------------------------
    @property
    def records_path(self) -> Path:
        """``DIR/records.jsonl``."""
        return self.path / "records.jsonl"

    def read_records(self, *, status: str | None = "ok") -> list[Record]:
        r"""Records of the run, optionally only those with a given ``status``.

        Read with :func:`interp.core.jsonl.parse_jsonl` (split on ``\n`` only, so U+2028,
        U+2029 and U+0085 inside a string are text). A last line cut by a crash (inside a
        document or a UTF-8 character) is dropped with a warning (it will be redone); a
        complete last line without its newline is kept.

        Raises:
            RunDirError: the run has no records.jsonl, or a line other than the last is
                malformed (names the line, how to delete it, and that Study 1 redoes it).
        """
        if not self.records_path.exists():
            self._missing("records.jsonl")
        got = _parse(self.records_path, redo=f"run the same `interp asymmetry --out "
                                            f"{self.path}` command again: it redoes that "
                                            f"record and keeps every other")
        latest: dict[tuple[str, str], Any] = {}
        for _, rec in got.rows:  # never trust a repeated id: the last line of it wins
            latest.pop(qa_key(rec), None)
            latest[qa_key(rec)] = rec
        if len(latest) < len(got.rows):
            warnings.warn(f"{self.records_path}: {len(got.rows) - len(latest)} line(s) repeat "
                          f"a record id (two writers?); each record is read once, its last "
                          f"line", stacklevel=2)
        return [rec for rec in latest.values() if status is None or rec.get("status") == status]

    def append_records(self, records: Iterable[Record] | Iterable[Mapping[str, Any]]) -> None:
        """Append records as JSON lines, then flush and fsync."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._repair_tail()
        with open(self.records_path, "a", encoding="utf-8") as f:
            for rec in records:
                f.write(json_line(nan_to_none(rec)))
            f.flush()
            os.fsync(f.fileno())

    def drop_records(self, keys: Iterable[tuple[str, str]]) -> int:
        """Rewrite ``records.jsonl`` without the records of ``keys`` (atomic); how many went.

        Used to redo records made from an older version of their example
        (:func:`interp.stages.asymmetry.stale_records`).
        """
        drop = set(keys)
        recs = self.read_records(status=None)
        kept = [r for r in recs if qa_key(r) not in drop]
        write_jsonl(self.records_path, kept)
        return len(recs) - len(kept)

    def redo_stale(self, stale: Mapping[tuple[str, str], str], dataset: str, *,
                   overwrite: bool) -> set[tuple[str, str]]:
        """Drop the stale finished records of ``dataset`` to redo them, or refuse to.

        Args:
            stale: ``{(dataset, id): why}`` of finished records made from another version of
                their example or prompt (:func:`interp.stages.asymmetry.stale_records`).
            dataset: their dataset, for the message.
            overwrite: drop them; else refuse.

        Returns:
            The keys dropped (to be done again).

        Raises:
            RunDirError: ``stale`` is not empty and not ``overwrite`` (one line naming the
                first and ``--overwrite``); nothing is changed then.
        """
        if not stale:
            return set()
        if not overwrite:
            (key, why), n = next(iter(stale.items())), len(stale)
            raise RunDirError(f"{self.path}: {n} finished record(s) of {dataset} were made from "
                              f"another version of their example or prompt (first: "
                              f"{'/'.join(key)}: {why}); use --overwrite to redo them")
        self.drop_records(stale)
        return set(stale)

    def _repair_tail(self) -> None:
        """Before appending: end a whole last line that lost its newline, cut a torn one.

        A writer killed between a record and its newline leaves a complete record: it is kept
        (the newline is added); one killed inside a record leaves a torn line: it is cut
        (:meth:`read_records` already left it out and the record is redone).
        """
        p = self.records_path
        if not p.exists() or p.stat().st_size == 0:
            return
        with open(p, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
        got = parse_jsonl(p.read_bytes())
        with open(p, "rb+") as f:
            if got.torn_offset is not None:
                f.truncate(got.torn_offset)
            else:
                f.seek(0, os.SEEK_END)
                f.write(b"\n")
            f.flush()
            os.fsync(f.fileno())

    # -- sub-folders ----------------------------------------------------------------------
    def sub(self, name: str) -> Path:
        """``DIR/name/``, created."""
        p = self.path / name
        p.mkdir(parents=True, exist_ok=True)
        return p


def _key_diff(old: Mapping[str, Any], new: Mapping[str, Any], keys: Iterable[str]
              ) -> dict[str, tuple[Any, Any]]:
    """``{key: (old value, new value)}`` for each of ``keys`` whose value differs."""
    return {k: (old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)}


def _fact_diff(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
               ) -> dict[str, tuple[Any, Any]]:
    """``{"runtime.<fact>": (old, new)}`` of differing result facts (none if one is unknown)."""
    if not old or not new:
        return {}
    return {f"runtime.{k}": (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k)}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
