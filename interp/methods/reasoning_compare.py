"""The one-word judge and the reasoning judge side by side, on the same records and answers.

Algorithm of :func:`side_by_side` (the reasoning judge is :mod:`interp.judging.reasoning`; its
records
come from a judge-only rerun, :func:`interp.methods.asymmetry.judge_records`, so both judges saw the
same candidate answers and share y*):

1. Pair the records by (dataset, id); keep those ``ok`` for both judges with a verdict-position
   recording for both.
2. Per record and judge: right (generated verdict == y*; no verdict counts as wrong, as in
   :func:`interp.methods.asymmetry.group_metrics`), right under the forced choice (``p_correct >
   0.5``), accepted (verdict Correct), accepted by the forced choice, no verdict,
   ``verdict_coverage``, and the band mean (band layers, all heads) of the verdict
   position's span mass on the context, question and candidate.
3. One passage-cluster bootstrap per group (:class:`interp.analysis.stats.ClusterBootstrap`,
cluster =
   dataset + context hash): every statistic of both judges is computed on the SAME resamples,
   so the difference reasoning - word of each statistic (``delta``) has a paired percentile
   CI. Rates are ratios of sums (acceptance among y* Correct = accepted and correct / correct).
4. The reasoning judge alone: replies that reached a verdict, replies that hit the token budget,
   mean reasoning length, replies whose own verdict word sits at the verdict position, and the
   band mean span mass while reasoning (over the positions that emit reasoning tokens) beside
   the same at its verdict position.

Keys of a group: :data:`SIDE_BY_SIDE_DEFINITIONS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from interp.analysis.stats import (
    MIN_PASSAGES,
    ClusterBootstrap,
    cluster_bootstrap_mean,
    passage_groups,
    passage_note,
)
from interp.core.names import dataset_order
from interp.judging.reasoning import REASONING_SPANS
from interp.store.records import qa_key as record_key

__all__ = ["COMPARED", "SIDE_BY_SIDE_DEFINITIONS", "format_side_by_side", "side_by_side"]

COMPARED = ("EA", "EA_forced", "acceptance_rate", "acceptance_rate_correct",
            "acceptance_rate_incorrect", "acceptance_rate_correct_forced",
            "acceptance_rate_incorrect_forced", "discrimination", "discrimination_forced",
            "no_verdict_share", "mean_verdict_coverage",
            "verdict_context_mass", "verdict_question_mass", "verdict_candidate_mass")
"""Statistics computed for both judges, with the paired difference reasoning - word."""

SIDE_BY_SIDE_DEFINITIONS = {
    "n": "records ok for both judges with both recordings; n_passages: distinct passages",
    "GA": "mean of y* (the same candidate answers for both judges)",
    "EA / EA_forced": "generated verdict == y* (no verdict = wrong) / (p_correct > 0.5) == y*",
    "acceptance_rate*": "accepted / all, among y* Correct, among y* Incorrect (ratio of sums); "
                        "_forced: p_correct > 0.5 instead of the generated verdict",
    "discrimination": "acceptance among y* Correct - acceptance among y* Incorrect (Youden's "
                      "J: 0 for a judge that cannot tell them apart, however often it "
                      "rejects; EA can rise by rejecting when most answers are wrong); "
                      "_forced: of the forced choice",
    "no_verdict_share": "share of replies with no verdict (reasoning: no verdict line and no "
                        "inline verdict ending the reply)",
    "mean_verdict_coverage": "mean P(ending Correct) + P(ending Incorrect) (one-word: the two "
                             "replies; reasoning: the two verdict lines after its reasoning)",
    "verdict_*_mass": "band mean (band layers, all heads) of the verdict position's attention "
                      "mass on the span; the reasoning judge's verdict position lies after "
                      "its reasoning",
    "delta": "reasoning - word of each statistic, paired: the same passage resamples",
    "reasoning_mass": "reasoning judge: band mean span mass averaged over the positions that "
                      "emit its reasoning tokens; verdict_mass: the same at its verdict position",
    "_ci": "95% percentile cluster bootstrap over passages; None with fewer than 2 passages",
}
"""What each key of a :func:`side_by_side` group means (copied into ``side_by_side.json``)."""


def _per_record(records: Sequence[Mapping[str, Any]], band_mass: np.ndarray,
                spans: Sequence[str]) -> dict[str, np.ndarray]:
    """Step 2: ``{name: [n]}`` numerators of one judge's statistics."""
    y = np.array([bool(r["oracle_label"]) for r in records])
    v = [r.get("verdict") for r in records]
    acc = np.array([x is True for x in v])
    valid = np.array([x is not None for x in v])
    forced = np.array([float(r["p_correct"]) > 0.5 for r in records])
    idx = {s: j for j, s in enumerate(spans)}
    out = {"right": valid & (acc == y), "right_forced": forced == y, "acc": acc,
           "forced": forced, "none": ~valid,
           "coverage": np.array([float(r["verdict_coverage"]) for r in records])}
    for s in ("context", "question", "candidate"):
        out[f"mass_{s}"] = band_mass[:, idx[s]] if s in idx else np.zeros(len(records))
    return out


