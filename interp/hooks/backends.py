"""Run a model with hooks three ways behind one protocol: hf, transformer_lens, nnsight.

Every backend answers the same call, :meth:`Backend.forward`: run token ids ``[batch, pos]``,
replace activations at hook points on per-row masks by a source activation, keep the
activations asked for, and return the logits of the last positions (:class:`Forward`), and
:meth:`Backend.score`: the same patched forward scored with the judge's whole-reply verdict
score (:mod:`interp.judging.verdict`). Hook-point names are the
TransformerLens names of :mod:`interp.models.points` (``blocks.L.hook_resid_pre``,
``blocks.L.attn.hook_z``, ``blocks.L.hook_resid_post``, ...); a mask is ``[batch, pos]``
(``[batch, pos, n_heads]`` for ``attn.hook_z``) and the source ``[pos, ...]`` is broadcast
over the batch: the patched activation is ``where(mask, source, activation)``.

1. ``hf`` (:class:`HFBackend`, the default and the reference): the Hugging Face model itself,
   read and edited through :func:`interp.hooks.capture.hooked` (each mask becomes an edit),
   optionally after a shared key/value prefix (:meth:`HFBackend.prefix_cache`), with
   gradients (``keep_graph``, ``inputs_embeds``) for attribution patching.
2. ``transformer_lens`` (:class:`TLBackend`): :func:`interp.hooks.wrappers.to_tlens` boots
   ``TransformerBridge.boot_transformers(path, hf_model=model, tokenizer=tok)`` offline on a
   deep copy of the model (booting replaces the wrapped model's submodules with bridge
   components and forces eager attention) and runs ``run_with_hooks`` on the same names. The
   bridge prepends BOS only when given a STRING; it is fed token ids, so it runs exactly the
   prompt interp rendered.
3. ``nnsight`` (:class:`NNsightBackend`): :func:`interp.hooks.wrappers.to_nnsight` wraps the
   model in nnsight's ``TransformersModel`` (``LanguageModel`` on older nnsight), sharing its
   weights; inside a trace, module inputs/outputs are read and assigned in execution order.
   Module paths come from :func:`interp.models.points.hook_site`.

What a backend offers beyond this protocol is declared once, torch-free, in
:data:`interp.core.vocab.BACKEND_OFFERS` (checked in one line by
:func:`interp.core.vocab.check_backend` before any forward), and done by the backend object:
``hf`` runs under another attention kernel (``attn``; ``eager`` is the exact recorder's check
path), with gradients and key/value prefixes, and steers with its rows kept
(:meth:`HFBackend.steered`, :meth:`HFBackend.steered_score`); ``transformer_lens`` steers
without rows (:meth:`TLBackend.steered_score`); every backend gives full patterns
(``patterns``: the recorder's check paths). :func:`get_backend` is the one place a name picks
a class.

Lifetimes: :func:`get_backend` builds a backend per call (cheap); only the TransformerLens
bridge, which wraps a COPY of the model, is cached (weakly, :mod:`interp.hooks.wrappers`), so
it dies with the model. Nothing here keeps a model alive.

Whole-reply verdict score of a patched forward (:meth:`Backend.score`; docs/measuring.md, the
verdict score): ``log P(reply | patched prompt)`` for the replies "Correct" and "Incorrect" with the
tokens the chat template gives them. The reply positions themselves are never patched: they
read the patched prompt. Two exact ways, tested to agree:

* ``hf``: the patched forward returns its key/value cache, and the replies' later tokens are
  scored from that cache by :func:`interp.models.kv_cache.continuation_logprobs` (outside the
  hooks).
* full prompts (TransformerLens, nnsight, and attribution patching, which needs gradients):
  each prompt is extended by ``reply[:-1]`` of every multi-token reply (right-padded rows, so
  one forward holds every reply; causal attention makes the padding invisible), the masks are
  extended with ``False`` (nothing patched there), and the reply log-probabilities are read at
  positions ``n - 1 ...`` (:func:`reply_extensions`, :func:`reply_logprobs`).

GQA convention everywhere: query head ``h`` reads key/value head ``h // (n_heads // n_kv_heads)``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.core.errors import BackendError
from interp.core.vocab import BACKENDS, check_backend
from interp.hooks.capture import Edit, hooked
from interp.hooks.guard import inference_guard
from interp.hooks.wrappers import attn_implementation, envoy, to_nnsight, to_tlens
from interp.models.devices import like
from interp.models.kv_cache import cache_kwarg, continuation_logprobs, output_cache
from interp.models.loading import ModelHandle
from interp.models.points import (
    HOOK_POINTS,
    HookSite,
    base_model,
    hook_site,
    n_heads_at,
    parse_hook,
)

__all__ = [
    "BACKENDS",
    "Backend",
    "Forward",
    "HFBackend",
    "NNsightBackend",
    "TLBackend",
    "check_masks",
    "get_backend",
    "hook_order",
    "extend_prompts",
    "masked_edit",
    "reply_extensions",
    "reply_logprobs",
]

Logits = Float[Tensor, "batch keep vocab"]
Masks = Mapping[str, Bool[Tensor, "batch pos *heads"]]
Sources = Mapping[str, Float[Tensor, "pos ..."]]
Cache = dict[str, Float[Tensor, "batch pos ..."]]


class Forward(NamedTuple):
    """What :meth:`Backend.forward` returns.

    Attributes:
        logits: logits of the last ``logits_to_keep`` positions, ``[batch, keep, vocab]``.
        acts: the cached (patched) activations by hook-point name, ``[batch, pos, ...]``.
        kv: the key/value cache after the forward (``hf`` with ``return_kv``), else None.
    """

    logits: Logits
    acts: Cache
    kv: Any = None


# ---------------------------------------------------------------------------------------------
# The protocol
# ---------------------------------------------------------------------------------------------


def hook_order(name: str) -> tuple[int, int]:
    """Execution-order key of a hook-point name: (layer, position of the point in a block)."""
    layer, point = parse_hook(name, 10**9)
    return layer, list(HOOK_POINTS).index(point)


def masked_edit(mask: Bool[Tensor, "batch pos *heads"], src: Float[Tensor, "pos ..."]) -> Edit:
    """The edit that patches ``src`` into the rows and positions (and heads) where ``mask`` holds.

    Returns:
        ``act -> where(mask[..., None], src[None], act)`` for ``act`` ``[batch, pos, d]``
        (``[batch, pos, n_heads, head_dim]`` at ``attn.hook_z``).
    """
    def edit(act: Tensor) -> Tensor:  # on the device of the layer it edits (a device map)
        return torch.where(like(mask, act, dtype=False).unsqueeze(-1), like(src, act)[None], act)
    return edit


def check_masks(ids: Int[Tensor, "batch pos"], masks: Masks, sources: Sources,
                config: Any) -> None:
    """Refuse masks and sources that do not fit the forward, before any hook is registered.

    Args:
        ids: the token ids of the forward ``[batch, pos]``.
        masks: hook-point name -> boolean mask ``[batch, pos]`` (``[batch, pos, n_heads]`` at
            ``attn.hook_z``).
        sources: hook-point name -> activation patched in, ``[pos, d_model]`` (``[pos, n_heads,
            head_dim]`` at ``attn.hook_z``).
        config: the model's config (``num_attention_heads``, ``hidden_size``, ``head_dim``).

    Raises:
        BackendError: a mask without a source, not boolean, or of the wrong shape, or a source
            of the wrong shape (the message names the hook point and both shapes).
    """
    batch, pos = ids.shape[:2]
    n_heads, d_model = int(config.num_attention_heads), int(config.hidden_size)
    head_dim = int(getattr(config, "head_dim", None) or d_model // n_heads)
    for name, m in masks.items():
        if name not in sources:
            raise BackendError(f"a mask is given for {name!r} but no source activation: pass "
                               f"sources[{name!r}]")
        z = name.endswith("attn.hook_z")
        want = (batch, pos) + ((n_heads,) if z else ())
        if m.dtype != torch.bool or tuple(m.shape) != want:
            raise BackendError(f"the mask of {name!r} must be bool {list(want)} (batch, pos"
                               f"{', heads' if z else ''} of the ids), got {m.dtype} "
                               f"{list(m.shape)}")
        src = (pos, n_heads, head_dim) if z else (pos, d_model)
        if tuple(sources[name].shape) != src:
            raise BackendError(f"the source of {name!r} must be {list(src)} (pos of the ids, "
                               f"{'heads, head_dim' if z else 'd_model'}), got "
                               f"{list(sources[name].shape)}")


def reply_extensions(replies: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """The token runs appended to a prompt so that one forward scores every reply.

    Returns:
        ``reply[:-1]`` of each multi-token reply, without repeats, in reply order; ``[()]``
        when every reply is one token (the prompt alone then scores them all).
    """
    exts = list(dict.fromkeys(tuple(r[:-1]) for r in replies if len(r) > 1))
    return exts or [()]


def extend_prompts(ids: Int[Tensor, "batch pos"], exts: Sequence[tuple[int, ...]], pad: int
            ) -> Int[Tensor, "rows pos_ext"]:
    """Prompts extended by each reply prefix: ``[E * batch, pos + width]``, right-padded.

    Row ``e * batch + b`` is prompt ``b`` followed by ``exts[e]`` and ``pad`` up to the longest
    extension (causal attention: the padding changes nothing before it).
    """
    width = max(len(e) for e in exts)
    rows = []
    for e in exts:
        tail = torch.full((ids.shape[0], width), pad, dtype=ids.dtype, device=ids.device)
        if e:
            tail[:, :len(e)] = torch.tensor(e, dtype=ids.dtype, device=ids.device)
        rows.append(torch.cat([ids, tail], dim=1))
    return torch.cat(rows)


def _extend_masks(masks: Masks, sources: Sources, n_ext: int, width: int
                  ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Masks ``False`` and sources 0 on the appended positions, rows repeated per extension."""
    if not width and n_ext == 1:
        return dict(masks), dict(sources)
    m2, s2 = {}, {}
    for name, m in masks.items():
        pad = m.new_zeros((m.shape[0], width, *m.shape[2:]))
        m2[name] = torch.cat([m, pad], dim=1).repeat(n_ext, *[1] * (m.dim() - 1))
        src = sources[name]
        s2[name] = torch.cat([src, src.new_zeros((width, *src.shape[1:]))])
    return m2, s2


