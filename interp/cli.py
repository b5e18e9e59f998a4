"""The ``interp`` command line (typer): every command, each a thin call into a stage.

``interp --help`` lists the commands. Each command turns its options into the stage's config,
loads the run's model where it needs one (:func:`interp.stages.load_run_model`), runs the stage
and prints its summary. Errors the toolkit raises on purpose (:class:`interp.errors.InterpError`)
are caught once, by the command group: ``error: <message>`` on stderr and exit status 2;
``interp --debug COMMAND`` shows the traceback instead.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup

from interp import attention as attention_method
from interp.errors import InterpError
from interp.inputs import kept_work, read_toml
from interp.layers import DEFAULT_BAND, parse_layers
from interp.models import DEFAULT_MODEL, load_model
from interp.pipeline import out_dir, run_config
from interp.stages import asymmetry as asymmetry_stage
from interp.stages import attention as attention_stage
from interp.stages import load_run_model
from interp.stages import patching as patching_stage
from interp.stages import probe as probe_stage
from interp.stages import record as record_stage
from interp.stages import steering as steering_stage
from interp.stages import transfer as transfer_stage
from interp.store.io import read_json
from interp.store.rundir import RunDir
from interp.view import find_record, write_view

__all__ = ["app", "main"]

BACKEND_ALIASES = {"tlens": "transformer_lens"}
_OVERWRITE_STAGE = ("redo this stage's stored work when it was computed under other runtime "
                    "settings (attention kernel, device, dtype, torch/transformers, TF32, "
                    "determinism) instead of refusing")
"""Backend names the command line also accepts (configs and the API use the full names)."""


_WATCHED: list[Path] = []
"""The run directories of the command now running, whose kept work a Ctrl-C reports."""


def _is_usage_error(err: Exception) -> bool:
    """A click usage error (bad option or value); typer may vendor its own click."""
    return hasattr(err, "format_message") and isinstance(getattr(err, "exit_code", None), int)


class _Group(TyperGroup):
    """The command group: one error policy for every command.

    An :class:`InterpError` or a bad option prints ``error: <message>`` and exits 2
    (``--debug``: the traceback). Ctrl-C prints one line, what finished work the command's run
    directory keeps (:func:`interp.inputs.kept_work`) and the command that resumes it, and
    exits 130.
    """

    def invoke(self, ctx: click.Context) -> Any:
        _WATCHED.clear()
        debug = bool(ctx.params.get("debug"))  # the group's own options are parsed by now
        try:
            return super().invoke(ctx)
        except InterpError as err:
            if debug:
                raise
            click.echo(f"error: {err}", err=True)
            ctx.exit(2)
        except KeyboardInterrupt:
            if debug:
                raise
            _close_bars()
            kept = f"kept {kept_work(_WATCHED)}" if _WATCHED else "nothing to resume"
            resume = shlex.join(["interp", *sys.argv[1:]])
            click.echo(f"\ninterrupted: {kept}; resume with: {resume}", err=True)
            ctx.exit(130)
        except Exception as err:
            if not _is_usage_error(err) or debug or type(err).__name__ in ("Exit", "Abort"):
                raise
            sub = getattr(getattr(err, "ctx", None), "info_name", None)
            hint = f" (see `interp {sub} --help`)" if sub and sub != ctx.info_name else ""
            click.echo(f"error: {err.format_message()}{hint}", err=True)  # type: ignore[attr-defined]
            ctx.exit(2)


def _close_bars() -> None:
    """Close open progress bars, so that none is redrawn after the interrupt message."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


def _watch(path: Path) -> Path:
    """Name the run directory whose kept work a Ctrl-C reports (:class:`_Group`)."""
    _WATCHED.append(Path(path))
    return path


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True,
                  pretty_exceptions_enable=False,
                  help="Is an LLM a better judge than a generator? GA/EA asymmetry, attention "
                       "span mass, activation patching, LoRA transfer and probes.")


@app.callback()
def _root(ctx: typer.Context, debug: Annotated[bool, typer.Option(
        "--debug", help="show the traceback of an error instead of one line")] = False) -> None:
    ctx.obj = {"debug": debug}


def _split(values: list[str] | str | None) -> list[str]:
    out: list[str] = []
    for v in [values] if isinstance(values, str) else values or []:
        out += [x.strip() for x in v.split(",") if x.strip()]
    return out


