"""The judge audit on a tiny random model: signals, AUCs, detector, flags, a judged JSONL."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from interp.analysis.stats import (
    ClusterBootstrap,
    cluster_bootstrap_auc,
    cluster_bootstrap_auc_difference,
    passage_groups,
    stratified_auc,
)
from interp.core.errors import ConfigError, DataError
from interp.core.io import read_json, write_jsonl
from interp.methods import audit as method
from interp.stages import attention as attention_stage
from interp.stages import audit as audit_stage
from interp.store import RunDir
from interp.testing import synthetic_probe_run


def _quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def audited(tiny, tmp_path_factory):
    run = synthetic_probe_run(tmp_path_factory.mktemp("audit") / "run", tiny)
    cfg = audit_stage.AuditConfig(band="all", folds=3, fpr=0.25, n_boot=200)
    return run, audit_stage.run(run, tiny, cfg, log=_quiet), cfg


def test_audit_context_mass_is_the_attention_stages_band_mean(audited, tiny):
    run, summary, cfg = audited
    attention_stage.write_tables(run, attention_stage.AttentionConfig(band="all",
                                                                      figures=False))
    table = pd.read_parquet(run.path / "attention" / "span_mass.parquet")
    every = pd.read_csv(run.path / "audit" / "verdicts.csv")
    flagged = pd.read_csv(run.path / "audit" / "flagged.csv")
    assert len(flagged) == summary["n_flagged"] == every.flagged.sum() > 0
    assert len(every) == summary["n"]
    for _, row in every.iterrows():
        sel = table[(table.id == str(row.id)) & (table.task == "eval")
                    & (table.span == "context")]
        assert row.context_mass == pytest.approx(sel["mass"].mean(), rel=1e-5)
        cand = table[(table.id == str(row.id)) & (table.task == "eval")
                     & (table.span == "candidate")]
        assert row.candidate_mass == pytest.approx(cand["mass"].mean(), rel=1e-5)


def test_audit_numbers(audited):
    run, summary, cfg = audited
    recs = run.read_records()
    wrong = np.array([not (r["verdict"] is not None and r["verdict"] == r["oracle_label"])
                      for r in recs])
    assert summary["n"] == 24 and summary["n_wrong"] == int(wrong.sum())
    assert summary["n_unparseable"] == 1  # record 3 of the synthetic run
    ld = np.array([r["logit_diff"] for r in recs])
    got = summary["overall"]["signals"]["logit_diff"]
    assert got["auc"] == pytest.approx(roc_auc_score(wrong, ld))
    assert got["ci"][0] <= got["auc"] <= got["ci"][1]
    margin = summary["overall"]["signals"]["logit_diff_margin"]["auc"]
    assert margin == pytest.approx(roc_auc_score(wrong, -np.abs(ld)))
    assert set(summary["per_dataset"]) == {"squad_v2", "hotpotqa"}
    det = summary["detector"]
    assert det["possible"] and det["folds"] == 3
    assert det["n_features"] == 2 * 4  # 2 layers x 4 heads, the lookback ratio of each
    f = summary["flags"]["detector"]
    assert f["fpr_achieved"] <= cfg.fpr and f["n_flagged"] == summary["n_flagged"]
    md = (run.path / "audit" / "flagged.md").read_text()
    assert md.startswith("| id | dataset | question | candidate | verdict | oracle_label")
    assert (run.path / "figures" / "audit_roc.png").exists()
    assert "not a cause" in summary["causal_note"] or "not causes" in summary["causal_note"]
    assert read_json(run.path / "audit" / "summary.json")["n_flagged"] == summary["n_flagged"]


def test_lookback_ratio_by_hand():
    # one record, one head; spans context (2 tokens), question (1), candidate (1), template (4)
    spans = ["context", "question", "candidate", "template"]
    mass = np.array([0.4, 0.1, 0.1, 0.4]).reshape(1, 1, 1, 4)
    tokens = np.array([[2, 1, 1, 4]])
    a_ctx, a_rest = 0.4 / 2, 0.6 / 6
    lr = method.lookback_ratio(mass, spans, tokens)
    assert lr.shape == (1, 1, 1) and lr[0, 0, 0] == pytest.approx(a_ctx / (a_ctx + a_rest))


def test_flag_at_fpr_keeps_to_the_rate():
    score = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0])
    wrong = np.array([True, False, True, False, False, False, False, False, False, False])
    f = method.flag_at_fpr(score, wrong, 0.125)  # 8 right verdicts: one may be flagged
    assert f["flagged"].tolist() == [True, True, True] + [False] * 7
    assert f["fpr_achieved"] == pytest.approx(1 / 8) and f["tpr"] == 1.0


def test_cluster_bootstrap_auc_is_the_weighted_auc_of_each_resample():
    rng = np.random.default_rng(3)
    y = rng.random(30) < 0.4
    s = rng.normal(size=30) + y
    groups = [f"p{i // 2}" for i in range(30)]
    got = cluster_bootstrap_auc(y, s, groups, np.random.default_rng(7), 200)
    assert got["auc"] == pytest.approx(roc_auc_score(y, s))
    bs = ClusterBootstrap(groups, 200, np.random.default_rng(7))
    per = [roc_auc_score(y, s, sample_weight=w) for w in bs.weights
           if (w[y] > 0).any() and (w[~y] > 0).any()]
    assert got["ci"] == pytest.approx([np.percentile(per, 2.5), np.percentile(per, 97.5)])
    assert got["n_clusters"] == 15


def test_paired_auc_difference_uses_one_resample_for_both_scores():
    rng = np.random.default_rng(4)
    y = rng.random(40) < 0.5
    a, b = rng.normal(size=40) + 1.5 * y, rng.normal(size=40) + 0.3 * y
    groups = [f"p{i // 4}" for i in range(40)]
    got = cluster_bootstrap_auc_difference(y, a, b, groups, np.random.default_rng(9), 300)
    assert got["difference"] == pytest.approx(roc_auc_score(y, a) - roc_auc_score(y, b))
    # each side is the single-score statistic on the same draws
    one = cluster_bootstrap_auc(y, a, groups, np.random.default_rng(9), 300)
    assert got["ci_a"] == pytest.approx(one["ci"]) and got["n_clusters"] == 10
    bs = ClusterBootstrap(groups, 300, np.random.default_rng(9))
    per = [roc_auc_score(y, a, sample_weight=w) - roc_auc_score(y, b, sample_weight=w)
           for w in bs.weights if (w[y] > 0).any() and (w[~y] > 0).any()]
    assert got["ci"] == pytest.approx([np.percentile(per, 2.5), np.percentile(per, 97.5)])
    # a score against itself: a difference of exactly 0 on every resample
    same = cluster_bootstrap_auc_difference(y, a, a, groups, np.random.default_rng(9), 300)
    assert same["difference"] == 0.0 and same["ci"] == [0.0, 0.0]
    # one class: nothing to compare
    none = cluster_bootstrap_auc_difference(np.ones(40, bool), a, b, groups,
                                            np.random.default_rng(9), 300)
    assert none["difference"] is None and none["ci"] is None


def test_within_stratum_auc_gives_a_base_rate_score_one_half():
    """A score that only knows each dataset's base rate: pooled AUC high, within 0.5."""
    rng = np.random.default_rng(2)
    ds = np.array(["a"] * 40 + ["b"] * 40)
    y = np.concatenate([rng.random(40) < 0.8, rng.random(40) < 0.1])
    base = np.where(ds == "a", y[ds == "a"].mean(), y[ds == "b"].mean())
    assert roc_auc_score(y, base) > 0.8 and stratified_auc(y, base, ds) == 0.5
    # a real score: the within-stratum AUC counts only the pairs inside each dataset
    s = rng.normal(size=80) + y
    want = sum(((s[(ds == k) & y][:, None] > s[(ds == k) & ~y][None, :])).sum() for k in "ab")
    pairs = sum(((ds == k) & y).sum() * ((ds == k) & ~y).sum() for k in "ab")
    assert stratified_auc(y, s, ds) == pytest.approx(want / pairs)
    assert stratified_auc(y, s) == pytest.approx(roc_auc_score(y, s))
    groups = [f"p{i // 2}" for i in range(80)]
    d = cluster_bootstrap_auc_difference(y, s, base, groups, np.random.default_rng(1), 300,
                                         strata=ds)
    assert d["auc_b"] == 0.5 and d["ci_b"] == [0.5, 0.5]      # every resample: ties only
    assert d["difference"] == pytest.approx(want / pairs - 0.5)
    assert d["ci"][0] <= d["difference"] <= d["ci"][1]


