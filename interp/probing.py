"""Probes on the residual stream: does the judge know more than it says? (representation-as-a-judge)

Seed 003 (*Representation-as-a-Judge*, "semantic capacity asymmetry"): a small model's hidden
states often encode the evaluation signal its spoken verdict misses. Here the probe target is
the oracle label ``y* = oracle_label`` of each record (positive class: Correct), and the verbal
judge is the same model's ``verdict`` / ``p_correct`` on the same records (paper section 3.1).

Algorithm:

1. Records: read the ``ok`` records of an asymmetry run (``DIR/records.jsonl``). Re-render each
   record's eval prompt (candidate = the record's extracted ``answer``) and gen prompt with the
   template named in the record, and check that the token spans and length equal the record's
   ``prompts.{eval,gen}`` (a mismatch names the record: other tokenizer or template file).
2. Residual stream: one forward pass per prompt (or left-padded batches, position ids
   ``cumsum(mask) - 1``), hook point ``resid_post`` of every layer L
   (TransformerLens ``blocks.L.hook_resid_post``: the output of decoder layer L, before the
   final norm). With transformers' ``output_hidden_states=True``, ``hidden_states[0]`` is the
   embedding output (``resid_pre`` of layer 0) and ``hidden_states[L + 1]`` is ``resid_post`` of
   layer L for ``L < n_layers - 1``; the LAST entry is NOT ``resid_post`` of the last layer:
   ``transformers.utils.output_capturing.capture_outputs`` (``tie_last_hidden_states=True``)
   replaces it by ``last_hidden_state``, i.e. after the final RMSNorm. That layer's
   ``resid_post`` is read with a forward hook on ``model.model.layers[n_layers - 1]``.
3. Pools per layer over the prompt's real positions only (padding never enters a pool):
   ``last`` (the last position: the verdict position of the eval prompt), ``candidate`` (mean
   over the candidate span; eval prompt only; an empty candidate falls back to ``last`` and is
   counted), ``mean`` (mean over the whole prompt), ``max`` and ``min`` (per dimension over the
   whole prompt). Features are cached in ``DIR/probes/features_{task}.safetensors``
   (``[n_records, n_layers, d_model]`` per pool; resumes by record key).
4. Probes (scikit-learn): ``StandardScaler`` fitted on the training fold, then a class-balanced
   ``LogisticRegression`` (``logreg``, the first probe), a class-balanced ``LinearSVC``
   (``svm``) and a small ``MLPClassifier`` (``mlp``, balanced sample weights).
   ``StratifiedGroupKFold(folds, shuffle=True, random_state=seed)`` with one group per passage
   (dataset + context hash; SQuAD and DROP ask several questions about one passage): the same
   folds for every layer, pool, probe and for the verbal judge; no record and no passage is in
   both a train and a test fold.
5. Sweep: the first probe is cross-validated at every (layer, pool); the others at the
   ``top_k`` (layer, pool) of the first by the selection metric (``select_by``: CV ROC AUC by
   default, or CV F1), or at every cell with ``sweep_all``. Per cell: accuracy, balanced
   accuracy, F1 of Correct, macro F1 and ROC AUC, mean and std over folds.
6. Questions answered in ``DIR/probes/results.json``: the best (probe, layer, pool) of the eval
   prompt; the probe against the verbal judge on the same records and folds (EA, F1 of the
   verdict, ROC AUC of ``p_correct``, and McNemar on out-of-fold predictions); a gen-prompt
   probe (does the residual stream before answering predict whether the model's own answer
   will be right?); cross-dataset transfer of the best eval probe (train on all records of one
   dataset, test on another's, for datasets with both classes).
7. The best probe of each kind and task is refitted on all records and saved as ``.npz`` plus
   ``.json`` (scaler mean/scale, coef, intercept; MLP weight matrices), never pickles; the
   figure ``DIR/figures/probes.png`` is drawn from ``results.json``.

Source: seed 003 (INSPECTOR: hidden states, pooled mean/last/min/max, logistic regression
first, also linear SVM and MLP, cross-validated per layer); PAPER.md "Related seed:
representation-as-a-judge".
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
import typer

from interp.errors import ProbeError
from interp.models import ModelHandle
from interp.prompts import RenderedPrompt, get_template, render
from interp.store import (
    RunDir,
    RunDirError,
    config_from_table,
    load_tensors,
    read_json,
    record_key,
    save_tensors,
    write_json,
)

STAGE = "probe"
SUMMARIES = {"probes/results.json": "probes_results.json"}
"""Run-dir tables that ``interp run`` copies next to the figures (source -> name)."""
HOOK_POINT = "resid_post"
HOOK_POINT_DOC = ("resid_post (TransformerLens blocks.L.hook_resid_post): output of decoder "
                  "layer L before the final norm; transformers hidden_states[L+1] for "
                  "L < n_layers-1, a forward hook on model.model.layers[n_layers-1] for the last "
                  "layer (transformers' hidden_states[-1] is after the final norm)")
POOLS = ("last", "candidate", "mean", "max", "min")
PROBES = ("logreg", "svm", "mlp")
TASKS = ("eval", "gen")
METRICS = ("accuracy", "balanced_accuracy", "f1", "f1_macro", "auc")
FEATURES_VERSION = "1"


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@dataclass
class ProbeConfig:
    """Settings of ``interp probe`` and of the ``[probe]`` stage of ``interp run``.

    Attributes:
        folds: k of the stratified k-fold cross-validation.
        layers: layers to probe (None: all); features are always cached for all layers.
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
        limit: use only the first N ok records of each dataset (None: all); the cost is about
            two forward passes per record (eval + gen prompt).
        permutations: label permutations for the selection-aware null of the best cell
            (:func:`permutation_null`; 0 = off); each costs one sweep of the first probe.
    """

    folds: int = 5
    layers: list[int] | None = None
    probes: list[str] = field(default_factory=lambda: list(PROBES))
    pools: list[str] = field(default_factory=lambda: list(POOLS))
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    batch_size: int = 4
    seed: int = 0
    select_by: str = "auc"
    top_k: int = 5
    sweep_all: bool = False
    C: float = 1.0
    mlp_hidden: int = 64
    mlp_alpha: float = 1e-2
    transfer_min_per_class: int = 2
    limit: int | None = None
    permutations: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.probes, str):
            self.probes = [p.strip() for p in self.probes.split(",") if p.strip()]
        if isinstance(self.pools, str):
            self.pools = [p.strip() for p in self.pools.split(",") if p.strip()]
        if isinstance(self.tasks, str):
            self.tasks = [p.strip() for p in self.tasks.split(",") if p.strip()]
        if isinstance(self.layers, str):
            self.layers = parse_layers(self.layers)
        for name, vals, known in (("probe", self.probes, PROBES), ("pool", self.pools, POOLS),
                                  ("task", self.tasks, TASKS)):
            if not vals:
                raise ProbeError(f"no {name}s given; choose from {list(known)}")
            if bad := [v for v in vals if v not in known]:
                raise ProbeError(f"unknown {name}(s) {bad}; known: {list(known)}")
        if self.select_by not in ("auc", "f1"):
            raise ProbeError(f"select_by must be 'auc' or 'f1', not {self.select_by!r}")
        if self.folds < 2:
            raise ProbeError(f"folds must be >= 2, not {self.folds}")
        if self.batch_size < 1:
            raise ProbeError("batch_size must be >= 1")
        if self.limit is not None and self.limit < 1:
            raise ProbeError(f"limit must be >= 1 or None, not {self.limit}")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> ProbeConfig:
        """Build from a config table, refusing unknown keys (the error lists the known ones).

        Raises:
            ValueError: an unknown key.
        """
        return config_from_table(cls, d, STAGE)


def parse_layers(spec: str | Sequence[int] | None, n_layers: int | None = None) -> list[int] | None:
    """Parse ``"0,4,10-12,-1"`` into sorted layer indices, checked against ``n_layers``.

    Args:
        spec: comma-separated ints and inclusive ranges ``a-b``; negative ints count from the
            end (needs ``n_layers``); a list of ints; None for all layers.
        n_layers: the model's number of layers (None: no range check).

    Returns:
        Sorted unique layer indices, or None (all).

    Raises:
        ProbeError: a malformed item or a layer outside ``0..n_layers-1`` (names the valid range).
    """
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return None
    items: list[int] = []
    if isinstance(spec, str):
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            try:
                if "-" in part[1:]:
                    a, b = part[0] + part[1:].split("-", 1)[0], part[1:].split("-", 1)[1]
                    items += list(range(int(a), int(b) + 1))
                else:
                    items.append(int(part))
            except ValueError as err:
                raise ProbeError(f"bad layer item {part!r} in {spec!r}; use e.g. '0,4,10-12'") \
                    from err
    else:
        items = [int(x) for x in spec]
    if n_layers is not None:
        out = []
        for L in items:
            L2 = L + n_layers if L < 0 else L
            if not 0 <= L2 < n_layers:
                raise ProbeError(f"layer {L} does not exist; valid layers are 0..{n_layers - 1} "
                                 f"(or -{n_layers}..-1)")
            out.append(L2)
        items = out
    return sorted(set(items))


# ---------------------------------------------------------------------------------------------
# Step 1: prompts re-rendered from records
# ---------------------------------------------------------------------------------------------


def rerender(record: Mapping[str, Any], task: str, tokenizer: Any, *,
             templates_path: str | None = None) -> RenderedPrompt:
    """Re-render a record's ``task`` prompt and check it against the record.

    The eval prompt's candidate is the record's extracted ``answer``; the reference (for
    templates with ``{reference}``) is the first gold answer, as in
    :func:`interp.asymmetry.evaluate_examples`.

    Args:
        record: an ``ok`` record of an asymmetry run.
        task: ``"eval"`` or ``"gen"``.
        tokenizer: the model's tokenizer.
        templates_path: the run's template file (``manifest.config.templates_path``).

    Returns:
        The :class:`interp.prompts.RenderedPrompt`.

    Raises:
        ProbeError: the token spans or length differ from ``record["prompts"][task]`` (names
            the record; another tokenizer, template or template file was used).
    """
    tpl = get_template(record.get("template") or "default", templates_path)
    answers = record.get("answers") or []
    rp = render(tokenizer, tpl, task, context=record["context"], question=record["question"],
                answer=record.get("answer") if task == "eval" else None,
                reference=answers[0] if answers else "")
    stored = (record.get("prompts") or {}).get(task)
    rid = f"{record.get('dataset')}/{record.get('id')}"
    if not stored:
        raise ProbeError(f"record {rid} has no prompts.{task}; re-run `interp asymmetry`")
    mine = {k: list(v) for k, v in rp.token_spans.items()}
    theirs = {k: list(v) for k, v in stored["token_spans"].items()}
    if mine != theirs or len(rp) != stored["n_tokens"]:
        raise ProbeError(
            f"record {rid}: the re-rendered {task} prompt ({len(rp)} tokens, spans {mine}) does "
            f"not match the record ({stored['n_tokens']} tokens, spans {theirs}); the run was made "
            f"with another tokenizer, template {record.get('template')!r} or template file")
    return rp


# ---------------------------------------------------------------------------------------------
# Step 2-3: residual stream and pools
# ---------------------------------------------------------------------------------------------


def _decoder(model: Any) -> tuple[Any, Any]:
    """The base decoder (``model.model``) and its layer list."""
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if base is None or layers is None:
        raise ProbeError(f"{type(model).__name__} has no model.model.layers; residual stream "
                         f"extraction supports Llama-style decoders")
    return base, layers


@torch.inference_mode()
def residual_stream(handle: ModelHandle, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``resid_post`` of every layer for a (left-padded) batch.

    Args:
        handle: the model.
        input_ids: ``[batch, seq]`` token ids (left padding).
        attention_mask: ``[batch, seq]``, 1 for real tokens (None: all real).

    Returns:
        ``[batch, n_layers, seq, d_model]`` float32 on CPU; entry ``[:, L]`` is the output of
        decoder layer L (module docstring, step 2). Padded positions hold garbage.

    Source:
        transformers ``capture_outputs`` (output_capturing.py): ``hidden_states[L+1]`` is the
        output of layer L except the last, which is replaced by the final-norm output.
    """
    base, layers = _decoder(handle.model)
    dev = handle.device
    input_ids = input_ids.to(dev)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = attention_mask.to(dev)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    captured: dict[str, torch.Tensor] = {}

    def hook(_module: Any, _args: Any, output: Any) -> None:
        captured["last"] = output[0] if isinstance(output, tuple) else output

    h = layers[len(layers) - 1].register_forward_hook(hook)
    try:
        out = base(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids, output_hidden_states=True, use_cache=False)
    finally:
        h.remove()
    hs = list(out.hidden_states[1:-1]) + [captured["last"]]
    return torch.stack(hs, dim=1).float().cpu()


