"""The ``interp`` command line: every command, each a thin call into a stage.

``interp --help`` lists the commands. A stage's command (one per entry of
:data:`interp.core.contract.SPECS`) is built from the stage's config dataclass: one option
per field, with the field's type, default and help (:func:`interp.core.options.click_params`), plus
the run directory options every stage of its kind takes (:func:`_stage_params`). It turns the
options given into the stage's config (:func:`interp.core.options.config_from_table`, the same
checks as a TOML table), checks the stage's needs and loads the run's model where it needs one
(:func:`interp.stages.load_run_model`), runs the stage and prints its summary. Commands are
built, and their modules (torch, transformers) imported, only when they run, so ``interp
--help`` starts at once. Errors the toolkit raises on purpose
(:class:`interp.core.errors.InterpError`)
are caught once, by the command group: ``error: <message>`` on stderr and exit status 2;
``interp --debug COMMAND`` shows the traceback instead.
"""

from __future__ import annotations

import inspect
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup

from interp.core.capabilities import is_served
from interp.core.contract import SPECS, StageSpec, kept_runs
from interp.core.errors import ConfigError, InterpError, LayerSpecError, RunDirError
from interp.core.inputs import read_toml
from interp.core.io import check_writable, unwritable
from interp.core.layers import DEFAULT_BAND, parse_layers
from interp.core.names import model_slug
from interp.core.options import cli_options, given, parse_count, split_list
from interp.core.vocab import DEFAULT_MODEL
from interp.judging.grading import parse_oracle_spec
from interp.launch import current_shard, finish
from interp.models.files import check_model_spec
from interp.models.gguf import check_gguf
from interp.run.pipeline import out_dir, run_config
from interp.stages.configs import check_model_specs, check_run
from interp.store.rundir import RunDir

__all__ = ["app", "main"]

BACKEND_ALIASES = {"tlens": "transformer_lens"}
_OVERWRITE_STAGE = ("redo this stage's stored work when it was computed under other runtime "
                    "settings (attention kernel, device, dtype, torch/transformers, TF32, "
                    "determinism) instead of refusing")
"""Backend names the command line also accepts (configs and the API use the full names)."""


_SHARD_HELP = ("run shard I of N (I from 0): its records only, into OUT/shards/I-of-N; "
               "default: from torchrun/accelerate (RANK, WORLD_SIZE) or a SLURM array")

_WATCHED: list[Path] = []
"""The run directories of the command now running, whose kept work a Ctrl-C reports."""


def _is_usage_error(err: Exception) -> bool:
    """A click usage error (bad option or value); typer may vendor its own click."""
    return hasattr(err, "format_message") and isinstance(getattr(err, "exit_code", None), int)


def _order() -> tuple[str, ...]:
    """The order of ``interp --help`` and the CLI reference, derived from the stage contract.

    The order a user meets the commands in: the demo's ``run`` first, then Study 1 and its
    outputs, the stages that read its run (in the contract's run order), the stages that start
    without one, then scale and servers. Only the commands that are no stage are named here,
    each beside the stage it belongs to (:data:`_BESIDE`); a new stage takes its place from its
    contract entry.
    """
    first, *rest = SPECS  # asymmetry: it makes the run every other stage reads
    stages = [first, *(s for s in rest if s.needs_run), *(s for s in rest if not s.needs_run)]
    return ("run", *(c for s in stages for c in (s.command, *_BESIDE.get(s.name, ()))),
            "merge", "serve", "oracle-agreement")


_BESIDE = {"asymmetry": ("metrics", "view"), "attention": ("heads",)}
"""The commands that are no stage and follow one in the help: what reads its output."""

ORDER = _order()
"""The order of ``interp --help`` and the CLI reference (:func:`_order`)."""


