"""Every stage's config class, in one module that imports no torch, transformers or numpy.

A config is built and checked (unknown keys with the nearest known one, counts, choices,
layer and placement syntax) before its stage's module, and the libraries that module needs,
are imported: ``interp --help``, each command's ``--help`` and every one-line error of a
config or an option come without the seconds torch and transformers take to import. Each
stage module re-exports its class (``interp.stages.steering.SteeringConfig``); the transfer
stage's lives in :mod:`interp.stages.transfer.config`. The checks of a config against the run it
reads (:func:`check_against_shape`, :func:`check_run`: layers, needed files, records) live here
too, so their one-line errors also come before those libraries.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interp.core.capabilities import is_served
from interp.core.errors import (
    AttentionError,
    CalibrationError,
    ConfigError,
    DataError,
    InterpError,
    LayerSpecError,
    LensError,
    PairwiseError,
    PatchingError,
    ProbeError,
    SteeringError,
)
from interp.core.layers import DEFAULT_BAND, band_note, parse_layers
from interp.core.options import (
    check_counts,
    config_from_table,
    fields_of_kind,
    option,
    split_list,
)
from interp.core.vocab import (
    ALPHAS,
    ATTENTION_BACKENDS,
    DEFAULT_MODEL,
    DETECTOR_FEATURES,
    EXACT_MODES,
    MAX_REASONING_TOKENS,
    MIN_GAP,
    PAIR_KINDS,
    POOLS,
    PROBES,
)
from interp.launch import parse_shard

__all__ = ["ASYMMETRY_KEY_FIELDS", "DTYPE_NAMES", "KEYS", "POSITIONS", "SWEEP_KINDS", "TASKS",
           "WHAT",
           "AsymmetryConfig", "AttentionConfig", "AuditConfig", "CalibrationConfig",
           "LensConfig", "PairwiseConfig",
           "PatchingConfig",
           "ProbeConfig", "ReasoningConfig", "RecordConfig", "SteeringConfig",
           "check_against_shape", "check_run"]

TASKS = ("eval", "gen")
"""The two prompts a stage can read: the judge's (``eval``) and the generator's (``gen``)."""
KEYS = ("context", "control")
"""Steering's key sets: the context, and as many non-context keys (the control)."""
SWEEP_KINDS = ("resid", "heads", "attribution")
"""Patching sweeps: residual stream per layer, every head, attribution patching."""
WHAT = ("attention", "resid", "z")
"""What ``interp record`` can store: attention patterns, residual streams, head outputs."""
POSITIONS = ("all", "last", "spans")
"""The query positions ``interp record`` keeps."""
DTYPE_NAMES = ("float16", "bfloat16", "float32")
"""The storage dtypes of ``interp record``."""
ASYMMETRY_KEY_FIELDS = ("model", "template", "templates_path", "oracle", "include_unanswerable",
                        "split", "max_new_tokens", "verdict_max_new_tokens", "dtype", "from_hub",
                        "answers_from")
"""Config fields that must match to reuse a run directory (others may change freely)."""


