"""The stage contract, as data: what each stage of a run directory reads, writes and keeps.

Every study is a stage with one :class:`StageSpec` in :data:`SPECS` (in the order ``interp
run`` runs them). A spec declares:

* ``name``: the stage's one name: its config table (``[steering]``), its ``--only`` name and
  (with ``command``, the short form ``steer``) its command; :func:`spec` accepts either;
* ``module`` and ``config``: where the stage's code and its config dataclass live (imported
  only when used, so the command line starts without torch); by default
  ``interp.stages.<name>`` and ``<Name>Config`` in ``interp.stages.configs.<name>``;
* ``needs``: what must exist in the run directory before it runs (:class:`Need`): every stage
  but ``asymmetry`` and ``transfer`` reads a finished asymmetry run's ``records.jsonl``;
  steering with ``heads = "top-diff:K"`` reads ``attention/summary.json`` (``reasoning``
  also reads the attention recordings of a one-word judge's run, which the harness's one
  pass writes, and refuses their absence itself);
  :func:`check_needs` refuses a missing one in one line before any model loads;
* ``parts``: what it keeps when interrupted (:class:`Part`): the resumable units, each with
  its path pattern, how it is keyed (one file per record ``dataset``/``id``, rows of many
  records keyed ``dataset/id`` inside one file, lines of records, or one file per step) and
  where its signature is stored; a fresh part (same signature) is reused, a stale one redone.
  Merging shards of a run means: copy (or append, or concatenate) every stage's parts, then
  recompute the ``tables`` once;
* ``tables``, ``summaries``, ``figures``: the files it computes from its parts (relative to
  the run directory), the tables ``interp run`` publishes next to the figures (source ->
  published name), and the figure files (glob patterns);
* ``tables_only``: the function of ``module`` that rebuilds ``tables`` and ``figures`` from
  the parts without a model (None: rerun the stage; its fresh parts are reused).

This entry is the one place a stage's facts are written: the stage module reads it as
``SPEC = stage_of(__name__)``, its config class (:class:`interp.core.options.StageConfig`)
finds its table's name here, the command line builds the stage's command and its place in
``interp --help`` from it. Every stage module provides ``run(run_dir, handle, cfg, *,
overwrite=False, log=print) -> summary`` and ``format_summary(summary) -> str``
(:func:`check_module` checks it). This module
imports nothing heavy: the command line, ``interp run``'s checks and tools that merge shards
read the layout without loading torch.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from interp.core.errors import ConfigError, RunDirError
from interp.core.names import flat_key, safe_name

__all__ = ["SPECS", "Need", "Part", "StageSpec", "check_module", "check_needs", "flat_key",
           "kept_runs", "kept_work", "safe_name", "spec", "stage_names", "stage_of"]

RUN_ARGS = ("run_dir", "handle", "cfg", "overwrite", "log")
"""The parameters of every stage's ``run``, in this order (``overwrite`` and ``log`` keyword
only)."""


@dataclass(frozen=True)
class Need:
    """A file a stage reads from the run directory, written by another stage.

    Attributes:
        stage: the stage that writes it.
        path: the file, relative to the run directory (one of that stage's ``tables`` or
            ``parts`` files).
        when: ``(field, prefix)``: needed only when the config's ``field`` starts with
            ``prefix`` (steering's ``heads = "top-diff:K"``); None: always.
    """

    stage: str
    path: str
    when: tuple[str, str] | None = None

    def applies(self, cfg: Any) -> bool:
        """Whether ``cfg`` (the needing stage's config) needs the file."""
        if self.when is None:
            return True
        value = getattr(cfg, self.when[0], None)
        return isinstance(value, str) and value.strip().lower().startswith(self.when[1])


@dataclass(frozen=True)
class Part:
    """One kind of resumable unit a stage keeps in the run directory.

    Attributes:
        pattern: its path relative to the run directory; ``{dataset}`` and ``{id}`` are the
            record's (file-safe: ``naming``), other ``{...}`` are the stage's own coordinates
            (``{pairs}``, ``{kind}``, ``{task}``, ``{adapter}``, ``{model}``, ``{rate}``).
        label: what it is called in messages (``"steering parts"``).
        keyed: ``record`` (one file or folder per record), ``rows`` (rows of many records in
            one file, keyed ``dataset/id`` in its metadata ``keys``), ``lines`` (JSON lines,
            each a record with ``dataset`` and ``id``) or ``step`` (one file per step of the
            stage, not per record).
        signature: where the part's signature is stored (a part is reused only when it equals
            the signature of now).
        unit: ``files`` or ``lines``: what :func:`kept_work` counts.
        naming: how ``{dataset}``/``{id}`` become path pieces: ``safe`` (each by
            :func:`safe_name`: ``{dataset}/{id}``) or ``flat`` (one piece,
            :func:`flat_key`: ``{dataset}__{id}``).
        saved: whether a study's saved state keeps it (``experiments/findings/state.py``):
            False for a part that is large and cheap to make again (residual-stream states
            of every layer, feature caches: hundreds of KB a record, one forward to remake),
            whatever the size of each file.
    """

    pattern: str
    label: str
    keyed: Literal["record", "rows", "lines", "step"]
    signature: str
    unit: Literal["files", "lines"] = "files"
    naming: Literal["safe", "flat"] = "safe"
    saved: bool = True

    @property
    def glob(self) -> str:
        """The pattern with every ``{...}`` as ``*`` (``flat`` ``{dataset}__{id}``: one ``*``)."""
        return re.sub(r"\{[a-z_]+\}", "*", self.pattern.replace("{dataset}__{id}", "*"))

    def path(self, run_dir: str | Path, dataset: str | None = None,
             record_id: str | None = None, **coords: str) -> Path:
        """The part of one record (and coordinates) under ``run_dir``.

        Raises:
            KeyError: a coordinate of the pattern that is not given.
        """
        if self.naming == "flat" and dataset is not None:
            pattern = self.pattern.replace("{dataset}__{id}", flat_key(dataset, str(record_id)))
            return Path(run_dir) / pattern.format(**coords)
        keys = {} if dataset is None else {"dataset": safe_name(dataset),
                                           "id": safe_name(str(record_id))}
        return Path(run_dir) / self.pattern.format(**keys, **coords)

    def files(self, run_dir: str | Path) -> list[Path]:
        """Every stored part of this kind under ``run_dir`` (sorted)."""
        return sorted(p for p in Path(run_dir).glob(self.glob) if p.is_file())


@dataclass(frozen=True)
class StageSpec:
    """The declared contract of one stage (module docstring).

    Attributes:
        name: config table, ``--only`` and canonical name.
        command: the command's name (``steer``; default ``name``); the command also answers
            to ``name``.
        module: the stage's module (default ``interp.stages.<name>``).
        config: the name of its config dataclass (default ``<Name>Config``).
        help: the command's help text.
        folder: its folder in the run directory ("" for files at the top).
        needs: files of other stages it reads (:class:`Need`).
        parts: what it keeps when interrupted (:class:`Part`).
        tables: files it computes from its parts, relative to the run directory.
        summaries: published tables, source -> name (``interp run`` with ``publish``).
        figures: figure files it draws (glob patterns relative to the run directory).
        tables_only: the module's function that rebuilds ``tables`` and ``figures`` from the
            parts without a model (``fn(run_dir, cfg)``); None: rerun the stage.
        parts_only: the module's function that makes the stage's parts and nothing else
            (``fn(run_dir, handle, cfg, *, overwrite, log)``). Under torchrun every process
            runs it on its share (:func:`interp.stages.common.share_of_records`: of the
            selected records; for ``transfer``, of its training: the learning-rate
            candidates, or the adapters), then rank 0 runs the stage, which finds every part
            fresh and writes the tables once. None: rank 0 runs the stage
            alone, because its selection depends on its own results (patching keeps the first
            ``limit`` pairs that build) or its parts are shared files (probe feature caches,
            the reasoning judge's ``records.jsonl``).
        needs_run: it works on a finished asymmetry run (loads the run's model); False: it
            creates its own (``asymmetry``) or may start in an empty folder (``transfer``).
        model_needs: what it needs the model to do (:mod:`interp.core.capabilities`); a
            stage is refused on a model that cannot, before the model loads
            (:func:`interp.stages.common.check_capabilities`).
        model_from: where its command gets the model: ``run`` (the run's manifest,
            :func:`interp.stages.load_run_model`), ``config`` (the config's ``model``, loaded
            by the command) or ``stage`` (the stage loads it after its own checks, maybe in a
            shard of a launcher: Study 1).
        config_file: its command also takes ``--config FILE`` (a TOML table of its config).
        judged_input: its command may instead judge a JSONL judge dataset into a new run
            (``--judged FILE --model M --out DIR``).
        config_module: the light module holding ``config`` (default
            ``interp.stages.configs.<name>``, :mod:`interp.stages.configs`), so a config is
            checked before the stage's module and its libraries load.
    """

    name: str
    help: str
    folder: str
    command: str = ""
    module: str = ""
    config: str = ""
    needs: tuple[Need, ...] = ()
    parts: tuple[Part, ...] = ()
    tables: tuple[str, ...] = ()
    summaries: Mapping[str, str] = field(default_factory=dict)
    figures: tuple[str, ...] = ()
    tables_only: str | None = None
    parts_only: str | None = None
    needs_run: bool = True
    model_needs: frozenset[str] = frozenset({"attention", "activations"})
    model_from: str = "run"
    config_file: bool = False
    judged_input: bool = False
    config_module: str = ""

    def __post_init__(self) -> None:
        for name, default in (("command", self.name), ("module", f"interp.stages.{self.name}"),
                              ("config", f"{self.name.capitalize()}Config"),
                              ("config_module", f"interp.stages.configs.{self.name}")):
            if not getattr(self, name):
                object.__setattr__(self, name, default)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the stage answers to: ``name`` and ``command``."""
        return (self.name,) if self.command == self.name else (self.name, self.command)

    def load(self) -> ModuleType:
        """The stage's module (imported now)."""
        return importlib.import_module(self.module)

    @property
    def config_class(self) -> Any:
        """The stage's config dataclass, from ``config_module`` (imports no stage module)."""
        return getattr(importlib.import_module(self.config_module), self.config)

    def table(self, name: str) -> str:
        """The declared table (or part pattern) whose file name is ``name``, run-dir relative.

        Raises:
            KeyError: the stage declares no such file.
        """
        for t in (*self.tables, *(p.pattern for p in self.parts)):
            if Path(t).name == name:
                return t
        raise KeyError(f"the {self.name} stage declares no file {name}")

    def written(self, run_dir: str | Path) -> str:
        """What the stage wrote, as the ``wrote ...`` line of its command.

        Only the declared tables and figure patterns that exist in ``run_dir`` are named (a
        stage may skip one: the lens's ``tuned_lens.json`` under ``--no-tuned``).
        """
        root = Path(run_dir)
        files = [str(root / t) for t in self.tables if (root / t).exists()] + \
            [str(root / f) for f in self.figures if any(root.glob(f))]
        return "wrote " + (", ".join(files) or "nothing")


_RECORDS = Need("asymmetry", "records.jsonl")

SPECS: tuple[StageSpec, ...] = (
    StageSpec(
        name="asymmetry",
        model_needs=frozenset({"generate", "judge"}), model_from="stage",
        folder="", needs_run=False,
        help="Study 1: generate, grade with the oracle, self-evaluate; write GA/EA/Delta.",
        parts=(Part("records.jsonl", "records", "lines", "the record's own fields (question, "
                    "context, answers, generation prompt); manifest.json key fields",
                    unit="lines"),),
        tables=("metrics.json",), summaries={"metrics.json": "asymmetry_metrics.json"},
        figures=("figures/asymmetry.png",), tables_only="write_metrics"),
    StageSpec(
        name="attention",
        model_needs=frozenset({"attention"}),
        folder="attention", needs=(_RECORDS,),
        help="Study 2: last-token attention rows and span mass per layer and head.",
        parts=(Part("attention/records/{dataset}/{id}.safetensors", "attention recordings",
                    "record", "safetensors metadata 'signature' (model, sha256, prompts' token "
                    "ids, runtime facts)"),
               Part("activations/{dataset}/{id}.safetensors", "saved activations", "record",
                    "safetensors metadata 'signature' (the recording's, layers, patterns)")),
        tables=("attention/span_mass.parquet", "attention/summary.json", "attention/heads.json"),
        summaries={"attention/summary.json": "attention_summary.json"},
        figures=("figures/attention_*.png",), tables_only="write_tables", parts_only="record"),
    StageSpec(
        name="probe",
        model_needs=frozenset({"activations"}),
        folder="probes", needs=(_RECORDS,),
        help="Probes on the residual stream predicting y*: the representation as a judge.",
        parts=(Part("probes/features_{task}.safetensors", "probe feature caches", "rows",
                    "safetensors metadata 'signature' (model, runtime facts) and per row "
                    "'prompt_sigs' (the prompt's token ids)", saved=False),),
        tables=("probes/results.json",), summaries={"probes/results.json": "probes_results.json"},
        figures=("figures/probes.png",)),
    StageSpec(
        name="transfer",
        model_needs=frozenset({"weights"}), model_from="config", config_file=True,
        folder="transfer", needs_run=False,
        help="Study 3: hard negatives, LoRA-Gen/Eval/Both adapters, transfer table and figures.",
        parts=(Part("transfer/adapters/{adapter}/adapter_config.json", "trained adapters",
                    "step", "transfer/config.json (settings and provenance)"),
               Part("transfer/select/lr_{rate}/heldout/{adapter}.jsonl",
                    "learning-rate selection files", "step",
                    "transfer/config.json (settings and provenance)"),
               Part("transfer/eval/{model}__{dataset}.jsonl", "transfer evaluations", "step",
                    "transfer/config.json (settings and provenance)")),
        tables=("transfer/table.json", "transfer/patching.json", "transfer/summary.json"),
        summaries={"transfer/table.json": "transfer_table.json"},
        figures=("figures/transfer_*.png",), parts_only="make_parts"),
    StageSpec(
        name="patching", command="patch",
        model_needs=frozenset({"activations"}),
        folder="patching", needs=(_RECORDS,),
        help="Activation / attribution patching between the judge and the generator.",
        parts=(Part("patching/{pairs}/{kind}/parts/{dataset}__{id}.json", "patching parts",
                    "record", "JSON key meta.signature (model, sweep settings, the pair's token "
                    "ids and position map, runtime facts)", naming="flat"),),
        tables=("patching/summary.json",),
        summaries={"patching/summary.json": "patching_summary.json"},
        figures=("figures/patching_*.png",)),
    StageSpec(
        name="steering", command="steer",
        model_needs=frozenset({"attention"}),
        folder="steering",
        needs=(_RECORDS, Need("attention", "attention/summary.json", ("heads", "top-diff:"))),
        help="Attention steering: scale the context attention of the judge's verdict position.",
        parts=(Part("steering/parts/{dataset}__{id}.json", "steering parts", "record",
                    "JSON key 'signature' (model, alphas, units, band, tasks, answer length, "
                    "oracle, prompts' token ids, runtime facts)", naming="flat"),),
        tables=("steering/rows.parquet", "steering/summary.json"),
        summaries={"steering/summary.json": "steering_summary.json"},
        figures=("figures/steering.png",), parts_only="make_parts"),
    StageSpec(
        name="lens",
        model_needs=frozenset({"activations", "weights"}),
        folder="lens", needs=(_RECORDS,),
        help="Verdict lens: logit lens, tuned lens and direct logit attribution of the verdict "
             "at every layer.",
        parts=(Part("lens/parts/{dataset}__{id}.json", "lens parts", "record",
                    "JSON key 'signature' (model, runtime facts, the tuned lens's signature, "
                    "verdict replies, prompts' token ids)", naming="flat"),
               Part("lens/tuned_lens.safetensors", "tuned lens translators", "step",
                    "lens/tuned_lens.json key 'signature' (model, runtime facts, training "
                    "settings)")),
        tables=("lens/summary.json", "lens/tuned_lens.json"),
        summaries={"lens/summary.json": "lens_summary.json"},
        figures=("figures/lens_*.png",)),
    StageSpec(
        name="calibration",
        model_needs=frozenset({"attention", "activations", "weights"}),
        folder="calibration", needs=(_RECORDS,),
        help="Does the judge know what the generator knew? Calibration of four confidence "
             "signals, the self-check in the generator's conversation, and its cache.",
        parts=(Part("calibration/parts/{dataset}__{id}.json", "calibration parts", "record",
                    "JSON key 'signature' (model, runtime facts, verdict replies, the eval and "
                    "self-check prompts' token ids, patch and block settings)",
                    naming="flat"),
               Part("calibration/directions/states/{dataset}__{id}.safetensors",
                    "direction states", "record", "safetensors metadata 'signature' (model, "
                    "runtime facts, the self-check and eval prompts' token ids, answer span)",
                    naming="flat", saved=False),
               Part("calibration/directions/steer/{dataset}__{id}.json", "direction steering",
                    "record", "JSON key 'signature' (model, runtime facts, verdict replies, "
                    "layer, the added vectors' digest, the eval prompt's token ids)",
                    naming="flat")),
        tables=("calibration/summary.json", "calibration/records.jsonl"),
        summaries={"calibration/summary.json": "calibration_summary.json"},
        figures=("figures/calibration_*.png",)),
    StageSpec(
        name="pairwise",
        model_needs=frozenset({"attention", "activations", "weights"}),
        folder="pairwise", needs=(_RECORDS,),
        help="Pairwise judge with order swap: position consistency, content and position "
             "terms, and the heads that carry the order.",
        parts=(Part("pairwise/parts/{dataset}__{id}.json", "pairwise parts", "record",
                    "JSON key 'signature' (model, runtime facts, letter replies, both orders' "
                    "token ids, band)", naming="flat"),),
        tables=("pairwise/summary.json", "pairwise/pairs.jsonl"),
        summaries={"pairwise/summary.json": "pairwise_summary.json"},
        figures=("figures/pairwise_*.png",)),
    StageSpec(
        name="record",
        model_needs=frozenset({"attention", "activations"}),
        folder="record", needs=(_RECORDS,),
        help="Full attention patterns, residual streams and head outputs of every prompt, on "
             "disk.",
        parts=(Part("record/{dataset}/{id}/index.json", "recorded prompts", "record",
                    "JSON key 'signature' (model, settings, prompts' token ids); the shards it "
                    "names lie in its folder"),),
        tables=("record/index.json", "record/index.parquet", "record/span_to_span.json"),
        summaries={"record/span_to_span.json": "record_span_to_span.json"},
        figures=("figures/record_span_to_span.png",), tables_only="write_tables",
        parts_only="record"),
    StageSpec(
        name="audit",
        model_needs=frozenset({"attention"}), judged_input=True,
        folder="audit", needs=(_RECORDS,),
        help="Did the judge read? Attention on context/candidate per verdict, AUCs, flagged "
             "verdicts.",
        tables=("audit/summary.json", "audit/verdicts.parquet", "audit/verdicts.csv",
                "audit/flagged.parquet", "audit/flagged.csv", "audit/flagged.md"),
        summaries={"audit/summary.json": "audit_summary.json"},
        figures=("figures/audit_roc.png",), tables_only="write_audit"),
    StageSpec(
        name="reasoning",
        model_needs=frozenset({"generate", "judge", "attention"}),
        folder="reasoning", needs=(_RECORDS,),
        help="A reasoning judge on the run's answers, side by side with its one-word judge.",
        parts=(Part("reasoning/records.jsonl", "reasoning judgments", "lines",
                    "each line's 'judge_signature' (model, sha256, template, budget, the "
                    "record's answer and prompt)", unit="lines"),
               Part("reasoning/attention/{dataset}/{id}.safetensors", "reasoning span masses",
                    "record", "its record's 'judge_signature' in reasoning/records.jsonl")),
        tables=("reasoning/side_by_side.json", "reasoning/side_by_side.md"),
        summaries={"reasoning/side_by_side.json": "reasoning_side_by_side.json"},
        figures=("figures/reasoning_side_by_side.png",)),
)
"""Every stage, in the order ``interp run`` runs them (``asymmetry`` first)."""


def spec(name: str) -> StageSpec:
    """The stage called ``name`` (its ``name`` or its ``command``).

    Raises:
        ConfigError: no stage has that name (the message lists the names).
    """
    for s in SPECS:
        if name in s.names:
            return s
    raise ConfigError(f"unknown stage {name!r}; stages: {', '.join(stage_names())}")


def stage_of(module: str) -> StageSpec:
    """The stage whose code is ``module`` (a stage module sets ``SPEC`` by its own name).

    A stage module states none of its contract's facts again; it reads them from its entry.

    Raises:
        KeyError: no stage is declared with that module.
    """
    for s in SPECS:
        if s.module == module:
            return s
    raise KeyError(f"no stage in interp.core.contract.SPECS has the module {module}")


def stage_names() -> list[str]:
    """Every stage's ``name``, in run order."""
    return [s.name for s in SPECS]


def check_module(s: StageSpec) -> None:
    """Check that a stage module follows the contract (``run`` and ``format_summary``).

    Raises:
        TypeError: ``run``'s parameters are not :data:`RUN_ARGS` (``overwrite`` and ``log``
            keyword-only), or a declared function is missing.
    """
    mod = s.load()
    params = list(inspect.signature(mod.run).parameters.values())
    names = tuple(p.name for p in params)
    kw_only = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    if names[:len(RUN_ARGS)] != RUN_ARGS or kw_only[:2] != ["overwrite", "log"]:
        raise TypeError(f"{s.module}.run{inspect.signature(mod.run)} is not "
                        f"run(run_dir, handle, cfg, *, overwrite, log)")
    for fn in ("format_summary", s.tables_only):
        if fn and not callable(getattr(mod, fn, None)):
            raise TypeError(f"{s.module} has no function {fn}")
    if not hasattr(mod, s.config):
        raise TypeError(f"{s.module} has no config class {s.config}")


def check_needs(run_dir: str | Path, stages: Iterable[tuple[str, Any]], *,
                before: Iterable[str] = (), in_config: bool = False) -> None:
    """Refuse a stage whose declared needs (:class:`Need`) nothing provides, before any work.

    A need is met when its file exists in ``run_dir``, or when its stage runs earlier in this
    same call (``before``, or an earlier entry of ``stages``).

    Args:
        run_dir: the run directory.
        stages: ``(name, config)`` of the stages to run, in run order.
        before: stages that run before all of them in this call (``asymmetry``).
        in_config: the stages come from an experiment config (the message then also offers
            adding the needed stage's table).

    Raises:
        RunDirError: one line naming the stage, the setting that needs the file, the file and
            what to do.
    """
    done = set(before)
    for name, cfg in stages:
        s = spec(name)
        for need in s.needs:
            if need.stage in done or not need.applies(cfg) or (Path(run_dir) / need.path).exists():
                continue
            why = (f"[{s.name}] {need.when[0]} = {getattr(cfg, need.when[0])!r}" if need.when
                   else f"[{s.name}]")
            first = spec(need.stage)
            raise RunDirError(f"{why} needs {Path(run_dir) / need.path}, which the "
                              f"{first.name} stage writes: run `interp {first.command} "
                              f"{'--out' if not first.needs_run else '--run'} {run_dir}` first"
                              + (f" or add an [{first.name}] table" if in_config else ""))
        done.add(s.name)


def _count(part: Part, files: list[Path]) -> int:
    if part.unit == "files":
        return len(files)
    return sum(sum(1 for line in p.read_bytes().split(b"\n") if line.strip())
               for p in files)  # bytes split on "\n": a torn tail or U+2028 cannot miscount


def kept_work(paths: Mapping[str, Path] | Iterable[Path]) -> str:
    """What finished work lies in run directories, as text (``"12 records in runs/x"``).

    :func:`kept_runs` joined by ``"; "``; ``"nothing"`` when no run directory holds any.
    """
    return "; ".join(kept_runs(paths)) or "nothing"


def kept_runs(paths: Mapping[str, Path] | Iterable[Path]) -> list[str]:
    """What finished work each run directory keeps, one text per directory.

    Counts every stage's declared parts (:class:`Part`): ``"12 records, 12 attention
    recordings in runs/x"``. A grid folder (``interp run --out``: one run directory per model,
    no manifest of its own) is counted in each of its model folders. A run directory (it has a
    manifest) that keeps no part yet is listed as ``"0 records in DIR"``, so that every model
    of a grid is named; a folder without a manifest that keeps nothing is left out.
    """
    out: list[str] = []
    roots = [Path(r) for r in (paths.values() if isinstance(paths, Mapping) else paths)]
    runs = [run for r in roots for run in (
        [r] if (r / "manifest.json").exists()
        else sorted(p.parent for p in r.glob("*/manifest.json")) or [r])]
    for root in dict.fromkeys(runs):
        found = [f"{n} {p.label}" for p in _parts() if (n := _count(p, p.files(root)))]
        if found or (root / "manifest.json").exists():
            out.append(f"{', '.join(found) or '0 records'} in {root}")
    return out


def _parts() -> Iterator[Part]:
    for s in SPECS:
        yield from s.parts
