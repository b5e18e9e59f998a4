"""User input checked before slow work, and results that a run with less work never replaces.

One home for the rules every command follows (docs/cli.md, errors):

* :func:`read_toml`: a config or template file that is missing, not UTF-8 or not TOML is a
  :class:`interp.errors.ConfigError` (one line naming the file and the line), never a traceback.
* :func:`config_from_table`: a stage config built from a ``[section]`` table: unknown keys,
  counts, numbers, device and dtype checked (below).
* :func:`check_counts`: counts such as ``limit``, ``batch_size`` and ``max_new_tokens`` are whole
  numbers >= 1 (``None`` where the field allows it means "all"); every stage config built by
  :func:`config_from_table` is checked, so ``--limit 0`` is refused by every
  command before a model loads.
* :func:`check_numbers`: a config field annotated as a number (``float``, ``int``) or a list
  of numbers (``list[float]``) holds numbers; strings of a ``list[float]`` (a CLI comma list)
  are parsed, anything else is refused naming the option and the value.
* :func:`check_device` and :func:`check_dtype`: a device torch can parse and this machine has,
  and a model dtype among :data:`MODEL_DTYPES`; checked by every config with a ``device`` field
  and by :func:`interp.models.load_model` before it reads anything.
* :func:`new_run_dir`: a command that creates a run directory and fails (or is interrupted)
  before it has kept any result removes the directory again, so a corrected rerun starts clean.
* :func:`write_result`: a summary computed over zero items does not replace an existing one.
* :func:`kept_work`: what an interrupted command leaves behind, for the one-line Ctrl-C message.
"""

from __future__ import annotations

import contextlib
import shutil
import tomllib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from interp.errors import ConfigError

__all__ = ["COUNT_FIELDS", "MODEL_DTYPES", "check_counts", "check_device", "check_dtype",
           "check_numbers", "config_from_table", "kept_work", "new_run_dir", "read_toml",
           "write_result"]

MODEL_DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
"""The precisions a model loads in (``auto``: bfloat16 on CUDA, float32 elsewhere)."""

COUNT_FIELDS = ("limit", "eval_limit", "batch_size", "max_new_tokens", "verdict_max_new_tokens",
                "max_train_examples", "max_length", "epochs", "rank", "train_batch_size",
                "layer_stride", "max_tokens", "top_k", "top", "n_boot", "mlp_hidden",
                "hard_negative_attempts", "hard_negative_max_new_tokens", "checkpoint_every")
"""Config fields that count something: each must be an int >= 1 (or None where allowed)."""


def config_from_table(cls: Any, table: Mapping[str, Any], section: str,
                      error: type[Exception] = ConfigError) -> Any:
    """Build the dataclass ``cls`` from a config table (``[section]`` of a TOML file).

    Raises:
        error: ``table`` has keys that are not fields of ``cls``; the message names the section,
            the unknown keys and the known ones, so a typo is fixed in one look; or a count
            (``limit``, ``batch_size``, ... :data:`COUNT_FIELDS`) below 1; a
            numeric field that holds no number (:func:`check_numbers`); with a
            ``device`` field, a device or dtype this machine cannot load a model on
            (:func:`check_device`, :func:`check_dtype`).
    """
    known = set(cls.__dataclass_fields__)
    if unknown := set(table) - known:
        raise error(f"[{section}]: unknown config keys {sorted(unknown)}; known: "
                    f"{sorted(known)}")
    table = check_numbers(cls, table, section, error)
    if "device" in known:  # a config that loads a model: its device and precision
        check_device(table.get("device"), error)
        check_dtype(table.get("dtype"), error)
    try:
        cfg = cls(**dict(table))
    except TypeError as err:  # a value of the wrong type, found by __post_init__
        raise error(f"[{section}]: {err}") from None
    check_counts(cfg, section, error)
    return cfg


