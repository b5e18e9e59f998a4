"""The pairwise-judge stage (``interp pairwise``): two answers, both orders, and what carries order.

Methods: :mod:`interp.methods.pairwise` (pairs, letter scores, outcomes, the per-pair
measurements).

Algorithm of :func:`run`:

1. Validate the config and the band before any model work; select the run's ok records
   (prompts over ``max_tokens`` left out first) and build up to ``limit`` pairs per dataset
   (:func:`interp.methods.pairwise.build_judge_pairs`; hard negatives from
   ``DIR/patching/hard_negatives.jsonl`` and the records' own ``hard_negative`` fields:
   ``interp patch --pairs candidate-swap`` mines them). Every built and skipped pair is
   listed in ``DIR/pairwise/pairs.jsonl``.
2. Per pair, reuse ``DIR/pairwise/parts/{dataset}__{id}__{source}.json`` when fresh, else
   measure it (:func:`interp.methods.pairwise.measure_pair`: both orders' letter scores, the
   swapped-order patching of the verdict position by layer and by head, the attribution, the
   attention masses and the logit lens) and write the part atomically. With
   ``behaviour_only``, a fresh full part is kept and any other pair gets both orders' scores
   alone (:func:`interp.methods.pairwise.score_orders`, one forward per order); step 3 then
   stops after the outcomes, and step 4 draws nothing.
3. Summary (:func:`summarise`), per dataset and over all, each with a passage-cluster
   bootstrap 95% CI: accuracy (an inconsistent pair is a miss), position consistency, each
   order's accuracy, flips towards first and second, preference fairness, content and
   position terms (nats); the order-averaged judge's pair accuracy and AUC (position bias
   cancelled, :func:`interp.methods.pairwise.order_averaged`; behaviour only too); the
   band's attention on A and B in both orders; the patching shares per layer and head (ratio
   of sums); the position term by unit. Held out: passages
   are split in two by a stable hash (:func:`interp.methods.pairwise.split_passages`); the
   ``top_k`` heads by patching share, and the smallest set of units carrying half the
   position term, are chosen on the ``select`` passages and measured on the ``test`` ones.
4. Figures ``DIR/figures/pairwise_orders.png`` and ``DIR/figures/pairwise_heads.png``
   (:mod:`interp.plots.pairwise`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from interp.analysis.stats import (
    MIN_PASSAGES,
    ci_text,
    mean_stat,
    passage_groups,
    passage_note,
    ratio_stat,
)
from interp.core.contract import stage_of
from interp.core.errors import StageError
from interp.core.inputs import write_result
from interp.core.io import is_fresh, read_json, signature, write_json, write_jsonl
from interp.core.layers import parse_layers
from interp.core.progress import resumed, tqdm
from interp.judging.prompts import get_pairwise_template
from interp.methods.pairwise import (
    MIN_SWAP_NATS,
    ORDERS,
    build_judge_pairs,
    letter_replies,
    measure_pair,
    order_outcomes,
    render_orders,
    score_orders,
    split_passages,
)
from interp.models.loading import ModelHandle
from interp.stages.common import fitting, ok_records, stage_facts, stored_negatives
from interp.stages.configs.pairwise import PairwiseConfig
from interp.store.rundir import RunDir

__all__ = ["PairwiseConfig", "format_summary", "run", "summarise"]

SPEC = stage_of(__name__)
"""This stage's declared contract (:data:`interp.core.contract.SPECS`)."""

ONE_LETTER_SHARE = 0.95
"""The share of pairs answered with the same letter in both orders from which the summary,
its printout and its figure name a one-letter judge (a degenerate case: its consistency and
accuracy count the pairs it does not answer so, not how well it reads the answers)."""
OUTCOMES = ("accurate", "consistent", "right_first", "right_second", "flip_first",
            "flip_second", "content", "position")


def _negatives(run_dir: RunDir, records: Sequence[Mapping[str, Any]]
               ) -> dict[tuple[str, str], str]:
    """Step 1's hard negatives: the patching stage's store, then the records' own."""
    return stored_negatives(run_dir.path, records)


