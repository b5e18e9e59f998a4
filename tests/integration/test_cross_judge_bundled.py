"""Cross-judging, cross-model probes and the audit on both bundled models and real records.

SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct each answer and judge the same 10
SQuAD 2.0 validation questions (one per passage; contexts cut to their first 300 characters,
at a word boundary, so the Qwen runs take minutes on a shared CPU; :func:`interp.testing.
rehearsal_datasets`), then each judges the other's answers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from interp.core.errors import StageError
from interp.core.io import write_jsonl
from interp.methods.cross_judge import format_matrix, judge_matrix
from interp.plots.cross import plot_cross_probe, plot_judge_matrix
from interp.run.cross_grid import cross_probe
from interp.stages import attention as attention_stage
from interp.stages import audit as audit_stage
from interp.stages import probe as probe_stage
from interp.stages.asymmetry import AsymmetryConfig, run
from interp.store import RunDir
from interp.testing import rehearsal_datasets

pytestmark = pytest.mark.integration

N = 10
SMOL, QWEN = "smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"


def _quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def grid(bundled, qwen, tmp_path_factory):
    root = tmp_path_factory.mktemp("cross_bundled")
    data = rehearsal_datasets(root / "data", n=N, max_chars=300, names=("squad_v2",))
    base = dict(datasets=[data["squad_v2"]], limit=N, batch_size=5, n_boot=200,
                max_new_tokens=16, device="cpu", dtype="float32")
    handles = {SMOL: bundled, QWEN: qwen}
    dirs = {(m, m): root / m for m in handles}
    dirs[(SMOL, QWEN)], dirs[(QWEN, SMOL)] = root / "smol_on_qwen", root / "qwen_on_smol"
    for (judge, source), d in sorted(dirs.items(), key=lambda kv: kv[0][0] != kv[0][1]):
        src = None if judge == source else str(dirs[(source, source)])
        run(d, handles[judge], AsymmetryConfig(model=judge, answers_from=src, **base),
            log=_quiet)
    return root, dirs, handles


def test_each_judged_candidate_is_the_source_answer_and_label(grid):
    _, dirs, _ = grid
    for judge, source in ((SMOL, QWEN), (QWEN, SMOL)):
        src = {(r["dataset"], r["id"]): r for r in RunDir(dirs[(source, source)]).read_records()}
        judged = RunDir(dirs[(judge, source)]).read_records()
        assert len(judged) == len(src) == N
        for r in judged:
            s = src[(r["dataset"], r["id"])]
            assert r["answer"] == s["answer"] and r["oracle_label"] == s["oracle_label"]
            assert r["model"] == judge and r["answer_source"]["model"] == source
            assert r["answer_source"]["run"] == str(dirs[(source, source)])
            assert r["verdict_text"] and r["prompts"]["eval"]["token_spans"]["candidate"]


def test_two_by_two_matrix_with_paired_cis(grid):
    root, dirs, _ = grid
    runs = {j: {s: dirs[(j, s)] for s in (SMOL, QWEN)} for j in (SMOL, QWEN)}
    mx = judge_matrix(runs, n_boot=300)
    for j in (SMOL, QWEN):
        for s in (SMOL, QWEN):
            c = mx["cells"][j][s]
            assert c["n"] == N and c["n_passages"] == N and c["EA_ci"] is not None
            assert c["EA_ci"][0] <= c["EA"] <= c["EA_ci"][1]
            assert c["delta"] == pytest.approx(c["EA"] - c["GA"])
        # the off-diagonal cell's GA is the source model's GA on the same records
        other = QWEN if j == SMOL else SMOL
        assert mx["cells"][j][other]["GA"] == mx["cells"][other][other]["GA"]
        d = mx["self_minus_other"][j][other]
        assert d["n"] == N and d["EA_diff"] == pytest.approx(
            mx["cells"][j][j]["EA"] - mx["cells"][j][other]["EA"])
        assert d["EA_diff_ci"][0] <= d["EA_diff"] <= d["EA_diff_ci"][1]
    assert plot_judge_matrix(mx, root / "figures").exists()
    print(format_matrix(mx))


def test_cross_model_probes_next_to_both_verbal_judges(grid):
    root, dirs, handles = grid
    cfg = probe_stage.ProbeConfig(folds=2, probes=["logreg"], tasks=["eval"])
    entries = []
    for judge, source in ((SMOL, QWEN), (QWEN, SMOL)):
        try:
            probe_stage.run(RunDir(dirs[(judge, source)]), handles[judge], cfg, log=_quiet)
        except StageError as err:  # the source's answers are (nearly) all of one class
            pytest.skip(f"{source}'s {N} answers cannot be split into 2 grouped folds: {err}")
        e = cross_probe(dirs[(judge, source)], dirs[(source, source)])
        src = RunDir(dirs[(source, source)]).read_records()
        assert e["judge"] == judge and e["answers_of"] == source and e["n_records"] == N
        assert e["class_counts"]["correct"] == sum(r["oracle_label"] for r in src)
        assert len(e["per_layer"]["layers"]) == handles[judge].n_layers
        assert set(e["per_layer"]["pools"]) == {"last", "candidate", "mean", "max", "min"}
        # the source's self-judge is scored on the same records: its pooled AUC is its own
        from interp.analysis.stats import roc_auc

        y = np.array([r["oracle_label"] for r in src])
        ld = np.array([r["logit_diff"] for r in src])
        assert e["source_self_judge_overall"]["auc"] == pytest.approx(roc_auc(y, ld))
        entries.append(e)
        best = e["best"]
        print(f"{judge} on {source}'s answers: best probe AUC {best['auc']:.2f} (layer "
              f"{best['layer']}, {best['pool']}); verbal AUC {e['judge_verbal_folds']['auc']}; "
              f"{source} self-judge AUC {e['source_self_judge_folds']['auc']}")
    assert plot_cross_probe(entries, root / "figures").exists()


def test_audit_on_a_bundled_run_matches_the_attention_stage(grid):
    _, dirs, handles = grid
    rd = RunDir(dirs[(SMOL, SMOL)])
    summary = audit_stage.run(rd, handles[SMOL], audit_stage.AuditConfig(folds=2, n_boot=200),
                              log=_quiet)
    assert summary["n"] == N and summary["n_wrong"] + summary["n_right"] == N
    assert set(summary["overall"]["signals"]) >= {"context_mass", "lookback_ratio", "logit_diff"}
    att = attention_stage.write_tables(rd, attention_stage.AttentionConfig(figures=False))
    table = pd.read_parquet(rd.path / "attention" / "span_mass.parquet")
    every = pd.read_csv(rd.path / "audit" / "verdicts.csv")
    band = att["band"]
    for _, row in every.iterrows():
        sel = table[(table.id == str(row.id)) & (table.task == "eval") & (table.span == "context")
                    & table.layer.isin(band)]
        assert row.context_mass == pytest.approx(sel["mass"].mean(), rel=1e-5)
    overall = att["overall"]["eval"]["context"]["mean"]
    assert every.context_mass.mean() == pytest.approx(overall, rel=1e-5)
    assert (rd.path / "audit" / "flagged.md").exists()
    print(audit_stage.format_summary(summary))


def test_audit_of_a_judged_jsonl_built_from_records(grid, tmp_path):
    """The judged-file path reproduces the run's own verdicts (same prompt, same model)."""
    _, dirs, handles = grid
    recs = RunDir(dirs[(SMOL, SMOL)]).read_records()
    rows = [{"id": r["id"], "dataset": r["dataset"], "context": r["context"],
             "question": r["question"], "candidate": r["answer"], "label": r["oracle_label"]}
            for r in recs]
    write_jsonl(tmp_path / "judged.jsonl", rows)
    rd = audit_stage.judged_run(tmp_path / "judged.jsonl", tmp_path / "out", handles[SMOL],
                                batch_size=5, log=_quiet)
    again = rd.read_records()
    assert [r["verdict"] for r in again] == [r["verdict"] for r in recs]
    assert np.allclose([r["logit_diff"] for r in again], [r["logit_diff"] for r in recs],
                       atol=1e-3)
    summary = audit_stage.run(rd, handles[SMOL], audit_stage.AuditConfig(folds=2, n_boot=200),
                              log=_quiet)
    assert summary["n"] == N and summary["judged_file"].endswith("judged.jsonl")
    print(audit_stage.format_summary(summary))
    print((rd.path / "audit" / "flagged.md").read_text())