def _stats(bs: ClusterBootstrap, x: Mapping[str, np.ndarray], y: np.ndarray
           ) -> dict[str, tuple[float | None, np.ndarray | None]]:
    """Step 3: ``{statistic: (value, resampled values)}`` of :data:`COMPARED` for one judge."""
    one = np.ones_like(y, dtype=float)
    pairs = {"EA": (x["right"], one), "EA_forced": (x["right_forced"], one),
             "acceptance_rate": (x["acc"], one),
             "acceptance_rate_correct": (x["acc"] & y, y),
             "acceptance_rate_incorrect": (x["acc"] & ~y, ~y),
             "acceptance_rate_correct_forced": (x["forced"] & y, y),
             "acceptance_rate_incorrect_forced": (x["forced"] & ~y, ~y),
             "no_verdict_share": (x["none"], one), "mean_verdict_coverage": (x["coverage"], one),
             "verdict_context_mass": (x["mass_context"], one),
             "verdict_question_mass": (x["mass_question"], one),
             "verdict_candidate_mass": (x["mass_candidate"], one)}
    out = {k: bs.ratio_of_means(a, b) for k, (a, b) in pairs.items()}
    for name, suffix in (("discrimination", ""), ("discrimination_forced", "_forced")):
        (vc, sc), (vi, si) = (out[f"acceptance_rate_{y_}{suffix}"]
                              for y_ in ("correct", "incorrect"))
        out[name] = (None if vc is None or vi is None else vc - vi,
                     None if sc is None or si is None else sc - si)
    return out


def _finite_mean(x: np.ndarray, records: Sequence[Mapping[str, Any]], seed: int,
                 n_boot: int) -> dict[str, Any]:
    """``{mean, ci}`` over the records where ``x`` is finite (a reply with reasoning tokens)."""
    r = cluster_bootstrap_mean(x, passage_groups(records), np.random.default_rng(seed), n_boot)
    return {"mean": r["mean"], "ci": r["ci"], "n": r["n"]}


def _group(word: Sequence[Mapping[str, Any]], reason: Sequence[Mapping[str, Any]],
           masses: Mapping[str, np.ndarray], spans_word: Sequence[str], seed: int,
           n_boot: int) -> dict[str, Any]:
    """Steps 2-4 for one group of paired records."""
    n = len(word)
    bs = ClusterBootstrap(passage_groups(word), n_boot, np.random.default_rng(seed))
    out: dict[str, Any] = {"n": n, "n_passages": bs.n_clusters,
                           "few_passages": bs.n_clusters < MIN_PASSAGES,
                           "note": passage_note(bs.n_clusters)}
    if not n:
        return out
    y = np.array([bool(r["oracle_label"]) for r in word])
    out["GA"] = float(y.mean())
    sw = _stats(bs, _per_record(word, masses["word"], spans_word), y)
    sr = _stats(bs, _per_record(reason, masses["verdict"], REASONING_SPANS), y)
    for k in COMPARED:
        (vw, bw), (vr, br) = sw[k], sr[k]
        out[k] = {"word": vw, "word_ci": bs.interval(bw), "reasoning": vr,
                  "reasoning_ci": bs.interval(br),
                  "delta": None if vw is None or vr is None else vr - vw,
                  "delta_ci": None if bw is None else bs.interval(br - bw)}
    stops = [r.get("reasoning_stop") for r in reason]
    out["reasoning_judge"] = {
        "n_reached_verdict": int(sum(r.get("verdict") is not None for r in reason)),
        "n_inline_verdict": int(sum(r.get("verdict_source") == "inline_verdict"
                                    for r in reason)),
        "n_hit_budget": int(sum(s == "max_new_tokens" for s in stops)),
        "share_hit_budget": float(np.mean([s == "max_new_tokens" for s in stops])),
        "n_verdict_position_own": int(sum(bool(r.get("verdict_position_own")) for r in reason)),
        "mean_reasoning_tokens": float(np.mean([r.get("reasoning_tokens", 0) for r in reason])),
        "reasoning_mass": {s: _finite_mean(masses["reasoning"][:, j], word, seed, n_boot)
                           for j, s in enumerate(REASONING_SPANS)},
        "verdict_mass": {s: bs.mean(masses["verdict"][:, j])
                         for j, s in enumerate(REASONING_SPANS)}}
    return out


