"""Study 3 (paper section 3.3): LoRA transfer between generation and self-evaluation.

Algorithm (``run_transfer``; every step writes under ``DIR/transfer/`` and is skipped when its
output already exists, so an interrupted run resumes):

1. **Training pool.** Load the train split of each configured dataset
   (:func:`interp.data.load_examples`, ``split="train"``; DROP has none: a clear error), keep
   answerable records whose longest training sequence (eval prompt + verdict) fits
   ``max_length`` tokens, and take the first ``max_train_examples`` of them (pooled over the
   datasets, in order).
2. **Hard negatives** (``hard_negatives.jsonl``). For each pool record ask the model the
   question WITHOUT the context (template variant ``closed_book``), sampling (temperature /
   top-p, seeded per attempt) up to ``hard_negative_attempts`` (5) times; keep the first
   extracted answer that is not empty, not a refusal (:func:`is_refusal`: the documented
   :data:`REFUSAL_PATTERNS` plus :func:`interp.grading.is_abstention`) and that the oracle judges
   NOT to match the gold answers. When no attempt is usable, fall back to *answer rotation*:
   the gold answer of another pool record (seeded order), never one equal (normalised) to, or
   judged correct against, this record's gold. Every attempt is stored with the reason it was
   kept or rejected, and whether the fallback was used.
3. **Training sets** (``train_sets/<adapter>.jsonl``), ``N = len(pool)`` items each:
   ``lora_gen``: (c, q) -> a* (the first gold answer); ``lora_eval``: (c, q, a) -> y*, half the
   records (seeded choice) with their gold answer as candidate -> ``Correct``, the other half
   with their hard negative -> ``Incorrect``; ``lora_both``: a 1:1 mix, N/2 items drawn from
   each of the two sets (seeded). Prompts are the Study 1 prompts (:func:`interp.prompts.render`,
   chat template, same template variant); the target is appended as the assistant reply plus
   the chat template's end-of-turn token; labels are -100 everywhere except the target tokens
   (loss only on the answer / verdict).
4. **Training** (``adapters/<adapter>/``): a peft LoRA adapter on a deep copy of the base model
   (the base model object is never modified), AdamW on the LoRA parameters only, linear warm-up
   then constant learning rate, right-padded batches, mean token cross-entropy over answer
   tokens. A checkpoint (LoRA weights, optimizer, RNG state, position in the seeded data order)
   is written every ``checkpoint_every`` optimizer steps and at every epoch end; a restarted
   training resumes from it and ends with the same weights as an uninterrupted one. The adapter
   is saved with peft's ``save_pretrained`` plus ``interp_adapter.json`` (training config, base
   model fingerprint, losses, training time).
5. **Evaluation** (``eval/<model>__<dataset>.jsonl``): ``base`` and each adapter run Study 1
   unchanged (:func:`interp.asymmetry.evaluate_examples`: T_gen, rule oracle, T_eval on its OWN
   answers) on the first ``eval_limit`` validation records of each dataset; additionally each
   model judges the BASE model's answers (``judge_base_answers``), which separates a change of
   judge from a change of the answers being judged. Adapters are loaded onto a fresh copy of the
   base model and checked against the base model's fingerprint (:class:`TransferError` on a
   mismatch).
6. **Table** (``table.json``): per model and dataset :func:`interp.asymmetry.group_metrics`
   (``GA``, ``EA``, ``delta``, acceptance rates on oracle-correct and oracle-incorrect answers,
   bootstrap / Wilson 95% CIs), and the same for ``judge_base_answers``.
7. **Patching across models** (``patching.json``): on the base model's eval prompts, the
   residual stream after each decoder layer (resid_post, the output of
   ``model.model.layers[L]``; hook point ``blocks.L.hook_resid_post`` in TransformerLens terms)
   is patched from the adapter model into the base model (``a->b``) and from the base model into
   the adapter model (``b->a``), at ``patch_positions`` = ``"all"`` positions (then ``a->b`` at
   layer L = adapter layers 0..L followed by base layers L+1..: the share of the verdict change
   produced by layers <= L) or ``"last"`` (only the verdict position: the share carried by that
   one residual vector). With the verdict logit difference ``LD = logit(Correct) -
   logit(Incorrect)`` at the last position, the fraction carried at layer L is
   ``(LD_patched(a->b) - LD_base) / (LD_adapter - LD_base)`` and
   ``(LD_adapter - LD_patched(b->a)) / (LD_adapter - LD_base)``, aggregated over prompts as the
   ratio of sums (prompts with a tiny change contribute little instead of exploding).
8. **Figures** (``figures/transfer_matrix.png``, ``figures/transfer_acceptance.png``,
   ``figures/transfer_patching.png``) drawn from ``table.json`` / ``patching.json``.
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

from interp.asymmetry import evaluate_examples, group_metrics, make_oracle
from interp.data import DataError, QAExample, load_examples
from interp.errors import TransferError
from interp.generation import left_pad
from interp.grading import BaseOracle, extract_answer, is_abstention, normalize_answer
from interp.models import ModelHandle
from interp.prompts import Template, get_template, render, verdict_token_ids
from interp.store import RunDir, atomic_write_text, config_from_table, read_json, write_json

STAGE = "transfer"
ADAPTERS = ("lora_gen", "lora_eval", "lora_both")
"""The three adapters of the paper (section 3.3)."""
MODELS = ("base",) + ADAPTERS
VERDICT_WORDS = {True: "Correct", False: "Incorrect"}

KEY_FIELDS = ("model", "datasets", "template", "hard_negative_template", "oracle",
              "max_train_examples", "max_length", "hard_negative_attempts",
              "hard_negative_temperature", "hard_negative_top_p",
              "hard_negative_max_new_tokens", "hard_negative_max_words", "rank", "alpha", "dropout", "target_modules",
              "lora_layers", "lr", "epochs", "train_batch_size", "warmup_steps", "weight_decay", "seed")
"""Config fields whose change invalidates stored hard negatives, training sets or adapters."""
EVAL_FIELDS = ("eval_limit", "max_new_tokens", "verdict_max_new_tokens", "judge_base_answers")
"""Config fields whose change redoes the evaluation (the adapters are kept)."""
PATCH_FIELDS = ("patch_examples", "patch_positions", "patch_layers")
"""Config fields whose change redoes the cross-model patching."""


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


@dataclass
class TransferConfig:
    """Configuration of the transfer study (defaults: the CPU quickstart on the bundled model).

    Attributes:
        model: base model spec (used by the CLI when no handle is given).
        datasets: datasets whose TRAIN split trains the adapters (pooled) and whose validation
            split evaluates them. Bundled train splits: ``squad_v2``, ``hotpotqa``, ``musique``.
        eval_limit: validation records per dataset for the evaluation (first N answerable).
        template: Study 1 template variant (training prompts AND evaluation).
        templates_path: TOML file of template variants (None: the bundled ``paper.toml``).
        hard_negative_template: variant whose gen prompt has no context (``closed_book``).
        oracle: ``"rule"`` or ``"model:SPEC"`` (:func:`interp.asymmetry.make_oracle`).
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
            only ~20 steps).
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
        patch_positions: ``"all"`` or ``"last"`` (module docstring, step 7).
        patch_layers: layers to patch (None: all).
        n_boot: bootstrap resamples of the CIs.
        device, dtype: where the CLI loads the model.
    """

    model: str = "smollm2-135m-instruct"
    datasets: list[str] = field(default_factory=lambda: ["squad_v2"])
    eval_limit: int = 50
    template: str = "default"
    templates_path: str | None = None
    hard_negative_template: str = "closed_book"
    oracle: str = "rule"
    max_train_examples: int = 80
    max_length: int = 512
    hard_negative_attempts: int = 5
    hard_negative_temperature: float = 0.7
    hard_negative_top_p: float = 0.9
    hard_negative_max_new_tokens: int = 16
    hard_negative_max_words: int = 12
    rank: int = 8
    alpha: int = 16
    dropout: float = 0.05
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    lora_layers: list[int] | None = None
    lr: float = 5e-4
    epochs: int = 1
    train_batch_size: int = 4
    warmup_steps: int = 2
    weight_decay: float = 0.0
    seed: int = 0
    checkpoint_every: int = 10
    max_new_tokens: int = 32
    verdict_max_new_tokens: int = 8
    batch_size: int = 8
    judge_base_answers: bool = True
    patch_examples: int = 4
    patch_positions: str = "all"
    patch_layers: list[int] | None = None
    n_boot: int = 1000
    device: str | None = None
    dtype: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.datasets, str):
            self.datasets = [self.datasets]
        if self.patch_positions not in ("all", "last"):
            raise TransferError(f"patch_positions must be 'all' or 'last', not "
                                f"{self.patch_positions!r}")
        for k in ("max_train_examples", "max_length", "hard_negative_attempts", "rank",
                  "epochs", "train_batch_size", "checkpoint_every"):
            if int(getattr(self, k)) < 1:
                raise TransferError(f"transfer config {k} must be >= 1, got {getattr(self, k)}")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> TransferConfig:
        """Build from a mapping (a TOML table), refusing unknown keys.

        Raises:
            TransferError: an unknown key (the message lists the known ones).
        """
        return config_from_table(cls, d, "transfer", TransferError)


# ---------------------------------------------------------------------------------------------
# Step 2: hard negatives
# ---------------------------------------------------------------------------------------------

REFUSAL_PATTERNS: tuple[str, ...] = (
    r"\bi need more\b",
    r"\b(?:can ?not|can't|cannot) (?:be )?(?:determined|answered|provide|answer|say)\b",
    r"\bwithout (?:more |further |the |additional )?(?:context|information|details)\b",
    r"\bas an ai\b",
    r"\bi(?: do not|'m not| am not|'m unable| am unable) (?:have|able|aware|sure)\b",
    r"\b(?:no|not enough|insufficient) (?:context|information)\b",
    r"\bplease provide\b",
    r"\bit depends\b",
    r"\b(?:there is|there's) no (?:way|answer)\b",
    r"\b(?:that's|that is|it's|it is) (?:impossible|not possible)\b",
    r"^\W*(?:a )?short phrase\b",
)
"""Refusal / non-answer phrases (searched case-insensitively) that disqualify a closed-book
answer as a hard negative, on top of :func:`interp.grading.is_abstention`'s list: "I need more
information", "cannot be determined", "without more context", "as an AI", "I'm not sure",
"not enough information", "please provide", "it depends", "there is no way to know",
"that's impossible", and an echo of the template's instruction ("A short phrase...")."""