def reply_logprobs(logits: Float[Tensor, "rows keep vocab"], replies: Sequence[Sequence[int]],
                   exts: Sequence[tuple[int, ...]], batch: int) -> Float[Tensor, "batch n_reply"]:
    """``log P(reply | prompt)`` from the logits of extended prompts (module docstring).

    Args:
        logits: logits at positions ``n - 1 ... n - 1 + width`` of the ``E * batch`` rows built
            by extending each prompt with ``exts`` (row ``e * batch + b``).
        replies: token ids of each reply.
        exts: :func:`reply_extensions` of ``replies``.
        batch: prompts per extension.

    Returns:
        Summed token log-probabilities ``[batch, len(replies)]`` (float32 or wider),
        differentiable.
    """
    lp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    cols = []
    for r in replies:
        e = exts.index(tuple(r[:-1])) if len(r) > 1 else 0
        rows = lp[e * batch:(e + 1) * batch]
        idx = torch.arange(len(r), device=lp.device)
        tok = torch.tensor(list(r), device=lp.device)
        cols.append(rows[:, idx, tok].sum(-1))
    return torch.stack(cols, dim=-1)


class Backend(Protocol):
    """What every backend offers (module docstring)."""

    name: str
    handle: ModelHandle

    def forward(self, ids: Int[Tensor, "batch pos"], *, masks: Masks | None = None,
                sources: Sources | None = None, cache_hooks: Iterable[str] = (),
                prefix: Any = None, inputs_embeds: Float[Tensor, "batch pos d_model"] | None = None,
                keep_graph: bool = False, extra_hooks: Callable[[], Any] | None = None,
                logits_to_keep: int = 1, return_kv: bool = False) -> Forward:
        """Run ``ids`` with the masked patches; return the last positions' logits and the cache.

        Args:
            ids: token ids, ``[batch, pos]`` (after ``prefix`` when one is given).
            masks: hook-point name -> where to patch, ``[batch, pos]`` or
                ``[batch, pos, n_heads]`` (``attn.hook_z``).
            sources: hook-point name -> the activation patched in, ``[pos, ...]``.
            cache_hooks: hook-point names whose (patched) activations to return.
            prefix: key/value cache of the positions before ``ids`` (``hf`` only).
            inputs_embeds: embeddings instead of ``ids`` (``hf`` only; gradients).
            keep_graph: return live tensors instead of detached copies (``hf`` only).
            extra_hooks: a context-manager factory entered around the forward (``hf`` only).
            logits_to_keep: how many last positions get logits.
            return_kv: also return the key/value cache (``hf`` only).

        Returns:
            :class:`Forward`: ``logits [batch, logits_to_keep, vocab]``, the activations
            ``{name: [batch, pos, ...]}`` and the key/value cache (or None).

        Raises:
            BackendError: an option this backend does not offer.
            HookError: an unknown hook point or a layer outside the model.
            BackendError: masks or sources that do not fit (:func:`check_masks`).
        """
        ...

    def score(self, ids: Int[Tensor, "batch pos"], replies: Sequence[Sequence[int]], *,
              masks: Masks | None = None, sources: Sources | None = None,
              cache_hooks: Iterable[str] = (), prefix: Any = None,
              extra_hooks: Callable[[], Any] | None = None,
              ) -> tuple[Float[Tensor, "batch n_reply"], Float[Tensor, "batch vocab"], Cache]:
        """The patched forward of :meth:`forward`, scored with whole replies (module docstring).

        ``extra_hooks`` (``hf`` only) is entered around the prompt's forward, not the replies'.

        Returns:
            ``(logprobs [batch, n_reply], last-position logits [batch, vocab], activations)``;
            ``logprobs[:, j] = log P(replies[j] | patched prompt)`` in nats.
        """
        ...


