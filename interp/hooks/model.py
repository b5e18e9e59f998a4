"""The hooked model: one object that reads, edits and patches activations of a loaded model.

The front door of the toolkit for a notebook, with the habits of TransformerLens
(``HookedTransformer`` / TransformerLens 4's ``TransformerBridge``: ``run_with_cache``, hook names,
an ``ActivationCache``) and nnsight (the user's own objects on the same weights):

1. Wrap a loaded model ONCE (:class:`HookedModel`), from a bundled alias, a ``.gguf`` file, a
   checkpoint folder or a hub id (:meth:`HookedModel.from_pretrained`, through
   :func:`interp.models.loading.load_model`), or from an object the user already has
   (:meth:`HookedModel.wrap`): a Hugging Face causal LM and its tokenizer, a
   :class:`interp.models.loading.ModelHandle`, an nnsight ``LanguageModel`` (its model is used
   as it is), or a TransformerLens 4 ``TransformerBridge`` (booting a bridge replaced its
   model's modules with bridge components, so an unmodified Hugging Face model is rebuilt
   around the bridge's OWN parameters: same weights, no copy).
2. The backend is chosen once (``hf``, the default and the reference; ``transformer_lens``;
   ``nnsight``: :mod:`interp.hooks.backends`). Every method runs through it, with the same hook
   names (:mod:`interp.models.points`) whatever the backend.
3. :meth:`HookedModel.run_with_cache`: one forward, the logits and an
   :class:`interp.hooks.cache.ActivationCache`. Under ``hf`` the forward runs with the exact
   last-row attention function (:mod:`interp.hooks.recorder`): the last position's attention
   rows of every layer come with every cache at about the cost of a plain SDPA forward, and the
   full pattern ``blocks.L.attn.hook_pattern`` of the layers asked for is computed inside the
   attention function; under ``transformer_lens`` and ``nnsight`` the patterns are the eager
   attention weights of the wrapped model.
4. :meth:`HookedModel.forward` / :meth:`HookedModel.score`: the backends' patched forward
   (masks and source activations per hook point) and its whole-reply verdict score;
   :meth:`HookedModel.hooks`: read and edit hook points of the Hugging Face model inside a
   ``with`` block (:func:`interp.hooks.capture.hooked`).
5. :meth:`HookedModel.to_transformer_lens` and :meth:`HookedModel.to_nnsight`: the field's own
   objects on the same weights with the same hook names, so their tools (TransformerLens's
   ``patching`` module, circuitsvis, SAE libraries, nnsight's tracing) run on the model.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.core.errors import BackendError, HookError
from interp.core.layers import parse_layers
from interp.core.vocab import check_backend
from interp.hooks.backends import Backend, Forward, get_backend
from interp.hooks.cache import PATTERN, POINTS, ActivationCache, act_name
from interp.hooks.capture import Edit, Stream, hooked
from interp.hooks.guard import inference_guard
from interp.hooks.recorder import recording
from interp.hooks.wrappers import to_nnsight, to_tlens
from interp.models.loading import ModelHandle, end_of_turn_ids, load_model
from interp.models.points import check_architecture

__all__ = ["HookedModel", "Prompt"]

Prompt = Any
"""What :meth:`HookedModel.run_with_cache` runs: a string (tokenized as it is, with the
tokenizer's own special tokens), token ids ``[pos]`` or ``[1, pos]`` (a list or a tensor), or a
prompt object with ``input_ids`` and ``labels`` (:class:`interp.judging.prompts.RenderedPrompt`,
the ``gen`` / ``judge`` prompts of :mod:`interp.judging.cases`), whose span labels the cache
keeps for :meth:`interp.hooks.cache.ActivationCache.span_mass`."""


class HookedModel:
    """A loaded causal LM with hook points, an activation cache and a backend chosen once.

    Example:
        >>> model = HookedModel.from_pretrained("smollm2-135m-instruct")
        >>> logits, cache = model.run_with_cache("The capital of France is")
        >>> cache["pattern", 20].shape            # [1, n_heads, pos, pos]

    Args:
        handle: the loaded model (:func:`interp.models.loading.load_model`).
        backend: ``hf`` (default), ``transformer_lens`` or ``nnsight``
            (:data:`interp.hooks.backends.BACKENDS`).

    Raises:
        BackendError: an unknown backend (lists the valid ones), or an architecture that
            backend cannot wrap.
    """

    def __init__(self, handle: ModelHandle, *, backend: str = "hf") -> None:
        check_backend(backend, BackendError)
        self.handle = handle
        self.backend_name = backend
        self._backend: Backend | None = None

    # --- construction -----------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, spec: str = "smollm2-135m-instruct", *, backend: str = "hf",
                        **load_kwargs: Any) -> HookedModel:
        """Load a model and wrap it (:func:`interp.models.loading.load_model`).

        Args:
            spec: a bundled alias, a ``.gguf`` path, a checkpoint folder or a hub id
                (``meta-llama/Llama-3.1-8B-Instruct``, ``id@revision``).
            backend: as :class:`HookedModel`.
            **load_kwargs: ``device``, ``dtype``, ``device_map``, ... of ``load_model``.

        Raises:
            interp.core.errors.ModelSpecError: as :func:`interp.models.loading.load_model`.
            BackendError: an unknown backend.
        """
        check_backend(backend, BackendError)  # before the weights load
        return cls(load_model(spec, **load_kwargs), backend=backend)

    @classmethod
    def wrap(cls, obj: Any, tokenizer: Any = None, *, backend: str = "hf",
             spec: str | None = None) -> HookedModel:
        """Wrap an object the user already has, on its own weights (module docstring, step 1).

        Args:
            obj: a :class:`ModelHandle`, a ``HookedModel`` (returned as it is when the backend
                matches), a Hugging Face ``*ForCausalLM`` (or a PEFT model around one), an
                nnsight ``LanguageModel``, or a TransformerLens 4 ``TransformerBridge``.
            tokenizer: the tokenizer (taken from the nnsight or TransformerLens object when
                None).
            backend: as :class:`HookedModel`.
            spec: a name for the model in messages and manifests (default: the config's
                ``_name_or_path``).

        Raises:
            BackendError: an object of another kind, no tokenizer, or an architecture interp
                has no hook points for (names the supported ones).
        """
        if isinstance(obj, HookedModel):
            return obj if obj.backend_name == backend else cls(obj.handle, backend=backend)
        if isinstance(obj, ModelHandle):
            return cls(obj, backend=backend)
        model = obj
        if type(obj).__name__ == "TransformerBridge" or hasattr(obj, "original_model"):
            model, tokenizer = _unwrap_bridge(obj), tokenizer or getattr(obj, "tokenizer", None)
        elif hasattr(obj, "_module") and hasattr(obj, "trace"):  # nnsight's LanguageModel
            model, tokenizer = obj._module, tokenizer or getattr(obj, "tokenizer", None)
        if not hasattr(model, "config") or not callable(model) or not callable(
                getattr(model, "get_output_embeddings", None)) or \
                model.get_output_embeddings() is None:
            raise BackendError(f"cannot wrap a {type(obj).__name__}: pass a Hugging Face causal "
                               f"LM (*ForCausalLM, with its LM head) and its tokenizer, a "
                               f"ModelHandle, an nnsight LanguageModel or a TransformerLens "
                               f"TransformerBridge")
        if tokenizer is None:
            raise BackendError("wrapping a Hugging Face model needs its tokenizer: "
                               "HookedModel.wrap(model, tokenizer)")
        check_architecture(model, "HookedModel", BackendError)
        return cls(_handle(model, tokenizer, spec), backend=backend)

    # --- facts ------------------------------------------------------------------------------

    @property
    def model(self) -> Any:
        """The Hugging Face causal LM (the weights every backend reads)."""
        return self.handle.model

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer."""
        return self.handle.tokenizer

    @property
    def n_layers(self) -> int:
        """Number of transformer blocks."""
        return self.handle.n_layers

    @property
    def n_heads(self) -> int:
        """Query heads per layer."""
        return self.handle.n_heads

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads per layer (GQA: query head ``h`` reads ``h // group``)."""
        return self.handle.n_kv_heads

    @property
    def d_model(self) -> int:
        """Residual-stream width."""
        return int(self.model.config.hidden_size)

    @property
    def device(self) -> torch.device:
        """Where inputs go (the input embeddings' device)."""
        return self.handle.device

    @property
    def backend(self) -> Backend:
        """The backend of :mod:`interp.hooks.backends` (built on first use)."""
        if self._backend is None:
            self._backend = get_backend(self.handle, self.backend_name)
        return self._backend

    def __repr__(self) -> str:
        return (f"HookedModel({self.handle.spec!r}, backend={self.backend_name!r}, "
                f"n_layers={self.n_layers}, n_heads={self.n_heads}, "
                f"n_kv_heads={self.n_kv_heads}, d_model={self.d_model})")

    # --- tokens -----------------------------------------------------------------------------

    def to_tokens(self, prompt: Prompt) -> Int[Tensor, "1 pos"]:
        """Token ids ``[1, pos]`` on the model's device (module docstring of :data:`Prompt`).

        Raises:
            HookError: an empty prompt, ids that are not one sequence of integers of the
                vocabulary, or a prompt longer than the model's positions.
        """
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt, return_tensors="pt")["input_ids"]
        else:
            raw = prompt["input_ids"] if isinstance(prompt, Mapping) and "input_ids" in \
                prompt else getattr(prompt, "input_ids", prompt)
            try:
                ids = torch.as_tensor(raw)
            except (TypeError, ValueError, RuntimeError):
                raise HookError(f"cannot read token ids from a {type(prompt).__name__}: pass "
                                f"a string, ids [pos] or [1, pos], or a prompt object") from None
            if ids.numel() and (ids.is_floating_point() or ids.is_complex()
                                or ids.dtype == torch.bool):
                raise HookError(f"token ids must be integers, not {ids.dtype}")
            ids = ids.long()
            ids = ids[None] if ids.ndim == 1 else ids
        if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
            raise HookError(f"run one non-empty prompt at a time: got ids of shape "
                            f"{list(ids.shape)} (pass [pos] or [1, pos])")
        vocab = int(self.model.get_input_embeddings().num_embeddings)
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise HookError(f"token ids must lie in 0..{vocab - 1} (the vocabulary), got "
                            f"{int(ids.min())}..{int(ids.max())}")
        if why := self.handle.overflow(ids.shape[1], what="the prompt"):
            raise HookError(why)
        return ids.to(self.device)

    def to_str_tokens(self, prompt: Prompt) -> list[str]:
        """Each token of ``prompt`` decoded alone (TransformerLens ``to_str_tokens``)."""
        return [self.tokenizer.decode([t]) for t in self.to_tokens(prompt)[0].tolist()]

    # --- reading activations ----------------------------------------------------------------

    def run_with_cache(self, prompt: Prompt, names: Iterable[str] | str |
                       Callable[[str], bool] | None = None, *, logits: str = "all",
                       ) -> tuple[Float[Tensor, "1 pos vocab"], ActivationCache]:
        """One forward; the logits and the activations at the hook points asked for.

        Args:
            prompt: a string, token ids or a prompt object (:data:`Prompt`).
            names: what to cache: full hook names (``blocks.3.attn.hook_z``, negative layers
                from the end), short names or points for every layer (``"resid_post"``,
                ``"attn.hook_pattern"``), a filter ``name -> bool`` over every name
                (TransformerLens's ``names_filter``), or None for every point of every
                layer (full patterns included: ``n_layers x n_heads x pos^2`` floats).
            logits: ``"all"`` (``[1, pos, vocab]``, TransformerLens's default) or ``"last"``
                (``[1, 1, vocab]``: no ``pos x vocab`` tensor, for long prompts and large
                vocabularies).

        Returns:
            ``(logits, cache)``: the cache's tensors are detached, ``[1, pos, ...]``
            (:class:`interp.hooks.cache.ActivationCache` lists the shapes), with the last
            position's attention rows of every layer (``cache.rows``, ``hf`` backend) and the
            prompt's span labels when the prompt carried them.

        Raises:
            HookError: an unknown name or a layer outside the model (before the forward); an
                empty prompt.
        """
        if logits not in ("all", "last"):
            raise HookError(f"logits must be 'all' or 'last', not {logits!r}")
        ids = self.to_tokens(prompt)
        wanted = self._names(names)
        points = [n for n in wanted if not n.endswith(PATTERN)]
        pattern_layers = sorted(int(n.split(".")[1]) for n in wanted if n.endswith(PATTERN))
        keep = 0 if logits == "all" else 1
        rows = None
        if self.backend_name == "hf":
            with torch.no_grad(), inference_guard(self.model), \
                    recording(self.handle, pattern_layers, ids.shape[1]) as cap, \
                    hooked(self.model, cache=points) as store:
                out = self.model(input_ids=ids, use_cache=False, logits_to_keep=keep)
            acts = dict(store)
            acts.update({f"blocks.{x}.{PATTERN}": cap.pattern[cap.pattern_index[x]][None]
                         for x in pattern_layers})
            rows = torch.stack([cap.rows[x][0] for x in range(self.n_layers)]).float().cpu()
            out_logits = out.logits
        else:
            fwd = self.backend.forward(ids, cache_hooks=points, logits_to_keep=keep or
                                       ids.shape[1])
            acts, out_logits = dict(fwd.acts), fwd.logits
            pats = self.backend.patterns(ids, pattern_layers) if pattern_layers else {}
            acts.update({f"blocks.{x}.{PATTERN}": p for x, p in pats.items()})
        labels = getattr(prompt, "labels", None)
        return out_logits.detach(), ActivationCache(
            {n: acts[n] for n in wanted}, n_layers=self.n_layers, model=self, rows=rows,
            labels=labels, token_ids=ids[0].tolist(), source=_source(prompt))

    def _names(self, names: Iterable[str] | str | Callable[[str], bool] | None) -> list[str]:
        """Full hook names in execution order, checked against the model (before any forward)."""
        every = [f"blocks.{x}.{p}" for x in range(self.n_layers) for p in POINTS]
        if names is None:
            return every
        if callable(names) and not isinstance(names, str):
            return [n for n in every if names(n)]
        if not isinstance(names, (str, Iterable)):
            raise HookError(f"names must be hook names, a short name, a filter or None, not "
                            f"{type(names).__name__}")
        out: list[str] = []
        for name in [names] if isinstance(names, str) else list(names):
            if isinstance(name, tuple):               # ("resid_post", 3), as cache keys are
                out.append(act_name(*name, n_layers=self.n_layers))
            elif not isinstance(name, str):
                raise HookError(f"a name must be a string or (short name, layer), not {name!r}")
            elif name.startswith("blocks."):
                out.append(act_name(name, None, self.n_layers))
            else:
                out += [act_name(name, x, self.n_layers) for x in range(self.n_layers)]
        order = {n: i for i, n in enumerate(every)}
        return sorted(dict.fromkeys(out), key=order.__getitem__)

    @contextlib.contextmanager
    def hooks(self, *, edits: Mapping[str, Edit] | None = None, cache: Iterable[str] = (),
              keep_graph: bool = False, stream: Stream | None = None
              ) -> Iterator[dict[str, Tensor]]:
        """Read and edit hook points of every forward of :attr:`model` inside the block.

        :func:`interp.hooks.capture.hooked` on the Hugging Face model (the weights every
        backend shares): ``edits`` maps a hook name to a function of its activation
        (``[batch, pos, ...]`` -> same shape); ``cache`` names the points whose (edited) value
        the yielded dict receives (or, with ``stream``, that function gets ``(name, value)``
        the moment it is computed and nothing is kept). Every hook is removed on exit,
        whatever raises.

        Example:
            >>> with model.hooks(edits={"blocks.3.attn.hook_z": zero_head_5}) as acts:
            ...     model.model(input_ids=ids)

        Raises:
            HookError: an unknown hook point or a layer outside the model (nothing registered).
        """
        with hooked(self.model, cache=cache, edits=edits, keep_graph=keep_graph,
                    stream=stream) as acts:
            yield acts

    # --- patching ---------------------------------------------------------------------------

    def forward(self, ids: Int[Tensor, "batch pos"], **kwargs: Any) -> Forward:
        """The backend's patched forward (:meth:`interp.hooks.backends.Backend.forward`).

        ``masks`` (where to patch, ``[batch, pos]`` or ``[batch, pos, n_heads]`` at
        ``attn.hook_z``), ``sources`` (the activation patched in, ``[pos, ...]``),
        ``cache_hooks``, ``logits_to_keep``, ...: as the protocol documents them.
        """
        return self.backend.forward(ids, **kwargs)

    def score(self, ids: Int[Tensor, "batch pos"], replies: Sequence[Sequence[int]],
              **kwargs: Any) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The patched forward scored with whole replies (:meth:`Backend.score`).

        Returns:
            ``(log P(reply_j | prompt) [batch, n_reply] in nats, last logits [batch, vocab],
            cached activations)``.
        """
        return self.backend.score(ids, replies, **kwargs)

    # --- the field's own objects ------------------------------------------------------------

    def to_transformer_lens(self) -> Any:
        """A TransformerLens 4 ``TransformerBridge`` on the same weights, same hook names.

        Its own modules (booting replaces the modules it wraps) around THIS model's parameter
        tensors (:func:`interp.hooks.wrappers.to_tlens`): ``bridge.run_with_cache(ids)`` and
        ``transformer_lens.patching`` run on the model. Feed it token ids (a string makes it
        prepend BOS).

        Raises:
            BackendError: transformer-lens missing or too old (names the version needed), or
                an architecture it cannot boot.
        """
        return to_tlens(self.handle)

    def to_nnsight(self) -> Any:
        """An nnsight ``LanguageModel`` around this very model (no copy): ``with lm.trace(ids)``.

        Raises:
            BackendError: nnsight missing or too old (names the version needed).
        """
        return to_nnsight(self.handle)

    def layers(self, spec: str | Sequence[int]) -> list[int]:
        """A layer selection in the one layer grammar (``"24-31"``, ``"last8"``, ``[0, -1]``)."""
        return parse_layers(spec, self.n_layers)


def _source(prompt: Prompt) -> str:
    """What a prompt is, in words, for a cache's messages (a string, ids, an object)."""
    if isinstance(prompt, str):
        return f"a plain string ({prompt[:30]!r}{'...' if len(prompt) > 30 else ''})"
    if isinstance(prompt, (Tensor, list, tuple)):
        return "bare token ids"
    if isinstance(prompt, Mapping):
        return "a mapping with input_ids but no labels"
    return f"a {type(prompt).__name__} without labels"


def _handle(model: Any, tokenizer: Any, spec: str | None) -> ModelHandle:
    """A :class:`ModelHandle` around a model the user loaded (eval mode, no gradients)."""
    cfg = model.config
    model.eval()
    name = spec or getattr(cfg, "_name_or_path", None) or type(model).__name__
    info: dict[str, Any] = {
        "spec": name, "source": "object", "sha256": None, "revision": None,
        "n_layers": cfg.num_hidden_layers, "n_heads": cfg.num_attention_heads,
        "n_kv_heads": getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        "d_model": cfg.hidden_size,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "max_positions": int(getattr(cfg, "max_position_embeddings", 2048)),
    }
    handle = ModelHandle(model=model, tokenizer=tokenizer, spec=str(name), info=info)
    info["device"] = str(handle.device)
    with contextlib.suppress(Exception):  # a tokenizer without chat tokens has none
        eot = end_of_turn_ids(tokenizer, model)
        info.update(eot_ids=eot, eot_tokens=tokenizer.convert_ids_to_tokens(eot))
    return handle


def _unwrap_bridge(bridge: Any) -> Any:
    """An unmodified Hugging Face model around a ``TransformerBridge``'s own parameters.

    Booting replaced modules of ``bridge.original_model`` with bridge components (each holding
    the original module as ``_original_component``); the same architecture is built again on
    the meta device and every parameter and buffer is set to the bridge's tensor of the same
    name (with the ``._original_component`` steps removed): no weight is copied.

    Raises:
        BackendError: a parameter or buffer the rebuilt model has that the bridge lacks.
    """
    from transformers import AutoModelForCausalLM

    orig = bridge.original_model
    cfg = copy.deepcopy(orig.config)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    strip = "._original_component"
    params = {n.replace(strip, ""): p for n, p in orig.named_parameters(remove_duplicate=False)}
    buffers = {n.replace(strip, ""): b for n, b in orig.named_buffers(remove_duplicate=False)}
    missing = []
    for table, names in ((params, [n for n, _ in fresh.named_parameters(
            remove_duplicate=False)]), (buffers, [n for n, _ in fresh.named_buffers(
            remove_duplicate=False)])):
        for name in names:
            owner, _, leaf = name.rpartition(".")
            mod = fresh.get_submodule(owner) if owner else fresh
            if name in table:
                setattr(mod, leaf, table[name])
            elif leaf == "weight" and name == "lm_head.weight":
                mod.weight = fresh.get_input_embeddings().weight  # tied
            else:
                missing.append(name)
    if missing:
        raise BackendError(f"cannot find {missing[:3]} in the TransformerBridge's model; wrap "
                           f"the Hugging Face model and tokenizer instead")
    fresh.eval()
    fresh.requires_grad_(False)
    return fresh