class _Group(TyperGroup):
    """The command group: one error policy for every command, and one name per stage.

    A stage's command answers to the stage's name too (``interp steering`` is ``interp
    steer``, :data:`interp.core.contract.SPECS`), as ``interp run --only`` accepts both.

    An :class:`InterpError` or a bad option prints ``error: <message>`` and exits 2
    (``--debug``: the traceback). Ctrl-C prints one line, what finished work the command's run
    directory keeps (:func:`interrupted_message`: a line per run directory when there are
    several) and the command that resumes it, and exits 130; a SIGTERM does the same and exits
    143 (:func:`_catch_sigterm`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _Commands(self.commands, {s.command: s for s in SPECS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command ``cmd_name``; a stage's name is its command's too (``steering``).

        While the group's help lists the commands, a stage command not built yet is a stub
        holding its spec's help, so that ``interp --help`` imports no stage.
        """
        if cmd_name not in self.commands:
            cmd_name = next((s.command for s in SPECS if cmd_name in s.names), cmd_name)
        if self._listing and (stub := self.commands.stub(cmd_name)) is not None:
            return stub
        return super().get_command(ctx, cmd_name)

    _listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        """The command names in the order a user meets them (:data:`ORDER`; building none)."""
        names = list(self.commands)
        rank = {n: i for i, n in enumerate(ORDER)}
        return sorted(names, key=lambda n: (rank.get(n, len(ORDER)), names.index(n)))

    def format_commands(self, ctx: click.Context, formatter: Any) -> None:
        """The commands, each with its whole first sentence of help, wrapped (click cuts it)."""
        rows = [(name, cmd.get_short_help_str(limit=1000)) for name in self.list_commands(ctx)
                if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def format_help(self, ctx: click.Context, formatter: Any) -> None:
        """The group's help, listing the stage commands from their specs."""
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def invoke(self, ctx: click.Context) -> Any:
        _WATCHED.clear()
        debug = bool(ctx.params.get("debug"))  # the group's own options are parsed by now
        caught = _catch_sigterm()
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
            click.echo("\n" + interrupted_message(_WATCHED, [*invoked_as(), *sys.argv[1:]]),
                       err=True)
            ctx.exit(128 + caught[0])
        except Exception as err:
            if not _is_usage_error(err) or debug or type(err).__name__ in ("Exit", "Abort"):
                raise
            sub = getattr(getattr(err, "ctx", None), "info_name", None)
            hint = f" (see `interp {sub} --help`)" if sub and sub != ctx.info_name else ""
            click.echo(f"error: {err.format_message()}{hint}", err=True)  # type: ignore[attr-defined]
            ctx.exit(2)
        finally:
            _restore_sigterm(caught)


class _Commands(dict):
    """The group's commands: the stage commands are built on first use (:func:`_stage_command`).

    Names list without building anything (``interp --help``); looking one up, or iterating over
    the values, builds it.
    """

    def __init__(self, eager: dict[str, click.Command], lazy: dict[str, StageSpec]) -> None:
        super().__init__(eager)
        self._lazy = {k: v for k, v in lazy.items() if k not in eager}

    def _build(self, name: object) -> None:
        if name in self._lazy:
            super().__setitem__(name, _stage_command(self._lazy.pop(name)))  # type: ignore[index]

    def stub(self, name: str) -> click.Command | None:
        """A stand-in holding a stage command's help, while it is not built (None: built)."""
        from typer.core import TyperCommand

        if name not in self._lazy:
            return None
        return TyperCommand(name, help=self._lazy[name].help)

    def __getitem__(self, name: str) -> click.Command:
        self._build(name)
        return super().__getitem__(name)

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        self._build(name)
        return super().get(name, default)

    def __contains__(self, name: object) -> bool:
        return super().__contains__(name) or name in self._lazy

    def __iter__(self) -> Any:
        return iter([*super().keys(), *self._lazy])

    def __len__(self) -> int:
        return super().__len__() + len(self._lazy)

    def keys(self) -> Any:  # type: ignore[override]
        return list(self)

    def items(self) -> Any:  # type: ignore[override]
        for name in list(self._lazy):
            self._build(name)
        return super().items()

    def values(self) -> Any:  # type: ignore[override]
        return [v for _, v in self.items()]


def invoked_as(argv0: str | None = None) -> list[str]:
    """The command that started this process, as the user can type it again.

    ``["interp"]``, except for an ``interp`` script that is not the one on ``PATH``: its path
    then (e.g. ``.venv/bin/interp`` under ``make demo``, whose virtual environment is not
    active). A module run (``python -m interp``) also says ``interp``.
    """
    import os
    import shutil

    argv0 = sys.argv[0] if argv0 is None else argv0
    on_path = shutil.which("interp")
    if (Path(argv0).name != "interp" or os.sep not in argv0
            or (on_path and os.path.realpath(on_path) == os.path.realpath(argv0))):
        return ["interp"]
    rel = os.path.relpath(argv0)
    return [rel if os.sep in rel else f".{os.sep}{rel}"]


def interrupted_message(watched: Sequence[Path], argv: Sequence[str]) -> str:
    """What a Ctrl-C (or SIGTERM) prints: the work each run directory kept, and the resume.

    One run directory: one line, ``interrupted: kept N records, ... in DIR; resume with: CMD``.
    Several (``interp run`` over several models): a line per run directory, each with what it
    kept (:func:`interp.core.contract.kept_runs`; ``0 records`` for one whose first chunk had
    not finished), then the command.

    Args:
        watched: the command's run directories (or grid folders), in the order they run.
        argv: the command as typed (``["interp", ...]``).

    Returns:
        The message (no trailing newline).
    """
    resume = shlex.join(list(argv))
    runs = kept_runs(watched) if watched else []
    if len(runs) <= 1:
        kept = f"kept {runs[0]}" if runs else "kept nothing" if watched else "nothing to resume"
        return f"interrupted: {kept}; resume with: {resume}"
    return "\n".join(["interrupted; finished work kept in each run directory:",
                      *(f"  {r}" for r in runs), f"resume with: {resume}"])


def _catch_sigterm() -> list[int]:
    """Turn a SIGTERM into a ``KeyboardInterrupt`` while a command runs (the main thread only).

    A scheduler's or ``kill``'s SIGTERM then keeps the finished work as Ctrl-C does
    (:class:`interp.core.errors.Interrupted`) and the command exits ``128 + signal``
    (130 Ctrl-C, 143 SIGTERM). Returns ``[signal number, previous handler]``, for
    :func:`_restore_sigterm`.
    """
    import signal
    import threading

    caught: list[Any] = [signal.SIGINT, None]
    if threading.current_thread() is not threading.main_thread():
        return caught

    def on_term(signum: int, frame: Any) -> None:
        caught[0] = signum
        raise KeyboardInterrupt

    caught[1] = signal.signal(signal.SIGTERM, on_term)
    return caught


def _restore_sigterm(caught: list[Any]) -> None:
    """Put back the SIGTERM handler :func:`_catch_sigterm` replaced."""
    import signal

    if caught[1] is not None:
        signal.signal(signal.SIGTERM, caught[1])


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
                  pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Is an LLM a better judge than a generator? GA/EA asymmetry, attention "
                       "span mass, activation patching, LoRA transfer and probes.")


