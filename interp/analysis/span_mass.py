"""Study 2 (paper section 3.2): last-token attention rows and span mass, per layer and head.

Algorithm, per ok record of a finished asymmetry run (the run-directory work is
:mod:`interp.stages.attention`):

1. Re-render the generation prompt and the evaluation prompt (the model's own extracted answer
   as candidate) with the record's template and check that the token spans equal the record's
   stored ``prompts.{gen,eval}.token_spans`` (:func:`interp.judging.prompts.record_prompts`; a
   mismatch names the record: the tokenizer or template changed since the run).
2. Run the model ONCE per prompt and record the last-token attention row ``A[l, h, :]`` of every
   layer ``l`` and query head ``h`` (:func:`interp.hooks.recorder.record_rows`): the
   distribution the model uses to predict the first output token (for the eval prompt: the
   verdict). GQA: query head ``h`` reads key/value head ``h // (n_heads / n_kv_heads)``.
3. Span mass (:func:`span_mass`): every position carries exactly one label from
   :attr:`interp.judging.prompts.RenderedPrompt.labels` (``context``, ``question``, ``candidate``
   (eval only), ``template`` = everything else; ``reference`` for templates that show a gold
   answer). ``mass[l, h, s] = sum_{p: label(p) = s} A[l, h, p]``, so the masses of a row sum
   to 1.
4. Tables (:func:`span_mass_table`, :func:`summarize`): one row per id, dataset, task, layer,
   head, span with ``mass``; per dataset and overall (and split by oracle label and by
   verdict), over the band (all heads, band layers; default the last eight layers, paper:
   24-31 of 32), the numbers of :data:`SUMMARY_DEFINITIONS`: band mean mass of each span for
   gen and eval; ``context_ratio`` = mean gen context mass / mean eval context mass (a RATIO
   OF MEANS); ``context_ratio_geometric`` = exp(mean over records of log(gen / eval context
   mass)) (a geometric MEAN OF RATIOS); the context share of the three content spans,
   context / (context + question + candidate), per record then averaged (a mean of ratios),
   and its gen/eval ratio of means (a control for mass moved onto the template); the mass per
   token of each span (per record, then averaged). Every CI is a percentile bootstrap over
   passages (:class:`interp.analysis.stats.ClusterBootstrap`, cluster = dataset + context hash; all
   statistics of a group on the same resamples), ``n_passages`` sits beside ``n`` and a group
   on fewer than 10 passages carries ``few_passages`` and a ``note``. Also layerwise means
   with CIs and the mean context mass of every (layer, head); :func:`top_heads` ranks heads
   by it.
5. Figures from the summary (:mod:`interp.plots`).
6. Span-to-span attention (:func:`span_to_span`, from FULL patterns ``A[l, h, q, k]`` that
   ``interp record`` computes, :mod:`interp.stages.record`): the mass each query span puts on
   each key span, ``S[l, h, i, j] = mean_{q in Q_i} sum_{k in K_j} A[l, h, q, k]``. Key spans
   are the labels of step 3; query spans are the same labels over all positions but the last,
   plus :data:`LAST` = the last position alone (the verdict position of the eval prompt, the
   answer position of the gen prompt). Each row sums to 1; a query span absent from a prompt
   (``candidate`` in gen) is NaN, and so is, in the summary, the column of a key span no
   prompt of the group has. :func:`summarize_span_to_span` averages the band: per record
   the mean over band layers and heads, then the mean over records (NaN rows left out, their
   count reported per query span), per dataset, with the number of distinct passages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp.analysis.stats import (
    MIN_PASSAGES,
    ClusterBootstrap,
    merge_notes,
    passage_groups,
    passage_note,
)
from interp.core.errors import StageError
from interp.core.names import dataset_order, in_dataset_order
from interp.store.records import Record

__all__ = ["CONTENT_SPANS", "LAST", "SPANS", "SUMMARY_DEFINITIONS", "TASKS", "format_heads",
           "format_summary", "query_span_names", "span_mass", "span_mass_table", "span_names",
           "span_to_span", "span_tokens", "summarize", "summarize_span_to_span", "top_heads"]

SPANS = ("context", "question", "candidate", "template")
"""Span order of the mass tensors (``reference`` is appended when a template uses it)."""
TASKS = ("gen", "eval")
CONTENT_SPANS = ("context", "question", "candidate")
"""The spans that carry the example's content (the renormalised context share's denominator)."""

SUMMARY_DEFINITIONS = {
    "n": "records in the group; n_passages: distinct passages (dataset + context hash)",
    "few_passages": f"true when n_passages < {MIN_PASSAGES}; note then says so",
    "gen / eval": "band mean mass of each span: mean over records of the mass averaged over "
                  "the band's layers and all heads",
    "context_ratio": "ratio of means: mean gen context mass / mean eval context mass",
    "context_log_ratio": "mean over records of log(gen context mass / eval context mass), nats",
    "context_ratio_geometric": "exp(context_log_ratio): the geometric mean of per-record "
                               "ratios (a mean of ratios)",
    "content_context_share": "mean over records of context / (context + question + "
                             "candidate) mass (a mean of ratios), per task",
    "content_context_share_ratio": "ratio of means: gen content_context_share / eval "
                                   "content_context_share",
    "context_question_share": "mean over records of context / (context + question) mass (a "
                              "mean of ratios), per task: the spans both prompts have, so the "
                              "judge's candidate is in neither denominator",
    "context_question_share_ratio": "ratio of means: gen context_question_share / eval "
                                    "context_question_share",
    "mass_per_token": "mean over records of a span's mass / its token count, per task and "
                      "span (None for a span absent from the task's prompts)",
    "_ci": "95% percentile cluster bootstrap over passages "
           "(interp.analysis.stats.ClusterBootstrap); None with fewer than 2 passages",
}
"""What each key of a :func:`summarize` group means (copied into ``summary.json``)."""
LAST = "last"
"""Query span of the last position alone (the verdict position of the eval prompt)."""

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
        StageError: ``labels`` and ``rows`` disagree in length, or a label is not in
            ``spans``.
    """
    if rows.shape[-1] != len(labels):
        raise StageError("attention",
                         f"{len(labels)} labels for rows over {rows.shape[-1]} positions")
    spans = list(spans or span_names(labels))
    index = {s: i for i, s in enumerate(spans)}
    if unknown := set(labels) - set(index):
        raise StageError("attention", f"labels {sorted(unknown)} are not among the spans {spans}")
    onehot = torch.zeros(len(labels), len(spans), dtype=torch.float32)
    onehot[torch.arange(len(labels)), torch.tensor([index[lab] for lab in labels])] = 1.0
    return rows.float().cpu() @ onehot