class HFBackend:
    """The Hugging Face model, read and edited through :func:`interp.hooks.capture.hooked`.

    Args:
        handle: the model (a PEFT model around one works too).
        attn: attention kernel to run under (None: the model's own).
    """

    name = "hf"

    def __init__(self, handle: ModelHandle, *, attn: str | None = None):
        self.handle = handle
        self.model = handle.model
        self.attn = attn

    def _attn(self) -> Any:
        if not self.attn or self.model.config._attn_implementation == self.attn:
            return contextlib.nullcontext()
        return attn_implementation(self.handle, self.attn)

    def forward(self, ids: Int[Tensor, "batch pos"], *, masks: Masks | None = None,
                sources: Sources | None = None, cache_hooks: Iterable[str] = (),
                prefix: Any = None, inputs_embeds: Float[Tensor, "batch pos d_model"] | None = None,
                keep_graph: bool = False, extra_hooks: Callable[[], Any] | None = None,
                logits_to_keep: int = 1, return_kv: bool = False) -> Forward:
        """:meth:`Backend.forward`; ``prefix`` is a batch-1 cache, expanded to the batch."""
        masks, sources = masks or {}, sources or {}
        check_masks(ids, masks, sources, base_model(self.handle.model).config)
        edits = {name: masked_edit(m, sources[name]) for name, m in masks.items()}
        kwargs: dict[str, Any] = {"use_cache": prefix is not None or return_kv,
                                  "logits_to_keep": logits_to_keep}
        if prefix is not None:
            pk = copy.deepcopy(prefix)
            batch = (inputs_embeds if inputs_embeds is not None else ids).shape[0]
            if batch > 1:
                pk.batch_repeat_interleave(batch)
            kwargs[cache_kwarg(self.model)] = pk
        extra = extra_hooks() if extra_hooks else contextlib.nullcontext()
        with self._attn(), hooked(self.model, cache=cache_hooks, edits=edits,
                                  keep_graph=keep_graph) as cache, extra:
            if inputs_embeds is not None:
                out = self.model(inputs_embeds=inputs_embeds, **kwargs)
            else:
                out = self.model(input_ids=ids, **kwargs)
        return Forward(out.logits, dict(cache), output_cache(out) if return_kv else None)

    def score(self, ids: Int[Tensor, "batch pos"], replies: Sequence[Sequence[int]], *,
              masks: Masks | None = None, sources: Sources | None = None,
              cache_hooks: Iterable[str] = (), prefix: Any = None,
              extra_hooks: Callable[[], Any] | None = None,
              ) -> tuple[Float[Tensor, "batch n_reply"], Float[Tensor, "batch vocab"], Cache]:
        """:meth:`Backend.score` from the patched forward's key/value cache.

        The replies' later tokens are scored by
        :func:`interp.models.kv_cache.continuation_logprobs`,
        run outside the hooks, so the reply positions are not patched.
        """
        out = self.forward(ids, masks=masks, sources=sources, cache_hooks=cache_hooks,
                           prefix=prefix, return_kv=True, extra_hooks=extra_hooks)
        n = ids.shape[1] + (prefix.get_seq_length() if prefix is not None else 0)
        mask = torch.ones(ids.shape[0], n, dtype=torch.long, device=ids.device)
        with self._attn():
            lp = continuation_logprobs(self.model, out.logits[:, -1], out.kv, mask,
                                       [list(r) for r in replies])
        return lp, out.logits[:, -1], out.acts

    def patterns(self, ids: Int[Tensor, "1 pos"], layers: Sequence[int]
                 ) -> dict[int, Float[Tensor, "1 head pos pos"]]:
        """Full attention patterns of ``layers``: eager attention's ``output_attentions``.

        The check path of the exact recorder (:mod:`interp.hooks.recorder`): float32 on CPU,
        rows sum to 1.
        """
        with attn_implementation(self.handle, "eager"), torch.no_grad(), \
                inference_guard(self.model):
            out = self.model(input_ids=ids, use_cache=False, output_attentions=True,
                             logits_to_keep=1)
        return {x: out.attentions[x].float().cpu() for x in layers}

    def prefix_cache(self, ids: Int[Tensor, "1 prefix"]) -> Any:
        """Key/value cache of ``ids`` (the shared unpatched prefix of every patched row)."""
        with self._attn(), torch.no_grad(), inference_guard(self.model):
            out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
        return output_cache(out)

    def _steer_last(self, ids: Int[Tensor, "1 pos"], steer: Any) -> dict[str, Any]:
        """The steered forward's arguments: the last position per alpha, the unsteered prefix."""
        return {"ids": ids[:, -1:].expand(len(steer.alphas), -1),
                "prefix": self.prefix_cache(ids[:, :-1]) if ids.shape[1] > 1 else None,
                "extra_hooks": lambda: steer.attention(self.handle)}

    @torch.no_grad()
    def steered(self, ids: Int[Tensor, "1 pos"], steer: Any) -> Forward:
        """The prompt's last position once per alpha of ``steer``, after the unsteered prefix.

        Step 1 of :mod:`interp.methods.steering`: every position but the last runs once,
        unsteered (its key/value cache is the same for every alpha and is expanded to the
        batch); then the last position runs for all alphas (one batch row each) inside
        ``steer.attention(handle)`` (:func:`interp.hooks.steering.steering`), which keeps the
        steered last rows of every layer in ``steer.rows`` when ``steer.keep_rows``.

        Args:
            ids: the prompt ``[1, pos]``.
            steer: the intervention, an :class:`interp.hooks.steering.Steer`.

        Returns:
            :class:`Forward`: ``logits [n_alpha, 1, vocab]`` of the last position and the
            key/value cache of every row (``kv``), for decoding on.
        """
        kw = self._steer_last(ids, steer)
        return self.forward(kw.pop("ids"), return_kv=True, **kw)

    @torch.no_grad()
    def steered_score(self, ids: Int[Tensor, "1 pos"], replies: Sequence[Sequence[int]],
                      steer: Any) -> tuple[Float[Tensor, "alpha n_reply"],
                                           dict[int, Tensor] | None]:
        """Whole-reply verdict scores under steering, one row per alpha (``hf``).

        :meth:`steered`, scored as :meth:`score` does: the replies' later tokens are scored
        from each row's key/value cache outside the steering, so only the verdict position's
        query is steered.

        Args:
            ids: the judge prompt ``[1, pos]``.
            replies: token ids of each reply.
            steer: the intervention (:class:`interp.hooks.steering.Steer`).

        Returns:
            ``(logprobs [n_alpha, n_reply], rows)``: ``log P(reply | steered prompt)`` in nats
            and ``steer.rows`` (layer -> steered last rows ``[n_alpha, n_heads, pos]``, filled
            when ``steer.keep_rows``).

        Raises:
            StageError: as :func:`interp.hooks.steering.steering`.
        """
        kw = self._steer_last(ids, steer)
        lp, _, _ = self.score(kw.pop("ids"), replies, **kw)
        return lp, steer.rows