def pool_resid(resid: torch.Tensor, candidate: Sequence[int] | None,
               pools: Sequence[str]) -> tuple[dict[str, torch.Tensor], bool]:
    """Pool one prompt's residual stream (real positions only).

    Args:
        resid: ``[n_layers, seq, d_model]`` of ONE prompt without padding.
        candidate: ``(start, end)`` token span of the candidate (end exclusive), or None.
        pools: names from :data:`POOLS`.

    Returns:
        ``({pool: [n_layers, d_model]}, fell_back)``; ``fell_back`` is True when the candidate
        pool was asked for without a candidate span and the last position was used.
    """
    out: dict[str, torch.Tensor] = {}
    fell_back = False
    for p in pools:
        if p == "last":
            out[p] = resid[:, -1]
        elif p == "mean":
            out[p] = resid.mean(1)
        elif p == "max":
            out[p] = resid.amax(1)
        elif p == "min":
            out[p] = resid.amin(1)
        elif p == "candidate":
            if candidate is None or candidate[1] <= candidate[0]:
                out[p] = resid[:, -1]
                fell_back = True
            else:
                out[p] = resid[:, candidate[0]:candidate[1]].mean(1)
        else:
            raise ProbeError(f"unknown pool {p!r}; known: {list(POOLS)}")
    return out, fell_back


