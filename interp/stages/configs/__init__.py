"""Every stage's config: one light module per stage, and the checks of a config against a run.

Each stage's config dataclass lives in ``interp.stages.configs.<stage>``, derives from
:class:`interp.core.options.StageConfig` (one ``from_mapping`` for all) and imports no torch,
transformers or numpy: a config is built and checked (unknown keys with the nearest known one,
counts, choices, layer and placement syntax) before its stage's module, and the libraries that
module needs, are imported: ``interp --help``, each command's ``--help`` and every one-line
error of a config or an option come without the seconds torch and transformers take to import.
Each stage module re-exports its class (``interp.stages.steering.SteeringConfig``); the stage
contract names it (:attr:`interp.core.contract.StageSpec.config_class`). The checks of a config
against the run it reads (:func:`check_against_shape`, :func:`check_run`: layers, needed files,
records) live here, so their one-line errors also come before those libraries, as does the
check of the model specs a command will load (:func:`check_model_specs`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from interp.core.capabilities import is_served
from interp.core.contract import check_needs
from interp.core.errors import InterpError, LayerSpecError
from interp.core.layers import band_note, parse_layers
from interp.core.options import fields_of_kind
from interp.models.files import check_model_spec
from interp.store.rundir import RunDir

__all__ = ["TASKS", "check_against_shape", "check_model_specs", "check_run"]

TASKS = ("eval", "gen")
"""The two prompts a stage can read: the judge's (``eval``) and the generator's (``gen``)."""


def check_against_shape(name: str, cfg: Any, n_layers: int, n_heads: int | None = None, *,
                 model: str | None = None) -> list[str]:
    """Check a stage config against a model's shape, before the model runs (or loads).

    Every field declared ``kind="layers"`` (:func:`interp.core.options.option`) that is set is
    parsed with ``n_layers``; then the config's
    own ``check(n_layers, n_heads)``, where it has one (steering's head spec). Used by
    ``interp run`` for every configured stage and every model before the first model loads
    (so a typo in a later stage's table, or a band one of the models lacks, fails before any
    asymmetry stage runs), and by :func:`load_run_model`
    from the run's manifest before the model loads.

    Args:
        name: the stage's config table name, for the message.
        cfg: the stage's config dataclass.
        n_layers: the model's transformer blocks.
        n_heads: its query heads per layer (None: unknown, head specs are not checked).
        model: the model's name, put in the message (a grid of several models).

    Returns:
        One line per layer option whose default adapted to the model
        (:func:`interp.core.layers.band_note`: the default band ``last8`` of a model with
        fewer than 8 layers is every layer), for the caller to print.

    Raises:
        LayerSpecError: a layer selection outside the model (names the option and the table
            key, e.g. ``--layers ([attention] layers)``, and the valid range).
        interp.core.errors.InterpError: what the config's own ``check`` raises.
    """
    on = f" for {model}" if model else ""
    notes = []
    for f in fields_of_kind(type(cfg), "layers") if hasattr(cfg, "__dataclass_fields__") else []:
        if (v := getattr(cfg, f)) is not None:
            try:
                parse_layers(v, n_layers, default="all")
            except LayerSpecError as err:
                raise LayerSpecError(f"--{f.replace('_', '-')} ([{name}] {f}){on}: {err}"
                                     ) from None
            if note := band_note(v, n_layers):
                notes.append(f"[{name}] {f}{on}: {note}")
    if (check := getattr(cfg, "check", None)) is not None:
        try:
            check(n_layers, n_heads)
        except InterpError as err:
            raise err.reworded(f"[{name}]{on}: {err}" if model else f"[{name}] {err}") from None
    return notes


def check_model_specs(cfg: Any, *, model: bool = True) -> None:
    """Refuse the model specs a command is about to load, before torch is imported.

    The config's ``model`` (with ``model``; not a served one, ``openai:MODEL``) and the
    ``SPEC`` of an ``oracle = "model:SPEC"`` must each be a spec
    :func:`interp.models.loading.load_model` can resolve
    (:func:`interp.models.files.check_model_spec`: a bundled alias, an existing ``.gguf`` file
    or checkpoint directory, or a hub id ``owner/name``, whose presence is left to the load).
    Called by the command line and by ``interp run`` where the spec is loaded; a stage run from
    Python with a loaded handle takes any label as its model.

    Args:
        cfg: a stage config.
        model: check its ``model`` field too (False: the model comes from the run's manifest).

    Raises:
        interp.core.errors.ModelSpecError: a spec that is none of these (a name gets the
            nearest bundled alias: "did you mean").
    """
    spec = getattr(cfg, "model", None)
    if model and isinstance(spec, str) and not is_served(spec):
        check_model_spec(spec)
    oracle = getattr(cfg, "oracle", None)
    if isinstance(oracle, str) and oracle.startswith("model:") and oracle[len("model:"):]:
        check_model_spec(oracle[len("model:"):])


def check_run(run_dir: str | Path, stage: str, cfg: Any, *, needs: bool = True) -> None:
    """Every check of a run a stage reads that needs no model, before its libraries load.

    The stage's one-line errors that read the run come without the seconds torch, scipy and
    transformers take to import (the command line calls this before the stage's module): no
    manifest; a layer selection outside the model the manifest records
    (:func:`check_against_shape`); a file the stage needs that nothing wrote
    (:func:`interp.core.contract.check_needs`, with ``needs``); a damaged line of
    ``records.jsonl`` (named, with how to recover: :meth:`interp.store.rundir.RunDir.
    read_records`).

    Args:
        run_dir: the run directory.
        stage: the stage's name (:data:`interp.core.contract.SPECS`).
        cfg: its config.
        needs: check the stage's declared needs too.

    Raises:
        RunDirError: no manifest, a missing needed file, a damaged records line.
        LayerSpecError: ``cfg`` selects layers outside the run's model.
        InterpError: what the config's own ``check`` raises against the model's shape.
    """
    run = RunDir(run_dir)
    run.require_run()
    model = run.manifest().get("model") or {}
    if n_layers := model.get("n_layers"):
        check_against_shape(stage, cfg, int(n_layers), model.get("n_heads"))
    if needs:
        check_needs(run.path, [(stage, cfg)])
    if run.records_path.exists():
        run.read_records(status=None)