class _FullPromptBackend:
    """What the TransformerLens and nnsight backends share: full prompts, checked names."""

    name = ""

    def __init__(self, handle: ModelHandle):
        self.handle = handle

    def forward(self, ids: Int[Tensor, "batch pos"], *, masks: Masks | None = None,
                sources: Sources | None = None, cache_hooks: Iterable[str] = (),
                prefix: Any = None, inputs_embeds: Any = None, keep_graph: bool = False,
                extra_hooks: Any = None, logits_to_keep: int = 1,
                return_kv: bool = False) -> Forward:
        """:meth:`Backend.forward` (full prompts only)."""
        bad = [k for k, v in {"prefix": prefix, "inputs_embeds": inputs_embeds,
                              "keep_graph": keep_graph, "extra_hooks": extra_hooks,
                              "return_kv": return_kv}.items() if v not in (None, False)]
        if bad:
            raise BackendError(f"the {self.name} backend runs full prompts without {bad}; "
                               f"use 'hf'")
        masks, sources = masks or {}, sources or {}
        # unknown names and masks that do not fit fail before the forward
        sites = {n: hook_site(self.handle.model, n) for n in set(masks) | set(cache_hooks)}
        check_masks(ids, masks, sources, base_model(self.handle.model).config)
        order = sorted(sites, key=hook_order)
        with inference_guard(self.handle.model):
            logits, acts = self._run(ids, {n: sites[n] for n in order}, masks, sources,
                                     set(cache_hooks), logits_to_keep)
        return Forward(logits, acts)

    def score(self, ids: Int[Tensor, "batch pos"], replies: Sequence[Sequence[int]], *,
              masks: Masks | None = None, sources: Sources | None = None,
              cache_hooks: Iterable[str] = (), prefix: Any = None,
              extra_hooks: Callable[[], Any] | None = None,
              ) -> tuple[Float[Tensor, "batch n_reply"], Float[Tensor, "batch vocab"], Cache]:
        """:meth:`Backend.score` on extended prompts (module docstring).

        The activations returned are those of the prompt positions of the first extension.
        """
        exts = reply_extensions(replies)
        width = max(len(e) for e in exts)
        b, n = ids.shape
        m2, s2 = _extend_masks(masks or {}, sources or {}, len(exts), width)
        tok = self.handle.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        out = self.forward(extend_prompts(ids, exts, pad), masks=m2, sources=s2,
                           cache_hooks=cache_hooks, prefix=prefix, extra_hooks=extra_hooks,
                           logits_to_keep=width + 1)
        lp = reply_logprobs(out.logits, replies, exts, b)
        acts = {k: v[:b, :n] for k, v in out.acts.items()}
        return lp, out.logits[:b, 0], acts

    def _run(self, ids: Tensor, sites: Mapping[str, HookSite], masks: Masks, sources: Sources,
             want: set[str], keep: int) -> tuple[Logits, Cache]:
        raise NotImplementedError