def task_pools(task: str, pools: Sequence[str]) -> list[str]:
    """The pools that apply to a task (the gen prompt has no candidate)."""
    return [p for p in pools if not (task == "gen" and p == "candidate")]


def extract_features(handle: ModelHandle, prompts: Sequence[RenderedPrompt], *,
                     pools: Sequence[str] = POOLS, batch_size: int = 4,
                     progress: bool = False) -> tuple[dict[str, torch.Tensor], list[bool]]:
    """Pooled ``resid_post`` features of rendered prompts (left-padded batches).

    Args:
        handle: the model.
        prompts: rendered prompts (``token_spans`` give the candidate span).
        pools: pool names.
        batch_size: prompts per forward; 1 runs one prompt at a time.
        progress: show a tqdm bar.

    Returns:
        ``({pool: [n_prompts, n_layers, d_model] float32}, fell_back per prompt)``. Left padding
        is cut off before pooling, so a padded batch gives the same features as one prompt at a
        time (to float tolerance).
    """
    tok = handle.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    from interp.generation import left_pad

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    feats: dict[str, list[torch.Tensor | None]] = {p: [None] * len(prompts) for p in pools}
    fell = [False] * len(prompts)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="residual stream", unit="batch")
    for idx in batches:
        ids, mask = left_pad([prompts[i].input_ids for i in idx], pad_id)
        resid = residual_stream(handle, ids, mask)
        width = ids.shape[1]
        for row, i in enumerate(idx):
            n = len(prompts[i])
            pooled, fb = pool_resid(resid[row, :, width - n:], prompts[i].token_spans.get(
                "candidate"), pools)
            fell[i] = fb
            for p, v in pooled.items():
                feats[p][i] = v.clone()
    return {p: torch.stack(v) for p, v in feats.items()}, fell  # type: ignore[arg-type]


def _key(rec: Mapping[str, Any]) -> str:
    return "/".join(record_key(rec))


def cached_features(run: RunDir, handle: ModelHandle, records: Sequence[Mapping[str, Any]],
                    task: str, *, pools: Sequence[str] = POOLS, batch_size: int = 4,
                    templates_path: str | None = None, chunk: int = 32,
                    log: Callable[[str], None] = print) -> tuple[dict[str, np.ndarray], dict]:
    """Features of ``records`` for ``task``, read from / appended to the run's cache.

    The cache ``DIR/probes/features_{task}.safetensors`` holds one tensor per pool
    ``[n_cached, n_layers, d_model]`` and metadata (record keys, model sha256, hook point).
    Records already in it are not recomputed; new ones are computed ``chunk`` at a time and
    the file rewritten atomically after each chunk (an interrupted run resumes).

    Args:
        run: the run directory.
        handle: the model that made the records.
        records: ``ok`` records.
        task: ``eval`` or ``gen``.
        pools: pools wanted (a cache missing one is recomputed).
        batch_size: prompts per forward.
        templates_path: the run's template file.
        chunk: records per cache write.
        log: progress lines.

    Returns:
        ``({pool: [n_records, n_layers, d_model] float32 array in records' order}, info)`` with
        ``info = {"candidate_fallback": [record keys], "n_computed": int}``.

    Raises:
        ProbeError: a record whose re-rendered prompt does not match it.
    """
    pools = task_pools(task, pools)
    path = run.sub("probes") / f"features_{task}.safetensors"
    ident = {"model_sha256": str(handle.info.get("sha256")), "model": handle.spec,
             "hook_point": HOOK_POINT, "n_layers": str(handle.n_layers),
             "version": FEATURES_VERSION}
    have: dict[str, torch.Tensor] = {}
    keys: list[str] = []
    fallback: list[str] = []
    if path.exists():
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        if all(meta.get(k) == v for k, v in ident.items()) and \
                set(pools) <= set(json.loads(meta.get("pools", "[]"))):
            have = load_tensors(path)
            keys = json.loads(meta["keys"])
            fallback = json.loads(meta.get("candidate_fallback", "[]"))
        else:
            log(f"[probe] {path.name} was made with another model, hook point or pools: "
                f"recomputing it")
            have, keys = {}, []
    known = set(keys)
    todo = [r for r in records if _key(r) not in known]
    if todo:
        log(f"[probe] {task} prompt: {len(records) - len(todo)} records cached, "
            f"{len(todo)} to extract")
    all_pools = sorted(set(pools) | set(have)) if have else list(pools)
    t0 = time.perf_counter()
    for s in range(0, len(todo), chunk):
        part = todo[s:s + chunk]
        prompts = [rerender(r, task, handle.tokenizer, templates_path=templates_path)
                   for r in part]
        feats, fell = extract_features(handle, prompts, pools=all_pools, batch_size=batch_size)
        for p in all_pools:
            have[p] = torch.cat([have[p], feats[p]]) if p in have and len(keys) else feats[p]
        keys += [_key(r) for r in part]
        fallback += [_key(r) for r, fb in zip(part, fell) if fb]
        save_tensors(path, have, {**ident, "keys": json.dumps(keys), "pools": json.dumps(
            all_pools), "candidate_fallback": json.dumps(fallback)})
        log(f"[probe] {task}: {len(keys)} / {len(records)} records "
            f"({time.perf_counter() - t0:.0f} s)")
    pos = {k: i for i, k in enumerate(keys)}
    idx = [pos[_key(r)] for r in records]
    out = {p: have[p][idx].numpy() for p in pools}
    want = {_key(r) for r in records}
    return out, {"candidate_fallback": [k for k in fallback if k in want],
                 "n_computed": len(todo)}


# ---------------------------------------------------------------------------------------------
# Step 4: probes
# ---------------------------------------------------------------------------------------------


