"""The verdict-lens stage (``interp lens``): at which layer the verdict becomes readable.

Methods: :mod:`interp.methods.lens` (logit lens, tuned lens, direct logit attribution).

Algorithm of :func:`run`:

1. Validate the config before any model work; select the first ``limit`` ok records of each
   dataset (prompts over ``max_tokens`` left out first).
2. Tuned lens (``tuned``), when a record of step 3 needs it: reuse
   ``DIR/lens/tuned_lens.safetensors`` when its signature (model, runtime facts, training
   settings) matches; else build training positions from the
   bundled TRAIN split of ``train_datasets`` (never the run's records): for the first
   ``train_limit`` examples of each, the generation prompt and the eval prompt (the candidate
   is the gold answer on even examples, the next example's gold answer on odd ones); of each
   prompt its last ``train_positions // 2`` positions (the verdict and answer positions and
   the chat template's closing tokens) and as many drawn from the rest with ``seed``. Passages
   are split ``heldout`` : ``1 - heldout`` (every k-th passage held out); translators are
   fitted on the rest (:func:`interp.methods.lens.fit_tuned_lens`) and both lenses' KL from
   the model's final distribution is measured per layer on the held-out positions
   (``DIR/lens/tuned_lens.json``). Parts carry the lens's signature, so a run whose parts are
   all fresh reads only that report and needs neither the translators nor their training.
3. Per record, reuse ``DIR/lens/parts/{dataset}__{id}.json`` when fresh, else:
   the judge: whole-reply lens logit difference ``log P_L(Correct) - log P_L(Incorrect)`` at
   every layer through the logit lens and the tuned lens (:func:`interp.methods.lens.
   reply_lens`), and the direct logit attribution of the first-token logit difference to every
   head and MLP (:func:`interp.methods.lens.direct_logit_attribution`; the reply's later tokens
   are its ``continuation`` term); the generator: the gold answer's first reply token against
   the best distractor at every layer (:func:`interp.methods.lens.token_lens`; records without
   a gold answer, SQuAD 2.0's unanswerable ones, have no generator curve).
4. Summary (:func:`summarise`): per task and lens, the mean curve per layer with a
   passage-cluster bootstrap 95% CI, the share of records whose reading at each layer has the
   last layer's sign (agreement with the final verdict), the first layer from which that sign
   holds (per record, then its mean with CI, also as a fraction of depth); the band's heads
   and MLPs by mean attribution with CIs; the checks: the largest gap between the last-layer
   lens and the model's own logit difference, and between the attribution sum and its total.
5. Figures ``DIR/figures/lens_layers.png`` and ``DIR/figures/lens_attribution.png``
   (:mod:`interp.plots.lens`).
"""

from __future__ import annotations

import time
import zlib
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
from interp.core.errors import PromptError, StageError
from interp.core.inputs import write_result
from interp.core.io import is_fresh, read_json, signature, write_json
from interp.core.layers import parse_layers
from interp.core.progress import resumed, tqdm
from interp.data.loading import bundled_splits, load_examples, passage_key
from interp.judging.prompts import get_template, render, rerender
from interp.models.loading import ModelHandle
from interp.stages.common import fitting, ok_records, stage_facts
from interp.stages.configs.lens import LensConfig
from interp.store.rundir import RunDir

__all__ = ["LensConfig", "format_summary", "run", "summarise"]

SPEC = stage_of(__name__)
"""This stage's declared contract (:data:`interp.core.contract.SPECS`)."""
LENSES = ("logit", "tuned")
TASKS = ("judge", "judge_first", "gen")


def _train_settings(cfg: LensConfig) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in ("train_datasets", "train_limit", "train_positions",
                                         "heldout", "ridge", "kl_steps", "kl_batch", "lr",
                                         "seed")}


