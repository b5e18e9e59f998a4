"""The calibration stage (``interp calibration``): does the judge know what the generator knew?

Methods: :mod:`interp.methods.calibration` (signals, self-check, cache patching and blocking)
and :mod:`interp.analysis.calibration` (ECE, Brier score, reliability data, CIs).

Algorithm of :func:`run`:

1. Validate the config before any model work; select the first ``limit`` ok records of each
   dataset (prompts over ``max_tokens`` left out first). A record whose generation is empty
   has no self-check (counted, left out).
2. Per record, reuse ``DIR/calibration/parts/{dataset}__{id}.json`` when fresh, else: the
   self-check prompt (:func:`interp.judging.prompts.render_self_check`: the generator's
   conversation, its raw generation as the assistant turn, the verdict question after it) is
   run once (:func:`interp.methods.calibration.self_check`): P(True), its greedy verdict, the
   generator's per-token answer log-probability, the residual stream after the answer, and
   the blocking test; then (``patch``) that state is patched into the fresh judge's eval
   prompt at its verdict position, layer by layer
   (:func:`interp.methods.calibration.patch_verdict_position`).
3. Probe signals (:func:`interp.methods.calibration.oof_probe`): the ``last`` pool of the eval
   prompt (the judge's verdict position) and of the generation prompt (before answering),
   from the probe stage's feature caches (:func:`interp.stages.probe.cached_features`, which
   the harness's one pass fills), out-of-fold by passage with the layer chosen on training
   folds; and the angle, per layer, between a probe fitted on all records and the verdict's
   unembedding-difference direction
   (:func:`interp.methods.calibration.verdict_direction`).
4. Summary (:func:`summarise`), over all records and per dataset: the calibration card of
   every signal (AUROC, ECE with both binnings and ``n_bins``, Brier, reliability rows, with
   passage-cluster CIs); the self-check against the fresh judge (EA, EA_forced, balanced
   accuracy, AUC, paired AUC difference); the cache test (per layer the mean change of the
   verdict's logit difference and the paired change in AUC; the blocking test against its
   control). ``DIR/calibration/records.jsonl`` holds every record's signals.
5. Figures: ``DIR/figures/calibration_reliability_{signal}.png`` (one reliability diagram
   per signal) and ``DIR/figures/calibration_cache.png`` (:mod:`interp.plots.calibration`).
6. With ``directions``: the generator's correctness direction at its answer tokens against
   the judge's verdict direction, on the same records and passage folds
   (:mod:`interp.stages.calibration_directions`: the summary's ``directions`` key and
   ``DIR/figures/calibration_directions.png``). ``card = False`` skips steps 2-5 (and the
   self-check's cost) and runs this part alone.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from interp.analysis.calibration import BINNINGS, calibration_card
from interp.analysis.stats import (
    MIN_PASSAGES,
    binary_metrics,
    ci_text,
    cluster_bootstrap_auc_difference,
    mean_stat,
    passage_groups,
    passage_note,
    roc_auc,
)
from interp.core.contract import stage_of
from interp.core.inputs import write_result
from interp.core.io import is_fresh, read_json, signature, write_json, write_jsonl
from interp.core.layers import parse_layers
from interp.core.progress import resumed, tqdm
from interp.judging.prompts import get_template, render_self_check, rerender
from interp.models.loading import ModelHandle
from interp.stages.common import ok_records, stage_facts
from interp.stages.configs.calibration import CalibrationConfig
from interp.store.records import qa_key
from interp.store.rundir import RunDir

__all__ = ["SIGNALS", "CalibrationConfig", "format_summary", "run", "summarise"]

SPEC = stage_of(__name__)
"""This stage's declared contract (:data:`interp.core.contract.SPECS`)."""

