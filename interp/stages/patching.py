"""The patching stage: pairs x sweeps over a run directory, resumable, with tables and figures.

Algorithm of :func:`run` (methods: :mod:`interp.methods.pairs`, :mod:`interp.methods.patching`,
:mod:`interp.methods.patch_sweeps`; summaries: :mod:`interp.stages.patching_summary`):

1. Validate the config, the layers and the band (:func:`interp.core.layers.parse_layers`) before
   any model work; the oracle is the run's (manifest ``config.oracle``, ``rule`` by default)
   unless ``oracle`` is set.
2. For each pair kind: build the pairs from the run's ``ok`` records with the run's template
   (:func:`interp.methods.pairs.build_pairs`, ``limit`` built pairs per dataset). Candidate swap: a
   record whose own answer is right and that stores no hard negative gets one mined
   closed-book on the fly (:class:`Miner`: Study 3's miner, seeded per record, no rotation),
   kept in ``DIR/patching/hard_negatives.jsonl`` with the signature of what produced it.
3. For each sweep kind and pair: reuse ``parts/{dataset}__{id}.json`` when it is fresh (its
   signature covers the model and its sha256, the sweep, the layers, the band, the hook, the
   exact mode and ``top_k``, the pair's token ids and position map, and the result-relevant
   runtime facts, :func:`interp.stages.common.stage_facts`: parts made under other facts are
   refused unless ``overwrite``); else run it
   (:func:`run_pair`) and write the part atomically (results are flushed per pair). A progress
   bar per pair and per batch of patched rows shows the ETA.
4. Per (pair kind, sweep kind): the tables and ``summary.json``
   (:func:`interp.stages.patching_summary.summarise`), then the figures.
5. ``DIR/patching/summary.json`` gathers every (pairs, kind) summary of this and earlier calls,
   each as soon as it is written (a call interrupted later keeps the kinds it finished).

Layout: ``DIR/patching/{pairs}/{kind}/parts/{dataset}__{id}.json``, ``effects.parquet``,
``units.parquet``, ``pairs.parquet``, ``summary.json``; ``DIR/patching/{pairs}/gaps.jsonl``
(``limit_kept``: every scored pair's gap, so a rerun scores none again);
``DIR/patching/summary.json``; ``DIR/figures/patching_*.png``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from interp.core.contract import stage_of
from interp.core.inputs import write_result
from interp.core.io import is_fresh, read_json, read_jsonl, signature, write_json, write_jsonl
from interp.core.layers import parse_layers
from interp.core.progress import resumed, tqdm
from interp.data import QAExample
from interp.hooks.recorder import context_mass, record_rows
from interp.judging.grading import make_oracle
from interp.judging.prompts import get_template, render
from interp.judging.verdict import verdict_replies
from interp.methods.pairs import PatchPair, build_pairs
from interp.methods.patch_sweeps import agreement, head_units, resid_units, sweep
from interp.methods.patching import Patcher
from interp.methods.transfer import HardNegativeSettings, mine_hard_negatives
from interp.models.loading import ModelHandle
from interp.stages.common import ok_records, stage_facts
from interp.stages.configs.patching import PatchingConfig
from interp.stages.patching_summary import format_summary, summarise
from interp.store.rundir import RunDir

__all__ = ["Miner", "PatchingConfig", "format_summary", "gap_signature", "run", "run_pair"]

SPEC = stage_of(__name__)
"""This stage's declared contract (:data:`interp.core.contract.SPECS`)."""


# ---------------------------------------------------------------------------------------------
# Hard negatives mined on the fly (step 2)
# ---------------------------------------------------------------------------------------------


