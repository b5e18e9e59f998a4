"""``interp run CONFIG``: an experiment config (models x datasets) through every stage.

Algorithm of :func:`run_config`:

1. Read the TOML file and check it BEFORE any model is loaded: top-level keys (``name``,
   ``out``, ``figures``, ``description``, ``[asymmetry]`` and one table per stage of
   :data:`STAGES`), the ``--only`` names, and every stage table (its ``Config.from_mapping``
   refuses unknown keys).
2. For each model of ``[asymmetry] models``: load it once, run Study 1 into
   ``out/<model-slug>/`` (:mod:`interp.stages.asymmetry`; with ``--only`` excluding it, only
   ``metrics.json`` is recomputed), then each configured stage in the order of :data:`STAGES`
   on that run directory with the same model.
3. With ``figures``, copy every figure and each stage's ``SUMMARIES`` tables (plus
   ``metrics.json`` as ``asymmetry_metrics.json``) into that folder (prefixed by the model slug
   when there are several models); ``out/summary.json`` holds every model's metrics and
   ``out/summary.txt`` every stage's summary table as text. The last lines printed say where
   the figures and the summary table are (and repeat the config's ``description``).
"""

from __future__ import annotations

import shutil
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from interp import stages
from interp.errors import ConfigError
from interp.models import DEFAULT_MODEL, load_model
from interp.stages import asymmetry
from interp.stages.common import Stage
from interp.store import RunDir, atomic_write_text, write_json

__all__ = ["STAGES", "model_slug", "run_config"]

TOP_LEVEL = ("name", "out", "figures", "description", "asymmetry")
"""Top-level keys of an experiment config besides the stage tables."""


STAGES: dict[str, Stage] = dict(stages.STAGES)
"""Every stage ``interp run`` knows, by config-table name, in the order they run."""


def model_slug(spec: str) -> str:
    """A folder name for a model spec.

    ``meta-llama/Llama-3.1-8B-Instruct`` -> ``Llama-3.1-8B-Instruct``; an existing path -> its
    stem.
    """
    if Path(spec).exists():
        return Path(spec).stem
    return spec.rstrip("/").replace("/", "__").replace("@", "_").removesuffix(".gguf").split(
        "__")[-1]


def _check(cfg: Mapping[str, Any], path: str | Path, only: Sequence[str] | None
           ) -> dict[str, Any]:
    """Step 1: refuse unknown keys, stages and ``--only`` names; the stage configs."""
    known = set(TOP_LEVEL) | set(STAGES)
    if unknown := set(cfg) - known:
        raise ConfigError(f"{path}: unknown keys or stages {sorted(unknown)}; known: "
                          f"{sorted(known)}")
    if only and (bad := set(only) - {"asymmetry"} - set(STAGES)):
        raise ConfigError(f"--only: unknown stages {sorted(bad)}; known: "
                          f"{['asymmetry', *STAGES]}")
    return {name: stage.Config.from_mapping(dict(cfg[name]))
            for name, stage in STAGES.items() if name in cfg}


def _copy_figures(run_dir: Path, dest: Path, names: Sequence[str], prefix: str) -> None:
    """Step 3 for one run directory."""
    dest.mkdir(parents=True, exist_ok=True)
    tables = dict(asymmetry.SUMMARIES)
    for name in names:
        tables.update(STAGES[name].SUMMARIES)
    files = [(p, p.name) for p in sorted((run_dir / "figures").glob("*.png"))]
    files += [(run_dir / src, name) for src, name in tables.items() if (run_dir / src).exists()]
    for src, name in files:
        shutil.copy2(src, dest / f"{prefix}{name}")


def run_config(path: str | Path, *, overwrite: bool = False, only: Sequence[str] | None = None,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every stage of a TOML config (module docstring; see ``experiments/quickstart.toml``).

    Args:
        path: the experiment config.
        overwrite: discard run directories made with another asymmetry config, and let
            every stage redo work computed under other runtime settings.
        only: run only these stages (``asymmetry`` and/or names of :data:`STAGES`).
        log: progress lines.

    Returns:
        ``{model spec: {"run_dir", "metrics"}}`` (also written to ``out/summary.json``).

    Raises:
        ConfigError: an unknown top-level key, stage, ``--only`` name or stage config key.
    """
    cfg = tomllib.loads(Path(path).read_text())
    stage_cfgs = _check(cfg, path, only)
    out = Path(cfg.get("out", f"runs/{cfg.get('name', Path(path).stem)}"))
    asym = dict(cfg.get("asymmetry", {}))
    models = asym.pop("models", [asym.pop("model", DEFAULT_MODEL)])
    acfgs = {spec: asymmetry.AsymmetryConfig.from_mapping({**asym, "model": spec})
             for spec in models}
    summary: dict[str, Any] = {}
    if cfg.get("description"):
        log(f"== {cfg.get('name', Path(path).stem)}: {cfg['description']}")
    texts: list[str] = []
    for spec, acfg in acfgs.items():
        run_dir = out / model_slug(spec)
        handle = load_model(spec, device=acfg.device, dtype=acfg.dtype)
        log(f"== {spec} -> {run_dir}")
        t0 = time.perf_counter()
        if not only or "asymmetry" in only:
            m = asymmetry.run(acfg, run_dir, overwrite=overwrite, handle=handle, log=log)
        else:
            m = asymmetry.write_metrics(RunDir(run_dir), acfg)
        texts += [f"## {spec}: asymmetry ({run_dir}/metrics.json)", asymmetry.format_summary(m)]
        log(f"{texts[-1]}\n== asymmetry took {time.perf_counter() - t0:.0f} s")
        summary[spec] = {"run_dir": str(run_dir), "metrics": m}
        for name, scfg in stage_cfgs.items():
            if not only or name in only:
                log(f"== stage {name} on {run_dir}")
                t0 = time.perf_counter()
                result = STAGES[name].run(RunDir(run_dir), handle, scfg, overwrite=overwrite,
                                          log=log)
                if text := STAGES[name].format_summary(result):
                    texts += [f"## {spec}: {name}", text]
                    log(text)
                log(f"== stage {name} took {time.perf_counter() - t0:.0f} s")
        if cfg.get("figures"):
            _copy_figures(run_dir, Path(cfg["figures"]), list(stage_cfgs),
                          "" if len(models) == 1 else f"{model_slug(spec)}__")
    write_json(out / "summary.json", summary)
    atomic_write_text(out / "summary.txt", "\n\n".join(texts) + "\n")
    figs = cfg.get("figures") or ", ".join(f"{out / model_slug(s)}/figures" for s in acfgs)
    log(f"== done. Figures: {figs}. Summary table: {out / 'summary.txt'} (numbers: "
        f"{out / 'summary.json'}).")
    if cfg.get("description"):
        log(f"== this was {cfg['description'].rstrip('.')}.")
    return summary
