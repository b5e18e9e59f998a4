"""The transfer stage's config (:class:`TransferConfig`) and which of its fields redo what.

:mod:`interp.stages.transfer` runs Study 3 with it; :func:`interp.stages.transfer.reconcile_config`
compares a stored config with a new one field group by field group (:data:`KEY_FIELDS`,
:data:`EVAL_FIELDS`, :data:`PATCH_FIELDS`, :data:`SELECT_FIELDS`). Light: it imports no torch,
transformers or numpy, so ``interp transfer`` checks its options before the stage's package
loads (:mod:`interp.stages.configs`); ``interp.stages.transfer.TransferConfig`` is this class.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from interp.core.errors import StageError
from interp.core.names import did_you_mean
from interp.core.options import StageConfig, option, split_list

__all__ = ["ADAPTERS", "EVAL_FIELDS", "KEY_FIELDS", "PATCH_FIELDS", "SELECT_FIELDS",
           "TransferConfig"]

ADAPTERS = ("lora_gen", "lora_eval", "lora_both")
"""The three adapters of the paper (section 3.3), in the order the stage trains, evaluates
and tabulates them; :attr:`TransferConfig.adapters` chooses among them."""

KEY_FIELDS = ("model", "datasets", "template", "hard_negative_template", "oracle",
              "max_train_examples", "max_length", "hard_negative_attempts",
              "hard_negative_temperature", "hard_negative_top_p",
              "hard_negative_max_new_tokens", "hard_negative_max_words", "rank", "alpha",
              "dropout", "target_modules", "lora_layers", "lr", "epochs", "train_batch_size",
              "warmup_steps", "weight_decay", "seed", "lr_grid", "select_holdout")
"""Config fields whose change invalidates stored hard negatives, training sets or adapters.