class Miner:
    """Closed-book hard negatives for candidate-swap pairs, mined once per record and stored.

    Calls :func:`interp.methods.transfer.mine_hard_negatives` on one record at a time (without the
    answer-rotation fallback), seeded with ``seed`` plus a stable hash of the record id, and
    keeps each result in ``path`` (JSON lines) under a signature of the model, oracle and
    settings, so a later call reads it back instead of sampling again.

    Args:
        handle: the model asked without the context.
        oracle: grades the sampled answers.
        cfg: the ``hard_negative_*`` settings and ``seed``.
        path: the store (``DIR/patching/hard_negatives.jsonl``).
        templates_path: the run's template file.
        log: progress lines.
    """

    def __init__(self, handle: ModelHandle, oracle: Any, cfg: PatchingConfig, path: Path,
                 templates_path: str | None, log: Callable[[str], None] = print,
                 template: Any = None):
        self.handle, self.oracle, self.cfg, self.path, self.log = handle, oracle, cfg, path, log
        self.templates_path, self.template = templates_path, template
        # equal_length enters the signature only when set, so stores mined without it stay
        equal = {"equal_length": True} if cfg.equal_length else {}
        self.sig = signature({"model": handle.spec, "sha256": handle.info.get("sha256"),
                              "oracle": getattr(oracle, "name", "?"), "templates_path":
                              templates_path, **{k: v for k, v in asdict(cfg).items()
                                                 if k.startswith("hard_negative") or
                                                 k == "seed"}, **equal})
        self.rows = {(r["dataset"], r["id"]): r for r in
                     (read_jsonl(path) if path.exists() else []) if r.get("signature") == self.sig}

    def __call__(self, rec: Mapping[str, Any]) -> list[str]:
        """The record's closed-book hard negatives (0 or 1), graded Incorrect by the oracle."""
        key = (rec["dataset"], str(rec["id"]))
        if key not in self.rows:
            h = int(hashlib.sha1(key[1].encode()).hexdigest()[:6], 16)
            c = self.cfg
            settings = HardNegativeSettings.from_config(
                c, seed=c.seed * 7919 + h, batch_size=1, templates_path=self.templates_path)
            ex = QAExample(id=key[1], dataset=key[0], context=rec["context"],
                           question=rec["question"], answers=tuple(rec["answers"]),
                           answerable=True, split=rec.get("split", "validation"))
            row = mine_hard_negatives(self.handle, [ex], self.oracle, settings,
                                      rotation=False, prefer=self._prefer(rec),
                                      log=lambda s: None)[0]
            row["signature"] = self.sig
            self.rows[key] = row
            write_jsonl(self.path, list(self.rows.values()))
            self.log(f"[hard negatives] {key[0]} {key[1]}: "
                     f"{row['hard_negative']!r} after {len(row['attempts'])} attempts")
        hn = self.rows[key].get("hard_negative")
        return [hn] if hn else []

    def _prefer(self, rec: Mapping[str, Any]) -> Callable[[int, str], bool] | None:
        """With ``equal_length``: an answer whose judge prompt is as long as the gold's."""
        if not self.cfg.equal_length or self.template is None or not rec.get("answers"):
            return None
        gold = rec["answers"][0]
        kw = {"context": rec["context"], "question": rec["question"], "reference": gold}
        n = len(render(self.handle.tokenizer, self.template, "eval", answer=gold, **kw))
        return lambda _k, ans: len(render(self.handle.tokenizer, self.template, "eval",
                                          answer=ans, **kw)) == n


# ---------------------------------------------------------------------------------------------
# One pair
# ---------------------------------------------------------------------------------------------


def _context_mass(handle: ModelHandle, ids: Sequence[int], span: tuple[int, int] | None,
                  band: Sequence[int]) -> float:
    """The prompt's last-row attention mass on its context (mean over heads and band)."""
    if not span:
        return float("nan")

    return float(context_mass(record_rows(handle, list(ids)).rows, band, span))


def _pair_meta(pair: PatchPair, pt: Patcher, handle: ModelHandle, band: Sequence[int],
               masses: dict[str, float]) -> dict[str, Any]:
    sc = pt.scores()
    for w, p in (("clean", pair.clean), ("corrupt", pair.corrupt)):
        if w not in masses:
            masses[w] = _context_mass(handle, p.input_ids, p.token_spans.get("context"), band)
    return {"id": pair.record_id, "dataset": pair.dataset, "pair": pair.kind,
            "passage": pair.passage, "n_clean": len(pair.clean), "n_tokens": len(pair.corrupt),
            "start": pair.start, "middle": list(pair.middle),
            "clean_answer": pair.clean_answer, "corrupt_answer": pair.corrupt_answer,
            "corrupt_source": pair.corrupt_source,
            **{f"{w}_{k}": v for w in ("clean", "corrupt") for k, v in
               (("ld", sc[w]["logit_diff"]), ("p_correct", sc[w]["p_correct"]),
                ("coverage", sc[w]["verdict_coverage"]))},
            "gap": sc["clean"]["logit_diff"] - sc["corrupt"]["logit_diff"],
            "clean_context_mass": masses["clean"], "corrupt_context_mass": masses["corrupt"],
            "clean_forward_s": pt.clean_forward_s}