class TLBackend(_FullPromptBackend):
    """TransformerLens ``TransformerBridge``: ``run_with_hooks`` on the same hook names."""

    name = "transformer_lens"

    def __init__(self, handle: ModelHandle):
        super().__init__(handle)
        self.bridge = to_tlens(handle)

    def _run(self, ids: Tensor, sites: Mapping[str, HookSite], masks: Masks, sources: Sources,
             want: set[str], keep: int) -> tuple[Logits, Cache]:
        cache: Cache = {}

        def mk(name: str) -> Callable:
            def fn(x: Tensor, hook: Any) -> Tensor:
                if name in masks:
                    x = masked_edit(masks[name], sources[name])(x)
                if name in want:
                    cache[name] = x.detach().clone()
                return x
            return fn

        hooks = [(n, mk(n)) for n in sites]
        with attn_implementation(self.handle, "eager"), torch.no_grad(), \
                inference_guard(self.bridge):
            logits = self.bridge.run_with_hooks(ids, fwd_hooks=hooks, return_type="logits")
        return logits[:, -keep:, :], cache

    @torch.no_grad()
    def steered_score(self, ids: Int[Tensor, "1 pos"], replies: Sequence[Sequence[int]],
                      steer: Any) -> tuple[Float[Tensor, "alpha n_reply"], None]:
        """Whole-reply verdict scores under steering on the bridge, one row per alpha.

        The prompt is extended by the replies (:func:`reply_extensions`, one row per
        extension and alpha) and run once with ``steer.score_hooks`` at the verdict position
        (``pos - 1``) under eager attention; the appended reply positions are not steered. It
        agrees with :meth:`HFBackend.steered_score` to 1e-4 (tests/equivalence).

        Args:
            ids: the judge prompt ``[1, pos]``.
            replies: token ids of each reply.
            steer: the intervention (:class:`interp.hooks.steering.Steer`).

        Returns:
            ``(logprobs [n_alpha, n_reply], None)``: no steered rows (no context mass).

        Raises:
            StageError: as :meth:`interp.hooks.steering.Steer.check`.
        """
        exts = reply_extensions(replies)
        width = max(len(e) for e in exts)
        b = len(steer.alphas)
        tok = self.handle.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        st = dataclasses.replace(steer, alphas=list(steer.alphas) * len(exts), keep_rows=False,
                                 rows={})
        hooks = st.score_hooks(self.handle, query=ids.shape[1] - 1)
        with attn_implementation(self.handle, "eager"), inference_guard(self.bridge):
            logits = self.bridge.run_with_hooks(extend_prompts(ids.expand(b, -1), exts, pad),
                                                fwd_hooks=hooks, return_type="logits")
        return reply_logprobs(logits[:, -(width + 1):, :], replies, exts, b), None

    def patterns(self, ids: Int[Tensor, "1 pos"], layers: Sequence[int]
                 ) -> dict[int, Float[Tensor, "1 head pos pos"]]:
        """Full attention patterns of ``layers``: the bridge's ``blocks.L.attn.hook_pattern``."""
        names = {x: f"blocks.{x}.attn.hook_pattern" for x in layers}
        with torch.no_grad(), inference_guard(self.bridge):
            _, cache = self.bridge.run_with_cache(ids, names_filter=lambda n: n in
                                                  names.values())
        return {x: cache[n].float().cpu() for x, n in names.items()}


