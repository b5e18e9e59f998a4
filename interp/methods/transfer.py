"""Study 3 methods (paper section 3.3): training pool, hard negatives and training sets.

The study around them (training, evaluation, table, cross-model patching, figures) is
:mod:`interp.stages.transfer`; the adapters are trained and loaded by :mod:`interp.methods.lora`.

Algorithm:

1. **Training pool** (:func:`training_pool`). Load the train split of each configured dataset
   (:func:`interp.data.load_study_split`: a file's even passages, never those evaluated on;
   DROP has no bundled train split: a clear error), keep
   answerable records whose longest training sequence (eval prompt + verdict, plus room for a
   hard negative) fits ``max_length`` tokens, and take the first ``max_train_examples`` of
   them (pooled over the datasets, in order).
2. **Hard negatives** (:func:`mine_hard_negatives`). For each pool record ask the model the
   question WITHOUT the context (template variant ``closed_book``), sampling (temperature /
   top-p, seeded per attempt) up to ``hard_negative_attempts`` (5) times; keep the first
   extracted answer that is not empty, not a refusal (:func:`is_refusal`: the documented
   :data:`REFUSAL_PATTERNS` plus :func:`interp.judging.grading.is_abstention`), not longer than
   ``hard_negative_max_words`` and that the oracle judges NOT to match the gold answers. When
   no attempt is usable, fall back to *answer rotation* (:func:`rotation_answer`): the gold
   answer of another pool record (seeded order), never one equal (normalised) to, or judged
   correct against, this record's gold. Every attempt is returned with the reason it was kept
   or rejected, and whether the fallback was used.
3. **Training sets** (:func:`build_training_sets`), ``N = len(pool)`` items each:
   ``lora_gen``: (c, q) -> a* (the first gold answer); ``lora_eval``: (c, q, a) -> y*, half the
   records (seeded choice) with their gold answer as candidate -> ``Correct``, the other half
   with their hard negative -> ``Incorrect``; ``lora_both``: a 1:1 mix, N/2 items drawn from
   each of the two sets (seeded). Items are encoded for training by
   :func:`interp.methods.lora.encode_example` (Study 1 prompt + target as the assistant reply).
4. **Learning rate on a held-out slice** (:mod:`interp.methods.transfer`): with
   ``lr_grid``, each adapter's rate is chosen on held-out TRAIN records, never on the
   validation records the study reports.
5. **Patching across models** (:func:`cross_model_patching`): with the activation-patching
   engine (:class:`interp.methods.patching.Patcher`, the clean run on the donor model), the residual
   stream after decoder layer L (``blocks.L.hook_resid_post``) is patched from the adapter
   model into the base model (``a->b``) and from the base model into the adapter model
   (``b->a``), at all positions (then ``a->b`` at layer L = adapter layers 0..L followed by
   base layers L+1..: the share of the verdict change produced by layers <= L) or only the
   last one (the share carried by that one residual vector). With the judge's whole-reply
   verdict score ``LD = log P("Correct") - log P("Incorrect")`` (:mod:`interp.judging.verdict`; a
   reply's later tokens are scored by the receiving model from the patched prompt's cache,
   their positions unpatched), the fraction carried at layer L is
   ``(LD_patched(a->b) - LD_base) / (LD_adapter - LD_base)`` and
   ``(LD_adapter - LD_patched(b->a)) / (LD_adapter - LD_base)``, aggregated over prompts as
   the ratio of sums of sign-aligned changes.

Step 4, the learning rate chosen on held-out TRAIN records (the functions at the end of this
module):

The stage (:func:`interp.stages.transfer.select_learning_rates`) trains the adapters once
per candidate of ``lr_grid`` without ``select_holdout`` evenly spaced pool records
(:func:`holdout_split`) and scores them on those held-out TRAIN records, never on the
validation records it reports. Each adapter is scored on what it was trained for
(:data:`SELECTION_RULE`, :func:`selection_score`): LoRA-Gen by held-out GA (its own answers,
graded by the oracle); LoRA-Eval by the judge's balanced accuracy
(:func:`judge_balanced_accuracy`) on the SAME answers for every rate and adapter, each
held-out record's gold answer (y* Correct) and its hard negative (y* Incorrect), so both labels
are always there and a judge that gives one reply to every answer scores 0.5 at most;
LoRA-Both by the mean of the two. Such a one-reply judge is marked ``collapsed`` and ranked
under every judge that is not; then the highest score wins and a tie goes to the smaller
learning rate (:func:`choose_learning_rates`).

Source: balanced accuracy, Brodersen et al. 2010; a held-out split of the training data for
model selection, never the evaluation records (Hastie, Tibshirani & Friedman 2009, 7.2).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch

from interp.core.errors import StageError
from interp.data import DataError, QAExample, load_study_split
from interp.hooks.guard import inference_guard
from interp.judging.grading import BaseOracle, extract_answer, is_abstention, normalize_answer
from interp.judging.prompts import Template, get_template, render
from interp.methods.lora import encode_example
from interp.methods.patching import Patch, Patcher
from interp.models.kv_cache import left_pad, pad_token_id
from interp.models.loading import ModelHandle, end_of_turn_ids, stop_ids
from interp.models.points import hook_name

__all__ = [
    "REFUSAL_PATTERNS",
    "SELECTION_RULE",
    "VERDICT_WORDS",
    "HardNegativeSettings",
    "TransferSettings",
        "build_training_sets",
    "cross_model_patching",
    "is_refusal",
    "mine_hard_negatives",
    "rotation_answer",
    "sample_answers",
    "training_pool",
    "choose_learning_rates",
]

VERDICT_WORDS = {True: "Correct", False: "Incorrect"}


class TransferSettings(Protocol):
    """The settings the methods here read.

    :class:`interp.stages.transfer.TransferConfig` has them all (its docstring explains each).
    """

    datasets: list[str]
    from_hub: bool
    max_train_examples: int
    max_length: int
    templates_path: str | None
    hard_negative_template: str
    hard_negative_attempts: int
    hard_negative_temperature: float
    hard_negative_top_p: float
    hard_negative_max_new_tokens: int
    hard_negative_max_words: int
    seed: int
    batch_size: int


# ---------------------------------------------------------------------------------------------
# Step 2: hard negatives
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HardNegativeSettings:
    """What the closed-book miner reads (:func:`mine_hard_negatives`): one type for both users.

    The transfer study mines one hard negative per training record; the patching study's
    candidate swap mines one per record, one record at a time, with its own seed per record.
    Both configs carry the ``hard_negative_*`` fields (their docstrings explain each):
    :meth:`from_config` takes them, and ``overrides`` replace any field.

    Attributes:
        hard_negative_template: the template whose generation prompt has no context.
        hard_negative_attempts: sampled answers per record before the fallback.
        hard_negative_temperature, hard_negative_top_p: sampling settings.
        hard_negative_max_new_tokens: length cap of an answer (tokens).
        hard_negative_max_words: longer answers are rejected.
        seed: the sampling seed.
        batch_size: prompts per forward.
        templates_path: a TOML of extra templates (None: the built-in ones).
    """

    hard_negative_template: str = "closed_book"
    hard_negative_attempts: int = 5
    hard_negative_temperature: float = 0.7
    hard_negative_top_p: float = 0.9
    hard_negative_max_new_tokens: int = 16
    hard_negative_max_words: int = 12
    seed: int = 0
    batch_size: int = 8
    templates_path: str | None = None

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> HardNegativeSettings:
        """The settings of a stage config (any object with these attributes), then ``overrides``.

        Raises:
            AttributeError: ``config`` lacks a field that ``overrides`` does not give.
        """
        names = [f.name for f in fields(cls)]
        return cls(**{n: overrides[n] if n in overrides else getattr(config, n) for n in names})

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
answer as a hard negative, on top of :func:`interp.judging.grading.is_abstention`'s list: "I need
more information", "cannot be determined", "without more context", "as an AI", "I'm not sure",
"not enough information", "please provide", "it depends", "there is no way to know",
"that's impossible", and an echo of the template's instruction ("A short phrase...")."""