_REFUSAL_RE = re.compile("|".join(f"(?:{p})" for p in REFUSAL_PATTERNS), re.IGNORECASE)


def is_refusal(text: str) -> bool:
    """Whether a closed-book answer is a refusal rather than a (possibly wrong) answer.

    Args:
        text: raw generation or extracted answer.

    Returns:
        True iff :data:`REFUSAL_PATTERNS` or :func:`interp.grading.is_abstention` matches.

    Source:
        Paper section 3.3 ("filter refusals such as 'I need more information'"); the list is a
        project rule.
    """
    t = text.replace("\u2019", "'")
    return bool(_REFUSAL_RE.search(t)) or is_abstention(t)


@torch.inference_mode()
def sample_answers(handle: ModelHandle, prompts: Sequence[Sequence[int]], *, seed: int,
                   temperature: float = 1.0, top_p: float = 0.95, max_new_tokens: int = 16,
                   batch_size: int = 8) -> list[str]:
    """Sample one continuation per prompt (ancestral sampling with temperature and top-p).

    Args:
        handle: the model.
        prompts: token id lists (``[seq]`` each, chat template applied).
        seed: ``torch.manual_seed`` before each batch is ``seed`` plus the batch index, so the
            same prompts in the same order give the same samples.
        temperature, top_p, max_new_tokens, batch_size: sampling settings.

    Returns:
        The decoded continuations (special tokens removed), in input order.
    """
    tok = handle.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out: list[str] = []
    for b, s in enumerate(range(0, len(prompts), batch_size)):
        ids, mask = left_pad(prompts[s:s + batch_size], pad_id, handle.device)
        torch.manual_seed(seed + b)
        res = handle.model.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                                    temperature=temperature, top_p=top_p, top_k=0,
                                    max_new_tokens=max_new_tokens, pad_token_id=pad_id)
        for row in res[:, ids.shape[1]:].tolist():
            out.append(tok.decode(row, skip_special_tokens=True))
    return out


def _judge_negative(answer: str, ex: QAExample, oracle: BaseOracle,
                    max_words: int | None = None) -> str:
    """``"kept"`` or the reason a candidate hard negative is rejected."""
    if not answer.strip():
        return "rejected: empty"
    if is_refusal(answer):
        return "rejected: refusal"
    if max_words is not None and len(answer.split()) > max_words:
        return f"rejected: too long (> {max_words} words)"
    graded = oracle.grade(answer, ex.answers, dataset=ex.dataset, answerable=True,
                          extras={**ex.extras, "context": ex.context, "question": ex.question})
    if graded.label:
        return f"rejected: oracle judges it correct ({graded.rule})"
    if normalize_answer(answer) in {normalize_answer(a) for a in ex.answers}:
        return "rejected: equals the gold answer"
    return "kept"