def run_pair(handle: ModelHandle, pair: PatchPair, kind: str, cfg: PatchingConfig,
             layers: Sequence[int], band: Sequence[int],
             progress: Callable[[int, int], None] | None = None,
             masses: dict[str, float] | None = None) -> dict[str, Any]:
    """All rows of one pair for one sweep kind (module docstring, step 3).

    Args:
        handle: the model.
        pair: the pair.
        kind: ``resid``, ``heads`` or ``attribution``.
        cfg: hook, per-position, exact mode, ``top_k``, batch size, prefix cache.
        layers: layers to sweep.
        band: layers of the context attention mass.
        progress: called with ``(rows done, rows in all)`` after each batch of patched rows.
        masses: the pair's clean and corrupt context masses when already measured (filled
            otherwise; the stage keeps them across sweep kinds).

    Returns:
        ``{"meta": {...}, "rows": [...]}``: ``meta`` holds the pair's clean and corrupt verdict
        scores, the gap, the context masses, wall times and costs in clean forwards
        (``attribution``: also ``agreement`` per sweep,
        :func:`interp.methods.patch_sweeps.agreement`);
        ``rows`` one per unit (:func:`interp.methods.patch_sweeps.sweep`).
    """
    pt = Patcher(handle, pair.clean.input_ids, pair.corrupt.input_ids, pos_map=pair.pos_map,
                 batch_size=cfg.batch_size, prefix_cache=cfg.prefix_cache)
    pt.ensure_clean([])
    meta = _pair_meta(pair, pt, handle, band, {} if masses is None else masses)
    per_pos = cfg.per_position and pair.kind != "system-prompt-control"
    units = {"resid": lambda: resid_units(pair, layers, per_position=per_pos),
             "heads": lambda: head_units(pair, layers, handle.n_heads)}
    kw = {"resid_hook": cfg.hook, "top_k": cfg.top_k, "band": band, "progress": progress,
          "context_span": pair.corrupt.token_spans.get("context")}
    if kind == "attribution":
        rows, info, agree = [], {"attr_wall_s": 0.0, "exact_wall_s": 0.0, "n_exact": 0}, {}
        for sub in ("resid", "heads"):
            r, i = sweep(pt, pair, units[sub](), exact="both", **kw)
            rows += r
            agree[sub] = agreement(r, cfg.top_k)
            agree[sub]["attr_cost_ratio"] = i["attr_wall_s"] / pt.clean_forward_s
            agree[sub]["exact_cost_ratio"] = i["exact_wall_s"] / pt.clean_forward_s
            agree[sub]["n_units"] = i["n_units"]
            for k in ("attr_wall_s", "exact_wall_s", "n_exact"):
                info[k] += i[k]
        meta["agreement"] = agree
    else:
        rows, info = sweep(pt, pair, units[kind](), exact=cfg.exact, **kw)
    meta.update(info)
    meta["wall_s"] = info["attr_wall_s"] + info["exact_wall_s"]
    meta["cost_ratio"] = meta["wall_s"] / pt.clean_forward_s
    return {"meta": meta, "rows": rows}


def part_signature(cfg: PatchingConfig, kind: str, layers: Sequence[int], band: Sequence[int],
                   handle: ModelHandle, pair: PatchPair,
                   facts: Mapping[str, Any] | None = None) -> str:
    """Signature of one pair's sweep: everything that shapes it (module docstring, step 3).

    ``facts``: :func:`interp.models.loading.result_facts` of the call.
    """
    return signature({"model": handle.spec, "sha256": handle.info.get("sha256"), "kind": kind,
                      "layers": list(layers), "band": list(band), "hook": cfg.hook,
                      "per_position": cfg.per_position, "exact": cfg.exact, "top_k": cfg.top_k,
                      "clean": pair.clean.input_ids, "corrupt": pair.corrupt.input_ids,
                      "pos_map": pair.pos_map, "metric": "whole-reply verdict score",
                      "runtime": facts})


# ---------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------


def _bar(total: int | None, desc: str, enabled: bool, **kw: Any) -> Any:
    """A progress bar of the stage (``enabled`` False: silent)."""
    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, **kw)