@dataclass
class AsymmetryConfig:
    """Configuration of one asymmetry run (one model, one or more datasets).

    Attributes:
        model: model spec (:func:`interp.models.loading.load_model`).
        datasets: dataset names (``squad_v2``, ``drop``, ``hotpotqa``, ``musique``) or paths.
        limit: examples per dataset (first N after filtering; all or None: every one), or a table
            ``{dataset: N}`` (a dataset it does not name gets all its examples; e.g. a small
            grid that keeps the ~3k-token MuSiQue prompts few).
        template: template variant name; ``templates_path`` a TOML file of variants.
        templates_path: a TOML file of template variants (None: the bundled ones).
        oracle: ``"rule"``, ``"model:SPEC"`` (an LLM oracle) or ``"openai:MODEL"`` (an LLM
            oracle behind an OpenAI-compatible endpoint, docs/endpoints.md).
        include_unanswerable: keep SQuAD 2.0 unanswerable questions (abstaining is correct).
        split: dataset split.
        max_new_tokens: answer length cap (tokens).
        verdict_max_new_tokens: verdict length cap (tokens).
        max_reasoning_tokens: a reasoning judge's reply budget (tokens; only templates with
            ``judge = "reasoning"`` use it, :mod:`interp.judging.reasoning`).
        batch_size: prompts per forward pass.
        seed: seed of bootstrap resampling.
        device: where to run (default CUDA when available).
        dtype: precision (``float32``, ``bfloat16``, ...; default by device).
        device_map: a model larger than one device: ``auto``, ``balanced``, ``sequential``
            or a table module -> device (``0``, ``"cuda:1"``, ``"cpu"``, ``"disk"``),
            :func:`interp.models.loading.load_model` (on the command line a table is a JSON object
            or a ``.json`` file of one); recorded in the manifest, not a key field (it
            changes nothing but speed).
        max_memory: with ``device_map``: device -> memory (``{0 = "20GiB", cpu = "60GiB"}``;
            on the command line ``0=20GiB,cpu=60GiB``).
        offload_folder: with ``device_map``: the folder of modules mapped to ``"disk"``.
        shard: run shard ``I/N`` (``I`` from 0): its records only, into
            ``OUT/shards/I-of-N``; None: from torchrun/accelerate (``RANK``, ``WORLD_SIZE``)
            or a SLURM array, else unsharded (:func:`interp.launch.current_shard`).
        from_hub: read dataset names from the Hugging Face hub instead of the bundled files.
        n_boot: bootstrap resamples for CIs.
        one_pass: in the harness's own prefill forwards, also record what the attention and
            probe stages read: the exact last-token attention rows (saved as span masses,
            ``DIR/attention/records/``) and the pooled ``resid_post`` of every layer
            (``DIR/probes/features_{gen,eval}.safetensors``), under those stages' own
            signatures, so ``interp attention`` / ``interp probe`` afterwards run no model
            forward (unless another backend or ``recompute`` is asked for). Costs no
            measurable harness time (SmolLM2, 16 SQuAD records: 20.1 examples per CPU-minute
            with and without) and ``n_layers x d_model x 5`` floats per prompt on disk.
            False: the stages compute them with their own forwards.
        chunk_batches: batches per chunk of examples: a chunk's prompts are sorted by length
            into batches and its records are appended together. 1 (default): records are saved
            after every batch, but the sort only orders one batch; 4: less padding (SmolLM2,
            32 SQuAD records: 19.4 instead of 15.8 examples per CPU-minute), and a kill loses
            up to 4 batches.
        answers_from: a finished run directory whose answers this model judges instead of
            generating its own (cross-judging, :mod:`interp.methods.cross_judge`): the same records,
            template and oracle as that run, its oracle labels, and every record names its
            ``answer_source``. None: self-evaluation.
        model_endpoint: for ``model = "openai:MODEL"``: ``base_url``, ``api_key_env``,
            ``concurrency``, ``timeout_s``, ``max_retries``, ``max_error_rate``, ``seed``
            (:class:`interp.endpoints.EndpointConfig`; None: defaults and the environment).
        oracle_endpoint: the same table for ``oracle = "openai:MODEL"`` (both tables are
            config keys only; on the command line the base URL comes from
            ``$INTERP_OPENAI_BASE_URL`` or ``$OPENAI_BASE_URL``).
        timeout_s: seconds one try of a request to a served model or oracle may take, reply
            included (``--timeout-s``; given, it replaces both tables' ``timeout_s``; None:
            theirs, default 60). A slow server under load needs more; no result depends on it.
    """

    model: str = DEFAULT_MODEL
    datasets: list[str] = option(["squad_v2"], flag="dataset", short="d")
    limit: int | dict[str, int] | None = option(None, kind="count")
    template: str = "default"
    templates_path: str | None = None
    oracle: str = "rule"
    include_unanswerable: bool = False
    split: str = "validation"
    max_new_tokens: int = option(48, kind="count")
    verdict_max_new_tokens: int = option(12, kind="count")
    max_reasoning_tokens: int = option(MAX_REASONING_TOKENS, kind="count")
    batch_size: int = option(8, kind="count")
    seed: int = 0
    device: str | None = None
    dtype: str | None = None
    device_map: str | dict[str, Any] | None = None
    max_memory: dict[str, Any] | str | None = None
    offload_folder: str | None = None
    shard: str | None = None
    from_hub: bool = False
    n_boot: int = option(2000, kind="count")
    one_pass: bool = True
    chunk_batches: int = 1
    model_endpoint: dict[str, Any] | None = option(None, cli=False)
    oracle_endpoint: dict[str, Any] | None = option(None, cli=False)
    timeout_s: float | None = None
    answers_from: str | None = None

    def __post_init__(self) -> None:
        self.device_map, self.max_memory = _placement_text(self.device_map, self.max_memory)
        if self.shard is not None:
            parse_shard(self.shard)  # a malformed I/N is refused with the config
        try:
            if (self.device_map, self.max_memory, self.offload_folder) != (None, None, None):
                from interp.models.loading import check_device_map

                check_device_map(self.device_map, self.max_memory, self.offload_folder)
        except InterpError as err:
            raise ConfigError(f"[asymmetry] {err}") from None
        if isinstance(self.chunk_batches, bool) or not isinstance(self.chunk_batches, int) or \
                self.chunk_batches < 1:
            raise ConfigError(f"[asymmetry] chunk_batches must be a whole number >= 1, not "
                              f"{self.chunk_batches!r}")
        if isinstance(self.limit, Mapping) and (bad := set(self.limit) - set(self.datasets)):
            raise ConfigError(f"limit names datasets {sorted(bad)} that are not in datasets "
                              f"{self.datasets}")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> AsymmetryConfig:
        """Build from a mapping, refusing unknown keys (the error lists the known ones).

        Raises:
            interp.core.errors.ConfigError: an unknown key, or a ``limit`` table naming a dataset
                that is not in ``datasets``.
        """
        return config_from_table(cls, d, "asymmetry")

    def endpoint_table(self, which: str) -> dict[str, Any] | None:
        """The ``model`` or ``oracle`` endpoint table, with ``timeout_s`` when one is given.

        Args:
            which: ``"model"`` or ``"oracle"``.

        Returns:
            The table (:class:`interp.endpoints.EndpointConfig`'s fields), or None.
        """
        table = self.model_endpoint if which == "model" else self.oracle_endpoint
        if self.timeout_s is None:
            return table
        return {**(table or {}), "timeout_s": self.timeout_s}

    def check_inputs(self) -> dict[str, list[Any]]:
        """Check the config and load its examples, before any model or heavy library loads.

        :func:`interp.stages.asymmetry.check_inputs` (step 0 of Study 1) documents the
        checks, the return value and the errors raised.
        """
        from interp.data import load_examples
        from interp.judging.grading import parse_oracle_spec
        from interp.judging.prompts import get_template

        config = self
        check_counts(config, "asymmetry")
        if not config.datasets:
            raise ConfigError("no dataset given: pass --dataset squad_v2 (or a JSONL file)")
        parse_oracle_spec(config.oracle)
        if config.timeout_s is not None and not (isinstance(config.timeout_s, int | float)
                                                 and config.timeout_s > 0):
            raise ConfigError(f"--timeout-s ([asymmetry] timeout_s) must be a number of seconds "
                              f"> 0, not {config.timeout_s!r}")
        for model_spec, table, where in (
                (config.model, config.endpoint_table("model"), "model_endpoint"),
                (config.oracle, config.endpoint_table("oracle"), "oracle_endpoint")):
            if is_served(model_spec):
                from interp.endpoints import EndpointConfig

                EndpointConfig.from_spec(model_spec, table, f"asymmetry.{where}")
        get_template(config.template, config.templates_path)
        loaded = {}
        for ds in config.datasets:
            n = config.limit.get(ds) if isinstance(config.limit, Mapping) else config.limit
            loaded[ds] = load_examples(ds, split=config.split, limit=n,
                                       include_unanswerable=config.include_unanswerable,
                                       from_hub=config.from_hub)
            if not loaded[ds]:
                raise DataError(f"{ds}: no examples to run (every example is unanswerable? pass "
                                f"--include-unanswerable to keep them)")
        if config.answers_from:
            from interp.methods.cross_judge import check_answer_source, load_answer_source

            check_answer_source(load_answer_source(config.answers_from), loaded,
                                template=config.template, templates_path=config.templates_path,
                                oracle=config.oracle)
        return loaded