def _training_positions(handle: ModelHandle, cfg: LensConfig, log: Callable[[str], None]
                        ) -> tuple[list[Any], list[str]]:
    """Step 2's positions: ``([(stack, logits) per prompt], [passage per prompt])``."""
    from interp.methods.lens import residual_stack

    rng = np.random.default_rng(cfg.seed)
    tpl = get_template()
    jobs = []
    for ds in cfg.train_datasets:
        if "train" not in bundled_splits(ds):
            log(f"[lens] {ds} has no bundled train split; the tuned lens trains without it")
            continue
        ex = [e for e in load_examples(ds, split="train", limit=cfg.train_limit) if e.answers]
        for i, e in enumerate(ex):
            cand = e.answers[0] if i % 2 == 0 else ex[(i + 1) % len(ex)].answers[0]
            kw = {"context": e.context, "question": e.question}
            for task, answer in (("gen", None), ("eval", cand)):
                jobs.append((render(handle.tokenizer, tpl, task, answer=answer, **kw).input_ids,
                             f"{ds}:{passage_key(e)}"))
    if not jobs:
        raise StageError("lens",
                         f"no bundled train split among {cfg.train_datasets}: the tuned lens "
                         f"needs one (squad_v2, hotpotqa or musique), or set tuned = false")
    jobs, long = fitting(handle, jobs, lambda job: len(job[0]), stage=SPEC.name,
                         what="tuned-lens training prompt", log=log)
    if not jobs:
        raise StageError("lens",
                         f"no tuned-lens training prompt fits the model's {handle.max_positions} "
                         f"positions (first: {long[0][1]}): train on datasets with shorter "
                         f"passages (train_datasets) or set tuned = false")
    out, groups = [], []
    half = cfg.train_positions // 2
    for ids, g in tqdm(jobs, desc="tuned lens: positions", unit="prompt",
                       disable=not cfg.progress):
        n = len(ids)
        last = list(range(max(0, n - half), n))
        rest = [p for p in range(n) if p not in last]
        drawn = sorted(rng.choice(rest, min(half, len(rest)), replace=False).tolist()) \
            if rest else []
        out.append(residual_stack(handle, ids, drawn + last))
        groups.append(g)
    return out, groups


def _tuned_signature(handle: ModelHandle, cfg: LensConfig, facts: Mapping[str, Any]) -> str:
    """The tuned lens's signature: model, runtime facts and training settings (step 2)."""
    return signature({"model": handle.spec, "sha256": handle.info.get("sha256"), **facts,
                      **_train_settings(cfg)})


def _tuned_lens(run_dir: RunDir, handle: ModelHandle, cfg: LensConfig, facts: Mapping[str, Any],
                log: Callable[[str], None]) -> tuple[Any, dict[str, Any]]:
    """Step 2: the tuned lens and its held-out report (reused when fresh)."""
    import torch

    from interp.methods.lens import TunedLens, fit_tuned_lens, lens_kl, readout

    root = run_dir.sub(SPEC.folder)
    path, rep = root / "tuned_lens.safetensors", root / "tuned_lens.json"
    sig = _tuned_signature(handle, cfg, facts)
    if path.is_file() and is_fresh(rep, sig):
        return TunedLens.load(path), read_json(rep)
    t0 = time.perf_counter()
    parts, groups = _training_positions(handle, cfg, log)
    uniq = list(dict.fromkeys(groups))
    every = max(2, round(1 / cfg.heldout))
    held = {g for i, g in enumerate(uniq) if i % every == every - 1}
    tr = [p for p, g in zip(parts, groups) if g not in held]
    te = [p for p, g in zip(parts, groups) if g in held]
    if not tr or not te:
        raise StageError("lens", f"{len(uniq)} training passages cannot be split {cfg.heldout:.2f} "
                                 f"held out; raise train_limit")
    cat = [(torch.cat([s for s, _ in ps], 1), torch.cat([lg for _, lg in ps])) for ps in (tr, te)]
    ro = readout(handle.model)
    with tqdm(total=cfg.kl_steps, desc="tuned lens: KL steps", unit="step",
              disable=not cfg.progress or not cfg.kl_steps) as bar:
        lens = fit_tuned_lens(ro, *cat[0], ridge=cfg.ridge, kl_steps=cfg.kl_steps,
                              batch=cfg.kl_batch, lr=cfg.lr, seed=cfg.seed,
                              on_step=lambda i, loss: (bar.update(1),
                                                       bar.set_postfix(kl=f"{loss:.2f}")))
    kl = {name: lens_kl(ro, *cat[1], t).tolist() for name, t in (("logit", None),
                                                                  ("tuned", lens))}
    report = {"signature": sig, "settings": _train_settings(cfg),
              "n_positions": {"train": int(cat[0][0].shape[1]), "heldout": int(cat[1][0].shape[1])},
              "n_passages": {"train": len(uniq) - len(held), "heldout": len(held)},
              "heldout_kl": kl, "layers": ["embed"] + list(range(handle.n_layers)),
              "fit_s": round(time.perf_counter() - t0, 1),
              "method": "ridge least-squares start (Din et al. 2023) + KL steps (Belrose et al. "
                        "2023); KL(final || lens) in nats per position, held-out passages"}
    lens.save(path, {"signature": sig})
    write_json(rep, report)
    log(f"[lens] tuned lens: {report['n_positions']['train']} train positions, held-out KL "
        f"mean over layers logit {np.mean(kl['logit'][:-1]):.2f} vs tuned "
        f"{np.mean(kl['tuned'][:-1]):.2f} nats ({report['fit_s']:.0f} s)")
    return lens, report


