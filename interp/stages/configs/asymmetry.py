"""Study 1's config (:class:`AsymmetryConfig`) and the fields that must match to reuse a run.

Light: it imports no torch, transformers or numpy, so the config is checked before the
stage's module loads (:mod:`interp.stages.configs`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interp.core.capabilities import is_served
from interp.core.errors import ConfigError, DataError, InterpError
from interp.core.options import StageConfig, check_counts, option
from interp.core.vocab import DEFAULT_MODEL, MAX_REASONING_TOKENS
from interp.data import load_examples
from interp.judging.answer_source import check_answer_source, load_answer_source
from interp.judging.grading import parse_oracle_spec
from interp.judging.prompts import get_template
from interp.launch import parse_shard
from interp.models.files import check_device_map

__all__ = ["ASYMMETRY_KEY_FIELDS", "AsymmetryConfig"]

ASYMMETRY_KEY_FIELDS = ("model", "template", "templates_path", "oracle", "include_unanswerable",
                        "split", "max_new_tokens", "verdict_max_new_tokens", "dtype", "from_hub",
                        "answers_from")
"""Config fields that must match to reuse a run directory (others may change freely)."""


@dataclass
class AsymmetryConfig(StageConfig):
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
        concurrency: examples of a served model (``model = "openai:MODEL"``) in flight at
            once, each its own requests in turn (``--concurrency``; given, it replaces the
            ``model_endpoint`` table's ``concurrency``; None: the table's, default 4). Match
            the server's slots (``interp serve --parallel N``); records come out in the same
            order whatever it is.
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
    concurrency: int | None = None
    answers_from: str | None = None

    def __post_init__(self) -> None:
        self.device_map, self.max_memory = _placement_text(self.device_map, self.max_memory)
        if self.shard is not None:
            parse_shard(self.shard)  # a malformed I/N is refused with the config
        try:
            if (self.device_map, self.max_memory, self.offload_folder) != (None, None, None):
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

    def endpoint_table(self, which: str) -> dict[str, Any] | None:
        """The ``model`` or ``oracle`` endpoint table with the command line's values in it.

        ``timeout_s`` replaces both tables' when given; ``concurrency`` the model's.

        Args:
            which: ``"model"`` or ``"oracle"``.

        Returns:
            The table (:class:`interp.endpoints.EndpointConfig`'s fields), or None.
        """
        table = self.model_endpoint if which == "model" else self.oracle_endpoint
        given = {k: v for k, v in (("timeout_s", self.timeout_s), ("concurrency",
                 self.concurrency if which == "model" else None)) if v is not None}
        return {**(table or {}), **given} if given else table

    def check_inputs(self) -> dict[str, list[Any]]:
        """Check the config and load its examples, before any model or heavy library loads.

        :func:`interp.stages.asymmetry.check_inputs` (step 0 of Study 1) documents the
        checks, the return value and the errors raised.
        """
        config = self
        check_counts(config, "asymmetry")
        if not config.datasets:
            raise ConfigError("no dataset given: pass --dataset squad_v2 (or a JSONL file)")
        parse_oracle_spec(config.oracle)
        if config.timeout_s is not None and not (isinstance(config.timeout_s, int | float)
                                                 and config.timeout_s > 0):
            raise ConfigError(f"--timeout-s ([asymmetry] timeout_s) must be a number of seconds "
                              f"> 0, not {config.timeout_s!r}")
        if config.concurrency is not None and (isinstance(config.concurrency, bool) or not
                                               isinstance(config.concurrency, int) or
                                               config.concurrency < 1):
            raise ConfigError(f"--concurrency ([asymmetry] concurrency) must be a whole number "
                              f">= 1, not {config.concurrency!r}")
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