def _placement_text(device_map: Any, max_memory: Any) -> tuple[Any, Any]:
    """The command line's text forms of ``device_map`` and ``max_memory`` as config values.

    ``--device-map`` is a strategy, a JSON object or a ``.json`` file of one;
    ``--max-memory`` is ``DEVICE=SIZE,...`` (``0=20GiB,cpu=60GiB``). Other values pass as
    they are.

    Raises:
        ConfigError: malformed JSON, a missing file, or a memory entry without ``=``.
    """
    if isinstance(device_map, str) and device_map.strip().startswith("{"):
        try:
            device_map = json.loads(device_map)
        except json.JSONDecodeError as err:
            raise ConfigError(f"--device-map is not a JSON object ({err})") from None
    elif isinstance(device_map, str) and device_map.endswith(".json"):
        if not Path(device_map).is_file():
            raise ConfigError(f"--device-map {device_map}: no such file")
        device_map = json.loads(Path(device_map).read_text(encoding="utf-8"))
    if isinstance(max_memory, str):
        if bad := [x for x in max_memory.split(",") if "=" not in x]:
            raise ConfigError(f"--max-memory {bad[0]!r}: use DEVICE=SIZE, e.g. 0=20GiB,cpu=60GiB")
        max_memory = dict(x.strip().split("=", 1) for x in max_memory.split(","))
    return device_map, max_memory


@dataclass
class AttentionConfig:
    """Settings of the attention stage (``[attention]`` table of a config).

    Attributes:
        backend: one of :data:`interp.hooks.recorder.BACKENDS` (``hf`` default).
        band: band for the summary and head ranking (:func:`interp.core.layers.parse_layers`:
            ``last8``, ``24-31``, ``all``).
        limit: records per dataset (first N ok records; all or None: every one).
        save_rows: keep every record's rows ``[n_layers, n_heads, pos]``.
        save_resid: layer spec whose residual streams / head outputs to save (None: none).
        save_patterns: with ``save_resid``, also save full patterns of those layers.
        n_boot: bootstrap resamples for CIs.
        seed: seed of the bootstrap resamples.
        figures: draw the figures into ``DIR/figures``.
        top: heads listed per ranking in ``DIR/attention/heads.json``.
        recompute: record every selected record again, even when a fresh recording exists
            (e.g. the one the harness made in its one pass).
        progress: show a progress bar while recording.
    """

    backend: str = "hf"
    band: str = option(DEFAULT_BAND, kind="layers", was="layers")
    limit: int | None = option(None, kind="count")
    save_rows: bool = False
    save_resid: str | None = option(None, kind="layers")
    save_patterns: bool = False
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True
    top: int = option(10, kind="count")
    recompute: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if self.backend not in ATTENTION_BACKENDS:
            raise AttentionError(f"unknown backend {self.backend!r}; use one of "
                                 f"{list(ATTENTION_BACKENDS)}")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> AttentionConfig:
        """Build from a config table.

        Raises:
            interp.core.errors.ConfigError: unknown keys (the message lists the known ones).
            AttentionError: an unknown backend.
        """
        return config_from_table(cls, d, "attention")


@dataclass
class AuditConfig:
    """Settings of ``interp audit`` and of the ``[audit]`` stage of ``interp run``.

    Attributes:
        band: layers of the band means (:func:`interp.core.layers.parse_layers`; paper: the last 8).
        detector_layers: layers whose heads feed the detector (``all`` by default).
        detector_features: per-head features of the detector
            (:data:`interp.methods.audit.DETECTOR_FEATURES`; Lookback Lens uses the ratio alone).
        folds: k of the passage-grouped CV of the detector (fewer when a class has fewer
            passages; none below 2).
        fpr: the false-positive rate (share of RIGHT verdicts flagged) the flags are set at.
        C: inverse L2 strength of the detector's logistic regression.
        limit: first N ok records per dataset (None: all).
        n_boot: bootstrap resamples of passages for the AUC CIs.
        seed: seed of the folds and the bootstrap.
        figures: draw ``DIR/figures/audit_roc.png``.
    """

    band: str = option(DEFAULT_BAND, kind="layers")
    detector_layers: str = option("all", kind="layers")
    detector_features: list[str] = field(default_factory=lambda: ["lookback_ratio"])
    folds: int = 5
    fpr: float = 0.1
    C: float = 1.0
    limit: int | None = option(None, kind="count")
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.detector_features, str):
            self.detector_features = [f.strip() for f in self.detector_features.split(",")
                                      if f.strip()]
        if bad := [f for f in self.detector_features if f not in DETECTOR_FEATURES]:
            raise ConfigError(f"[audit] detector_features {bad}: choose from "
                              f"{list(DETECTOR_FEATURES)}")
        if not self.detector_features:
            raise ConfigError("[audit] detector_features is empty")
        if not 0.0 < float(self.fpr) < 1.0:
            raise ConfigError(f"[audit] fpr must lie strictly between 0 and 1, not {self.fpr}")
        if self.folds < 2:
            raise ConfigError(f"[audit] folds must be >= 2, not {self.folds}")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> AuditConfig:
        """Build from a config table, refusing unknown keys (the error lists the known ones).

        Raises:
            interp.core.errors.ConfigError: an unknown key or a value out of range.
        """
        return config_from_table(cls, d, "audit")

    def check(self, n_layers: int, n_heads: int | None = None) -> None:
        """Refuse detector layers outside the model (``band`` is checked as a layer field).

        Raises:
            interp.core.errors.LayerSpecError: ``detector_layers`` outside ``n_layers``.
        """
        parse_layers(self.detector_layers, n_layers, default="all")


