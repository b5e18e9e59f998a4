"""Study 2 (paper section 3.2): last-token attention rows and span mass, per layer and head.

Algorithm, per ok record of a finished asymmetry run (the run-directory work is
:mod:`interp.stages.attention`):

1. Re-render the generation prompt and the evaluation prompt (the model's own extracted answer
   as candidate) with the record's template and check that the token spans equal the record's
   stored ``prompts.{gen,eval}.token_spans`` (:func:`interp.asymmetry.record_prompts`; a
   mismatch names the record: the tokenizer or template changed since the run).
2. Run the model ONCE per prompt and record the last-token attention row ``A[l, h, :]`` of every
   layer ``l`` and query head ``h`` (:func:`interp.hooks.recorder.record_rows`): the
   distribution the model uses to predict the first output token (for the eval prompt: the
   verdict). GQA: query head ``h`` reads key/value head ``h // (n_heads / n_kv_heads)``.
3. Span mass (:func:`span_mass`): every position carries exactly one label from
   :attr:`interp.prompts.RenderedPrompt.labels` (``context``, ``question``, ``candidate``
   (eval only), ``template`` = everything else; ``reference`` for templates that show a gold
   answer). ``mass[l, h, s] = sum_{p: label(p) = s} A[l, h, p]``, so the masses of a row sum
   to 1.
4. Tables (:func:`span_mass_table`, :func:`summarize`): one row per id, dataset, task, layer,
   head, span with ``mass``; per dataset, the band mean (all heads, band layers; default the
   last eight layers, paper: 24-31 of 32) of each span for gen and eval with percentile
   bootstrap 95% CIs over records (:mod:`interp.stats`), ``context_ratio`` = mean gen context
   mass / mean eval context mass (a ratio of means, paired bootstrap CI), the same split by
   oracle label and by verdict, layerwise means with CIs, and the mean context mass of every
   (layer, head); :func:`top_heads` ranks heads by it.
5. Figures from the summary (:mod:`interp.plots`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp.errors import AttentionError
from interp.stats import bootstrap_mean, percentile_ci, resample_indices
from interp.store import Record

__all__ = ["SPANS", "TASKS", "format_heads", "format_summary", "span_mass", "span_mass_table",
           "span_names", "summarize", "top_heads"]

SPANS = ("context", "question", "candidate", "template")
"""Span order of the mass tensors (``reference`` is appended when a template uses it)."""
TASKS = ("gen", "eval")

Mass = Float[np.ndarray, "rec layer head span"]
"""Span masses of records: ``[n_records, n_layers, n_heads, n_spans]``."""


def span_names(labels: Sequence[str]) -> list[str]:
    """The spans of a prompt: :data:`SPANS` plus any extra label (``reference``) in order."""
    extra = sorted(set(labels) - set(SPANS))
    return list(SPANS) + extra


def span_mass(rows: Float[Tensor, "... pos"], labels: Sequence[str],
              spans: Sequence[str] | None = None) -> Float[Tensor, "... span"]:
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


def span_mass_table(records: Sequence[Record] | Sequence[Mapping[str, Any]],
                    mass: Mapping[str, Mass], spans: Sequence[str]) -> pd.DataFrame:
    """Long table: one row per (id, dataset, task, layer, head, span) with ``mass``.

    Args:
        records: records aligned with the first axis of ``mass``.
        mass: ``{"gen": [n_rec, n_layers, n_heads, n_spans], "eval": ...}``.
        spans: span names of the last axis.

    Returns:
        ``pandas.DataFrame`` with columns ``id, dataset, task, layer, head, span, mass``.
    """
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


def _group(band_g: np.ndarray, band_e: np.ndarray, spans: Sequence[str],
           rng: np.random.Generator, n_boot: int) -> dict[str, Any]:
    """band_* ``[n_rec, n_spans]`` -> means, CIs and the context ratio (a ratio of means)."""
    n = band_g.shape[0]
    out: dict[str, Any] = {"n": int(n)}
    if n == 0:
        return out
    for t, arr in (("gen", band_g), ("eval", band_e)):
        out[t] = {s: bootstrap_mean(arr[:, j], rng, n_boot) for j, s in enumerate(spans)}
    c = list(spans).index("context")
    g, e = band_g[:, c].astype(np.float64), band_e[:, c].astype(np.float64)
    out["context_ratio"] = float(g.mean() / e.mean()) if e.mean() > 0 else None
    out["context_ratio_ci"] = None
    if n > 1 and n_boot > 0:
        idx = resample_indices(n, n_boot, rng)
        out["context_ratio_ci"] = percentile_ci(g[idx].mean(1)
                                                / np.maximum(e[idx].mean(1), 1e-12))
    return out


def _layerwise(layer_mass: np.ndarray, spans: Sequence[str], rng: np.random.Generator,
               n_boot: int) -> dict[str, dict[str, list[float]]]:
    """``[n, n_layers, n_spans]`` -> per span ``{mean, lo, hi}`` lists over layers."""
    out = {}
    for j, s in enumerate(spans):
        x = layer_mass[:, :, j].astype(np.float64)  # [n, n_layers]
        lo = hi = x.mean(0)
        if x.shape[0] > 1 and n_boot > 0:
            lo, hi = percentile_ci(x[resample_indices(x.shape[0], n_boot, rng)].mean(1))
        out[s] = {"mean": x.mean(0).tolist(), "lo": np.asarray(lo).tolist(),
                  "hi": np.asarray(hi).tolist()}
    return out


def _verdict_name(v: Any) -> str:
    """Record verdict (True / False / None, or the words) -> Correct / Incorrect / none."""
    if v is True or (isinstance(v, str) and v.lower() == "correct"):
        return "Correct"
    if v is False or (isinstance(v, str) and v.lower() == "incorrect"):
        return "Incorrect"
    return "none"


def summarize(records: Sequence[Record] | Sequence[Mapping[str, Any]], mass: Mapping[str, Mass],
              spans: Sequence[str], band: Sequence[int], *, n_boot: int = 1000,
              seed: int = 0) -> dict[str, Any]:
    """Per-dataset band means with bootstrap CIs, context ratio, splits and layerwise means.

    Args:
        records: records aligned with the first axis of ``mass``.
        mass: ``{"gen": [n_rec, n_layers, n_heads, n_spans], "eval": ...}``.
        spans: span names of the last axis.
        band: layers averaged for the band means (paper: the last eight).
        n_boot: bootstrap resamples over records (percentile 95% CIs).
        seed: seed of the one generator all resamples are drawn from, in a fixed order.

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
    ol = np.array([bool(r.get("oracle_label")) for r in records])
    ver = np.array([_verdict_name(r.get("verdict")) for r in records])

    def split(sel: np.ndarray) -> dict[str, Any]:
        return _group(band_mass["gen"][sel], band_mass["eval"][sel], spans, rng, n_boot)

    def group(sel: np.ndarray) -> dict[str, Any]:
        out = split(sel)
        if not sel.any():
            return out
        out["by_oracle_label"] = {name: split(sel & m)
                                  for name, m in (("correct", ol), ("incorrect", ~ol))}
        out["by_verdict"] = {v: split(sel & (ver == v)) for v in sorted(set(ver[sel]))}
        out["layerwise"] = {t: _layerwise(layer_mass[t][sel], spans, rng, n_boot) for t in TASKS}
        out["head_context"] = {t: mass[t][sel][:, :, :, c].mean(0).tolist() for t in TASKS}
        return out

    ds = np.array([r["dataset"] for r in records])
    per = {d: group(ds == d) for d in dict.fromkeys(ds)}
    return {"band": band, "spans": list(spans), "n_layers": int(n_l), "n_heads": int(n_h),
            "n_boot": n_boot, "seed": seed, "per_dataset": per,
            "overall": group(np.ones(len(records), dtype=bool))}


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


def format_heads(ranked: Mapping[str, Sequence[Mapping[str, Any]]], *, top: int,
                 dataset: str | None = None) -> str:
    """The three rankings of :func:`top_heads` as text."""
    lines = []
    for key, title in (("gen", "context mass in gen"), ("eval", "context mass in eval"),
                       ("diff", "gen minus eval context mass")):
        lines.append(f"top {top} heads by {title} ({dataset or 'all datasets'}):")
        lines.append(f"  {'layer':>5} {'head':>4} {'gen':>7} {'eval':>7} {'diff':>7}")
        lines += [f"  {r['layer']:>5} {r['head']:>4} {r['gen']:>7.3f} {r['eval']:>7.3f} "
                  f"{r['diff']:>+7.3f}" for r in ranked[key]]
    return "\n".join(lines)
