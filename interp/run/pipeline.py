"""``interp run CONFIG``: an experiment config (models x datasets) through every stage.

Algorithm of :func:`run_config`:

1. Read the TOML file and check it BEFORE any model is loaded: top-level keys (``name``,
   ``out``, ``figures``, ``publish``, ``description``, ``[asymmetry]`` and one table per stage
   of :data:`interp.stages.STAGES`), the ``--only`` names (each must be ``asymmetry`` or a
   stage the config has), every stage table (its ``Config.from_mapping`` refuses unknown keys
   and counts below 1) and the asymmetry inputs of every model
   (:func:`interp.stages.asymmetry.check_inputs`: datasets, fields, limit).
   Then every stage config to run is checked against every model's shape, read from its
   config alone (:func:`interp.models.loading.model_shape`,
   :func:`interp.stages.common.check_against_shape`:
   layer selections, heads), and every stage's declared needs against what runs before it
   or lies in the model's run directory (:func:`interp.core.contract.check_needs`: steering
   with ``heads = "top-diff:K"`` needs the attention summary), so no model runs before a later
   one would fail. ``--only`` takes a stage's name or its command's (``steer``). Then the plan
   is printed (:func:`plan`): each model's records and stage units and their CPU cost from the
   measured per-record costs (:mod:`interp.core.costs`).
2. For each model of ``[asymmetry] models``: load it once, run Study 1 into
   ``out/<model-slug>/`` (:mod:`interp.stages.asymmetry`; with ``--only`` excluding it, only
   ``metrics.json`` is recomputed), then each configured stage in the order of
   :data:`interp.stages.STAGES` on that run directory with the same model; each stage's wall
   and CPU seconds are logged when it ends.
3. With ``figures`` and ``publish = true``, and only when the whole study ran to its end in
   this call (no ``--only``), copy every figure and each stage's published tables (the
   ``summaries`` of its contract entry: ``metrics.json`` as ``asymmetry_metrics.json``, ...)
   into that folder (prefixed by the model slug when there are several models): the
   committed ``figures/`` are replaced only by the command that makes the committed study,
   complete. ``out/summary.json`` holds every model's metrics
   and ``out/summary.txt`` every stage's summary table as text; the last lines printed say
   where the figures and the summary table are (and repeat the config's ``description``).
4. With several models: one table and figures that put them side by side
   (:func:`interp.run.compare.write_comparison`: ``out/comparison.json`` and ``comparison.md``,
   one row per model and dataset; ``out/figures/models_*.png``, one colour per model), also
   published into ``figures`` under the conditions of step 3.
5. With ``cross_judge = true`` (two or more models): every model judges every other's answers
   and the judge x answer-source matrix is drawn (:mod:`interp.run.cross_grid`); its table and
   figures (:data:`CROSS_FILES`) are published with the others.

:func:`swap_sources` turns a config into its rehearsal: the same config with only the model
and dataset sources replaced (``tests/rehearsal`` runs ``experiments/paper.toml`` that way on a
tiny Llama-3.1-shaped checkpoint, and ``benchmarks/gpu_check.sh`` does on a GPU).
"""

from __future__ import annotations

import copy
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from interp.core import contract
from interp.core.capabilities import is_served
from interp.core.costs import SOURCE, estimate, format_cpu, units
from interp.core.errors import ConfigError
from interp.core.inputs import new_run_dir, read_toml
from interp.core.io import atomic_write_text, write_json
from interp.core.names import did_you_mean, model_slug
from interp.core.vocab import DEFAULT_MODEL
from interp.judging.prompts import get_template
from interp.launch import Shard, barrier, current_shard, heartbeat
from interp.stages.configs import check_model_specs
from interp.stages.configs.asymmetry import ASYMMETRY_KEY_FIELDS, AsymmetryConfig
from interp.store.rundir import RunDir

__all__ = ["STAGE_NAMES", "load_config", "model_slug", "out_dir", "plan", "publish_run_dir",
           "run_config", "stage_units", "swap_sources"]

TOP_LEVEL = ("name", "out", "figures", "publish", "description", "asymmetry", "cross_judge")
"""Top-level keys of an experiment config besides the stage tables."""


