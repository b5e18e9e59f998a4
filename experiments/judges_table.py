"""Every judge tried on the bundled models' SQuAD 2.0 records, side by side: which discriminates.

For one model of the findings study, one summary ``OUT/<model>__judges.json`` of rows, each a
judge on a set of SQuAD 2.0 candidates with its AUC (95% passage-cluster bootstrap interval),
balanced accuracy, acceptance of right and of wrong answers, candidates and passages, and
whether the AUC's interval excludes 0.5. Nothing is run through a model: every row is read
from a stored summary or computed from stored per-item scores.

* ``default`` / ``fewshot`` verdict judges (own answers, balanced set): the summary of
  :mod:`experiments.judge_templates` (``FIGS/judges/<model>__judge_templates.json``).
* ``matched template (its own run)``: the verdict judge under the ``matched`` template on
  its own run's records (``FIGS/matched/<model>__asymmetry_metrics.json``).
* ``LoRA-Eval (transfer stage)``: the findings study's adapter judging the base model's
  answers on its held-out records (``FIGS/<model>__transfer_table.json``), and the one
  trained longer on LoRA-Eval alone where its table is there
  (``FIGS/judges/<model>__lora_eval_converged_table.json``).
* ``pairwise, order-averaged``: the pairwise stage's stored letter scores of both orders
  (``VIEWS/<model>/pairwise/parts``), :func:`interp.methods.pairwise.order_averaged`, over
  all SQuAD 2.0 pairs and per pair source; beside it a control by construction, the share of
  the candidate's words found in the passage (reads no model: how far lexical overlap alone
  separates the same candidates). The same control on the verdict judges' balanced set
  (rebuilt from the restored run, no model).
* ``probe``: the probe stage's nested out-of-fold scores on the judge prompt's residual
  stream (``RUNS/<model>/probes/nested_eval.json``, each outer fold's probe, layer and pool
  chosen on its training records), on the SQuAD 2.0 records only; and, as the probe summary
  gives them, pooled over the four datasets and within datasets.

Usage::

    python -m experiments.judges_table RUNS_FINDINGS VIEWS FIGS OUT [--models a,b]
        [--n-boot 2000] [--markdown]

with the restored findings state (``runs/findings``, ``runs/findings_views``) and the
committed figures (``figures/findings``); ``--markdown`` prints each model's table.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

MODELS = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")
DATASET = "squad_v2"
_WORD = re.compile(r"\w+")


def excludes(ci: Sequence[float] | None) -> str | bool | None:
    """``"above"`` / ``"below"`` when a 95% interval lies on one side of 0.5, else False."""
    if ci is None:
        return None
    return "above" if ci[0] > 0.5 else "below" if ci[1] < 0.5 else False


def overlap(answer: str, context: str) -> float:
    """Share of the answer's lower-cased word tokens that occur in the context (0 if none)."""
    words = _WORD.findall(answer.lower())
    ctx = set(_WORD.findall(context.lower()))
    return sum(w in ctx for w in words) / len(words) if words else 0.0


def _row(judge: str, set_: str, reads: str, **kw: Any) -> dict[str, Any]:
    row = {"judge": judge, "set": set_, "reads": reads, **kw}
    row["auc_excludes_chance"] = excludes(row.get("auc_ci"))
    return row


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def template_rows(figs: Path, model: str) -> list[dict[str, Any]]:
    """The verdict judges of :mod:`experiments.judge_templates` (own answers, balanced set).

    The balanced set also per kind of wrong answer, where that part spans at least
    :data:`interp.analysis.stats.MIN_PASSAGES` passages.
    """
    from interp.analysis.stats import MIN_PASSAGES

    s = _read(figs / "judges" / f"{model}__judge_templates.json")
    if s is None:
        return []
    partial = s.get("partial") or {}
    rows = []
    for t, sets in s["templates"].items():
        for name, g in sets.items():
            part = " (partial)" if f"{t}/{name}" in partial else ""
            subs = [(name + part, g)] + [(f"{name}, {src} pairs{part}", sub) for src, sub in
                                         (g.get("by_negative_source") or {}).items()]
            for k, (label, x) in enumerate(subs):
                if x.get("auc_logit_diff") is None or (k and x["n_passages"] < MIN_PASSAGES):
                    continue   # a set's part by kind of wrong answer on too few passages
                rows.append(_row(
                    t, label, f"verdict score logit_diff, first {s['n_records']} records",
                    auc=x["auc_logit_diff"], auc_ci=x["auc_logit_diff_ci"],
                    balanced_accuracy=x["balanced_accuracy"],
                    balanced_accuracy_ci=x["balanced_accuracy_ci"],
                    acceptance_right=x["acceptance_right"],
                    acceptance_wrong=x["acceptance_wrong"],
                    no_verdict_share=x.get("no_verdict_share"), n=x["n"],
                    n_passages=x["n_passages"], source=f"judges/{model}__judge_templates.json"))
    return rows