@app.callback()
def _root(ctx: typer.Context, debug: Annotated[bool, typer.Option(
        "--debug", help="show the traceback of an error instead of one line")] = False) -> None:
    ctx.obj = {"debug": debug}


def _read_run(run: Path, require: bool = True, **layers: str) -> None:
    """A run a command reads, checked before its libraries load.

    Its manifest, every line of its ``records.jsonl`` (a damaged one named, with how to
    recover), and each layer option (``layers``: option name -> spec) against the model the
    manifest records (:func:`interp.stages.configs.check_run`'s checks for the commands that
    are not stages). ``require``: refuse a folder without a manifest (else check what is there).
    """
    rd = RunDir(run)
    if require:
        rd.require_run()
    elif not rd.manifest_path.exists():
        return
    n_layers = (rd.manifest().get("model") or {}).get("n_layers")
    for name, spec in layers.items():
        if n_layers:
            try:
                parse_layers(spec, int(n_layers))
            except LayerSpecError as err:
                raise LayerSpecError(f"--{name}: {err}") from None
    if rd.records_path.exists():
        rd.read_records(status=None)


@app.command()
def metrics(run: Annotated[Path, typer.Option(help="run directory")],
            balanced: Annotated[bool, typer.Option(
                "--balanced", help="also judge each record's gold answer and a wrong one "
                "(its hard negative, else its own wrong answer): balanced accuracy and AUC "
                "on a set with GA = 0.5; loads the model, two judge passes per record")
            ] = False) -> None:
    """Recompute metrics.json and the asymmetry figure from a run's records.

    A run that cannot be written (a read-only mount) is read: its table is printed and its
    files are left as they are. ``--balanced`` first judges the balanced judge set
    (:func:`interp.stages.asymmetry.judge_balanced`, resumable).
    """
    _read_run(run)
    from interp.stages import asymmetry as stage

    rd = RunDir(run)
    cfg = stage.AsymmetryConfig.from_mapping(rd.manifest()["config"])
    if balanced:
        if (err := unwritable(rd.path)) is not None:
            raise RunDirError(f"{rd.path} cannot be written ({err.strerror or err}): "
                                     f"--balanced stores the judged set there")
        stage.judge_balanced(rd, cfg, log=typer.echo)
    if (err := unwritable(rd.path)) is None:
        typer.echo(stage.format_summary(stage.write_metrics(rd, cfg)))
        typer.echo(f"wrote {rd.path / 'metrics.json'}, {rd.path / 'figures/asymmetry.png'}")
        return
    typer.echo(stage.format_summary(stage.write_metrics(rd, cfg, write=False)))
    typer.echo(f"{rd.path} cannot be written ({err.strerror or err}): the table above was "
               f"computed from its records; metrics.json and the figure were left as they are")