def _sweep_kind(handle: ModelHandle, cfg: PatchingConfig, pk: str, kind: str,
                pairs: list[PatchPair], layers: list[int], band: list[int], run_root: Path,
                masses: dict[str, dict[str, float]], log: Callable[[str], None],
                facts: Mapping[str, Any] | None = None) -> list[dict]:
    """Every pair's sweep of one kind: fresh parts read back, the others run and written.

    A pair's part is the stage contract's (:data:`SPEC`), under ``run_root``.
    """
    results = []
    with _bar(len(pairs), f"{pk}/{kind} pairs", cfg.progress, unit="pair") as bar:
        for pair in pairs:
            f = SPEC.parts[0].path(run_root, pair.dataset, pair.record_id, pairs=pk, kind=kind)
            sig = part_signature(cfg, kind, layers, band, handle, pair, facts)
            if is_fresh(f, sig):
                res = read_json(f)
                resumed(bar)
            else:
                if f.exists():
                    log(f"[{pk}/{kind}] {pair.key}: stored sweep used other settings; redone")
                with _bar(None, f"  {pair.key} rows", cfg.progress, unit="row") as rb:
                    def progress(k: int, total: int, rb: Any = rb) -> None:
                        if rb.total != total:
                            rb.total = total
                            rb.refresh()
                        rb.update(k)
                    res = run_pair(handle, pair, kind, cfg, layers, band, progress=progress,
                                   masses=masses.setdefault(pair.key, {}))
                res["meta"]["signature"] = sig
                write_json(f, res)
                m = res["meta"]
                log(f"[{pk}/{kind}] {pair.dataset} {pair.record_id}: LD clean "
                    f"{m['clean_ld']:+.2f}, corrupt {m['corrupt_ld']:+.2f} (gap {m['gap']:+.2f}"
                    f" nats), {m['n_exact']} exact rows, {m['wall_s']:.1f} s = "
                    f"{m['cost_ratio']:.0f} clean forwards")
                bar.update(1)
            results.append(res)
    return results


def gap_signature(handle: ModelHandle, pair: PatchPair,
                  facts: Mapping[str, Any] | None = None) -> str:
    """Signature of a pair's gap: the model, the pair's token ids and position map, the facts.

    What ``LD_clean - LD_corrupt`` depends on (not the sweep's settings), so a gap stored in
    ``DIR/patching/{pairs}/gaps.jsonl`` serves every sweep kind, layer range and ``min_gap``.
    """
    return signature({"model": handle.spec, "sha256": handle.info.get("sha256"),
                      "clean": pair.clean.input_ids, "corrupt": pair.corrupt.input_ids,
                      "pos_map": pair.pos_map, "metric": "whole-reply verdict score",
                      "runtime": facts})


def _fits_then(handle: ModelHandle, accept: Callable[[PatchPair], dict[str, Any] | None] | None,
               reply: int) -> Callable[[PatchPair], dict[str, Any] | None]:
    """The positions rule, then ``accept`` (the gap filter, or None).

    A pair whose longer prompt, with the verdict reply's tokens, exceeds the model's positions
    (:meth:`interp.models.loading.ModelHandle.overflow`) is skipped with reason ``too_long``
    before anything runs on it.
    """
    def check(pair: PatchPair) -> dict[str, Any] | None:
        n = max(len(pair.clean), len(pair.corrupt))
        if why := handle.overflow(n, reply, what="patching prompt", new="for the verdict reply"):
            return {"reason": "too_long", "message": why}
        return accept(pair) if accept is not None else None
    return check


def _gap_filter(handle: ModelHandle, cfg: PatchingConfig, pk: str, layers: list[int],
                band: list[int], run_root: Path, facts: Mapping[str, Any] | None,
                ) -> Callable[[PatchPair], dict[str, Any] | None]:
    """``limit_kept``'s test of a built pair: None keeps it, a skip entry leaves it out.

    The gap ``LD_clean - LD_corrupt`` (nats) is read from a fresh stored sweep of the pair
    (any of ``cfg.kinds``), else from ``DIR/patching/{pk}/gaps.jsonl`` when its entry's
    :func:`gap_signature` is the pair's, else scored with the pair's clean and corrupt
    forwards and added to that file (rewritten whole, atomically, after each pair: a rerun
    scores no pair twice, kept or skipped).
    """
    path = Path(run_root) / SPEC.folder / pk / "gaps.jsonl"
    stored = {(e["dataset"], e["id"]): e for e in read_jsonl(path)} if path.exists() else {}

    def accept(pair: PatchPair) -> dict[str, Any] | None:
        gap = None
        for kind in cfg.kinds:
            f = SPEC.parts[0].path(run_root, pair.dataset, pair.record_id, pairs=pk, kind=kind)
            if is_fresh(f, part_signature(cfg, kind, layers, band, handle, pair, facts)):
                gap = float(read_json(f)["meta"]["gap"])
                break
        sig = gap_signature(handle, pair, facts) if gap is None else None
        if gap is None and (e := stored.get((pair.dataset, pair.record_id))) and \
                e.get("signature") == sig:
            gap = float(e["gap"])
        if gap is None:
            # scored as the sweep scores it (the corrupt run through the prefix cache), so a
            # pair's gap is the same number whether it was kept or left out
            pt = Patcher(handle, pair.clean.input_ids, pair.corrupt.input_ids,
                         pos_map=pair.pos_map, batch_size=cfg.batch_size)
            pt.ensure_clean([])
            gap = pt.clean_ld - pt.corrupt_ld
            stored[(pair.dataset, pair.record_id)] = {
                "dataset": pair.dataset, "id": pair.record_id, "gap": gap,
                "clean_ld": pt.clean_ld, "corrupt_ld": pt.corrupt_ld, "signature": sig}
            write_jsonl(path, stored.values())
        if abs(gap) >= cfg.min_gap:
            return None
        return {"reason": "small_gap", "gap": gap,
                "message": f"|gap| {abs(gap):.2f} < min_gap {cfg.min_gap} nats (clean - corrupt "
                           f"{gap:+.2f}); not swept"}
    return accept


