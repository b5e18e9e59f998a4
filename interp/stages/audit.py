"""Audit stage: did the judge read? Per-verdict attention signals, AUCs, a detector, flags.

Algorithm of :func:`run` (the method is :mod:`interp.methods.audit`):

1. Recordings: the attention stage's own recorder (:func:`interp.stages.stored.record_attention`)
   makes sure every selected ok record has a fresh recording of the verdict position's span
   masses (none is made again when the harness's one pass or ``interp attention`` made it).
2. :func:`write_audit` (no model): the masses (:func:`interp.stages.stored.load_masses`),
   the signals, their AUCs for wrong verdicts per dataset and overall, the detector and the
   flags at ``fpr`` (:mod:`interp.methods.audit`, steps 2-6); writes ``DIR/audit/summary.json``,
   ``DIR/audit/verdicts.csv`` (every verdict: id, dataset, question, candidate, verdict,
   oracle label, wrong, context and candidate mass, Lookback ratio, logit_diff, detector
   score, flagged; also ``.parquet``), the flagged ones as ``flagged.csv`` and ``flagged.md``
   (a Markdown table, cells cut to 80 characters) and
   ``DIR/figures/audit_roc.png``.

A judge dataset this project did not make (:func:`judged_run`): a JSONL file with, per line,
``context``, ``question``, ``candidate``, ``label`` (the candidate's truth) and optionally
``verdict`` (the judge's; else the loaded model's own), ``id``, ``dataset``, ``answers``
(gold answers), ``answer_model``. The loaded model is the judge: it judges every line with the
one harness call of given answers (:func:`interp.methods.cross_judge.judge_answers`, same template
machinery, one pass recording the attention), into a run directory the audit then reads.

Source: ``docs/audit.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from interp.core.contract import spec, stage_of
from interp.core.errors import DataError
from interp.core.io import atomic_write_text, read_jsonl, write_json, write_table
from interp.core.layers import parse_layers
from interp.core.names import in_dataset_order
from interp.data import QAExample
from interp.judging.prefill import Capture
from interp.judging.prompts import get_template
from interp.judging.residual_features import POOLS
from interp.methods import audit as method
from interp.methods.cross_judge import GivenAnswer, judge_answers
from interp.models.loading import ModelHandle, result_facts, runtime_facts
from interp.plots.cross import plot_audit_roc
from interp.stages.common import stage_facts
from interp.stages.configs.audit import AuditConfig
from interp.stages.run_metrics import write_metrics
from interp.stages.stored import load_masses, record_attention, store_one_pass
from interp.store import RunDir
from interp.store.records import qa_key

__all__ = ["SPEC", "AuditConfig", "format_summary", "judged_run", "read_judged", "run",
           "write_audit"]

SPEC = stage_of(__name__)
"""This stage's declared contract (:data:`interp.core.contract.SPECS`)."""