def _gold_token(tokenizer: Any, rec: Mapping[str, Any]) -> int | None:
    from interp.judging.verdict import reply_tokens

    answers = [a for a in rec.get("answers") or [] if a.strip()]
    if not answers:
        return None
    try:
        return reply_tokens(tokenizer, answers[0].strip())[0]
    except PromptError:
        ids = tokenizer(" " + answers[0].strip(), add_special_tokens=False)["input_ids"]
        return ids[0] if ids else None


def _lens_one(handle: ModelHandle, rec: Mapping[str, Any], prompts: Mapping[str, Any],
              replies: Any, lens: Any) -> dict[str, Any]:
    """Step 3 for one record."""
    from interp.methods.lens import direct_logit_attribution, reply_lens, token_lens

    ev = prompts["eval"].input_ids
    lenses = {"logit": None, **({"tuned": lens} if lens is not None else {})}
    r = reply_lens(handle, ev, replies.ids, lens=lenses)
    judge: dict[str, Any] = {k: (v[0] - v[1]).tolist() for k, v in r["logprobs"].items()}
    judge["model"] = float(r["model"][0] - r["model"][1])
    first = {k: (v[0] - v[1]).tolist() for k, v in r["first_logprobs"].items()}
    d = direct_logit_attribution(handle, ev, replies.correct[0], replies.incorrect[0])
    dla = {"heads": d["heads"].tolist(), "mlp": d["mlp"].tolist(),
           "attn_bias": d["attn_bias"].tolist(), "embed": d["embed"], "lm_bias": d["lm_bias"],
           "norm_bias": d["norm_bias"],
           "total": d["total"], "sum": d["sum"], "continuation": judge["model"] - d["total"]}
    gen: dict[str, Any] | None = None
    gold = _gold_token(handle.tokenizer, rec)
    if gold is not None:
        g = token_lens(handle, prompts["gen"].input_ids, gold, lens=lenses)
        gen = {"target": gold, **{k: v.tolist() for k, v in g["logit_diff"].items()},
               "model": g["model"], "distractor": g["distractor"], "rank": g["rank"]}
    return {"id": rec["id"], "dataset": rec["dataset"], "y_star": bool(rec["oracle_label"]),
            "judge": judge, "judge_first": first, "dla": dla, "gen": gen}