def matched_rows(figs: Path, model: str) -> list[dict[str, Any]]:
    """The verdict judge under the ``matched`` template: its own run's SQuAD 2.0 records.

    Read from ``FIGS/matched/<model>__asymmetry_metrics.json`` (the findings study's
    ``experiments/findings_matched.toml``: the model's own answers, judged with the template
    that gives both prompts the same system prompt and framing); its own records, not the
    first records the other verdict rows judge.
    """
    name = f"matched/{model}__asymmetry_metrics.json"
    g = ((_read(figs / name) or {}).get("per_dataset") or {}).get(DATASET)
    if not g or g.get("auc_logit_diff") is None:
        return []
    return [_row("matched template (its own run)", "own answers",
                 "verdict score logit_diff, the matched run's records",
                 auc=g["auc_logit_diff"], auc_ci=g["auc_logit_diff_ci"],
                 balanced_accuracy=g["balanced_accuracy"],
                 balanced_accuracy_ci=g["balanced_accuracy_ci"],
                 acceptance_right=g["acceptance_rate_correct"],
                 acceptance_wrong=g["acceptance_rate_incorrect"],
                 no_verdict_share=1 - g["n_valid"] / g["n"], n=g["n"],
                 n_passages=g["n_passages"], source=name)]


LORA_TABLES = (("LoRA-Eval (transfer stage)", "{model}__transfer_table.json"),
               ("LoRA-Eval, longer training (transfer stage)",
                "judges/{model}__lora_eval_converged_table.json"))
"""The LoRA-Eval adapters read, each a transfer stage's ``table.json`` under ``FIGS``: the
findings study's, and the one trained longer on LoRA-Eval alone (docs/findings/judges.md,
"LoRA-Eval trained longer": its ``transfer/table.json`` copied there once finished)."""


def lora_rows(figs: Path, model: str) -> list[dict[str, Any]]:
    """Each LoRA-Eval adapter of :data:`LORA_TABLES` judging the base model's held-out answers."""
    rows = []
    for label, pattern in LORA_TABLES:
        name = pattern.format(model=model)
        s = _read(figs / name)
        g = (((s or {}).get("judge_base_answers") or {}).get("lora_eval") or {}).get(DATASET)
        if not g:
            continue
        by = g["verdicts_by_label"]
        right = by["correct"]["accept"] / max(1, sum(by["correct"].values()))
        wrong = by["incorrect"]["accept"] / max(1, sum(by["incorrect"].values()))
        rows.append(_row(label, "base model's answers, held-out records",
                         "verdict score logit_diff of the adapted judge", auc=g["auc_logit_diff"],
                         auc_ci=g.get("auc_logit_diff_ci"),
                         balanced_accuracy=(right + 1 - wrong) / 2, balanced_accuracy_ci=None,
                         acceptance_right=right, acceptance_wrong=wrong,
                         no_verdict_share=g["verdict_shares"]["none"], n=g["n"],
                         n_passages=g["n_passages"], source=name))
    return rows


def pairwise_rows(views: Path, model: str, n_boot: int, seed: int = 0) -> list[dict[str, Any]]:
    """The order-averaged pairwise judge and the lexical-overlap control, per pair source."""
    from interp.core.io import read_jsonl
    from interp.methods.pairwise import order_averaged

    root = views / model / "pairwise"
    if not (root / "pairs.jsonl").is_file():
        return []
    ctx = {(r["dataset"], str(r["id"])): r["context"]
           for r in read_jsonl(views / model / "records.jsonl")}
    items = []
    for p in read_jsonl(root / "pairs.jsonl"):
        f = root / "parts" / f"{p['dataset']}__{p['id']}__{p['source']}.json"
        if p["built"] and p["dataset"] == DATASET and f.is_file():
            d = json.loads(f.read_text())["pairwise"]
            items.append({**p, "s1": d["s1"], "s2": d["s2"],
                          "context": ctx[(p["dataset"], str(p["id"]))]})
    rows = []
    groups: dict[str, list[Mapping[str, Any]]] = {"all pairs": items}
    for it in items:
        groups.setdefault(f"{it['source']} pairs", []).append(it)
    for name, its in groups.items():
        g = [it["passage"] for it in its]
        a = order_averaged([it["s1"] for it in its], [it["s2"] for it in its], g,
                           np.random.default_rng(seed), n_boot)
        c = np.array([(it["s1"] - it["s2"]) / 2 for it in its])
        rows.append(_row(
            "pairwise, order-averaged", name,
            "letter score of both orders, mean preference (position term cancelled)",
            auc=a["auc"]["auc"], auc_ci=a["auc"]["ci"],
            balanced_accuracy=a["pair_accuracy"]["mean"],
            balanced_accuracy_ci=a["pair_accuracy"]["ci"],
            acceptance_right=float(np.mean(c > 0)), acceptance_wrong=float(np.mean(c < 0)),
            no_content_share=a["no_content_share"], n=2 * a["n"], n_passages=a["n_passages"],
            source=f"runs/findings_views/{model}/pairwise/parts"))
        rows.append(overlap_row(name, [(it["right"], it["wrong"], it["context"]) for it in its],
                                g, n_boot, seed,
                                f"runs/findings_views/{model}/pairwise/pairs.jsonl"))
    return rows