def _parts(run_dir: RunDir, handle: ModelHandle, cfg: PairwiseConfig, *, overwrite: bool,
           log: Callable[[str], None]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Steps 1-2: ``(parts, skipped, made now)``."""
    cfg.validate()
    band = parse_layers(cfg.band, handle.n_layers)
    _, records = ok_records(run_dir, handle, None, stage=SPEC.name, max_tokens=cfg.max_tokens)
    template = get_pairwise_template(cfg.template, cfg.templates_path)
    pairs, skipped = build_judge_pairs(records, passage_groups(records),
                                       _negatives(run_dir, records), sources=cfg.sources,
                                       limit=cfg.limit)

    replies = letter_replies(handle.tokenizer)
    pairs, long = fitting(
        handle, pairs, lambda p: max(len(o) for o in render_orders(handle.tokenizer, template, p)),
        stage=SPEC.name, what="pairwise prompt", new_tokens=max(map(len, replies.ids)),
        new="for the letter reply", log=log)
    skipped += [{"dataset": p.dataset, "id": p.record_id, "source": p.source,
                 "reason": "too_long", "detail": why} for p, why in long]
    if not pairs:   # refused before anything is written: a finished run's files stay

        why = {r["reason"] for r in skipped}
        hint = ("none of its records has a hard negative: `interp patch --pairs "
                "candidate-swap` mines them" if set(cfg.sources) == {"hard_negative"} else
                "its records have no wrong answer and no hard negative (interp patch --pairs "
                "candidate-swap mines them)")
        if long:
            hint = (f"no pair's prompt fits the model's {handle.max_positions} positions "
                    f"(first: {long[0][1]}): choose shorter records (--max-tokens)")
        raise StageError("pairwise", f"no pair builds from {run_dir.path}: {hint}; skipped "
                                     f"{len(skipped)} ({', '.join(sorted(why)) or 'no record'})")
    root = run_dir.sub(SPEC.folder)
    write_jsonl(root / "pairs.jsonl",
                [{"dataset": p.dataset, "id": p.record_id, "source": p.source,
                  "passage": p.passage, "right": p.right, "wrong": p.wrong, "built": True}
                 for p in pairs] + [{**s, "built": False} for s in skipped])
    log(f"[pairwise] {len(pairs)} pairs over {len({p.passage for p in pairs})} passages "
        f"({len(skipped)} skipped)")
    facts = stage_facts(run_dir, handle, SPEC.name, overwrite=overwrite)
    parts, made = [], 0
    with tqdm(total=len(pairs), desc="pairwise", unit="pair", disable=not cfg.progress) as bar:
        for pair in pairs:
            ids = [p.input_ids for p in render_orders(handle.tokenizer, template, pair)]
            base = {"model": handle.spec, "sha256": handle.info.get("sha256"), **facts,
                    "replies": replies.id_lists(), "ids": ids}
            sig = signature({**base, "band": band})
            f = SPEC.parts[0].path(run_dir.path, pair.dataset, pair.key)
            if cfg.behaviour_only and not is_fresh(f, sig):
                # a fresh full measurement holds the scores too: keep it; else the scores alone
                sig = signature({**base, "behaviour_only": True})
            if is_fresh(f, sig):
                part = read_json(f)["pairwise"]
                resumed(bar)
            elif cfg.behaviour_only:
                part = score_orders(handle, pair, template, replies)
                write_json(f, {"signature": sig, "pairwise": part})
                made += 1
                bar.update(1)
            else:
                part = measure_pair(handle, pair, template, replies, band,
                                    batch_size=cfg.batch_size)
                write_json(f, {"signature": sig, "pairwise": part})
                made += 1
                bar.update(1)
            parts.append({**part, "dataset": pair.dataset, "id": pair.record_id,
                          "source": pair.source, "passage": pair.passage})
    return parts, skipped, made


def _outcomes(parts: Sequence[Mapping[str, Any]], rng: np.random.Generator, n_boot: int
              ) -> dict[str, Any]:
    o = order_outcomes([p["s1"] for p in parts], [p["s2"] for p in parts])
    g = [p["passage"] for p in parts]
    out = {k: mean_stat(o[k], g, rng, n_boot) for k in OUTCOMES}
    out["fairness"] = mean_stat(o["flip_second"] - o["flip_first"], g, rng, n_boot)
    out.update(n=len(parts), n_passages=len(set(g)))
    return out


def _order_averaged(groups: Mapping[str, Sequence[Mapping[str, Any]]], cfg: PairwiseConfig
                    ) -> dict[str, Any]:
    """Per group: the order-averaged judge (:func:`interp.methods.pairwise.order_averaged`).

    Its own generator (``[seed, 1]``): the other keys' intervals stay as they were.
    """
    from interp.methods.pairwise import order_averaged

    rng = np.random.default_rng([cfg.seed, 1])
    return {k: order_averaged([p["s1"] for p in v], [p["s2"] for p in v],
                              [p["passage"] for p in v], rng, cfg.n_boot)
            for k, v in groups.items()}


def _unit_names(n_layers: int, n_heads: int, band: Sequence[int]) -> list[tuple[str, Any]]:
    return [(f"L{i}.H{j}", (i, j)) for i in band for j in range(n_heads)] + \
        [(f"L{i}.MLP", (i, None)) for i in band]


def _position_units(parts: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Per pair: each unit's position term (mean of its two orders' attributions), nats."""
    h = np.mean([[p["dla"][o]["heads"] for o in ORDERS] for p in parts], 1)   # [n, L, H]
    m = np.mean([[p["dla"][o]["mlp"] for o in ORDERS] for p in parts], 1)     # [n, L]
    tot = np.mean([[p["dla"][o]["total"] for o in ORDERS] for p in parts], 1)  # [n]
    return {"heads": h, "mlp": m, "total": tot}


def _held_out(parts: Sequence[Mapping[str, Any]], n_layers: int, n_heads: int,
              band: Sequence[int], k: int, rng: np.random.Generator, n_boot: int
              ) -> dict[str, Any]:
    """Step 3's held-out tests: heads chosen on ``select`` passages, measured on ``test``."""
    side = split_passages([p["passage"] for p in parts])
    sel = [p for p, s in zip(parts, side) if s == "select"]
    test = [p for p, s in zip(parts, side) if s == "test"]
    out: dict[str, Any] = {"n_select": len(sel), "n_test": len(test),
                           "n_passages_select": len({p["passage"] for p in sel}),
                           "n_passages_test": len({p["passage"] for p in test})}
    if not sel or not test:
        out["note"] = "too few passages to split into selection and test"
        return out

    def head_shares(ps: Sequence[Mapping[str, Any]]) -> np.ndarray:
        hp = np.array([p["patch"]["heads"] for p in ps])                    # [n, L, H]
        s1 = np.array([p["s1"] for p in ps])[:, None, None]
        gap = np.array([p["s2"] - p["s1"] for p in ps])[:, None, None]
        return (np.sign(gap) * (hp - s1)).sum(0) / max(float(np.abs(gap).sum()), 1e-12)

    share = head_shares(sel)                                                # [band, H]
    order = np.argsort(-share, axis=None)[:k]
    chosen = [(int(i // n_heads), int(i % n_heads)) for i in order]         # (band row, head)
    hl = list(parts[0]["patch"]["head_layers"])
    g = [p["passage"] for p in test]
    gap = np.array([p["s2"] - p["s1"] for p in test])
    out["order_heads"] = [
        {"unit": f"L{hl[i]}.H{j}", "select_share": float(share[i, j]),
         "test": ratio_stat(np.sign(gap) * (np.array([p["patch"]["heads"][i][j] for p in test])
                                        - np.array([p["s1"] for p in test])),
                        np.abs(gap), g, rng, n_boot)} for i, j in chosen]
    # position term: the fewest band units (by select mean) carrying half of it
    ps, pt = _position_units(sel), _position_units(test)
    sign = 1.0 if ps["total"].mean() >= 0 else -1.0
    units = _unit_names(n_layers, n_heads, band)

    def val(d: Mapping[str, np.ndarray], u: tuple[int, Any]) -> np.ndarray:
        return d["heads"][:, u[0], u[1]] if u[1] is not None else d["mlp"][:, u[0]]

    ranked = sorted(units, key=lambda u: -sign * float(val(ps, u[1]).mean()))
    total = sign * float(ps["total"].mean())
    picked, acc = [], 0.0
    for name, u in ranked:
        if total <= 0 or acc >= total / 2:
            break
        c = sign * float(val(ps, u).mean())
        if c <= 0:
            break
        picked.append((name, u))
        acc += c
    out["position_units"] = {
        "units": [n for n, _ in picked], "select_share": acc / total if total > 0 else None,
        "select_total": float(ps["total"].mean()),
        "test": ratio_stat(sum((val(pt, u) for _, u in picked), np.zeros(len(test))),
                       pt["total"], g, rng, n_boot) if picked else None,
        "reaches_half": bool(total > 0 and acc >= total / 2)}
    return out


def summarise(parts: Sequence[Mapping[str, Any]], skipped: Sequence[Mapping[str, Any]],
              cfg: PairwiseConfig, handle_info: Mapping[str, Any]) -> dict[str, Any]:
    """Step 3 of the module algorithm from the per-pair parts.

    Returns:
        ``{"model", "n_layers", "n_heads", "band", "n_pairs", "n_passages", "few_passages",
        "note", "skipped", "metric", "outcomes": {"all" | dataset | source: {outcome: {"mean",
        "ci", "n", "n_passages"}, "fairness", "n", "n_passages"}}, "one_letter": None or
        {"letter", "share"} (:data:`ONE_LETTER_SHARE`), "order_averaged": {"all" | dataset |
        source: the judge's preference averaged over both orders, its pair accuracy and AUC
        (:func:`interp.methods.pairwise.order_averaged`; a one-letter judge scores 0.5)},
        "mass": {order: {span:
        stat}}, "mass_terms": {"first_minus_second", "right_minus_wrong"}, "patching":
        {"resid": [per layer {"share", "ci", ...}], "head_layers": the band, "heads":
        [len(band)][n_heads] shares, "gap"}, "position": {"total", "heads_mean", "mlp_mean",
        "top_units"}, "lens": {"s1",
        "s2", "content", "position": [per layer stat]}, "held_out", "checks"}``. Accuracy
        and consistency near 0 or 1 with a position term near its extreme mean a judge that
        answers one letter whatever it reads (a degenerate case the report names).
    """
    rng = np.random.default_rng(cfg.seed)
    n_layers, n_heads = int(handle_info["n_layers"]), int(handle_info["n_heads"])
    band = parse_layers(cfg.band, n_layers)
    g = [p["passage"] for p in parts]
    reasons: dict[str, int] = {}
    for s in skipped:
        reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
    s: dict[str, Any] = {
        "model": handle_info.get("spec"), "n_layers": n_layers, "n_heads": n_heads,
        "band": band, "n_pairs": len(parts), "n_passages": len(set(g)), "skipped": reasons,
        "metric": "letter score s = log P(A) - log P(B) (whole replies, nats); s1 with the "
                  "right answer as A, s2 with it as B; content (s1 - s2)/2, position "
                  "(s1 + s2)/2 (> 0: prefers the first slot)"}
    s["few_passages"] = s["n_passages"] < MIN_PASSAGES
    s["note"] = passage_note(s["n_passages"])
    if not parts:
        return s
    groups: dict[str, list[Mapping[str, Any]]] = {"all": list(parts)}
    for p in parts:
        groups.setdefault(p["dataset"], []).append(p)
        groups.setdefault(f"source:{p['source']}", []).append(p)
    s["outcomes"] = {k: _outcomes(v, rng, cfg.n_boot) for k, v in groups.items()}
    o_all = s["outcomes"]["all"]
    side = max(("A", o_all["flip_first"]["mean"]), ("B", o_all["flip_second"]["mean"]),
               key=lambda x: x[1])
    s["one_letter"] = ({"letter": side[0], "share": side[1]}
                       if side[1] >= ONE_LETTER_SHARE else None)
    s["order_averaged"] = _order_averaged(groups, cfg)
    if cfg.behaviour_only:   # the scores alone: nothing inside the model was read
        s["behaviour_only"] = True
        return s
    mass = {o: {k: np.array([p["mass"][o][k] for p in parts]) for k in
                ("answer_a", "answer_b", "context")} for o in ORDERS}
    s["mass"] = {o: {k: mean_stat(v, g, rng, cfg.n_boot) for k, v in d.items()}
                 for o, d in mass.items()}
    first = (mass["right_first"]["answer_a"] + mass["right_second"]["answer_a"]) / 2
    second = (mass["right_first"]["answer_b"] + mass["right_second"]["answer_b"]) / 2
    right = (mass["right_first"]["answer_a"] + mass["right_second"]["answer_b"]) / 2
    wrong = (mass["right_first"]["answer_b"] + mass["right_second"]["answer_a"]) / 2
    s["mass_terms"] = {"first_minus_second": mean_stat(first - second, g, rng, cfg.n_boot),
                       "right_minus_wrong": mean_stat(right - wrong, g, rng, cfg.n_boot)}
    s1 = np.array([p["s1"] for p in parts])
    s2 = np.array([p["s2"] for p in parts])
    gap = s2 - s1
    resid = np.array([p["patch"]["resid"] for p in parts])                   # [n, L]
    heads = np.array([p["patch"]["heads"] for p in parts])                   # [n, band, H]
    den = np.abs(gap)
    s["patching"] = {
        "what": "swapped order (right answer as B) patched into the original (right as A) at "
                "the verdict position; share = sum sign(gap)(s_patched - s1) / sum |s2 - s1|; "
                "heads of the band's layers only",
        "gap": mean_stat(gap, g, rng, cfg.n_boot),
        "resid": [ratio_stat(np.sign(gap) * (resid[:, i] - s1), den, g, rng, cfg.n_boot)
                  for i in range(n_layers)],
        "head_layers": list(parts[0]["patch"]["head_layers"]),
        "heads": ((np.sign(gap)[:, None, None] * (heads - s1[:, None, None])).sum(0)
                  / max(float(den.sum()), 1e-12)).tolist(),
        "last_layer_is_control": "patching the last block's residual stream gives s2 "
                                 "exactly: share 1 by construction"}
    pu = _position_units(parts)
    units = _unit_names(n_layers, n_heads, band)
    vals = [(name, pu["heads"][:, i, j] if j is not None else pu["mlp"][:, i])
            for name, (i, j) in units]
    ranked = sorted(vals, key=lambda u: -abs(float(u[1].mean())))
    s["position"] = {
        "target": "position term of the letters' first-token logit difference, mean of both "
                  "orders' direct logit attributions (final norm's scale frozen per prompt)",
        "total": mean_stat(pu["total"], g, rng, cfg.n_boot),
        "heads_mean": pu["heads"].mean(0).tolist(), "mlp_mean": pu["mlp"].mean(0).tolist(),
        "top_units": [{"unit": u, **mean_stat(x, g, rng, cfg.n_boot)} for u, x in ranked[:12]]}
    lens = {o: np.array([p["lens"][o] for p in parts]) for o in ORDERS}
    s["lens"] = {
        "s1": [mean_stat(lens["right_first"][:, i], g, rng, cfg.n_boot)
               for i in range(n_layers + 1)],
        "s2": [mean_stat(lens["right_second"][:, i], g, rng, cfg.n_boot)
               for i in range(n_layers + 1)],
        "content": [mean_stat((lens["right_first"][:, i] - lens["right_second"][:, i]) / 2, g, rng,
                          cfg.n_boot) for i in range(n_layers + 1)],
        "position": [mean_stat((lens["right_first"][:, i] + lens["right_second"][:, i]) / 2, g, rng,
                           cfg.n_boot) for i in range(n_layers + 1)]}
    s["held_out"] = _held_out(parts, n_layers, n_heads, band, cfg.top_k, rng, cfg.n_boot)
    o = order_outcomes(s1, s2)
    s["checks"] = {
        "max_abs_last_resid_patch_minus_s2": float(np.abs(resid[:, -1] - s2).max()),
        "max_abs_attribution_sum_minus_total": float(max(
            abs(p["dla"][k]["sum"] - p["dla"][k]["total"]) for p in parts for k in ORDERS)),
        "max_abs_lens_last_minus_score": float(max(
            np.abs(lens["right_first"][:, -1] - s1).max(),
            np.abs(lens["right_second"][:, -1] - s2).max())),
        "outcome_terms_sum": float(np.abs((o["content"] + o["position"]) - s1).max())}
    return s


def run(run_dir: RunDir | str | Path, handle: ModelHandle, cfg: PairwiseConfig, *,
        overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The pairwise judge on a run's records, both orders (module docstring).

    ``overwrite``: redo parts stored under other result-relevant runtime facts instead of
    refusing (:func:`interp.stages.common.stage_facts`).

    Returns:
        The summary (also ``DIR/pairwise/summary.json``).

    Raises:
        StageError: a bad setting, or no pair builds.
        PromptError: an unknown pairwise template.
        RunDirError: the run has no manifest or records; another model than the run's; parts
            stored under other runtime facts and not ``overwrite``.
    """
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    parts, skipped, _ = _parts(run_dir, handle, cfg, overwrite=overwrite, log=log)
    s = summarise(parts, skipped, cfg, {**handle.info, "n_layers": handle.n_layers,
                                        "n_heads": handle.n_heads})
    write_result(run_dir.sub(SPEC.folder) / "summary.json", s, n=len(parts), log=log)
    if cfg.figures and parts and not cfg.behaviour_only:
        try:
            from interp.plots.pairwise import plot_pairwise

            plot_pairwise(s, run_dir.sub("figures"))
        except Exception as err:  # noqa: BLE001 - figures never block the tables
            log(f"[pairwise] figure failed: {err}")
    return s


def format_summary(summary: Mapping[str, Any]) -> str:
    """Accuracy, position consistency, the two terms, the held-out heads and the checks."""
    def f(x: Mapping[str, Any] | None, key: str = "mean", p: str = ".2f") -> str:
        if not x or x.get(key) is None:
            return "-"
        return f"{x[key]:{p}}" + (f" {ci_text(x.get('ci'), p)}" if x.get("ci") else "")

    star = "*" if summary.get("few_passages") else ""
    lines = [f"pairwise judge: {summary.get('n_pairs')} pairs, {summary.get('n_passages')} "
             f"passages{star}, both orders"]
    for k, o in (summary.get("outcomes") or {}).items():
        lines.append(f"{k:<22} accuracy {f(o['accurate'])}  consistency {f(o['consistent'])}  "
                     f"flips to first {f(o['flip_first'])} / second {f(o['flip_second'])}  "
                     f"content {f(o['content'])}  position {f(o['position'])} nats")
    if ol := summary.get("one_letter"):
        lines.append(f"a one-letter judge: {ol['letter']} in both orders on {ol['share']:.0%} "
                     f"of pairs; its consistency and accuracy count the other pairs, not how "
                     f"well it reads the answers")
    for k, a in (summary.get("order_averaged") or {}).items():
        lines.append(f"{k:<22} averaged over both orders: pair accuracy "
                     f"{f(a['pair_accuracy'])}  AUC {f(a['auc'], 'auc')} "
                     f"({a['n']} pairs, {a['n_passages']} passages)")
    h = summary.get("held_out") or {}
    gap = ((summary.get("patching") or {}).get("gap") or {}).get("mean")
    if h.get("order_heads"):
        small = (f" (shares of a swap that moves the score by {gap:+.2f} nats on average, "
                 f"under {MIN_SWAP_NATS:g})" if gap is not None and abs(gap) < MIN_SWAP_NATS
                 else "")
        lines.append("order heads (chosen on selection passages, share on test passages): "
                     + ", ".join(f"{u['unit']} {f(u['test'], 'share')}"
                                 for u in h["order_heads"]) + small)
    elif h.get("note"):
        lines.append(f"held out: {h['note']}")
    if (pu := h.get("position_units")) and pu.get("units"):
        lines.append(f"units carrying half the position term on selection passages: "
                     f"{', '.join(pu['units'])}; their share on test passages "
                     f"{f(pu.get('test'), 'share')}")
    c = summary.get("checks") or {}
    if c:
        lines.append(f"checks: last-block patch - s2 {c['max_abs_last_resid_patch_minus_s2']:.1e}"
                     f", attribution sum - total "
                     f"{c['max_abs_attribution_sum_minus_total']:.1e}, lens last - score "
                     f"{c['max_abs_lens_last_minus_score']:.1e}")
    if star:
        lines.append(f"* {summary.get('note') or passage_note(summary['n_passages'])}")
    return "\n".join(lines)