@app.command()
def asymmetry(
    dataset: Annotated[list[str], typer.Option(
        "--dataset", "-d", help="squad_v2, drop, hotpotqa, musique or a file path (JSONL "
                                "format: README 'Data files'); repeat or comma-separate")] = [  # noqa: B006
        "squad_v2"],
    model: Annotated[str, typer.Option(help="alias, .gguf, checkpoint dir or hub id")] = (
        DEFAULT_MODEL),
    limit: Annotated[int | None, typer.Option(
        help="examples per dataset (>= 1; the first N in passage round-robin order)")] = 50,
    out: Annotated[Path, typer.Option(help="run directory")] = Path("runs/asymmetry"),
    seed: Annotated[int, typer.Option(help="seed of the bootstrap CIs")] = 0,
    oracle: Annotated[str, typer.Option(help="'rule' or 'model:SPEC'")] = "rule",
    batch_size: Annotated[int, typer.Option(
        help="prompts per forward; records are saved after every batch")] = 8,
    template: Annotated[str, typer.Option(
        help="template variant: default, reference, matched (control), closed_book")] = "default",
    templates_path: Annotated[str | None, typer.Option(help="TOML file of variants")] = None,
    include_unanswerable: Annotated[bool, typer.Option(
        help="keep SQuAD 2.0 unanswerable questions (abstaining is then correct)")] = False,
    split: Annotated[str, typer.Option(help="validation or train")] = "validation",
    max_new_tokens: Annotated[int, typer.Option(
        help="answer length cap in tokens (the quickstart config uses 32)")] = 48,
    device: Annotated[str | None, typer.Option(
        help="cpu, cuda, cuda:1 (default: CUDA when available)")] = None,
    dtype: Annotated[str | None, typer.Option(
        help="float32, bfloat16, float16 (default: by device)")] = None,
    from_hub: Annotated[bool, typer.Option(help="load datasets from the HF hub")] = False,
    overwrite: Annotated[bool, typer.Option(help="discard a run made with another config")] = (
        False),
    one_pass: Annotated[bool, typer.Option(
        help="also record, in the same forwards, the attention span masses and probe "
             "features the later stages read")] = True,
) -> None:
    """Study 1: generate, grade with the oracle, self-evaluate; write GA/EA/Delta."""
    cfg = asymmetry_stage.AsymmetryConfig.from_mapping(dict(
        model=model, datasets=_split(dataset), limit=limit, seed=seed, oracle=oracle,
        batch_size=batch_size, template=template, templates_path=templates_path,
        include_unanswerable=include_unanswerable, split=split, max_new_tokens=max_new_tokens,
        device=device, dtype=dtype, from_hub=from_hub, one_pass=one_pass))
    metrics = asymmetry_stage.run(cfg, _watch(out), overwrite=overwrite)
    typer.echo(asymmetry_stage.format_summary(metrics))
    typer.echo(f"wrote {out}/records.jsonl, {out}/metrics.json, {out}/figures/asymmetry.png")


@app.command()
def metrics(run: Annotated[Path, typer.Option(help="run directory")]) -> None:
    """Recompute metrics.json and the asymmetry figure from a run's records."""
    rd = RunDir(run)
    cfg = asymmetry_stage.AsymmetryConfig.from_mapping(rd.manifest()["config"])
    typer.echo(asymmetry_stage.format_summary(asymmetry_stage.write_metrics(rd, cfg)))


@app.command("oracle-agreement")
def oracle_agreement_cmd(
    run: Annotated[Path, typer.Option(help="asymmetry run directory")],
    oracle: Annotated[str, typer.Option(help="the LLM oracle, model:SPEC")],
    limit: Annotated[int | None, typer.Option(help="first N ok records per dataset")] = None,
    device: Annotated[str | None, typer.Option(help="where the LLM oracle runs")] = None,
) -> None:
    """Cohen's kappa and the confusion table of the rule oracle vs an LLM oracle on a run."""
    res = asymmetry_stage.oracle_agreement(RunDir(run), oracle, limit=limit, device=device)
    typer.echo(asymmetry_stage.format_oracle_agreement(res))
    typer.echo(f"wrote {run}/oracle_agreement.json")