class NNsightBackend(_FullPromptBackend):
    """nnsight tracing: module inputs/outputs read and assigned in execution order."""

    name = "nnsight"

    def __init__(self, handle: ModelHandle):
        super().__init__(handle)
        self.lm = to_nnsight(handle)
        self.n_heads = handle.n_heads

    def _run(self, ids: Tensor, sites: Mapping[str, HookSite], masks: Masks, sources: Sources,
             want: set[str], keep: int) -> tuple[Logits, Cache]:
        saved: dict[str, Any] = {}
        with torch.no_grad(), self.lm.trace(ids):
            for name, site in sites.items():
                env = envoy(self.lm, site.module_path)
                whole = env.output if site.io == "output" else env.input
                # a module that returns a tuple (the attention block: output, weights) holds
                # the hook point's tensor first, as interp.hooks.capture reads it
                raw = whole[0] if isinstance(whole, tuple) else whole
                heads = n_heads_at(self.handle.model, site.point)
                x = raw.view(*raw.shape[:-1], heads, -1) if heads else raw
                if name in masks:
                    x = masked_edit(masks[name], sources[name])(x)
                    new = x.reshape(raw.shape) if heads else x
                    if isinstance(whole, tuple):
                        new = (new, *whole[1:])
                    if site.io == "output":
                        env.output = new
                    else:
                        env.input = new
                if name in want:
                    saved[name] = x.save()
            logits = self.lm.lm_head.output[:, -keep:, :].save()
        return logits.detach().clone(), {k: v.detach().clone() for k, v in saved.items()}

    def patterns(self, ids: Int[Tensor, "1 pos"], layers: Sequence[int]
                 ) -> dict[int, Float[Tensor, "1 head pos pos"]]:
        """Full attention patterns of ``layers``: each attention module's weights (eager).

        The attention module's second output under eager attention, read in an nnsight trace.
        """
        saved = []
        with attn_implementation(self.handle, "eager"), torch.no_grad(), \
                inference_guard(self.handle.model), self.lm.trace(ids):
            for x in layers:  # the attention block's second output: its weights
                path = hook_site(self.handle.model, f"blocks.{x}.hook_attn_out").module_path
                saved.append(envoy(self.lm, path).output[1].save())
        return {x: getattr(v, "value", v).float().cpu() for x, v in zip(layers, saved,
                                                                       strict=True)}


def get_backend(handle: ModelHandle, backend: str = "hf", *, attn: str | None = None
                ) -> Backend:
    """A backend for ``handle`` by name (:data:`BACKENDS`): the one place a name picks a class.

    Args:
        handle: the model.
        backend: ``hf``, ``transformer_lens`` or ``nnsight``.
        attn: ``hf`` only: run under another attention kernel (``eager``: the check path of
            the exact recorder, whose patterns are ``output_attentions``).

    Raises:
        BackendError: an unknown backend name (lists the valid ones, and what to write for
            ``eager``: ``backend="hf", attn="eager"``), or ``attn`` with a backend other than
            ``hf`` (:func:`interp.core.vocab.check_backend`).
    """
    check_backend(backend, BackendError, attn=attn)
    if backend == "hf":
        return HFBackend(handle, attn=attn)
    return {"transformer_lens": TLBackend, "nnsight": NNsightBackend}[backend](handle)
