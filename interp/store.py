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

import contextlib
import hashlib
import json
import os
import platform
import re
import secrets
import subprocess
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, Required, TypedDict

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from interp.errors import ConfigError, RunDirError
from interp.stages.contract import safe_name, spec


class PromptSummary(TypedDict):
    """``prompts.gen`` / ``prompts.eval`` of a record (``RenderedPrompt.to_record()``).

    Attributes:
        n_tokens: length of the rendered prompt in tokens.
        token_spans: span name (``context``, ``question``, ``candidate``, ``reference``) ->
            ``[start, end)`` token range.
    """

    n_tokens: int
    token_spans: dict[str, list[int]]


class OracleResult(TypedDict):
    """``oracle`` of a record: which oracle graded the answer and how.

    Attributes:
        name: ``rule`` or ``model:SPEC``.
        em: exact match with the best gold answer (0 or 1).
        f1: token F1 with the best gold answer.
        rule: the rule that decided the label (``interp.grading``).
    """

    name: str
    em: float
    f1: float
    rule: str


class Record(TypedDict, total=False):
    """One line of ``records.jsonl``: the contract between the harness and every analysis.

    Written by :func:`interp.asymmetry.evaluate_examples` (plus ``template`` by the asymmetry
    stage); read by the attention, patching, probe and transfer studies. A ``skipped`` record
    has the example fields and ``reason`` only.

    Attributes:
        id, dataset, split, question, context, answers, answerable: the example.
        status: ``ok`` or ``skipped``; reason: why it was skipped.
        model: the model spec that generated and judged; template: the template variant.
        generation: the raw generated text; answer: the extracted answer (the candidate the
            judge saw).
        oracle_label: y* (True = Correct); oracle: how it was graded.
        verdict: the parsed verdict (True = "Correct", False = "Incorrect", None = neither);
            verdict_source: what decided it (``word``, ``restated_answer`` or ``none``,
            :func:`interp.asymmetry.parse_record_verdict`); verdict_text: the judge's raw reply.
        logprob_correct, logprob_incorrect: ``log P(reply | eval prompt)`` of the whole
            replies "Correct" and "Incorrect" (nats, :mod:`interp.verdict`).
        logit_diff: ``logprob_correct - logprob_incorrect`` (nats).
        p_correct: ``sigmoid(logit_diff)``, the forced choice between the two replies.
        verdict_coverage: ``P(Correct) + P(Incorrect)`` in ``(0, 1]``.
        prompts: ``{"gen": PromptSummary, "eval": PromptSummary}``.
    """

    id: Required[str]
    dataset: Required[str]
    status: Required[Literal["ok", "skipped"]]
    split: str
    question: str
    context: str
    answers: list[str]
    answerable: bool
    reason: str
    model: str
    template: str
    generation: str
    answer: str
    oracle_label: bool
    oracle: OracleResult
    verdict: bool | None
    verdict_source: Literal["word", "restated_answer", "none"]
    verdict_text: str
    logprob_correct: float
    logprob_incorrect: float
    logit_diff: float
    p_correct: float
    verdict_coverage: float
    prompts: dict[str, PromptSummary]


VERDICT_SCORE_FIELDS = ("logprob_correct", "logprob_incorrect", "logit_diff", "p_correct",
                        "verdict_coverage")
"""The whole-reply verdict score of a record (:meth:`interp.verdict.VerdictScores.rows`)."""


def check_verdict_scores(records: Iterable[Mapping[str, Any]]) -> None:
    """Refuse records without the whole-reply verdict score.

    Runs made before :mod:`interp.verdict` stored ``p_correct`` from the first sub-token of
    each verdict word ("Correct" vs "In"), a different number under the same name.

    Raises:
        RunDirError: names the first such record and how to redo the run.
    """
    for r in records:
        if any(k not in r for k in VERDICT_SCORE_FIELDS):
            raise RunDirError(
                f"record {r.get('dataset')}/{r.get('id')} has no whole-reply verdict score "
                f"({', '.join(k for k in VERDICT_SCORE_FIELDS if k not in r)} missing): it was "
                f"made before interp scored whole verdict replies; redo the run that wrote it "
                f"(`interp asymmetry` or `interp transfer`) into a new --out or with "
                f"--overwrite")


_PACKAGES = ("interp", "torch", "transformers", "transformer-lens", "nnsight", "peft",
             "datasets", "numpy", "scikit-learn")


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
    return atomic_write_text(path, json.dumps(_nan_to_none(obj), indent=2, sort_keys=False) + "\n")


