"""The files of a model: what a checkpoint folder holds, its fingerprint, the hub's reach.

:func:`checkpoint_sha256` fingerprints every file of a local checkpoint that can change a
result; :func:`check_folder` and :func:`check_loaded` refuse folders that would load something
other than what they hold (an adapter applied twice, a tensor left at its random init);
:func:`hub_reachable` tells an offline machine at once. :func:`check_model_spec` and
:func:`check_device_map` refuse a model spec or a placement that cannot load, without torch, so
a config check says so before any heavy library loads. Used by :mod:`interp.models.loading`.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from interp.core.errors import ModelSpecError
from interp.core.inputs import check_device
from interp.core.names import did_you_mean
from interp.models.gguf import BUNDLED, sha256_file

__all__ = ["ADAPTER_FILES", "DEVICE_MAP_STRATEGIES", "HUB_PROBE_TIMEOUT_S", "NOT_RESULT_FILES",
           "PAPER_MODEL", "WEIGHT_SUFFIXES", "canonical_spec", "check_device_map", "check_folder",
           "check_loaded", "check_model_spec", "checkpoint_sha256", "hub_info", "hub_kwargs",
           "hub_reachable", "hub_sha256"]


NOT_RESULT_FILES = (".md", ".txt.license", ".gitattributes", ".gitignore", "LICENSE")
"""Suffixes of a checkpoint's files that cannot change a result (docs, licences, git files);
every other file is part of the fingerprint (:func:`checkpoint_sha256`)."""


PAPER_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
"""The paper's model: the example of a hub id in messages."""


def canonical_spec(spec: str) -> str:
    """The bundled alias a spec names, in any letter case or as its upstream hub id.

    ``SmolLM2-135M-Instruct`` and ``HuggingFaceTB/SmolLM2-135M-Instruct`` (the bundled
    GGUF's upstream model, :attr:`interp.models.gguf.BundledModel.upstream`; without ``@revision``)
    both name ``smollm2-135m-instruct``, which loads offline from its package. Any other spec
    is returned unchanged.
    """
    low = spec.lower()
    if low in BUNDLED:
        return low
    return next((alias for alias, b in BUNDLED.items() if b.upstream.lower() == low), spec)


def check_model_spec(spec: str) -> str:
    """Refuse a model spec :func:`interp.models.loading.load_model` cannot resolve, without torch.

    Accepted (the loading module's docstring): a bundled alias (:func:`canonical_spec`), an
    existing ``.gguf`` file, a checkpoint directory holding ``config.json``, or a hub id
    ``owner/name`` (``@revision`` allowed; whether the hub holds it is left to the load, no
    network here). A served model (``openai:MODEL``) is not a spec of weights: callers that
    accept one test :func:`interp.core.capabilities.is_served` first.

    Args:
        spec: the spec as given.

    Returns:
        The spec, as its bundled alias where it names one.

    Raises:
        ModelSpecError: a ``.gguf`` file that does not exist; a directory without
            ``config.json``; a path (``/``, ``./``, ``../``, ``~`` or two ``/``) that does not
            exist; or a name that is none of these (with the nearest bundled alias).
    """
    spec = canonical_spec(spec)
    if spec in BUNDLED:
        return spec
    if spec.endswith(".gguf"):
        if not Path(spec).is_file():
            raise ModelSpecError(f"GGUF file {spec} does not exist")
        return spec
    if Path(spec).is_dir():
        if not (Path(spec) / "config.json").exists():
            raise ModelSpecError(f"{spec} is a directory without config.json: not a checkpoint")
        return spec
    if (spec.startswith(("/", "./", "../", "~")) or spec.count("/") > 1) and \
            not Path(spec).exists():
        raise ModelSpecError(f"{spec} does not exist: a model path must be a .gguf file or a "
                             f"checkpoint directory (a hub id is owner/name)")
    if "/" not in spec:
        raise ModelSpecError(
            f"unknown model spec {spec!r}{did_you_mean(spec, BUNDLED)}: use a bundled alias "
            f"{sorted(BUNDLED)}, a .gguf "
            f"file, a checkpoint directory, or a hub id like {PAPER_MODEL!r}")
    return spec


DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
"""The placement strategies of transformers' ``device_map`` (accelerate's
``infer_auto_device_map``)."""


def check_device_map(device_map: str | Mapping[str, Any] | None,
                     max_memory: Mapping[Any, Any] | None = None,
                     offload_folder: str | Path | None = None) -> dict[str, Any]:
    """Check big-model placement options and return them as ``from_pretrained`` keywords.

    Args:
        device_map: a strategy of :data:`DEVICE_MAP_STRATEGIES` or module name -> device
            (an int GPU index, ``"cuda:N"``, ``"cpu"``, ``"disk"``, ``"meta"`` is refused).
        max_memory: device -> memory (``"20GiB"`` or bytes); keys ``0``/``"0"``/``"cpu"``.
        offload_folder: folder of the modules mapped to ``"disk"``.

    Returns:
        ``{}`` without a device map; else ``device_map`` (and ``max_memory`` with GPU indices
        as ints, ``offload_folder`` as a string) for ``from_pretrained``.

    Raises:
        ModelSpecError: ``max_memory`` or ``offload_folder`` without ``device_map``; an
            unknown strategy; a device a mapping names that this machine lacks; ``"disk"``
            without ``offload_folder``.
    """
    if device_map is None:
        if max_memory is not None or offload_folder is not None:
            raise ModelSpecError("--max-memory and --offload-folder need --device-map (auto, "
                                 "balanced, sequential or a module -> device table)")
        return {}
    out: dict[str, Any] = {}
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAP_STRATEGIES:
            raise ModelSpecError(f"--device-map {device_map!r}: use one of "
                                 f"{', '.join(DEVICE_MAP_STRATEGIES)} or a module -> device "
                                 f"table")
        out["device_map"] = device_map
    elif isinstance(device_map, Mapping) and device_map:
        placed = {}
        for name, dev in device_map.items():
            dev = int(dev) if isinstance(dev, str) and dev.isdigit() else dev
            if dev != "disk":
                check_device(f"cuda:{dev}" if isinstance(dev, int) else dev, ModelSpecError)
            placed[str(name)] = dev
        if "disk" in placed.values() and offload_folder is None:
            raise ModelSpecError("--device-map puts modules on 'disk': give --offload-folder "
                                 "DIR for them")
        out["device_map"] = placed
    else:
        raise ModelSpecError(f"--device-map must be a strategy or a non-empty module -> device "
                             f"table, not {device_map!r}")
    if max_memory is not None:
        out["max_memory"] = {int(k) if str(k).isdigit() else str(k): v
                             for k, v in dict(max_memory).items()}
    if offload_folder is not None:
        out["offload_folder"] = str(offload_folder)
    return out


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