@app.command("run")
def run_cmd(
    config: Annotated[Path, typer.Argument(help="TOML config, e.g. experiments/quickstart.toml")],
    overwrite: Annotated[bool, typer.Option(
        help="discard runs made with another config; redo stage work made under other "
             "runtime settings")] = False,
    only: Annotated[list[str] | None, typer.Option(
        help="run only these stages (asymmetry or a stage the config has; comma list); "
             "figures/ is then not updated")] = None,
) -> None:
    """Run a configured grid (models x datasets) and its stages."""
    _watch(out_dir(read_toml(config), config))
    run_config(config, overwrite=overwrite, only=_split(only) or None, log=typer.echo)


@app.command("attention")
def attention_cmd(
    run: Annotated[Path, typer.Option(help="finished asymmetry run directory")],
    backend: Annotated[str, typer.Option(
        help="hf | eager | transformer_lens (alias tlens) | nnsight")] = "hf",
    layers: Annotated[str, typer.Option(
        help="band: last8, all, or a range such as 22-29 (SmolLM2 has 30 layers)")] = (
        DEFAULT_BAND),
    limit: Annotated[int | None, typer.Option(help="records per dataset (>= 1)")] = None,
    save_rows: Annotated[bool, typer.Option(help="keep rows per record")] = False,
    save_resid: Annotated[str | None, typer.Option(
        help="layers whose resid_pre/resid_post/head outputs to save, e.g. last8")] = None,
    save_patterns: Annotated[bool, typer.Option(
        help="with --save-resid: also full patterns of those layers")] = False,
    n_boot: Annotated[int, typer.Option(help="bootstrap resamples of the CIs")] = 1000,
    seed: Annotated[int, typer.Option(help="seed of the bootstrap")] = 0,
    tables_only: Annotated[bool, typer.Option(
        help="only rebuild tables and figures from existing recordings")] = False,
    device: Annotated[str | None, typer.Option(help="default: the run's device")] = None,
    overwrite: Annotated[bool, typer.Option(help=_OVERWRITE_STAGE)] = False,
    recompute: Annotated[bool, typer.Option(
        help="record again even where a fresh recording exists (e.g. the harness's)")] = False,
) -> None:
    """Study 2: last-token attention rows and span mass per layer and head."""
    cfg = attention_stage.AttentionConfig.from_mapping(dict(
        backend=BACKEND_ALIASES.get(backend, backend), layers=layers, limit=limit,
        save_rows=save_rows, save_resid=save_resid, save_patterns=save_patterns, n_boot=n_boot,
        seed=seed, recompute=recompute))
    rd = RunDir(_watch(run))
    if tables_only:
        summary = attention_stage.write_tables(rd, cfg)
    else:
        summary = attention_stage.run(rd, load_run_model(rd, device=device, stage="attention",
                                                      config=cfg), cfg,
                                      overwrite=overwrite, log=typer.echo)
    typer.echo(attention_stage.format_summary(summary))
    typer.echo(f"wrote {run}/attention/span_mass.parquet, summary.json, heads.json and "
               f"{run}/figures/attention_*.png")


@app.command("record")
def record_cmd(
    run: Annotated[Path, typer.Option(help="finished asymmetry run directory")],
    what: Annotated[str, typer.Option(help="comma list of attention,resid,z")] = (
        "attention,resid,z"),
    layers: Annotated[str, typer.Option(help="layers: all, last8, 22-29, 0,4,-1")] = "all",
    positions: Annotated[str, typer.Option(
        help="query rows / positions kept: all | last | spans")] = "all",
    dtype: Annotated[str, typer.Option(help="float16 | bfloat16 | float32")] = "float16",
    limit: Annotated[int | None, typer.Option(help="records per dataset (>= 1)")] = None,
    shard_mb: Annotated[float, typer.Option(help="largest shard, MiB")] = 512.0,
    band: Annotated[str, typer.Option(help="layers of the span-to-span summary")] = DEFAULT_BAND,
    tables_only: Annotated[bool, typer.Option(
        help="only rebuild the index, tables and figure from existing recordings")] = False,
    device: Annotated[str | None, typer.Option(help="default: the run's device")] = None,
) -> None:
    """Full attention patterns, residual streams and head outputs of every prompt, on disk."""
    cfg = record_stage.RecordConfig.from_mapping(dict(
        what=what, layers=layers, positions=positions, dtype=dtype, limit=limit,
        shard_mb=shard_mb, band=band))
    rd = RunDir(_watch(run))
    if tables_only:
        summary = record_stage.write_tables(rd, cfg)
    else:
        summary = record_stage.run(rd, load_run_model(rd, device=device, stage="record",
                                                            config=cfg), cfg, log=typer.echo)
    typer.echo(record_stage.format_summary(summary))
    typer.echo(f"wrote {run}/record/ (index.json, index.parquet, span_to_span.parquet) and "
               f"{run}/figures/record_span_to_span.png")


