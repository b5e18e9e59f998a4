"""Which judge separates right from wrong answers: judge templates on the findings records.

For one model of the findings study (its restored run directory, ``runs/findings/<model>``),
the first ``--limit`` SQuAD 2.0 validation records are judged again (judge-only reruns,
:func:`interp.methods.asymmetry.judge_records`: same answers, same oracle labels) with each
``--templates`` variant, on two sets:

* ``own``: the model's own answers (the default template's are the stored records);
* ``balanced``: each record's gold answer and one wrong answer (its mined hard negative, else
  its own wrong answer; :func:`interp.methods.balanced.balanced_candidates`).

The summary gives, per template and set, the AUC of ``logit_diff`` against the label and the
balanced accuracy, with 95% passage-cluster bootstrap intervals
(:func:`interp.methods.balanced.compute_balanced`), and whether each AUC's interval excludes
0.5; the balanced set also per kind of wrong answer (``by_negative_source``: the pairs whose
wrong answer is a hard negative, and those whose wrong answer is the model's own).

Resumable: judged records are appended per chunk to ``OUT/<model>__<template>__<set>.jsonl``
and a rerun judges only the rest; ``--summary-only`` summarises what is stored, and
the summary's ``partial`` names each set judged only in part (the candidates judged)::

    python -m experiments.judge_templates RUNS_FINDINGS MODEL OUT [--limit 150]
        [--templates default,fewshot] [--chunk 8]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

SETS = ("own", "balanced")


def _negatives(run: Path) -> dict[tuple[str, str], str]:
    from interp.core.io import read_jsonl

    store = run / "patching" / "hard_negatives.jsonl"
    return {(r["dataset"], str(r["id"])): r["hard_negative"]
            for r in (read_jsonl(store) if store.is_file() else []) if r.get("hard_negative")}


def _candidates(run: Path, limit: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from interp.core.io import read_jsonl
    from interp.methods.balanced import balanced_candidates

    recs = [r for r in read_jsonl(run / "records.jsonl")
            if r.get("status") == "ok" and r["dataset"] == "squad_v2"][:limit]
    cands, counts = balanced_candidates(recs, _negatives(run))
    return recs, {"records": cands, "counts": counts}


def summarize(out: Path, model: str, templates: list[str], own: list[dict[str, Any]],
              counts: dict[str, Any]) -> dict[str, Any]:
    """The per-template, per-set metrics of the candidates judged."""
    from interp.core.io import read_jsonl
    from interp.methods.balanced import compute_balanced

    res: dict[str, Any] = {"model": model, "dataset": "squad_v2", "n_records": len(own),
                           "balanced_counts": counts, "templates": {}}
    for t in templates:
        for s in SETS:
            path = out / f"{model}__{t}__{s}.jsonl"
            rows = own if (t == "default" and s == "own") else (
                read_jsonl(path) if path.exists() else [])
            if not rows:
                continue
            g = compute_balanced(rows)["overall"]
            if s == "balanced":   # per kind of wrong answer: a hard negative or its own
                g["by_negative_source"] = {
                    src: compute_balanced([r for r in rows if r.get("negative_source") == src]
                                          )["overall"]
                    for src in sorted({r.get("negative_source") for r in rows} - {None})}
            ci = g.get("auc_logit_diff_ci")
            g["auc_excludes_chance"] = (None if ci is None else
                                        "above" if ci[0] > 0.5 else "below" if ci[1] < 0.5
                                        else False)
            res["templates"].setdefault(t, {})[s] = g
    return res


def main(argv: list[str] | None = None) -> None:
    """Judge, resumably, then write ``OUT/<model>__judge_templates.json``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="runs/findings (the restored findings state)")
    ap.add_argument("model", help="model slug, e.g. smollm2-135m-instruct")
    ap.add_argument("out", type=Path)
    ap.add_argument("--limit", type=int, default=150)
    ap.add_argument("--templates", default="default,fewshot")
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--summary-only", action="store_true",
                    help="judge nothing: summarise what is stored (a partial run says so)")
    a = ap.parse_args(argv)
    run = a.run / a.model
    if not (run / "records.jsonl").is_file():
        raise SystemExit(f"error: {run}/records.jsonl does not exist (restore the findings "
                         f"state first)")
    from interp.judging.prompts import get_template

    templates = a.templates.split(",")
    tmpl = {t: get_template(t) for t in templates}   # an unknown name fails here, early
    own, bal = _candidates(run, a.limit)
    a.out.mkdir(parents=True, exist_ok=True)
    # own answers first (one pass per record), then the balanced set (two)
    jobs = [(t, s) for s in SETS for t in templates if not (t == "default" and s == "own")]
    jobs = [] if a.summary_only else jobs
    handle = None
    for t, s in jobs:
        rows = own if s == "own" else bal["records"]
        path = a.out / f"{a.model}__{t}__{s}.jsonl"
        key = lambda r: (r["id"], r.get("balanced_role", ""))  # noqa: E731
        done = {key(r) for r in map(json.loads, path.read_text().splitlines())} \
            if path.exists() else set()
        todo = [r for r in rows if key(r) not in done]
        if not todo:
            continue
        if handle is None:
            from interp.models.loading import load_model

            handle = load_model(rows[0]["model"])
        from interp.methods.asymmetry import judge_records

        t0, n0 = time.time(), len(todo)
        for i in range(0, len(todo), a.chunk):
            part = todo[i:i + a.chunk]
            judged, _ = judge_records(handle, part, template=tmpl[t],
                                      batch_size=a.batch_size)
            with path.open("a") as f:
                for src, r in zip(part, judged):
                    r = {k: v for k, v in r.items() if k != "prompts"}
                    r.update({k: src[k] for k in ("balanced_role", "negative_source")
                              if k in src})
                    f.write(json.dumps(r) + "\n")
                f.flush()
            left = n0 - i - len(part)
            rate = (time.time() - t0) / (i + len(part))
            print(f"[{a.model} {t} {s}] {i + len(part)}/{n0}, {rate:.1f} s each, "
                  f"ETA {left * rate / 60:.1f} min", flush=True)
    res = summarize(a.out, a.model, templates, own, bal["counts"])
    res["command"] = ("python -m experiments.judge_templates runs/findings " + a.model +
                      f" OUT --limit {a.limit} --templates {a.templates}")
    res["partial"] = {f"{t}/{s}": g["n"] for t, ss in res["templates"].items()
                      for s, g in ss.items()
                      if g["n"] < (len(own) if s == "own" else 2 * bal["counts"]["n_pairs"])}
    (a.out / f"{a.model}__judge_templates.json").write_text(json.dumps(res, indent=1) + "\n")
    for t, sets in res["templates"].items():
        for s, g in sets.items():
            print(f"{a.model} {t:>8} {s:>8}: n={g['n']} p={g['n_passages']} AUC "
                  f"{g['auc_logit_diff']:.3f} {g['auc_logit_diff_ci']} BA "
                  f"{g['balanced_accuracy']} acc right {g['acceptance_right']} wrong "
                  f"{g['acceptance_wrong']}")


if __name__ == "__main__":
    main()