def rotation_answer(k: int, pool: Sequence[QAExample], oracle: BaseOracle, *,
                    seed: int) -> tuple[str | None, str | None]:
    """Answer rotation: a gold answer of another pool record that is wrong for record ``k``.

    Args:
        k: index of the record in ``pool``.
        pool: the training pool.
        oracle: a candidate is skipped when the oracle judges it correct for record ``k``.
        seed: other records are tried in a ``random.Random(seed * 100003 + k)`` order.

    Returns:
        ``(answer, donor_id)``, or ``(None, None)`` when every other gold matches this gold.

    Source:
        Paper section 3.3 (fallback "answer rotation").
    """
    ex = pool[k]
    golds = {normalize_answer(a) for a in ex.answers}
    order = [j for j in range(len(pool)) if j != k]
    random.Random(seed * 100003 + k).shuffle(order)
    for j in order:
        cand = pool[j].answers[0]
        if normalize_answer(cand) in golds:
            continue
        if _judge_negative(cand, ex, oracle) == "kept":
            return cand, pool[j].id
    return None, None


def mine_hard_negatives(handle: ModelHandle, pool: Sequence[QAExample], oracle: BaseOracle,
                        config: TransferConfig, *,
                        log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Step 2 of the module algorithm: one hard negative per pool record.

    Args:
        handle: the base model (asked WITHOUT the context).
        pool: training records (answerable).
        oracle: judges whether a sampled answer matches the gold.
        config: ``hard_negative_*`` settings, ``seed``, ``templates_path``.
        log: progress lines.

    Returns:
        One row per record: ``id``, ``dataset``, ``question``, ``gold`` (list), ``attempts``
        (``[{attempt, generation, answer, decision}]``), ``hard_negative``, ``source``
        (``"closed_book"`` or ``"rotation"``), ``fallback`` (bool), ``donor_id`` (rotation).

    Raises:
        TransferError: no usable negative at all for a record (all golds in the pool equal).
    """
    tpl = get_template(config.hard_negative_template, config.templates_path)
    prompts = [render(handle.tokenizer, tpl, "gen", context=ex.context, question=ex.question)
               .input_ids for ex in pool]
    rows = [{"id": ex.id, "dataset": ex.dataset, "question": ex.question,
             "gold": list(ex.answers), "attempts": [], "hard_negative": None,
             "source": None, "fallback": False, "donor_id": None} for ex in pool]
    pending = list(range(len(pool)))
    for attempt in range(config.hard_negative_attempts):
        if not pending:
            break
        texts = sample_answers(handle, [prompts[k] for k in pending],
                               seed=config.seed * 1_000_003 + attempt * 10_007,
                               temperature=config.hard_negative_temperature,
                               top_p=config.hard_negative_top_p,
                               max_new_tokens=config.hard_negative_max_new_tokens,
                               batch_size=config.batch_size)
        still = []
        for k, text in zip(pending, texts):
            ans = extract_answer(text)
            decision = _judge_negative(ans, pool[k], oracle, config.hard_negative_max_words)
            rows[k]["attempts"].append({"attempt": attempt + 1, "generation": text,
                                        "answer": ans, "decision": decision})
            if decision == "kept":
                rows[k].update(hard_negative=ans, source="closed_book")
            else:
                still.append(k)
        pending = still
        log(f"[hard negatives] attempt {attempt + 1}: {len(pool) - len(pending)}/{len(pool)} "
            f"records have one")
    for k in pending:
        ans, donor = rotation_answer(k, pool, oracle, seed=config.seed)
        if ans is None:
            raise TransferError(f"record {pool[k].id}: no hard negative (every closed-book "
                                f"attempt was rejected and no other pool record has a "
                                f"different gold answer); use more training records")
        rows[k].update(hard_negative=ans, source="rotation", fallback=True, donor_id=donor)
    return rows


# ---------------------------------------------------------------------------------------------
# Step 3: training sets
# ---------------------------------------------------------------------------------------------


def end_of_turn_id(tokenizer: Any) -> int:
    """The token that closes an assistant turn in the tokenizer's chat template.

    Rendered ``[user, assistant "X"]`` minus the generation-prompt rendering gives ``"X" +
    suffix``; the first token of the suffix is the end-of-turn token when it is a special token
    (SmolLM2 / ChatML ``<|im_end|>``, Llama 3 ``<|eot_id|>``), else the EOS token.
    """
    eos = tokenizer.eos_token_id
    if not getattr(tokenizer, "chat_template", None):
        return eos
    msgs = [{"role": "user", "content": "Q"}]
    a = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    b = tokenizer.apply_chat_template(msgs + [{"role": "assistant", "content": "X"}],
                                      tokenize=False)
    if not b.startswith(a):
        return eos
    suffix = b[len(a):].split("X", 1)[-1]
    ids = tokenizer(suffix, add_special_tokens=False)["input_ids"]
    if ids and ids[0] in set(tokenizer.all_special_ids):
        return int(ids[0])
    return eos


def encode_example(tokenizer: Any, template: Template, item: Mapping[str, Any], *,
                   eot_id: int | None = None) -> dict[str, list[int]]:
    """Tokenize one training item: the Study 1 prompt plus the target as the assistant reply.

    Args:
        tokenizer: chat tokenizer.
        template: the Study 1 template variant.
        item: ``{"task": "gen"|"eval", "context", "question", "answer" (eval), "target"}``.
        eot_id: end-of-turn token (default :func:`end_of_turn_id`).

    Returns:
        ``input_ids [seq]`` = prompt ids + target ids + [eot], and ``labels [seq]`` with -100 on
        every prompt position and the token id on target and end-of-turn positions (the loss
        is on the answer only).
    """
    p = render(tokenizer, template, item["task"], context=item["context"],
               question=item["question"], answer=item.get("answer"))
    eot = end_of_turn_id(tokenizer) if eot_id is None else eot_id
    target = tokenizer(item["target"], add_special_tokens=False)["input_ids"] + [eot]
    return {"input_ids": list(p.input_ids) + target,
            "labels": [-100] * len(p.input_ids) + target}


def build_training_sets(pool: Sequence[QAExample], negatives: Sequence[Mapping[str, Any]],
                        *, seed: int) -> dict[str, list[dict[str, Any]]]:
    """Step 3 of the module algorithm: the LoRA-Gen, LoRA-Eval and LoRA-Both items.

    Args:
        pool: training records.
        negatives: :func:`mine_hard_negatives` rows, aligned with ``pool``.
        seed: seeds the Correct/Incorrect split and the LoRA-Both draw.

    Returns:
        ``{adapter: [item]}``, each of ``len(pool)`` items; an item has ``id``, ``task``,
        ``context``, ``question``, ``answer`` (eval), ``target`` and for eval ``label`` (y*).
    """
    n = len(pool)
    gen = [{"id": ex.id, "task": "gen", "context": ex.context, "question": ex.question,
            "target": ex.answers[0]} for ex in pool]
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    correct = set(order[: (n + 1) // 2])
    ev = []
    for k, ex in enumerate(pool):
        y = k in correct
        ev.append({"id": ex.id, "task": "eval", "context": ex.context, "question": ex.question,
                   "answer": ex.answers[0] if y else negatives[k]["hard_negative"],
                   "label": y, "target": VERDICT_WORDS[y],
                   "negative_source": None if y else negatives[k]["source"]})
    # LoRA-Both: n/2 gen items and n/2 eval items (eval items balanced Correct/Incorrect).
    n_gen = n // 2
    gen_pick = sorted(rng.sample(range(n), n_gen))
    ev_c = [i for i in range(n) if ev[i]["label"]]
    ev_i = [i for i in range(n) if not ev[i]["label"]]
    n_ev = n - n_gen
    take_c = min(len(ev_c), (n_ev + 1) // 2)
    take_i = min(len(ev_i), n_ev - take_c)
    ev_pick = rng.sample(ev_c, take_c) + rng.sample(ev_i, take_i)
    both = [gen[i] for i in gen_pick] + [ev[i] for i in sorted(ev_pick)]
    rng.shuffle(both)
    return {"lora_gen": gen, "lora_eval": ev, "lora_both": both}


def training_pool(config: TransferConfig, tokenizer: Any, template: Template, *,
                  log: Callable[[str], None] = print) -> list[QAExample]:
    """Step 1 of the module algorithm: train-split records that fit ``max_length``.

    Raises:
        TransferError: a dataset has no train split (DROP in the bundled data) or no record
            fits ``max_length``.
    """
    per_ds = math.ceil(config.max_train_examples / len(config.datasets))
    pool: list[QAExample] = []
    eot = end_of_turn_id(tokenizer)
    for ds in config.datasets:
        try:
            examples = load_examples(ds, split="train")
        except DataError as err:
            raise TransferError(f"the transfer study trains on the train split of {ds!r}, "
                                f"which is not available: {err}. Use squad_v2, hotpotqa or "
                                f"musique (bundled train splits) or a train file.") from err
        kept, too_long = [], 0
        for ex in examples:
            if len(kept) >= per_ds:
                break
            longest = max(ex.answers, key=len)
            enc = encode_example(tokenizer, template, {
                "task": "eval", "context": ex.context, "question": ex.question,
                "answer": longest, "target": "Incorrect"}, eot_id=eot)
            enc_g = encode_example(tokenizer, template, {
                "task": "gen", "context": ex.context, "question": ex.question,
                "target": longest}, eot_id=eot)
            # room for a hard negative up to hard_negative_max_new_tokens tokens
            if len(enc["input_ids"]) + config.hard_negative_max_new_tokens > config.max_length \
                    or len(enc_g["input_ids"]) > config.max_length:
                too_long += 1
                continue
            kept.append(ex)
        if not kept:
            raise TransferError(f"no train record of {ds!r} fits max_length="
                                f"{config.max_length} tokens; raise max_length")
        log(f"[pool] {ds}: {len(kept)} train records ({too_long} longer than "
            f"{config.max_length} tokens skipped)")
        pool += kept
    return pool[: config.max_train_examples]


# ---------------------------------------------------------------------------------------------
# Step 4: training
# ---------------------------------------------------------------------------------------------


def model_fingerprint(handle: ModelHandle) -> dict[str, Any]:
    """What an adapter must match: spec, weight sha256 and shape facts of the base model."""
    cfg = handle.model.config
    return {"spec": handle.spec, "sha256": handle.info.get("sha256"),
            "n_layers": cfg.num_hidden_layers, "d_model": cfg.hidden_size,
            "n_heads": cfg.num_attention_heads, "vocab_size": cfg.vocab_size}


def _lora_config(config: TransferConfig) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
                      target_modules=list(config.target_modules), bias="none",
                      layers_to_transform=config.lora_layers, task_type="CAUSAL_LM")


def _pad_right(batch: Sequence[Mapping[str, list[int]]], pad_id: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(b["input_ids"]) for b in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, b in enumerate(batch):
        n = len(b["input_ids"])
        ids[i, :n] = torch.tensor(b["input_ids"])
        labels[i, :n] = torch.tensor(b["labels"])
        mask[i, :n] = 1
    return ids, mask, labels


def _epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n))
    random.Random(seed * 7919 + epoch).shuffle(order)
    return order


def train_adapter(handle: ModelHandle, encoded: Sequence[Mapping[str, list[int]]],
                  config: TransferConfig, out_dir: str | Path, *,
                  checkpoint_dir: str | Path | None = None, name: str = "adapter",
                  stop_after_steps: int | None = None,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train one LoRA adapter on encoded items; resume from a checkpoint; save the adapter.

    Args:
        handle: the base model; it is deep-copied, never modified.
        encoded: :func:`encode_example` outputs (``input_ids``, ``labels``).
        config: LoRA and optimisation settings (``rank``, ``alpha``, ``dropout``,
            ``target_modules``, ``lr``, ``epochs``, ``train_batch_size``, ``warmup_steps``,
            ``weight_decay``, ``seed``, ``checkpoint_every``).
        out_dir: adapter folder (peft ``save_pretrained`` + ``interp_adapter.json``).
        checkpoint_dir: where checkpoints go (default ``out_dir/../checkpoints/<name>``).
        name: adapter name (logs, metadata).
        stop_after_steps: stop (as if killed) after this many optimizer steps in this call,
            leaving only the checkpoint (tests of resumption).
        log: progress lines.

    Returns:
        The ``interp_adapter.json`` content (``None`` fields when stopped early): ``name``,
        ``base`` (fingerprint), ``config``, ``n_examples``, ``n_steps``, ``losses`` (mean loss
        per step), ``train_seconds`` (wall clock) and ``train_cpu_seconds`` (process CPU time,
        all threads), both summed over resumed sessions.
    """
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file, save_file

    out_dir = Path(out_dir)
    ck = Path(checkpoint_dir) if checkpoint_dir else out_dir.parent.parent / "checkpoints" / name
    if (out_dir / "interp_adapter.json").exists():
        return read_json(out_dir / "interp_adapter.json")
    if not encoded:
        raise TransferError(f"adapter {name}: empty training set")
    torch.manual_seed(config.seed)
    model = get_peft_model(copy.deepcopy(handle.model), _lora_config(config))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    bs = config.train_batch_size
    steps_per_epoch = math.ceil(len(encoded) / bs)
    total = steps_per_epoch * config.epochs
    state = {"global_step": 0, "losses": [], "train_seconds": 0.0, "train_cpu_seconds": 0.0}
    if (ck / "state.json").exists():
        state = read_json(ck / "state.json")
        set_peft_model_state_dict(model, load_file(str(ck / "lora.safetensors")))
        opt.load_state_dict(torch.load(ck / "optimizer.pt", weights_only=False))
        torch.set_rng_state(torch.load(ck / "rng.pt", weights_only=False))
        log(f"[{name}] resumed from step {state['global_step']}/{total}")
    pad_id = handle.tokenizer.pad_token_id or 0

    def checkpoint() -> None:
        ck.mkdir(parents=True, exist_ok=True)
        lora = {k: v.detach().cpu().contiguous()
                for k, v in get_peft_model_state_dict(model).items()}
        save_file(lora, str(ck / "lora.safetensors.tmp"))
        Path(ck / "lora.safetensors.tmp").replace(ck / "lora.safetensors")
        torch.save(opt.state_dict(), ck / "optimizer.pt.tmp")
        Path(ck / "optimizer.pt.tmp").replace(ck / "optimizer.pt")
        torch.save(torch.get_rng_state(), ck / "rng.pt.tmp")
        Path(ck / "rng.pt.tmp").replace(ck / "rng.pt")
        write_json(ck / "state.json", state)  # last: marks the checkpoint complete

    model.train()
    t0, c0 = time.perf_counter(), time.process_time()
    done_here = 0

    def clock() -> None:
        nonlocal t0, c0
        state["train_seconds"] = state.get("train_seconds", 0.0) + time.perf_counter() - t0
        state["train_cpu_seconds"] = (state.get("train_cpu_seconds", 0.0)
                                      + time.process_time() - c0)
        t0, c0 = time.perf_counter(), time.process_time()

    while state["global_step"] < total:
        g = state["global_step"]
        epoch, step = divmod(g, steps_per_epoch)
        order = _epoch_order(len(encoded), config.seed, epoch)
        batch = [encoded[i] for i in order[step * bs:(step + 1) * bs]]
        ids, mask, labels = _pad_right(batch, pad_id)
        ids, mask, labels = ids.to(handle.device), mask.to(handle.device), labels.to(
            handle.device)
        for group in opt.param_groups:  # linear warm-up, then constant
            group["lr"] = config.lr * min(1.0, (g + 1) / max(1, config.warmup_steps))
        with torch.enable_grad():
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        state["global_step"] = g + 1
        state["losses"].append(float(loss.detach()))
        done_here += 1
        if (g + 1) % config.checkpoint_every == 0 or (g + 1) % steps_per_epoch == 0:
            clock()
            checkpoint()
        if (g + 1) % max(1, steps_per_epoch // 4) == 0:
            log(f"[{name}] step {g + 1}/{total} loss {state['losses'][-1]:.3f}")
        if stop_after_steps is not None and done_here >= stop_after_steps \
                and state["global_step"] < total:
            clock()
            checkpoint()
            return {"name": name, "stopped_at_step": state["global_step"]}
    clock()
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    meta = {"name": name, "base": model_fingerprint(handle),
            "config": {k: getattr(config, k) for k in KEY_FIELDS},
            "n_examples": len(encoded), "n_steps": total, "losses": state["losses"],
            "train_seconds": state["train_seconds"],
            "train_cpu_seconds": state["train_cpu_seconds"]}
    write_json(out_dir / "interp_adapter.json", meta)
    del model
    return meta


def load_adapter(handle: ModelHandle, adapter_dir: str | Path, *, name: str | None = None
                 ) -> ModelHandle:
    """The base model with a trained adapter, on a fresh copy of the base model.

    The base handle is not modified: its numbers before and after are identical.

    Args:
        handle: the base model.
        adapter_dir: a folder written by :func:`train_adapter`.
        name: model name for records (default the folder name).

    Returns:
        A :class:`ModelHandle` whose ``model`` is a peft ``PeftModel`` in eval mode and whose
        ``spec`` is ``"<base spec>+<name>"``.

    Raises:
        TransferError: the folder is not an adapter, or it was trained on another base model
            (the message shows both fingerprints).
    """
    from peft import PeftModel

    adapter_dir = Path(adapter_dir)
    meta_path = adapter_dir / "interp_adapter.json"
    if not (adapter_dir / "adapter_config.json").exists() or not meta_path.exists():
        raise TransferError(f"{adapter_dir} holds no trained adapter (adapter_config.json and "
                            f"interp_adapter.json expected); train it with `interp transfer`")
    meta = read_json(meta_path)
    want, have = meta.get("base", {}), model_fingerprint(handle)
    diff = {k: (want.get(k), have[k]) for k in have if want.get(k) != have[k]}
    if diff:
        lines = "; ".join(f"{k}: adapter {a!r} vs model {b!r}" for k, (a, b) in diff.items())
        raise TransferError(f"adapter {adapter_dir} was trained on another base model ({lines})")
    name = name or adapter_dir.name
    model = PeftModel.from_pretrained(copy.deepcopy(handle.model), str(adapter_dir)).eval()
    model.requires_grad_(False)
    info = {**handle.info, "spec": f"{handle.spec}+{name}", "adapter": str(adapter_dir)}
    return ModelHandle(model=model, tokenizer=handle.tokenizer, spec=f"{handle.spec}+{name}",
                       info=info)


# ---------------------------------------------------------------------------------------------
# Step 7: patching across models
# ---------------------------------------------------------------------------------------------


def decoder_layers(model: Any) -> Any:
    """The decoder blocks (``model.model.layers``) of a causal LM or a peft model around one."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    try:
        return model.model.layers
    except AttributeError as err:
        raise TransferError(f"{type(model).__name__} has no model.model.layers; cross-model "
                            f"patching supports Llama-style decoder models") from err


def _out(o: Any) -> torch.Tensor:
    return o[0] if isinstance(o, tuple) else o


@torch.inference_mode()
def resid_post(model: Any, input_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual stream after every decoder layer, and the last-position logits.

    Args:
        model: causal LM (or peft model).
        input_ids: one prompt, ``[seq]``.

    Returns:
        ``resid [n_layers, seq, d_model]`` (float32, CPU) and ``logits [vocab]`` at the last
        position.
    """
    layers = decoder_layers(model)
    store: list[torch.Tensor] = [None] * len(layers)  # type: ignore[list-item]
    hooks = [layer.register_forward_hook(
        lambda m, i, o, L=L: store.__setitem__(L, _out(o)[0].detach().float().cpu()))
        for L, layer in enumerate(layers)]
    try:
        dev = next(model.parameters()).device
        logits = model(input_ids=torch.tensor([list(input_ids)], device=dev)).logits[0, -1]
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(store), logits.float().cpu()


@torch.inference_mode()
def patched_logit_diffs(model: Any, input_ids: Sequence[int], source: torch.Tensor,
                        layers: Sequence[int], ids: tuple[int, int], *, positions: str = "all",
                        chunk: int = 8) -> list[float]:
    """Verdict logit difference of ``model`` with resid_post of layer L taken from ``source``.

    Runs a batch with one row per patched layer: row ``r`` replaces the output of
    ``model.model.layers[layers[r]]`` (all positions, or only the last) by
    ``source[layers[r]]``, through forward hooks.

    Args:
        model: the receiving model.
        input_ids: the eval prompt, ``[seq]``.
        source: the donor's resid_post, ``[n_layers, seq, d_model]``.
        layers: layers to patch, one result each.
        ids: ``(Correct, Incorrect)`` first-token ids.
        positions: ``"all"`` or ``"last"``.
        chunk: rows per forward.

    Returns:
        ``logit(Correct) - logit(Incorrect)`` at the last position, one per layer (nats).
    """
    blocks = decoder_layers(model)
    dev = next(model.parameters()).device
    out: list[float] = []
    for s in range(0, len(layers), chunk):
        part = list(layers[s:s + chunk])
        hooks = []
        for r, L in enumerate(part):
            def hook(m, i, o, r=r, L=L):
                h = _out(o).clone()
                src = source[L].to(h.device, h.dtype)
                if positions == "all":
                    h[r] = src
                else:
                    h[r, -1] = src[-1]
                return (h,) + tuple(o[1:]) if isinstance(o, tuple) else h
            hooks.append(blocks[L].register_forward_hook(hook))
        try:
            x = torch.tensor([list(input_ids)] * len(part), device=dev)
            logits = model(input_ids=x).logits[:, -1].float()
        finally:
            for h in hooks:
                h.remove()
        out += (logits[:, ids[0]] - logits[:, ids[1]]).cpu().tolist()
    return out


def cross_model_patching(base: ModelHandle, adapter: ModelHandle,
                         prompts: Sequence[Sequence[int]], *, positions: str = "all",
                         layers: Sequence[int] | None = None) -> dict[str, Any]:
    """Step 7 of the module algorithm for one adapter.

    Args:
        base, adapter: the two models (same tokenizer and architecture).
        prompts: eval prompts, token ids ``[seq]`` each.
        positions: ``"all"`` or ``"last"``.
        layers: layers to patch (default all).

    Returns:
        ``layers``, ``ld_base`` / ``ld_adapter`` (per prompt), ``patched_a_to_b`` /
        ``patched_b_to_a`` (``[prompt][layer]`` logit differences), and
        ``fraction_a_to_b`` / ``fraction_b_to_a`` per layer (ratio of sums over prompts; None
        when the adapter does not change the logit difference at all).

    Raises:
        TransferError: a layer out of range (the message gives the valid range).
    """
    n = base.n_layers
    layers = list(range(n)) if layers is None else [int(x) for x in layers]
    if bad := [L for L in layers if not 0 <= L < n]:
        raise TransferError(f"patch layers {bad} out of range; valid layers: 0..{n - 1}")
    ids = verdict_token_ids(base.tokenizer)
    res: dict[str, Any] = {"layers": layers, "positions": positions, "ld_base": [],
                           "ld_adapter": [], "patched_a_to_b": [], "patched_b_to_a": []}
    for p in prompts:
        rb, lb = resid_post(base.model, p)
        ra, la = resid_post(adapter.model, p)
        res["ld_base"].append(float(lb[ids[0]] - lb[ids[1]]))
        res["ld_adapter"].append(float(la[ids[0]] - la[ids[1]]))
        res["patched_a_to_b"].append(patched_logit_diffs(base.model, p, ra, layers, ids,
                                                         positions=positions))
        res["patched_b_to_a"].append(patched_logit_diffs(adapter.model, p, rb, layers, ids,
                                                         positions=positions))
    db = torch.tensor(res["ld_base"])
    da = torch.tensor(res["ld_adapter"])
    change = (da - db)
    sign = torch.sign(change)
    denom = float((change * sign).sum())
    ab = torch.tensor(res["patched_a_to_b"])  # [prompt, layer]
    ba = torch.tensor(res["patched_b_to_a"])
    if denom < 1e-6:
        res["fraction_a_to_b"] = res["fraction_b_to_a"] = None
    else:
        res["fraction_a_to_b"] = (((ab - db[:, None]) * sign[:, None]).sum(0) / denom).tolist()
        res["fraction_b_to_a"] = (((da[:, None] - ba) * sign[:, None]).sum(0) / denom).tolist()
    res["mean_abs_change"] = float(change.abs().mean()) if len(prompts) else None
    return res


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def _write_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def _check_config(tdir: Path, config: TransferConfig, overwrite: bool) -> None:
    path = tdir / "config.json"
    cfg = asdict(config)
    if path.exists():
        old = read_json(path)
        # evaluation / patching settings: their outputs are redone, adapters are kept
        for fields, outs in ((EVAL_FIELDS, ("eval", "table.json", "patching.json")),
                             (PATCH_FIELDS, ("patching.json",))):
            if any(old.get(k) != cfg.get(k) for k in fields):
                import shutil

                for sub in outs:
                    p = tdir / sub
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(
                        missing_ok=True)
        diff = {k: (old.get(k), cfg.get(k)) for k in KEY_FIELDS if old.get(k) != cfg.get(k)}
        if diff and not overwrite:
            lines = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
            raise TransferError(f"{tdir} was made with another transfer config ({lines}); use "
                                f"another --out or --overwrite")
        if diff:
            import shutil

            for sub in ("hard_negatives.jsonl", "train_sets", "adapters", "checkpoints", "eval",
                        "table.json", "patching.json", "summary.json"):
                p = tdir / sub
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    write_json(path, cfg)


def build_table(evals: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]], *,
                n_boot: int, seed: int) -> dict[str, Any]:
    """Step 6: ``{"self": {model: {dataset: metrics}}, "judge_base_answers": {...}}``.

    Args:
        evals: ``{kind: {model: records}}`` with kind ``"self"`` (self-evaluation) or
            ``"judge_base_answers"``; records of several datasets are grouped by ``dataset``.
        n_boot, seed: bootstrap settings of :func:`interp.asymmetry.group_metrics`.
    """
    out: dict[str, Any] = {}
    for kind, per_model in evals.items():
        out[kind] = {}
        for model, recs in per_model.items():
            ok = [r for r in recs if r.get("status") == "ok"]
            ds = sorted({r["dataset"] for r in ok})
            out[kind][model] = {d: group_metrics([r for r in ok if r["dataset"] == d],
                                                 n_boot=n_boot, seed=seed) for d in ds}
            if len(ds) > 1:
                out[kind][model]["overall"] = group_metrics(ok, n_boot=n_boot, seed=seed)
    return out


