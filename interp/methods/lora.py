"""LoRA adapters for the transfer study: encode training items, train, save, load, fingerprint.

Algorithm (paper section 3.3; the study around it is :mod:`interp.stages.transfer`):

1. **Encoding** (:func:`encode_example`): the Study 1 prompt (:func:`interp.judging.prompts.render`,
   chat template) plus the target as the assistant reply plus the chat template's end-of-turn
   token (the first of :func:`interp.models.loading.end_of_turn_ids`); labels are -100 everywhere
   except the target tokens (loss only on the answer / verdict).
2. **Training** (:func:`train_adapter`): a peft LoRA adapter on a deep copy of the base model
   (the base model object is never modified), AdamW on the LoRA parameters only, linear
   warm-up then constant learning rate, right-padded batches in a seeded order per epoch,
   mean token cross-entropy over answer tokens. A checkpoint (LoRA weights, optimizer, RNG
   state, step; written atomically, ``state.json`` last, with what it trains and its files'
   sha256) is written every ``checkpoint_every`` optimizer steps and at every epoch end; a
   restarted training resumes from it and ends with the same weights as an uninterrupted one
   (a checkpoint of another training, or with files from different steps, is started again).
   The saved adapter replaces its checkpoint (removed). The adapter is saved with
   peft's ``save_pretrained`` plus ``interp_adapter.json`` (settings, base model
   fingerprint, losses, training time).
3. **Loading** (:func:`load_adapter`): onto a fresh copy of the base model, after checking the
   adapter's recorded fingerprint (:func:`model_fingerprint`: spec, weight sha256, shape
   facts) against the base model's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from jaxtyping import Int
from torch import Tensor

from interp.core.errors import StageError
from interp.core.io import atomic_path, read_json, save_tensors, write_json
from interp.core.progress import tqdm
from interp.judging.prompts import Template, render
from interp.models.gguf import sha256_file
from interp.models.loading import ModelHandle, end_of_turn_ids

__all__ = [
    "LORA_FIELDS",
    "check_in_memory",
    "LoraSettings",
    "encode_example",
    "check_adapter_state",
    "load_adapter",
    "model_fingerprint",
    "train_adapter",
]

LORA_FIELDS = ("rank", "alpha", "dropout", "target_modules", "lora_layers", "lr", "epochs",
               "train_batch_size", "warmup_steps", "weight_decay", "seed", "checkpoint_every")
"""The settings :func:`train_adapter` reads (:class:`LoraSettings`)."""


class LoraSettings(Protocol):
    """The LoRA and optimisation settings :func:`train_adapter` reads.

    :class:`interp.stages.transfer.TransferConfig` has them all (its docstring explains each).
    """

    rank: int
    alpha: int
    dropout: float
    target_modules: list[str]
    lora_layers: list[int] | None
    lr: float
    epochs: int
    train_batch_size: int
    warmup_steps: int
    weight_decay: float
    seed: int
    checkpoint_every: int


# ---------------------------------------------------------------------------------------------
# Step 1: encoding
# ---------------------------------------------------------------------------------------------


def encode_example(tokenizer: Any, template: Template, item: Mapping[str, Any], *,
                   eot_id: int | None = None) -> dict[str, list[int]]:
    """Tokenize one training item: the Study 1 prompt plus the target as the assistant reply.

    Args:
        tokenizer: chat tokenizer.
        template: the Study 1 template variant.
        item: ``{"task": "gen"|"eval", "context", "question", "answer" (eval), "target"}``.
        eot_id: end-of-turn token (default: the first of
            :func:`interp.models.loading.end_of_turn_ids`, the template's own).

    Returns:
        ``input_ids [seq]`` = prompt ids + target ids + [eot], and ``labels [seq]`` with -100 on
        every prompt position and the token id on target and end-of-turn positions (the loss
        is on the answer only).
    """
    p = render(tokenizer, template, item["task"], context=item["context"],
               question=item["question"], answer=item.get("answer"))
    eot = end_of_turn_ids(tokenizer)[0] if eot_id is None else eot_id
    target = tokenizer(item["target"], add_special_tokens=False)["input_ids"] + [eot]
    return {"input_ids": list(p.input_ids) + target,
            "labels": [-100] * len(p.input_ids) + target}


# ---------------------------------------------------------------------------------------------
# Step 2: training
# ---------------------------------------------------------------------------------------------


def model_fingerprint(handle: ModelHandle) -> dict[str, Any]:
    """What an adapter must match: spec, weight sha256 and shape facts of the base model."""
    cfg = handle.model.config
    return {"spec": handle.spec, "sha256": handle.info.get("sha256"),
            "n_layers": cfg.num_hidden_layers, "d_model": cfg.hidden_size,
            "n_heads": cfg.num_attention_heads, "vocab_size": cfg.vocab_size}


def _lora_config(config: LoraSettings) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
                      target_modules=list(config.target_modules), bias="none",
                      layers_to_transform=config.lora_layers, task_type="CAUSAL_LM")


def _pad_right(batch: Sequence[Mapping[str, list[int]]], pad_id: int
               ) -> tuple[Int[Tensor, "batch seq"], Int[Tensor, "batch seq"],
                          Int[Tensor, "batch seq"]]:
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


_CHECKPOINT_FILES = ("lora.safetensors", "optimizer.pt", "rng.pt")


def _save_checkpoint(ck: Path, model: Any, opt: Any, state: Mapping[str, Any]) -> None:
    """Write LoRA weights, optimizer and RNG state atomically; ``state.json`` last.

    ``state.json`` marks the checkpoint complete and holds the sha256 of the other files, so
    a checkpoint whose files come from different steps (a copy taken while training wrote
    one) is recognised (:func:`_checkpoint_whole`).
    """
    from peft import get_peft_model_state_dict

    save_tensors(ck / "lora.safetensors", get_peft_model_state_dict(model))
    with atomic_path(ck / "optimizer.pt") as tmp:
        torch.save(opt.state_dict(), tmp)
    with atomic_path(ck / "rng.pt") as tmp:
        torch.save(torch.get_rng_state(), tmp)
    write_json(ck / "state.json", {**state, "files_sha256": {
        f: sha256_file(ck / f) for f in _CHECKPOINT_FILES}})


def _checkpoint_whole(ck: Path, state: Mapping[str, Any]) -> bool:
    """Whether every file of checkpoint ``ck`` is the one its ``state.json`` was written with.

    A checkpoint written before the hashes were recorded is taken as whole.
    """
    want = state.get("files_sha256")
    return want is None or all((ck / f).exists() and sha256_file(ck / f) == want.get(f)
                               for f in _CHECKPOINT_FILES)


def check_adapter_state(model: Any, path: Path) -> None:
    """Refuse an adapter file whose tensors are not exactly the model's adapter tensors.

    peft loads an adapter whose keys are missing or carry another prefix with only a warning
    and leaves those LoRA matrices at their initialisation (``lora_B`` = 0: the adapter does
    nothing). Every adapter tensor of ``model`` must be in the file under its key, no file key
    may be left over, and after loading each must equal the file's.
    See https://huggingface.co/docs/peft/developer_guides/checkpoint.

    Args:
        model: a peft model after its adapter was loaded from ``path``.
        path: the adapter's safetensors file.

    Raises:
        StageError: one line naming the file and the missing, unexpected or unloaded keys.
    """
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    have, got = get_peft_model_state_dict(model), load_file(str(path))
    missing, extra = sorted(set(have) - set(got)), sorted(set(got) - set(have))
    unloaded = sorted(k for k in set(have) & set(got)
                      if not torch.equal(have[k].detach().cpu().float(), got[k].float()))

    def few(keys: list[str]) -> str:
        return ", ".join(keys[:3]) + (f" (+{len(keys) - 3} more)" if len(keys) > 3 else "")

    parts = [f"{what} {len(keys)} key(s): {few(keys)}" for what, keys in
             (("lacks", missing), ("has unexpected", extra), ("did not load", unloaded)) if keys]
    if parts:
        raise StageError("transfer",
                         f"adapter file {path} {'; '.join(parts)}; it would leave the model "
                         f"(partly) equal to its base: retrain it or fix its keys")


def _load_checkpoint(ck: Path, model: Any, opt: Any) -> dict[str, Any]:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = read_json(ck / "state.json")
    state.pop("files_sha256", None)
    set_peft_model_state_dict(model, load_file(str(ck / "lora.safetensors")))
    check_adapter_state(model, ck / "lora.safetensors")
    opt.load_state_dict(torch.load(ck / "optimizer.pt", weights_only=False))
    torch.set_rng_state(torch.load(ck / "rng.pt", weights_only=False))
    return state


class _Clock:
    """Wall and process CPU seconds, added to ``state`` at each :meth:`tick`."""

    def __init__(self, state: dict[str, Any]):
        self.state = state
        self.t0, self.c0 = time.perf_counter(), time.process_time()

    def tick(self) -> None:
        self.state["train_seconds"] = (self.state.get("train_seconds", 0.0)
                                       + time.perf_counter() - self.t0)
        self.state["train_cpu_seconds"] = (self.state.get("train_cpu_seconds", 0.0)
                                           + time.process_time() - self.c0)
        self.t0, self.c0 = time.perf_counter(), time.process_time()


def _step(model: Any, opt: Any, batch: Sequence[Mapping[str, list[int]]], lr: float,
          pad_id: int, device: Any) -> float:
    """One optimizer step at learning rate ``lr``; returns the batch loss."""
    ids, mask, labels = (t.to(device) for t in _pad_right(batch, pad_id))
    for group in opt.param_groups:
        group["lr"] = lr
    with torch.enable_grad():
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return float(loss.detach())


def check_in_memory(handle: ModelHandle, what: str) -> None:
    """Refuse LoRA on a model whose weights are not all in memory (an offloading device map).

    accelerate keeps offloaded blocks on the ``meta`` device between forwards; peft cannot wrap
    them and a gradient cannot flow into them, so training and loading an adapter need every
    weight loaded.

    Raises:
        StageError: some weights are on the ``meta`` device (one line naming the device
            map's offloaded modules and what to do).
    """
    meta = [n for n, p in handle.model.named_parameters() if p.device.type == "meta"]
    if not meta:
        return
    dm = handle.info.get("device_map") or {}
    off = sorted({k for k, v in dm.items() if v in ("disk", "meta")}) or sorted(
        {n.rsplit(".", 2)[0] for n in meta})
    raise StageError("transfer",
                     f"{what} needs every weight of {handle.spec} in memory, but its "
                     f"device_map offloads {len(off)} modules ({', '.join(off[:3])}"
                     f"{', ...' if len(off) > 3 else ''}): load it without disk offload "
                     f"(device_map 'auto' with enough memory, or max_memory) for LoRA")


def train_adapter(handle: ModelHandle, encoded: Sequence[Mapping[str, list[int]]],
                  config: LoraSettings, out_dir: str | Path, *,
                  checkpoint_dir: str | Path | None = None, name: str = "adapter",
                  stop_after_steps: int | None = None,
                  meta_config: Mapping[str, Any] | None = None,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train one LoRA adapter on encoded items; resume from a checkpoint; save the adapter.

    Args:
        handle: the base model; it is deep-copied, never modified.
        encoded: :func:`encode_example` outputs (``input_ids``, ``labels``).
        config: LoRA and optimisation settings (:class:`LoraSettings`).
        out_dir: adapter folder (peft ``save_pretrained`` + ``interp_adapter.json``).
        checkpoint_dir: where checkpoints go (default ``out_dir/../checkpoints/<name>``).
        name: adapter name (logs, metadata).
        stop_after_steps: stop (as if killed) after this many optimizer steps in this call,
            leaving only the checkpoint (tests of resumption).
        meta_config: the settings recorded as ``config`` in ``interp_adapter.json`` (default:
            :data:`LORA_FIELDS` of ``config``).
        log: progress lines.

    Returns:
        The ``interp_adapter.json`` content (``{"name", "stopped_at_step"}`` when stopped
        early): ``name``, ``base`` (fingerprint), ``config``, ``n_examples``, ``n_steps``,
        ``losses`` (mean loss per step), ``train_seconds`` (wall clock) and
        ``train_cpu_seconds`` (process CPU time, all threads), both summed over the runs
        that resumed it.

    Raises:
        StageError: an empty training set, or a model with offloaded weights
            (:func:`check_in_memory`).
    """
    from peft import get_peft_model

    out_dir = Path(out_dir)
    ck = Path(checkpoint_dir) if checkpoint_dir else out_dir.parent.parent / "checkpoints" / name
    if (out_dir / "interp_adapter.json").exists():
        return read_json(out_dir / "interp_adapter.json")
    if not encoded:
        raise StageError("transfer", f"adapter {name}: empty training set")
    check_in_memory(handle, f"training the LoRA adapter {name}")
    torch.manual_seed(config.seed)
    model = get_peft_model(copy.deepcopy(handle.model), _lora_config(config))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                            weight_decay=config.weight_decay)
    bs = config.train_batch_size
    total = (steps_per_epoch := math.ceil(len(encoded) / bs)) * config.epochs
    settings = (dict(meta_config) if meta_config is not None
                else {k: getattr(config, k) for k in LORA_FIELDS})
    # what the checkpoint continues: a checkpoint of another training (other settings, base
    # or training set, e.g. one restored from a saved state) is started again, never resumed
    items = hashlib.sha256(json.dumps([[e["input_ids"], e["labels"]] for e in encoded])
                           .encode()).hexdigest()
    trains = json.loads(json.dumps({"config": settings, "base": model_fingerprint(handle),
                                    "n_examples": len(encoded), "items_sha256": items,
                                    "n_steps": total}))  # as read back from state.json
    state: dict[str, Any] = {"global_step": 0, "losses": [], "train_seconds": 0.0,
                             "train_cpu_seconds": 0.0, "trains": trains}
    if (ck / "state.json").exists():
        saved = read_json(ck / "state.json")
        other = saved.get("trains", trains) != trains
        if other or not _checkpoint_whole(ck, saved):
            why = ("is of another training (settings, base model or training set differ)"
                   if other else "has files from different steps")
            log(f"[{name}] checkpoint {ck} {why}: started again from step 0")
            shutil.rmtree(ck)
        else:
            state = _load_checkpoint(ck, model, opt)
            state["trains"] = trains
            log(f"[{name}] resumed from step {state['global_step']}/{total}")
    pad_id = handle.tokenizer.pad_token_id or 0
    model.train()
    clock, done_here = _Clock(state), 0
    bar = tqdm(total=total, initial=state["global_step"], desc=f"train {name}", unit="step",
               leave=False)
    while state["global_step"] < total:
        g = state["global_step"]
        epoch, step = divmod(g, steps_per_epoch)
        order = _epoch_order(len(encoded), config.seed, epoch)
        batch = [encoded[i] for i in order[step * bs:(step + 1) * bs]]
        lr = config.lr * min(1.0, (g + 1) / max(1, config.warmup_steps))  # warm-up, constant
        state["losses"].append(_step(model, opt, batch, lr, pad_id, handle.device))
        state["global_step"] = g + 1
        done_here += 1
        bar.update(1)
        bar.set_postfix(loss=f"{state['losses'][-1]:.3f}", refresh=False)
        if (g + 1) % config.checkpoint_every == 0 or (g + 1) % steps_per_epoch == 0:
            clock.tick()
            _save_checkpoint(ck, model, opt, state)
        if (g + 1) % max(1, steps_per_epoch // 4) == 0:
            log(f"[{name}] step {g + 1}/{total} loss {state['losses'][-1]:.3f}")
        if stop_after_steps is not None and done_here >= stop_after_steps \
                and state["global_step"] < total:
            clock.tick()
            _save_checkpoint(ck, model, opt, state)
            bar.close()
            return {"name": name, "stopped_at_step": state["global_step"]}
    bar.close()
    clock.tick()
    meta = _save_adapter(model, out_dir, {
        "name": name, "base": trains["base"], "config": settings,
        "n_examples": len(encoded), "n_steps": total, "losses": state["losses"],
        "train_seconds": state["train_seconds"],
        "train_cpu_seconds": state["train_cpu_seconds"]})
    # the adapter supersedes its checkpoint: a checkpoint on disk means unfinished training
    # (what a study's saved state keeps, experiments.findings.state)
    shutil.rmtree(ck, ignore_errors=True)
    return meta


def _save_adapter(model: Any, out_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Save the adapter with peft into ``out_dir``, then ``meta`` as ``interp_adapter.json``."""
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    write_json(out_dir / "interp_adapter.json", meta)
    return meta


# ---------------------------------------------------------------------------------------------
# Step 3: loading
# ---------------------------------------------------------------------------------------------


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
        StageError: the folder is not an adapter, it was trained on another base model
            (the message shows both fingerprints), or its weight file's keys do not load
            exactly (:func:`check_adapter_state`), or the base model has offloaded weights
            (:func:`check_in_memory`).
    """
    check_in_memory(handle, "loading a LoRA adapter")
    from peft import PeftModel

    adapter_dir = Path(adapter_dir)
    meta_path = adapter_dir / "interp_adapter.json"
    if not (adapter_dir / "adapter_config.json").exists() or not meta_path.exists():
        raise StageError("transfer",
                         f"{adapter_dir} holds no trained adapter (adapter_config.json and "
                         f"interp_adapter.json expected); train it with `interp transfer`")
    meta = read_json(meta_path)
    want, have = meta.get("base", {}), model_fingerprint(handle)
    diff = {k: (want.get(k), have[k]) for k in have if want.get(k) != have[k]}
    if diff:
        lines = "; ".join(f"{k}: adapter {a!r} vs model {b!r}" for k, (a, b) in diff.items())
        raise StageError("transfer",
                         f"adapter {adapter_dir} was trained on another base model ({lines})")
    name = name or adapter_dir.name
    model = PeftModel.from_pretrained(copy.deepcopy(handle.model), str(adapter_dir)).eval()
    check_adapter_state(model, adapter_dir / "adapter_model.safetensors")
    model.requires_grad_(False)
    info = {**handle.info, "spec": f"{handle.spec}+{name}", "adapter": str(adapter_dir)}
    return ModelHandle(model=model, tokenizer=handle.tokenizer, spec=f"{handle.spec}+{name}",
                       info=info)
