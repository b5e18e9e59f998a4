"""Base-rate-free judging (interp.methods.balanced) on constructed records, values by hand."""

from __future__ import annotations

import numpy as np
import pytest

from interp.methods.asymmetry import compute_metrics, format_metrics, group_metrics
from interp.methods.balanced import (
    balanced_candidates,
    balanced_metrics,
    compute_balanced,
)


def _rec(i: int, label: bool, verdict, ld: float, dataset: str = "squad_v2",
         passage: int | None = None) -> dict:
    ctx = f"passage {i if passage is None else passage}"
    return {"id": f"r{i}", "dataset": dataset, "context": ctx,
            "question": "q?", "answers": ["gold"], "oracle_label": label, "verdict": verdict,
            "logit_diff": ld, "p_correct": float(1 / (1 + np.exp(-ld))),
            "verdict_coverage": 0.9, "logprob_correct": ld / 2, "logprob_incorrect": -ld / 2,
            "status": "ok", "model": "m"}


def test_balanced_accuracy_and_auc_by_hand():
    """4 right, 4 wrong candidates.

    Right: verdicts T, T, T, F -> acceptance 3/4. Wrong: T, F, F, None -> acceptance 1/4,
    rejection 2/4 (no verdict rejects nothing). BA = (0.75 + 0.5) / 2 = 0.625. Forced
    (logit_diff > 0): right 3/4 accepted, wrong accepts 2 (2.0) of 4 -> BA_f = (0.75 + 0.5)/2.
    AUC of logit_diff: right [3, 2, 1, -1] vs wrong [2, 0, -2, -3]: 4 + 3.5 + 3 + 2 = 12.5
    of 16 pairs = 0.78125.
    """
    right = [_rec(i, True, v, ld) for i, (v, ld) in enumerate(
        [(True, 3.0), (True, 2.0), (True, 1.0), (False, -1.0)])]
    wrong = [_rec(10 + i, False, v, ld) for i, (v, ld) in enumerate(
        [(True, 2.0), (False, 0.0), (False, -2.0), (None, -3.0)])]
    g = balanced_metrics(right + wrong, n_boot=300)
    assert g["n"] == 8 and g["n_right"] == 4 and g["n_wrong"] == 4 and g["n_passages"] == 8
    assert g["acceptance_right"] == pytest.approx(0.75)
    assert g["acceptance_wrong"] == pytest.approx(0.25)
    assert g["balanced_accuracy"] == pytest.approx(0.625)
    assert g["acceptance_wrong_forced"] == pytest.approx(0.25)   # ld 2.0 only (0.0 is not > 0)
    assert g["balanced_accuracy_forced"] == pytest.approx((0.75 + 0.75) / 2)
    assert g["auc_logit_diff"] == pytest.approx(12.5 / 16)
    lo, hi = g["auc_logit_diff_ci"]
    assert lo <= g["auc_logit_diff"] <= hi and lo < hi
    assert g["no_verdict_share"] == pytest.approx(1 / 8) and g["one_reply"] is None


def test_judge_that_accepts_all_is_at_chance_whatever_ga():
    """EA = GA for a judge that accepts everything; its balanced accuracy is 0.5 at any GA."""
    for n_right in (2, 8):
        recs = [_rec(i, i < n_right, True, 1.0) for i in range(10)]
        m = group_metrics(recs, n_boot=200)
        assert m["EA"] == pytest.approx(m["GA"]) == pytest.approx(n_right / 10)
        assert m["balanced_accuracy"] == pytest.approx(0.5)
        assert m["balanced_accuracy_forced"] == pytest.approx(0.5)
        assert m["balanced_accuracy_ci"] == [0.5, 0.5]
    g = balanced_metrics([_rec(i, i % 2 == 0, True, 1.0) for i in range(6)], n_boot=100)
    assert g["balanced_accuracy"] == 0.5 and "accepts all 6" in g["one_reply"]


def test_own_balanced_accuracy_in_group_metrics():
    """Own answers: right T, F (acc 1/2); wrong F, F, None (rejection 2/3): BA = 7/12."""
    recs = [_rec(0, True, True, 1.0), _rec(1, True, False, -1.0), _rec(2, False, False, -2.0),
            _rec(3, False, False, 0.5), _rec(4, False, None, 0.2)]
    m = group_metrics(recs, n_boot=200)
    assert m["balanced_accuracy"] == pytest.approx((0.5 + 2 / 3) / 2)
    # forced: right 1/2 accepted; wrong accepts 0.5 and 0.2 -> rejection 1/3
    assert m["balanced_accuracy_forced"] == pytest.approx((0.5 + 1 / 3) / 2)
    one_class = group_metrics([_rec(i, True, True, 1.0) for i in range(3)], n_boot=50)
    assert one_class["balanced_accuracy"] is None and one_class["balanced_accuracy_ci"] is None