def run_transfer(config: TransferConfig, out: str | Path, *, handle: ModelHandle | None = None,
                 overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run Study 3 into ``out/transfer/`` (module docstring), resuming finished steps.

    Args:
        config: the study's configuration.
        out: run directory (an asymmetry run directory, or a fresh folder).
        handle: the base model (else ``config.model`` is loaded).
        overwrite: discard ``out/transfer`` work made with another config.
        log: progress lines.

    Returns:
        ``summary.json``'s content: pool size, fallback rate, training seconds per adapter,
        the table's headline numbers and file paths.

    Raises:
        TransferError: unknown dataset split, config mismatch with stored work, bad layers.
    """
    from interp.models import load_model

    run = RunDir(out)
    tdir = run.sub("transfer")
    handle = handle or load_model(config.model, device=config.device, dtype=config.dtype)
    _check_config(tdir, config, overwrite)
    template = get_template(config.template, config.templates_path)
    oracle = make_oracle(config.oracle, device=config.device)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    # 1-2: pool and hard negatives
    pool = training_pool(config, handle.tokenizer, template, log=log)
    hn_path = tdir / "hard_negatives.jsonl"
    t0 = time.perf_counter()
    if hn_path.exists():
        negatives = _read_jsonl(hn_path)
        if [r["id"] for r in negatives] != [ex.id for ex in pool]:
            raise TransferError(f"{hn_path} does not match the training pool; delete it or use "
                                f"--overwrite")
    else:
        negatives = mine_hard_negatives(handle, pool, oracle, config, log=log)
        _write_jsonl(hn_path, negatives)
    timings["hard_negatives_s"] = time.perf_counter() - t0
    fallback_rate = sum(r["fallback"] for r in negatives) / len(negatives)
    log(f"[hard negatives] {len(negatives)} records, fallback (answer rotation) rate "
        f"{fallback_rate:.2f}")

    # 3: training sets
    sets = build_training_sets(pool, negatives, seed=config.seed)
    eot = end_of_turn_id(handle.tokenizer)
    for name, items in sets.items():
        _write_jsonl(tdir / "train_sets" / f"{name}.jsonl", items)

    # 4: training
    metas = {}
    for name in ADAPTERS:
        enc = [encode_example(handle.tokenizer, template, it, eot_id=eot) for it in sets[name]]
        metas[name] = train_adapter(handle, enc, config, tdir / "adapters" / name,
                                    checkpoint_dir=tdir / "checkpoints" / name, name=name,
                                    log=log)
        log(f"[{name}] trained on {metas[name]['n_examples']} items in "
            f"{metas[name]['train_seconds']:.1f} s (final loss {metas[name]['losses'][-1]:.3f})")

    # 5: evaluation
    evals: dict[str, dict[str, list[dict[str, Any]]]] = {"self": {}, "judge_base_answers": {}}
    val = {ds: load_examples(ds, split="validation", limit=config.eval_limit)
           for ds in config.datasets}
    eval_dir = tdir / "eval"
    base_answers: dict[str, list[str | None]] = {}
    kw = dict(template=template, oracle=oracle, max_new_tokens=config.max_new_tokens,
              verdict_max_new_tokens=config.verdict_max_new_tokens,
              batch_size=config.batch_size)
    for mname in MODELS:
        h = handle if mname == "base" else None
        evals["self"][mname], evals["judge_base_answers"][mname] = [], []
        for ds, exs in val.items():
            p_self = eval_dir / f"{mname}__{ds}.jsonl"
            p_fix = eval_dir / f"{mname}__{ds}__judge_base_answers.jsonl"
            need_fix = config.judge_base_answers and mname != "base"
            if not p_self.exists() or (need_fix and not p_fix.exists()):
                if h is None:
                    h = load_adapter(handle, tdir / "adapters" / mname, name=mname)
                t0 = time.perf_counter()
                if not p_self.exists():
                    recs = evaluate_examples(h, exs, **kw)
                    for r in recs:
                        r["transfer_model"], r["template"] = mname, config.template
                    _write_jsonl(p_self, recs)
                if need_fix and not p_fix.exists():
                    cands = [a if a is not None else "" for a in base_answers[ds]]
                    recs = evaluate_examples(h, exs, candidates=cands, **kw)
                    for r in recs:
                        r["transfer_model"], r["template"] = mname, config.template
                    _write_jsonl(p_fix, recs)
                timings[f"eval_{mname}_{ds}_s"] = time.perf_counter() - t0
                log(f"[eval] {mname} on {ds}: {len(exs)} records in "
                    f"{timings[f'eval_{mname}_{ds}_s']:.1f} s")
            recs = _read_jsonl(p_self)
            evals["self"][mname] += recs
            if mname == "base":
                base_answers[ds] = [r.get("answer") for r in recs]
                evals["judge_base_answers"]["base"] += recs
            elif need_fix:
                evals["judge_base_answers"][mname] += _read_jsonl(p_fix)
        if h is not None and h is not handle:
            del h

    # 6: table
    table = build_table(evals, n_boot=config.n_boot, seed=config.seed)
    table["train_seconds"] = {n: m["train_seconds"] for n, m in metas.items()}
    table["train_cpu_seconds"] = {n: m.get("train_cpu_seconds") for n, m in metas.items()}
    table["hard_negative_fallback_rate"] = fallback_rate
    write_json(tdir / "table.json", table)

    # 7: patching across models
    patch_path = tdir / "patching.json"
    if config.patch_examples > 0 and not patch_path.exists():
        t0 = time.perf_counter()
        base_recs = [r for r in evals["self"]["base"] if r.get("status") == "ok"]
        by_id = {(ex.dataset, ex.id): ex for exs in val.values() for ex in exs}
        prompts = []
        for r in base_recs[: config.patch_examples]:
            ex = by_id[(r["dataset"], r["id"])]
            prompts.append(render(handle.tokenizer, template, "eval", context=ex.context,
                                  question=ex.question, answer=r["answer"]).input_ids)
        patching = {"positions": config.patch_positions, "n_prompts": len(prompts),
                    "ids": [r["id"] for r in base_recs[: config.patch_examples]],
                    "adapters": {}}
        for name in ADAPTERS:
            ah = load_adapter(handle, tdir / "adapters" / name, name=name)
            patching["adapters"][name] = cross_model_patching(
                handle, ah, prompts, positions=config.patch_positions,
                layers=config.patch_layers)
            del ah
        write_json(patch_path, patching)
        timings["patching_s"] = time.perf_counter() - t0
        log(f"[patching] {len(prompts)} prompts x {len(ADAPTERS)} adapters in "
            f"{timings['patching_s']:.1f} s")

    # 8: figures
    from interp.plots import plot_transfer_acceptance, plot_transfer_matrix, plot_transfer_patching

    figs = run.sub("figures")
    paths = [plot_transfer_matrix(table, figs), plot_transfer_acceptance(table, figs)]
    if patch_path.exists():
        paths.append(plot_transfer_patching(read_json(patch_path), figs))

    summary = {
        "pool": len(pool), "datasets": config.datasets,
        "hard_negative_fallback_rate": fallback_rate,
        "hard_negative_sources": {s: sum(r["source"] == s for r in negatives)
                                  for s in ("closed_book", "rotation")},
        "train_seconds": table["train_seconds"],
        "train_cpu_seconds": table["train_cpu_seconds"],
        "train_items": {n: len(s) for n, s in sets.items()},
        "timings_s": timings, "wall_s_this_call": time.perf_counter() - t_start,
        "headline": {m: {d: {k: v.get(k) for k in ("n", "GA", "EA", "delta",
                                                    "acceptance_rate_correct",
                                                    "acceptance_rate_incorrect")}
                         for d, v in per.items()} for m, per in table["self"].items()},
        "figures": [str(p) for p in paths],
    }
    write_json(tdir / "summary.json", summary)
    return summary


def format_table(table: Mapping[str, Any], kind: str = "self") -> str:
    """Plain-text transfer table: one row per (model, dataset)."""
    head = (f"{'model':<10} {'dataset':<9} {'n':>3} {'GA':>6} {'EA':>6} {'delta':>7} "
            f"{'acc|y*=C':>9} {'acc|y*=I':>9}")
    rows = [f"[{kind}]", head, "-" * len(head)]

    def f(x: Any) -> str:
        return "     -" if x is None else f"{x:6.3f}"

    for model, per in table[kind].items():
        for ds, m in per.items():
            if not m.get("n"):
                continue
            rows.append(f"{model:<10} {ds:<9} {m['n']:>3} {f(m['GA'])} {f(m['EA'])} "
                        f"{m['delta']:+7.3f} {f(m['acceptance_rate_correct']):>9} "
                        f"{f(m['acceptance_rate_incorrect']):>9}")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The transfer settings of a TOML file: its ``[transfer]`` table, else the whole file.

    In a full experiment config (with ``[asymmetry]`` etc.) only ``[transfer]`` is read.
    """
    import tomllib

    data = tomllib.loads(Path(path).read_text())
    if STAGE in data:
        return dict(data[STAGE])
    return data


def run_stage(run: RunDir, section: dict, handle: ModelHandle) -> None:
    """``interp run`` stage: the ``[transfer]`` table of the config, on ``run``'s model.

    Raises:
        TransferError: an unknown key in the section.
    """
    cfg = TransferConfig.from_mapping({**section, "model": handle.spec})
    summary = run_transfer(cfg, run.path, handle=handle)
    print(format_table(read_json(run.path / "transfer" / "table.json")))
    print(f"fallback rate {summary['hard_negative_fallback_rate']:.2f}; train seconds "
          f"{summary['train_seconds']}")


def register(app: Any) -> None:
    """Add ``interp transfer`` to the typer app."""
    @app.command("transfer")
    def transfer_cmd(
        config: Annotated[Path | None, typer.Option(help="TOML: a 'transfer' table or flat "
                                                          "TransferConfig keys")] = None,
        out: Annotated[Path, typer.Option(help="run directory")] = Path("runs/transfer"),
        model: Annotated[str | None, typer.Option(help="base model spec")] = None,
        dataset: Annotated[list[str] | None, typer.Option(
            "--dataset", "-d", help="train+eval datasets (squad_v2, hotpotqa, musique)")] = None,
        eval_limit: Annotated[int | None, typer.Option(help="validation records")] = None,
        max_train_examples: Annotated[int | None, typer.Option(help="items per adapter")] = (
            None),
        epochs: int | None = None,
        lr: float | None = None,
        rank: int | None = None,
        max_length: int | None = None,
        patch_examples: int | None = None,
        patch_positions: Annotated[str | None, typer.Option(help="all or last")] = None,
        seed: int | None = None,
        judge_base_answers: Annotated[bool | None, typer.Option(
            help="also let each adapter judge the base model's answers")] = None,
        device: str | None = None,
        overwrite: Annotated[bool, typer.Option(help="discard work made with another config")]
        = False,
    ) -> None:
        """Study 3: hard negatives, LoRA-Gen/Eval/Both adapters, transfer table and figures."""
        values = load_config_file(config) if config else {}
        flags = {"model": model, "eval_limit": eval_limit,
                 "max_train_examples": max_train_examples, "epochs": epochs, "lr": lr,
                 "rank": rank, "max_length": max_length, "patch_examples": patch_examples,
                 "patch_positions": patch_positions, "seed": seed, "device": device,
                 "judge_base_answers": judge_base_answers}
        if dataset:
            flags["datasets"] = [x.strip() for v in dataset for x in v.split(",") if x.strip()]
        values.update({k: v for k, v in flags.items() if v is not None})
        cfg = TransferConfig.from_mapping(values)
        summary = run_transfer(cfg, out, overwrite=overwrite, log=typer.echo)
        typer.echo(format_table(read_json(Path(out) / "transfer" / "table.json")))
        typer.echo(format_table(read_json(Path(out) / "transfer" / "table.json"),
                                "judge_base_answers"))
        typer.echo(f"hard-negative fallback rate {summary['hard_negative_fallback_rate']:.2f}; "
                   f"training seconds {summary['train_seconds']}")
        typer.echo(f"wrote {out}/transfer/ and {out}/figures/transfer_*.png")
