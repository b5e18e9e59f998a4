"""Study 1 on the bundled model and real records."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.integration


def test_quick_run_metrics(quick_run):
    """The bundled model's run: metrics.json agrees with the records."""
    m = json.loads((quick_run.path / "metrics.json").read_text())
    recs = quick_run.read_records()
    assert m["overall"]["n"] == len(recs) == 6
    ga = np.mean([r["oracle_label"] for r in recs])
    assert m["overall"]["GA"] == pytest.approx(ga)
    for name, g in [*m["per_dataset"].items(), ("overall", m["overall"])]:
        sel = [r for r in recs if name in ("overall", r["dataset"])]
        assert g["EA_forced"] == np.mean([(r["p_correct"] > 0.5) == r["oracle_label"]
                                          for r in sel])
        assert g["EA"] == np.mean([r["verdict"] is not None and r["verdict"] == r["oracle_label"]
                                   for r in sel])
        assert sum(g["verdicts"].values()) == g["n"] == len(sel)
        assert g["few_passages"] is True and g["note"]
    assert all(0.0 < r["verdict_coverage"] <= 1.0 for r in recs)
    manifest = quick_run.manifest()
    assert manifest["model"]["sha256"] and manifest["model"]["n_layers"] == 30



def test_record_scores_are_teacher_forced_whole_replies(quick_run, bundled):
    """A record's verdict score is each whole reply's teacher-forced log-probability.

    Computed independently: one full forward of the record's eval prompt + the reply. The run
    scored left-padded batches in float32, so the two agree to 1e-4 nats (as batched and
    single forwards do, tests/equivalence/test_batching.py), not bit for bit.
    """
    from interp.judging.prompts import rerender
    from interp.judging.verdict import verdict_replies
    from tests.unit.judging.test_verdict import _teacher_forced

    r = verdict_replies(bundled.tokenizer)
    for rec in quick_run.read_records()[:2]:
        ids = rerender(rec, "eval", bundled.tokenizer).input_ids
        lc = _teacher_forced(bundled.model, ids, r.correct)
        li = _teacher_forced(bundled.model, ids, r.incorrect)
        assert rec["logprob_correct"] == pytest.approx(lc, abs=1e-4)
        assert rec["logprob_incorrect"] == pytest.approx(li, abs=1e-4)
        assert rec["verdict_coverage"] == pytest.approx(np.exp(lc) + np.exp(li), rel=1e-4)
