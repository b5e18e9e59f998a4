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
range.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from interp.core.errors import LayerSpecError

__all__ = ["DEFAULT_BAND", "band_note", "parse_layers"]

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
                raise LayerSpecError(f"layers {spec!r}: cannot parse {part!r}; use 'all', "
                                     f"'last8', '24-31' or '0,4,-1'")
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
