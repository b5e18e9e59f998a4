"""The files of a model: what a checkpoint folder holds, its fingerprint, the hub's reach.

:func:`checkpoint_sha256` fingerprints every file of a local checkpoint that can change a
result; :func:`check_folder` and :func:`check_loaded` refuse folders that would load something
other than what they hold (an adapter applied twice, a tensor left at its random init);
:func:`hub_reachable` tells an offline machine at once. Used by :mod:`interp.models.loading`.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from interp.core.errors import ModelSpecError
from interp.models.gguf import BUNDLED, sha256_file

__all__ = ["ADAPTER_FILES", "HUB_PROBE_TIMEOUT_S", "NOT_RESULT_FILES", "WEIGHT_SUFFIXES",
           "check_folder", "check_loaded", "checkpoint_sha256", "hub_info", "hub_kwargs",
           "hub_reachable", "hub_sha256"]


NOT_RESULT_FILES = (".md", ".txt.license", ".gitattributes", ".gitignore", "LICENSE")
"""Suffixes of a checkpoint's files that cannot change a result (docs, licences, git files);
every other file is part of the fingerprint (:func:`checkpoint_sha256`)."""


def _result_file(name: str) -> bool:
    return not name.endswith(NOT_RESULT_FILES) and not name.startswith(("LICENSE", "README"))


def checkpoint_sha256(path: Path) -> str:
    """sha256 over every file of a local checkpoint that can change a result.

    Names and contents of the folder's files, sorted: the weights, and also ``config.json``
    (``rope_theta``, ``rope_scaling``, ...), ``generation_config.json``, the tokenizer files
    and the chat template (``tokenizer_config.json``, ``chat_template.jinja``), an adapter's
    config and weights; not READMEs, licences and git files (:data:`NOT_RESULT_FILES`). A run
    resumed with a checkpoint whose template or config changed is then refused like one whose
    weights changed (:func:`interp.stages.common.check_run_model`).

    Args:
        path: the checkpoint directory.

    Returns:
        A hex digest.
    """
    h = hashlib.sha256()
    for p in sorted(p for p in path.iterdir() if p.is_file() and _result_file(p.name)):
        h.update(p.name.encode())
        h.update(sha256_file(p).encode())
    return h.hexdigest()


HUB_PROBE_TIMEOUT_S = 3.0
"""Seconds to wait for a TCP connection to the hub before calling it unreachable."""


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether the Hugging Face hub answers a TCP connection within a few seconds.

    ``HF_HUB_OFFLINE=1`` means no. Checked once per process, in a daemon thread (a resolver
    that hangs cannot hold the caller longer than :data:`HUB_PROBE_TIMEOUT_S`), so an offline
    machine is told at once instead of after the libraries' retries (about 51 s measured).
    See https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables.
    """
    import socket
    import threading
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    got: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((url.hostname, url.port or 443),
                                     timeout=HUB_PROBE_TIMEOUT_S).close()
            got.append(True)
        except OSError:
            got.append(False)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(HUB_PROBE_TIMEOUT_S + 0.5)
    return bool(got and got[0])


def hub_info(repo: str, revision: str | None, info: dict[str, Any]) -> dict[str, Any]:
    """Provenance of a hub id; offline, the hub cache is used or the spec refused at once."""
    info = {**info, "source": "hub", "path": repo, "revision": revision}
    if hub_reachable():
        return info
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo, "config.json", revision=revision), str):
        return {**info, "offline": True}  # a warm hub cache: read it without the network
    raise ModelSpecError(
        f"{repo!r} is a hub id, the hub is not reachable from here and the hub cache does not "
        f"hold it. Offline, use a bundled alias {sorted(BUNDLED)}, a local checkpoint "
        f"directory or a .gguf file.")