@app.command("oracle-agreement")
def oracle_agreement_cmd(
    run: Annotated[Path, typer.Option(help="asymmetry run directory")],
    oracle: Annotated[str, typer.Option(help="the LLM oracle, model:SPEC or openai:MODEL")],
    limit: Annotated[int | None, typer.Option(
        help="first N ok records per dataset (>= 1; default: every record)")] = None,
    device: Annotated[str | None, typer.Option(help="where the LLM oracle runs")] = None,
    base_url: Annotated[str | None, typer.Option(
        help="an openai:MODEL oracle's base URL (default: $INTERP_OPENAI_BASE_URL, "
             "$OPENAI_BASE_URL)")] = None,
    timeout_s: Annotated[float | None, typer.Option(
        help="seconds one try of an openai:MODEL oracle's request may take (default 60)")] = None,
) -> None:
    """Cohen's kappa and the confusion table of the rule oracle vs an LLM oracle on a run."""
    if parse_oracle_spec(oracle).kind == "model":
        check_model_spec(oracle.partition(":")[2])  # a misspelt name: before the run is read
    if timeout_s is not None and not timeout_s > 0:
        raise typer.BadParameter(f"--timeout-s must be > 0 seconds, not {timeout_s}")
    _read_run(run)
    from interp.stages import asymmetry as stage

    table = {k: v for k, v in (("base_url", base_url), ("timeout_s", timeout_s)) if v}
    res = stage.oracle_agreement(RunDir(run), oracle, limit=limit, device=device,
                                 endpoint=table or None)
    typer.echo(stage.format_oracle_agreement(res))
    typer.echo(f"wrote {run}/oracle_agreement.json")


@app.command("run")
def run_cmd(
    config: Annotated[Path, typer.Argument(help="TOML config, e.g. experiments/quickstart.toml")],
    overwrite: Annotated[bool, typer.Option(
        help="discard runs made with another config; redo stage work made under other "
             "runtime settings")] = False,
    only: Annotated[list[str] | None, typer.Option(
        help="run only these stages (asymmetry or a stage the config has, by stage or "
             "command name: steering or steer; comma list); figures/ is then not updated")] = None,
    out: Annotated[Path | None, typer.Option(
        help="folder of the run directories (default: the config's out, else runs/<name>)")] = (
        None),
    shard: Annotated[str | None, typer.Option(help=_SHARD_HELP)] = None,
) -> None:
    """Run a configured grid (models x datasets) and its stages."""
    doc = read_toml(config)  # a missing or broken file is said before anything else
    grid = Path(out or out_dir(doc, config))
    asym = doc.get("asymmetry") if isinstance(doc.get("asymmetry"), dict) else {}
    models = asym.get("models", [asym.get("model", DEFAULT_MODEL)])
    if isinstance(models, list) and all(isinstance(m, str) for m in models):
        for spec in models:  # each model's run directory, in the order they run
            _watch(grid / model_slug(spec))
    _watch(grid)  # then any other run directory in it (cross-judged runs)
    try:
        run_config(config, overwrite=overwrite, only=split_list(only or []) or None, out=out,
                   log=typer.echo, shard=current_shard(shard))
    finally:
        finish()


