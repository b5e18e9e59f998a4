"""The balanced judge set on the bundled model and a few real records."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytestmark = pytest.mark.integration


def test_balanced_set_judges_gold_and_a_wrong_answer_and_reaches_metrics(quick_run, bundled,
                                                                          tmp_path):
    """Each answerable record: its gold answer (label True) and a wrong one (label False).

    The wrong one is a stored hard negative where there is one (one is written here for the
    first SQuAD 2.0 record with a gold answer), else the record's own wrong answer. The set
    is judged by the run's own judge, stored, read into metrics.json['balanced'] (balanced
    accuracy and AUC recomputed here from the stored candidates), and a second call judges
    nothing again.
    """
    from interp.methods.balanced import balanced_candidates
    from interp.stages.asymmetry import AsymmetryConfig, judge_balanced, write_metrics
    from interp.stages.run_metrics import BALANCED_RECORDS
    from interp.store.rundir import RunDir

    shutil.copytree(quick_run.path, tmp_path / "run")
    rd = RunDir(tmp_path / "run")
    recs = rd.read_records()
    first = next(r for r in recs if r["dataset"] == "squad_v2" and r["answers"])
    (rd.path / "patching").mkdir()
    (rd.path / "patching" / "hard_negatives.jsonl").write_text(json.dumps(
        {"dataset": "squad_v2", "id": first["id"], "hard_negative": "the year 1066"}) + "\n")
    cfg = AsymmetryConfig.from_mapping(rd.manifest()["config"])
    n = judge_balanced(rd, cfg, handle=bundled, log=lambda s: None)
    rows = [json.loads(x) for x in (rd.path / BALANCED_RECORDS).read_text().splitlines()]
    counts, judged = rows[0]["counts"], rows[1:]
    want, _ = balanced_candidates(recs, {("squad_v2", first["id"]): "the year 1066"})
    assert n == len(judged) == len(want) == 2 * sum(c["n_pairs"] for c in counts.values())
    assert n >= 2
    neg = next(r for r in judged if r["id"] == first["id"] and r["balanced_role"] == "wrong")
    assert (neg["answer"], neg["oracle_label"], neg["negative_source"]) == (
        "the year 1066", False, "hard_negative")
    for r in judged:
        assert r["model"] == bundled.spec and r["verdict"] in (True, False, None)
        assert r["oracle_label"] == (r["balanced_role"] == "gold")
        assert np.isfinite(r["logit_diff"]) and 0 < r["verdict_coverage"] <= 1
    m = write_metrics(rd, cfg)
    b = m["balanced"]["overall"]
    y = np.array([r["oracle_label"] for r in judged])
    acc = np.array([r["verdict"] is True for r in judged])
    rej = np.array([r["verdict"] is False for r in judged])
    assert b["n"] == len(judged) and b["n_right"] == b["n_wrong"] == len(judged) // 2
    assert b["balanced_accuracy"] == pytest.approx((acc[y].mean() + rej[~y].mean()) / 2)
    ld = np.array([r["logit_diff"] for r in judged])
    pairs = [(a > b) + 0.5 * (a == b) for a in ld[y] for b in ld[~y]]
    assert b["auc_logit_diff"] == pytest.approx(np.mean(pairs))
    assert json.loads((rd.path / "metrics.json").read_text())["balanced"]["overall"]["n"] == b["n"]
    assert judge_balanced(rd, cfg, handle=bundled, log=lambda s: None) == 0