def run(run_dir: RunDir, handle: ModelHandle, cfg: AuditConfig | None = None, *,
        overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Audit the verdicts of a judged run (module docstring); return ``audit/summary.json``.

    Raises:
        interp.core.errors.RunDirError: as :func:`interp.stages.stored.record_attention` (no
        records,
            another model, prompts that do not match their records).
        interp.core.errors.LayerSpecError: a band or detector layers outside the model.
    """
    cfg = cfg or AuditConfig()
    record_attention(run_dir, handle, spec("attention").config_class(
        band=cfg.band, limit=cfg.limit), overwrite=overwrite, log=log)
    return write_audit(run_dir, cfg, log=log)


def write_audit(run: RunDir, cfg: AuditConfig | None = None, *,
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """Step 2: the audit from stored recordings (no model); the files of the module docstring.

    Raises:
        interp.core.errors.RunDirError: no recordings (run ``interp attention``).
    """
    cfg = cfg or AuditConfig()
    records, mass, spans, backends = load_masses(run, limit=cfg.limit)
    ev = mass["eval"]
    n_layers = ev.shape[1]
    band = parse_layers(cfg.band, n_layers)
    det_layers = parse_layers(cfg.detector_layers, n_layers, default="all")
    wrong = method.wrong_verdicts(records)
    signals = method.verdict_signals(records, ev, spans, band)
    det = method.detector(method.head_features(records, ev, spans, det_layers,
                                               cfg.detector_features),
                          wrong, records, folds=cfg.folds, seed=cfg.seed, C=cfg.C)
    oriented = {k: method.ORIENTATION[k] * v for k, v in signals.items()}
    if det["possible"]:
        oriented["detector"] = det["oof"]
    aucs = method.signal_aucs(records, signals, wrong, n_boot=cfg.n_boot, seed=cfg.seed,
                              extra={"detector": det["oof"]} if det["possible"] else None)
    flags = {k: method.flag_at_fpr(s, wrong, cfg.fpr) for k, s in oriented.items()}
    flag_by = "detector" if det["possible"] else "context_mass"
    flagged = flags[flag_by]["flagged"]
    every = _verdict_table(records, signals, det.get("oof"), flagged, wrong)
    table = every[every.flagged].drop(columns="flagged")
    out = run.sub("audit")
    write_table(every, out / "verdicts.parquet")
    write_table(table, out / "flagged.parquet")
    atomic_write_text(out / "flagged.md", _markdown(table) + "\n")
    manifest = run.manifest()
    summary = {
        "run": str(run.path), "judge": manifest.get("model", {}).get("spec"),
        "answers_from": manifest.get("config", {}).get("answers_from"),
        "judged_file": manifest.get("config", {}).get("judged"),
        "n": len(records), "n_wrong": int(wrong.sum()), "n_right": int((~wrong).sum()),
        "n_unparseable": int(sum(r.get("verdict") is None for r in records)),
        "class_balance": f"{int(wrong.sum())} wrong / {int((~wrong).sum())} right verdicts",
        "band": band, "detector_layers": det_layers, "spans": spans, "backends": backends,
        "config": asdict(cfg), "definitions": method.DEFINITIONS,
        **aucs,
        "detector": {k: v for k, v in det.items() if k != "oof"},
        "flags": {k: {kk: vv for kk, vv in f.items() if kk != "flagged"}
                  for k, f in flags.items()},
        "flagged_by": flag_by, "n_flagged": int(flagged.sum()),
        "given_verdicts": _given_agreement(records),
        "causal_note": "attention-error correlations are not causes: the steering study "
                       "(interp steer) is the causal test",
    }
    write_json(out / "summary.json", summary)
    if cfg.figures:
        curves = {k: {**method.roc_points(wrong, s),
                      **{kk: aucs["overall"]["signals"][k][kk] for kk in ("auc", "ci")}}
                  for k, s in oriented.items()}
        plot_audit_roc(curves, run.sub("figures"),
                       title=f"{_short(summary['judge'])}: {summary['n']} verdicts, "
                             f"{summary['n_wrong']} wrong, "
                             f"{aucs['overall']['n_passages']} passages")
    log(f"[audit] wrote {out / 'summary.json'}, {out / 'flagged.md'} ({int(flagged.sum())} "
        f"flagged by {flag_by} at FPR {cfg.fpr})")
    return summary


def _short(spec: Any) -> str:
    return Path(str(spec)).name


def _given_agreement(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """How often the loaded model's own verdict equals a judged file's given verdict."""
    pairs = [(r["verdict"], r.get("judge_verdict")) for r in records
             if r.get("verdict_source") == "given"]
    if not pairs:
        return None
    return {"n": len(pairs), "agree": int(sum(a == b for a, b in pairs)),
            "note": "verdicts come from the file; the attention and logit_diff are the "
                    "loaded model's, whose own verdict agrees this often"}


def _verdict_word(v: Any) -> str:
    return "Correct" if v is True else "Incorrect" if v is False else "(none)"


def _verdict_table(records: Sequence[Mapping[str, Any]], signals: Mapping[str, np.ndarray],
                   oof: np.ndarray | None, flagged: np.ndarray, wrong: np.ndarray
                   ) -> pd.DataFrame:
    """Every verdict with its signals and flag, highest detector score first."""
    rows = []
    for i, r in enumerate(records):
        rows.append({"id": str(r["id"]), "dataset": r["dataset"], "question": r["question"],
                     "candidate": r.get("answer", ""), "verdict": _verdict_word(r.get("verdict")),
                     "oracle_label": "Correct" if r["oracle_label"] else "Incorrect",
                     "wrong": bool(wrong[i]),
                     "context_mass": float(signals["context_mass"][i]),
                     "candidate_mass": float(signals["candidate_mass"][i]),
                     "lookback_ratio": float(signals["lookback_ratio"][i]),
                     "logit_diff": round(float(signals["logit_diff"][i]), 3),
                     "detector_score": None if oof is None else round(float(oof[i]), 3),
                     "flagged": bool(flagged[i])})
    cols = ["id", "dataset", "question", "candidate", "verdict", "oracle_label", "wrong",
            "context_mass", "candidate_mass", "lookback_ratio", "logit_diff", "detector_score",
            "flagged"]
    df = pd.DataFrame(rows, columns=cols)
    return df.sort_values("detector_score", ascending=False, na_position="last",
                          kind="stable") if len(df) else df


def _markdown(df: pd.DataFrame) -> str:
    """A Markdown table of ``df`` (floats to 3 places, cells cut to 80 characters)."""
    def cell(v: Any) -> str:
        s = f"{v:.3f}" if isinstance(v, float) else str(v)
        s = s.replace("|", "\\|").replace("\n", " ")
        return s if len(s) <= 80 else s[:77] + "..."

    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(
        index=False)]
    return "\n".join(lines) if len(df) else "no verdict flagged"


# ---------------------------------------------------------------------------------------------
# A judge dataset from elsewhere
# ---------------------------------------------------------------------------------------------


def _bool(v: Any, what: str) -> bool | None:
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int | float) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("correct", "incorrect", "true", "false"):
        return v.strip().lower() in ("correct", "true")
    raise DataError(f"{what} must be true/false, 0/1 or Correct/Incorrect, not {v!r}")


def read_judged(path: str | Path) -> list[tuple[QAExample, Any, bool | None]]:
    """Read a judged JSONL file (module docstring) before any model loads.

    Returns:
        Per line ``(example, GivenAnswer, given verdict or None)``.

    Raises:
        DataError: a missing file, a line without ``context`` / ``question`` / ``candidate``
            / ``label``, a label or verdict that is not a truth value, or a repeated id (the
            message names the line).
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"--judged {path}: no such file")
    out, seen = [], set()
    for n, row in enumerate(read_jsonl(p), 1):
        where = f"{path} line {n}"
        if miss := [k for k in ("context", "question", "candidate", "label") if k not in row]:
            raise DataError(f"{where}: missing {miss} (each line needs context, question, "
                            f"candidate, label; verdict optional)")
        rid, ds = str(row.get("id", n)), str(row.get("dataset", p.stem))
        if (ds, rid) in seen:
            raise DataError(f"{where}: repeated id {ds}/{rid}")
        seen.add((ds, rid))
        answers = tuple(row.get("answers") or ())
        ex = QAExample(id=rid, dataset=ds, context=str(row["context"]),
                       question=str(row["question"]), answers=answers,
                       answerable=bool(answers), extras={"judged_file": str(p)})
        label = _bool(row["label"], f"{where}: label")
        given = GivenAnswer(answer=str(row["candidate"]), label=bool(label),
                            generation=str(row["candidate"]),
                            oracle={"name": "given", "em": 0.0, "f1": 0.0, "rule": "given"},
                            source={"model": str(row.get("answer_model", "unknown")),
                                    "run": str(p)})
        out.append((ex, given, _bool(row.get("verdict"), f"{where}: verdict")))
    if not out:
        raise DataError(f"--judged {path}: no lines")
    return out