def test_balanced_candidates_sources_and_counts():
    recs = [
        {**_rec(0, True, True, 1.0), "answer": "gold"},                  # right, hard negative
        {**_rec(1, False, True, 1.0), "answer": "other"},                # wrong: own answer
        {**_rec(2, True, True, 1.0), "answer": "gold"},                  # right, no negative
        {**_rec(3, False, True, 1.0), "answers": [], "answer": "x"},     # no gold
        {**_rec(4, True, True, 1.0), "answer": "gold"},                  # negative = gold
        {**_rec(5, False, True, 1.0), "answer": "mine"},                 # both: hard neg wins
    ]
    negs = {("squad_v2", "r0"): "wrong one", ("squad_v2", "r4"): "Gold.",
            ("squad_v2", "r5"): "mined"}
    cands, counts = balanced_candidates(recs, negs)
    assert counts == {"n_pairs": 3, "n_without_gold": 1, "n_without_negative": 1,
                      "n_negative_same_as_gold": 1}
    got = [(c["id"], c["balanced_role"], c["answer"], c["oracle_label"], c["negative_source"])
           for c in cands]
    assert got == [("r0", "gold", "gold", True, "hard_negative"),
                   ("r0", "wrong", "wrong one", False, "hard_negative"),
                   ("r1", "gold", "gold", True, "own_wrong_answer"),
                   ("r1", "wrong", "other", False, "own_wrong_answer"),
                   ("r5", "gold", "gold", True, "hard_negative"),
                   ("r5", "wrong", "mined", False, "hard_negative")]
    assert all("verdict" not in c and "logit_diff" not in c for c in cands)


def test_compute_balanced_and_table():
    """Per dataset and overall; the metrics table prints BA and the balanced block."""
    recs = [_rec(i, i % 2 == 0, i % 2 == 0, 1.0 if i % 2 == 0 else -1.0, passage=i // 2,
                 dataset="squad_v2" if i < 8 else "drop") for i in range(12)]
    b = compute_balanced(recs, {"squad_v2": {"n_pairs": 4, "n_without_gold": 0,
                                             "n_without_negative": 2}}, n_boot=100)
    assert b["per_dataset"]["squad_v2"]["n"] == 8 and b["per_dataset"]["drop"]["n"] == 4
    assert b["overall"]["balanced_accuracy"] == 1.0 and b["overall"]["auc_logit_diff"] == 1.0
    m = compute_metrics(recs, n_boot=100)
    m["balanced"] = b
    text = format_metrics(m)
    assert " BA " in text.splitlines()[0] and "acc|wrong" in text
    assert "left out 0 without a gold answer, 2 without a wrong one" in text


def test_write_metrics_reads_a_stored_balanced_set(tmp_path):
    """A run with balanced/records.jsonl (its counts line first) gets metrics['balanced']."""
    import json

    from interp.stages.run_metrics import BALANCED_RECORDS, write_metrics
    from interp.store.rundir import RunDir

    recs = [_rec(i, i % 2 == 0, True, 1.0) for i in range(4)]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    cands = [{**_rec(10 + i, i % 2 == 0, i % 2 == 0, 1.0 if i % 2 == 0 else -1.0, passage=i // 2),
              "balanced_role": "gold" if i % 2 == 0 else "wrong"} for i in range(4)]
    (tmp_path / "balanced").mkdir()
    (tmp_path / BALANCED_RECORDS).write_text(json.dumps(
        {"counts": {"squad_v2": {"n_pairs": 2, "n_without_gold": 0, "n_without_negative": 1}}})
        + "\n" + "".join(json.dumps(c) + "\n" for c in cands))
    m = write_metrics(RunDir(tmp_path), write=False)
    b = m["balanced"]
    assert b["overall"]["n"] == 4 and b["overall"]["balanced_accuracy"] == 1.0
    assert b["counts"]["squad_v2"]["n_without_negative"] == 1
    assert m["overall"]["balanced_accuracy"] == 0.5   # its own answers: it accepts all