_REFUSAL_RE = re.compile("|".join(f"(?:{p})" for p in REFUSAL_PATTERNS), re.IGNORECASE)


def is_refusal(text: str) -> bool:
    """Whether a closed-book answer is a refusal rather than a (possibly wrong) answer.

    Args:
        text: raw generation or extracted answer.

    Returns:
        True iff :data:`REFUSAL_PATTERNS` or :func:`interp.judging.grading.is_abstention` matches.

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
        temperature: softmax temperature.
        top_p: nucleus (top-p) mass kept.
        max_new_tokens: length cap of a continuation.
        batch_size: prompts per ``generate`` call.

    Returns:
        The decoded continuations up to the first end-of-turn token
        (:func:`interp.models.loading.stop_ids`: the end of turn or any special token), in input
        order.
    """
    tok = handle.tokenizer
    pad_id = pad_token_id(tok)
    stop = stop_ids(tok, handle.model)
    out: list[str] = []
    for b, s in enumerate(range(0, len(prompts), batch_size)):
        ids, mask = left_pad(prompts[s:s + batch_size], pad_id, handle.device)
        torch.manual_seed(seed + b)
        res = handle.model.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                                    temperature=temperature, top_p=top_p, top_k=0,
                                    max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                                    eos_token_id=stop)
        for row in res[:, ids.shape[1]:].tolist():
            cut = next((i for i, t in enumerate(row) if t in stop), len(row))
            out.append(tok.decode(row[:cut], skip_special_tokens=True))
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
        ``(answer, donor_id)``, or ``(None, None)`` when every other gold matches this gold
        or is judged correct for record ``k`` by the oracle.

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
                        config: HardNegativeSettings | TransferSettings, *,
                        rotation: bool = True,
                        prefer: Callable[[int, str], bool] | None = None,
                        log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Step 2 of the module algorithm: one hard negative per pool record.

    Args:
        handle: the base model (asked WITHOUT the context).
        pool: training records (answerable).
        oracle: judges whether a sampled answer matches the gold.
        config: the miner's settings (:class:`HardNegativeSettings`, or a config that has
            them all: :meth:`HardNegativeSettings.from_config` takes them).
        rotation: fall back to answer rotation when no attempt is usable (Study 3); without
            it such a record keeps ``hard_negative`` None (the patching study skips it).
        prefer: ``(record index, answer) -> bool``: a kept answer for which it is False is held
            back (decision ``kept_not_preferred``) and sampling goes on; the first preferred
            answer is taken, else the first held back after the last attempt (the patching
            study prefers answers of the gold's token length, so the candidate span is
            patched as one unit).
        log: progress lines.

    Returns:
        One row per record: ``id``, ``dataset``, ``question``, ``gold`` (list), ``attempts``
        (``[{attempt, generation, answer, decision}]``), ``hard_negative``, ``source``
        (``"closed_book"`` or ``"rotation"``), ``fallback`` (bool), ``donor_id`` (rotation).

    Raises:
        StageError: with ``rotation``, no usable negative at all for a record (all golds
            in the pool equal).
    """
    if not isinstance(config, HardNegativeSettings):
        config = HardNegativeSettings.from_config(config)
    tpl = get_template(config.hard_negative_template, config.templates_path)
    prompts = [render(handle.tokenizer, tpl, "gen", context=ex.context, question=ex.question)
               .input_ids for ex in pool]
    rows = [{"id": ex.id, "dataset": ex.dataset, "question": ex.question,
             "gold": list(ex.answers), "attempts": [], "hard_negative": None,
             "source": None, "fallback": False, "donor_id": None} for ex in pool]
    pending = list(range(len(pool)))
    held: dict[int, str] = {}
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
            if decision == "kept" and prefer is not None and not prefer(k, ans):
                rows[k]["attempts"][-1]["decision"] = "kept_not_preferred"
                held.setdefault(k, ans)
                still.append(k)
            elif decision == "kept":
                rows[k].update(hard_negative=ans, source="closed_book")
            else:
                still.append(k)
        pending = still
        log(f"[hard negatives] attempt {attempt + 1}: {len(pool) - len(pending)}/{len(pool)} "
            f"records have one")
    for k in [k for k in pending if k in held]:
        rows[k].update(hard_negative=held[k], source="closed_book")
    pending = [k for k in pending if k not in held]
    for k in pending if rotation else ():
        ans, donor = rotation_answer(k, pool, oracle, seed=config.seed)
        if ans is None:
            raise StageError("transfer",
                             f"record {pool[k].id}: no hard negative (every closed-book "
                             f"attempt was rejected, and every other pool record's gold "
                             f"answer equals this record's or the oracle {oracle.name} "
                             f"judges it correct here); use more training records")
        rows[k].update(hard_negative=ans, source="rotation", fallback=True, donor_id=donor)
    return rows


# ---------------------------------------------------------------------------------------------
# Steps 1 and 3: training pool and training sets
# ---------------------------------------------------------------------------------------------


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


def training_pool(config: TransferSettings, tokenizer: Any, template: Template, *,
                  log: Callable[[str], None] = print) -> list[QAExample]:
    """Step 1 of the module algorithm: train-split records that fit ``max_length``.

    Raises:
        StageError: a dataset has no train split (DROP in the bundled data) or no record
            fits ``max_length``.
    """
    per_ds = math.ceil(config.max_train_examples / len(config.datasets))
    pool: list[QAExample] = []
    eot = end_of_turn_ids(tokenizer)[0]
    for ds in config.datasets:
        try:
            examples = load_study_split(ds, "train", from_hub=config.from_hub)
        except DataError as err:
            raise StageError("transfer",
                             f"the transfer study trains on the train split of {ds!r}, "
                             f"which is not available: {err}. Use squad_v2, hotpotqa or "
                             f"musique (bundled train splits) or a train file.") from err
        if not examples:
            raise StageError("transfer", f"{ds!r} gives no train record: a file's passages are "
                                         f"dealt out in turn (the 1st, 3rd ... evaluated, the "
                                         f"2nd, 4th ... trained on), so it needs at least two "
                                         f"passages; give a file with more")
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
            raise StageError("transfer", f"no train record of {ds!r} fits max_length="
                                         f"{config.max_length} tokens; raise max_length")
        log(f"[pool] {ds}: {len(kept)} train records ({too_long} longer than "
            f"{config.max_length} tokens skipped)")
        pool += kept
    return pool[: config.max_train_examples]


# ---------------------------------------------------------------------------------------------
# Step 4: cross-model patching
# ---------------------------------------------------------------------------------------------


def _model_lds(donor: ModelHandle, receiver: ModelHandle, prompt: Sequence[int],
               layers: Sequence[int], positions: str) -> tuple[float, float, list[float]]:
    """``(LD_receiver, LD_donor, [LD_patched per layer])`` of one prompt.

    Row r patches the donor's resid_post of ``layers[r]`` into the receiver (all positions, or
    only the last).
    """
    pt = Patcher(receiver, prompt, prompt, donor=donor, batch_size=8, prefix_cache=False)
    last = (len(prompt) - 1,) if positions == "last" else None
    res = pt.run([Patch(hook_name(layer, "hook_resid_post"), last) for layer in layers])
    return pt.corrupt_ld, pt.clean_ld, [float(x) for x in res.patched]


def cross_model_patching(base: ModelHandle, adapter: ModelHandle,
                         prompts: Sequence[Sequence[int]], *, positions: str = "all",
                         layers: Sequence[int] | None = None) -> dict[str, Any]:
    """Patch the residual stream between two models of one architecture (module step 4).

    At ``blocks.L.hook_resid_post``, the adapter's activations go into the base model
    (``a->b``) and the base model's into the adapter (``b->a``), at every position (then ``a->b``
    at layer L = adapter layers 0..L followed by base layers L+1..: the share of the verdict
    change produced by layers <= L) or only the last one (the share carried by that one
    residual vector). The fraction carried at layer L is ``(LD_patched(a->b) - LD_base) /
    (LD_adapter - LD_base)`` and ``(LD_adapter - LD_patched(b->a)) / (LD_adapter - LD_base)``,
    aggregated over prompts as the ratio of sums of sign-aligned changes (prompts with a tiny
    change contribute little instead of exploding). ``LD`` is the whole-reply verdict score
    (module step 4): with a reply of several tokens, its later tokens are scored by the
    receiving model from the patched prompt's cache, so at the last layer the fraction is
    exactly 1 for the first token and close to, not exactly, 1 for the whole reply.

    Args:
        base: the base model.
        adapter: the other model (same tokenizer and architecture), e.g. base + LoRA.
        prompts: eval prompts, token ids ``[seq]`` each.
        positions: ``"all"`` or ``"last"``.
        layers: layers to patch (default all).

    Returns:
        ``layers``, ``positions``, ``ld_base`` / ``ld_adapter`` (per prompt),
        ``patched_a_to_b`` / ``patched_b_to_a`` (``[prompt][layer]`` logit differences),
        ``fraction_a_to_b`` / ``fraction_b_to_a`` per layer (None when the adapter does not
        change the logit difference at all), ``mean_abs_change``.

    Both models run in eval mode (:func:`interp.hooks.guard.inference_guard`) and get their
    training flags and hooks back afterwards, whatever raises.

    Raises:
        StageError: a layer out of range (the message gives the valid range),
            ``positions`` other than ``all`` / ``last``, the same model twice, or two
            models of different shapes (layers, width, heads, vocabulary; named in the
            message).

    Source:
        Paper section 3.3 (patching across the base model and the LoRA adapters).
    """
    if adapter is base or adapter.model is base.model:
        raise StageError("transfer",
                         "cross-model patching needs two models; the adapter given is the "
                         "base model itself (patching it into itself changes nothing)")
    n = base.n_layers
    layers = list(range(n)) if layers is None else [int(x) for x in layers]
    if bad := [L for L in layers if not 0 <= L < n]:
        raise StageError("transfer", f"patch layers {bad} out of range; valid layers: 0..{n - 1}")
    if positions not in ("all", "last"):
        raise StageError("transfer", f"positions must be 'all' or 'last', not {positions!r}")
    shape = {k: (getattr(base.model.config, k, None), getattr(adapter.model.config, k, None))
             for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")}
    if diff := {k: v for k, v in shape.items() if v[0] != v[1]}:
        raise StageError("transfer", f"cross-model patching needs two models of one shape; base vs "
                                     f"adapter differ in {diff}")
    with inference_guard(base, adapter):
        return _cross_model(base, adapter, prompts, positions, layers)


def _cross_model(base: ModelHandle, adapter: ModelHandle, prompts: Sequence[Sequence[int]],
                 positions: str, layers: list[int]) -> dict[str, Any]:
    """The body of :func:`cross_model_patching` (arguments checked)."""
    res: dict[str, Any] = {"layers": layers, "positions": positions, "ld_base": [],
                           "ld_adapter": [], "patched_a_to_b": [], "patched_b_to_a": []}
    for p in prompts:
        lb, la, ab = _model_lds(adapter, base, p, layers, positions)
        _, _, ba = _model_lds(base, adapter, p, layers, positions)
        res["ld_base"].append(lb)
        res["ld_adapter"].append(la)
        res["patched_a_to_b"].append(ab)
        res["patched_b_to_a"].append(ba)
    db, da = torch.tensor(res["ld_base"]), torch.tensor(res["ld_adapter"])
    change = da - db
    sign = torch.sign(change)
    denom = float((change * sign).sum())
    ab_t = torch.tensor(res["patched_a_to_b"])  # [prompt, layer]
    ba_t = torch.tensor(res["patched_b_to_a"])
    if denom < 1e-6:
        res["fraction_a_to_b"] = res["fraction_b_to_a"] = None
    else:
        res["fraction_a_to_b"] = (((ab_t - db[:, None]) * sign[:, None]).sum(0) / denom).tolist()
        res["fraction_b_to_a"] = (((da[:, None] - ba_t) * sign[:, None]).sum(0) / denom).tolist()
    res["mean_abs_change"] = float(change.abs().mean()) if len(prompts) else None
    return res


# ---------------------------------------------------------------------------------------------
# Step 4: the learning rate, chosen on held-out TRAIN records
# ---------------------------------------------------------------------------------------------


SELECTION_RULE = {"lora_gen": ("GA",), "lora_eval": ("judge_balanced_accuracy",),
                  "lora_both": ("GA", "judge_balanced_accuracy")}
"""What each adapter's held-out score averages (module docstring, step 4): the task it is
trained for (LoRA-Gen: generation; LoRA-Eval: judging; LoRA-Both: both, equally)."""


def holdout_split(n: int, hold: int) -> tuple[list[int], list[int]]:
    """Pool indices ``(train, held out)``: ``hold`` evenly spaced records held out.

    Evenly spaced over the pool (which lists its datasets one after another), so each dataset
    gives its share of the held-out records.

    Raises:
        StageError: ``hold`` not in ``1..n-1``.
    """
    if not 0 < hold < n:
        raise StageError("transfer", f"select_holdout = {hold} must be between 1 and the pool's "
                                     f"{n} records less one")
    held = sorted({int((k + 0.5) * n / hold) for k in range(hold)})
    return [i for i in range(n) if i not in set(held)], held


def judge_balanced_accuracy(records: Sequence[Mapping[str, Any]]) -> float | None:
    """The judge's accuracy averaged over the two oracle labels (a missing verdict is wrong).

    ``mean(P(verdict Correct | y* Correct), P(verdict Incorrect | y* Incorrect))``: unlike EA
    it does not reward a judge for matching the base rate, and a judge that gives the same
    verdict to every answer scores at most 0.5 (Brodersen et al. 2010, balanced accuracy).

    Args:
        records: Study 1 records (``oracle_label`` bool, ``verdict`` True/False/None).

    Returns:
        The balanced accuracy in [0, 1]; None when either label is missing (a judge that
        rejects every answer would score 1 on wrong answers alone).
    """
    per = []
    for label in (True, False):
        grp = [r for r in records if bool(r["oracle_label"]) is label]
        if not grp:
            return None
        per.append(sum(r["verdict"] is label for r in grp) / len(grp))
    return sum(per) / 2


def selection_score(adapter: str, own: Sequence[Mapping[str, Any]] = (),
                    judged: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """An adapter's held-out records scored by :data:`SELECTION_RULE`.

    Args:
        adapter: ``lora_gen``, ``lora_eval`` or ``lora_both``.
        own: Study 1 records of the adapter on the held-out records (its own answers, graded
            by the oracle): ``GA`` (LoRA-Gen, LoRA-Both).
        judged: the adapter judging the held-out records' gold answers and hard negatives
            (the same answers for every rate): ``judge_balanced_accuracy`` (LoRA-Eval,
            LoRA-Both). Only ``status == "ok"`` records count in either.

    Returns:
        ``{"n_own", "GA", "n_judged", "judge_balanced_accuracy", "accept_share",
        "no_verdict_share", "collapsed", "score"}``: ``accept_share`` is the share of judged
        answers called ``Correct``; ``collapsed`` is True when the judge gave every judged
        answer the same verdict (or none), None without judged records; ``score`` the mean of
        the rule's metrics (None if one is undefined).

    Raises:
        StageError: an unknown adapter name.
    """
    if adapter not in SELECTION_RULE:
        raise StageError("transfer", f"no selection rule for adapter {adapter!r}; one of "
                                     f"{sorted(SELECTION_RULE)}")
    own = [r for r in own if r.get("status", "ok") == "ok"]
    judged = [r for r in judged if r.get("status", "ok") == "ok"]
    n = len(judged)
    out: dict[str, Any] = {
        "n_own": len(own),
        "GA": sum(bool(r["oracle_label"]) for r in own) / len(own) if own else None,
        "n_judged": n,
        "judge_balanced_accuracy": judge_balanced_accuracy(judged),
        "accept_share": sum(r["verdict"] is True for r in judged) / n if n else None,
        "no_verdict_share": sum(r["verdict"] is None for r in judged) / n if n else None,
        "collapsed": len({r["verdict"] for r in judged}) <= 1 if n else None,
    }
    vals = [out[k] for k in SELECTION_RULE[adapter]]
    out["score"] = None if None in vals else sum(vals) / len(vals)
    return out


def choose_learning_rates(scores: Mapping[float, Mapping[str, Mapping[str, Any]]]
                          ) -> dict[str, dict[str, Any]]:
    """Each adapter's learning rate from its held-out scores (module docstring, step 4).

    A rate with a score beats one without; a judge that did not collapse beats one that did;
    then the higher score wins, and a tie goes to the smaller rate.

    Args:
        scores: ``{lr: {adapter: selection_score(...)}}``.

    Returns:
        ``{adapter: {"lr", "by"}}`` for every adapter scored at some rate, ``by`` saying how:
        ``held-out score``, or ``smallest rate: no rate could be scored`` when every score is
        None (every held-out record failed).
    """
    names = sorted({a for per in scores.values() for a in per})
    out = {}
    for a in names:
        rates = sorted(lr for lr in scores if a in scores[lr])
        best = max(rates, key=lambda lr: (scores[lr][a]["score"] is not None,
                                          scores[lr][a].get("collapsed") is not True,
                                          scores[lr][a]["score"] or 0.0, -lr))
        out[a] = {"lr": best, "by": "held-out score" if scores[best][a]["score"] is not None
                  else "smallest rate: no rate could be scored"}
    return out