def hub_kwargs(info: Mapping[str, Any]) -> dict[str, Any]:
    """``revision`` and ``local_files_only`` (an offline hub cache) for ``from_pretrained``."""
    if info.get("source") != "hub":
        return {}
    return {"revision": info.get("revision"), "local_files_only": bool(info.get("offline"))}


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def check_folder(path: Path) -> None:
    """Refuse a checkpoint folder that holds full weights AND a peft adapter.

    ``from_pretrained`` attaches an ``adapter_config.json`` it finds beside the weights; in a
    folder of merged weights (``merge_and_unload`` then ``save_pretrained``) that still holds
    the adapter's files, the adapter is applied a second time, silently (measured: logits 5.5
    nats off on a tiny Llama). Which of the two the folder means cannot be told from it.
    See https://huggingface.co/docs/peft/developer_guides/checkpoint.

    Raises:
        ModelSpecError: naming the weight files and the adapter files.
    """
    weights = sorted(p.name for p in path.iterdir() if p.is_file()
                     and p.name.endswith(WEIGHT_SUFFIXES) and p.name not in ADAPTER_FILES
                     and not p.name.startswith(("optimizer", "rng", "training_args")))
    adapter = sorted(n for n in ADAPTER_FILES if (path / n).exists())
    if weights and "adapter_config.json" in adapter:
        raise ModelSpecError(
            f"{path} holds full weights ({', '.join(weights)}) and a peft adapter "
            f"({', '.join(adapter)}): loading would apply the adapter again; move the adapter "
            f"files out if the weights are merged, or the weights out to load the adapter")


def check_loaded(path: Path | str, loading_info: Mapping[str, Any]) -> None:
    """Refuse a checkpoint whose weight files lack tensors the model needs (or mis-shape them).

    ``from_pretrained`` fills a tensor missing from every weight file with its random
    initialisation and only logs it (a sharded checkpoint whose index names a shard that lacks
    the tensor loads "successfully"). Tied weights are not reported missing by transformers.

    Args:
        path: the checkpoint directory or hub id (for the message).
        loading_info: the ``output_loading_info=True`` result of ``from_pretrained``.

    Raises:
        ModelSpecError: one line naming the missing (or mis-shaped) keys and, for a sharded
            checkpoint, the shard its index names for them.
    """
    missing = sorted(loading_info.get("missing_keys") or ())
    mismatched = sorted(str(k[0] if isinstance(k, tuple) else k)
                        for k in loading_info.get("mismatched_keys") or ())
    if not missing and not mismatched:
        return
    where = ""
    index = Path(path) / "model.safetensors.index.json"
    if missing and index.exists():
        import json

        wmap = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        named = sorted({wmap[k] for k in missing if k in wmap})
        where = (f"; {index.name} names {', '.join(named)} for them, which lack them" if named
                 else f"; {index.name} does not name them")
    keys = ", ".join(missing[:4]) + (f" (+{len(missing) - 4} more)" if len(missing) > 4 else "")
    bad = f"missing {len(missing)} tensor(s) ({keys})" if missing else ""
    if mismatched:
        bad += ("; " if bad else "") + f"mis-shaped {', '.join(mismatched[:4])}"
    raise ModelSpecError(f"checkpoint {path} {bad}{where}: they would load at their random "
                         f"initialisation; fix or re-download the weight files")


def hub_sha256(repo: str, revision: str | None) -> str | None:
    """sha256 of a hub checkpoint's files, from the hub cache's blob names (no hashing).

    The hub cache stores LFS files as ``blobs/<sha256>`` and small files as ``blobs/<git
    sha1>``; combining the names and digests of every file that can change a result (weights,
    config, tokenizer, chat template: :func:`checkpoint_sha256`'s selection) identifies the
    checkpoint without reading 16 GB. Returns None where the cache layout is not found.
    """
    try:
        from huggingface_hub import scan_cache_dir
    except ImportError:  # pragma: no cover
        return None
    try:
        for repo_info in scan_cache_dir().repos:
            if repo_info.repo_id != repo:
                continue
            for rev in repo_info.revisions:
                if revision and rev.commit_hash != revision:
                    continue
                blobs = sorted(f"{f.file_name}={Path(f.blob_path).name}" for f in rev.files
                               if _result_file(f.file_name))
                if blobs:
                    return hashlib.sha256("".join(blobs).encode()).hexdigest()
    except Exception:  # noqa: BLE001 - provenance is best effort for hub models
        return None
    return None
