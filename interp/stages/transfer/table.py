"""The transfer table (:mod:`interp.stages.transfer`, step 6).

Study 1 per model and dataset (:func:`build_table`), and each adapter minus the base model
paired per record with passage-cluster CIs (:func:`paired_vs_base`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from interp.analysis.stats import cluster_bootstrap_mean, passage_groups
from interp.methods.asymmetry import group_metrics

__all__ = ["VS_BASE", "build_table", "format_table", "paired_vs_base"]


def build_table(evals: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]], *,
                n_boot: int, seed: int) -> dict[str, Any]:
    """Step 6: ``{"self": {model: {dataset: metrics}}, "judge_base_answers": {...}}``.

    Args:
        evals: ``{kind: {model: records}}`` with kind ``"self"`` (self-evaluation) or
            ``"judge_base_answers"``; records of several datasets are grouped by ``dataset``.
        n_boot: bootstrap resamples of :func:`interp.methods.asymmetry.group_metrics`.
        seed: bootstrap seed.
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
    if "base" in evals.get("self", {}):
        out["vs_base"] = paired_vs_base(evals, n_boot=n_boot, seed=seed)
    return out


def _accepts(r: Mapping[str, Any]) -> float:
    return float(r["verdict"] is True)


VS_BASE: dict[str, tuple[str, Callable[[Mapping[str, Any]], float],
                         Callable[[Mapping[str, Any]], bool] | None]] = {
    "GA": ("self", lambda r: float(bool(r["oracle_label"])), None),
    "EA": ("self", lambda r: float(r["verdict"] is not None
                                   and r["verdict"] == bool(r["oracle_label"])), None),
    "accept_base_answers": ("judge_base_answers", _accepts, None),
    "accept_wrong_base_answers": ("judge_base_answers", _accepts,
                                  lambda r: not r["oracle_label"]),
    "accept_right_base_answers": ("judge_base_answers", _accepts,
                                  lambda r: bool(r["oracle_label"])),
    "logit_diff_base_answers": ("judge_base_answers", lambda r: float(r["logit_diff"]), None),
}
"""The paired differences adapter - base of :func:`paired_vs_base`: ``(records, per-record
value, which base records count)``. ``GA`` / ``EA`` on each model's own answers to the same
questions; the judge's acceptance (verdict ``Correct``, a missing verdict not accepting) of
the SAME base-model answers, all of them, the wrong ones (over-accepting: paper 3.3, LoRA-Gen
over-accepts) and the right ones, and its whole-reply ``logit_diff`` on them: a change of
judge, not of what it judges."""


def paired_vs_base(evals: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]], *,
                   n_boot: int, seed: int) -> dict[str, Any]:
    """Each adapter minus the base model, paired per record, with passage-cluster 95% CIs.

    Args:
        evals: ``{"self" | "judge_base_answers": {model: records}}`` (step 5), ``base``
            among the models.
        n_boot: passage-cluster bootstrap resamples
        (:func:`interp.analysis.stats.cluster_bootstrap_mean`).
        seed: bootstrap seed.

    Returns:
        ``{adapter: {dataset | "overall": {metric: {"mean", "ci", "n", "n_passages"}}}}`` for
        every metric of :data:`VS_BASE`; records ``ok`` in both runs are paired by
        ``(dataset, id)``.
    """
    import numpy as np

    def ok(recs: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
        return {(r["dataset"], r["id"]): r for r in recs if r.get("status") == "ok"}

    out: dict[str, Any] = {}
    for model in evals["self"]:
        if model == "base":
            continue
        per: dict[str, dict[str, Any]] = {}
        for metric, (kind, value, keep) in VS_BASE.items():
            base, ad = ok(evals.get(kind, {}).get("base", ())), ok(
                evals.get(kind, {}).get(model, ()))
            keys = [k for k in ad if k in base and (keep is None or keep(base[k]))]
            for d in sorted({k[0] for k in keys}) + (["overall"] if keys else []):
                ks = [k for k in keys if d in ("overall", k[0])]
                x = np.array([value(ad[k]) - value(base[k]) for k in ks])
                e = cluster_bootstrap_mean(x, passage_groups([base[k] for k in ks]),
                                           np.random.default_rng(seed), n_boot)
                per.setdefault(d, {})[metric] = {"mean": e["mean"], "ci": e["ci"],
                                                 "n": e["n"], "n_passages": e["n_clusters"]}
        out[model] = per
    return out


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