def query_span_names(spans: Sequence[str]) -> list[str]:
    """Query spans of :func:`span_to_span`: the key spans, then :data:`LAST`."""
    return [*spans, LAST]


def span_to_span(pattern: Float[Tensor, "... q k"], labels: Sequence[str],
                 spans: Sequence[str] | None = None) -> Float[Tensor, "... qspan kspan"]:
    """Attention mass each query span puts on each key span (module docstring, step 6).

    Args:
        pattern: full attention patterns ``[..., pos, pos]`` (e.g. ``[n_heads, pos, pos]``
            of one layer), every row summing to 1.
        labels: span label of every position, ``len(labels) == pos``.
        spans: key-span order (default :func:`span_names` of ``labels``); the query spans
            are :func:`query_span_names` of it.

    Returns:
        ``[..., n_spans + 1, n_spans]`` float32: row ``i`` is the mean over the query
        positions of span ``i`` (the last position alone for :data:`LAST`, and never in
        another row) of their mass on each key span; it sums to 1, or is NaN when the prompt
        has no such query position.

    Raises:
        StageError: ``pattern`` is not square over ``len(labels)`` positions, or a label
            is not in ``spans``.
    """
    n = len(labels)
    if pattern.shape[-2:] != (n, n):
        raise StageError("attention",
                         f"span_to_span needs patterns [..., {n}, {n}] for {n} labels, "
                         f"got {tuple(pattern.shape)}")
    spans = list(spans or span_names(labels))
    keyed = span_mass(pattern, labels, spans)  # [..., q, n_spans]
    qlab = [*labels[:-1], LAST]
    qspans = query_span_names(spans)
    index = {s: i for i, s in enumerate(qspans)}
    avg = torch.zeros(len(qspans), n, dtype=torch.float32)
    avg[torch.tensor([index[lab] for lab in qlab]), torch.arange(n)] = 1.0
    count = avg.sum(1, keepdim=True)
    avg = torch.where(count > 0, avg / count.clamp(min=1), torch.full_like(avg, float("nan")))
    return avg @ keyed


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