def overlap_row(set_: str, pairs: Sequence[tuple[str, str, str]], groups: Sequence[str],
                n_boot: int, seed: int, source: str) -> dict[str, Any]:
    """The lexical control on ``(right, wrong, context)`` pairs, a control by construction.

    The AUC of :func:`overlap` against the label over both candidates of every pair, and the
    pair accuracy (the share of pairs whose right answer has more of its words in the passage,
    ties half), each with a 95% passage-cluster bootstrap interval (``groups``: one passage id
    per pair). A judge's row is read beside it: the gold answers of SQuAD 2.0 are spans of the
    passage, so this separates them from many wrong answers without reading the question.
    """
    from interp.analysis.stats import cluster_bootstrap_auc, mean_stat

    rng = np.random.default_rng(seed)
    ro = np.array([overlap(r, c) for r, _, c in pairs])
    wo = np.array([overlap(w, c) for _, w, c in pairs])
    g = list(groups)
    y = np.r_[np.ones(len(pairs), bool), np.zeros(len(pairs), bool)]
    auc = cluster_bootstrap_auc(y, np.r_[ro, wo], g + g, rng, n_boot)
    pa = mean_stat((ro > wo) + 0.5 * (ro == wo), g, rng, n_boot)
    return _row("control: answer words in the passage", set_,
                "no model: share of the candidate's words found in the passage",
                auc=auc["auc"], auc_ci=auc["ci"], balanced_accuracy=pa["mean"],
                balanced_accuracy_ci=pa["ci"], acceptance_right=float(np.mean(ro > wo)),
                acceptance_wrong=float(np.mean(wo > ro)), n=2 * len(pairs),
                n_passages=len(set(g)), source=source)


def balanced_control_rows(runs: Path, figs: Path, model: str, n_boot: int, seed: int = 0
                          ) -> list[dict[str, Any]]:
    """The lexical control (:func:`overlap_row`) on the verdict judges' balanced set.

    The same candidates :mod:`experiments.judge_templates` judged (the first ``n_records``
    SQuAD 2.0 records of the restored run and its stored hard negatives; no model), over all
    pairs and per kind of wrong answer on at least ``MIN_PASSAGES`` passages, so that every
    balanced-set row of a verdict judge has its control on the same pairs.
    """
    from experiments.judge_templates import _candidates
    from interp.analysis.stats import MIN_PASSAGES, passage_groups

    s = _read(figs / "judges" / f"{model}__judge_templates.json")
    if s is None or not any("balanced" in sets for sets in s["templates"].values()):
        return []
    _, bal = _candidates(runs / model, s["n_records"])
    cands = bal["records"]
    pairs = [(g, w) for g, w in zip(cands[::2], cands[1::2])]   # gold, then its wrong answer
    groups: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {"balanced": pairs}
    for p in pairs:
        groups.setdefault(f"balanced, {p[1]['negative_source']} pairs", []).append(p)
    rows = []
    for name, ps in groups.items():
        g = passage_groups([gold for gold, _ in ps])
        if name != "balanced" and len(set(g)) < MIN_PASSAGES:
            continue
        rows.append(overlap_row(name, [(a["answer"], b["answer"], a["context"]) for a, b in ps],
                                g, n_boot, seed, f"runs/findings/{model} (the balanced set)"))
    return rows


