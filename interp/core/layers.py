"""The one layer-selection grammar, used by every command and config.

Grammar (case-insensitive, whitespace ignored)::

    spec   := "all" | "last" K | item ("," item)*
    item   := INT | INT "-" INT          (an inclusive range; "24-31", "-8--1")

* ``all``: every layer ``0 .. n_layers-1``.
* ``lastK``: the last ``K`` layers (``last8`` = the paper's band, layers 24-31 of a 32-layer
  model; layers 22-29 of the 30-layer SmolLM2). ``K`` must be at most the model's layers,
  except for the default band (:data:`DEFAULT_BAND`, ``last8``): it adapts to a model with
  fewer than 8 layers, where it is every layer (a 4-layer model's band is 0-3), so a stage
  run with its defaults works on any model; :func:`band_note` says so in one line.
* integers may be negative and then count from the end (``-1`` = the last layer), also inside
  ranges (``-8--1`` = ``last8``).
* a Python sequence of ints is accepted as well.

The result is sorted and de-duplicated. Every selection is checked against the model: a layer
outside ``0 .. n_layers-1`` raises :class:`interp.core.errors.LayerSpecError` naming the valid
range. The grammar alone is checked without the model (:func:`check_layer_syntax`), so a
config's misspelt selection is refused before any model or heavy library loads.

Steering's head spec (``all``, ``top-diff:K``, ``L.H,L.H``: :func:`parse_heads`) selects heads
within layers and is parsed here too, so a config check reads it without torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from interp.core.errors import LayerSpecError, StageError

__all__ = ["DEFAULT_BAND", "band_note", "check_layer_syntax", "parse_heads", "parse_layers",
           "top_diff_k"]

DEFAULT_BAND = "last8"
"""The paper's late-layer band (section 3.2): the last eight layers (every layer of a model
with fewer)."""
_DEFAULT_K = 8


def band_note(spec: str | int | Sequence[int] | None, n_layers: int) -> str | None:
    """The one line a stage prints when the default band adapts to a small model, else None.

    Args:
        spec: the band as given (a stage config's ``band``).
        n_layers: the model's transformer blocks.

    Returns:
        E.g. ``"the default band last8 is layers 0-3: the model has only 4 layers"``.
    """
    if _is_default(spec) and 1 <= n_layers < _DEFAULT_K:
        return (f"the default band {DEFAULT_BAND} is layers 0-{n_layers - 1}: the model has "
                f"only {n_layers} layers")
    return None


def _is_default(spec: object) -> bool:
    return isinstance(spec, str) and re.sub(r"\s+", "", spec.lower()) == DEFAULT_BAND

_RANGE = re.compile(r"(-?\d+)-(-?\d+)")
_INT = re.compile(r"-?\d+")
_FORMS = "use 'all', 'last8', '24-31' or '0,4,-1'"


def check_layer_syntax(spec: str | int | Sequence[int] | None) -> None:
    """Refuse a layer selection the grammar (module docstring) cannot parse, without the model.

    Whether the layers exist is left to :func:`parse_layers` once the model's layer count is
    known; here only the form: ``all``, ``lastK`` with ``K >= 1``, integers and ranges
    separated by commas (a range whose ends have the same sign must not be empty), an int,
    or a non-empty sequence of ints. None (the option's default) passes.

    Args:
        spec: the selection as given (a config value or a command-line option).

    Raises:
        LayerSpecError: the spec is not of the grammar; the message shows the accepted forms.
    """
    if spec is None or (isinstance(spec, int) and not isinstance(spec, bool)):
        return
    if isinstance(spec, str):
        s = re.sub(r"\s+", "", spec.lower())
        if s == "all":
            return
        if m := re.fullmatch(r"last(\d+)", s):
            if int(m.group(1)) < 1:
                raise LayerSpecError(f"layers {spec!r}: lastK needs K >= 1; {_FORMS}")
            return
        if not s:
            raise LayerSpecError(f"empty layer selection; {_FORMS}")
        for part in s.split(","):
            if m := _RANGE.fullmatch(part):
                a, b = (int(x) for x in m.groups())
                if (a < 0) == (b < 0) and a > b:
                    raise LayerSpecError(f"layers {spec!r}: range {part} is empty; {_FORMS}")
            elif not _INT.fullmatch(part):
                raise LayerSpecError(f"layers {spec!r}: cannot parse {part!r}; {_FORMS}")
        return
    if isinstance(spec, Sequence) and spec and all(
            isinstance(x, int) and not isinstance(x, bool) for x in spec):
        return
    raise LayerSpecError(f"layers {spec!r}: not a layer selection; {_FORMS}")


def parse_layers(spec: str | int | Sequence[int] | None, n_layers: int, *,
                 default: str | None = DEFAULT_BAND) -> list[int]:
    """Parse a layer selection (module docstring) into sorted layer indices.

    Args:
        spec: ``"all"``, ``"lastK"``, ``"24-31"``, ``"0,4,-1"``, ``"0-3,10"``, an int, a
            sequence of ints, or None (then ``default`` is parsed).
        n_layers: number of transformer blocks of the model.
        default: the spec used when ``spec`` is None (None: then None is an error).

    Returns:
        Sorted unique layer indices in ``0 .. n_layers-1``.

    Raises:
        LayerSpecError: an unparseable spec, an empty range, ``lastK`` with ``K`` outside
            ``1 .. n_layers`` (but the default band, ``last8``, adapts: module docstring), or a
            layer outside the model; the message names the valid range.
    """
    if n_layers < 1:
        raise LayerSpecError(f"a model needs at least one layer, not {n_layers}")
    valid = f"valid layers are 0-{n_layers - 1} (the model has {n_layers})"
    if spec is None:
        if default is None:
            raise LayerSpecError(f"no layers given; {valid}")
        spec = default
    items: list[int] = []
    if isinstance(spec, str):
        s = re.sub(r"\s+", "", spec.lower())
        if s == "all":
            return list(range(n_layers))
        if m := re.fullmatch(r"last(\d+)", s):
            k = int(m.group(1))
            if s == DEFAULT_BAND:  # the default band adapts to a smaller model
                k = min(k, n_layers)
            if not 1 <= k <= n_layers:
                raise LayerSpecError(f"layers {spec!r}: cannot take the last {k}; {valid}")
            return list(range(n_layers - k, n_layers))
        if not s:
            raise LayerSpecError(f"empty layer selection; {valid}")
        for part in s.split(","):
            if m := _RANGE.fullmatch(part):
                a, b = (_resolve(int(x), n_layers, spec, valid) for x in m.groups())
                if a > b:
                    raise LayerSpecError(f"layers {spec!r}: range {part} is empty; {valid}")
                items += range(a, b + 1)
            elif _INT.fullmatch(part):
                items.append(_resolve(int(part), n_layers, spec, valid))
            else:
                raise LayerSpecError(f"layers {spec!r}: cannot parse {part!r}; {_FORMS}")
    elif isinstance(spec, int):
        items = [_resolve(spec, n_layers, spec, valid)]
    else:
        items = [_resolve(int(x), n_layers, spec, valid) for x in spec]
        if not items:
            raise LayerSpecError(f"empty layer selection; {valid}")
    return sorted(set(items))


def _resolve(layer: int, n_layers: int, spec: object, valid: str) -> int:
    x = layer + n_layers if layer < 0 else layer
    if not 0 <= x < n_layers:
        raise LayerSpecError(f"layers {spec!r}: layer {layer} is out of range; {valid}")
    return x


def top_diff_k(spec: str) -> int:
    """The ``K`` of a ``top-diff:K`` head spec.

    Raises:
        StageError: ``K`` is not a whole number >= 1.
    """
    k = spec.strip().split(":", 1)[1]
    if not k.isdigit() or int(k) < 1:
        raise StageError("steering", f"heads {spec!r}: K of top-diff:K must be a whole number >= 1")
    return int(k)


def parse_heads(spec: str | Sequence[str], band: Sequence[int], n_heads: int, *,
                ranked: Sequence[Mapping[str, Any]] | None = None) -> dict[int, list[int] | None]:
    """The steered (layer -> heads) from a head spec.

    Args:
        spec: ``"all"`` (every head of every band layer), ``"top-diff:K"`` (the ``K`` heads with
            the largest gen-minus-eval context mass, ``ranked`` from ``interp heads``), or
            ``"L.H,L.H,..."`` (explicit layer.head pairs).
        band: the steered layers of ``"all"``.
        n_heads: query heads per layer.
        ranked: :func:`interp.analysis.span_mass.top_heads` ``["diff"]`` rows (for ``top-diff:K``).

    Returns:
        ``{layer: None}`` for every band layer, or ``{layer: [heads]}``.

    Raises:
        StageError: an unparseable spec, a head out of range, or ``top-diff`` without a
            ranking (run ``interp attention`` first).
    """
    if not isinstance(spec, str):
        spec = ",".join(spec)
    s = spec.strip().lower()
    if s == "all":
        return {int(layer): None for layer in band}
    pairs: list[tuple[int, int]] = []
    if s.startswith("top-diff:"):
        if ranked is None:
            raise StageError("steering",
                             "heads 'top-diff:K' needs the attention summary's head ranking; "
                             "run `interp attention` on the run first")
        pairs = [(int(r["layer"]), int(r["head"])) for r in list(ranked)[:top_diff_k(spec)]]
    else:
        try:
            pairs = [(int(a), int(b)) for a, b in (x.split(".") for x in s.split(",") if x)]
        except ValueError as err:
            raise StageError("steering",
                             f"heads {spec!r}: use 'all', 'top-diff:K' or 'L.H,L.H'") from err
    if not pairs or any(not 0 <= h < n_heads for _, h in pairs):
        raise StageError("steering", f"heads {spec!r}: empty, or a head outside 0..{n_heads - 1}")
    out: dict[int, list[int] | None] = {}
    for layer, h in pairs:
        out.setdefault(layer, []).append(h)  # type: ignore[union-attr]
    return out