def span_tokens(records: Sequence[Record] | Sequence[Mapping[str, Any]], task: str,
                spans: Sequence[str]) -> Float[np.ndarray, "rec span"]:
    """Token count of each span of each record's ``task`` prompt (from the stored spans).

    ``template`` counts every position of no field (the prompt's length minus the fields).

    Raises:
        StageError: a record without ``prompts.{task}``.
    """
    out = np.zeros((len(records), len(spans)))
    for i, r in enumerate(records):
        stored = (r.get("prompts") or {}).get(task)
        if not stored:
            raise StageError("attention", f"record {r.get('dataset')}/{r.get('id')} has no "
                                          f"prompts.{task}: not an ok asymmetry record")
        for j, s in enumerate(spans):
            if s in stored["token_spans"]:
                a, b = stored["token_spans"][s]
                out[i, j] = b - a
        if "template" in spans:
            t = list(spans).index("template")
            out[i, t] = stored["n_tokens"] - (out[i].sum() - out[i, t])
    return out


def _ci_dict(bs: ClusterBootstrap, x: np.ndarray) -> dict[str, Any]:
    """``{mean, ci}`` of ``x`` over the records where it is finite (a span present)."""
    ok = np.isfinite(x)
    if not ok.any():
        return {"mean": None, "ci": None}
    if ok.all():
        return bs.mean(x)
    # weights of the resamples restricted to the records that have the span
    w = bs.weights
    mean = float(x[ok].mean())
    if w is None:
        return {"mean": mean, "ci": None}
    num = w[:, ok] @ x[ok]
    den = w[:, ok].sum(1)
    with np.errstate(all="ignore"):
        return {"mean": mean, "ci": bs.interval(np.where(den > 0, num / den, np.nan))}


def _group(band: Mapping[str, np.ndarray], tokens: Mapping[str, np.ndarray],
           spans: Sequence[str], bs: ClusterBootstrap) -> dict[str, Any]:
    """Numbers of :data:`SUMMARY_DEFINITIONS` for one group.

    Args:
        band: ``{task: [n_rec, n_spans]}`` band mean masses.
        tokens: ``{task: [n_rec, n_spans]}`` span token counts.
        spans: span names of the last axis.
        bs: the group's bootstrap (one draw; every statistic on the same resamples).
    """
    n = band["gen"].shape[0]
    out: dict[str, Any] = {"n": int(n), "n_passages": bs.n_clusters,
                           "few_passages": bs.n_clusters < MIN_PASSAGES,
                           "note": passage_note(bs.n_clusters)}
    if n == 0:
        return out
    idx = {s: j for j, s in enumerate(spans)}
    c = idx["context"]
    for t in TASKS:
        out[t] = {s: bs.mean(band[t][:, j]) for j, s in enumerate(spans)}
    g, e = band["gen"][:, c].astype(np.float64), band["eval"][:, c].astype(np.float64)
    out["context_ratio"], samples = bs.ratio_of_means(g, e)
    out["context_ratio_ci"] = bs.interval(samples)
    log_ratio = np.log(np.maximum(g, 1e-12) / np.maximum(e, 1e-12))
    lr = bs.mean(log_ratio)
    out["context_log_ratio"], out["context_log_ratio_ci"] = lr["mean"], lr["ci"]
    out["context_ratio_geometric"] = float(np.exp(lr["mean"]))
    out["context_ratio_geometric_ci"] = None if lr["ci"] is None else np.exp(lr["ci"]).tolist()
    content = [idx[s] for s in CONTENT_SPANS if s in idx]
    share = {t: band[t][:, c] / np.maximum(band[t][:, content].sum(1), 1e-12) for t in TASKS}
    out["content_context_share"] = {t: bs.mean(share[t]) for t in TASKS}
    out["content_context_share_ratio"], samples = bs.ratio_of_means(share["gen"], share["eval"])
    out["content_context_share_ratio_ci"] = bs.interval(samples)
    # like with like: both prompts have a context and a question, only the judge a candidate
    cq = {t: band[t][:, c] / np.maximum(band[t][:, c] + band[t][:, idx["question"]], 1e-12)
          for t in TASKS} if "question" in idx else None
    if cq is not None:
        out["context_question_share"] = {t: bs.mean(cq[t]) for t in TASKS}
        out["context_question_share_ratio"], samples = bs.ratio_of_means(cq["gen"], cq["eval"])
        out["context_question_share_ratio_ci"] = bs.interval(samples)
    out["mass_per_token"] = {}
    for t in TASKS:
        with np.errstate(all="ignore"):
            per_tok = np.where(tokens[t] > 0, band[t] / np.where(tokens[t] > 0, tokens[t], 1),
                               np.nan)
        out["mass_per_token"][t] = {s: _ci_dict(bs, per_tok[:, j]) for j, s in enumerate(spans)}
    return out