@dataclass
class LensConfig:
    """Settings of ``interp lens`` / the ``[lens]`` config table.

    Attributes:
        limit: records per dataset (None: every ok record; each costs three forwards).
        max_tokens: leave out records whose longer prompt has more tokens, before ``limit``.
        band: the layers whose heads and MLPs the attribution summary ranks
            (:func:`interp.core.layers.parse_layers`; default the attention band ``last8``).
        tuned: train and read a tuned lens beside the logit lens.
        train_datasets: datasets whose bundled train split trains the tuned lens.
        train_limit: train-split examples per dataset.
        train_positions: positions per training prompt (half the last ones, half drawn).
        heldout: share of the training passages held out for the KL evaluation (0 < x < 1).
        ridge: ridge penalty of the least-squares start (relative to the input's mean square).
        kl_steps: Adam steps on the tuned lens's KL objective after the start.
        kl_batch: positions per KL step.
        lr: Adam's learning rate.
        n_boot: passage-cluster bootstrap resamples.
        seed: seed of the position draws, the KL steps and the bootstrap.
        figures: draw the figures.
        progress: show progress bars.
    """

    limit: int | None = option(20, kind="count")
    max_tokens: int | None = option(None, kind="count")
    band: str | list[int] = option(DEFAULT_BAND, kind="layers")
    tuned: bool = True
    train_datasets: list[str] = field(default_factory=lambda: ["squad_v2", "hotpotqa",
                                                               "musique"])
    train_limit: int = option(24, kind="count")
    train_positions: int = option(16, kind="count")
    heldout: float = 0.25
    ridge: float = 1e-2
    kl_steps: int = option(40, kind="count")
    kl_batch: int = option(32, kind="count")
    lr: float = 1e-3
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True
    progress: bool = True

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> LensConfig:
        """Build from a config table, refusing unknown keys and values.

        Raises:
            ConfigError: unknown keys (lists the known ones).
            LensError: a bad value (:meth:`validate`).
        """
        cfg = config_from_table(cls, d, "lens")
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raises LensError on a bad held-out share, ridge, rate, sizes or dataset."""
        from interp.data.examples import DATASETS

        if not 0 < self.heldout < 1:
            raise LensError(f"heldout must lie strictly between 0 and 1, got {self.heldout}")
        if self.ridge < 0 or not self.lr > 0:
            raise LensError(f"ridge must be >= 0 and lr > 0, got ridge {self.ridge}, lr "
                            f"{self.lr}")
        if self.train_positions < 2 or self.kl_batch < 1 or self.train_limit < 2:
            raise LensError("train_positions >= 2, train_limit >= 2 and kl_batch >= 1 needed")
        if self.tuned and (bad := [d for d in self.train_datasets if d not in DATASETS]):
            from interp.core.names import did_you_mean

            raise LensError(f"unknown train dataset {bad[0]!r}{did_you_mean(bad[0], DATASETS)};"
                            f" known: {', '.join(DATASETS)}")


@dataclass
class CalibrationConfig:
    """Settings of ``interp calibration`` / the ``[calibration]`` config table.

    Attributes:
        limit: records per dataset (None: every ok record; each costs two prompt forwards, a
            short greedy verdict and a single-token forward per patched layer).
        max_tokens: leave out records whose longer prompt has more tokens, before ``limit``.
        folds: outer cross-validation folds of the probe (by passage).
        inner_folds: inner folds that choose the probe's layer on each outer training part.
        probe_layers: the probe's candidate layers (:func:`interp.core.layers.parse_layers`).
        C: the probe's inverse L2 regularisation.
        n_bins: ECE bins (both binnings, equal-mass and equal-width, are reported).
        patch: patch the generator conversation's state after the answer into the fresh
            judge's verdict position, by layer, and (the control) the state after the answer
            of the ok record before it in the run's records (the last one's for the first).
        patch_layers: the patched layers (``blocks.L.hook_resid_pre``).
        block: block the self-check verdict position's attention to the first position after
            the answer (and to the control position).
        max_new_tokens: cap of the self-check's greedy verdict.
        card: the calibration card, the self-check and the cache test (False: only the
            ``directions`` part, which needs neither).
        directions: also fit the generator's correctness direction at its answer tokens and
            the judge's verdict direction at its verdict position, their cosine, cross-decoding
            and the causal steering test (:mod:`interp.stages.calibration_directions`).
        direction_pool: the generator's states over its answer tokens: ``mean`` or ``last``.
        direction_norms: the steering norms, in multiples of the median norm of the judge's
            resid_post at the chosen layer (training records).
        direction_seeds: random directions of equal norm (the steering control).
        direction_perms: label permutations of the cosine's null (0: none).
        n_boot: passage-cluster bootstrap resamples.
        seed: seed of the folds and the bootstrap.
        figures: draw the figures.
        progress: show progress bars.
    """

    limit: int | None = option(150, kind="count")
    max_tokens: int | None = option(None, kind="count")
    folds: int = option(5, kind="count")
    inner_folds: int = option(3, kind="count")
    probe_layers: str | list[int] = option("all", kind="layers")
    C: float = 1.0
    n_bins: int = option(10, kind="count")
    patch: bool = True
    patch_layers: str | list[int] = option("all", kind="layers")
    block: bool = True
    max_new_tokens: int = option(12, kind="count")
    card: bool = True
    directions: bool = False
    direction_pool: str = "mean"
    direction_norms: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0])
    direction_seeds: int = option(3, kind="count")
    direction_perms: int = 50
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True
    progress: bool = True

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> CalibrationConfig:
        """Build from a config table, refusing unknown keys and values.

        Raises:
            ConfigError: unknown keys (lists the known ones).
            CalibrationError: a bad value (:meth:`validate`).
        """
        cfg = config_from_table(cls, d, "calibration")
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raises CalibrationError on too few folds or bins, or a C that is not > 0."""
        if self.folds < 2 or self.inner_folds < 2:
            raise CalibrationError(f"folds and inner_folds must be >= 2, got {self.folds} and "
                                   f"{self.inner_folds}")
        if self.n_bins < 2:
            raise CalibrationError(f"n_bins must be >= 2, got {self.n_bins}")
        if not self.C > 0:
            raise CalibrationError(f"C must be > 0, got {self.C}")
        if self.max_new_tokens < 1:
            raise CalibrationError("max_new_tokens must be >= 1")
        if self.direction_pool not in ("mean", "last"):
            raise CalibrationError(f"direction_pool must be 'mean' or 'last', got "
                                   f"{self.direction_pool!r}")
        if not self.direction_norms or not all(0 < float(x) < float("inf")
                                               for x in self.direction_norms):
            raise CalibrationError(f"direction_norms must be positive numbers, got "
                                   f"{self.direction_norms}")
        if self.direction_perms < 0:
            raise CalibrationError(f"direction_perms must be >= 0, got {self.direction_perms}")