def _records(run_dir: RunDir, handle: ModelHandle, cfg: LensConfig, *, overwrite: bool,
             log: Callable[[str], None]) -> tuple[list[dict[str, Any]], dict[str, Any] | None,
                                                  int]:
    """Steps 1-3: ``(parts, tuned-lens report, made now)``."""
    from interp.judging.verdict import verdict_replies

    cfg.validate()
    parse_layers(cfg.band, handle.n_layers)
    manifest, records = ok_records(run_dir, handle, cfg.limit, stage=SPEC.name,
                                   max_tokens=cfg.max_tokens)
    facts = stage_facts(run_dir, handle, SPEC.name, overwrite=overwrite)
    # the tuned lens is trained (or loaded) only when a record needs it: parts made with it
    # carry its signature, so a run whose parts are all fresh needs neither its weights nor
    # its training (only its report, tuned_lens.json)
    tuned_sig = _tuned_signature(handle, cfg, facts) if cfg.tuned else None
    rep = run_dir.sub(SPEC.folder) / "tuned_lens.json"
    report = read_json(rep) if cfg.tuned and is_fresh(rep, tuned_sig) else None
    lens = None
    replies = verdict_replies(handle.tokenizer)
    tp = manifest.get("config", {}).get("templates_path")
    parts, made = [], 0
    with tqdm(total=len(records), desc="lens", unit="record", disable=not cfg.progress) as bar:
        for rec, passage in zip(records, passage_groups(records)):
            prompts = {t: rerender(rec, t, handle.tokenizer, templates_path=tp)
                       for t in ("gen", "eval")}
            sig = signature({"model": handle.spec, "sha256": handle.info.get("sha256"), **facts,
                             "tuned": tuned_sig,
                             "replies": replies.id_lists(),
                             "ids": {t: p.input_ids for t, p in prompts.items()}})
            f = SPEC.parts[0].path(run_dir.path, rec["dataset"], rec["id"])
            if is_fresh(f, sig):
                part = read_json(f)["lens"]
                resumed(bar)
            else:
                if cfg.tuned and lens is None:
                    lens, report = _tuned_lens(run_dir, handle, cfg, facts, log)
                part = _lens_one(handle, rec, prompts, replies, lens)
                write_json(f, {"signature": sig, "lens": part})
                made += 1
                bar.update(1)
            parts.append({**part, "passage": passage,
                          "verdict": bool(part["judge"]["model"] > 0)})
    if cfg.tuned and report is None:   # no record needed it, and its report is not stored
        lens, report = _tuned_lens(run_dir, handle, cfg, facts, log)
    return parts, report, made


def _curves(rows: Sequence[Mapping[str, Any]], lens: str, rng: np.random.Generator,
            n_boot: int) -> dict[str, Any] | None:
    """One task's curves under one lens (step 4); None when no record has them."""
    from interp.methods.lens import first_agreeing_layer

    rows = [r for r in rows if r.get(lens) is not None]
    if not rows:
        return None
    c = np.array([r[lens] for r in rows], dtype=float)                 # [n, layers]
    g = [r["passage"] for r in rows]
    final = np.sign(c[:, -1])
    agree = np.sign(c) == final[:, None]
    first = np.array([first_agreeing_layer(list(x)) for x in c], dtype=float)
    lenient = np.array([first_agreeing_layer(list(x), skip=1) for x in c], dtype=float)
    depth = c.shape[1] - 1
    return {"n": len(rows), "n_passages": len(set(g)),
            "logit_diff": [mean_stat(c[:, i], g, rng, n_boot) for i in range(c.shape[1])],
            "agreement": [mean_stat(agree[:, i], g, rng, n_boot) for i in range(c.shape[1])],
            "first_agreeing_layer": mean_stat(first, g, rng, n_boot),
            "first_agreeing_depth": mean_stat(first / depth, g, rng, n_boot),
            "first_agreeing_layers": first.astype(int).tolist(),
            "first_agreeing_depth_skip1": mean_stat(lenient / depth, g, rng, n_boot),
            "final_positive_share": float((final > 0).mean())}