def _layerwise(layer_mass: np.ndarray, spans: Sequence[str],
               bs: ClusterBootstrap) -> dict[str, dict[str, list[float]]]:
    """``[n, n_layers, n_spans]`` -> per span ``{mean, lo, hi}`` lists over layers."""
    out = {}
    for j, s in enumerate(spans):
        x = layer_mass[:, :, j].astype(np.float64)  # [n, n_layers]
        ci = bs.interval(bs.means(x))
        lo, hi = ci if ci is not None else (x.mean(0), x.mean(0))
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
    """Per-dataset band means, context ratios, splits and layerwise means (module step 4).

    Args:
        records: records aligned with the first axis of ``mass`` (``dataset``, ``context``,
            ``oracle_label``, ``verdict`` and the stored ``prompts.{gen,eval}`` spans).
        mass: ``{"gen": [n_rec, n_layers, n_heads, n_spans], "eval": ...}``.
        spans: span names of the last axis.
        band: layers averaged for the band means (paper: the last eight).
        n_boot: bootstrap resamples of passages (percentile 95% CIs).
        seed: seed of the one generator all resamples are drawn from, in a fixed order.

    Returns:
        ``{"band", "spans", "n_layers", "n_heads", "n_boot", "seed", "definitions",
        "per_dataset": {name: group}, "overall"}``; a group has the keys of
        :data:`SUMMARY_DEFINITIONS` (``gen``/``eval`` ``{span: {mean, ci}}``,
        ``context_ratio`` (+ci), ...), ``by_oracle_label`` (``correct``/``incorrect``),
        ``by_verdict`` (``Correct``/``Incorrect``/``none``), ``layerwise`` (``{task: {span:
        {mean, lo, hi}}}`` lists over layers, mean over heads) and ``head_context``
        (``{task: [n_layers][n_heads]}`` mean context mass).

    Raises:
        StageError: a record without its stored prompt spans.
    """
    rng = np.random.default_rng(seed)
    band = list(band)
    n_l, n_h = mass["gen"].shape[1:3]
    band_mass = {t: mass[t][:, band].mean(axis=(1, 2)) for t in TASKS}  # [n_rec, n_spans]
    layer_mass = {t: mass[t].mean(axis=2) for t in TASKS}  # [n_rec, n_layers, n_spans]
    tokens = {t: span_tokens(records, t, spans) for t in TASKS}
    clusters = np.array(passage_groups(records), dtype=object)
    c = list(spans).index("context")
    ol = np.array([bool(r.get("oracle_label")) for r in records])
    ver = np.array([_verdict_name(r.get("verdict")) for r in records])

    def split(sel: np.ndarray) -> tuple[dict[str, Any], ClusterBootstrap]:
        bs = ClusterBootstrap(clusters[sel].tolist(), n_boot, rng)
        return _group({t: band_mass[t][sel] for t in TASKS},
                      {t: tokens[t][sel] for t in TASKS}, spans, bs), bs

    def group(sel: np.ndarray) -> dict[str, Any]:
        out, bs = split(sel)
        if not sel.any():
            return out
        out["by_oracle_label"] = {name: split(sel & m)[0]
                                  for name, m in (("correct", ol), ("incorrect", ~ol))}
        out["by_verdict"] = {v: split(sel & (ver == v))[0] for v in sorted(set(ver[sel]))}
        out["layerwise"] = {t: _layerwise(layer_mass[t][sel], spans, bs) for t in TASKS}
        out["head_context"] = {t: mass[t][sel][:, :, :, c].mean(0).tolist() for t in TASKS}
        return out

    ds = np.array([r["dataset"] for r in records])
    per = {d: group(ds == d) for d in dataset_order(ds.tolist())}
    return {"band": band, "spans": list(spans), "n_layers": int(n_l), "n_heads": int(n_h),
            "n_boot": n_boot, "seed": seed, "definitions": SUMMARY_DEFINITIONS,
            "per_dataset": per, "overall": group(np.ones(len(records), dtype=bool))}