@app.command("view")
def view_cmd(
    run: Annotated[Path, typer.Option(help="asymmetry run directory")],
    record_id: Annotated[str, typer.Option("--id", help="the record's id")],
    out: Annotated[Path | None, typer.Option(
        help="HTML file (default DIR/view/<dataset>/<id>.html)")] = None,
    dataset: Annotated[str | None, typer.Option(
        help="the record's dataset, when the id occurs in several")] = None,
    band: Annotated[str, typer.Option(help="layers of the 'band mean' choice")] = DEFAULT_BAND,
    device: Annotated[str | None, typer.Option(help="default: the run's device")] = None,
) -> None:
    """A self-contained HTML page: a record's gen and eval tokens coloured by attention."""
    rd = RunDir(run)
    find_record(rd, record_id, dataset)  # a wrong id fails before the model loads
    path = write_view(rd, load_run_model(rd, device=device), record_id, out, dataset=dataset,
                      band=band)
    typer.echo(f"wrote {path} (open it in a browser; it needs no server or network)")


@app.command("heads")
def heads_cmd(
    run: Annotated[Path, typer.Option(help="run directory with attention/summary.json")],
    dataset: Annotated[str | None, typer.Option(help="one dataset (default all)")] = None,
    top: Annotated[int, typer.Option(help="heads listed per ranking")] = 10,
    layers: Annotated[str, typer.Option(help="restrict to layers: all, last8, 22-29")] = "all",
) -> None:
    """List the top heads by context mass in gen, in eval, and by gen minus eval."""
    summary = attention_stage.read_summary(RunDir(run))
    ranked = attention_method.top_heads(summary, dataset=dataset, top=top,
                                        layers=parse_layers(layers, summary["n_layers"]))
    typer.echo(attention_method.format_heads(ranked, top=top, dataset=dataset))


@app.command("probe")
def probe_cmd(
    run: Annotated[Path, typer.Option(help="asymmetry run directory")],
    folds: Annotated[int, typer.Option(help="stratified CV folds")] = 5,
    layers: Annotated[str | None, typer.Option(
        help="layers to probe: all, last8, 22-29, 0,8,12-20 (default all)")] = None,
    probes: Annotated[str, typer.Option(help="comma list of logreg,svm,mlp; the first sweeps "
                                             "every layer x pool")] = "logreg,svm,mlp",
    pools: Annotated[str, typer.Option(help="comma list of last,candidate,mean,max,min")] = (
        "last,candidate,mean,max,min"),
    tasks: Annotated[str, typer.Option(help="eval,gen")] = "eval,gen",
    select_by: Annotated[str, typer.Option(help="auc or f1")] = "auc",
    top_k: Annotated[int, typer.Option(help="cells at which the other probes run")] = 5,
    sweep_all: Annotated[bool, typer.Option(help="every probe on every cell")] = False,
    batch_size: Annotated[int, typer.Option(help="prompts per forward")] = 4,
    seed: Annotated[int, typer.Option(help="seed of the folds and of the MLP")] = 0,
    limit: Annotated[int | None, typer.Option(
        help="first N ok records per dataset (>= 1; default all)")] = None,
    permutations: Annotated[int, typer.Option(
        help="label permutations for the best cell's selection-aware null (0: off)")] = 0,
    device: Annotated[str | None, typer.Option(help="default: the run's device")] = None,
    overwrite: Annotated[bool, typer.Option(help=_OVERWRITE_STAGE)] = False,
    recompute: Annotated[bool, typer.Option(
        help="extract features again even where cached (e.g. by the harness)")] = False,
) -> None:
    """Probes on the residual stream predicting y*: the representation as a judge."""
    cfg = probe_stage.ProbeConfig.from_mapping(dict(
        folds=folds, layers=layers, probes=_split(probes), pools=_split(pools),
        tasks=_split(tasks), select_by=select_by, top_k=top_k, sweep_all=sweep_all,
        batch_size=batch_size, seed=seed, limit=limit, permutations=permutations,
        recompute=recompute))
    rd = RunDir(_watch(run))
    res = probe_stage.run(rd, load_run_model(rd, device=device, stage="probe", config=cfg),
                          cfg, overwrite=overwrite,
                          log=typer.echo)
    typer.echo(probe_stage.format_summary(res))