def side_by_side(word: Sequence[Mapping[str, Any]], reason: Sequence[Mapping[str, Any]],
                 masses: Mapping[str, Mapping[tuple[str, str], np.ndarray]],
                 spans_word: Sequence[str], *, n_boot: int = 1000, seed: int = 0
                 ) -> dict[str, Any]:
    """The paired comparison of the two judges (module docstring), per dataset and overall.

    Args:
        word: the one-word judge's ok records.
        reason: the reasoning judge's records on the same candidates (judge-only rerun).
        masses: band mean span masses per record key: ``{"word": {key: [n_spans_word]},
            "verdict": {key: [len(REASONING_SPANS)]}, "reasoning": {key: [...]}}`` (the
            reasoning judge's verdict position and its reasoning tokens); a record without a
            reasoning-token mass (no reasoning token) gets NaN there.
        spans_word: span order of the one-word masses.
        n_boot: bootstrap resamples of passages.
        seed: bootstrap seed (the same for every group).

    Returns:
        ``{"definitions", "n_boot", "seed", "per_dataset": {name: group}, "overall": group,
        "unpaired": count}``; group keys: :data:`SIDE_BY_SIDE_DEFINITIONS`.
    """
    by_key = {record_key(r): r for r in reason if r.get("status") == "ok"}
    pairs = [(w, by_key[record_key(w)]) for w in word
             if record_key(w) in by_key and record_key(w) in masses["word"]
             and record_key(w) in masses["verdict"]]
    nan = np.full(len(REASONING_SPANS), np.nan)

    def arrays(sel: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]
               ) -> dict[str, np.ndarray]:
        keys = [record_key(w) for w, _ in sel]
        return {"word": np.array([masses["word"][k] for k in keys]).reshape(len(keys), -1),
                "verdict": np.array([masses["verdict"][k] for k in keys]).reshape(len(keys), -1),
                "reasoning": np.array([masses["reasoning"].get(k, nan) for k in keys]
                                      ).reshape(len(keys), -1)}

    def group(sel: list) -> dict[str, Any]:
        return _group([w for w, _ in sel], [r for _, r in sel], arrays(sel), spans_word,
                      seed, n_boot)

    datasets = dataset_order(w["dataset"] for w, _ in pairs)
    return {"definitions": SIDE_BY_SIDE_DEFINITIONS, "n_boot": n_boot, "seed": seed,
            "per_dataset": {d: group([p for p in pairs if p[0]["dataset"] == d])
                            for d in datasets},
            "overall": group(pairs), "unpaired": len(word) - len(pairs)}


_LABELS = {"EA": "EA", "EA_forced": "EA_forced", "acceptance_rate": "acceptance (all)",
           "acceptance_rate_correct": "acceptance, y* Correct",
           "acceptance_rate_incorrect": "acceptance, y* Incorrect",
           "acceptance_rate_correct_forced": "forced acceptance, y* Correct",
           "acceptance_rate_incorrect_forced": "forced acceptance, y* Incorrect",
           "discrimination": "acceptance gap, right - wrong (Youden's J)",
           "discrimination_forced": "forced acceptance gap, right - wrong",
           "no_verdict_share": "no verdict (share)",
           "mean_verdict_coverage": "verdict coverage (mean)",
           "verdict_context_mass": "verdict-position context mass",
           "verdict_question_mass": "verdict-position question mass",
           "verdict_candidate_mass": "verdict-position candidate mass"}


def _num(x: float | None, ci: Sequence[float] | None, sign: bool = False) -> str:
    if x is None:
        return "-"
    s = f"{x:+.3f}" if sign else f"{x:.3f}"
    return s if not ci else s + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if sign else
                                 f" [{ci[0]:.3f}, {ci[1]:.3f}]")


def format_side_by_side(result: Mapping[str, Any], model: str = "") -> str:
    """A markdown table of :func:`side_by_side`'s overall group (and the reasoning judge's facts).

    Rows: :data:`COMPARED`; columns: one-word judge, reasoning judge, reasoning - word, each
    with its 95% passage-cluster CI; below, the reasoning judge's replies (reached a verdict,
    hit the budget) and its band span mass while reasoning vs at its verdict.
    """
    g = result["overall"]
    if not g.get("n"):
        return f"{model}: no paired records"
    rj = g["reasoning_judge"]
    lines = [f"**{model}**: {g['n']} records on {g['n_passages']} passages"
             + (" (fewer than 10 passages: few independent units)" if g["few_passages"] else "")
             + f", GA {g['GA']:.3f}; reasoning replies that reached a verdict: "
             f"{rj['n_reached_verdict']}/{g['n']} ({rj.get('n_inline_verdict', 0)} of them "
             f"inline, ending the last line); hit the budget: {rj['n_hit_budget']}/{g['n']}"
             f"; mean reasoning length {rj['mean_reasoning_tokens']:.0f} tokens; own verdict "
             f"word at the verdict position: {rj['n_verdict_position_own']}/{g['n']}", "",
             "| statistic | one-word judge | reasoning judge | reasoning - word |",
             "|---|---|---|---|"]
    for k in COMPARED:
        s = g[k]
        lines.append(f"| {_LABELS[k]} | {_num(s['word'], s['word_ci'])} | "
                     f"{_num(s['reasoning'], s['reasoning_ci'])} | "
                     f"{_num(s['delta'], s['delta_ci'], sign=True)} |")
    lines += ["", "| reasoning judge, span | mass while reasoning | mass at its verdict |",
              "|---|---|---|"]
    for s in REASONING_SPANS:
        a, b = rj["reasoning_mass"][s], rj["verdict_mass"][s]
        lines.append(f"| {s} | {_num(a['mean'], a['ci'])} | {_num(b['mean'], b['ci'])} |")
    return "\n".join(lines)