def read_json(path: str | Path) -> Any:
    """Read a JSON file."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Atomically write rows as JSON lines, the whole file at once.

    :meth:`RunDir.append_records` is the append-as-you-go record log instead.
    """
    return atomic_write_text(path, "".join(json.dumps(_nan_to_none(r), ensure_ascii=False)
                                           + "\n" for r in rows))


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file written by :func:`write_jsonl` (blank lines skipped)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()
            if line.strip()]


def write_table(df: Any, path: str | Path, *, csv: bool = True) -> Path:
    """Atomically write a ``pandas.DataFrame`` as parquet (and the same table as ``.csv``)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)
    if csv:
        with atomic_path(path.with_suffix(".csv")) as tmp:
            df.to_csv(tmp, index=False)
    return path


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
    with atomic_path(path) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp),
                  metadata=dict(metadata_ or {}))
    return Path(path)


def signature(obj: Any) -> str:
    """A short, stable digest (16 hex) of a JSON-able description of how something was made.

    Every cache and resumable part of a run directory stores the signature of what produced it
    (model sha256, prompt token ids, hook point, layers, settings); a stored part is reused only
    when its signature equals the one computed now (:func:`is_fresh`), otherwise it is redone.
    """
    text = json.dumps(_nan_to_none(obj), sort_keys=True, default=str, separators=(",", ":"))
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


def limit_per_dataset(records: Sequence[Mapping[str, Any]], limit: int | None) -> list[Any]:
    """The first ``limit`` records of each dataset, in their order (None: all).

    The one meaning of ``limit`` for stages that read a run's records: *per dataset*. (Which
    examples enter a run in the first place is decided when they are loaded,
    :func:`interp.data.load_examples`.)

    Raises:
        ConfigError: ``limit`` below 1.
    """
    if limit is None:
        return list(records)
    if limit < 1:
        raise ConfigError(f"limit must be >= 1 (or left out for all records), not {limit}")
    seen: dict[str, int] = {}
    out = []
    for r in records:
        k = r["dataset"]
        if seen.get(k, 0) < limit:
            out.append(r)
            seen[k] = seen.get(k, 0) + 1
    return out


def load_tensors(path: str | Path) -> dict[str, Any]:
    """Load a safetensors file into CPU tensors."""
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
            RunDirError: there is none (the message says to run ``interp asymmetry`` first,
                or, for a folder of run directories such as ``interp run`` writes, names
                them).
        """
        if not self.manifest_path.exists():
            runs = sorted(p.parent for p in self.path.glob("*/manifest.json"))
            if runs:
                raise RunDirError(f"{self.path} is a grid of runs: pass one of "
                                  f"{', '.join(str(p) for p in runs)}")
            raise RunDirError(f"{self.path} has no manifest.json: run `interp asymmetry --out "
                              f"{self.path} ...` first")
        return read_json(self.manifest_path)

    def init_manifest(self, config: Mapping[str, Any], *, model_info: Mapping[str, Any],
                      overwrite: bool = False, key_fields: Iterable[str] = (),
                      merge_fields: Iterable[str] = ("datasets",),
                      runtime: Mapping[str, Any] | None = None,
                      result_facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Create the manifest, or check that an existing one has the same config and runtime.

        Args:
            config: the run's configuration (JSON-safe).
            model_info: :attr:`interp.models.ModelHandle.info`.
            overwrite: replace a manifest (and its records) made with another config.
            key_fields: config keys that must match an existing manifest; others (``limit``,
                ``datasets``, ``batch_size``) may change between invocations.
            merge_fields: list-valued keys that accumulate over invocations (ordered union):
                a run extended with another dataset still reports on all of its datasets.
            runtime: :func:`interp.models.runtime_facts` now (stored as ``runtime``).
            result_facts: its result-relevant part (:func:`interp.models.result_facts`),
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
                write_json(self.manifest_path, old)
                return old
        manifest = {
            "created": _now(), "config": dict(config), "model": dict(model_info),
            "versions": package_versions(), "git_commit": git_commit(),
            "platform": platform.platform(), "argv": sys.argv, "invocations": [_now()],
        }
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
                    result_facts: Mapping[str, Any], overwrite: bool = False) -> dict[str, Any]:
        """Refuse to reuse a stage's work made under other result facts; record the new ones.

        The manifest keeps, per stage, the runtime facts of its last call (``stages.<stage>``:
        ``runtime``, ``result_facts``, package ``versions``, ``git_commit``, ``updated``), so two
        runs, or two calls of one stage, that computed under different settings are told apart
        from the manifest alone. Every stored part of a stage also carries the result facts in
        its signature, so with ``overwrite`` the parts made under the old facts are redone.

        Args:
            stage: the stage name (``attention``, ``probe``, ``patching``, ``transfer``).
            runtime: :func:`interp.models.runtime_facts` now.
            result_facts: :func:`interp.models.result_facts` of it.
            overwrite: allow the change (the stage redoes its parts).

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
        manifest.setdefault("stages", {})[stage] = entry
        write_json(self.manifest_path, manifest)
        return entry

    # -- records --------------------------------------------------------------------------
    @property
    def records_path(self) -> Path:
        """``DIR/records.jsonl``."""
        return self.path / "records.jsonl"

    def read_records(self, *, status: str | None = "ok") -> list[Record]:
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

    def append_records(self, records: Iterable[Record] | Iterable[Mapping[str, Any]]) -> None:
        """Append records as JSON lines, then flush and fsync."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._repair_tail()
        with open(self.records_path, "a", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(_nan_to_none(rec), ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def drop_records(self, keys: Iterable[tuple[str, str]]) -> int:
        """Rewrite ``records.jsonl`` without the records of ``keys`` (atomic); how many went.

        Used to redo records made from an older version of their example
        (:func:`interp.stages.asymmetry.stale_records`).
        """
        drop = set(keys)
        recs = self.read_records(status=None)
        kept = [r for r in recs if record_key(r) not in drop]
        write_jsonl(self.records_path, kept)
        return len(recs) - len(kept)

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


def record_key(rec: Record | Mapping[str, Any]) -> tuple[str, str]:
    """The identity of a record: ``(dataset, id)``."""
    return (rec["dataset"], rec["id"])


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


# -- recorded activations (``interp record``) -------------------------------------------------

RECORD_DIR = spec("record").folder
"""Folder of ``interp record`` in a run directory (:mod:`interp.stages.record`)."""


def record_part_path(run: RunDir | str | Path, dataset: str, record_id: str) -> Path:
    """``DIR/record/<dataset>/<id>/index.json``: one record's part (the contract's)."""
    root = run.path if isinstance(run, RunDir) else Path(run)
    return spec("record").parts[0].path(root, dataset, record_id)


@dataclass
class Activations:
    """One recorded hook point of one prompt, with what its axes mean.

    Attributes:
        hook: the TransformerLens name asked for (``blocks.5.attn.hook_pattern``), or a bare
            point (``hook_resid_post``) for all recorded layers stacked.
        tensor: ``[n_heads, n_query, pos]`` for ``attn.hook_pattern`` (rows sum to 1),
            ``[n_query, d_model]`` for ``hook_resid_pre`` / ``hook_resid_post``,
            ``[n_query, n_heads, head_dim]`` for ``attn.hook_z``; a bare point adds a leading
            ``[n_layers]`` axis (``layers``). ``n_query = len(positions)``.
        tokens: the prompt's token strings ``[pos]`` (each id decoded alone).
        labels: span label of every position ``[pos]`` (``context``, ``question``,
            ``candidate``, ``template``, ...).
        positions: the prompt positions of the query/position axis (``--positions``).
        layers: the layers of the tensor (one for a single hook).
        token_ids: the prompt's token ids ``[pos]``.
        token_spans: span -> ``[start, end)`` token range.
    """

    hook: str
    tensor: torch.Tensor
    tokens: list[str]
    labels: list[str]
    positions: list[int]
    layers: list[int]
    token_ids: list[int]
    token_spans: dict[str, list[int]]


def _find_part(root: Path, record_id: str, dataset: str | None) -> Path:
    """The index part of a record (step 1 of :func:`load_activations`)."""
    folder = safe_name(dataset) if dataset is not None else "*"  # safe names hold no glob
    parts = sorted((root / RECORD_DIR).glob(f"{folder}/{safe_name(record_id)}/index.json"))
    if not parts:
        of = "" if dataset is None else f" of {dataset}"
        n = len(list((root / RECORD_DIR).glob("*/*/index.json")))
        if not n:
            raise RunDirError(f"{root} has no recording of record {record_id!r}{of}: run "
                              f"`interp record --run {root}` first")
        rd = RunDir(root)
        ok = rd.records_path.exists() and any(
            str(r.get("id")) == record_id and dataset in (None, r.get("dataset"))
            for r in rd.read_records())
        if not ok:
            raise RunDirError(f"{root} has no ok record {record_id!r}{of} (not in records.jsonl,"
                              f" or skipped by the harness): only ok records are recorded")
        raise RunDirError(f"record {record_id!r}{of} was not recorded: `interp record` recorded "
                          f"{n} records (the first --limit N ok records per dataset) and this "
                          f"one is outside them; run `interp record --run {root}` with a larger "
                          f"--limit, or none, to include it")
    if len(parts) > 1:
        raise RunDirError(f"record id {record_id!r} is recorded in several datasets "
                          f"({[p.parent.parent.name for p in parts]}): pass dataset=")
    return parts[0]


def load_activations(run: RunDir | str | Path, record_id: str, task: str, hook: str, *,
                     dataset: str | None = None) -> Activations:
    """Load a tensor that ``interp record`` wrote, by its TransformerLens hook name.

    Algorithm: 1. find the record's index part ``DIR/record/<dataset>/<id>/index.json`` (written
    after all of its shards, so it never names a missing one); 2. look the hook up in its
    ``tensors.<task>`` table; 3. read only those tensors from their shards (``safe_open``).

    Example:
        >>> a = load_activations("runs/smol", "56de0f", "eval", "blocks.20.attn.hook_pattern")
        >>> a.tensor.shape, a.tokens[-1], a.labels[a.positions[0]]

    Args:
        run: the run directory.
        record_id: the record's ``id``.
        task: ``"gen"`` or ``"eval"``.
        hook: ``blocks.{L}.attn.hook_pattern``, ``blocks.{L}.hook_resid_pre``,
            ``blocks.{L}.hook_resid_post``, ``blocks.{L}.attn.hook_z`` (``L`` may be negative:
            from the end of the model), or the point alone (``attn.hook_pattern``,
            ``hook_resid_post``, ...) for every recorded layer stacked on a first axis.
        dataset: the record's dataset, needed only when the id occurs in several.

    Returns:
        :class:`Activations` (shapes there), the tensor in the recorded dtype on CPU.

    Raises:
        RunDirError: nothing recorded for the record, an ambiguous id, an unknown task, or a
            hook that was not recorded (the message lists the recorded ones).
    """
    root = run.path if isinstance(run, RunDir) else Path(run)
    path = _find_part(root, str(record_id), dataset)
    part = read_json(path)
    if task not in part["tasks"]:
        raise RunDirError(f"unknown task {task!r}; recorded: {sorted(part['tasks'])}")
    table: dict[str, Any] = part["tensors"][task]
    n_layers = int(part["n_layers"])
    m = re.fullmatch(r"blocks\.(-?\d+)\.(.+)", hook)
    if m:
        layer = int(m.group(1)) + (n_layers if int(m.group(1)) < 0 else 0)
        names = [f"blocks.{layer}.{m.group(2)}"]
    else:
        names = [n for n in table if n.split(".", 2)[2] == hook]
    if not names or any(n not in table for n in names):
        known = sorted({n.split(".", 2)[2] for n in table})
        raise RunDirError(f"{hook!r} was not recorded for {record_id!r} ({task}); recorded "
                          f"points {known} at layers {part['layers']}")
    tensors = []
    for name in names:
        with safe_open(str(path.parent / table[name]["shard"]), "pt") as f:
            tensors.append(f.get_tensor(name))
    info = part["tasks"][task]
    return Activations(hook=hook, tensor=tensors[0] if m else torch.stack(tensors),
                       tokens=info["tokens"], labels=info["labels"],
                       positions=info["positions"],
                       layers=[int(n.split(".")[1]) for n in names],
                       token_ids=info["token_ids"], token_spans=info["token_spans"])


def load_cache(run: RunDir | str | Path, record_id: str, task: str,
               hooks: Iterable[str], *, dataset: str | None = None) -> dict[str, torch.Tensor]:
    """A TransformerLens-style cache: hook name -> tensor with a batch axis of 1.

    As ``run_with_cache`` gives it: ``blocks.5.attn.hook_pattern`` is ``[1, n_heads, pos, pos]``
    with ``--positions all``. Raises as :func:`load_activations`.
    """
    return {h: load_activations(run, record_id, task, h, dataset=dataset).tensor[None]
            for h in hooks}