def probe_rows(runs: Path, figs: Path, model: str, n_boot: int, seed: int = 0
               ) -> list[dict[str, Any]]:
    """The eval-prompt probe: nested out-of-fold scores on SQuAD 2.0, and as summarised."""
    from interp.analysis.stats import ClusterBootstrap, cluster_bootstrap_auc, passage_groups
    from interp.store.rundir import RunDir

    res = _read(figs / f"{model}__probes_results.json")
    nested = _read(runs / model / "probes" / "nested_eval.json")
    if res is None or nested is None:
        return []
    vs = res["tasks"]["eval"]["vs_judge"]["nested"]
    chosen = "; ".join(f"{c['probe']} L{c['layer']} {c['pool']}" for c in vs["chosen"])
    reads = (f"resid_post of the judge (eval) prompt, the record's own answer as candidate; "
             f"nested CV, per outer fold: {chosen}")
    recs = RunDir(runs / model).read_records(status="ok")   # the probe stage's records, in order
    oof = np.asarray(nested["result"]["oof"], dtype=float)
    if len(oof) != len(recs):
        raise SystemExit(f"error: {model}'s nested out-of-fold scores ({len(oof)}) do not match "
                         f"its {len(recs)} ok records: rerun the probe stage")
    y = np.array([bool(r["oracle_label"]) for r in recs])
    sq = np.array([r["dataset"] == DATASET for r in recs])
    g = passage_groups([r for r, s in zip(recs, sq) if s])
    auc = cluster_bootstrap_auc(y[sq], oof[sq], g, np.random.default_rng(seed), n_boot)
    pred, ys = oof[sq] > 0, y[sq]
    bs = ClusterBootstrap(g, n_boot, np.random.default_rng(seed))
    ba = None
    if bs.weights is not None:
        w = bs.weights
        tpr = (w * (pred & ys)).sum(1) / (w * ys).sum(1)
        tnr = (w * (~pred & ~ys)).sum(1) / (w * ~ys).sum(1)
        ba = bs.interval((tpr + tnr) / 2)
    right, wrong = float(pred[ys].mean()), float(pred[~ys].mean())
    rows = [_row("probe (reference)", "own answers", reads, auc=auc["auc"], auc_ci=auc["ci"],
                 balanced_accuracy=(right + 1 - wrong) / 2, balanced_accuracy_ci=ba,
                 acceptance_right=right, acceptance_wrong=wrong, n=int(sq.sum()),
                 n_passages=auc["n_clusters"],
                 source=f"runs/findings/{model}/probes/nested_eval.json")]
    for key, what in (("auc_paired", "own answers, four datasets pooled"),
                      ("auc_paired_within_dataset", "own answers, pairs within a dataset")):
        p = vs[key]
        rows.append(_row("probe (reference)", what, reads, auc=p["probe"], auc_ci=p["probe_ci"],
                         n=p["n"], n_passages=p["n_passages"], dataset="all",
                         source=f"{model}__probes_results.json"))
    return rows


def build(runs: Path, views: Path, figs: Path, model: str, n_boot: int) -> dict[str, Any]:
    """Every row of one model (module docstring)."""
    rows = (template_rows(figs, model) + balanced_control_rows(runs, figs, model, n_boot)
            + matched_rows(figs, model) + lora_rows(figs, model)
            + pairwise_rows(views, model, n_boot) + probe_rows(runs, figs, model, n_boot))
    disc = [f"{r['judge']}: {r['set']}" for r in rows if r["auc_excludes_chance"] == "above"
            and not r["judge"].startswith("control") and r.get("dataset") != "all"]
    return {"model": model, "dataset": DATASET, "n_boot": n_boot, "rows": rows,
            "discriminates_on_squad_v2": disc,
            "command": "python -m experiments.judges_table runs/findings runs/findings_views "
                       "figures/findings figures/findings/judges"}


def _f(x: float | None, ci: Sequence[float] | None = None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def markdown(s: Mapping[str, Any]) -> str:
    """The model's rows as the table of docs/findings/judges.md."""
    lines = ["| judge | set | AUC [95% CI] | balanced accuracy [95% CI] | accepts right / wrong "
             "| candidates (passages) |", "|---|---|---|---|---|---|"]
    for r in s["rows"]:
        acc = ("-" if r.get("acceptance_right") is None else
               f"{r['acceptance_right']:.2f} / {r['acceptance_wrong']:.2f}")
        lines.append(f"| {r['judge']} | {r['set']} | {_f(r['auc'], r['auc_ci'])} | "
                     f"{_f(r.get('balanced_accuracy'), r.get('balanced_accuracy_ci'))} | "
                     f"{acc} | {r['n']} ({r['n_passages']}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Write ``OUT/<model>__judges.json`` for each model."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, help="runs/findings (the restored findings state)")
    ap.add_argument("views", type=Path, help="runs/findings_views")
    ap.add_argument("figs", type=Path, help="figures/findings")
    ap.add_argument("out", type=Path)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    for m in a.models.split(","):
        if not (a.runs / m / "records.jsonl").is_file():
            raise SystemExit(f"error: {a.runs / m}/records.jsonl does not exist (restore the "
                             f"findings state first)")
    a.out.mkdir(parents=True, exist_ok=True)
    for m in a.models.split(","):
        s = build(a.runs, a.views, a.figs, m, a.n_boot)
        (a.out / f"{m}__judges.json").write_text(json.dumps(s, indent=1) + "\n")
        print(f"{m}: discriminates on SQuAD 2.0: {s['discriminates_on_squad_v2'] or 'none'}")
        if a.markdown:
            print(markdown(s))


if __name__ == "__main__":
    main()
