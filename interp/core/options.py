"""Options declared once: a stage config's dataclass field is its option everywhere.

Each field of a stage's config dataclass is declared once: its type (the annotation), its
default and (with :func:`option`) its kind and command-line name, its help text in the class
docstring's ``Attributes:`` (:func:`field_help`). From that one declaration come

* the TOML table of ``interp run`` and the one-line errors (:func:`config_from_table`, which
  every stage config's ``from_mapping`` calls: :class:`StageConfig`, the one implementation);
* the options of the stage's command and their ``--help`` (:mod:`interp.cli` builds them);
* the checks every config shares: counts (``kind="count"``: a whole number >= 1, or
  ``"all"``/None for every record where the default is None) and layer selections
  (``kind="layers"``, checked against a model's shape by
  :func:`interp.stages.common.check_against_shape`).

One rule turns a value into its declared type, for every key of every table and option
(:func:`conform`): a value is converted only where the conversion cannot be mistaken:

* a string where a list belongs is a comma list (``datasets = "squad_v2"`` is
  ``["squad_v2"]``, ``--alphas 0.5,1`` is ``[0.5, 1.0]``), the one list parser
  (:func:`split_list`);
* ``"all"`` where a count that may be None belongs is None (every record);
* numbers in such a list are parsed (:func:`check_numbers`);
* anything else of another type is refused naming the option and the key: a quoted word where
  a boolean belongs (``include_unanswerable = "false"``), a number in quotes where a number
  belongs (``limit = "3"``), a list where text belongs.

This module imports nothing heavy (the command line builds its options from it before torch
loads).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import re
import types
import typing
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar

from interp.core import contract
from interp.core.errors import ConfigError, InterpError, StageError
from interp.core.inputs import check_device, check_dtype
from interp.core.layers import check_layer_syntax
from interp.core.names import did_you_mean

__all__ = ["ALL", "CliOption", "StageConfig", "allows_none", "check_counts", "check_numbers",
           "cli_options", "config_from_table", "conform",
           "field_help", "fields_of_kind", "given", "option", "option_name", "parse_count",
           "renamed_keys", "split_list"]

ALL = "all"
"""The word that means "every record" for a count whose default is None (``--limit all``)."""

_MISSING = dataclasses.MISSING


def option(default: Any = _MISSING, *, kind: str | None = None, flag: str | None = None,
           short: str | None = None, cli: bool = True, was: str | None = None) -> Any:
    """A config field with what its option needs besides its type, default and help.

    The help text is the field's entry under ``Attributes:`` in the class docstring
    (:func:`field_help`), so a field is documented once.

    Args:
        default: the default value (a list or dict is copied for every instance).
        kind: ``count`` (a whole number >= 1; None/``all`` where the default is None) or
            ``layers`` (a layer selection, :func:`interp.core.layers.parse_layers`); None: plain.
        flag: the command-line name when it is not the field's (``dataset`` for ``datasets``).
        short: a one-letter alias on the command line (``-d``).
        cli: whether the stage's command offers it (False: config table only).
        was: the field's former name, still accepted as a table key (with a one-line
            warning, :func:`renamed_keys`) and as a command-line option.

    Returns:
        A :func:`dataclasses.field`.
    """
    meta = {"kind": kind, "flag": flag, "short": short, "cli": cli, "was": was}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def field_help(cls: Any) -> dict[str, str]:
    """Each field's help: its ``Attributes:`` entry in ``cls``'s docstring, as one line.

    An entry ``a, b:`` documents ``a`` and ``b``; ``prefix_*:`` every field starting with
    ``prefix_``.
    """
    doc = inspect.cleandoc(cls.__doc__ or "")
    if "Attributes:" not in doc:
        return {}
    entries: dict[str, str] = {}
    name = None
    for line in doc.split("Attributes:", 1)[1].splitlines():
        if m := re.match(r"^    ([A-Za-z_][\w*]*(?:, [A-Za-z_][\w*]*)*): (.*)$", line):
            name = m.group(1)
            entries[name] = m.group(2).strip()
        elif name and line.startswith("        "):
            entries[name] += " " + line.strip()
        elif line.strip():
            break
    for names in [k for k in entries if ", " in k]:  # "a, b: text" documents a and b
        for one in names.split(", "):
            entries.setdefault(one, entries[names])
    out = {}
    for f in dataclasses.fields(cls):
        text = entries.get(f.name) or next((t for k, t in entries.items() if k.endswith("*")
                                            and f.name.startswith(k[:-1])), None)
        if text:  # as plain text: :func:`a.b` -> a.b, ``x`` -> x
            out[f.name] = re.sub(r"``(.+?)``", r"\1", re.sub(r":\w+:`~?([^`]+)`", r"\1", text))
    return out


def renamed_keys(cls: Any, table: Mapping[str, Any], section: str,
                 error: type[Exception] = ConfigError) -> dict[str, Any]:
    """A copy of ``table`` with each former key name (``option(was=...)``) under its new name.

    Each former name used gives one :class:`FutureWarning` line naming the new key.

    Raises:
        error: a table that gives both the former and the new name.
    """
    out = dict(table)
    for f in dataclasses.fields(cls):
        old = f.metadata.get("was")
        if not old or old not in out:
            continue
        if f.name in out:
            raise error(f"[{section}]: {old} is the former name of {f.name}; give {f.name} only")
        warnings.warn(f"[{section}] {old} is now called {f.name}; the old key will go",
                      FutureWarning, stacklevel=3)
        out[f.name] = out.pop(old)
    return out


def option_name(f: dataclasses.Field) -> str:
    """The command-line option of a field: ``--max-new-tokens`` (or its declared ``flag``)."""
    return "--" + (f.metadata.get("flag") or f.name).replace("_", "-")


def fields_of_kind(cls: Any, kind: str) -> list[str]:
    """The names of ``cls``'s fields declared with ``kind`` (``count``, ``layers``)."""
    return [f.name for f in dataclasses.fields(cls) if f.metadata.get("kind") == kind]


