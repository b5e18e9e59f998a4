"""Study 2 (paper section 3.2): last-token attention rows and span mass, per layer and head.

Algorithm, per ok record of a finished asymmetry run:

1. Re-render the generation prompt and the evaluation prompt (the model's own extracted answer
   as candidate) with the template named in the record (``templates_path`` from the manifest),
   and check that the token spans equal the record's stored ``prompts.{gen,eval}.token_spans``
   (a mismatch names the record: the tokenizer or template changed since the run).
2. Run the model ONCE per prompt (batch 1, no padding, no KV cache) and record the last-token
   attention row ``A[l, h, :]`` of every layer ``l`` and every query head ``h``: the
   distribution the model uses to predict the first output token (for the eval prompt: the
   verdict). The default ``hf`` recorder is a custom attention function registered with
   transformers' ``AttentionInterface``: it calls SDPA for the layer output and, on the side,
   computes ``softmax(q_last . K^T * scaling + mask_last)`` in float32 from the post-RoPE query
   of the last position and all keys. GQA: query head ``h`` reads key/value head
   ``h // (n_heads / n_kv_heads)`` (transformers' ``repeat_kv``), so every query head reports
   its own row. Cost: about one plain SDPA forward (``benchmarks/attention_recorder.py``).
   ``eager`` (``output_attentions=True``), ``tlens`` (TransformerBridge ``hook_pattern``) and
   ``nnsight`` (``self_attn.output[1]``) give the same rows for checking.
3. Span mass: every position carries exactly one label from
   :attr:`interp.prompts.RenderedPrompt.labels` (``context``, ``question``, ``candidate``
   (eval only), ``template`` = everything else; ``reference`` for templates that show a gold
   answer). ``mass[l, h, s] = sum_{p: label(p) = s} A[l, h, p]``, so the masses of a row sum
   to 1. Saved per record (``DIR/attention/records/``) so an interrupted run resumes.
4. Tables: ``DIR/attention/span_mass.parquet`` (one row per id, dataset, task, layer, head,
   span with ``mass``) and ``DIR/attention/summary.json``: per dataset, the band mean (all
   heads, band layers; default the last eight layers, paper: 24-31 of 32) of each span for
   gen and eval with percentile-bootstrap 95% CIs over records, ``context_ratio`` = gen context
   mass / eval context mass (paired bootstrap CI), the same split by oracle label and by
   verdict, layerwise means with CIs, and the mean context mass of every (layer, head).
5. Figures from summary.json: layerwise span-mass curves, layer x head context heatmaps, and
   per-dataset context-ratio bars (:mod:`interp.plots`).

Optional outputs, per record: ``--save-rows`` adds the rows (``rows.gen`` ``[n_layers,
n_heads, n_gen_tokens]``, ``rows.eval``) to the record file; ``--save-resid LAYERS`` writes
``DIR/activations/<dataset>/<id>.safetensors`` with, for ``task`` in gen/eval and the chosen
layers in ascending order (``layers`` in the metadata): ``{task}.resid_pre`` and
``{task}.resid_post`` ``[n_sel, pos, d_model]`` (TransformerLens ``blocks.L.hook_resid_pre`` /
``hook_resid_post``), ``{task}.z`` ``[n_sel, pos, n_heads, head_dim]`` (per-head attention
output before ``o_proj``, ``hook_z``), ``{task}.result_last`` ``[n_sel, n_heads, d_model]``
(per-head output at the last position projected by its slice of ``W_O``, ``hook_result``) and,
with ``--save-patterns``, ``{task}.pattern`` ``[n_sel, n_heads, pos, pos]`` (full
``hook_pattern``). Tensors are stored in the model's dtype on CPU.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
import typer

from interp.errors import AttentionError
from interp.models import ModelHandle
from interp.prompts import RenderedPrompt, get_template, render
from interp.store import RunDir, RunDirError, config_from_table, read_json, save_tensors, write_json

STAGE = "attention"
SUMMARIES = {"attention/summary.json": "attention_summary.json"}
"""Run-dir tables that ``interp run`` copies next to the figures (source -> name)."""
SPANS = ("context", "question", "candidate", "template")
"""Span order of the mass tensors (``reference`` is appended when a template uses it)."""
TASKS = ("gen", "eval")
BACKENDS = ("hf", "eager", "tlens", "nnsight")
_IMPL = "interp_last_row"


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


def parse_layers(spec: str | Sequence[int] | None, n_layers: int) -> list[int]:
    """Parse a layer selection.

    Args:
        spec: ``"last8"`` (default; ``lastK`` in general), ``"all"``, a range ``"24-31"``
            (inclusive), a comma list ``"3,5,7"`` (ranges allowed inside: ``"0-3,10"``), or a
            sequence of ints. Negative ints count from the end.
        n_layers: number of blocks of the model.

    Returns:
        Sorted unique layer indices.

    Raises:
        AttentionError: unparseable spec, or a layer outside ``0..n_layers-1`` (the message
            names the valid range).
    """
    valid = f"valid layers are 0-{n_layers - 1} (the model has {n_layers})"
    if spec is None:
        spec = "last8"
    if isinstance(spec, str):
        s = spec.strip().lower()
        if s == "all":
            return list(range(n_layers))
        if m := re.fullmatch(r"last(\d+)", s):
            k = int(m.group(1))
            if not 1 <= k <= n_layers:
                raise AttentionError(f"layers {spec!r}: cannot take the last {k}; {valid}")
            return list(range(n_layers - k, n_layers))
        out: list[int] = []
        for part in filter(None, (p.strip() for p in s.split(","))):
            if m := re.fullmatch(r"(-?\d+)\s*-\s*(-?\d+)", part):
                a, b = int(m.group(1)), int(m.group(2))
                if a > b:
                    raise AttentionError(f"layers {spec!r}: range {part} is empty; {valid}")
                out += list(range(a, b + 1))
            elif re.fullmatch(r"-?\d+", part):
                out.append(int(part))
            else:
                raise AttentionError(f"layers {spec!r}: cannot parse {part!r}; use 'last8', "
                                     f"'all', '24-31' or '3,5,7'")
    else:
        out = [int(x) for x in spec]
    out = [x + n_layers if x < 0 else x for x in out]
    bad = [x for x in out if not 0 <= x < n_layers]
    if bad or not out:
        raise AttentionError(f"layers {spec!r} out of range {bad}; {valid}")
    return sorted(set(out))


# ---------------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------------


@dataclass
class Recording:
    """What one forward pass recorded.

    Attributes:
        rows: last-token attention rows, float32 ``[n_layers, n_heads, pos]``; every row sums
            to 1.
        acts: optional activations keyed ``resid_pre``, ``resid_post``, ``z``,
            ``result_last``, ``pattern`` (shapes in the module docstring), for ``layers``.
        layers: the layers of ``acts`` (ascending).
    """

    rows: torch.Tensor
    acts: dict[str, torch.Tensor] = field(default_factory=dict)
    layers: list[int] = field(default_factory=list)


@dataclass
class _Capture:
    n_layers: int
    act_layers: set[int]
    patterns: bool
    rows: dict[int, torch.Tensor] = field(default_factory=dict)
    z: dict[int, torch.Tensor] = field(default_factory=dict)
    pattern: dict[int, torch.Tensor] = field(default_factory=dict)


_ACTIVE: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("interp_capture",
                                                                         default=None)


def _last_row(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None,
              scaling: float) -> torch.Tensor:
    """Exact last-query attention row.

    query ``[b, H, q, d]`` (post-RoPE), key ``[b, Hkv, k, d]`` -> row ``[b, H, k]`` float32.
    """
    b, n_heads, _, d = query.shape
    n_kv, k_len = key.shape[1], key.shape[2]
    q = query[:, :, -1, :].float().reshape(b, n_kv, n_heads // n_kv, d)
    scores = torch.einsum("bngd,bnkd->bngk", q, key.float()).reshape(b, n_heads, k_len)
    scores = scores * scaling
    if mask is not None:
        m = mask[:, :, -1, :k_len]
        if m.dtype == torch.bool:
            scores = scores.masked_fill(~m, float("-inf"))
        else:
            scores = scores + m.float()
    return torch.softmax(scores, dim=-1)


def _full_pattern(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None,
                  scaling: float) -> torch.Tensor:
    b, n_heads, q_len, d = query.shape
    n_kv, k_len = key.shape[1], key.shape[2]
    g = n_heads // n_kv
    q = query.float().reshape(b, n_kv, g, q_len, d)
    scores = torch.einsum("bngqd,bnkd->bngqk", q, key.float()).reshape(b, n_heads, q_len, k_len)
    scores = scores * scaling
    if mask is None:
        causal = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(
            k_len - q_len)
        scores = scores.masked_fill(~causal, float("-inf"))
    elif mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask[..., :k_len], float("-inf"))
    else:
        scores = scores + mask[..., :k_len].float()
    return torch.softmax(scores, dim=-1)


def _last_row_attention(module: Any, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, attention_mask: torch.Tensor | None,
                        scaling: float | None = None, dropout: float = 0.0,
                        **kwargs: Any) -> tuple[torch.Tensor, None]:
    """SDPA attention that also records the last-token row (registered as ``interp_last_row``)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kwargs.pop("output_attentions", None)
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                    scaling=scaling, **kwargs)
    cap = _ACTIVE.get()
    if cap is not None:
        layer = int(module.layer_idx)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        cap.rows[layer] = _last_row(query, key, attention_mask, scale)[0]
        if layer in cap.act_layers:
            cap.z[layer] = out[0].detach()
            if cap.patterns:
                cap.pattern[layer] = _full_pattern(query, key, attention_mask, scale)[0]
    return out, None