SIGNALS = {
    "judge": "the fresh judge's whole-reply forced choice p_correct = sigmoid(log P(Correct) - "
             "log P(Incorrect)) on the eval prompt (the run's records)",
    "p_true": "P(True) asked in the generator's own conversation: the same forced choice on "
              "the self-check prompt (the verdict question after the generator's answer)",
    "answer_prob": "the generator's own answer probability, length-normalised: exp(mean "
                   "per-token log-probability of its reply's tokens given the generation "
                   "prompt), end-of-turn marker excluded",
    "probe_eval": "an unweighted logistic probe on resid_post at the eval prompt's last "
                  "position (the verdict position), out-of-fold by passage, its layer chosen "
                  "on each training part by inner cross-validation",
    "probe_gen": "the same probe on the generation prompt's last position (before answering)",
}
"""The four signals of the card (the probe read on two prompts), each a probability."""

def _self_prompt(rec: Mapping[str, Any], tokenizer: Any, templates_path: str | None) -> Any:
    tpl = get_template(rec.get("template") or "default", templates_path)
    return render_self_check(tokenizer, tpl, context=rec["context"], question=rec["question"],
                             answer=rec["generation"])


def _records(run_dir: RunDir, handle: ModelHandle, cfg: CalibrationConfig, *, overwrite: bool,
             log: Callable[[str], None]) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                  dict[str, Any], int]:
    """Steps 1-2: ``(records, parts, facts, n_skipped)`` (parts in the records' order)."""
    from interp.judging.verdict import verdict_replies
    from interp.methods.calibration import (
        patch_verdict_position,
        self_check,
        states_after_answer,
    )

    cfg.validate()
    patch_layers = parse_layers(cfg.patch_layers, handle.n_layers)
    parse_layers(cfg.probe_layers, handle.n_layers)
    manifest, records = ok_records(run_dir, handle, cfg.limit, stage=SPEC.name,
                                   max_tokens=cfg.max_tokens)
    skipped = [r for r in records if not (r.get("generation") or "").strip()]
    if skipped:
        log(f"[calibration] {len(skipped)} records with an empty generation have no "
            f"self-check; left out")
    records = [r for r in records if (r.get("generation") or "").strip()]
    facts = stage_facts(run_dir, handle, SPEC.name, overwrite=overwrite)
    if not cfg.card:
        return records, [], facts, len(skipped)
    replies = verdict_replies(handle.tokenizer)
    tp = manifest.get("config", {}).get("templates_path")
    settings = {"patch": cfg.patch, "patch_layers": patch_layers if cfg.patch else None,
                "block": cfg.block, "max_new_tokens": cfg.max_new_tokens, "version": 1}
    parts = []
    # the control's donor: the ok record before it in the run's records.jsonl (cyclic), so a
    # part's control does not depend on which records a call selects (limit, a share)
    run_recs = [r for r in run_dir.read_records(status="ok")
                if (r.get("generation") or "").strip()]
    order = ["/".join(qa_key(r)) for r in run_recs]
    before = {k: run_recs[(i - 1) % len(run_recs)] for i, k in enumerate(order)}
    selfs: dict[str, Any] = {}
    states: dict[str, Any] = {}                  # self-check states made in this call

    def self_of(rec: Mapping[str, Any]) -> Any:
        k = "/".join(qa_key(rec))
        if k not in selfs:
            selfs[k] = _self_prompt(rec, handle.tokenizer, tp)
        return selfs[k]

    def donor(rec: Mapping[str, Any]) -> Any:
        k = "/".join(qa_key(rec))
        if k not in states:
            states[k] = states_after_answer(handle, self_of(rec))
        return states[k]

    with tqdm(total=len(records), desc="calibration", unit="record",
              disable=not cfg.progress) as bar:
        for rec in records:
            key = "/".join(qa_key(rec))
            sc = self_of(rec)
            ev = rerender(rec, "eval", handle.tokenizer, templates_path=tp)
            ctrl = self_of(before[key])
            sig = signature({"model": handle.spec, "sha256": handle.info.get("sha256"), **facts,
                             "replies": replies.id_lists(), **settings,
                             "ids": {"eval": ev.input_ids, "self": sc.input_ids,
                                     "control": ctrl.input_ids if cfg.patch else None}})
            f = SPEC.parts[0].path(run_dir.path, rec["dataset"], rec["id"])
            if is_fresh(f, sig):
                part = read_json(f)["part"]
                resumed(bar)
            else:
                r = self_check(handle, sc, replies, max_new_tokens=cfg.max_new_tokens,
                               block=cfg.block)
                states[key] = r.pop("states")
                if cfg.patch:
                    r["patch"] = patch_verdict_position(handle, ev.input_ids, states[key],
                                                        replies, layers=patch_layers,
                                                        control=donor(before[key]))
                    r["patch"]["control_record"] = before[key]["id"]
                part = {"id": rec["id"], "dataset": rec["dataset"], **r,
                        "n_tokens": {"eval": len(ev), "self": len(sc)}}
                write_json(f, {"signature": sig, "part": part})
                bar.update(1)
            parts.append(part)
    return records, parts, facts, len(skipped)