def summarize_span_to_span(records: Sequence[Record] | Sequence[Mapping[str, Any]],
                           s2s: Mapping[str, np.ndarray], layers: Sequence[int],
                           band: Sequence[int], spans: Sequence[str]) -> dict[str, Any]:
    """Band means of span-to-span attention, gen and eval, per dataset (module docstring).

    Args:
        records: records aligned with the first axis of ``s2s``.
        s2s: ``{"gen": [n_rec, n_layers, n_heads, n_spans + 1, n_spans], "eval": ...}``
            (:func:`span_to_span` of every recorded layer).
        layers: the model layers of the second axis of ``s2s``.
        band: layers to average (those not recorded are left out; none left: all recorded).
        spans: key spans (query spans: :func:`query_span_names`).

    Returns:
        ``{"band", "query_spans", "key_spans", "per_dataset": {name: group}, "overall"}``; a
        group has ``n`` (records), ``n_passages`` (distinct contexts) and per task ``mean``
        ``[n_query_spans][n_key_spans]`` (None for a query span no record has, and for the
        column of a key span no record has: ``candidate`` in gen is n/a, not a measured 0)
        and ``n_rows`` (records with each query span).
    """
    use = [i for i, x in enumerate(layers) if x in set(band)] or list(range(len(layers)))
    # NaN rows (a query span the prompt lacks) are NaN in every layer and head alike
    per_rec = {t: np.asarray(s2s[t], dtype=np.float64).reshape(
        len(records), len(layers), -1, len(spans) + 1, len(spans))[:, use].mean(axis=(1, 2))
        for t in TASKS}
    ds = np.array([r["dataset"] for r in records])
    ctx = np.array([str(r.get("context", "")) for r in records])

    def group(sel: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {"n": int(sel.sum()), "n_passages": len(set(ctx[sel]))}
        for t in TASKS:
            m = per_rec[t][sel]  # [n, nq, nk]
            has = ~np.isnan(m).any(axis=2)
            with np.errstate(invalid="ignore"):
                mean = np.nansum(m, axis=0) / has.sum(0)[:, None]
            # a key span no prompt of the group has (its query row absent everywhere and no
            # mass on it): n/a, not a measured 0
            gone = [not has[:, i].any() and not np.nansum(m[:, :, i]) for i in range(len(spans))]
            out[t] = {"mean": [[None if not has[:, i].any() or gone[j] else float(v)
                                for j, v in enumerate(row)] for i, row in enumerate(mean)],
                      "n_rows": has.sum(0).astype(int).tolist()}
        return out

    return {"band": [int(layers[i]) for i in use], "query_spans": query_span_names(spans),
            "key_spans": list(spans),
            "per_dataset": {d: group(ds == d) for d in dataset_order(ds.tolist())},
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
        StageError: an unknown dataset (names the known ones).
    """
    if dataset is None:
        grp = summary["overall"]
    elif dataset not in summary["per_dataset"]:
        raise StageError("attention", f"no dataset {dataset!r} in the summary; have "
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
    """Plain-text table: band span masses gen/eval and the context ratios per dataset.

    ``ratio`` is the ratio of means, ``geo`` the geometric mean of per-record ratios, ``share
    g/e`` the gen/eval ratio of the content-renormalised context shares; ``*`` marks a group
    on fewer than 10 passages (explained below the table).
    """
    band = summary["band"]
    lines = [f"band layers {band[0]}-{band[-1]} ({len(band)} layers, all heads); "
             f"backend {','.join(summary.get('backends', []))}",
             f"{'dataset':<12}{'n':>4}{'pass':>6}  {'ctx gen':>8} {'ctx eval':>9} {'ratio':>6} "
             f"{'geo':>5} {'share g/e':>9}  {'q gen':>6} {'q eval':>7}  {'cand eval':>9}  "
             f"{'tmpl gen':>8} {'tmpl eval':>9}"]
    groups = in_dataset_order(summary["per_dataset"]) + [("overall", summary["overall"])]

    def f(g: Mapping[str, Any], t: str, s: str) -> str:
        v = g.get(t, {}).get(s, {}).get("mean")
        return "-" if v is None else f"{v:.3f}"

    def r(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    notes = []
    for name, g in groups:
        star = "*" if g.get("few_passages") else ""
        if star:
            notes.append((name, g["note"]))
        lines.append(f"{name:<12}{g['n']:>4}{str(g.get('n_passages', '-')) + star:>6}  "
                     f"{f(g, 'gen', 'context'):>8} {f(g, 'eval', 'context'):>9} "
                     f"{r(g.get('context_ratio')):>6} {r(g.get('context_ratio_geometric')):>5} "
                     f"{r(g.get('content_context_share_ratio')):>9}  "
                     f"{f(g, 'gen', 'question'):>6} {f(g, 'eval', 'question'):>7}  "
                     f"{f(g, 'eval', 'candidate'):>9}  {f(g, 'gen', 'template'):>8} "
                     f"{f(g, 'eval', 'template'):>9}")
    return "\n".join(lines + ["* " + n for n in merge_notes(notes)])  # one line per fact


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