def judged_run(path: str | Path, out: str | Path, handle: ModelHandle, *,
               template: str = "default", templates_path: str | None = None,
               batch_size: int = 8, verdict_max_new_tokens: int = 12, overwrite: bool = False,
               log: Callable[[str], None] = print) -> RunDir:
    """Judge a judged JSONL file's candidates with ``handle`` into the run directory ``out``.

    The loaded model judges every line (:func:`interp.methods.cross_judge.judge_answers`, one pass
    recording attention and probe features); the file's label is y*; a line's ``verdict``,
    when given, replaces the model's (kept as ``judge_verdict``; ``verdict_source`` "given").
    Lines already in ``out`` are kept (resume). ``metrics.json`` is written as for any run.

    Raises:
        DataError: as :func:`read_judged` (checked before any forward).
        interp.core.errors.RunDirError: ``out`` holds a run made from another file, model or
            template (and not ``overwrite``).
    """
    rows = read_judged(path)
    tpl = get_template(template, templates_path)
    rd = RunDir(out)
    facts = runtime_facts(handle)
    config = {"model": handle.spec, "judged": str(Path(path).resolve()), "template": template,
              "templates_path": templates_path, "oracle": "given",
              "verdict_max_new_tokens": verdict_max_new_tokens}
    rd.init_manifest(config, model_info=handle.info, overwrite=overwrite,
                     key_fields=tuple(config), runtime=facts, result_facts=result_facts(facts))
    sfacts = stage_facts(rd, handle, "attention", overwrite=overwrite)
    stage_facts(rd, handle, "probe", overwrite=overwrite)
    done = {qa_key(r) for r in rd.read_records(status=None)} if rd.records_path.exists() \
        else set()
    todo = [x for x in rows if (x[0].dataset, x[0].id) not in done]
    log(f"[audit] {path}: {len(rows)} judged lines, {len(rows) - len(todo)} already done")
    t0 = time.perf_counter()
    for s in range(0, len(todo), batch_size):
        part = todo[s:s + batch_size]
        cap = Capture(rows=True, pools=POOLS)
        recs = judge_answers(handle, [x[0] for x in part], [x[1] for x in part], template=tpl,
                             max_new_tokens=0, verdict_max_new_tokens=verdict_max_new_tokens,
                             batch_size=batch_size, capture=cap)
        for rec, (_, _, given) in zip(recs, part):
            rec["template"] = template
            if rec["status"] == "ok" and given is not None:
                rec["judge_verdict"] = rec["verdict"]
                rec["verdict"], rec["verdict_source"] = given, "given"
        store_one_pass(rd, handle, recs, cap, sfacts)
        rd.append_records(recs)
        done_n = s + len(part)
        rate = done_n / max(time.perf_counter() - t0, 1e-9)
        log(f"[audit] judged {done_n}/{len(todo)} (ETA {(len(todo) - done_n) / rate:.0f} s)")
    write_metrics(rd)
    return rd