@app.command("serve")
def serve_cmd(
    model: Annotated[str, typer.Argument(help="a bundled alias (smollm2-135m-instruct, "
                                              "qwen2.5-coder-0.5b-instruct) or a .gguf file")],
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 8080,
    alias: Annotated[str | None, typer.Option(
        help="the model name the server answers to (default: MODEL's name)")] = None,
    threads: Annotated[int, typer.Option(help="CPU threads of the server")] = 1,
    n_ctx: Annotated[int, typer.Option(
        help="context length (tokens), split between the slots: each holds n_ctx // parallel")
                     ] = 4096,
    parallel: Annotated[int, typer.Option(
        help="slots: requests answered at once, batched together (llama.cpp's -np); a run "
             "sends up to --concurrency at a time")] = 1,
) -> None:
    """Serve a GGUF on 127.0.0.1 as an OpenAI-compatible server (llama.cpp; Ctrl-C stops it)."""
    import importlib.util

    if importlib.util.find_spec("xllamacpp") is None:
        raise typer.BadParameter("the llama.cpp server is not installed: pip install -e "
                                 "'.[serve]' (the xllamacpp wheel)")
    if not 1 <= port <= 65535 or threads < 1 or n_ctx < 16:
        raise typer.BadParameter(f"--port must be 1-65535, --threads >= 1, --n-ctx >= 16; "
                                 f"got {port}, {threads}, {n_ctx}")
    from interp.endpoints.local import check_port, check_slots

    check_slots(n_ctx, parallel)  # a slot too small for any prompt: one line, exit 2
    check_port(port)  # in use: one line now, not the server's failure after it loaded
    if model.endswith(".gguf"):
        gguf = Path(model)
        if not gguf.is_file():
            raise typer.BadParameter(f"{gguf} does not exist")
    else:
        from interp.models.loading import bundled_gguf

        gguf = bundled_gguf(model)
    check_gguf(gguf)  # truncated or not a GGUF: said before the server reads it
    name = alias or (Path(model).stem if model.endswith(".gguf") else model)
    base = f"http://127.0.0.1:{port}/v1"
    slots = (f"; {parallel} slots of {n_ctx // parallel} tokens each: a run with "
             f"--concurrency {parallel}" if parallel > 1 else "")
    typer.echo(f"serving {gguf.name} as openai:{name} at {base} (Ctrl-C stops it); in a run: "
               f"--model openai:{name} with INTERP_OPENAI_BASE_URL={base}{slots}")
    from interp.endpoints.local import _serve

    _serve([str(gguf), "--port", str(port), "--alias", name, "--threads", str(threads),
            "--n-ctx", str(n_ctx), "--parallel", str(parallel)])


@app.command("merge")
def merge_cmd(
    shards: Annotated[list[Path], typer.Argument(
        help="every shard's run directory, e.g. runs/x/shards/*-of-4")],
    out: Annotated[Path, typer.Option(help="the merged run directory")],
    overwrite: Annotated[bool, typer.Option(
        help="replace a run in --out made with another config")] = False,
) -> None:
    """Join finished shards (--shard I/N, SLURM arrays, Ray tasks) into one run directory."""
    from interp.stages import asymmetry as stage
    from interp.stages.merge import merge_shards

    metrics = merge_shards(shards, out, overwrite=overwrite, log=typer.echo)
    typer.echo(stage.format_summary(metrics))
    typer.echo(f"wrote {out}/records.jsonl, {out}/manifest.json, {out}/metrics.json; run the "
               f"stages on {out} (interp run CONFIG, or interp attention/probe/... --run {out})")


_VIEW_HELP = ("A self-contained HTML page: a record's gen and eval tokens coloured by attention."
              "\n\nOpen the page in a browser: the menus above the two prompts choose the layer "
              "(a layer, or the mean over --band) and the head (a query head, or the mean over "
              "heads) whose last-token attention colours every token, and the colour scale; a "
              "box sets the first token (the attention sink) aside when scaling. Each span's "
              "mass is listed beside its prompt.")