@app.command("patch")
def patch_cmd(
    run: Annotated[Path, typer.Option(help="run directory (from `interp asymmetry`)")],
    pairs: Annotated[str, typer.Option(
        help="candidate-swap, gen-to-eval, eval-to-gen, system-prompt-control (comma list)")] = (
        "candidate-swap"),
    kind: Annotated[str, typer.Option(help="resid, heads, attribution (comma list)")] = "resid",
    limit: Annotated[int | None, typer.Option(help="pairs per dataset (>= 1)")] = 5,
    layers: Annotated[str | None, typer.Option(help="all, last8, 0-29 or 20,24,28")] = None,
    layer_stride: Annotated[int, typer.Option(help="sweep every k-th layer")] = 1,
    hook: Annotated[str, typer.Option(
        help="residual hook of --kind resid: hook_resid_pre (the input of block L) or "
             "hook_resid_post (its output)")] = "hook_resid_pre",
    per_position: Annotated[bool, typer.Option(help="also sweep single positions")] = True,
    exact: Annotated[str, typer.Option(
        help="topk: AtP* (attribution, then exact top-k); all: every unit exactly")] = "topk",
    top_k: Annotated[int, typer.Option(help="units patched exactly per pair with topk")] = 16,
    min_gap: Annotated[float, typer.Option(
        help="pairs with |clean - corrupt| below this (nats) leave the headline")] = 1.0,
    band: Annotated[str, typer.Option(help="layers of the context attention mass")] = (
        DEFAULT_BAND),
    oracle: Annotated[str | None, typer.Option(
        help="grades candidate-swap answers (default: the run's oracle)")] = None,
    mine: Annotated[bool, typer.Option(help="mine closed-book hard negatives")] = True,
    max_tokens: Annotated[int, typer.Option(help="skip longer pairs")] = 1024,
    batch_size: Annotated[int, typer.Option(help="patched rows per forward")] = 16,
    device: Annotated[str | None, typer.Option(help="default: the run's device")] = None,
    overwrite: Annotated[bool, typer.Option(help=_OVERWRITE_STAGE)] = False,
) -> None:
    """Activation / attribution patching between the judge and the generator."""
    cfg = patching_stage.PatchingConfig.from_mapping({
        "pairs": _split(pairs), "kinds": _split(kind), "limit": limit, "layers": layers,
        "layer_stride": layer_stride, "hook": hook, "per_position": per_position,
        "exact": exact, "top_k": top_k, "min_gap": min_gap, "band": band, "oracle": oracle,
        "mine": mine, "max_tokens": max_tokens, "batch_size": batch_size})
    rd = RunDir(run)
    _watch(rd.path)
    summary = patching_stage.run(rd, load_run_model(rd, device=device, stage="patching",
                                                       config=cfg), cfg,
                                 overwrite=overwrite, log=typer.echo)
    typer.echo(patching_stage.format_summary(summary))
    typer.echo(f"wrote {rd.path / 'patching'} and {rd.path / 'figures'}/patching_*.png")