def summarise(parts: Sequence[Mapping[str, Any]], cfg: LensConfig, handle_info: Mapping[str, Any],
              report: Mapping[str, Any] | None) -> dict[str, Any]:
    """Step 4 of the module algorithm from the per-record parts.

    Returns:
        ``{"model", "n_layers", "layers", "band", "n_records", "n_passages", "few_passages",
        "note", "judge": {lens: curves}, "judge_first": {lens: curves}, "gen": {lens: curves},
        "attribution", "checks",
        "tuned_lens", "metric"}`` where each ``curves`` is ``{"n", "n_passages",
        "logit_diff": [per layer {"mean", "ci", "n", "n_passages"}], "agreement": [...],
        "first_agreeing_layer", "first_agreeing_depth", "first_agreeing_layers" (per record),
        "first_agreeing_depth_skip1" (one later layer may disagree:
        :func:`interp.methods.lens.first_agreeing_layer`), "final_positive_share"}`` (layer
        index 0 is the embeddings, ``L + 1`` block ``L``).
        ``final_positive_share`` near 0 or 1 means the final verdict is (nearly) constant:
        agreement is then about one class (a degenerate case the report names).
    """
    def rng(block: str) -> np.random.Generator:
        # one stream per block of statistics, so a block's intervals do not depend on which
        # other blocks were computed (a --no-tuned run has no tuned blocks)
        return np.random.default_rng([cfg.seed, zlib.crc32(block.encode())])

    n_layers = int(handle_info["n_layers"])
    band = parse_layers(cfg.band, n_layers)
    groups = [p["passage"] for p in parts]
    s: dict[str, Any] = {
        "model": handle_info.get("spec"), "n_layers": n_layers,
        "layers": ["embed"] + list(range(n_layers)), "band": band, "n_records": len(parts),
        "n_passages": len(set(groups)),
        "metric": "judge: whole-reply lens logit difference log P_L(Correct) - log P_L("
                  "Incorrect), teacher-forced, nats; judge_first: the replies' first tokens "
                  "only, logit_L(Correct[0]) - logit_L(Incorrect[0]), nats (the attribution's "
                  "target); gen: lens logit of the gold answer's first reply token minus the "
                  "model's best other token, nats"}
    s["few_passages"] = s["n_passages"] < MIN_PASSAGES
    s["note"] = passage_note(s["n_passages"])
    for task in TASKS:
        rows = [{**(p[task] or {}), "passage": p["passage"]} for p in parts
                if p.get(task) is not None]
        s[task] = {lens: cur for lens in LENSES
                   if (cur := _curves(rows, lens, rng(f"{task}/{lens}"), cfg.n_boot))
                   is not None}
    if parts:
        r_attr = rng("attribution")
        h = np.array([p["dla"]["heads"] for p in parts], dtype=float)      # [n, L, H]
        m = np.array([p["dla"]["mlp"] for p in parts], dtype=float)        # [n, L]
        units = [(f"L{i}.H{j}", h[:, i, j]) for i in band for j in range(h.shape[2])] + \
            [(f"L{i}.MLP", m[:, i]) for i in band]
        ranked = sorted(units, key=lambda u: -abs(float(np.mean(u[1]))))
        band_total = h[:, band].sum((1, 2)) + m[:, band].sum(1)
        total = np.array([p["dla"]["total"] for p in parts])
        s["attribution"] = {
            "target": "first-token logit difference logit(Correct[0]) - logit(Incorrect[0]), "
                      "final norm's scale frozen per record",
            "total": mean_stat(total, groups, r_attr, cfg.n_boot),
            # a ratio of sums (a mean of per-record ratios explodes where a record's total is
            # near 0); above 1 when the layers before the band write against the total
            "band_share": ratio_stat(band_total, total, groups, r_attr, cfg.n_boot),
            "heads_mean": h.mean(0).tolist(), "mlp_mean": m.mean(0).tolist(),
            "top_units": [{"unit": u, **mean_stat(x, groups, r_attr, cfg.n_boot)}
                          for u, x in ranked[:12]],
            "continuation": mean_stat([p["dla"]["continuation"] for p in parts], groups, r_attr,
                                  cfg.n_boot)}
        s["checks"] = {
            "max_abs_last_layer_minus_model": float(max(
                abs(p["judge"]["logit"][-1] - p["judge"]["model"]) for p in parts)),
            "max_abs_attribution_sum_minus_total": float(max(
                abs(p["dla"]["sum"] - p["dla"]["total"]) for p in parts)),
            "max_abs_first_token_last_layer_minus_total": float(max(
                (abs(p["judge_first"]["logit"][-1] - p["dla"]["total"]) for p in parts
                 if p.get("judge_first")), default=0.0))}
    if report:
        s["tuned_lens"] = {k: report[k] for k in ("n_positions", "n_passages", "heldout_kl",
                                                  "method", "settings") if k in report}
    return s


