"""The ``interp`` command line (typer). ``interp --help`` lists the commands.

Each study module adds its commands through a ``register(app)`` function listed in
:data:`COMMAND_MODULES`; ``interp run CONFIG`` runs the stages of a TOML config in order
(``asymmetry`` first, then any of ``attention``, ``patching``, ``probe``, ``transfer``), each
stage through the ``run_stage(run_dir, section, handle)`` of its module.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer

from interp.asymmetry import AsymmetryConfig, format_metrics, run_asymmetry, write_metrics
from interp.models import DEFAULT_MODEL
from interp.store import RunDir, write_json

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Is an LLM a better judge than a generator? GA/EA asymmetry, attention "
                       "span mass, activation patching, LoRA transfer and probes.")

COMMAND_MODULES: list[str] = [
    "interp.attention",
    "interp.probing",
    "interp.stages.transfer",
    "interp.stages.patching",
]
"""Modules whose ``register(app)`` adds commands, and whose ``run_stage`` serves ``interp run``
for the config section of the same name as ``STAGE`` in the module."""


def _split(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out += [x.strip() for x in v.split(",") if x.strip()]
    return out


@app.command()
def asymmetry(
    dataset: Annotated[list[str], typer.Option(
        "--dataset", "-d", help="squad_v2, drop, hotpotqa, musique or a file path; "
                                "repeat or comma-separate")] = ["squad_v2"],  # noqa: B006
    model: Annotated[str, typer.Option(help="alias, .gguf, checkpoint dir or hub id")] = (
        DEFAULT_MODEL),
    limit: Annotated[int | None, typer.Option(help="examples per dataset")] = 50,
    out: Annotated[Path, typer.Option(help="run directory")] = Path("runs/asymmetry"),
    seed: int = 0,
    oracle: Annotated[str, typer.Option(help="'rule' or 'model:SPEC'")] = "rule",
    batch_size: int = 8,
    template: Annotated[str, typer.Option(help="template variant")] = "default",
    templates_path: Annotated[str | None, typer.Option(help="TOML file of variants")] = None,
    include_unanswerable: bool = False,
    split: str = "validation",
    max_new_tokens: int = 48,
    device: str | None = None,
    dtype: str | None = None,
    from_hub: Annotated[bool, typer.Option(help="load datasets from the HF hub")] = False,
    overwrite: Annotated[bool, typer.Option(help="discard a run made with another config")] = (
        False),
) -> None:
    """Study 1: generate, grade with the oracle, self-evaluate; write GA/EA/Delta."""
    cfg = AsymmetryConfig(model=model, datasets=_split(dataset), limit=limit, seed=seed,
                          oracle=oracle, batch_size=batch_size, template=template,
                          templates_path=templates_path,
                          include_unanswerable=include_unanswerable, split=split,
                          max_new_tokens=max_new_tokens, device=device, dtype=dtype,
                          from_hub=from_hub)
    metrics = run_asymmetry(cfg, out, overwrite=overwrite)
    typer.echo(format_metrics(metrics))
    typer.echo(f"wrote {out}/records.jsonl, {out}/metrics.json, {out}/figures/asymmetry.png")


@app.command()
def metrics(run: Annotated[Path, typer.Option(help="run directory")]) -> None:
    """Recompute metrics.json and the asymmetry figure from a run's records."""
    rd = RunDir(run)
    cfg = AsymmetryConfig.from_mapping(rd.manifest()["config"])
    typer.echo(format_metrics(write_metrics(rd, cfg)))


def _model_slug(spec: str) -> str:
    return spec.rstrip("/").replace("/", "__").replace("@", "_").removesuffix(".gguf").split(
        "__")[-1] if not Path(spec).exists() else Path(spec).stem


def run_config(path: str | Path, *, overwrite: bool = False,
               only: list[str] | None = None) -> dict[str, Any]:
    """Run every stage of a TOML config (see ``experiments/quickstart.toml``).

    The config has top-level ``name``, ``out`` (default ``runs/<name>``), optional ``figures``
    (a folder the figures are copied to, with ``metrics.json`` as ``asymmetry_metrics.json``
    and each stage's ``SUMMARIES``), an ``[asymmetry]`` table with ``models`` (a list)
    and the :class:`interp.asymmetry.AsymmetryConfig` fields, and one table per further stage.
    Each model gets its own run directory ``out/<model-slug>/``; ``out/summary.json`` holds
    every model's metrics.

    Raises:
        ValueError: an unknown top-level key or stage name.
    """
    cfg = tomllib.loads(Path(path).read_text())
    stages = {m.rsplit(".", 1)[-1]: m for m in COMMAND_MODULES}
    stage_names = {getattr(importlib.import_module(m), "STAGE", None): m
                   for m in stages.values()}
    known_top = {"name", "out", "figures", "description", "asymmetry"} | set(stage_names)
    if unknown := set(cfg) - known_top:
        raise ValueError(f"{path}: unknown keys or stages {sorted(unknown)}; known: "
                         f"{sorted(k for k in known_top if k)}")
    name = cfg.get("name", Path(path).stem)
    out = Path(cfg.get("out", f"runs/{name}"))
    asym = dict(cfg.get("asymmetry", {}))
    models = asym.pop("models", [asym.pop("model", DEFAULT_MODEL)])
    summary: dict[str, Any] = {}
    from interp.models import load_model

    for spec in models:
        run_dir = out / _model_slug(spec)
        acfg = AsymmetryConfig.from_mapping({**asym, "model": spec})
        handle = load_model(spec, device=acfg.device, dtype=acfg.dtype)
        typer.echo(f"== {spec} -> {run_dir}")
        if not only or "asymmetry" in only:
            m = run_asymmetry(acfg, run_dir, overwrite=overwrite, handle=handle)
            typer.echo(format_metrics(m))
        else:
            m = write_metrics(RunDir(run_dir), acfg)
        summary[spec] = {"run_dir": str(run_dir), "metrics": m}
        for stage, module in stage_names.items():
            if stage in cfg and (not only or stage in only):
                typer.echo(f"== stage {stage} on {run_dir}")
                importlib.import_module(module).run_stage(RunDir(run_dir), dict(cfg[stage]),
                                                          handle)
        if cfg.get("figures"):
            dest = Path(cfg["figures"])
            dest.mkdir(parents=True, exist_ok=True)
            tables = {"metrics.json": "asymmetry_metrics.json"}
            for stage, module in stage_names.items():
                if stage in cfg:
                    tables.update(getattr(importlib.import_module(module), "SUMMARIES", {}))
            files = [(p, p.name) for p in sorted((run_dir / "figures").glob("*.png"))]
            files += [(run_dir / src, name) for src, name in tables.items()
                      if (run_dir / src).exists()]
            for src, name in files:
                stem = name if len(models) == 1 else f"{_model_slug(spec)}__{name}"
                shutil.copy2(src, dest / stem)
    write_json(out / "summary.json", summary)
    return summary


@app.command("run")
def run_cmd(
    config: Annotated[Path, typer.Argument(help="TOML config, e.g. experiments/quickstart.toml")],
    overwrite: bool = False,
    only: Annotated[list[str] | None, typer.Option(help="run only these stages")] = None,
) -> None:
    """Run a configured grid (models x datasets) and its stages."""
    run_config(config, overwrite=overwrite, only=_split(only) or None)


def _register_all() -> None:
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(app)


def main() -> None:
    """Entry point of the ``interp`` console script."""
    # progress lines reach a log file (nohup, sbatch --output) as they are printed, not when a
    # block buffer fills
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    _register_all()
    app()


if __name__ == "__main__":
    main()