@app.command("steer")
def steer_cmd(
    run: Annotated[Path, typer.Option(help="run directory (from `interp asymmetry`)")],
    alphas: Annotated[str, typer.Option(help="attention factors on the context keys")] = (
        "0.25,0.5,1,2,4,8"),
    layers: Annotated[str, typer.Option(help="steered band: last8, 22-29, all")] = DEFAULT_BAND,
    heads: Annotated[str, typer.Option(
        help="all | top-diff:K (top gen-minus-eval heads of `interp heads`) | L.H,L.H")] = "all",
    tasks: Annotated[str, typer.Option(help="eval, gen (comma list)")] = "eval,gen",
    limit: Annotated[int | None, typer.Option(help="records per dataset (>= 1)")] = 10,
    max_new_tokens: Annotated[int, typer.Option(help="steered answer length cap")] = 32,
    oracle: Annotated[str | None, typer.Option(
        help="grades steered answers (default: the run's oracle)")] = None,
    n_boot: Annotated[int, typer.Option(help="bootstrap resamples of the CIs")] = 1000,
    seed: Annotated[int, typer.Option(help="seed of the bootstrap")] = 0,
    device: Annotated[str | None, typer.Option(help="default: the run's device")] = None,
) -> None:
    """Attention steering: scale the context attention of the judge's verdict position."""
    cfg = steering_stage.SteeringConfig.from_mapping({
        "alphas": _split(alphas), "layers": layers, "heads": heads, "tasks": _split(tasks),
        "limit": limit, "max_new_tokens": max_new_tokens, "oracle": oracle, "n_boot": n_boot,
        "seed": seed})
    rd = RunDir(run)
    _watch(rd.path)
    summary = steering_stage.run(rd, load_run_model(rd, device=device, stage="steering",
                                                       config=cfg), cfg, log=typer.echo)
    typer.echo(steering_stage.format_summary(summary))
    typer.echo(f"wrote {rd.path / 'steering'} and {rd.path / 'figures'}/steering.png")


@app.command("transfer")
def transfer_cmd(
    config: Annotated[Path | None, typer.Option(
        help="TOML: a \\[transfer] table or flat TransferConfig keys")] = None,
    out: Annotated[Path, typer.Option(help="run directory")] = Path("runs/transfer"),
    model: Annotated[str | None, typer.Option(help="base model spec")] = None,
    dataset: Annotated[list[str] | None, typer.Option(
        "--dataset", "-d", help="train+eval datasets (squad_v2, hotpotqa, musique)")] = None,
    eval_limit: Annotated[int | None, typer.Option(
        help="validation records per dataset (>= 1)")] = None,
    max_train_examples: Annotated[int | None, typer.Option(help="items per adapter")] = None,
    epochs: Annotated[int | None, typer.Option(help="passes over the training set")] = None,
    lr: Annotated[float | None, typer.Option(help="AdamW learning rate")] = None,
    rank: Annotated[int | None, typer.Option(help="LoRA rank r")] = None,
    max_length: Annotated[int | None, typer.Option(help="longest training sequence")] = None,
    patch_examples: Annotated[int | None, typer.Option(
        help="eval prompts for cross-model patching (0: off)")] = None,
    patch_positions: Annotated[str | None, typer.Option(
        help="positions patched across models: all or last")] = None,
    seed: Annotated[int | None, typer.Option(help="seeds sampling, data order, LoRA")] = None,
    judge_base_answers: Annotated[bool | None, typer.Option(
        help="also let each adapter judge the base model's answers")] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, cuda:1, ...")] = None,
    overwrite: Annotated[bool, typer.Option(help="discard work made with another config")] = (
        False),
) -> None:
    """Study 3: hard negatives, LoRA-Gen/Eval/Both adapters, transfer table and figures."""
    values = transfer_stage.load_config_file(config) if config else {}
    flags = {"model": model, "eval_limit": eval_limit,
             "max_train_examples": max_train_examples, "epochs": epochs, "lr": lr,
             "rank": rank, "max_length": max_length, "patch_examples": patch_examples,
             "patch_positions": patch_positions, "seed": seed, "device": device,
             "judge_base_answers": judge_base_answers,
             "datasets": _split(dataset) or None}
    values.update({k: v for k, v in flags.items() if v is not None})
    cfg = transfer_stage.TransferConfig.from_mapping(values)
    handle = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)
    summary = transfer_stage.run(_watch(out), handle, cfg, overwrite=overwrite, log=typer.echo)
    table = read_json(Path(out) / "transfer" / "table.json")
    typer.echo(transfer_stage.format_table(table))
    typer.echo(transfer_stage.format_table(table, "judge_base_answers"))
    typer.echo(f"hard-negative fallback rate {summary['hard_negative_fallback_rate']:.2f}; "
               f"training seconds {summary['train_seconds']}")
    typer.echo(f"wrote {out}/transfer/ and {out}/figures/transfer_*.png")


def main() -> None:
    """Entry point of the ``interp`` console script."""
    # progress lines reach a log file (nohup, sbatch --output) as they are printed, not when a
    # block buffer fills
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    app()

if __name__ == "__main__":
    main()