@app.command("view", help=_VIEW_HELP)
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
    """A self-contained HTML page: a record's gen and eval tokens coloured by attention.

    Open the page in a browser: the menus above the two prompts choose the layer (a layer, or
    the mean over --band) and the head (a query head, or the mean over heads) whose last-token
    attention colours every token, and the colour scale; a box sets the first token (the
    attention sink) aside when scaling. Each span's mass is listed beside its prompt.
    """
    _read_run(run, band=band)
    from interp.run.view import find_record, write_view
    from interp.stages import load_run_model

    rd = RunDir(run)
    rec = find_record(rd, record_id, dataset)  # a wrong id fails before the model loads
    check_writable((out.parent if out else rd.path / "view" / rec["dataset"]),
                   "the record's page (give --out FILE in a writable folder)")
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
    _read_run(run, require=False, layers=layers)  # it reads attention/summary.json only
    from interp.analysis import span_mass as attention
    from interp.stages.stored import read_attention_summary

    summary = read_attention_summary(RunDir(run))
    ranked = attention.top_heads(summary, dataset=dataset, top=top,
                                 layers=parse_layers(layers, summary["n_layers"]))
    typer.echo(attention.format_heads(ranked, top=top, dataset=dataset))


_TYPES = {"bool": bool | None, "list": list[str] | None, "count": str | None,
          "int": int | None, "float": float | None, "str": str | None}


def _stage_params(s: StageSpec) -> list[inspect.Parameter]:
    """The options a stage's command takes besides its config's: where it reads and writes."""
    def opt(name: str, tp: Any, default: Any, **kw: Any) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                 annotation=Annotated[tp, typer.Option(**kw)])

    overwrite = opt("overwrite", bool, False, help=(
        _OVERWRITE_STAGE if s.needs_run else "discard work made with another config"))
    if s.judged_input:  # a run directory, or a judge dataset judged into a new one
        return [opt("run", Path | None, None, help="a judged run directory (self- or "
                                                   "cross-judged)"),
                opt("judged", Path | None, None, help=(
                    "instead: a JSONL judge dataset (context, question, candidate, label, "
                    "optional verdict per line), judged by --model into --out")),
                opt("model", str | None, None, help="with --judged: the judge model"),
                opt("out", Path | None, None, help="with --judged: the run directory"),
                opt("template", str, "default", help="with --judged: the eval template"),
                opt("device", str | None, None, help="default: the run's device"), overwrite,
                opt("tables_only", bool, False, help=(
                    "only rebuild the tables and figures from the stored recordings (no "
                    "model)"))]
    if s.needs_run:
        params = [opt("run", Path, ..., help="finished asymmetry run directory"),
                  opt("device", str | None, None, help="default: the run's device"), overwrite]
        if s.tables_only:
            params.append(opt("tables_only", bool, False, help=(
                "only rebuild the tables and figures from the stored parts (no model)")))
        return params
    params = [opt("out", Path, Path(f"runs/{s.name}"), help="run directory"), overwrite]
    if s.config_file:
        params.insert(0, opt("config", Path | None, None, help=(
            "TOML: a [transfer] table or flat TransferConfig keys (options given override "
            "it)")))
    return params


def _stage_command(s: StageSpec) -> click.Command:
    """The command of a stage: its config's options (:func:`interp.core.options.cli_options`)."""
    import typer.main
    import typer.models

    cls = s.config_class
    params = _stage_params(s)
    for o in cli_options(cls):
        extra = {"parser": _count, "metavar": "N|all"} if o.kind == "count" else (
            {"metavar": "A,B,..."} if o.kind == "list" else {})
        params.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[_TYPES[o.kind], typer.Option(
                                            *o.decls, help=o.help, show_default=False,
                                            **extra)]))

    def callback(**kw: Any) -> None:
        _run_stage(s, cls, kw)

    callback.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    callback.__annotations__ = {p.name: p.annotation for p in params}
    return typer.main.get_command_from_info(
        typer.models.CommandInfo(name=s.command, callback=callback, help=s.help),
        pretty_exceptions_short=True, rich_markup_mode=None)