def _probe_signals(run_dir: RunDir, handle: ModelHandle, cfg: CalibrationConfig,
                   records: Sequence[Mapping[str, Any]], y: np.ndarray, groups: Sequence[str],
                   facts: Mapping[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    """Step 3: out-of-fold probe probabilities and the probe-verdict angles per task."""
    from interp.judging.verdict import verdict_replies
    from interp.methods.calibration import (
        cosine,
        oof_probe,
        probe_direction,
        random_cosine_band,
        verdict_direction,
    )
    from interp.stages.stored import cached_features

    layers = parse_layers(cfg.probe_layers, handle.n_layers)
    vd = verdict_direction(handle, verdict_replies(handle.tokenizer))
    tp = RunDir(run_dir.path).manifest().get("config", {}).get("templates_path")
    out: dict[str, Any] = {"direction_tokens": vd["tokens"],
                           "random_band": random_cosine_band(len(vd["unembed"]))}
    for task in ("eval", "gen"):
        feats, _ = cached_features(run_dir, handle, list(records), task, pools=["last"],
                                   templates_path=tp, facts=facts, log=log)
        X = feats["last"]                                       # [n, n_layers, d]
        oof = oof_probe(X, y, groups, layers, folds=cfg.folds, inner_folds=cfg.inner_folds,
                        seed=cfg.seed, C=cfg.C)
        angles = []
        for L in layers:
            w = probe_direction(X[:, L], y, C=cfg.C)
            angles.append({"layer": L, "cos_unembed": cosine(w, vd["unembed"]),
                           "cos_read": cosine(w, vd["read"])})
        out[task] = {"p": oof["p"].tolist(), "chosen": oof["chosen"], "angles": angles}
    return out


def _verdict_block(y: np.ndarray, verdict: Sequence[Any], ld: np.ndarray) -> dict[str, Any]:
    """EA (parsed verdict; none = wrong), EA_forced, balanced accuracy and AUC of one judge."""
    pred = np.array([v is True for v in verdict])
    right = np.array([v is not None and v == t for v, t in zip(verdict, y)])
    m = binary_metrics(y, pred, ld)
    return {"EA": float(right.mean()), "EA_forced": float(((ld > 0) == y).mean()),
            "balanced_accuracy": m["balanced_accuracy"],
            "balanced_accuracy_forced": binary_metrics(y, ld > 0, None)["balanced_accuracy"],
            "auc": m["auc"], "no_verdict": float(np.mean([v is None for v in verdict])),
            "accept_right": float(pred[y].mean()) if y.any() else None,
            "accept_wrong": float(pred[~y].mean()) if (~y).any() else None}


def _group(rows: Sequence[Mapping[str, Any]], cfg: CalibrationConfig,
           rng: Callable[[str], np.random.Generator]) -> dict[str, Any]:
    """Step 4 on one group of rows (all records, or one dataset's)."""
    y = np.array([r["y_star"] for r in rows], bool)
    g = [r["passage"] for r in rows]
    n_pass = len(set(g))
    s: dict[str, Any] = {"n": len(rows), "n_passages": n_pass, "n_right": int(y.sum()),
                         "GA": float(y.mean()), "few_passages": n_pass < MIN_PASSAGES,
                         "note": passage_note(n_pass)}
    s["cards"] = {sig: calibration_card(y, np.array([r[sig] for r in rows]), g,
                                        rng(f"card/{sig}"), cfg.n_boot, n_bins=cfg.n_bins)
                  for sig in SIGNALS if all(r.get(sig) is not None for r in rows)}
    judge_ld = np.array([r["judge_logit_diff"] for r in rows])
    self_ld = np.array([r["self_logit_diff"] for r in rows])
    s["self_vs_judge"] = {
        "judge": _verdict_block(y, [r["judge_verdict"] for r in rows], judge_ld),
        "self_check": _verdict_block(y, [r["self_verdict"] for r in rows], self_ld),
        "auc_self_minus_judge": _auc_diff(y, self_ld, judge_ld, g, rng("auc/self-judge"),
                                          cfg.n_boot),
        "verdict_agreement": float(np.mean([a == b for a, b in zip(
            [r["judge_verdict"] for r in rows], [r["self_verdict"] for r in rows])])),
        "mean_logit_diff": {"judge": mean_stat(judge_ld, g, rng("ld/judge"), cfg.n_boot),
                            "self_check": mean_stat(self_ld, g, rng("ld/self"), cfg.n_boot)}}
    if all("patch" in r for r in rows) and rows:
        base = np.array([r["patch"]["base"]["logit_diff"] for r in rows])
        P = np.array([r["patch"]["logit_diff"] for r in rows])             # [n, layers]
        Q = np.array([r["patch"]["control_logit_diff"] for r in rows])     # [n, layers]
        k = range(P.shape[1])
        s["patch"] = {"layers": rows[0]["patch"]["layers"],
                      "base_auc": _auc(y, base),
                      "delta_logit_diff": [mean_stat(P[:, i] - base, g, rng(f"patch/ld/{i}"),
                                                     cfg.n_boot) for i in k],
                      "delta_auc": [_auc_diff(y, P[:, i], base, g, rng(f"patch/auc/{i}"),
                                              cfg.n_boot) for i in k],
                      "control_delta_logit_diff": [mean_stat(Q[:, i] - base, g,
                                                             rng(f"patch/cld/{i}"), cfg.n_boot)
                                                   for i in k],
                      "control_delta_auc": [_auc_diff(y, Q[:, i], base, g,
                                                      rng(f"patch/cauc/{i}"), cfg.n_boot)
                                            for i in k],
                      "auc_own_minus_control": [_auc_diff(y, P[:, i], Q[:, i], g,
                                                          rng(f"patch/oc/{i}"), cfg.n_boot)
                                                for i in k],
                      "flip_share": [float(np.mean(np.sign(P[:, i]) != np.sign(base)))
                                     for i in k],
                      "control": "each record's eval prompt patched with the state after the "
                                 "answer of the ok record before it in the run (cyclic): a "
                                 "foreign state that moves the verdict as much but says "
                                 "nothing about this answer"}
    if all("block" in r for r in rows) and rows:
        s["block"] = {}
        for key in ("logit_diff", "first_logit_diff"):
            none = np.array([r["block"]["none"][key] for r in rows])
            cache = np.array([r["block"]["cache"][key] for r in rows])
            ctrl = np.array([r["block"]["control"][key] for r in rows])
            s["block"][key] = {
                "cache_minus_none": mean_stat(cache - none, g, rng(f"block/{key}/c"), cfg.n_boot),
                "control_minus_none": mean_stat(ctrl - none, g, rng(f"block/{key}/k"),
                                                cfg.n_boot),
                "cache_minus_control": mean_stat(cache - ctrl, g, rng(f"block/{key}/d"),
                                                 cfg.n_boot),
                "abs_cache_minus_none": mean_stat(np.abs(cache - none), g,
                                                  rng(f"block/{key}/ac"), cfg.n_boot),
                "abs_control_minus_none": mean_stat(np.abs(ctrl - none), g,
                                                    rng(f"block/{key}/ak"), cfg.n_boot),
                "auc": {"none": _auc(y, none), "cache": _auc_diff(y, cache, none, g,
                                                                  rng(f"block/{key}/aucc"),
                                                                  cfg.n_boot),
                        "control": _auc_diff(y, ctrl, none, g, rng(f"block/{key}/auck"),
                                             cfg.n_boot)}}
    return s


def _auc(y: np.ndarray, x: np.ndarray) -> float | None:
    return roc_auc(y, x)


def _auc_diff(y: np.ndarray, a: np.ndarray, b: np.ndarray, g: Sequence[str],
              rng: np.random.Generator, n_boot: int) -> dict[str, Any]:
    d = cluster_bootstrap_auc_difference(y, a, b, g, rng, n_boot)
    return {"a": d["auc_a"], "a_ci": d["ci_a"], "b": d["auc_b"], "b_ci": d["ci_b"],
            "difference": d["difference"], "ci": d["ci"]}


def _rows(records: Sequence[Mapping[str, Any]], parts: Sequence[Mapping[str, Any]],
          probes: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """One row of signals per record (``calibration/records.jsonl``)."""
    rows = []
    for i, (rec, part, passage) in enumerate(zip(records, parts, passage_groups(records))):
        row = {"id": rec["id"], "dataset": rec["dataset"], "passage": passage,
               "y_star": bool(rec["oracle_label"]), "judge": float(rec["p_correct"]),
               "judge_logit_diff": float(rec["logit_diff"]), "judge_verdict": rec.get("verdict"),
               "p_true": float(part["p_correct"]), "self_logit_diff": float(part["logit_diff"]),
               "self_verdict": part["verdict"], "self_verdict_text": part["verdict_text"],
               "self_coverage": float(part["verdict_coverage"]),
               "answer_prob": float(np.exp(part["answer_logprob_mean"])),
               "answer_logprob_mean": float(part["answer_logprob_mean"]),
               "answer_tokens": int(part["answer_tokens"])}
        if probes:
            row["probe_eval"] = float(probes["eval"]["p"][i])
            row["probe_gen"] = float(probes["gen"]["p"][i])
        for k in ("patch", "block"):
            if k in part:
                row[k] = part[k]
        rows.append(row)
    return rows


def summarise(rows: Sequence[Mapping[str, Any]], cfg: CalibrationConfig,
              handle_info: Mapping[str, Any], probes: Mapping[str, Any] | None,
              checks: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Step 4 of the module algorithm from the per-record rows.

    Returns:
        ``{"model", "n_layers", "n_records", "n_passages", "signals" (definitions),
        "binning", "all": group, "datasets": {dataset: group}, "probe": {task: {"chosen",
        "angles"}}, "direction_tokens", "random_band", "checks"}`` where each ``group`` is
        ``{"n", "n_passages", "GA", "cards": {signal: calibration card}, "self_vs_judge",
        "patch", "block"}`` (:func:`interp.analysis.calibration.calibration_card`).
    """
    def rng(block: str) -> np.random.Generator:
        return np.random.default_rng([cfg.seed, zlib.crc32(block.encode())])

    by_ds: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_ds.setdefault(r["dataset"], []).append(r)
    s: dict[str, Any] = {
        "model": handle_info.get("spec"), "n_layers": int(handle_info["n_layers"]),
        "n_records": len(rows), "n_passages": len({r["passage"] for r in rows}),
        "signals": SIGNALS,
        "binning": {"n_bins": cfg.n_bins, "binnings": list(BINNINGS),
                    "note": "mass: equal-mass bins (examples sorted by p, cut into n_bins runs "
                            "of as equal size as possible); width: equal-width bins on [0, 1]; "
                            "resamples keep the full sample's bins"},
        "metric": "logit_diff: log P(Correct) - log P(Incorrect) of the whole replies, nats; "
                  "first_logit_diff: the replies' first tokens' logit difference, nats",
        "all": _group(rows, cfg, lambda b: rng(f"all/{b}")) if rows else None,
        "datasets": {ds: _group(rs, cfg, lambda b, ds=ds: rng(f"{ds}/{b}"))
                     for ds, rs in sorted(by_ds.items())} if len(by_ds) > 1 else {}}
    if probes:
        s["probe"] = {t: {"chosen": probes[t]["chosen"], "angles": probes[t]["angles"]}
                      for t in ("eval", "gen")}
        s["direction_tokens"] = probes["direction_tokens"]
        s["random_band"] = probes["random_band"]
    s["checks"] = dict(checks or {})
    return s


def run(run_dir: RunDir | str | Path, handle: ModelHandle, cfg: CalibrationConfig, *,
        overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The calibration card, the self-check and the cache test on a run's records.

    ``overwrite``: redo parts stored under other result-relevant runtime facts instead of
    refusing (:func:`interp.stages.common.stage_facts`).

    Returns:
        The summary (also ``DIR/calibration/summary.json``).

    Raises:
        StageError: a bad setting.
        StageError: too few passages of a class for the probe's folds.
        RunDirError: the run has no manifest or records; another model than the run's; parts
            stored under other runtime facts and not ``overwrite``.
    """
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    records, parts, facts, n_skipped = _records(run_dir, handle, cfg, overwrite=overwrite,
                                                log=log)
    y = np.array([bool(r["oracle_label"]) for r in records])
    groups = passage_groups(records)
    if not cfg.card:                       # the directions part alone
        s = {"model": handle.info.get("spec"), "n_layers": handle.n_layers,
             "n_records": len(records), "n_passages": len(set(groups)), "all": None,
             "checks": {"skipped_empty_generation": n_skipped}}
        if cfg.directions and records:
            s["directions"] = _directions(run_dir, handle, cfg, records, groups, facts, log)
        write_result(run_dir.sub(SPEC.folder) / "summary.json", s, n=len(records), log=log)
        if cfg.figures and s.get("directions"):
            _figures(s, run_dir, log)
        return s
    probes = _probe_signals(run_dir, handle, cfg, records, y, groups, facts, log) \
        if len(records) else None
    rows = _rows(records, parts, probes)
    checks: dict[str, Any] = {"skipped_empty_generation": n_skipped}
    if rows and "patch" in rows[0]:
        checks["max_abs_patch_base_minus_record_logit_diff"] = float(max(
            abs(r["patch"]["base"]["logit_diff"] - r["judge_logit_diff"]) for r in rows))
    if rows and "block" in rows[0]:
        checks["max_abs_block_none_minus_self_logit_diff"] = float(max(
            abs(r["block"]["none"]["logit_diff"] - r["self_logit_diff"]) for r in rows))
    s = summarise(rows, cfg, {**handle.info, "n_layers": handle.n_layers}, probes, checks)
    if cfg.directions and records:
        s["directions"] = _directions(run_dir, handle, cfg, records, groups, facts, log)
    write_jsonl(run_dir.sub(SPEC.folder) / "records.jsonl",
                [{k: v for k, v in r.items() if k not in ("patch", "block")} for r in rows])
    write_result(run_dir.sub(SPEC.folder) / "summary.json", s, n=len(rows), log=log)
    if cfg.figures and rows:
        _figures(s, run_dir, log)
    return s


def _figures(s: Mapping[str, Any], run_dir: RunDir, log: Callable[[str], None]) -> None:
    try:
        from interp.plots.calibration import plot_calibration

        plot_calibration(s, run_dir.sub("figures"))
    except Exception as err:  # noqa: BLE001 - figures never block the tables
        log(f"[calibration] figure failed: {err}")


def _directions(run_dir: RunDir, handle: ModelHandle, cfg: CalibrationConfig,
                records: Sequence[Mapping[str, Any]], groups: Sequence[str],
                facts: Mapping[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    """The ``directions`` part (:mod:`interp.stages.calibration_directions`)."""
    from interp.stages.calibration_directions import run_directions

    tp = run_dir.manifest().get("config", {}).get("templates_path")
    return run_directions(
        run_dir, handle, cfg, records, groups, facts,
        self_prompt=lambda r: _self_prompt(r, handle.tokenizer, tp),
        eval_prompt=lambda r: rerender(r, "eval", handle.tokenizer, templates_path=tp), log=log)


def _f(x: Mapping[str, Any] | None, key: str, p: str = ".2f") -> str:
    if not x or x.get(key) is None:
        return "-"
    ci = x.get("ci") if key in ("mean", "value", "difference") else x.get(f"{key}_ci")
    return f"{x[key]:{p}}" + (f" {ci_text(ci, p)}" if ci else "")


def format_summary(summary: Mapping[str, Any]) -> str:
    """The card of every signal, the self-check against the judge, and the cache test."""
    g = summary.get("all") or {}
    star = "*" if g.get("few_passages") else ""
    nb = summary.get("binning", {}).get("n_bins")
    lines = [f"calibration: {summary.get('n_records')} records, {summary.get('n_passages')} "
             f"passages{star}, GA {g.get('GA', float('nan')):.2f}; ECE with {nb} equal-mass "
             f"bins (width: {nb} equal-width bins); CIs: bootstrap over passages"]
    if g.get("cards"):
        lines.append(f"{'signal':<12} {'AUROC':>18} {'ECE mass':>18} {'ECE width':>18} "
                     f"{'Brier':>18} {'mean p':>7}")
    for sig, c in (g.get("cards") or {}).items():
        lines.append(f"{sig:<12} {_f(c, 'auc'):>18} {_f(c['ece']['mass'], 'value'):>18} "
                     f"{_f(c['ece']['width'], 'value'):>18} {_f(c, 'brier', '.3f'):>18} "
                     f"{c['mean_p']:>7.2f}")
    sv = g.get("self_vs_judge")
    if sv:
        for who in ("judge", "self_check"):
            b = sv[who]
            ba = b["balanced_accuracy"]
            lines.append(f"{who:<11} EA {b['EA']:.2f}  EA_forced {b['EA_forced']:.2f}  balanced "
                         f"acc {'-' if ba is None else f'{ba:.2f}'}  AUC "
                         f"{'-' if b['auc'] is None else format(b['auc'], '.2f')}  no verdict "
                         f"{b['no_verdict']:.0%}")
        d = _f(sv["auc_self_minus_judge"], "difference", "+.2f")
        lines.append(f"AUC self-check - judge: {d}; verdicts agree on "
                     f"{sv['verdict_agreement']:.0%}")
    pt = g.get("patch")
    if pt:
        best = max(range(len(pt["layers"])), key=lambda i: abs(
            pt["delta_auc"][i]["difference"] or 0))
        lines.append(f"cache patching (resid_pre, verdict position): base AUC "
                     f"{pt['base_auc'] if pt['base_auc'] is None else round(pt['base_auc'], 2)};"
                     f" largest AUC change at layer {pt['layers'][best]}: "
                     f"{_f(pt['delta_auc'][best], 'difference', '+.2f')} (control "
                     f"{_f(pt['control_delta_auc'][best], 'difference', '+.2f')}; own - control "
                     f"{_f(pt['auc_own_minus_control'][best], 'difference', '+.2f')}), mean "
                     f"change of the logit difference there "
                     f"{_f(pt['delta_logit_diff'][best], 'mean', '+.2f')}")
    bl = (g.get("block") or {}).get("logit_diff")
    if bl:
        lines.append(f"blocking the verdict position's attention to the position after the "
                     f"answer: |change| {_f(bl['abs_cache_minus_none'], 'mean')} nats, control "
                     f"{_f(bl['abs_control_minus_none'], 'mean')}; AUC change "
                     f"{_f(bl['auc']['cache'], 'difference', '+.2f')} (control "
                     f"{_f(bl['auc']['control'], 'difference', '+.2f')})")
    pr = summary.get("probe")
    if pr:
        for task in ("eval", "gen"):
            a = pr[task]["angles"]
            top = max(a, key=lambda x: abs(x["cos_read"]))
            lines.append(f"probe ({task}) layers chosen {pr[task]['chosen']}; largest |cos| with "
                         f"the verdict direction {top['cos_read']:+.3f} at layer {top['layer']} "
                         f"(random directions: +/-{summary['random_band']:.3f})")
    if summary.get("directions"):
        from interp.stages.calibration_directions import format_directions

        lines.append(format_directions(summary["directions"]))
    if star:
        lines.append(f"* {g.get('note')}")
    return "\n".join(lines)
