"""The activation cache: hook name -> tensor, as TransformerLens's ``ActivationCache`` reads.

One type for activations read live (:meth:`interp.hooks.model.HookedModel.run_with_cache`) and
read back from disk (:func:`load_cache`, what ``interp record`` wrote): the same keys (the
TransformerLens hook names of :mod:`interp.models.points`, plus ``blocks.L.attn.hook_pattern``),
each tensor with a leading batch axis of 1, and the analyses researchers expect on a cache:

* **shorthand** (TransformerLens ``utils.get_act_name``): ``cache["pattern", 3]`` is
  ``cache["blocks.3.attn.hook_pattern"]``, ``cache["resid_post", -1]`` the last block's
  residual output (:data:`SHORTHAND`);
* :meth:`ActivationCache.stack`: one hook point over layers, ``[n_sel, batch, pos, ...]``;
* :meth:`ActivationCache.accumulated_resid`: the residual stream before block 0 and after every
  block, optionally through the model's final norm with each vector's own scale
  (:mod:`interp.models.readout`, pitfall 1; TransformerLens once folded the final layer's
  scale into every layer);
* :meth:`ActivationCache.logit_attrs`: direct logit attribution of a logit difference to the
  embeddings, every head, every attention bias and every MLP (Elhage et al. 2021;
  :func:`interp.models.readout.logit_attribution`), summing to the model's own difference;
* :meth:`ActivationCache.span_mass`: the attention mass of the last position on a labelled span
  (context, question, candidate), mean over heads and a band of layers: exactly the number
  ``interp attention`` stores for a record (paper section 3.2; :func:`span_mass_of`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from interp.analysis.span_mass import span_mass as _span_mass
from interp.analysis.span_mass import span_names
from interp.core.errors import HookError
from interp.core.layers import parse_layers
from interp.core.names import did_you_mean
from interp.models.points import ALL_POINTS, PATTERN_POINT, hook_error, parse_hook
from interp.models.readout import attribution_names, logit_attribution, readout
from interp.store.recordings import load_activations

__all__ = ["PATTERN", "SHORTHAND", "ActivationCache", "act_name", "load_cache", "span_mass_of"]

PATTERN = PATTERN_POINT
"""The attention pattern's point (``[batch, n_heads, q_pos, k_pos]``; rows sum to 1)."""

SHORTHAND: dict[str, str] = {
    "resid_pre": "hook_resid_pre", "resid_mid": "hook_resid_mid",
    "resid_post": "hook_resid_post", "attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out",
    "k": "attn.hook_k", "v": "attn.hook_v", "z": "attn.hook_z", "pattern": PATTERN,
}
"""TransformerLens's short names (``utils.get_act_name``) -> the point of a block."""

POINTS = ALL_POINTS
"""Every point a cache can hold, in execution order within a block."""


def act_name(name: str, layer: int | None = None, n_layers: int | None = None) -> str:
    """The full hook name of a short name and a layer (TransformerLens ``get_act_name``).

    Args:
        name: a short name of :data:`SHORTHAND` (``"pattern"``), a point (``"attn.hook_z"``),
            or a full name (``"blocks.3.hook_resid_post"``, returned as it is).
        layer: the block (negative counts from the end when ``n_layers`` is given).
        n_layers: the model's depth, to check ``layer`` and resolve negative layers.

    Raises:
        HookError: an unknown name, a short name without a layer, or a layer out of range.
    """
    if not isinstance(name, str):
        raise HookError(f"an activation is named by a string, not {name!r}: "
                        f"cache['resid_post', 3] or cache['blocks.3.hook_resid_post']")
    if name.startswith("blocks."):
        return name if n_layers is None else _full(name, n_layers)
    point = SHORTHAND.get(name, name)
    if point not in POINTS and re.search(r"\.-?\d+\.", name):    # a full name, misspelt
        raise hook_error(name, 10**9 if n_layers is None else n_layers, POINTS)
    if point not in POINTS:
        hint = did_you_mean(name, [*SHORTHAND, *POINTS])
        raise HookError(f"unknown activation {name!r}{hint}: use one of {sorted(SHORTHAND)} or "
                        f"a point of {list(POINTS)}, with a layer: cache['pattern', 3]")
    if layer is None:
        raise HookError(f"{name!r} needs a layer: cache[{name!r}, 3]")
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise HookError(f"the layer of {name!r} must be an integer, not {layer!r}")
    full = f"blocks.{int(layer)}.{point}"
    return full if n_layers is None else _full(full, n_layers)