def _count(value: str) -> int | str:
    try:
        return parse_count(value)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def _run_stage(s: StageSpec, cls: Any, kw: dict[str, Any]) -> None:
    """Build the config from the options given, check, load the model, run, print.

    Every check that needs no model (the config's values, its inputs, the run directory)
    comes before the stage's module, and torch and transformers with it, is imported.
    """
    values = given(cls, kw)
    if "backend" in values:
        values["backend"] = BACKEND_ALIASES.get(values["backend"], values["backend"])
    if kw.get("config"):
        values = {**s.load().load_config_file(kw["config"]), **values}
    cfg = cls.from_mapping(values)  # every bad value is refused before any file is read
    check_model_specs(cfg, model=s.model_from != "run")  # a misspelt name: before torch
    if kw.get("judged") and isinstance(kw.get("model"), str) and not is_served(kw["model"]):
        check_model_spec(kw["model"])  # audit --judged's judge
    if callable(getattr(cfg, "check_inputs", None)):
        cfg.check_inputs()  # datasets, template, oracle: before the stage's libraries load
    where = Path(kw.get("run") or kw["out"]) if kw.get("run") or kw.get("out") else None
    if where is not None and s.needs_run and not kw.get("judged"):
        check_writable(where, f"interp {s.command}")
        # the run's manifest, layers, needs and records: said before the stage's libraries load
        check_run(where, s.name, cfg,
                  needs=s.model_from == "run" and not kw.get("tables_only"))
    from interp.models.loading import load_model
    from interp.stages import load_run_model
    from interp.stages.common import check_capabilities

    mod = s.load()
    if s.judged_input:
        _audit_dir(mod, kw)
    where = Path(kw.get("run") or kw["out"])
    check_writable(where, f"interp {s.command}")  # before any model loads
    rd = RunDir(_watch(where))
    if kw.get("judged"):
        summary = mod.run(rd, kw["judged_handle"], cfg, overwrite=kw["overwrite"],
                          log=typer.echo)
    elif kw.get("tables_only"):
        summary = getattr(mod, s.tables_only)(rd, cfg)  # type: ignore[arg-type]
    else:
        handle, shard = None, {}
        if s.model_from == "run":
            handle = load_run_model(rd, device=kw["device"], stage=s.name, config=cfg)
        elif s.model_from == "stage":  # loaded by the stage after its checks; maybe sharded
            shard = {"shard": current_shard(cfg.shard)}   # --shard, torchrun, SLURM
        else:  # "config"
            check_capabilities(s.name, cfg.model)
            handle = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)
        try:
            summary = mod.run(rd, handle, cfg, overwrite=kw["overwrite"], log=typer.echo,
                              **shard)
        finally:
            if shard:
                finish()  # leave the process group, stop the heartbeat
        if summary is None:  # a shard's records only: the merge writes metrics.json
            return
    typer.echo(mod.format_summary(summary))
    typer.echo(s.written(where))


def _audit_dir(mod: Any, kw: dict[str, Any]) -> None:
    """``interp audit``: a run given by ``--run``, or ``--judged`` judged into ``--out``.

    Raises:
        ConfigError: neither or both of ``--run`` and ``--judged``; ``--judged`` without
            ``--model`` and ``--out``.
    """
    from interp.models.loading import load_model

    if (kw["run"] is None) == (kw["judged"] is None):
        raise ConfigError("give either --run DIR or --judged FILE.jsonl (with --model, --out)")
    if kw["judged"] is None:
        return
    if not kw["model"] or kw["out"] is None:
        raise ConfigError("--judged needs --model (the judge) and --out (its run directory)")
    mod.read_judged(kw["judged"])  # a malformed file fails before the model loads
    from interp.stages.common import check_capabilities

    check_capabilities("audit", kw["model"], where="interp audit --judged")
    kw["judged_handle"] = handle = load_model(kw["model"], device=kw["device"])
    mod.judged_run(kw["judged"], _watch(kw["out"]), handle, template=kw["template"],
                   overwrite=kw["overwrite"], log=typer.echo)


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