def allows_none(cls: Any, name: str) -> bool:
    """Whether field ``name`` of ``cls`` is annotated to take None (``int | None``)."""
    return type(None) in _members(typing.get_type_hints(cls)[name])


def split_list(value: str | list[str] | tuple[str, ...]) -> list[str]:
    """The one comma-list parser: ``"a, b"`` or ``["a,b", "c"]`` -> ``["a", "b", "c"]``."""
    out: list[str] = []
    for v in [value] if isinstance(value, str) else value:
        out += [x.strip() for x in str(v).split(",") if x.strip()]
    return out


def _members(tp: Any) -> tuple[Any, ...]:
    """The members of a union annotation (``int | None`` -> ``(int, NoneType)``), else (tp,)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return typing.get_args(tp)
    return (tp,)


def _origin(tp: Any) -> Any:
    return typing.get_origin(tp) or tp


def conform(cls: Any, table: Mapping[str, Any], section: str,
            error: type[Exception] = ConfigError) -> dict[str, Any]:
    """Turn each value of a config table into its field's declared type (module docstring).

    Args:
        cls: the config dataclass.
        table: the table (TOML, or the command's options).
        section: its table name, for the message.
        error: the error class to raise.

    Returns:
        A copy of ``table`` with comma lists split, ``"all"`` counts as None and numbers in
        lists parsed.

    Raises:
        error: a value of another type (names the option and the key, e.g. ``--include-
            unanswerable ([asymmetry] include_unanswerable) must be true or false, not
            'false'``).
    """
    hints = typing.get_type_hints(cls)
    out = dict(table)
    for f in dataclasses.fields(cls):
        if f.name not in out or out[f.name] is None:
            continue
        value, members = out[f.name], _members(hints[f.name])
        kinds = {_origin(m) for m in members}
        where = f"{option_name(f)} ([{section}] {f.name})"
        if f.metadata.get("kind") == "count" and value == ALL and type(None) in kinds:
            out[f.name] = None
        elif isinstance(value, str) and list in kinds and str not in kinds:
            out[f.name] = split_list(value)
        elif bool in kinds and not isinstance(value, bool):
            raise error(f"{where} must be true or false, not {value!r}")
        elif kinds <= {str, type(None)} and not isinstance(value, str):
            raise error(f"{where} must be text, not {value!r}")
        elif kinds <= {list, type(None)} and not isinstance(value, list | tuple) and any(
                typing.get_args(m) == (str,) for m in members):  # numbers: check_numbers
            raise error(f"{where} must be a list of text values (or a comma-separated "
                        f"string), not {value!r}")
        elif list in kinds and isinstance(value, list | tuple) and any(
                typing.get_args(m) == (str,) for m in members) and not all(
                isinstance(v, str) for v in value):
            raise error(f"{where} must be a list of text values, not {value!r}")
    return check_numbers(cls, out, section, error)


def config_from_table(cls: Any, table: Mapping[str, Any], section: str,
               error: type[Exception] = ConfigError) -> Any:
    """Build the dataclass ``cls`` from a config table (``[section]`` of a TOML file).

    A key's former name (:func:`renamed_keys`) is read as its new one, with a warning.

    Raises:
        error: ``table`` has keys that are not fields of ``cls`` (the message names the
            section, the unknown keys and the known ones, so a typo is fixed in one look); a
            value of another type (:func:`conform`); a count below 1
            (:func:`check_counts`); a layer field (``kind="layers"``) whose value is not of
            the layer grammar (:func:`interp.core.layers.check_layer_syntax`; whether the
            layers exist is checked once the model is known); with a ``device`` field, a
            device or dtype this machine cannot load a model on
            (:func:`interp.core.inputs.check_device`, :func:`interp.core.inputs.check_dtype`).
    """
    known = set(cls.__dataclass_fields__)
    table = renamed_keys(cls, table, section, error)
    if unknown := set(table) - known:
        raise error(f"[{section}]: unknown config keys {sorted(unknown)}"
                    f"{did_you_mean(sorted(unknown), known)}; known: {sorted(known)}")
    table = conform(cls, table, section, error)
    if "device" in known:  # a config that loads a model: its device and precision
        check_device(table.get("device"), error)
        check_dtype(table.get("dtype"), error)
    try:
        cfg = cls(**dict(table))
    except TypeError as err:  # a value of the wrong type, found by __post_init__
        raise error(f"[{section}]: {err}") from None
    check_counts(cfg, section, error)
    for name in fields_of_kind(cls, "layers"):
        try:
            check_layer_syntax(getattr(cfg, name))
        except InterpError as err:
            raise error(f"--{name.replace('_', '-')} ([{section}] {name}): {err}") from None
    return cfg


class StageConfig:
    """The base of every stage's config dataclass: one ``from_mapping`` for all of them.

    A config declares its fields (:func:`option`) and, where a value needs a check beyond its
    type, a ``validate`` method (or ``__post_init__``) that raises what it declares; its table's
    name is its stage's, read from the stage contract (:data:`interp.core.contract.SPECS`
    names each stage's config class), never written in the class.

    Attributes:
        table_error: the error a bad table raises (an unknown key, a value of another type,
            a count below 1): :class:`interp.core.errors.ConfigError`, or the stage's own
            :class:`interp.core.errors.StageError` (raised with the stage's name).
    """

    table_error: ClassVar[type[Exception]] = ConfigError

    @classmethod
    def stage(cls) -> str:
        """The stage this config belongs to (its contract entry's ``name``).

        Raises:
            KeyError: no stage declares this class (or a class it derives from).
        """
        for klass in cls.__mro__:
            for s in contract.SPECS:
                if (s.config, s.config_module) == (klass.__name__, klass.__module__):
                    return s.name
        raise KeyError(f"no stage in interp.core.contract.SPECS has the config {cls.__name__}")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> Any:
        """Build from a config table, refusing unknown keys and values, then :meth:`validate`.

        Raises:
            ConfigError: an unknown key (the message lists the known ones), a value of another
                type, a count below 1 (:func:`config_from_table`), or what ``__post_init__``
                raises; ``table_error`` instead where the class declares one.
            interp.core.errors.InterpError: what the class's :meth:`validate` raises.
        """
        name = cls.stage()
        error: Any = cls.table_error
        if isinstance(error, type) and issubclass(error, StageError):
            error = functools.partial(error, name)  # raised as StageError(stage, message)
        cfg = config_from_table(cls, d, name, error)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Check values beyond their types (a config with such checks overrides this)."""


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not _MISSING:
        d = f.default
    elif f.default_factory is not _MISSING:
        d = f.default_factory()
    else:
        return ""
    if d is None:
        return ALL if f.metadata.get("kind") == "count" else "none"
    if isinstance(d, bool):
        return "true" if d else "false"
    return ",".join(map(str, d)) if isinstance(d, list | tuple) else str(d)


@dataclasses.dataclass(frozen=True)
class CliOption:
    """One command-line option of a config field (:func:`cli_options`).

    Attributes:
        name: the field (the parameter name of the command's callback).
        decls: the option's names (``--max-new-tokens``, ``-d``).
        kind: ``bool`` (a ``--x/--no-x`` flag), ``list`` (a comma list that may be repeated),
            ``count`` (a whole number or ``all``), ``int``, ``float`` or ``str``.
        help: the field's help (:func:`field_help`) and its default; None: undocumented.
    """

    name: str
    decls: tuple[str, ...]
    kind: str
    help: str | None


def cli_options(cls: Any) -> list[CliOption]:
    """The command-line options of a config dataclass, one per field offered (``cli``).

    Kinds follow the annotation (:class:`CliOption`). No option has a default of its own: an
    option left out is not passed, so the dataclass default applies (it is shown in the help).
    """
    hints, helps = typing.get_type_hints(cls), field_help(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", True):
            continue
        kinds = {_origin(m) for m in _members(hints[f.name])}
        decls = (option_name(f),) + ((f"-{f.metadata['short']}",) if f.metadata.get("short")
                                     else ()) + (
            ("--" + f.metadata["was"].replace("_", "-"),) if f.metadata.get("was") else ())
        if bool in kinds:
            kind = "bool"
        elif list in kinds and str not in kinds:
            kind = "list"
        elif f.metadata.get("kind") == "count" and type(None) in kinds:
            kind = "count"
        elif kinds & {int, float} and str not in kinds:
            kind = "float" if float in kinds else "int"
        else:
            kind = "str"
        if kind == "bool":   # both ways: a default of true must be possible to turn off
            decls = tuple(f"{d}/--no-{d[2:]}" if d.startswith("--") else d for d in decls)
        text = helps.get(f.name)  # None: undocumented (a unit test refuses that)
        out.append(CliOption(f.name, decls, kind,
                             text and f"{text} [default: {_default_text(f)}]"))
    return out


def parse_count(value: str) -> int | str:
    """A count option's value: a whole number, or ``all`` (every record).

    Raises:
        ValueError: neither (the command line reports it as an invalid value).
    """
    if value == ALL:
        return ALL
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a whole number or {ALL!r}") from None


def given(cls: Any, values: Mapping[str, Any]) -> dict[str, Any]:
    """The options of :func:`cli_options` that were given, as a config table."""
    out = {}
    for f in dataclasses.fields(cls):
        v = values.get(f.name)
        if v is None or v == () or v == []:
            continue
        out[f.name] = ",".join(v) if isinstance(v, list | tuple) else v
    return out


def check_counts(cfg: Any, section: str, error: type[Exception] = ConfigError) -> None:
    """Refuse a count field that is not a whole number >= 1 (None: all, where the type allows).

    The count fields are those declared ``kind="count"`` (:func:`interp.core.options.option`).

    Args:
        cfg: a config dataclass instance.
        section: its config table name, for the message.
        error: the error class to raise.

    Raises:
        error: names the option (``--limit``) and the table key (``[section] limit``); for a
            ``limit`` it adds how to ask for every record.
    """
    fields = getattr(cfg, "__dataclass_fields__", {})
    for name in fields_of_kind(type(cfg), "count") if fields else []:
        value = getattr(cfg, name)
        every = fields[name].default is None
        if value is None and allows_none(type(cfg), name):
            continue
        # a table of counts ({dataset: N}, the harness's limit) is checked entry by entry
        for v in (value.values() if isinstance(value, Mapping) else [value]):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                hint = ""
                if name.endswith("limit"):
                    hint = (" (leave it out to use every record)" if every else
                            " (or all to use every record)"
                            if allows_none(type(cfg), name) else "")
                raise error(f"--{name.replace('_', '-')} ([{section}] {name}) must be a whole "
                            f"number >= 1{hint}, not {value!r}")


_NUMBER_TYPES = {"int": (int,), "float": (int, float)}


def check_numbers(cls: Any, table: Mapping[str, Any], section: str,
                  error: type[Exception] = ConfigError) -> dict[str, Any]:
    """Check (and parse) the numeric fields of a config table before the dataclass is built.

    A field annotated ``int``, ``float``, ``list[int]`` or ``list[float]`` (optionally
    ``| None``) must hold numbers of that kind (``True`` is not a number; an int is a float);
    a string in a ``list[float]``/``list[int]`` (a comma list from the command line) is parsed.
    Fields with other annotations (``str | list[int]`` layer specs, ...) are left alone.

    Args:
        cls: the config dataclass (its annotations are strings or types).
        table: the config table.
        section: its table name, for the message.
        error: the error class to raise.

    Returns:
        A copy of ``table`` with parsed lists.

    Raises:
        error: names the option (``--alphas``), the table key, the bad entry and the kind of
            number expected.
    """
    out = dict(table)
    for name, f in getattr(cls, "__dataclass_fields__", {}).items():
        if name not in out or out[name] is None:
            continue
        ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        ann = ann.replace(" | None", "").strip()
        is_list = ann.startswith("list[") and ann.endswith("]")
        kind = ann[5:-1] if is_list else ann
        if kind not in _NUMBER_TYPES:
            continue
        value = out[name]
        what = "whole number" if kind == "int" else "number"
        if is_list and not isinstance(value, list | tuple):
            raise error(f"--{name.replace('_', '-')} ([{section}] {name}) must be a list of "
                        f"{what}s, not {value!r}")
        parsed = []
        for v in value if is_list else [value]:
            if is_list and isinstance(v, str):
                with contextlib.suppress(ValueError):
                    v = int(v) if kind == "int" else float(v)
            if isinstance(v, bool) or not isinstance(v, _NUMBER_TYPES[kind]):
                shape = f"a list of {what}s" if is_list else f"a {what}"
                raise error(f"--{name.replace('_', '-')} ([{section}] {name}) must be {shape}, "
                            f"not {value!r} ({v!r} is not a {what})")
            parsed.append(float(v) if kind == "float" else v)  # 1 -> 1.0: one key per value
        out[name] = parsed if is_list else parsed[0]
    return out
