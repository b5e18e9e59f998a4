"""User input checked before slow work, and results that a run with less work never replaces.

One home for the rules every command follows (docs/cli.md, errors):

* :func:`read_toml`: a config or template file that is missing, not UTF-8 or not TOML is a
  :class:`interp.core.errors.ConfigError` (one line naming the file and the line), never a
  traceback.
* counts (``limit``, ``batch_size``, ...) and numbers of every stage config are checked where
  the options are declared (:func:`interp.core.options.check_counts`,
  :func:`interp.core.options.check_numbers`), so ``--limit 0`` is refused by every command before a
  model loads.
* :func:`check_device` and :func:`check_dtype`: a device torch can parse and this machine has,
  and a model dtype among :data:`MODEL_DTYPES`; checked by every config with a ``device`` field
  and by :func:`interp.models.loading.load_model` before it reads anything.
* :func:`new_run_dir`: a command that creates a run directory and fails (or is interrupted)
  before it has kept any result removes the directory again, so a corrected rerun starts clean.
* :func:`write_result`: a summary computed over zero items does not replace an existing one.
* :func:`kept_work`: what an interrupted command leaves behind, for the one-line Ctrl-C message
  (every stage's declared parts, :func:`interp.core.contract.kept_work`).
"""

from __future__ import annotations

import contextlib
import shutil
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from interp.core.contract import kept_work
from interp.core.errors import ConfigError
from interp.core.io import write_json

__all__ = ["MODEL_DTYPES", "check_device", "check_dtype",
           "kept_work", "new_run_dir", "read_toml", "write_result"]

MODEL_DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
"""The precisions a model loads in (``auto``: bfloat16 on CUDA, float32 elsewhere)."""

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
    """Whether a folder holds any file besides ``manifest.json`` and hidden bookkeeping files.

    Hidden files (``.name``) are never results: temporary files of atomic writes and the
    writer lock (``.writer.lock``, ``.writer.json``, :meth:`interp.store.rundir.RunDir.writer`).
    """
    return any(p.is_file() and p.name != "manifest.json" and not p.name.startswith(".")
               for p in path.rglob("*"))


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
    """Write a summary (:func:`interp.core.io.write_json`) unless it covers nothing.

    Args:
        path: the summary file.
        obj: its content.
        n: how many items (records, pairs) it summarises.
        log: told when an existing summary is kept.

    Returns:
        Whether the file was written: False when ``n == 0`` and the file already exists (a run
        that had nothing to do never replaces a result).
    """
    path = Path(path)
    if n == 0 and path.exists():
        if log:
            log(f"nothing was computed; {path} is kept as it was")
        return False
    write_json(path, obj)
    return True