@dataclass
class PairwiseConfig:
    """Settings of ``interp pairwise`` / the ``[pairwise]`` config table.

    Attributes:
        limit: pairs per dataset (None: every pair that builds; each costs about eight
            forwards and one patched sweep of the verdict position).
        max_tokens: leave out records whose eval prompt has more tokens, before ``limit``.
        sources: kinds of pair, in order per record: ``hard_negative`` (the patching stage's
            closed-book hard negatives, ``DIR/patching/hard_negatives.jsonl``) and ``model``
            (the model's own answer graded Incorrect).
        band: layers of the attention masses and of the attribution summary (default
            ``last8``).
        template: the pairwise template's name.
        templates_path: the TOML file of pairwise templates (None: the bundled
            ``templates/pairwise.toml``).
        top_k: heads chosen on the selection passages and tested on the others.
        batch_size: patched rows per forward.
        behaviour_only: measure the behaviour alone (both orders' scores, the outcomes,
            content and position terms: one forward per order,
            :func:`interp.methods.pairwise.score_orders`) and skip patching, attribution,
            attention and the lens.
        n_boot: passage-cluster bootstrap resamples.
        seed: seed of the bootstrap.
        figures: draw the figures.
        progress: show progress bars.
    """

    limit: int | None = option(60, kind="count")
    max_tokens: int | None = option(None, kind="count")
    sources: list[str] = field(default_factory=lambda: ["hard_negative", "model"])
    band: str | list[int] = option(DEFAULT_BAND, kind="layers")
    template: str = "pairwise"
    templates_path: str | None = None
    top_k: int = option(5, kind="count")
    batch_size: int = option(16, kind="count")
    behaviour_only: bool = False
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True
    progress: bool = True

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> PairwiseConfig:
        """Build from a config table, refusing unknown keys and values.

        Raises:
            ConfigError: unknown keys (lists the known ones).
            PairwiseError: a bad value (:meth:`validate`).
        """
        cfg = config_from_table(cls, d, "pairwise")
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Refuse a bad setting before any model work.

        Raises:
            PairwiseError: an unknown or empty ``sources``, a missing ``templates_path``.
            PromptError: an unknown ``template``.
        """
        from interp.core.names import did_you_mean

        known = ("hard_negative", "model")
        if not self.sources:
            raise PairwiseError(f"sources is empty; use some of {list(known)}")
        if bad := [s for s in self.sources if s not in known]:
            raise PairwiseError(f"unknown pair source {bad[0]!r}{did_you_mean(bad[0], known)};"
                                f" use {list(known)}")
        if self.templates_path is not None and not Path(self.templates_path).is_file():
            raise PairwiseError(f"templates_path {self.templates_path!r} is not a file")
        from interp.judging.prompts import get_pairwise_template

        get_pairwise_template(self.template, self.templates_path)


@dataclass
class PatchingConfig:
    """Settings of ``interp patch`` / the ``[patching]`` config table.

    Attributes:
        pairs: pair kinds to run (:data:`interp.methods.pairs.PAIR_KINDS`).
        kinds: sweeps: ``resid``, ``heads``, ``attribution`` (AtP* against the full exact
            sweep of both, with agreement and cost).
        limit: built pairs per dataset (all or None: every one; each pair costs many forwards).
        limit_kept: ``limit`` counts kept pairs (``|gap| >= min_gap``) instead of built ones:
            each built pair is scored first (its clean and corrupt forwards, or a stored
            sweep's gap or ``DIR/patching/{pairs}/gaps.jsonl``), and one under ``min_gap`` is
            skipped (reason ``small_gap``, its gap listed) without a sweep, until ``limit``
            pairs per dataset are kept or the records run out.
        layers: layers to sweep, a spec of :func:`interp.core.layers.parse_layers` (None: all).
        layer_stride: sweep every k-th layer (after ``layers``).
        hook: residual hook point (``hook_resid_pre`` or ``hook_resid_post``).
        per_position: also sweep single positions (not only spans) in ``resid``.
        exact: ``topk`` (AtP*: attribution ranks every unit, the ``top_k`` are patched
            exactly) or ``all`` (every unit exactly).
        top_k: units patched exactly per pair and sweep with ``exact = "topk"``.
        min_gap: pairs whose ``|LD_clean - LD_corrupt|`` (nats) is below it are left out of
            the headline ratio of sums (and listed with their gaps).
        band: layers averaged for the judge's context attention mass.
        oracle: grades candidate-swap answers (None: the run's oracle; ``rule`` or
            ``model:SPEC``).
        mine: mine closed-book hard negatives for records without a wrong answer.
        equal_length: candidate-swap: prefer wrong answers with as many tokens as the gold
            (the model's own, a stored or a mined one; the miner samples on until one has the
            gold's length, else keeps its first), so the candidate span corresponds position
            by position and is measured as a unit; off: the first usable wrong answer.
        hard_negative_*: the miner's settings (as in the transfer study).
        seed: seeds the miner (per record) and the bootstrap.
        n_boot: cluster-bootstrap resamples for the summary's CIs.
        max_tokens: skip pairs longer than this (CPU time).
        batch_size: patched rows per forward.
        backend: ``hf`` (the sweeps need it; :func:`interp.methods.patching.patch` takes all three).
        prefix_cache: run the positions before the first patchable one once.
        figures: draw the figures after the tables.
        progress: show progress bars.
    """

    pairs: list[str] = field(default_factory=lambda: ["candidate-swap"])
    kinds: list[str] = option(["resid"], flag="kind")
    limit: int | None = option(5, kind="count")
    limit_kept: bool = False
    layers: str | list[int] | None = option(None, kind="layers")
    layer_stride: int = option(1, kind="count")
    hook: str = "hook_resid_pre"
    per_position: bool = True
    exact: str = "topk"
    top_k: int = option(16, kind="count")
    min_gap: float = MIN_GAP
    band: str | list[int] = option(DEFAULT_BAND, kind="layers")
    oracle: str | None = None
    mine: bool = True
    equal_length: bool = False
    hard_negative_template: str = "closed_book"
    hard_negative_attempts: int = option(5, kind="count")
    hard_negative_temperature: float = 0.7
    hard_negative_top_p: float = 0.9
    hard_negative_max_new_tokens: int = option(16, kind="count")
    hard_negative_max_words: int = 12
    seed: int = 0
    n_boot: int = option(1000, kind="count")
    max_tokens: int | None = option(1024, kind="count")
    batch_size: int = option(16, kind="count")
    backend: str = "hf"
    prefix_cache: bool = True
    figures: bool = True
    progress: bool = True

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> PatchingConfig:
        """Build from a mapping, refusing unknown keys and values (lists the known ones).

        Raises:
            ConfigError: unknown keys (the message lists the known ones).
            PatchingError: unknown pair kinds, sweep kinds, hooks, modes or backends.
        """
        cfg = config_from_table(cls, d, "patching")
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raises PatchingError on unknown kinds, hooks, modes, backends or bad numbers."""
        for p in self.pairs:
            if p not in PAIR_KINDS:
                raise PatchingError(f"unknown pair kind {p!r}; valid: {list(PAIR_KINDS)}")
        for k in self.kinds:
            if k not in SWEEP_KINDS:
                raise PatchingError(f"unknown kind {k!r}; valid: {list(SWEEP_KINDS)}")
        if self.hook not in ("hook_resid_pre", "hook_resid_post"):
            raise PatchingError(f"hook must be hook_resid_pre or hook_resid_post, not "
                                f"{self.hook!r}")
        if self.exact not in EXACT_MODES:
            raise PatchingError(f"exact must be one of {list(EXACT_MODES)}, not {self.exact!r}")
        if self.top_k < 1 or self.min_gap < 0 or self.batch_size < 1:
            raise PatchingError(f"top_k and batch_size must be >= 1 and min_gap >= 0, got "
                                f"{self.top_k}, {self.batch_size}, {self.min_gap}")
        if self.backend != "hf":
            raise PatchingError("sweeps run on the hf backend (use patch() for the others)")

    def layer_list(self, n_layers: int) -> list[int]:
        """The swept layers.

        Raises:
            LayerSpecError: a bad spec or a layer out of range (names the valid range).
        """
        layers = parse_layers(self.layers, n_layers, default="all")
        return layers[:: max(1, self.layer_stride)]


@dataclass
class ProbeConfig:
    """Settings of ``interp probe`` and of the ``[probe]`` stage of ``interp run``.

    Attributes:
        folds: k of the stratified k-fold cross-validation.
        layers: layers to probe (:func:`interp.core.layers.parse_layers`: ``last8``, ``0,8,12-20``,
            a list; None: all); features are always cached for all layers.
        probes: probe kinds, the first sweeps the whole (layer, pool) grid.
        pools: poolings (``candidate`` is skipped for the gen prompt).
        tasks: prompts to probe: ``eval`` (judge prompt) and/or ``gen`` (generation prompt).
        batch_size: prompts per forward pass (left-padded).
        seed: seed of the folds and of the MLP.
        select_by: ``auc`` or ``f1``: the CV metric that picks the best layer and pooling.
        top_k: (layer, pool) cells, best first by the first probe, at which the other probes run.
        sweep_all: run every probe on every cell instead.
        C: inverse L2 strength of logreg and svm (on standardised features).
        mlp_hidden: hidden units of the one-hidden-layer MLP.
        mlp_alpha: L2 penalty of the MLP.
        transfer_min_per_class: fewest examples of each class a dataset needs to take part in
            the cross-dataset transfer table.
        limit: use only the first N ok records of each dataset (all or None: every one); the
            cost is about two forward passes per record (eval + gen prompt).
        permutations: label permutations for the selection-aware null of the best cell
            (:func:`interp.methods.probing.permutation_null`; 0 = off); each costs one sweep of the
            first probe.
        recompute: compute the features again even when cached (e.g. by the harness's one
            pass).
        n_jobs: processes that cross-validate the (layer, pool) cells at once, in the sweep
            and in every permutation of the null (:func:`interp.methods.probing.sweep`); the results
            are those of one process, so stored sweeps and permutations stay valid.
        permute_within: ``dataset`` permutes the null's labels within each dataset
            (:func:`interp.methods.probing.permutation_null` ``strata``): the null then keeps each
            dataset's base rate, which a probe can read off the prompt; None: across all
            records.
        n_boot: passage-cluster bootstrap resamples of the paired probe-vs-judge AUC CIs
            (:func:`interp.methods.probing.probe_vs_judge`; 0: none); not part of the sweep's
            signature.
    """

    folds: int = 5
    layers: str | list[int] | None = option(None, kind="layers")
    probes: list[str] = field(default_factory=lambda: list(PROBES))
    pools: list[str] = field(default_factory=lambda: list(POOLS))
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    batch_size: int = option(4, kind="count")
    seed: int = 0
    select_by: str = "auc"
    top_k: int = option(5, kind="count")
    sweep_all: bool = False
    C: float = 1.0
    mlp_hidden: int = option(64, kind="count")
    mlp_alpha: float = 1e-2
    transfer_min_per_class: int = 2
    limit: int | None = option(None, kind="count")
    permutations: int = 0
    recompute: bool = False
    n_jobs: int = option(1, kind="count")
    n_boot: int = option(2000, kind="count")
    permute_within: str | None = None

    def __post_init__(self) -> None:
        self.probes, self.pools, self.tasks = (split_list(self.probes), split_list(self.pools),
                                               split_list(self.tasks))
        for name, vals, known in (("probe", self.probes, PROBES), ("pool", self.pools, POOLS),
                                  ("task", self.tasks, TASKS)):
            if not vals:
                raise ProbeError(f"no {name}s given; choose from {list(known)}")
            if bad := [v for v in vals if v not in known]:
                raise ProbeError(f"unknown {name}(s) {bad}; known: {list(known)}")
        if self.layers is not None:  # the grammar now; the range against the model at run time
            parse_layers(self.layers, 1 << 20)
        if self.permute_within not in (None, "dataset"):
            raise ProbeError(f"permute_within must be 'dataset' or absent, not "
                             f"{self.permute_within!r}")
        if self.select_by not in ("auc", "f1"):
            raise ProbeError(f"select_by must be 'auc' or 'f1', not {self.select_by!r}")
        if self.folds < 2:
            raise ProbeError(f"folds must be >= 2, not {self.folds}")
        if self.batch_size < 1:
            raise ProbeError("batch_size must be >= 1")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> ProbeConfig:
        """Build from a config table, refusing unknown keys (the error lists the known ones).

        Raises:
            interp.core.errors.ConfigError: an unknown key.
        """
        return config_from_table(cls, d, "probe")

    def fit_kw(self) -> dict[str, Any]:
        """Keyword arguments of :func:`interp.methods.probing.fit_probe`."""
        return {"C": self.C, "mlp_hidden": self.mlp_hidden, "mlp_alpha": self.mlp_alpha,
                "seed": self.seed}


@dataclass
class ReasoningConfig:
    """Settings of the reasoning-judge stage (``[reasoning]`` table of a config).

    Attributes:
        template: the reasoning judge's template variant (``judge = "reasoning"``).
        templates_path: a TOML file of variants (None: the bundled ones).
        limit: records per dataset (first N ok records; None for all).
        max_reasoning_tokens: token budget of a reasoning reply (:mod:`interp.judging.reasoning`).
        batch_size: prompts per forward (and records per saved chunk).
        band: band of the span-mass means (:func:`interp.core.layers.parse_layers`).
        reasoning_attention: also record the attention while reasoning (one more forward
            per record with full patterns).
        n_boot: bootstrap resamples for CIs.
        seed: bootstrap seed.
        figures: draw the figure into ``DIR/figures``.
    """

    template: str = "reasoning"
    templates_path: str | None = None
    limit: int | None = option(None, kind="count")
    max_reasoning_tokens: int = option(MAX_REASONING_TOKENS, kind="count")
    batch_size: int = option(8, kind="count")
    band: str = option(DEFAULT_BAND, kind="layers", was="layers")
    reasoning_attention: bool = True
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> ReasoningConfig:
        """Build from a config table.

        Raises:
            interp.core.errors.ConfigError: unknown keys (the message lists the known ones).
        """
        return config_from_table(cls, d, "reasoning")


@dataclass
class RecordConfig:
    """Settings of ``interp record`` (``[record]`` table of a config).

    Attributes:
        what: any of ``attention`` (``attn.hook_pattern``), ``resid`` (``hook_resid_pre`` and
            ``hook_resid_post``), ``z`` (``attn.hook_z``); a list or a comma string.
        layers: layers to record (:func:`interp.core.layers.parse_layers`; default ``all``).
        positions: query rows / positions kept: ``all``, ``last`` or ``spans`` (module
            docstring, step 3). Span-to-span masses always use every query row.
        dtype: ``float16``, ``bfloat16`` or ``float32`` on disk.
        limit: records per dataset (first N ok records; all or None: every one).
        shard_mb: largest shard in MiB (a bigger tensor gets a shard of its own).
        band: layers of the span-to-span summary and figure (default the last eight; only
            recorded layers count, and all recorded layers when none of the band is).
        figures: draw ``figures/record_span_to_span.png``.
    """

    what: list[str] = field(default_factory=lambda: list(WHAT))
    layers: str = option("all", kind="layers")
    positions: str = "all"
    dtype: str = "float16"
    limit: int | None = option(None, kind="count")
    shard_mb: float = 512.0
    band: str = option(DEFAULT_BAND, kind="layers")
    figures: bool = True

    def __post_init__(self) -> None:
        self.what = split_list(self.what)
        if not self.what or set(self.what) - set(WHAT):
            raise ConfigError(f"record: what must be a non-empty subset of {list(WHAT)}, not "
                              f"{self.what}")
        if self.positions not in POSITIONS:
            raise ConfigError(f"record: positions must be one of {list(POSITIONS)}, not "
                              f"{self.positions!r}")
        if self.dtype not in DTYPE_NAMES:
            raise ConfigError(f"record: dtype must be one of {list(DTYPE_NAMES)}, not "
                              f"{self.dtype!r}")
        if not self.shard_mb > 0:
            raise ConfigError(f"record: shard_mb must be > 0, not {self.shard_mb}")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> RecordConfig:
        """Build from a config table.

        Raises:
            ConfigError: unknown keys or invalid values (the message lists the valid ones).
        """
        return config_from_table(cls, d, "record")

    def settings(self, layers: Sequence[int]) -> dict[str, Any]:
        """What decides the recorded bytes (part of the signature)."""
        return {"what": sorted(self.what), "layers": list(layers), "positions": self.positions,
                "dtype": self.dtype, "shard_mb": self.shard_mb}


@dataclass
class SteeringConfig:
    """Settings of ``interp steer`` / the ``[steering]`` config table.

    Attributes:
        alphas: attention factors on the context keys (each > 0; 1 = unsteered).
        band: the steered band (:func:`interp.core.layers.parse_layers`; default the attention
            band ``last8``); also the band of the context mass.
        heads: ``all``, ``top-diff:K`` (top gen-minus-eval heads of ``interp heads``) or
            ``L.H,L.H`` (:func:`interp.methods.steering.parse_heads`).
        tasks: ``eval`` (the judge) and/or ``gen`` (the generator).
        keys: the steered keys: ``context`` (the causal test) and/or ``control`` (as many
            non-context keys, :func:`interp.hooks.steering.control_keys`: does steering ANY
            keys move the verdict, or only the context's?).
        limit: records per dataset (all or None: every ok record; each costs a forward per alpha).
        per_label: ``limit`` records per dataset and oracle label y*, so that acceptance of
            oracle-correct and of oracle-incorrect answers are both measured where a dataset
            has both (:func:`interp.store.records.limit_per_dataset`).
        max_tokens: leave out records whose longer prompt has more tokens (CPU time; None:
            every length), before ``limit`` counts.
        max_new_tokens: length cap of the steered answers.
        oracle: grades the steered answers (None: the run's oracle).
        n_boot: passage-cluster bootstrap resamples.
        seed: bootstrap seed.
        figures: draw the figure.
        progress: show a progress bar.
    """

    alphas: list[float] = field(default_factory=lambda: list(ALPHAS))
    band: str | list[int] = option(DEFAULT_BAND, kind="layers", was="layers")
    heads: str = "all"
    tasks: list[str] = field(default_factory=lambda: ["eval", "gen"])
    keys: list[str] = field(default_factory=lambda: ["context"])
    limit: int | None = option(10, kind="count")
    per_label: bool = False
    max_tokens: int | None = option(None, kind="count")
    max_new_tokens: int = option(32, kind="count")
    oracle: str | None = None
    n_boot: int = option(1000, kind="count")
    seed: int = 0
    figures: bool = True
    progress: bool = True

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> SteeringConfig:
        """Build from a config table, refusing unknown keys and values.

        Raises:
            ConfigError: unknown keys (lists the known ones).
            SteeringError: bad alphas or tasks.
        """
        cfg = config_from_table(cls, d, "steering")
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raises SteeringError on alphas not > 0, no alpha 1, unknown tasks or keys."""
        if not self.alphas or any(not (a > 0 and math.isfinite(a)) for a in self.alphas):
            raise SteeringError(f"alphas must be finite numbers > 0, got {self.alphas}")
        if 1.0 not in [float(a) for a in self.alphas]:
            raise SteeringError("alphas must include 1 (the unsteered reference)")
        if not self.tasks or set(self.tasks) - set(TASKS):
            raise SteeringError(f"tasks must be among {list(TASKS)}, got {self.tasks}")
        if not self.keys or set(self.keys) - set(KEYS) or len(set(self.keys)) < len(self.keys):
            raise SteeringError(f"keys must be among {list(KEYS)} (each once), got {self.keys}")


    def check(self, n_layers: int, n_heads: int | None = None) -> None:
        """Check the band and an explicit head spec against a model's shape.

        ``top-diff:K`` needs the attention ranking; here only ``K`` is checked (an int >= 1).

        Raises:
            interp.core.errors.LayerSpecError: the band lies outside the model.
            SteeringError: an unparseable head spec, a head outside ``0..n_heads-1`` or a layer
                outside the model.
        """
        band = parse_layers(self.band, n_layers)
        from interp.methods.steering import parse_heads, top_diff_k

        s = self.heads.strip().lower()
        if s.startswith("top-diff:"):
            top_diff_k(self.heads)
        elif n_heads is not None:
            units = parse_heads(self.heads, band, n_heads)
            if bad := [x for x in units if not 0 <= x < n_layers]:
                raise SteeringError(f"heads on layers {bad}: valid layers 0..{n_layers - 1}")


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
            raise type(err)(f"[{name}]{on}: {err}" if model else f"[{name}] {err}") from None
    return notes


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
    from interp.core.contract import check_needs
    from interp.store.rundir import RunDir

    run = RunDir(run_dir)
    run.require_run()
    model = run.manifest().get("model") or {}
    if n_layers := model.get("n_layers"):
        check_against_shape(stage, cfg, int(n_layers), model.get("n_heads"))
    if needs:
        check_needs(run.path, [(stage, cfg)])
    if run.records_path.exists():
        run.read_records(status=None)