def format_summary(summary: Mapping[str, Any]) -> str:
    """Per dataset and overall: n, wrong verdicts, each signal's AUC [CI]; the flags."""
    names = list(method.SIGNALS) + (["detector"] if summary["detector"].get("possible") else [])
    lines = [f"judge {summary['judge']}: {summary['class_balance']} "
             f"({summary['n_unparseable']} unparseable, counted wrong); AUC for a wrong verdict "
             f"[95% passage CI]"]
    groups = in_dataset_order(summary["per_dataset"]) + [("overall", summary["overall"])]
    for name, g in groups:
        cells = []
        for k in names:
            a = g["signals"].get(k, {})
            ci = a.get("ci")
            cells.append(f"{k} " + ("-" if a.get("auc") is None else f"{a['auc']:.2f}")
                         + (f" [{ci[0]:.2f},{ci[1]:.2f}]" if ci else ""))
        star = "*" if g.get("few_passages") else ""
        lines.append(f"  {name} (n {g['n']}, wrong {g['n_wrong']}, {g['n_passages']}{star} "
                     f"passages): " + "; ".join(cells))
    d = summary["detector"]
    if not d.get("possible"):
        lines.append(f"  detector: not fitted ({d.get('reason')})")
    f = summary["flags"][summary["flagged_by"]]
    tpr = "-" if f["tpr"] is None else f"{f['tpr']:.2f}"
    lines.append(f"  flagged by {summary['flagged_by']} at FPR {f['fpr_target']}: "
                 f"{f['n_flagged']} of {summary['n']} ({f['share_flagged']:.2f}); wrong "
                 f"verdicts caught {tpr}; table: audit/flagged.md")
    lines.append(f"  {summary['causal_note']}")
    return "\n".join(lines)