CROSS_FILES = ("cross_judge.json", "cross_probe.json", "figures/cross_judge.png",
               "figures/cross_probe_layers.png")
"""What cross-judging leaves in ``out`` that a published run copies next to the figures."""

STAGE_NAMES = tuple(s.name for s in contract.SPECS if s.name != "asymmetry")
"""Every stage ``interp run`` knows, by config-table name, in the order they run."""


def out_dir(cfg: Mapping[str, Any], path: str | Path) -> Path:
    """The folder of a config's run directories: ``out``, else ``runs/<name or file stem>``."""
    return Path(cfg.get("out", f"runs/{cfg.get('name', Path(path).stem)}"))


def load_config(config: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """An experiment config as a dict: a TOML file read, or a mapping copied (deeply).

    Raises:
        ConfigError: as :func:`interp.core.inputs.read_toml` (missing file, not TOML, ...).
    """
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    return read_toml(config)


def swap_sources(config: str | Path | Mapping[str, Any], *, models: Mapping[str, str],
                 datasets: Mapping[str, str], out: str | Path) -> dict[str, Any]:
    """The same experiment config with only its model and dataset sources replaced.

    A rehearsal runs a real config (e.g. ``experiments/paper.toml``) end to end on a stand-in
    model and a few records: what it exercises is the config itself, so nothing else may
    change. Replaced, in every table:

    * a model spec: the ``models`` / ``model`` entries, and the ``SPEC`` of an LLM oracle
      ``"model:SPEC"`` (``oracle`` keys), through ``models``;
    * dataset names: every entry of a ``datasets`` list and every key of a per-dataset
      ``limit`` table, through ``datasets`` (usually local files), and ``from_hub`` becomes
      false (a file is not read from the hub);
    * where results go: ``out`` becomes ``out``, and ``figures`` (if set) ``out/figures``.

    Everything else (stages, layers, limits, dtype, seeds, ...) is kept as written.

    Args:
        config: a TOML path or a parsed config.
        models: old model spec -> new spec; every model and oracle spec of the config must be
            a key.
        datasets: old dataset name -> new source; every dataset of the config must be a key.
        out: the rehearsal's output folder.

    Returns:
        The new config (the input is not modified).

    Raises:
        ConfigError: a model, oracle or dataset of the config that the swap does not cover
            (so a rehearsal can never silently run the original source).
    """
    cfg = load_config(config)

    def model(spec: str, where: str) -> str:
        if spec not in models:
            raise ConfigError(f"{where}: model {spec!r} is not swapped; add it to models "
                              f"(covered: {sorted(models)})")
        return models[spec]

    def walk(table: dict[str, Any], where: str) -> None:
        for key, val in table.items():
            at = f"{where}.{key}" if where else key
            if key == "limit" and isinstance(val, dict):  # a per-dataset limit table
                table[key] = {datasets.get(d, d): n for d, n in val.items()}
            elif isinstance(val, dict):
                walk(val, at)
            elif key == "models":
                table[key] = [model(v, at) for v in val]
            elif key == "model":
                table[key] = model(val, at)
            elif key == "oracle" and isinstance(val, str) and val.startswith("model:"):
                table[key] = "model:" + model(val.removeprefix("model:"), at)
            elif key == "datasets":
                if bad := [d for d in ([val] if isinstance(val, str) else val)
                           if d not in datasets]:
                    raise ConfigError(f"{at}: datasets {bad} are not swapped; add them to "
                                      f"datasets (covered: {sorted(datasets)})")
                table[key] = [datasets[d] for d in ([val] if isinstance(val, str) else val)]
            elif key == "from_hub":
                table[key] = False

    walk(cfg, "")
    cfg["out"] = str(out)
    if "figures" in cfg:
        cfg["figures"] = str(Path(out) / "figures")
    return cfg


def canonical(names: Sequence[str] | None) -> list[str] | None:
    """Stage names with each command name (``steer``) replaced by the stage's (``steering``).

    Unknown names are kept as given (for the caller's message).
    """
    if not names:
        return None
    by = {n: s.name for s in contract.SPECS for n in s.names}
    return [by.get(n, n) for n in names]


def _check(cfg: Mapping[str, Any], path: str | Path, only: Sequence[str] | None
           ) -> dict[str, Any]:
    """Step 1: refuse unknown keys, stages and ``--only`` names; the stage configs."""
    known = set(TOP_LEVEL) | set(STAGE_NAMES)
    if unknown := set(cfg) - known:
        raise ConfigError(f"{path}: unknown keys or stages {sorted(unknown)}"
                          f"{did_you_mean(sorted(unknown), known)}; known: {sorted(known)}")
    configured = ["asymmetry", *(name for name in STAGE_NAMES if name in cfg)]
    only = canonical(only)
    if only and (bad := [name for name in only if name not in configured]):
        what = "not configured in this file" if set(bad) <= set(STAGE_NAMES) else "unknown"
        raise ConfigError(f"--only: {what}: {', '.join(bad)}{did_you_mean(bad, configured)}; "
                          f"valid stages here: {', '.join(configured)}")
    if not isinstance(cfg.get("publish", False), bool):
        raise ConfigError(f"{path}: publish must be true or false, not {cfg['publish']!r}")
    return {s.name: s.config_class.from_mapping(dict(cfg[s.name]))
            for s in contract.SPECS if s.name in cfg and s.name in STAGE_NAMES}


def stage_units(name: str, scfg: Any, counts: Mapping[str, int]) -> int:
    """Units of work (:data:`interp.core.costs.UNITS`) a stage does on datasets of ``counts``.

    Per dataset, its records or the stage's ``limit`` if smaller (patching: pairs), doubled
    for ``per_label`` (steering: one record per oracle label); an upper bound, as a limit may
    not be reached (too few ok records, pairs or records under ``max_tokens``).
    """
    if name == "asymmetry":
        return sum(counts.values())
    limit = getattr(scfg, "limit", None)
    per = sum(min(n, limit) if isinstance(limit, int) else n for n in counts.values())
    return per * (2 if getattr(scfg, "per_label", False) else 1)


def plan(counts: Mapping[str, Mapping[str, int]], runs: Sequence[tuple[str, Any]], *,
         with_asymmetry: bool = True) -> list[str]:
    """The lines ``interp run`` prints before it starts: each model's work and its CPU cost.

    The CPU-seconds are :func:`interp.core.costs.estimate` (measured per-record costs of the
    bundled models); a model or stage without a measured cost is said to have none.

    Args:
        counts: ``{model spec: {dataset: records}}`` (the loaded, limited examples).
        runs: ``(stage name, config)`` of the stages to run, in order.
        with_asymmetry: Study 1 runs too.

    Returns:
        One line per model, then the total.
    """
    lines, total, unknown = [], 0.0, False
    for spec, per_ds in counts.items():
        work = {"asymmetry": stage_units("asymmetry", None, per_ds)} if with_asymmetry else {}
        work.update({name: stage_units(name, scfg, per_ds) for name, scfg in runs})
        cpu, missing = estimate(spec, work)
        total += cpu
        unknown |= bool(missing)
        said = ", ".join(f"{name} {units(name, n)}" for name, n in work.items())
        cost = (format_cpu(cpu) + (f" (no measured cost for {', '.join(missing)})"
                                   if missing else "")) if cpu else "no measured cost"
        lines.append(f"== plan: {spec} on {', '.join(f'{n} {d}' for d, n in per_ds.items())} "
                     f"records: {said}; {cost}")
    if len(counts) > 1 or not unknown:
        lines.append(f"== in all {format_cpu(total)}{' and more' if unknown else ''} "
                     f"(measured per-record costs: {SOURCE}; the wall time is this divided by "
                     f"the cores free, longer on a machine busy with other work)")
    return lines


def publish_run_dir(run_dir: Path, dest: Path, names: Sequence[str], prefix: str) -> None:
    """Step 3 for one run directory: its figures and the published tables of ``names``.

    The tables are the contract's ``summaries`` (:attr:`interp.core.contract.StageSpec.
    summaries`) of Study 1 and of each stage in ``names``. Only the files that exist are copied
    (a stage that has not run leaves nothing), each as ``dest/{prefix}{name}``.
    """
    dest.mkdir(parents=True, exist_ok=True)
    tables = dict(contract.spec("asymmetry").summaries)
    for name in names:
        tables.update(contract.spec(name).summaries)
    files = [(p, p.name) for p in sorted((run_dir / "figures").glob("*.png"))]
    files += [(run_dir / src, name) for src, name in tables.items() if (run_dir / src).exists()]
    for src, name in files:
        shutil.copy2(src, dest / f"{prefix}{name}")


def run_config(path: str | Path | Mapping[str, Any], *, overwrite: bool = False,
               only: Sequence[str] | None = None, out: str | Path | None = None,
               log: Callable[[str], None] = print,
               shard: Shard | None = None) -> dict[str, Any]:
    """Run every stage of a TOML config (module docstring; see ``experiments/quickstart.toml``).

    With ``shard`` (:mod:`interp.launch`: ``--shard I/N``, torchrun, a SLURM array) each
    model's Study 1 runs on the shard's records into ``out/<model>/shards/I-of-N``
    (:func:`interp.stages.asymmetry.run`). Under torchrun rank 0 then merges them into
    ``out/<model>`` and runs every stage there, once, over all records (fresh one-pass parts
    are reused), and writes the summary: the run directories an unsharded run leaves; the
    other ranks stop after their shards. A ``--shard`` or SLURM shard stops after its
    records; ``interp merge`` joins them and ``interp run CONFIG`` (unsharded) then resumes
    with the stages.

    Args:
        path: the experiment config (a TOML file, or a parsed config such as
            :func:`swap_sources` returns).
        overwrite: discard run directories made with another asymmetry config, and let
            every stage redo work computed under other runtime settings.
        only: run only these stages (``asymmetry`` and/or names of
            :data:`interp.stages.STAGES`, or their command names: ``steer`` is ``steering``).
        out: the folder of the run directories instead of the config's ``out``.
        log: progress lines.
        shard: this process's shard (:func:`interp.launch.current_shard`; None: unsharded).

    Returns:
        ``{model spec: {"run_dir", "metrics"}}`` (also written to ``out/summary.json``).

    Raises:
        ConfigError: a missing or malformed file, an unknown top-level key or stage, an
            ``--only`` name that is not a configured stage, a bad stage config value, or a
            stage whose declared needs (:func:`interp.core.contract.check_needs`) neither an
            earlier stage of this call nor the run directory provides.
        interp.core.errors.ShardError: shards of another count under a run directory, or a
            refused merge.
        interp.core.errors.DataError: a dataset or file of ``[asymmetry]`` that cannot be loaded.
        interp.core.errors.RunDirError: ``--only`` without ``asymmetry`` on a run that has none.
    """
    cfg = load_config(path)
    if isinstance(path, Mapping):
        path = str(cfg.get("name", "config"))
    if out is not None:
        cfg["out"] = str(out)
    stage_cfgs = _check(cfg, path, only)
    only = canonical(only)
    out = out_dir(cfg, path)
    asym = dict(cfg.get("asymmetry", {}))
    models = asym.pop("models", [asym.pop("model", DEFAULT_MODEL)])
    acfgs = {spec: AsymmetryConfig.from_mapping({**asym, "model": spec})
             for spec in models}
    if shard is None and asym.get("shard"):  # [asymmetry] shard = "I/N"
        shard = current_shard(asym["shard"])
    cross = None
    if cfg.get("cross_judge") not in (None, False):
        from interp.run.cross_grid import CrossJudgeConfig

        cross = CrossJudgeConfig.from_value(cfg.get("cross_judge"), models)
    for acfg in acfgs.values():  # a misspelt model or oracle name: before any file is read
        check_model_specs(acfg)
    for scfg in stage_cfgs.values():
        check_model_specs(scfg, model=False)
    counts: dict[str, dict[str, int]] = {}
    for spec, acfg in acfgs.items():
        counts[spec] = {ds: len(exs) for ds, exs in acfg.check_inputs().items()}
        if not overwrite and (not only or "asymmetry" in only):  # before any model loads
            RunDir(out / model_slug(spec)).check_same_config(asdict(acfg), ASYMMETRY_KEY_FIELDS)
        if only and "asymmetry" not in only:  # the stages need a finished asymmetry run
            RunDir(out / model_slug(spec)).read_records()
    runs = [(name, scfg) for name, scfg in stage_cfgs.items() if not only or name in only]
    if runs and (reasoning := [s for s, a in acfgs.items() if get_template(
            a.template, a.templates_path).judge != "word"]):
        raise ConfigError(f"[asymmetry] template {acfgs[reasoning[0]].template!r} is a "
                          f"reasoning judge, whose verdict position follows its reasoning; the "
                          f"stages {[n for n, _ in runs]} read the one-word judge's: run them on "
                          f"a one-word template and compare with the [reasoning] stage")
    from interp.models.loading import model_shape  # the checks that need the model's files
    from interp.stages.common import check_against_shape, check_capabilities

    for spec in acfgs:  # every model's shape and needs against every stage, before any runs
        for name, _ in runs:
            check_capabilities(name, spec, where=f"[{name}]")
        if is_served(spec):
            continue
        n_layers, n_heads = model_shape(spec)
        for name, scfg in runs:
            for note in check_against_shape(name, scfg, n_layers, n_heads, model=spec):
                log(note)
        contract.check_needs(out / model_slug(spec), runs,
                             before=["asymmetry"] if not only or "asymmetry" in only else [],
                             in_config=True)
    if cfg.get("description"):
        log(f"== {cfg.get('name', Path(path).stem)}: {cfg['description']}")
    for line in plan(counts, runs, with_asymmetry=not only or "asymmetry" in only):
        log(line)
    from interp.run.compare import write_comparison
    from interp.run.cross_grid import run_cross

    texts: list[str] = []
    with new_run_dir(out):
        summary = _run_models(acfgs, stage_cfgs, out, overwrite=overwrite, only=only, log=log,
                              texts=texts, shard=shard)
        if shard is not None and not (shard.joined and shard.index == 0):
            return summary  # this process wrote its shards; rank 0 or `interp merge` goes on
        if cross is not None and not only:
            run_cross(acfgs, stage_cfgs, cross, out, model_slug, overwrite=overwrite, log=log,
                      texts=texts)
    write_json(out / "summary.json", summary)
    atomic_write_text(out / "summary.txt", "\n\n".join(texts) + "\n")
    comp = None
    if len(models) > 1:
        comp = write_comparison(out, {spec: s["run_dir"] for spec, s in summary.items()})
        log(f"== {len(models)} models side by side: {comp['markdown']}, {out}/figures/models_*")
    if cfg.get("figures"):
        if not cfg.get("publish"):
            log(f"figures in {out}/*/figures; {cfg['figures']}/ not updated (the config does "
                f"not say publish = true)")
        elif only:
            log(f"{cfg['figures']}/ not updated: --only ran part of the study")
        else:
            for spec in models:
                publish_run_dir(out / model_slug(spec), Path(cfg["figures"]), list(stage_cfgs),
                              "" if len(models) == 1 else f"{model_slug(spec)}__")
            cross_files = [out / n for n in CROSS_FILES if (out / n).exists()] if cross else []
            for src in [*([comp["table"], comp["markdown"], *comp["figures"]] if comp else []),
                        *cross_files]:
                shutil.copy2(src, Path(cfg["figures"]) / Path(src).name)
            log(f"published figures and tables to {cfg['figures']}/")
    published = cfg.get("figures") and cfg.get("publish") and not only
    figs = cfg["figures"] if published else ", ".join(f"{out / model_slug(s)}/figures"
                                                      for s in acfgs)
    log(f"== done. Figures: {figs}. Summary table: {out / 'summary.txt'} (numbers: "
        f"{out / 'summary.json'})." + (f" Models side by side: {comp['markdown']} and "
                                       f"{out}/figures/models_*.png." if comp else ""))
    if cfg.get("description"):
        log(f"== this was {cfg['description'].rstrip('.')}.")
    return summary


def _took(t0: float, c0: float) -> str:
    """``"12 s (21 CPU-s)"``: wall and CPU seconds (every thread of this process) since then."""
    return f"{time.perf_counter() - t0:.0f} s ({time.process_time() - c0:.0f} CPU-s)"


def _run_models(acfgs: Mapping[str, Any], stage_cfgs: Mapping[str, Any], out: Path, *,
                overwrite: bool, only: Sequence[str] | None,
                log: Callable[[str], None], texts: list[str],
                shard: Shard | None = None) -> dict[str, Any]:
    """Step 2 of :func:`run_config` (the module docstring) for every model.

    Each stage's summary text is appended to ``texts`` and its time logged. With ``shard``,
    a process whose Study 1 gives no merged run (:func:`interp.stages.asymmetry.run` returns
    None: ``--shard``, a SLURM array) skips the model's stages. Under torchrun every process
    goes on after the merge: a stage that declares ``parts_only``
    (:class:`interp.core.contract.StageSpec`) makes its per-record parts on each process's
    share of its records (:func:`interp.stages.common.share_of_records`), in the merged run
    directory, then rank 0 runs the stage, which finds them fresh and writes its tables once;
    every other stage runs on rank 0 alone. A barrier (:func:`interp.launch.barrier`) follows
    each step, so a stage reads what the one before it wrote.
    """
    from interp.models.loading import load_model, placement
    from interp.stages import STAGES, asymmetry
    from interp.stages.common import share_of_records

    group = shard is not None and shard.joined and shard.count > 1
    lead = shard is None or shard.index == 0
    summary: dict[str, Any] = {}
    for spec, acfg in acfgs.items():
        run_dir = out / model_slug(spec)
        runs = [(n, c) for n, c in stage_cfgs.items() if not only or n in only]
        if shard is not None and (only and "asymmetry" not in only) and not lead and not group:
            continue  # stages only, a shard of an array: they run on the merged run
        device = shard.device(acfg.device) if shard is not None else acfg.device
        heartbeat(run_dir, shard)   # alive while the model loads, for ranks at a barrier
        handle = None if is_served(spec) else load_model(  # served: no weights
            spec, device=device, dtype=acfg.dtype, **placement(acfg))
        log(f"== {spec} -> {run_dir}")
        t0, c0 = time.perf_counter(), time.process_time()
        if not only or "asymmetry" in only:
            m = asymmetry.run(run_dir, handle, acfg, shard=shard, overwrite=overwrite, log=log)
            if group:
                barrier(shard)  # the merge (rank 0) is done: every process reads the run
            if m is None and not (group and runs):
                continue
        elif lead:
            m = asymmetry.write_metrics(RunDir(run_dir), acfg)
        if lead:
            texts += [f"## {spec}: asymmetry ({run_dir}/metrics.json)",
                      asymmetry.format_summary(m)]
            log(f"{texts[-1]}\n== asymmetry took {_took(t0, c0)}")
            summary[spec] = {"run_dir": str(run_dir), "metrics": m}
        for name, scfg in runs:
            t0, c0 = time.perf_counter(), time.process_time()
            parts_only = contract.spec(name).parts_only
            if group and parts_only:
                log(f"== stage {name}, share {shard.name} of its records, on {run_dir}")
                with share_of_records(shard.index, shard.count):
                    made = getattr(STAGES[name], parts_only)(RunDir(run_dir), handle, scfg,
                                                             overwrite=overwrite, log=log)
                log(f"== stage {name}: {made} parts made by {shard.name} in "
                    f"{time.perf_counter() - t0:.0f} s")
                barrier(shard)
            if lead:
                log(f"== stage {name} on {run_dir}")
                result = STAGES[name].run(RunDir(run_dir), handle, scfg, overwrite=overwrite,
                                          log=log)
                if text := STAGES[name].format_summary(result):
                    texts += [f"## {spec}: {name}", text]
                    log(text)
                log(f"== stage {name} took {_took(t0, c0)}")
            if group:
                barrier(shard)  # its tables are written before the next stage starts
    return summary