def _oracle(cfg: PatchingConfig, mcfg: Mapping[str, Any], handle: ModelHandle) -> Any:
    return make_oracle(cfg.oracle or mcfg.get("oracle") or "rule", device=str(handle.device),
                       dtype=mcfg.get("dtype"), run_model=handle)


def run(run_dir: RunDir | str | Path, handle: ModelHandle, cfg: PatchingConfig, *,
        overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every (pair kind, sweep kind) of ``cfg`` on a run's records (module docstring).

    ``overwrite``: redo parts computed under other result-relevant runtime facts (else they
    are refused).

    Returns:
        ``{"{pairs}/{kind}": summary}`` of this call (also merged into
        ``DIR/patching/summary.json``).

    Raises:
        StageError: bad config values (unknown kinds).
        LayerSpecError: layers or band out of range.
        RunDirError: the run has no manifest or no records, or parts computed under other
            runtime facts and not ``overwrite``.
    """
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    cfg.validate()
    layers = cfg.layer_list(handle.n_layers)
    band = parse_layers(cfg.band, handle.n_layers)
    manifest, records = ok_records(run_dir, handle, None, stage=SPEC.name)
    facts = stage_facts(run_dir, handle, SPEC.name, overwrite=overwrite)
    mcfg = manifest.get("config", {})
    template = get_template(mcfg.get("template", "default"), mcfg.get("templates_path"))
    root = run_dir.sub(SPEC.folder)
    oracle = _oracle(cfg, mcfg, handle) if "candidate-swap" in cfg.pairs else None
    miner = Miner(handle, oracle, cfg, root / "hard_negatives.jsonl",
                  mcfg.get("templates_path"), log, template) if cfg.mine and oracle else None
    summary: dict[str, Any] = {}
    for pk in cfg.pairs:
        masses: dict[str, dict[str, float]] = {}   # pair -> context masses, across kinds
        reply = max(map(len, verdict_replies(handle.tokenizer).ids))
        gap = (_gap_filter(handle, cfg, pk, layers, band, run_dir.path, facts)
               if cfg.limit_kept else None)
        pairs, skipped = build_pairs(records, pk, template, handle.tokenizer, oracle=oracle,
                                     mine=miner, limit=cfg.limit, max_tokens=cfg.max_tokens,
                                     equal_length=cfg.equal_length,
                                     accept=_fits_then(handle, gap, reply), log=log)
        if long := [x for x in skipped if x["reason"] == "too_long" and "positions" in
                    x["message"]]:
            log(f"[patching] {len(long)} {pk} pairs skipped: longer than the model's "
                f"{handle.max_positions} positions (first: {long[0]['message']})")
        for kind in cfg.kinds:
            d = root / pk / kind
            t0 = time.perf_counter()
            results = _sweep_kind(handle, cfg, pk, kind, pairs, layers, band, run_dir.path,
                                  masses, log, facts)
            s = summarise(d, pk, kind, results, skipped, layers, band, handle.spec, cfg)
            s["elapsed_s"] = time.perf_counter() - t0
            if not write_result(d / "summary.json", s, n=len(results), log=log):
                continue  # no pair was built: the existing summary and figures stay
            summary[f"{pk}/{kind}"] = s
            # gathered as each kind ends: an interrupted call keeps what it finished
            old = read_json(root / "summary.json") if (root / "summary.json").exists() else {}
            write_json(root / "summary.json", {**old, f"{pk}/{kind}": s})
            if cfg.figures:
                _figures(d, run_dir, f"[{pk}/{kind}]", log)
    return summary


def _figures(d: Path, run_dir: RunDir, tag: str, log: Callable[[str], None]) -> None:
    try:
        from interp.plots.patching import plot_patching

        plot_patching(d, run_dir.sub("figures"))
    except Exception as err:  # noqa: BLE001 - figures never block the tables
        log(f"{tag} figure failed: {err}")