def run(run_dir: RunDir | str | Path, handle: ModelHandle, cfg: LensConfig, *,
        overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The verdict lens on a run's records (module docstring).

    ``overwrite``: redo parts stored under other result-relevant runtime facts instead of
    refusing (:func:`interp.stages.common.stage_facts`).

    Returns:
        The summary (also ``DIR/lens/summary.json``).

    Raises:
        StageError: a bad setting, or no bundled train split for the tuned lens.
        RunDirError: the run has no manifest or records; another model than the run's; parts
            stored under other runtime facts and not ``overwrite``.
    """
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    parts, report, _ = _records(run_dir, handle, cfg, overwrite=overwrite, log=log)
    s = summarise(parts, cfg, {**handle.info, "n_layers": handle.n_layers}, report)
    write_result(run_dir.sub(SPEC.folder) / "summary.json", s, n=len(parts), log=log)
    if cfg.figures and parts:
        try:
            from interp.plots.lens import plot_lens

            plot_lens(s, run_dir.sub("figures"))
        except Exception as err:  # noqa: BLE001 - figures never block the tables
            log(f"[lens] figure failed: {err}")
    return s


def format_summary(summary: Mapping[str, Any]) -> str:
    """Per task and lens: the first layer agreeing with the final verdict, and the checks."""
    def f(x: Mapping[str, Any] | None, p: str = ".2f", key: str = "mean") -> str:
        if not x or x.get(key) is None:
            return "-"
        return f"{x[key]:{p}}" + (f" {ci_text(x.get('ci'), p)}" if x.get("ci") else "")

    star = "*" if summary.get("few_passages") else ""
    lines = [f"verdict lens, {summary.get('n_layers')} layers: {summary.get('n_records')} "
             f"records, {summary.get('n_passages')} passages{star} (layer index 0: the "
             f"embeddings, L + 1: after block L)"]
    for task, label in (("judge", "judge (Correct - Incorrect)"),
                        ("judge_first", "judge, first tokens (C - In)"),
                        ("gen", "generator (gold - best other)")):
        for lens, cur in (summary.get(task) or {}).items():
            lines.append(f"{label:<30} {lens:>5} lens: first agreeing layer index "
                         f"{f(cur['first_agreeing_layer'], '.1f')} (depth "
                         f"{f(cur['first_agreeing_depth'])}), final > 0 in "
                         f"{cur['final_positive_share']:.0%} of {cur['n']}"
                         + (" (a constant final sign: agreement is about one class)"
                            if cur["final_positive_share"] in (0.0, 1.0) else ""))
    a = summary.get("attribution") or {}
    if a.get("top_units"):
        top = ", ".join(f"{u['unit']} {u['mean']:+.2f}" for u in a["top_units"][:4])
        lines.append(f"attribution of the first-token logit difference (band {summary['band']}):"
                     f" {top}; band share {f(a.get('band_share'), key='share')}"
                     + (" (the total's CI spans 0: a share of a total that may be 0)"
                        if (ci := (a.get("total") or {}).get("ci")) and ci[0] <= 0 <= ci[1]
                        else ""))
    c = summary.get("checks") or {}
    if c:
        lines.append(f"checks: last-layer lens - model {c['max_abs_last_layer_minus_model']:.1e}"
                     f", attribution sum - total {c['max_abs_attribution_sum_minus_total']:.1e}")
    if star:
        lines.append(f"* {summary.get('note') or passage_note(summary['n_passages'])}")
    return "\n".join(lines)