def test_judged_jsonl_is_audited(tiny, tmp_path):
    """A judge dataset made elsewhere: the model judges it, the file's verdicts are audited."""
    src = synthetic_probe_run(tmp_path / "src", tiny)
    rows = [{"id": r["id"], "dataset": r["dataset"], "context": r["context"],
             "question": r["question"], "candidate": r["answer"],
             "label": "Correct" if r["oracle_label"] else "Incorrect",
             "verdict": r["verdict"]} for r in src.read_records()]
    path = tmp_path / "judged.jsonl"
    write_jsonl(path, rows)
    rd = audit_stage.judged_run(path, tmp_path / "out", tiny, log=_quiet)
    recs = rd.read_records()
    assert [r["answer"] for r in recs] == [x["candidate"] for x in rows]
    assert [r["oracle_label"] for r in recs] == [x["label"] == "Correct" for x in rows]
    assert [r["verdict"] for r in recs] == [x["verdict"] for x in rows]
    assert all("judge_verdict" in r for r in recs if r["verdict_source"] == "given")
    summary = audit_stage.run(rd, tiny, audit_stage.AuditConfig(band="all", folds=3,
                                                                n_boot=100), log=_quiet)
    assert summary["n"] == len(rows) and summary["judged_file"].endswith("judged.jsonl")
    assert summary["given_verdicts"]["n"] == len(rows) - 1  # one verdict is null
    assert summary["overall"]["signals"]["context_mass"]["auc"] is not None
    assert (rd.path / "audit" / "flagged.md").exists()
    assert (rd.path / "metrics.json").exists()
    # resuming judges nothing again
    again = audit_stage.judged_run(path, tmp_path / "out", tiny, log=_quiet)
    assert len(again.read_records()) == len(rows)


def test_judged_jsonl_and_config_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    write_jsonl(bad, [{"context": "c", "question": "q", "candidate": "a"}])
    with pytest.raises(DataError, match="line 1: missing \\['label'\\]"):
        audit_stage.read_judged(bad)
    write_jsonl(bad, [{"context": "c", "question": "q", "candidate": "a", "label": "maybe"}])
    with pytest.raises(DataError, match="label must be"):
        audit_stage.read_judged(bad)
    with pytest.raises(ConfigError, match="fpr must lie"):
        audit_stage.AuditConfig(fpr=1.5)
    with pytest.raises(ConfigError, match="detector_features"):
        audit_stage.AuditConfig(detector_features="attention")
    assert passage_groups([{"dataset": "d", "context": "x"}])  # the grouping the CIs use
    assert RunDir(tmp_path).path == tmp_path