def _full(name: str, n_layers: int) -> str:
    """A full name with its layer checked and made non-negative.

    Raises:
        HookError: :func:`interp.models.points.hook_error` (every valid point, the closest
            name, or the user's own hook with the valid layers).
    """
    layer, point = parse_hook(name, n_layers, POINTS)
    return f"blocks.{layer}.{point}"


class ActivationCache(Mapping[str, Tensor]):
    """Activations of one forward by hook name, with TransformerLens's cache habits.

    Args:
        acts: hook name -> tensor with a batch axis: ``[batch, pos, d_model]`` residuals and
            block outputs, ``[batch, pos, n_heads, head_dim]`` at ``attn.hook_z``,
            ``[batch, pos, n_kv_heads, head_dim]`` at ``attn.hook_k`` / ``attn.hook_v``,
            ``[batch, n_heads, pos, pos]`` float32 at ``attn.hook_pattern``.
        n_layers: the model's depth (checks layers, resolves negative ones).
        model: the live :class:`interp.hooks.model.HookedModel` (or a causal LM), needed by
            the analyses that read weights (:meth:`accumulated_resid` with ``apply_ln``,
            :meth:`logit_attrs`); None for a cache read from disk without a model.
        rows: the last position's attention rows ``[n_layers, n_heads, pos]`` float32 of the
            same forward (every layer, recorded at about the cost of a plain forward), or None.
        labels: the span label of every position (``context``, ``question``, ``candidate``,
            ``template``, ...), when the prompt carried them.
        token_ids: the prompt's token ids ``[pos]``.
        source: what the forward ran on, in words (``"a plain string"``, ``"bare token
            ids"``), for the messages of analyses that need what it lacks.
    """

    def __init__(self, acts: Mapping[str, Tensor], *, n_layers: int, model: Any = None,
                 rows: Tensor | None = None, labels: Sequence[str] | None = None,
                 token_ids: Sequence[int] | None = None, source: str | None = None) -> None:
        self.cache_dict = dict(acts)
        self.n_layers = int(n_layers)
        self.model = model
        self.rows = rows
        self.labels = list(labels) if labels is not None else None
        self.token_ids = list(token_ids) if token_ids is not None else None
        self.source = source or "a prompt without span labels"

    # --- the mapping ------------------------------------------------------------------------

    def _key(self, key: str | tuple) -> str:
        if isinstance(key, tuple):
            return act_name(key[0], key[1] if len(key) > 1 else None, self.n_layers)
        return act_name(key, None, self.n_layers)

    def __getitem__(self, key: str | tuple) -> Tensor:
        """``cache["blocks.3.hook_resid_post"]`` or ``cache["resid_post", 3]`` (TL shorthand).

        Raises:
            HookError: an unknown name or a layer outside the model.
            KeyError: a valid name that was not cached (the message lists what was).
        """
        name = self._key(key)
        if name not in self.cache_dict:
            raise KeyError(f"{name!r} was not cached; cached: {self._summary()} (pass it in "
                           f"names= of run_with_cache)")
        return self.cache_dict[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache_dict)

    def __len__(self) -> int:
        return len(self.cache_dict)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, (str, tuple)):
            return False
        try:
            return self._key(key) in self.cache_dict
        except HookError:
            return False

    def __repr__(self) -> str:
        return f"ActivationCache({self._summary()})"

    def _summary(self) -> str:
        by_point: dict[str, list[int]] = {}
        for name in self.cache_dict:
            _, layer, point = name.split(".", 2)
            by_point.setdefault(point, []).append(int(layer))
        return ", ".join(f"{p} at layers {sorted(ls)}" for p, ls in by_point.items()) or "nothing"

    def to(self, device: str | torch.device) -> ActivationCache:
        """The same cache with every tensor on ``device``."""
        return ActivationCache({k: v.to(device) for k, v in self.cache_dict.items()},
                               n_layers=self.n_layers, model=self.model, rows=self.rows,
                               labels=self.labels, token_ids=self.token_ids,
                               source=self.source)

    # --- TransformerLens's analyses ---------------------------------------------------------

    def stack(self, point: str, layers: str | Sequence[int] | None = None
              ) -> Float[Tensor, "layer batch ..."]:
        """One hook point over layers (TransformerLens ``stack_activation``).

        Args:
            point: a short name (``"resid_post"``) or a point (``"attn.hook_z"``).
            layers: the layer grammar (``"24-31"``, ``"last8"``, ``[0, -1]``) or None for every
                layer cached at that point.

        Returns:
            ``[n_sel, batch, ...]``: the point's tensors stacked in ascending layer order.

        Raises:
            HookError: an unknown point; KeyError: a selected layer that was not cached.
        """
        sel = (parse_layers(layers, self.n_layers) if layers is not None else
               [x for x in range(self.n_layers) if act_name(point, x) in self.cache_dict])
        if not sel:
            raise KeyError(f"no layer of {point!r} was cached; cached: {self._summary()}")
        return torch.stack([self[point, x] for x in sel])

    def accumulated_resid(self, *, apply_ln: bool = False, pos: int | slice | None = None
                          ) -> Float[Tensor, "layer batch pos d_model"]:
        """The residual stream before block 0 and after every block (the logit lens's input).

        TransformerLens ``accumulated_resid``: entry 0 is ``blocks.0.hook_resid_pre`` (the
        embeddings), entry ``L + 1`` is ``blocks.L.hook_resid_post``. With ``apply_ln`` each
        vector goes through the model's final norm with ITS OWN scale (module docstring), so
        ``readout.weight`` times the last entry gives the model's logits.

        Args:
            apply_ln: apply the final norm (needs the model).
            pos: keep one position (an int, kept as an axis of 1) or a slice; None: all.

        Returns:
            ``[n_layers + 1, batch, pos, d_model]``.

        Raises:
            KeyError: a residual stream that was not cached.
            HookError: ``apply_ln`` on a cache without a model.
        """
        names = ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post"
                                               for i in range(self.n_layers)]
        stack = torch.stack([self[n] for n in names])
        if isinstance(pos, int):
            self._check_pos(pos, stack.shape[2])
        if pos is not None:
            stack = stack[:, :, pos:pos + 1 if pos != -1 else None] if isinstance(pos, int) \
                else stack[:, :, pos]
        if apply_ln:
            stack = readout(self._model()).normalized(stack)
        return stack

    def logit_attrs(self, a: int | str, b: int | str, *, pos: int = -1) -> dict[str, Any]:
        """Direct logit attribution of ``logit[a] - logit[b]`` at position ``pos``.

        :func:`interp.models.readout.logit_attribution` on this cache (batch row 0): what the
        embeddings, each head, each attention bias and each MLP add to the difference with the
        final norm's scale frozen at its value at ``pos``. The parts sum to the model's own
        logit difference (``total``, from the cached final residual stream).

        Tokens are given as TransformerLens's ``ActivationCache.logit_attrs`` takes its
        ``tokens`` / ``incorrect_tokens``: a token id (an int or a 0-d integer tensor) or a
        string that the model's tokenizer encodes (without special tokens) as exactly one
        token (TransformerLens ``to_single_token``). A string of several tokens is refused:
        pass the id of the token meant (the message lists them); mind a leading space
        (``" Correct"`` and ``"Correct"`` are different tokens in most vocabularies).

        Example:
            >>> cache.logit_attrs("Correct", "Incorrect")["heads"]   # [n_layers, n_heads]

        Args:
            a: the token scored up (e.g. ``"Correct"``, or the id of its first token).
            b: the token scored down (e.g. ``"Incorrect"``).
            pos: the position read (default the last: the verdict position of a judge prompt).

        Returns:
            ``{"heads": [n_layers, n_heads], "mlp": [n_layers], "attn_bias": [n_layers],
            "embed", "lm_bias", "norm_bias", "sum", "total"}`` in nats (float64;
            ``norm_bias``: a LayerNorm final norm's bias on the direction, 0 for RMSNorm).

        Raises:
            KeyError: an activation the attribution reads was not cached
                (:func:`interp.models.readout.attribution_names`).
            HookError: a cache without a model, a token that is neither an id nor a string
                (says what to pass), a string of several tokens (lists their ids), a token
                outside the vocabulary or a position outside the prompt.
        """
        model = self._model()
        vocab = int(readout(model).weight.shape[0])
        a, b = (self._token_id(t) for t in (a, b))
        if bad := [t for t in (a, b) if not 0 <= t < vocab]:
            raise HookError(f"token ids {bad} are outside the vocabulary 0..{vocab - 1}")
        self._check_pos(pos, self[f"blocks.{self.n_layers - 1}.hook_resid_post"].shape[1])
        acts = {n: self[n][0, pos] for n in attribution_names(self.n_layers)}
        out = logit_attribution(acts, model, a, b)
        ro = readout(model)
        logits = ro.logits(acts[f"blocks.{self.n_layers - 1}.hook_resid_post"][None])[0]
        out["total"] = float(logits[a].double() - logits[b].double())
        return out

    def span_mass(self, span: str, layers: str | Sequence[int] = "last8") -> float:
        """The last position's attention mass on ``span``, mean over heads and ``layers``.

        :func:`span_mass_of` on this cache's last rows (recorded with every forward of
        :meth:`interp.hooks.model.HookedModel.run_with_cache`, else the patterns' last rows):
        the number ``interp attention`` stores for a record (``mass.{task}`` averaged over the
        band), paper section 3.2.

        Args:
            span: a label of the prompt (``context``, ``question``, ``candidate``,
                ``template``; ``reference`` with such templates).
            layers: the band, in the layer grammar (``"24-31"``; default the last eight).

        Returns:
            The mass, a probability in [0, 1] (float).

        Raises:
            HookError: a cache without labels (names what it was run on: a plain string or
                bare ids carry no spans; run a rendered prompt of
                :mod:`interp.judging.cases`) or without attention rows or patterns of the band.
        """
        if self.labels is None:
            raise HookError(f"this cache has no span labels: it was run on {self.source}, "
                            f"which carries none; run a prompt with spans instead (a "
                            f"RenderedPrompt: case(tokenizer, example).judging(answer) or "
                            f".gen of interp.judging.cases)")
        if span not in span_names(self.labels):
            raise HookError(f"unknown span {span!r}; this prompt's spans: "
                            f"{span_names(self.labels)}")
        band = parse_layers(layers, self.n_layers)
        if self.rows is not None:
            rows = self.rows[band]
        else:
            missing = [x for x in band if f"blocks.{x}.{PATTERN}" not in self.cache_dict]
            if missing:
                raise HookError(f"no attention rows or patterns at layers {missing}: cache "
                                f"'pattern' at those layers")
            rows = torch.stack([self["pattern", x][0, :, -1, :] for x in band])
        return span_mass_of(rows, self.labels, span)

    def _token_id(self, token: Any) -> int:
        """A token id from an id or a one-token string (:meth:`logit_attrs`).

        Raises:
            HookError: another type, a string of several (or no) tokens, or a string on a
                cache whose model has no tokenizer.
        """
        if isinstance(token, str):
            tok = getattr(self.model, "tokenizer", None)
            if tok is None:
                raise HookError(f"cannot encode {token!r} without the model's tokenizer: pass "
                                f"a token id, or use run_with_cache on a HookedModel")
            ids = list(tok.encode(token, add_special_tokens=False))
            if len(ids) != 1:
                raise HookError(f"{token!r} is {len(ids)} tokens {ids} "
                                f"{tok.convert_ids_to_tokens(ids)}, not one: pass one token's "
                                f"id or a string of one token")
            return int(ids[0])
        if isinstance(token, Tensor) and token.numel() == 1 and not (
                token.is_floating_point() or token.is_complex() or token.dtype == torch.bool):
            return int(token.item())
        if not isinstance(token, bool) and hasattr(token, "__index__"):
            return int(token.__index__())
        raise HookError(f"a token is an id (int) or a string of one token (\"Correct\"), not "
                        f"{token!r}")

    @staticmethod
    def _check_pos(pos: int, n: int) -> None:
        if not -n <= pos < n:
            raise HookError(f"position {pos} is outside the prompt's {n} positions "
                            f"(-{n}..{n - 1})")

    def _model(self) -> Any:
        if self.model is None:
            raise HookError("this analysis reads the model's weights: load the cache with "
                            "model=... (or use run_with_cache)")
        if callable(getattr(self.model, "get_output_embeddings", None)):
            return self.model                   # a causal LM itself (its .model is the trunk)
        return getattr(self.model, "model", self.model)


