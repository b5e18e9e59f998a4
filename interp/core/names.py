"""File-safe names for datasets, record ids and models: the one rule every stored path follows.

A leaf module (it imports nothing from ``interp``), so the run-directory store and the stage
contract (:mod:`interp.core.contract`) name the same files without importing each other.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePath
from typing import Any

__all__ = ["CROSS_JUDGES", "cross_name", "dataset_order", "did_you_mean", "flat_key",
           "in_dataset_order", "model_slug", "safe_name"]


def safe_name(name: str) -> str:
    """A file name for a dataset or record id (``_`` for unsafe characters, + sha1 if changed)."""
    s = re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))
    if s != str(name) or not s:
        s = f"{s[:60]}-{hashlib.sha1(str(name).encode()).hexdigest()[:8]}"
    return s


def dataset_order(names: Iterable[str]) -> list[str]:
    """The one order of datasets in every table, printout and figure: sorted by name.

    Independent of the order records were made in (a resumed run, a dataset added later,
    merged shards), so ``metrics.json``, ``attention/summary.json`` and every figure drawn from
    them list ``drop, hotpotqa, squad_v2`` alike; ``overall`` is not a dataset and goes last
    where a table has it.

    Args:
        names: dataset names (repeats are dropped).

    Returns:
        The distinct names, sorted.
    """
    return sorted(set(names))


def in_dataset_order(per_dataset: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """A table's ``per_dataset`` groups as ``(name, group)`` pairs in :func:`dataset_order`.

    What every printout and figure iterates, so a table stored in another order (one written
    before the order was fixed) reads the same way.
    """
    return [(d, per_dataset[d]) for d in dataset_order(per_dataset)]


def flat_key(dataset: str, record_id: str) -> str:
    """A record's file-safe key ``dataset__id`` (characters outside ``[A-Za-z0-9_.-]`` -> ``_``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{dataset}__{record_id}")


def model_slug(spec: str) -> str:
    """A folder name for a model spec.

    ``meta-llama/Llama-3.1-8B-Instruct`` -> ``Llama-3.1-8B-Instruct``; an existing path -> its
    stem.
    """
    if Path(spec).exists():
        return Path(spec).stem
    return spec.rstrip("/").replace("/", "__").replace("@", "_").removesuffix(".gguf").split(
        "__")[-1]


CROSS_JUDGES = "__judges__"
"""What joins a judge's and a generator's model slugs in the name of a cross-judged run
(``<judge>__judges__<source>``, :mod:`interp.run.cross_grid`) and of its published files."""


def cross_name(judge_slug: str, source_slug: str) -> str:
    """``<judge>__judges__<source>``: the name of one judge's run on another model's answers."""
    return f"{judge_slug}{CROSS_JUDGES}{source_slug}"


def did_you_mean(given: str | Iterable[str], known: Iterable[str]) -> str:
    """`` (did you mean 'limit'?)`` for names close to a known one, else ``""``.

    For a path (``data/squad_v3.jsonl``) its stem is compared too. Closeness is
    :func:`difflib.get_close_matches` (ratio >= 0.6), the rule of Python's own "Did you mean".

    Args:
        given: the unknown name, or several.
        known: the names it should have been.

    Returns:
        The suggestion, with a leading space, for the end of an error's phrase.
    """
    import difflib

    known = sorted({str(k) for k in known})
    names = [given] if isinstance(given, str) else list(given)
    hits = []
    for name in names:
        for cand in (str(name), PurePath(str(name)).stem):
            if m := difflib.get_close_matches(cand, known, n=1, cutoff=0.6):
                hits.append(f"{m[0]!r} for {str(name)!r}" if len(names) > 1 else repr(m[0]))
                break
    return f" (did you mean {', '.join(hits)}?)" if hits else ""