_REGISTERED = False


def register_recorder() -> str:
    """Register the recording attention function (and its SDPA mask) with transformers.

    Returns:
        The attention-implementation name (``"interp_last_row"``).
    """
    global _REGISTERED
    if not _REGISTERED:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(_IMPL, _last_row_attention)
        AttentionMaskInterface.register(_IMPL, sdpa_mask)
        _REGISTERED = True
    return _IMPL


def _blocks(model: Any) -> Any:
    for path in ("model.layers", "model.model.layers", "transformer.h", "gpt_neox.layers"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return obj
        except AttributeError:
            continue
    raise AttentionError(f"cannot find the decoder blocks of {type(model).__name__}")


@contextlib.contextmanager
def _resid_hooks(model: Any, layers: Sequence[int], store: dict[str, dict[int, torch.Tensor]]
                 ) -> Iterator[None]:
    blocks = _blocks(model)
    handles = []
    for layer in layers:
        def pre(mod: Any, args: tuple, kwargs: dict, _l: int = layer) -> None:
            h = args[0] if args else kwargs["hidden_states"]
            store["resid_pre"][_l] = h[0].detach()

        def post(mod: Any, args: tuple, kwargs: dict, out: Any, _l: int = layer) -> None:
            h = out[0] if isinstance(out, tuple) else out
            store["resid_post"][_l] = h[0].detach()

        handles.append(blocks[layer].register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(blocks[layer].register_forward_hook(post, with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _as_ids(input_ids: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.ndim != 1 or ids.numel() == 0:
        raise AttentionError(f"input_ids must be one non-empty sequence, got shape "
                             f"{tuple(ids.shape)}")
    return ids[None].to(device)


@torch.no_grad()
def record_rows(handle: ModelHandle, input_ids: Sequence[int] | torch.Tensor, *,
                backend: str = "hf", act_layers: Sequence[int] = (),
                patterns: bool = False) -> Recording:
    """Record the last-token attention row of every layer and query head for one prompt.

    Args:
        handle: the model (any device/dtype; rows come back float32 on CPU).
        input_ids: token ids ``[pos]``, fed exactly (no BOS added by any backend).
        backend: ``hf`` (default: exact rows inside an ``AttentionInterface`` function around
            SDPA, about one plain forward), ``eager`` (``output_attentions=True``), ``tlens``
            (TransformerBridge ``blocks.L.attn.hook_pattern``), ``nnsight``.
        act_layers: layers whose residual streams / per-head outputs to keep (``hf`` only).
        patterns: also keep full patterns ``[n_heads, pos, pos]`` of ``act_layers``.

    Returns:
        A :class:`Recording`; ``rows`` ``[n_layers, n_heads, pos]`` float32.

    Raises:
        AttentionError: unknown backend, or activations requested from a backend other than
            ``hf``.
    """
    from interp.backends import attn_implementation

    if backend not in BACKENDS:
        raise AttentionError(f"unknown backend {backend!r}; use one of {list(BACKENDS)}")
    if act_layers and backend != "hf":
        raise AttentionError("residual streams / head outputs are recorded by the 'hf' backend "
                             f"only, not {backend!r}")
    model = handle.model
    ids = _as_ids(input_ids, handle.device)
    n_layers = handle.n_layers
    if backend == "hf":
        cap = _Capture(n_layers=n_layers, act_layers=set(act_layers), patterns=patterns)
        store: dict[str, dict[int, torch.Tensor]] = {"resid_pre": {}, "resid_post": {}}
        token = _ACTIVE.set(cap)
        try:
            with attn_implementation(handle, register_recorder()), \
                    _resid_hooks(model, sorted(cap.act_layers), store):
                model(input_ids=ids, use_cache=False, logits_to_keep=1)
        finally:
            _ACTIVE.reset(token)
        missing = [layer for layer in range(n_layers) if layer not in cap.rows]
        if missing:
            raise AttentionError(f"the recorder saw no attention call in layers {missing}: "
                                 f"{type(model).__name__} does not use AttentionInterface")
        rows = torch.stack([cap.rows[layer] for layer in range(n_layers)])
        acts: dict[str, torch.Tensor] = {}
        layers = sorted(cap.act_layers)
        if layers:
            acts["resid_pre"] = torch.stack([store["resid_pre"][x] for x in layers])
            acts["resid_post"] = torch.stack([store["resid_post"][x] for x in layers])
            acts["z"] = torch.stack([cap.z[x] for x in layers])
            blocks = _blocks(model)
            res = []
            for x in layers:
                w_o = blocks[x].self_attn.o_proj.weight  # [d_model, n_heads * head_dim]
                z_last = cap.z[x][-1]  # [n_heads, head_dim]
                n_h, d_h = z_last.shape
                res.append(torch.einsum("hd,mhd->hm", z_last, w_o.view(-1, n_h, d_h)))
            acts["result_last"] = torch.stack(res)
            if patterns:
                acts["pattern"] = torch.stack([cap.pattern[x] for x in layers])
        return Recording(rows=rows.float().cpu(),
                         acts={k: v.cpu() for k, v in acts.items()}, layers=layers)
    with attn_implementation(handle, "eager"):
        if backend == "eager":
            out = model(input_ids=ids, use_cache=False, output_attentions=True, logits_to_keep=1)
            rows = torch.stack([a[0, :, -1, :] for a in out.attentions])
        elif backend == "tlens":
            from interp.backends import to_tlens

            bridge = to_tlens(handle)
            names = [f"blocks.{x}.attn.hook_pattern" for x in range(n_layers)]
            _, cache = bridge.run_with_cache(ids, names_filter=lambda n: n in names)
            rows = torch.stack([cache[n][0, :, -1, :] for n in names])
        else:
            from interp.backends import to_nnsight

            lm = to_nnsight(handle)
            saved = []
            with lm.trace(ids):
                for x in range(n_layers):
                    saved.append(lm.model.layers[x].self_attn.output[1][0, :, -1, :].save())
            rows = torch.stack([getattr(s, "value", s) for s in saved])
    return Recording(rows=rows.float().cpu())


# ---------------------------------------------------------------------------------------------
# Span mass
# ---------------------------------------------------------------------------------------------


def span_names(labels: Sequence[str]) -> list[str]:
    """The spans of a prompt: :data:`SPANS` plus any extra label (``reference``) in order."""
    extra = sorted(set(labels) - set(SPANS))
    return list(SPANS) + extra


def span_mass(rows: torch.Tensor, labels: Sequence[str],
              spans: Sequence[str] | None = None) -> torch.Tensor:
    """Attention mass of each labelled span (paper section 3.2).

    Args:
        rows: attention rows ``[..., pos]`` (e.g. ``[n_layers, n_heads, pos]``).
        labels: span label of every position, ``len(labels) == pos``.
        spans: span order of the output (default :func:`span_names` of ``labels``).

    Returns:
        ``[..., n_spans]`` float32: ``mass[..., s] = sum of rows[..., p] over p labelled s``.
        A span absent from the prompt (``candidate`` in gen) gets 0.

    Raises:
        AttentionError: ``labels`` and ``rows`` disagree in length, or a label is not in
            ``spans``.
    """
    if rows.shape[-1] != len(labels):
        raise AttentionError(f"{len(labels)} labels for rows over {rows.shape[-1]} positions")
    spans = list(spans or span_names(labels))
    index = {s: i for i, s in enumerate(spans)}
    if unknown := set(labels) - set(index):
        raise AttentionError(f"labels {sorted(unknown)} are not among the spans {spans}")
    onehot = torch.zeros(len(labels), len(spans), dtype=torch.float32)
    onehot[torch.arange(len(labels)), torch.tensor([index[lab] for lab in labels])] = 1.0
    return rows.float().cpu() @ onehot


# ---------------------------------------------------------------------------------------------
# Records -> prompts
# ---------------------------------------------------------------------------------------------


def record_prompts(rec: Mapping[str, Any], handle: ModelHandle, *,
                   templates_path: str | None = None) -> dict[str, RenderedPrompt]:
    """Re-render a record's gen and eval prompts and check them against the stored spans.

    Args:
        rec: an ok record of ``records.jsonl`` (:mod:`interp.asymmetry`).
        handle: the model whose tokenizer renders.
        templates_path: TOML file of template variants (the run manifest's
            ``config.templates_path``; None for the bundled ones).

    Returns:
        ``{"gen": RenderedPrompt, "eval": RenderedPrompt}``.

    Raises:
        AttentionError: the record lacks a field, or the rendered token spans / length differ
            from the record's ``prompts.*`` (message names the record id and the difference).
    """
    rid = f"{rec.get('dataset')}/{rec.get('id')}"
    try:
        template = get_template(rec.get("template", "default"), templates_path)
        ref = rec["answers"][0] if rec.get("answers") else ""
        kw = {"context": rec["context"], "question": rec["question"], "reference": ref}
        out = {"gen": render(handle.tokenizer, template, "gen", **kw),
               "eval": render(handle.tokenizer, template, "eval", answer=rec["answer"], **kw)}
    except KeyError as err:
        raise AttentionError(f"record {rid} lacks the field {err}") from err
    except ValueError as err:
        raise AttentionError(f"record {rid}: cannot render its prompts ({err})") from err
    for task, p in out.items():
        stored = rec.get("prompts", {}).get(task)
        if stored is None:
            raise AttentionError(f"record {rid} has no prompts.{task} (not an ok asymmetry "
                                 f"record?)")
        want = {k: list(v) for k, v in stored.get("token_spans", {}).items()}
        got = {k: list(v) for k, v in p.token_spans.items()}
        if want != got or stored.get("n_tokens", len(p)) != len(p):
            raise AttentionError(
                f"record {rid}: the {task} prompt's spans cannot be found where the run put "
                f"them (stored {want}, {stored.get('n_tokens')} tokens; re-rendered {got}, "
                f"{len(p)} tokens). Was the run made with another tokenizer or template?")
    return out


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


@dataclass
class AttentionConfig:
    """Settings of the attention stage (``[attention]`` table of a config).

    Attributes:
        backend: ``hf`` (default), ``eager``, ``tlens`` or ``nnsight``.
        layers: band for the summary and head ranking (``last8``, ``24-31``, ``all``).
        limit: records per dataset (first N ok records; None for all).
        save_rows: keep every record's rows ``[n_layers, n_heads, pos]``.
        save_resid: layer spec whose residual streams / head outputs to save (None: none).
        save_patterns: with ``save_resid``, also save full patterns of those layers.
        n_boot: bootstrap resamples for CIs; ``seed`` their seed.
        figures: draw the figures into ``DIR/figures``.
        top: heads listed per ranking in ``DIR/attention/heads.json``.
    """

    backend: str = "hf"
    layers: str = "last8"
    limit: int | None = None
    save_rows: bool = False
    save_resid: str | None = None
    save_patterns: bool = False
    n_boot: int = 1000
    seed: int = 0
    figures: bool = True
    top: int = 10

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> AttentionConfig:
        """Build from a config table.

        Raises:
            AttentionError: unknown keys (the message lists the known ones).
        """
        return config_from_table(cls, d, STAGE, AttentionError)


def _safe(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))
    if s != str(name) or not s:
        s = f"{s[:60]}-{hashlib.sha1(str(name).encode()).hexdigest()[:8]}"
    return s


def record_path(run: RunDir, rec: Mapping[str, Any]) -> Path:
    """``DIR/attention/records/<dataset>/<id>.safetensors`` of a record."""
    folder = run.path / "attention" / "records" / _safe(rec["dataset"])
    return folder / f"{_safe(rec['id'])}.safetensors"


def activations_path(run: RunDir, rec: Mapping[str, Any]) -> Path:
    """``DIR/activations/<dataset>/<id>.safetensors`` of a record."""
    return run.path / "activations" / _safe(rec["dataset"]) / f"{_safe(rec['id'])}.safetensors"


def _select(records: list[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    if limit is None:
        return records
    seen: dict[str, int] = {}
    out = []
    for r in records:
        if seen.get(r["dataset"], 0) < limit:
            out.append(r)
            seen[r["dataset"]] = seen.get(r["dataset"], 0) + 1
    return out


def _done(path: Path, need_rows: bool) -> bool:
    if not path.exists():
        return False
    if not need_rows:
        return True
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return "rows.gen" in f.keys()


def record_run(run: RunDir, handle: ModelHandle, config: AttentionConfig | None = None, *,
               log: Callable[[str], None] = print) -> int:
    """Steps 1-3 of the module algorithm for every ok record not yet recorded.

    Args:
        run: a finished asymmetry run directory.
        handle: the run's model.
        config: settings (default :class:`AttentionConfig`).
        log: where progress lines go.

    Returns:
        Number of records recorded now (already recorded ones are skipped: resume).

    Raises:
        interp.store.RunDirError: no manifest / records, or no ok record.
        AttentionError: a record whose spans do not match, layers outside the model.
    """
    config = config or AttentionConfig()
    manifest = run.manifest()
    records = _select(run.read_records(), config.limit)
    if not records:
        raise RunDirError(f"{run.path}/records.jsonl holds no ok record: nothing to record")
    if manifest.get("model", {}).get("sha256") and handle.info.get("sha256") and \
            manifest["model"]["sha256"] != handle.info["sha256"]:
        raise AttentionError(f"{run.path} was made with model {manifest['model'].get('spec')!r} "
                             f"(sha256 {manifest['model']['sha256'][:12]}), not {handle.spec!r}")
    parse_layers(config.layers, handle.n_layers)
    act_layers = parse_layers(config.save_resid, handle.n_layers) if config.save_resid else []
    tpath = manifest.get("config", {}).get("templates_path")
    todo = [r for r in records
            if not (_done(record_path(run, r), config.save_rows)
                    and (not act_layers or activations_path(run, r).exists()))]
    log(f"[attention] {len(records)} records, {len(records) - len(todo)} already recorded, "
        f"backend {config.backend}")
    from tqdm.auto import tqdm

    for rec in tqdm(todo, desc="attention", unit="rec", disable=not todo):
        prompts = record_prompts(rec, handle, templates_path=tpath)
        spans = span_names([lab for p in prompts.values() for lab in p.labels])
        tensors: dict[str, torch.Tensor] = {}
        acts: dict[str, torch.Tensor] = {}
        for task, p in prompts.items():
            got = record_rows(handle, p.input_ids, backend=config.backend,
                              act_layers=act_layers, patterns=config.save_patterns)
            tensors[f"mass.{task}"] = span_mass(got.rows, p.labels, spans)
            if config.save_rows:
                tensors[f"rows.{task}"] = got.rows
            acts.update({f"{task}.{k}": v for k, v in got.acts.items()})
        meta = {"id": str(rec["id"]), "dataset": rec["dataset"], "spans": json.dumps(spans),
                "backend": config.backend, "n_layers": str(handle.n_layers),
                "n_heads": str(handle.n_heads),
                "n_tokens": json.dumps({t: len(p) for t, p in prompts.items()})}
        if acts:
            save_tensors(activations_path(run, rec), acts,
                         {**meta, "layers": json.dumps(act_layers)})
        save_tensors(record_path(run, rec), tensors, meta)
    return len(todo)


def load_masses(run: RunDir, *, limit: int | None = None
                ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray], list[str], list[str]]:
    """Load the recorded span masses of a run's ok records (no model).

    Returns:
        ``(records, mass, spans, backends)``: the ok records that have a recording, ``mass`` =
        ``{"gen": [n_rec, n_layers, n_heads, n_spans], "eval": ...}`` (spans aligned to the
        union ``spans``), and the backends that recorded them.

    Raises:
        interp.store.RunDirError: no records, or none recorded yet (run ``interp attention``).
    """
    from safetensors import safe_open

    records = _select(run.read_records(), limit)
    have, per, spans, backends = [], [], list(SPANS), set()
    for r in records:
        p = record_path(run, r)
        if not p.exists():
            continue
        with safe_open(str(p), "pt") as f:
            meta = f.metadata() or {}
            s = json.loads(meta.get("spans", json.dumps(list(SPANS))))
            backends.add(meta.get("backend", "?"))
            per.append((s, {t: f.get_tensor(f"mass.{t}").numpy() for t in TASKS}))
        spans += [x for x in s if x not in spans]
        have.append(r)
    if not have:
        raise RunDirError(f"{run.path} has no attention recordings: run `interp attention --run "
                          f"{run.path}` first")
    mass = {}
    for t in TASKS:
        n_l, n_h = per[0][1][t].shape[:2]
        arr = np.zeros((len(per), n_l, n_h, len(spans)), dtype=np.float32)
        for i, (s, m) in enumerate(per):
            for j, name in enumerate(s):
                arr[i, :, :, spans.index(name)] = m[t][:, :, j]
        mass[t] = arr
    return have, mass, spans, sorted(backends)


def span_mass_table(records: Sequence[Mapping[str, Any]], mass: Mapping[str, np.ndarray],
                    spans: Sequence[str]) -> Any:
    """Long table: one row per (id, dataset, task, layer, head, span) with ``mass``.

    Returns:
        ``pandas.DataFrame`` with columns ``id, dataset, task, layer, head, span, mass``.
    """
    import pandas as pd

    frames = []
    for t in TASKS:
        m = mass[t]
        n, n_l, n_h, n_s = m.shape
        idx = np.indices((n, n_l, n_h, n_s)).reshape(4, -1)
        frames.append(pd.DataFrame({
            "id": np.array([str(r["id"]) for r in records])[idx[0]],
            "dataset": np.array([r["dataset"] for r in records])[idx[0]],
            "task": t, "layer": idx[1].astype(np.int16), "head": idx[2].astype(np.int16),
            "span": np.array(spans)[idx[3]], "mass": m.reshape(-1)}))
    return pd.concat(frames, ignore_index=True)


def _boot_mean(x: np.ndarray, rng: np.random.Generator, n_boot: int) -> dict[str, Any]:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return {"mean": None, "ci": None}
    if x.size == 1 or n_boot <= 0:
        return {"mean": float(x.mean()), "ci": None}
    b = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    return {"mean": float(x.mean()), "ci": [float(np.percentile(b, 2.5)),
                                            float(np.percentile(b, 97.5))]}


def _group(band_g: np.ndarray, band_e: np.ndarray, spans: Sequence[str],
           rng: np.random.Generator, n_boot: int) -> dict[str, Any]:
    """band_* ``[n_rec, n_spans]`` -> means, CIs and the context ratio."""
    n = band_g.shape[0]
    out: dict[str, Any] = {"n": int(n)}
    if n == 0:
        return out
    for t, arr in (("gen", band_g), ("eval", band_e)):
        out[t] = {s: _boot_mean(arr[:, j], rng, n_boot) for j, s in enumerate(spans)}
    c = list(spans).index("context")
    g, e = band_g[:, c].astype(np.float64), band_e[:, c].astype(np.float64)
    out["context_ratio"] = float(g.mean() / e.mean()) if e.mean() > 0 else None
    out["context_ratio_ci"] = None
    if n > 1 and n_boot > 0:
        idx = rng.integers(0, n, size=(n_boot, n))
        ratios = g[idx].mean(1) / np.maximum(e[idx].mean(1), 1e-12)
        out["context_ratio_ci"] = [float(np.percentile(ratios, 2.5)),
                                   float(np.percentile(ratios, 97.5))]
    return out


def _verdict_name(v: Any) -> str:
    """Record verdict (True / False / None, or the words) -> Correct / Incorrect / none."""
    if v is True or (isinstance(v, str) and v.lower() == "correct"):
        return "Correct"
    if v is False or (isinstance(v, str) and v.lower() == "incorrect"):
        return "Incorrect"
    return "none"


def summarize(records: Sequence[Mapping[str, Any]], mass: Mapping[str, np.ndarray],
              spans: Sequence[str], band: Sequence[int], *, n_boot: int = 1000,
              seed: int = 0) -> dict[str, Any]:
    """Per-dataset band means with bootstrap CIs, context ratio, splits and layerwise means.

    Args:
        records: records aligned with the first axis of ``mass``.
        mass: ``{"gen": [n_rec, n_layers, n_heads, n_spans], "eval": ...}``.
        spans: span names of the last axis.
        band: layers averaged for the band means (paper: the last eight).
        n_boot: bootstrap resamples over records (percentile 95% CIs); seed: their seed.

    Returns:
        ``{"band", "spans", "n_layers", "n_heads", "per_dataset": {name: group}, "overall"}``;
        a group has ``n``, ``gen``/``eval`` ``{span: {mean, ci}}``, ``context_ratio`` (+ci),
        ``by_oracle_label`` (``correct``/``incorrect``), ``by_verdict``
        (``Correct``/``Incorrect``/``none``), ``layerwise`` (``{task: {span: {mean, lo,
        hi}}}`` lists over layers, mean over heads) and ``head_context`` (``{task: [n_layers]
        [n_heads]}`` mean context mass).
    """
    rng = np.random.default_rng(seed)
    band = list(band)
    n_l, n_h = mass["gen"].shape[1:3]
    band_mass = {t: mass[t][:, band].mean(axis=(1, 2)) for t in TASKS}  # [n_rec, n_spans]
    layer_mass = {t: mass[t].mean(axis=2) for t in TASKS}  # [n_rec, n_layers, n_spans]
    c = list(spans).index("context")

    def group(sel: np.ndarray, full: bool) -> dict[str, Any]:
        out = _group(band_mass["gen"][sel], band_mass["eval"][sel], spans, rng, n_boot)
        if not full or not sel.any():
            return out
        ol = np.array([bool(r.get("oracle_label")) for r in records])
        ver = np.array([_verdict_name(r.get("verdict")) for r in records])
        out["by_oracle_label"] = {
            name: _group(band_mass["gen"][sel & m], band_mass["eval"][sel & m], spans, rng,
                         n_boot)
            for name, m in (("correct", ol), ("incorrect", ~ol))}
        out["by_verdict"] = {
            v: _group(band_mass["gen"][sel & (ver == v)], band_mass["eval"][sel & (ver == v)],
                      spans, rng, n_boot)
            for v in sorted(set(ver[sel]))}
        lw: dict[str, Any] = {}
        for t in TASKS:
            lw[t] = {}
            for j, s in enumerate(spans):
                x = layer_mass[t][sel][:, :, j].astype(np.float64)  # [n, n_layers]
                lo = hi = x.mean(0)
                if x.shape[0] > 1 and n_boot > 0:
                    idx = rng.integers(0, x.shape[0], size=(n_boot, x.shape[0]))
                    bm = x[idx].mean(1)
                    lo, hi = np.percentile(bm, 2.5, axis=0), np.percentile(bm, 97.5, axis=0)
                lw[t][s] = {"mean": x.mean(0).tolist(), "lo": np.asarray(lo).tolist(),
                            "hi": np.asarray(hi).tolist()}
        out["layerwise"] = lw
        out["head_context"] = {t: mass[t][sel][:, :, :, c].mean(0).tolist() for t in TASKS}
        return out

    ds = np.array([r["dataset"] for r in records])
    per = {d: group(ds == d, True) for d in dict.fromkeys(ds)}
    return {"band": band, "spans": list(spans), "n_layers": int(n_l), "n_heads": int(n_h),
            "n_boot": n_boot, "seed": seed, "per_dataset": per,
            "overall": group(np.ones(len(records), dtype=bool), True)}


def top_heads(summary: Mapping[str, Any], *, dataset: str | None = None, top: int = 10,
              layers: Sequence[int] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Heads ranked by context mass in gen, in eval, and by gen minus eval.

    Args:
        summary: ``summary.json`` content (:func:`summarize`).
        dataset: one dataset (default: all records, ``overall``).
        top: heads per ranking.
        layers: restrict to these layers (default: all).

    Returns:
        ``{"gen": [...], "eval": [...], "diff": [...]}``, each a list of ``{layer, head, gen,
        eval, diff}`` sorted descending by the ranking's key.

    Raises:
        AttentionError: an unknown dataset (names the known ones).
    """
    if dataset is None:
        grp = summary["overall"]
    elif dataset not in summary["per_dataset"]:
        raise AttentionError(f"no dataset {dataset!r} in the summary; have "
                             f"{sorted(summary['per_dataset'])}")
    else:
        grp = summary["per_dataset"][dataset]
    g = np.asarray(grp["head_context"]["gen"])
    e = np.asarray(grp["head_context"]["eval"])
    keep = list(layers) if layers is not None else list(range(g.shape[0]))
    rows = [{"layer": int(layer), "head": int(h), "gen": float(g[layer, h]),
             "eval": float(e[layer, h]), "diff": float(g[layer, h] - e[layer, h])}
            for layer in keep for h in range(g.shape[1])]
    return {k: sorted(rows, key=lambda r: -r[k])[:top] for k in ("gen", "eval", "diff")}


def write_tables(run: RunDir, config: AttentionConfig | None = None, *,
                 n_layers: int | None = None) -> dict[str, Any]:
    """Step 4-5: span_mass.parquet, summary.json, heads.json and figures from recordings.

    Raises:
        interp.store.RunDirError: nothing recorded yet.
        AttentionError: the band lies outside the recorded layers.
    """
    config = config or AttentionConfig()
    records, mass, spans, backends = load_masses(run, limit=config.limit)
    n_l = mass["gen"].shape[1]
    band = parse_layers(config.layers, n_layers or n_l)
    out = run.sub("attention")
    df = span_mass_table(records, mass, spans)
    tmp = out / ".span_mass.parquet.tmp"
    df.to_parquet(tmp, index=False)
    tmp.replace(out / "span_mass.parquet")
    summary = summarize(records, mass, spans, band, n_boot=config.n_boot, seed=config.seed)
    summary.update(layers_spec=config.layers, backends=backends,
                   model=run.manifest().get("model", {}).get("spec"))
    write_json(out / "summary.json", summary)
    heads = {"band": band, "overall": top_heads(summary, top=config.top),
             "per_dataset": {d: top_heads(summary, dataset=d, top=config.top)
                             for d in summary["per_dataset"]}}
    write_json(out / "heads.json", heads)
    if config.figures:
        from interp import plots

        figs = run.sub("figures")
        plots.plot_span_mass_layerwise(summary, figs)
        plots.plot_head_context_heatmaps(summary, figs)
        plots.plot_context_ratio(summary, figs)
    return summary


def run_attention(run: RunDir | str | Path, handle: ModelHandle | None = None,
                  config: AttentionConfig | None = None, *,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Record every record of a run (resuming), then write the tables and figures.

    Args:
        run: asymmetry run directory.
        handle: the run's model (default: loaded from the manifest's model spec).
        config: settings.
        log: progress lines.

    Returns:
        ``summary.json``'s content.
    """
    run = run if isinstance(run, RunDir) else RunDir(run)
    config = config or AttentionConfig()
    if handle is None:
        from interp.models import load_model

        m = run.manifest()
        c = m.get("config", {})
        handle = load_model(m.get("model", {}).get("spec") or c.get("model"),
                            device=c.get("device"), dtype=c.get("dtype"))
    record_run(run, handle, config, log=log)
    return write_tables(run, config, n_layers=handle.n_layers)


def format_summary(summary: Mapping[str, Any]) -> str:
    """Plain-text table: band span masses gen/eval and the context ratio per dataset."""
    band = summary["band"]
    lines = [f"band layers {band[0]}-{band[-1]} ({len(band)} layers, all heads); "
             f"backend {','.join(summary.get('backends', []))}",
             f"{'dataset':<12}{'n':>4}  {'ctx gen':>8} {'ctx eval':>9} {'ratio':>7}  "
             f"{'q gen':>6} {'q eval':>7}  {'cand eval':>9}  {'tmpl gen':>8} {'tmpl eval':>9}"]
    groups = list(summary["per_dataset"].items()) + [("overall", summary["overall"])]

    def f(g: Mapping[str, Any], t: str, s: str) -> str:
        v = g.get(t, {}).get(s, {}).get("mean")
        return "-" if v is None else f"{v:.3f}"

    for name, g in groups:
        r = g.get("context_ratio")
        lines.append(f"{name:<12}{g['n']:>4}  {f(g, 'gen', 'context'):>8} "
                     f"{f(g, 'eval', 'context'):>9} {('-' if r is None else f'{r:.2f}'):>7}  "
                     f"{f(g, 'gen', 'question'):>6} {f(g, 'eval', 'question'):>7}  "
                     f"{f(g, 'eval', 'candidate'):>9}  {f(g, 'gen', 'template'):>8} "
                     f"{f(g, 'eval', 'template'):>9}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def run_stage(run: RunDir, section: dict, handle: ModelHandle) -> None:
    """``interp run``: the ``[attention]`` table of a config (keys of :class:`AttentionConfig`).

    Raises:
        AttentionError: unknown keys in the table.
    """
    cfg = AttentionConfig.from_mapping(section)
    print(format_summary(run_attention(run, handle, cfg)))


def register(app: Any) -> None:
    """Add the ``attention`` and ``heads`` commands to the ``interp`` app."""
    @app.command("attention")
    def attention_cmd(
        run: Annotated[Path, typer.Option(help="finished asymmetry run directory")],
        backend: Annotated[str, typer.Option(help="hf | eager | tlens | nnsight")] = "hf",
        layers: Annotated[str, typer.Option(help="band: last8, 24-31, all")] = "last8",
        limit: Annotated[int | None, typer.Option(help="records per dataset")] = None,
        save_rows: Annotated[bool, typer.Option(help="keep rows per record")] = False,
        save_resid: Annotated[str | None, typer.Option(
            help="layers whose resid_pre/resid_post/head outputs to save, e.g. 24-31")] = None,
        save_patterns: Annotated[bool, typer.Option(
            help="with --save-resid: also full patterns of those layers")] = False,
        n_boot: int = 1000,
        seed: int = 0,
        tables_only: Annotated[bool, typer.Option(
            help="only rebuild tables and figures from existing recordings")] = False,
    ) -> None:
        """Study 2: last-token attention rows and span mass per layer and head."""
        cfg = AttentionConfig(backend=backend, layers=layers, limit=limit, save_rows=save_rows,
                              save_resid=save_resid, save_patterns=save_patterns,
                              n_boot=n_boot, seed=seed)
        rd = RunDir(run)
        try:
            summary = write_tables(rd, cfg) if tables_only else run_attention(rd, None, cfg)
        except (AttentionError, RunDirError) as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from err
        typer.echo(format_summary(summary))
        typer.echo(f"wrote {run}/attention/span_mass.parquet, summary.json, heads.json and "
                   f"{run}/figures/attention_*.png")

    @app.command("heads")
    def heads_cmd(
        run: Annotated[Path, typer.Option(help="run directory with attention/summary.json")],
        dataset: Annotated[str | None, typer.Option(help="one dataset (default all)")] = None,
        top: int = 10,
        layers: Annotated[str, typer.Option(help="restrict to layers: all, last8, 24-31")] = (
            "all"),
    ) -> None:
        """List the top heads by context mass in gen, in eval, and by gen minus eval."""
        path = RunDir(run).path / "attention" / "summary.json"
        if not path.exists():
            typer.echo(f"error: {path} does not exist: run `interp attention --run {run}` "
                       f"first", err=True)
            raise typer.Exit(2)
        summary = read_json(path)
        try:
            sel = parse_layers(layers, summary["n_layers"])
            ranked = top_heads(summary, dataset=dataset, top=top, layers=sel)
        except AttentionError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from err
        for key, title in (("gen", "context mass in gen"), ("eval", "context mass in eval"),
                           ("diff", "gen minus eval context mass")):
            typer.echo(f"top {top} heads by {title} ({dataset or 'all datasets'}):")
            typer.echo(f"  {'layer':>5} {'head':>4} {'gen':>7} {'eval':>7} {'diff':>7}")
            for r in ranked[key]:
                typer.echo(f"  {r['layer']:>5} {r['head']:>4} {r['gen']:>7.3f} "
                           f"{r['eval']:>7.3f} {r['diff']:>+7.3f}")


__all__ = ["STAGE", "SPANS", "AttentionConfig", "AttentionError", "Recording",
           "parse_layers", "record_rows", "register_recorder", "span_mass", "span_names",
           "record_prompts", "record_run", "load_masses", "span_mass_table", "summarize",
           "top_heads", "write_tables", "run_attention", "format_summary", "run_stage",
           "register", "load_tensors"]