def span_mass_of(rows: Float[Tensor, "layer head pos"], labels: Sequence[str], span: str
                 ) -> float:
    """Mean over layers and heads of the attention mass of ``rows`` on the positions of ``span``.

    Raises:
        HookError: ``span`` is not a label of the prompt (names the labels it has).
    """
    names = span_names(labels)
    if span not in names:
        raise HookError(f"unknown span {span!r}; this prompt's spans: {names}")
    mass = _span_mass(rows, labels, names)[..., names.index(span)]
    return float(mass.double().mean())


def load_cache(run: Any, record_id: str, task: str, hooks: Sequence[str], *,
               dataset: str | None = None, model: Any = None) -> ActivationCache:
    """What ``interp record`` wrote for one prompt, as the cache ``run_with_cache`` returns.

    Example:
        >>> cache = load_cache("runs/smol", "56de0f", "eval", ["attn.hook_pattern"])
        >>> cache["pattern", 20].shape          # [1, n_heads, pos, pos]
        >>> cache.span_mass("context", "24-29")

    Args:
        run: the run directory (path or :class:`interp.store.RunDir`).
        record_id: the record's id.
        task: ``"gen"`` or ``"eval"``.
        hooks: full names (``blocks.20.attn.hook_pattern``; negative layers count from the
            end) or points alone (``attn.hook_pattern``: every recorded layer).
        dataset: the record's dataset, needed only when the id occurs in several.
        model: the live model, for the analyses that read weights.

    Returns:
        An :class:`ActivationCache` keyed by full hook names, each tensor ``[1, ...]``, with
        the recording's span labels and token ids.

    Raises:
        interp.core.errors.RunDirError: as :func:`interp.store.load_activations`.
    """
    root = Path(getattr(run, "path", run))
    acts: dict[str, Tensor] = {}
    info = None
    for hook in hooks:
        a = load_activations(root, record_id, task, hook, dataset=dataset)
        info = a
        point = hook.split(".", 2)[2] if hook.startswith("blocks.") else hook
        tensors = [a.tensor] if hook.startswith("blocks.") else list(a.tensor)
        for layer, t in zip(a.layers, tensors, strict=True):
            acts[f"blocks.{layer}.{point}"] = t[None]
    return ActivationCache(acts, n_layers=info.n_layers if info else 0, model=model,
                           labels=info.labels if info else None,
                           token_ids=info.token_ids if info else None)