``adapters`` is not one of them: each adapter's training set and training read only these
fields (the three sets are built together from the pool, each training seeds itself), so a
changed choice of adapters keeps every adapter already trained and trains only the new ones;
the evaluation and patching are stored per adapter, the table, summary and figures are
redrawn for the adapters chosen."""
EVAL_FIELDS = ("eval_limit", "max_new_tokens", "verdict_max_new_tokens", "judge_base_answers")
"""Config fields whose change redoes the evaluation (the adapters are kept)."""
PATCH_FIELDS = ("patch_examples", "patch_positions", "patch_layers")
"""Config fields whose change redoes the cross-model patching."""
SELECT_FIELDS = ("max_new_tokens", "verdict_max_new_tokens")
"""Config fields whose change redoes the held-out records of the learning-rate selection
(decoding; the adapters are kept) and so the choice."""


@dataclass
class TransferConfig(StageConfig):
    """Configuration of the transfer study (defaults: the CPU quickstart on the bundled model).

    Attributes:
        model: base model spec (used by the CLI when no handle is given).
        adapters: the adapters trained, evaluated, patched and tabulated, any of
            ``lora_gen``, ``lora_eval``, ``lora_both`` (default all three; e.g. ``lora_eval``
            alone). Each adapter's training does not depend on which others are chosen, so
            adding one later trains only it.
        datasets: datasets whose TRAIN split trains the adapters (pooled) and whose validation
            split evaluates them. Bundled train splits: ``squad_v2``, ``hotpotqa``, ``musique``.
        from_hub: read the dataset names' train and validation splits from the Hugging Face
            hub (:func:`interp.data.load_examples`) instead of the bundled files; the paper's
            setting (DROP has no bundled train split).
        eval_limit: validation records per dataset for the evaluation (first N answerable;
            all or None: every one).
        template: Study 1 template variant (training prompts AND evaluation).
        templates_path: TOML file of template variants (None: the bundled ``paper.toml``).
        hard_negative_template: variant whose gen prompt has no context (``closed_book``).
        oracle: ``"rule"`` or ``"model:SPEC"`` (:func:`interp.judging.grading.make_oracle`).
        max_train_examples: training items per adapter (= pool records; default 80).
        max_length: longest training sequence in tokens (prompt + target); records whose eval
            item would be longer are left out of the pool (default 512).
        hard_negative_attempts: sampled closed-book answers per record before the fallback (5).
        hard_negative_temperature, hard_negative_top_p: sampling settings (0.7, 0.9: a
            small model sampled at temperature 1 mostly rambles instead of hallucinating a
            plausible short answer).
        hard_negative_max_new_tokens: length cap of a closed-book answer (16).
        hard_negative_max_words: longer answers are rejected (12): a hard negative must look
            like an answer, not a sentence cut off at the token cap.
        rank, alpha, dropout: LoRA rank r, scaling alpha (update scaled by alpha / r) and
            dropout on the LoRA input (8, 16, 0.05).
        target_modules: module names that get LoRA (attention projections by default).
        lora_layers: decoder layers that get LoRA (None: all). Gradients then flow back only
            to the first of them, which cuts the backward pass on a CPU.
        lr: AdamW learning rate (5e-4; higher than the usual 2e-4 because the quickstart takes
            only ~20 steps); unused with ``lr_grid``.
        lr_grid: candidate learning rates (e.g. 1e-4,3e-4,1e-3): each adapter's rate is
            chosen on held-out training records (docs/stages.md, transfer); unset: train
            once at ``lr``.
        select_holdout: with ``lr_grid``, how many training records (evenly spaced over the
            pool) are held out of training to choose the rate on (32).
        epochs: passes over the training set (1).
        train_batch_size: sequences per optimizer step (4).
        warmup_steps: linear learning-rate warm-up steps (2).
        weight_decay: AdamW weight decay (0.0).
        seed: seeds sampling, data order, LoRA initialisation and dropout.
        checkpoint_every: optimizer steps between checkpoints (an epoch end always writes one).
        max_new_tokens, verdict_max_new_tokens, batch_size: evaluation decoding settings (as in
            Study 1).
        judge_base_answers: also let every adapter judge the base model's answers.
        patch_examples: eval prompts used for cross-model patching (0 disables it).
        patch_positions: ``"all"`` or ``"last"`` (module docstring, step 6).
        patch_layers: layers to patch, a spec of :func:`interp.core.layers.parse_layers` or a list
            (None: all).
        n_boot: bootstrap resamples of the CIs.
        device, dtype: where the CLI loads the model.
    """

    table_error = StageError
    """A bad ``[transfer]`` table raises the stage's error (:class:`interp.core.options.
    StageConfig`)."""

    model: str = "smollm2-135m-instruct"
    adapters: list[str] = option(list(ADAPTERS))
    datasets: list[str] = option(["squad_v2"], flag="dataset", short="d")
    from_hub: bool = False
    eval_limit: int | None = option(50, kind="count")
    template: str = "default"
    templates_path: str | None = None
    hard_negative_template: str = "closed_book"
    oracle: str = "rule"
    max_train_examples: int = option(80, kind="count")
    max_length: int = option(512, kind="count")
    hard_negative_attempts: int = option(5, kind="count")
    hard_negative_temperature: float = 0.7
    hard_negative_top_p: float = 0.9
    hard_negative_max_new_tokens: int = option(16, kind="count")
    hard_negative_max_words: int = 12
    rank: int = option(8, kind="count")
    alpha: int = 16
    dropout: float = 0.05
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    lora_layers: list[int] | None = option(None, kind="layers")
    lr: float = 5e-4
    lr_grid: list[float] | None = None
    select_holdout: int = option(32, kind="count")
    epochs: int = option(1, kind="count")
    train_batch_size: int = option(4, kind="count")
    warmup_steps: int = 2
    weight_decay: float = 0.0
    seed: int = 0
    checkpoint_every: int = option(10, kind="count")
    max_new_tokens: int = option(32, kind="count")
    verdict_max_new_tokens: int = option(8, kind="count")
    batch_size: int = option(8, kind="count")
    judge_base_answers: bool = True
    patch_examples: int = 4
    patch_positions: str = "all"
    patch_layers: str | list[int] | None = option(None, kind="layers")
    n_boot: int = option(1000, kind="count")
    device: str | None = None
    dtype: str | None = None

    def __post_init__(self) -> None:
        self.datasets = split_list(self.datasets)
        self.adapters = self._chosen_adapters(split_list(self.adapters))
        if self.patch_positions not in ("all", "last"):
            raise StageError("transfer", f"patch_positions must be 'all' or 'last', not "
                                         f"{self.patch_positions!r}")
        for k in ("max_train_examples", "max_length", "hard_negative_attempts", "rank",
                  "epochs", "train_batch_size", "checkpoint_every", "select_holdout"):
            if int(getattr(self, k)) < 1:
                raise StageError("transfer",
                                 f"transfer config {k} must be >= 1, got {getattr(self, k)}")
        if self.lr_grid is not None:
            self.lr_grid = sorted({float(x) for x in self.lr_grid})
            if not self.lr_grid or self.lr_grid[0] <= 0:
                raise StageError("transfer",
                                 f"transfer config lr_grid must list learning rates > 0, "
                                 f"got {self.lr_grid}")
            if self.select_holdout >= self.max_train_examples:
                raise StageError(
                    "transfer",
                    f"transfer config select_holdout ({self.select_holdout}) must be under "
                    f"max_train_examples ({self.max_train_examples}): the held-out records "
                    f"come out of the training pool")

    @staticmethod
    def _chosen_adapters(names: list[str]) -> list[str]:
        """``names`` checked (known, at least one, no repeat), in :data:`ADAPTERS` order.

        Raises:
            StageError: an unknown name (with the closest known one), none, or a repeat.
        """
        known = ", ".join(ADAPTERS)
        if not names:
            raise StageError("transfer", f"transfer config adapters is empty; name at least "
                                         f"one of {known}")
        if bad := [n for n in names if n not in ADAPTERS]:
            raise StageError("transfer",
                             f"transfer config adapters: unknown adapter "
                             f"{', '.join(map(repr, bad))}{did_you_mean(bad, ADAPTERS)}; "
                             f"known: {known}")
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise StageError("transfer", f"transfer config adapters lists {', '.join(twice)} "
                                         f"more than once; name each adapter once")
        return [a for a in ADAPTERS if a in names]