def read_toml(path: str | Path, what: str = "config") -> dict[str, Any]:
    """Read a TOML file.

    Args:
        path: the file.
        what: what the file is, for the message (``config``, ``templates``).

    Returns:
        The parsed document.

    Raises:
        ConfigError: the file is missing, a directory, not UTF-8 or not valid TOML (the
            message names the file and, for syntax errors, the line and column).
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} file {p} does not exist" if not p.exists()
                          else f"{what} file {p} is a directory, not a TOML file")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"{what} file {p} is not UTF-8 text ({err.reason})") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{what} file {p} is not valid TOML: {err}") from None


def check_counts(cfg: Any, section: str, error: type[Exception] = ConfigError) -> None:
    """Refuse a count field (:data:`COUNT_FIELDS`) that is not a whole number >= 1.

    Args:
        cfg: a config dataclass instance.
        section: its config table name, for the message.
        error: the error class to raise.

    Raises:
        error: names the option (``--limit``) and the table key (``[section] limit``); for
            ``limit`` it adds that leaving it out means every record.
    """
    for name in COUNT_FIELDS:
        if name not in getattr(cfg, "__dataclass_fields__", {}):
            continue
        value = getattr(cfg, name)
        if value is None and cfg.__dataclass_fields__[name].default is None:
            continue
        # a table of counts ({dataset: N}, the harness's limit) is checked entry by entry
        for v in (value.values() if isinstance(value, Mapping) else [value]):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                hint = " (leave it out to use every record)" if name.endswith("limit") else ""
                raise error(f"--{name.replace('_', '-')} ([{section}] {name}) must be a whole "
                            f"number >= 1{hint}, not {value!r}")


_NUMBER_TYPES = {"int": (int,), "float": (int, float)}


def check_numbers(cls: Any, table: Mapping[str, Any], section: str,
                  error: type[Exception] = ConfigError) -> dict[str, Any]:
    """Check (and parse) the numeric fields of a config table before the dataclass is built.

    A field annotated ``int``, ``float``, ``list[int]`` or ``list[float]`` (optionally
    ``| None``) must hold numbers of that kind (``True`` is not a number; an int is a float);
    a string in a ``list[float]``/``list[int]`` (a comma list from the command line) is parsed.
    Fields with other annotations (``str | list[int]`` layer specs, ...) are left alone.

    Args:
        cls: the config dataclass (its annotations are strings or types).
        table: the config table.
        section: its table name, for the message.
        error: the error class to raise.

    Returns:
        A copy of ``table`` with parsed lists.

    Raises:
        error: names the option (``--alphas``), the table key, the bad entry and the kind of
            number expected.
    """
    out = dict(table)
    for name, f in getattr(cls, "__dataclass_fields__", {}).items():
        if name not in out or out[name] is None:
            continue
        ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        ann = ann.replace(" | None", "").strip()
        is_list = ann.startswith("list[") and ann.endswith("]")
        kind = ann[5:-1] if is_list else ann
        if kind not in _NUMBER_TYPES:
            continue
        value = out[name]
        what = "whole number" if kind == "int" else "number"
        if is_list and not isinstance(value, list | tuple):
            raise error(f"--{name.replace('_', '-')} ([{section}] {name}) must be a list of "
                        f"{what}s, not {value!r}")
        parsed = []
        for v in value if is_list else [value]:
            if is_list and isinstance(v, str):
                with contextlib.suppress(ValueError):
                    v = int(v) if kind == "int" else float(v)
            if isinstance(v, bool) or not isinstance(v, _NUMBER_TYPES[kind]):
                shape = f"a list of {what}s" if is_list else f"a {what}"
                raise error(f"--{name.replace('_', '-')} ([{section}] {name}) must be {shape}, "
                            f"not {value!r} ({v!r} is not a {what})")
            parsed.append(float(v) if kind == "float" else v)  # 1 -> 1.0: one key per value
        out[name] = parsed if is_list else parsed[0]
    return out


def check_dtype(dtype: Any, error: type[Exception] = ConfigError) -> None:
    """Refuse a model precision that is not one of :data:`MODEL_DTYPES` (None: by device).

    Raises:
        error: lists the valid names.
    """
    if dtype is None or (isinstance(dtype, str) and dtype in MODEL_DTYPES):
        return
    if type(dtype).__name__ == "dtype" and type(dtype).__module__ == "torch":
        return  # a torch.dtype given in code
    raise error(f"--dtype {dtype!r} is not a model precision: use one of "
                f"{', '.join(MODEL_DTYPES)}")


def check_device(device: Any, error: type[Exception] = ConfigError) -> None:
    """Refuse a device torch cannot parse or this machine does not have (None: the default).

    Raises:
        error: a name ``torch.device`` does not know (``tpu``), a CUDA or MPS device when this
            torch cannot use one (the message says to use ``--device cpu``), or a CUDA index
            beyond the visible devices.
    """
    if device is None:
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise error(f"--device {device!r} is not a device torch knows: use cpu, cuda or "
                    f"cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise error(f"--device {device}: cuda requested but torch.cuda.is_available() is "
                        f"False: use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise error(f"--device {device}: this machine has {torch.cuda.device_count()} "
                        f"CUDA device(s) (cuda:0..cuda:{torch.cuda.device_count() - 1})")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise error(f"--device {device}: mps requested but torch.backends.mps.is_available() "
                        f"is False: use --device cpu")
    elif dev.type != "cpu":
        raise error(f"--device {device!r}: interp runs on cpu, cuda or mps, not {dev.type}")


def _holds_results(path: Path) -> bool:
    """Whether a folder holds any file besides ``manifest.json`` and temporary files."""
    for p in path.rglob("*"):
        if p.is_file() and p.name != "manifest.json" and not (
                p.name.startswith(".") and ".tmp" in p.name):
            return True
    return False


@contextlib.contextmanager
def new_run_dir(path: str | Path) -> Iterator[Path]:
    """Remove ``path`` again when the body fails and this call created it with no result in it.

    A failure (or Ctrl-C) after the first result was written keeps the folder: it is a run that
    resumes. A folder that existed before is never touched.
    """
    path = Path(path)
    existed = path.exists()
    try:
        yield path
    except BaseException:
        if not existed and path.is_dir() and not _holds_results(path):
            shutil.rmtree(path, ignore_errors=True)
        raise


def write_result(path: str | Path, obj: Any, *, n: int,
                 log: Callable[[str], None] | None = None) -> bool:
    """Write a summary (:func:`interp.store.io.write_json`) unless it covers nothing.

    Args:
        path: the summary file.
        obj: its content.
        n: how many items (records, pairs) it summarises.
        log: told when an existing summary is kept.

    Returns:
        Whether the file was written: False when ``n == 0`` and the file already exists (a run
        that had nothing to do never replaces a result).
    """
    from interp.store.io import write_json

    path = Path(path)
    if n == 0 and path.exists():
        if log:
            log(f"nothing was computed; {path} is kept as it was")
        return False
    write_json(path, obj)
    return True


_KEPT = (("records.jsonl", "records", "lines"),
         ("attention/records/*/*.safetensors", "attention recordings", "files"),
         ("record/*/*/index.json", "recorded prompts", "files"),
         ("probes/features_*.safetensors", "probe feature caches", "files"),
         ("patching/*/*/parts/*.json", "patching parts", "files"),
         ("steering/parts/*.json", "steering parts", "files"),
         ("transfer/adapters/*/adapter_config.json", "trained adapters", "files"),
         ("transfer/eval/*.jsonl", "transfer evaluations", "files"))


def kept_work(paths: Mapping[str, Path] | list[Path]) -> str:
    """What finished work lies in run directories, as text (``"12 records in runs/x"``).

    Counts the resumable units each stage keeps (records, recordings, parts, adapters);
    ``"nothing"`` when there are none. A grid folder (``interp run --out``: one run directory
    per model, no manifest of its own) is counted in each of its model folders.
    """
    out = []
    roots = [Path(r) for r in (paths.values() if isinstance(paths, Mapping) else paths)]
    runs = [run for r in roots for run in (
        [r] if (r / "manifest.json").exists()
        else sorted(p.parent for p in r.glob("*/manifest.json")) or [r])]
    for root in runs:
        before = len(out)
        for pattern, label, unit in _KEPT:
            files = [p for p in root.glob(pattern) if p.is_file()]
            if unit == "lines":
                n = sum(sum(1 for line in p.read_bytes().split(b"\n") if line.strip())
                        for p in files)  # bytes split on "\n": a torn tail cannot raise
            else:
                n = len(files)
            if n:
                out.append(f"{n} {label}")
        if len(out) > before:
            out[-1] += f" in {root}"
    return ", ".join(out) or "nothing"