@dataclass
class FittedProbe:
    """A probe fitted on standardised features, storable without pickles.

    ``score(X) = f((X - mean) / scale)`` where ``f`` is linear (``coef @ z + intercept``) for
    ``logreg``/``svm`` and a ReLU MLP (``weights``/``biases``, logistic output) for ``mlp``.
    Positive scores mean "Correct".

    Attributes:
        kind: ``logreg``, ``svm`` or ``mlp``.
        mean, scale: the scaler's ``[d]`` mean and scale.
        coef: ``[d]`` weights (linear probes), intercept: float.
        weights, biases: MLP layer matrices and vectors (``mlp`` only).
        meta: JSON-safe description (task, layer, pool, hook point, record count...).
    """

    kind: str
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray | None = None
    intercept: float = 0.0
    weights: list[np.ndarray] = field(default_factory=list)
    biases: list[np.ndarray] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def decision(self, X: np.ndarray) -> np.ndarray:
        """Scores ``[n]`` (log-odds for logreg/mlp, margin for svm) of features ``[n, d]``."""
        z = (np.asarray(X, dtype=np.float64) - self.mean) / self.scale
        if self.kind in ("logreg", "svm"):
            return z @ self.coef + self.intercept
        a = z
        for W, b in zip(self.weights[:-1], self.biases[:-1]):
            a = np.maximum(a @ W + b, 0.0)
        return (a @ self.weights[-1] + self.biases[-1]).ravel()

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Predicted labels ``[n]`` (True = Correct): score > 0."""
        return self.decision(X) > 0

    def save(self, stem: str | Path) -> tuple[Path, Path]:
        """Write ``stem.npz`` (arrays) and ``stem.json`` (meta, and the linear weights).

        Returns:
            The two paths.
        """
        import os

        stem = Path(stem)
        stem.parent.mkdir(parents=True, exist_ok=True)
        arrays = {"mean": self.mean, "scale": self.scale}
        if self.coef is not None:
            arrays.update(coef=self.coef, intercept=np.array([self.intercept]))
        for i, (W, b) in enumerate(zip(self.weights, self.biases)):
            arrays[f"W{i}"], arrays[f"b{i}"] = W, b
        tmp = stem.with_name(f".{stem.name}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, stem.with_suffix(".npz"))
        doc = {"kind": self.kind, "meta": self.meta, "n_mlp_layers": len(self.weights),
               "score": "((x - scaler_mean) / scaler_scale) @ coef + intercept > 0 => Correct"
               if self.coef is not None else "ReLU MLP on standardised x; logit > 0 => Correct",
               "scaler_mean": self.mean.tolist(), "scaler_scale": self.scale.tolist()}
        if self.coef is not None:
            doc.update(coef=self.coef.tolist(), intercept=float(self.intercept))
        write_json(stem.with_suffix(".json"), doc)
        return stem.with_suffix(".npz"), stem.with_suffix(".json")

    @classmethod
    def load(cls, stem: str | Path) -> FittedProbe:
        """Read a probe written by :meth:`save` (``stem.npz`` + ``stem.json``)."""
        stem = Path(stem)
        doc = read_json(stem.with_suffix(".json"))
        with np.load(stem.with_suffix(".npz"), allow_pickle=False) as z:
            arr = {k: z[k] for k in z.files}
        n = doc["n_mlp_layers"]
        return cls(kind=doc["kind"], mean=arr["mean"], scale=arr["scale"],
                   coef=arr.get("coef"), intercept=float(arr["intercept"][0])
                   if "intercept" in arr else 0.0,
                   weights=[arr[f"W{i}"] for i in range(n)],
                   biases=[arr[f"b{i}"] for i in range(n)], meta=doc["meta"])


def _balanced_weights(y: np.ndarray) -> np.ndarray:
    n, pos = len(y), int(y.sum())
    w_pos, w_neg = n / (2 * max(pos, 1)), n / (2 * max(n - pos, 1))
    return np.where(y, w_pos, w_neg)


def fit_probe(X: np.ndarray, y: np.ndarray, kind: str = "logreg", *, C: float = 1.0,
              mlp_hidden: int = 64, mlp_alpha: float = 1e-2, seed: int = 0) -> FittedProbe:
    """Fit one probe on standardised features (module docstring, step 4).

    Args:
        X: ``[n, d]`` features.
        y: ``[n]`` bool labels (True = y* Correct).
        kind: ``logreg`` (class-balanced L2 logistic regression, lbfgs), ``svm``
            (class-balanced ``LinearSVC``) or ``mlp`` (one ReLU hidden layer, balanced sample
            weights, adam).
        C: inverse regularisation of logreg and svm.
        mlp_hidden, mlp_alpha: MLP size and L2 penalty.
        seed: MLP initialisation seed.

    Returns:
        The :class:`FittedProbe`.

    Raises:
        ProbeError: unknown kind or a single class in ``y``.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.preprocessing import StandardScaler

    y = np.asarray(y, dtype=bool)
    if y.all() or not y.any():
        raise ProbeError(f"cannot fit a probe on one class (n={len(y)}, correct={int(y.sum())})")
    scaler = StandardScaler().fit(X)
    Z = scaler.transform(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        if kind == "logreg":
            from sklearn.linear_model import LogisticRegression

            clf = LogisticRegression(C=C, class_weight="balanced", max_iter=2000).fit(Z, y)
            return FittedProbe(kind, scaler.mean_, scaler.scale_, coef=clf.coef_[0].copy(),
                               intercept=float(clf.intercept_[0]))
        if kind == "svm":
            from sklearn.svm import LinearSVC

            clf = LinearSVC(C=C, class_weight="balanced", max_iter=5000, dual="auto").fit(Z, y)
            return FittedProbe(kind, scaler.mean_, scaler.scale_, coef=clf.coef_[0].copy(),
                               intercept=float(clf.intercept_[0]))
        if kind == "mlp":
            from sklearn.neural_network import MLPClassifier

            clf = MLPClassifier(hidden_layer_sizes=(mlp_hidden,), alpha=mlp_alpha,
                                max_iter=300, random_state=seed)
            clf.fit(Z, y, sample_weight=_balanced_weights(y))
            return FittedProbe(kind, scaler.mean_, scaler.scale_,
                               weights=[w.copy() for w in clf.coefs_],
                               biases=[b.copy() for b in clf.intercepts_])
    raise ProbeError(f"unknown probe {kind!r}; known: {list(PROBES)}")


def binary_metrics(y: np.ndarray, pred: np.ndarray, score: np.ndarray | None) -> dict[str, Any]:
    """Accuracy, balanced accuracy, F1 of Correct, macro F1 and ROC AUC of one split.

    Args:
        y: ``[n]`` bool truth (y*), pred: ``[n]`` bool predictions, score: ``[n]`` scores for
            the AUC (higher = Correct) or None.

    Returns:
        The metrics; ``auc`` is None with one class in ``y`` or no score. Computed in numpy
        (sklearn's metric functions cost ~10 ms a call, which dominates a layer sweep); a test
        checks them against ``sklearn.metrics``. F1 of a class with no true or predicted
        example is 0 (sklearn's ``zero_division=0``).
    """
    from scipy.stats import rankdata

    y, pred = np.asarray(y, bool), np.asarray(pred, bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    two = n_pos > 0 and n_neg > 0
    tp, fp = int(np.sum(pred & y)), int(np.sum(pred & ~y))
    fn, tn = n_pos - tp, n_neg - fp

    def f1(t: int, f_p: int, f_n: int) -> float:
        return 2 * t / (2 * t + f_p + f_n) if t else 0.0

    auc = None
    if two and score is not None:  # Mann-Whitney U with average ranks for ties
        r = rankdata(np.asarray(score, float))
        auc = float((r[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
    return {
        "accuracy": (tp + tn) / len(y),
        "balanced_accuracy": (tp / n_pos + tn / n_neg) / 2 if two else None,
        "f1": f1(tp, fp, fn),
        "f1_macro": (f1(tp, fp, fn) + f1(tn, fn, fp)) / 2,
        "auc": auc,
    }


def make_folds(y: np.ndarray, folds: int, seed: int, *, groups: Sequence[Any] | None = None,
               what: str = "records") -> list[tuple[np.ndarray, np.ndarray]]:
    """Stratified k-fold ``(train, test)`` index pairs, checked for class counts.

    With ``groups`` (e.g. one id per passage: SQuAD and DROP ask several questions about one
    passage), ``StratifiedGroupKFold`` keeps every group inside one fold, so a probe is never
    tested on a passage it was trained on; without, ``StratifiedKFold``. Both shuffle with
    ``seed``.

    Args:
        y: ``[n]`` bool labels. folds: number of folds. seed: shuffling seed.
        groups: ``[n]`` hashable group ids, or None (every example its own group).
        what: what the examples are, for the error message.

    Raises:
        ProbeError: fewer than ``folds`` examples (with groups: groups) of a class; the
            message gives the counts.
    """
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

    y = np.asarray(y, bool)
    n_c, n_i = int(y.sum()), int((~y).sum())
    unit = "examples"
    if groups is not None:
        g = np.asarray(groups)
        if len(g) != len(y):
            raise ProbeError(f"groups has {len(g)} entries for {len(y)} labels")
        n_c, n_i = len(set(g[y].tolist())), len(set(g[~y].tolist()))
        unit = "groups (passages)"
    if min(n_c, n_i) < folds:
        raise ProbeError(
            f"too few {unit} of a class for {folds}-fold cross-validation of {what}: "
            f"y*=Correct {n_c}, y*=Incorrect {n_i} (each needs >= {folds}); use fewer --folds "
            f"or more records (`interp asymmetry --limit`)")
    if groups is None:
        skf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
        return [(tr, te) for tr, te in skf.split(np.zeros(len(y)), y)]
    sgkf = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
    return [(tr, te) for tr, te in sgkf.split(np.zeros(len(y)), y, groups)]


def passage_groups(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """One group id per record: its dataset plus a hash of its context (the passage)."""
    return [f"{r.get('dataset')}:"
            f"{hashlib.sha1(str(r.get('context', '')).encode()).hexdigest()[:12]}"
            for r in records]


def _summ(per_fold: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in METRICS:
        vals = [f[m] for f in per_fold if f.get(m) is not None]
        out[m] = float(np.mean(vals)) if vals else None
        out[f"{m}_std"] = float(np.std(vals)) if vals else None
    return out


def cross_validate(X: np.ndarray, y: np.ndarray, folds: Sequence[tuple[np.ndarray, np.ndarray]],
                   kind: str = "logreg", **fit_kw: Any) -> tuple[dict[str, Any], np.ndarray]:
    """Cross-validate one probe on given folds.

    Args:
        X: ``[n, d]`` features, y: ``[n]`` bool labels.
        folds: ``(train_idx, test_idx)`` pairs (:func:`make_folds`).
        kind: probe kind; ``fit_kw`` go to :func:`fit_probe`.

    Returns:
        ``(summary, oof_scores)``: metric means and ``*_std`` over folds, and the out-of-fold
        score of every example ``[n]``.
    """
    per_fold, oof = [], np.zeros(len(y))
    for tr, te in folds:
        p = fit_probe(X[tr], y[tr], kind, **fit_kw)
        s = p.decision(X[te])
        oof[te] = s
        per_fold.append(binary_metrics(y[te], s > 0, s))
    return _summ(per_fold), oof


def judge_metrics(records: Sequence[Mapping[str, Any]],
                  folds: Sequence[tuple[np.ndarray, np.ndarray]] | None = None) -> dict[str, Any]:
    """The verbal judge scored like a probe, overall and on the probes' test folds.

    ``EA`` = accuracy of the parsed verdict against y* (an unparseable verdict counts as wrong,
    as in :func:`interp.asymmetry.group_metrics`); for F1 and balanced accuracy an unparseable
    verdict counts as "Incorrect"; the AUC is that of ``p_correct``.

    Returns:
        ``{"overall": {EA, accuracy, balanced_accuracy, f1, f1_macro, auc, invalid_verdicts},
        "folds": {metric means and stds over the test folds}}`` (``folds`` only when given).
    """
    y = np.array([bool(r["oracle_label"]) for r in records])
    v = [r.get("verdict") for r in records]
    pred = np.array([x is True for x in v])
    right = np.array([x is not None and x == t for x, t in zip(v, y)])
    p = np.array([float(r["p_correct"]) if r.get("p_correct") is not None else np.nan
                  for r in records])
    score = None if np.isnan(p).any() else p
    overall = {"EA": float(right.mean()), **binary_metrics(y, pred, score),
               "invalid_verdicts": int(sum(x is None for x in v))}
    overall["accuracy"] = overall["EA"]
    out: dict[str, Any] = {"overall": overall}
    if folds is not None:
        per = []
        for _, te in folds:
            m = binary_metrics(y[te], pred[te], None if score is None else score[te])
            m["accuracy"] = float(right[te].mean())
            per.append(m)
        out["folds"] = _summ(per)
    return out


def mcnemar(a_right: np.ndarray, b_right: np.ndarray) -> dict[str, Any]:
    """Exact McNemar test of two classifiers on the same examples.

    Returns:
        ``{"b": a right & b wrong, "c": a wrong & b right, "p_value": exact two-sided}``.
    """
    from scipy.stats import binomtest

    b = int(np.sum(a_right & ~b_right))
    c = int(np.sum(~a_right & b_right))
    return {"b": b, "c": c, "p_value": float(binomtest(b, b + c, 0.5).pvalue) if b + c else 1.0}


# ---------------------------------------------------------------------------------------------
# Steps 5-7: sweep, questions, weights
# ---------------------------------------------------------------------------------------------


def _fit_kw(cfg: ProbeConfig) -> dict[str, Any]:
    return {"C": cfg.C, "mlp_hidden": cfg.mlp_hidden, "mlp_alpha": cfg.mlp_alpha,
            "seed": cfg.seed}


def sweep(feats: Mapping[str, np.ndarray], y: np.ndarray, layers: Sequence[int],
          cfg: ProbeConfig, folds: Sequence[tuple[np.ndarray, np.ndarray]], *,
          log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Cross-validate probes over (layer, pool) cells (module docstring, step 5).

    Args:
        feats: ``{pool: [n, n_layers, d]}``.
        y: ``[n]`` labels.
        layers: layers to probe.
        cfg: the probe config (probes, top_k, select_by, sweep_all).
        folds: shared CV folds.

    Returns:
        Rows ``{probe, layer, pool, accuracy, accuracy_std, ..., auc, auc_std}``.
    """
    rows: list[dict[str, Any]] = []
    kw = _fit_kw(cfg)
    first, rest = cfg.probes[0], cfg.probes[1:]
    t0 = time.perf_counter()
    cells = [(L, p) for p in feats for L in layers]
    for L, p in cells:
        summ, _ = cross_validate(feats[p][:, L], y, folds, first, **kw)
        rows.append({"probe": first, "layer": L, "pool": p, **summ})
    log(f"[probe] {first}: {len(cells)} cells x {len(folds)} folds in "
        f"{time.perf_counter() - t0:.0f} s")
    if rest:
        ranked = sorted(rows, key=lambda r: -(r[cfg.select_by] or 0.0))
        chosen = cells if cfg.sweep_all else [(r["layer"], r["pool"]) for r in
                                              ranked[:cfg.top_k]]
        for kind in rest:
            t0 = time.perf_counter()
            for L, p in chosen:
                summ, _ = cross_validate(feats[p][:, L], y, folds, kind, **kw)
                rows.append({"probe": kind, "layer": L, "pool": p, **summ})
            log(f"[probe] {kind}: {len(chosen)} cells in {time.perf_counter() - t0:.0f} s")
    return rows


def permutation_null(feats: Mapping[str, np.ndarray], y: np.ndarray, layers: Sequence[int],
                     cfg: ProbeConfig, observed: float, *, groups: np.ndarray | None = None,
                     log: Callable[[str], None] = print) -> dict[str, Any]:
    """Selection-aware permutation test of the best (layer, pool) cell of the first probe.

    The best cell is the maximum over many cells, so its CV score is optimistic. Here the
    labels are permuted ``cfg.permutations`` times (``numpy`` generator seeded with
    ``cfg.seed``), folds are rebuilt on each permuted labelling (same groups), the first
    probe's whole grid is cross-validated again, and the best cell's ``cfg.select_by`` is kept:
    the distribution of "the best score the search finds when labels carry no signal"
    (a max-statistic permutation test; Westfall & Young 1993, Ojala & Garriga 2010).

    Args:
        feats: ``{pool: [n, n_layers, d]}``; y: ``[n]`` bool labels; layers: layers swept.
        cfg: the probe config (``permutations``, ``select_by``, folds, seed, first probe).
        observed: the real best cell's ``select_by`` value of the first probe.
        groups: ``[n]`` passage ids for the folds (see :func:`make_folds`).

    Returns:
        ``{"n", "metric", "observed", "null" (list), "null_mean", "null_q95", "p_value"}``
        with ``p_value = (1 + #{null >= observed}) / (1 + n)``.
    """
    rng = np.random.default_rng(cfg.seed)
    one = ProbeConfig(**{**asdict(cfg), "probes": cfg.probes[:1]})
    null, skipped = [], 0
    t0 = time.perf_counter()
    for i in range(cfg.permutations):
        yp = rng.permutation(y)
        try:
            folds = make_folds(yp, cfg.folds, cfg.seed + 1 + i, groups=groups)
        except ProbeError:   # the permuted positives fell into fewer passages than folds
            skipped += 1
            continue
        rows = sweep(feats, yp, layers, one, folds, log=lambda _: None)
        null.append(float(best_row(rows, cfg.select_by)[cfg.select_by] or 0.0))
    log(f"[probe] permutation null: {cfg.permutations} sweeps in "
        f"{time.perf_counter() - t0:.0f} s")
    arr = np.array(null)
    return {"n": len(null), "skipped": skipped, "metric": cfg.select_by,
            "probe": cfg.probes[0],
            "observed": observed, "null": null,
            "null_mean": float(arr.mean()) if len(arr) else None,
            "null_q95": float(np.quantile(arr, 0.95)) if len(arr) else None,
            "p_value": float((1 + (arr >= observed).sum()) / (1 + len(arr)))}


def best_row(rows: Sequence[Mapping[str, Any]], select_by: str,
             probe: str | None = None) -> dict[str, Any]:
    """The row with the highest mean CV ``select_by`` (ties: the other metric, then earlier
    layer), optionally among one probe kind's rows."""
    other = "f1" if select_by == "auc" else "auc"
    cand = [r for r in rows if probe is None or r["probe"] == probe]
    return dict(max(cand, key=lambda r: (r[select_by] or 0.0, r[other] or 0.0, -r["layer"])))


def _transfer(feats: np.ndarray, y: np.ndarray, ds: np.ndarray, cfg: ProbeConfig,
              kind: str, groups: np.ndarray | None = None) -> dict[str, Any]:
    """Cross-dataset transfer of one (layer, pool) feature matrix ``[n, d]``."""
    names = sorted(set(ds.tolist()))
    eligible, excluded = [], {}
    for d in names:
        yd = y[ds == d]
        n_c, n_i = int(yd.sum()), int((~yd).sum())
        if min(n_c, n_i) < cfg.transfer_min_per_class:
            excluded[d] = f"y*=Correct {n_c}, y*=Incorrect {n_i} (needs >= " \
                          f"{cfg.transfer_min_per_class} of each)"
        else:
            eligible.append(d)
    pairs = []
    kw = _fit_kw(cfg)
    for a in eligible:
        probe = fit_probe(feats[ds == a], y[ds == a], kind, **kw)
        for b in eligible:
            row: dict[str, Any] = {"train": a, "test": b, "n_train": int((ds == a).sum()),
                                   "n_test": int((ds == b).sum())}
            if a == b:
                yd = y[ds == a]
                gd = None if groups is None else groups[ds == a]
                k = min(cfg.folds, int(yd.sum()), int((~yd).sum()))
                if gd is not None:
                    k = min(k, len(set(gd[yd].tolist())), len(set(gd[~yd].tolist())))
                if k >= 2:
                    summ, _ = cross_validate(feats[ds == a], yd,
                                             make_folds(yd, k, cfg.seed, groups=gd), kind, **kw)
                    row.update({m: summ[m] for m in METRICS}, note=f"within-dataset {k}-fold CV")
                else:
                    row.update({m: None for m in METRICS}, note="too few for CV")
            else:
                s = probe.decision(feats[ds == b])
                row.update(binary_metrics(y[ds == b], s > 0, s))
            pairs.append(row)
    return {"datasets": eligible, "excluded": excluded, "pairs": pairs,
            "possible": len(eligible) >= 2}


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_probe_records(run: RunDir, handle: ModelHandle | None = None) -> list[dict[str, Any]]:
    """The run's ``ok`` records, checked for probing.

    Raises:
        interp.store.RunDirError: no records.jsonl (names ``interp asymmetry``).
        ProbeError: no ok records, duplicate record keys, records without an oracle label, or
            records made by another model than ``handle``.
    """
    records = run.read_records(status="ok")
    if not records:
        raise ProbeError(f"{run.path} has no ok records: run `interp asymmetry --out {run.path}`"
                         f" first")
    keys = [_key(r) for r in records]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})[:5]
        raise ProbeError(f"{run.path}/records.jsonl repeats records {dup}")
    if missing := [_key(r) for r in records if r.get("oracle_label") is None][:5]:
        raise ProbeError(f"records without oracle_label (y*): {missing}")
    if handle is not None:
        models = sorted({r.get("model") for r in records})
        if models != [handle.spec]:
            raise ProbeError(f"the records were made by {models}, the loaded model is "
                             f"{handle.spec!r}: probe with the model that made them")
    return records


def run_probes(run: RunDir | str | Path, config: ProbeConfig | None = None, *,
               handle: ModelHandle | None = None,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the whole probe study on a run directory (module docstring); return results.json.

    Args:
        run: an asymmetry run directory.
        config: probe settings (default :class:`ProbeConfig`).
        handle: the model that made the records (default: loaded from the manifest's config).
        log: progress lines.

    Returns:
        The content written to ``DIR/probes/results.json``.

    Raises:
        interp.store.RunDirError: no manifest or records (names what to run first).
        ProbeError: too few examples of a class for the folds (with counts), unknown layers,
            records that do not match the model or their prompts.
    """
    run = run if isinstance(run, RunDir) else RunDir(run)
    cfg = config or ProbeConfig()
    manifest = run.manifest()
    mcfg = manifest.get("config", {})
    if handle is None:
        from interp.models import load_model

        handle = load_model(mcfg.get("model"), device=mcfg.get("device"), dtype=mcfg.get("dtype"))
    records = load_probe_records(run, handle)
    if cfg.limit is not None:
        per: dict[str, int] = {}
        kept = []
        for r in records:
            per[r["dataset"]] = per.get(r["dataset"], 0) + 1
            if per[r["dataset"]] <= cfg.limit:
                kept.append(r)
        records = kept
    layers = parse_layers(cfg.layers, handle.n_layers) or list(range(handle.n_layers))
    y = np.array([bool(r["oracle_label"]) for r in records])
    ds = np.array([r["dataset"] for r in records])
    groups = np.array(passage_groups(records))
    folds = make_folds(y, cfg.folds, cfg.seed, groups=groups)
    keys = [_key(r) for r in records]
    probes_dir = run.sub("probes")
    judge = judge_metrics(records, folds)
    results: dict[str, Any] = {
        "hook_point": HOOK_POINT, "hook_point_doc": HOOK_POINT_DOC,
        "label": "y* = oracle_label; positive class = Correct",
        "model": handle.spec, "n_layers": handle.n_layers, "d_model": handle.info.get("d_model"),
        "n_records": len(records), "n_passages": len(set(groups.tolist())),
        "cv": f"StratifiedGroupKFold, groups = passages (dataset + context hash), "
              f"{cfg.folds} folds, seed {cfg.seed}",
        "datasets": {str(d): int((ds == d).sum()) for d in sorted(set(ds.tolist()))},
        "class_counts": {"correct": int(y.sum()), "incorrect": int((~y).sum())},
        "majority_baseline_accuracy": float(max(y.mean(), 1 - y.mean())),
        "config": asdict(cfg), "layers": layers, "folds": cfg.folds, "seed": cfg.seed,
        "select_by": cfg.select_by,
        "selection_note": f"best (probe, layer, pool) = highest mean {cfg.select_by.upper()} "
                          f"over the CV test folds; the selection itself is not cross-validated "
                          f"(optimistic by the number of cells tried)",
        "judge": judge, "tasks": {}, "weights": {},
    }
    for task in cfg.tasks:
        feats, info = cached_features(run, handle, records, task, pools=cfg.pools,
                                      batch_size=cfg.batch_size,
                                      templates_path=mcfg.get("templates_path"), log=log)
        # the sweep does not depend on the permutation count; the permutation null does
        sig = _digest({"cfg": {**asdict(cfg), "permutations": None}, "layers": layers,
                       "keys": keys, "task": task, "y": y.tolist(), "v": FEATURES_VERSION,
                       "groups": groups.tolist()})
        cache = probes_dir / f"sweep_{task}.json"
        if cache.exists() and read_json(cache).get("signature") == sig and not info["n_computed"]:
            rows = read_json(cache)["rows"]
            log(f"[probe] {task}: sweep reused from {cache.name}")
        else:
            rows = sweep(feats, y, layers, cfg, folds, log=log)
            write_json(cache, {"signature": sig, "rows": rows})
        best = best_row(rows, cfg.select_by)
        best_by_probe = {k: best_row(rows, cfg.select_by, k) for k in cfg.probes}
        tres: dict[str, Any] = {"pools": task_pools(task, cfg.pools), "grid": rows,
                                "best": best, "best_by_probe": best_by_probe,
                                "candidate_fallback": info["candidate_fallback"]}
        if cfg.permutations > 0:
            pcache = probes_dir / f"permutation_{task}.json"
            psig = _digest({"sweep": sig, "permutations": cfg.permutations})
            if pcache.exists() and read_json(pcache).get("signature") == psig:
                tres["permutation"] = read_json(pcache)["result"]
            else:
                first_best = best_row(rows, cfg.select_by, cfg.probes[0])
                tres["permutation"] = permutation_null(
                    feats, y, layers, cfg, float(first_best[cfg.select_by] or 0.0),
                    groups=groups, log=log)
                write_json(pcache, {"signature": psig, "result": tres["permutation"]})
        # probe vs judge on the same records and folds: out-of-fold predictions of the best cell
        X = feats[best["pool"]][:, best["layer"]]
        _, oof = cross_validate(X, y, folds, best["probe"], **_fit_kw(cfg))
        probe_right = (oof > 0) == y
        v = [r.get("verdict") for r in records]
        judge_right = np.array([x is not None and x == t for x, t in zip(v, y)])
        tres["vs_judge"] = {
            "probe": {m: best[m] for m in METRICS} | {f"{m}_std": best[f"{m}_std"]
                                                      for m in METRICS},
            "judge_same_folds": judge["folds"],
            "delta_accuracy_probe_minus_EA": best["accuracy"] - judge["folds"]["accuracy"],
            "delta_auc_probe_minus_p_correct": (best["auc"] - judge["folds"]["auc"])
            if best["auc"] is not None and judge["folds"]["auc"] is not None else None,
            "mcnemar_probe_vs_verdict": mcnemar(probe_right, judge_right),
            "oof_accuracy": float(probe_right.mean()),
        }
        if task == "eval":
            tres["transfer"] = _transfer(X, y, ds, cfg, best["probe"], groups)
        # weights: the best cell of each probe kind refitted on all records
        for kind, row in best_by_probe.items():
            fp = fit_probe(feats[row["pool"]][:, row["layer"]], y, kind, **_fit_kw(cfg))
            fp.meta = {"task": task, "layer": row["layer"], "pool": row["pool"],
                       "hook_point": HOOK_POINT, "model": handle.spec,
                       "n_records": len(records), "cv": {m: row[m] for m in METRICS},
                       "label": "True = y* Correct"}
            npz, js = fp.save(probes_dir / f"probe_{task}_{kind}")
            results["weights"][f"{task}/{kind}"] = {"npz": str(npz.relative_to(run.path)),
                                                    "json": str(js.relative_to(run.path))}
        results["tasks"][task] = tres
    if "eval" in results["tasks"]:
        results["best"] = results["tasks"]["eval"]["best"]
    if "gen" in results["tasks"]:
        g = results["tasks"]["gen"]
        results["gen_probe"] = {
            "question": "does the generation prompt's residual stream predict whether the "
                        "model's own answer will be right (y*)?",
            "best": g["best"], "vs_judge": g["vs_judge"]}
    if "eval" in results["tasks"]:
        results["transfer"] = results["tasks"]["eval"]["transfer"]
    write_json(probes_dir / "results.json", results)
    from interp.plots import plot_probes

    png = plot_probes(results, run.sub("figures"))
    log(f"[probe] wrote {probes_dir / 'results.json'} and {png}")
    return results


def format_results(results: Mapping[str, Any]) -> str:
    """A short plain-text summary of results.json."""
    j = results["judge"]["overall"]
    lines = [f"records: {results['n_records']} {results['datasets']}; y*: "
             f"{results['class_counts']}; selection by CV {results['select_by'].upper()}",
             f"verbal judge: EA {j['EA']:.3f}  F1 {j['f1']:.3f}  balanced acc "
             f"{j['balanced_accuracy'] or float('nan'):.3f}  AUC(p_correct) "
             f"{j['auc'] if j['auc'] is not None else float('nan'):.3f}"]
    for task, t in results["tasks"].items():
        b = t["best"]
        lines.append(
            f"{task} prompt best: {b['probe']} layer {b['layer']} pool {b['pool']}: "
            f"AUC {b['auc']:.3f}±{b['auc_std']:.3f}  F1 {b['f1']:.3f}±{b['f1_std']:.3f}  "
            f"acc {b['accuracy']:.3f}  balanced acc {b['balanced_accuracy']:.3f}")
        for k, r in t["best_by_probe"].items():
            lines.append(f"   {k:<6} layer {r['layer']:>2} {r['pool']:<9} AUC {r['auc']:.3f} "
                         f"F1 {r['f1']:.3f} bal.acc {r['balanced_accuracy']:.3f}")
        if pm := t.get("permutation"):
            lines.append(f"   permutation null of the best {pm['probe']} cell ({pm['n']} label "
                         f"permutations): {pm['metric'].upper()} observed {pm['observed']:.3f}, "
                         f"null mean {pm['null_mean']:.3f}, 95th pct {pm['null_q95']:.3f}, "
                         f"p = {pm['p_value']:.3f}")
    tr = results.get("transfer")
    if tr and tr["possible"]:
        for p in tr["pairs"]:
            if p["train"] != p["test"]:
                auc = p["auc"]
                lines.append(f"transfer {p['train']} -> {p['test']}: AUC "
                             f"{auc if auc is None else round(auc, 3)} F1 {p['f1']:.3f}")
    elif tr:
        lines.append(f"transfer: not possible (needs >= 2 datasets with both classes; eligible "
                     f"{tr['datasets']}, excluded {tr['excluded']})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# CLI and config stage
# ---------------------------------------------------------------------------------------------


def run_stage(run: RunDir, section: dict, handle: ModelHandle) -> None:
    """``[probe]`` stage of ``interp run``: :func:`run_probes` with the section's settings.

    Raises:
        ValueError: an unknown key in the section.
    """
    cfg = ProbeConfig.from_mapping(section)
    res = run_probes(run, cfg, handle=handle)
    print(format_results(res))


def register(app: Any) -> None:
    """Add ``interp probe`` to the typer app."""
    @app.command("probe")
    def probe_cmd(
        run: Annotated[Path, typer.Option(help="asymmetry run directory")],
        folds: Annotated[int, typer.Option(help="stratified CV folds")] = 5,
        layers: Annotated[str | None, typer.Option(
            help="layers to probe, e.g. '0,8,12-20' (default all)")] = None,
        probes: Annotated[str, typer.Option(help="comma list of logreg,svm,mlp; the first "
                                                 "sweeps every layer x pool")] = "logreg,svm,mlp",
        pools: Annotated[str, typer.Option(help="comma list of last,candidate,mean,max,min")] = (
            ",".join(POOLS)),
        tasks: Annotated[str, typer.Option(help="eval,gen")] = "eval,gen",
        select_by: Annotated[str, typer.Option(help="auc or f1")] = "auc",
        top_k: Annotated[int, typer.Option(help="cells at which the other probes run")] = 5,
        sweep_all: Annotated[bool, typer.Option(help="every probe on every cell")] = False,
        batch_size: int = 4,
        seed: int = 0,
        limit: Annotated[int | None, typer.Option(
            help="first N ok records per dataset (default all)")] = None,
        permutations: Annotated[int, typer.Option(
            help="label permutations for the best cell's selection-aware null (0: off)")] = 0,
        device: str | None = None,
    ) -> None:
        """Probes on the residual stream predicting y* (representation-as-a-judge, seed 003)."""
        try:
            cfg = ProbeConfig(folds=folds, layers=layers, probes=probes, pools=pools, tasks=tasks,
                              select_by=select_by, top_k=top_k, sweep_all=sweep_all,
                              batch_size=batch_size, seed=seed, limit=limit,
                              permutations=permutations)
            rd = RunDir(run)
            handle = None
            if device:
                from interp.models import load_model

                m = rd.manifest()["config"]
                handle = load_model(m["model"], device=device, dtype=m.get("dtype"))
            res = run_probes(rd, cfg, handle=handle, log=typer.echo)
        except (ProbeError, RunDirError) as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from err
        typer.echo(format_results(res))
