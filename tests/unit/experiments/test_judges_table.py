"""Every judge side by side (experiments/judges_table.py): rows from stored scores, no model."""

from __future__ import annotations

import json

import pytest

from experiments.judges_table import excludes, markdown, overlap, pairwise_rows


def test_overlap_counts_the_answers_words_found_in_the_passage():
    ctx = "The Eiffel Tower, in Paris, opened in 1889."
    assert overlap("Paris", ctx) == 1.0
    assert overlap("in Lyon", ctx) == 0.5
    assert overlap("...", ctx) == 0.0
    assert excludes([0.52, 0.7]) == "above" and excludes([0.2, 0.49]) == "below"
    assert excludes([0.4, 0.6]) is False and excludes(None) is None


def _views(tmp_path, scores):
    root = tmp_path / "views" / "m"
    (root / "pairwise" / "parts").mkdir(parents=True)
    recs, pairs = [], []
    for i, (s1, s2) in enumerate(scores):
        recs.append({"dataset": "squad_v2", "id": f"r{i}", "context": f"Paris is in France {i}."})
        pairs.append({"dataset": "squad_v2", "id": f"r{i}", "source": "model",
                      "passage": f"p{i}", "right": "Paris", "wrong": "Lyon", "built": True})
        (root / "pairwise" / "parts" / f"squad_v2__r{i}__model.json").write_text(
            json.dumps({"pairwise": {"s1": s1, "s2": s2}}))
    # a pair of another dataset and one not built are left out
    pairs.append({**pairs[0], "dataset": "drop"})
    pairs.append({"dataset": "squad_v2", "id": "rx", "source": "model", "built": False})
    (root / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (root / "pairwise" / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return tmp_path / "views"


def test_a_one_letter_pairwise_judge_is_at_chance_and_the_overlap_control_is_not(tmp_path):
    rows = pairwise_rows(_views(tmp_path, [(4.0, 4.0)] * 12), "m", n_boot=200)
    judge = {r["set"]: r for r in rows if r["judge"] == "pairwise, order-averaged"}
    control = {r["set"]: r for r in rows if r["judge"].startswith("control")}
    assert set(judge) == set(control) == {"all pairs", "model pairs"}
    a = judge["all pairs"]
    assert a["auc"] == 0.5 and a["balanced_accuracy"] == 0.5 and a["no_content_share"] == 1.0
    assert a["auc_excludes_chance"] is False and (a["n"], a["n_passages"]) == (24, 12)
    assert a["acceptance_right"] == 0.0 and a["acceptance_wrong"] == 0.0
    c = control["all pairs"]   # "Paris" is in every passage, "Lyon" in none
    assert c["auc"] == 1.0 and c["auc_excludes_chance"] == "above"
    row = "| pairwise, order-averaged | all pairs | 0.50 [0.50, 0.50] |"
    assert row in markdown({"rows": rows})


def test_a_judge_that_prefers_the_right_answer_in_both_orders_scores_one(tmp_path):
    rows = pairwise_rows(_views(tmp_path, [(1.0 + i, -2.0) for i in range(12)]), "m", n_boot=200)
    a = next(r for r in rows if r["judge"] == "pairwise, order-averaged")
    assert a["auc"] == pytest.approx(1.0) and a["acceptance_right"] == 1.0


def test_template_rows_list_a_kind_of_wrong_answer_only_on_enough_passages(tmp_path):
    from experiments.judges_table import template_rows

    def g(auc, p):
        return {"auc_logit_diff": auc, "auc_logit_diff_ci": [auc - 0.1, auc + 0.1],
                "balanced_accuracy": 0.5, "balanced_accuracy_ci": [0.4, 0.6],
                "acceptance_right": 0.3, "acceptance_wrong": 0.2, "n": 2 * p, "n_passages": p}

    bal = {**g(0.3, 14), "by_negative_source": {"hard_negative": g(0.2, 11),
                                                "own_wrong_answer": g(0.9, 3)}}
    s = {"n_records": 20, "partial": {"default/balanced": 28},
         "templates": {"default": {"own": g(0.55, 20), "balanced": bal}}}
    (tmp_path / "judges").mkdir()
    (tmp_path / "judges" / "m__judge_templates.json").write_text(json.dumps(s))
    rows = template_rows(tmp_path, "m")
    assert [r["set"] for r in rows] == ["own", "balanced (partial)",
                                        "balanced, hard_negative pairs (partial)"]
    assert [r["auc_excludes_chance"] for r in rows] == [False, "below", "below"]


def test_lora_rows_read_the_study_adapter_and_the_longer_trained_one(tmp_path):
    from experiments.judges_table import lora_rows

    def table(auc, accept_right, accept_wrong):
        return {"judge_base_answers": {"lora_eval": {"squad_v2": {
            "auc_logit_diff": auc, "auc_logit_diff_ci": [auc - 0.1, auc + 0.1], "n": 10,
            "n_passages": 10, "verdict_shares": {"none": 0.0}, "verdicts_by_label": {
                "correct": {"accept": accept_right, "reject": 4 - accept_right},
                "incorrect": {"accept": accept_wrong, "reject": 6 - accept_wrong}}}}}}

    (tmp_path / "m__transfer_table.json").write_text(json.dumps(table(0.5, 2, 3)))
    (rows,) = lora_rows(tmp_path, "m")                  # the longer run not there yet
    assert rows["judge"] == "LoRA-Eval (transfer stage)" and rows["auc"] == 0.5
    (tmp_path / "judges").mkdir()
    (tmp_path / "judges" / "m__lora_eval_converged_table.json").write_text(
        json.dumps(table(0.7, 3, 1)))
    study, longer = lora_rows(tmp_path, "m")
    assert longer["judge"] == "LoRA-Eval, longer training (transfer stage)"
    assert (longer["auc"], longer["acceptance_right"], longer["acceptance_wrong"]) == (
        0.7, 0.75, pytest.approx(1 / 6))
    assert longer["balanced_accuracy"] == pytest.approx((0.75 + 5 / 6) / 2)
    assert longer["source"] == "judges/m__lora_eval_converged_table.json"


def test_the_balanced_set_gets_its_lexical_control_on_the_same_pairs(tmp_path, monkeypatch):
    from experiments.judges_table import balanced_control_rows

    run = tmp_path / "runs" / "m"
    (run / "patching").mkdir(parents=True)
    recs = [{"dataset": "squad_v2", "id": f"r{i}", "status": "ok", "context": f"Paris {i}.",
             "title": f"t{i}", "question": "Where?", "answers": ["Paris"],
             "answer": "Lyon" if i % 2 else "Paris", "oracle_label": not i % 2}
            for i in range(12)]
    recs.append({**recs[0], "id": "d0", "dataset": "drop"})   # another dataset: left out
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    negs = [{"dataset": "squad_v2", "id": f"r{i}", "hard_negative": "Rome"} for i in (0, 2)]
    (run / "patching" / "hard_negatives.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in negs))
    figs = tmp_path / "figs"
    assert balanced_control_rows(tmp_path / "runs", figs, "m", n_boot=200) == []  # no summary
    (figs / "judges").mkdir(parents=True)
    (figs / "judges" / "m__judge_templates.json").write_text(json.dumps(
        {"n_records": 10, "templates": {"default": {"own": {}, "balanced": {}}}}))
    rows = {r["set"]: r for r in balanced_control_rows(tmp_path / "runs", figs, "m", n_boot=200)}
    # the first 10 records: 2 hard negatives, 5 own wrong answers, 3 right without a negative
    b = rows["balanced"]
    assert (b["n"], b["n_passages"]) == (14, 7) and b["judge"].startswith("control")
    assert b["auc"] == 1.0 and b["acceptance_right"] == 1.0 and b["acceptance_wrong"] == 0.0
    assert rows.keys() == {"balanced"}   # each kind of wrong answer on under 10 passages
    monkeypatch.setattr("interp.analysis.stats.MIN_PASSAGES", 2)
    rows = {r["set"]: r for r in balanced_control_rows(tmp_path / "runs", figs, "m", n_boot=200)}
    assert {k: r["n"] for k, r in rows.items()} == {
        "balanced": 14, "balanced, hard_negative pairs": 4, "balanced, own_wrong_answer pairs": 10}


def test_the_matched_templates_judge_is_read_from_its_own_runs_metrics(tmp_path):
    from experiments.judges_table import matched_rows

    assert matched_rows(tmp_path, "m") == []
    (tmp_path / "matched").mkdir()
    g = {"auc_logit_diff": 0.64, "auc_logit_diff_ci": [0.55, 0.73], "balanced_accuracy": 0.33,
         "balanced_accuracy_ci": [0.26, 0.42], "acceptance_rate_correct": 0.36,
         "acceptance_rate_incorrect": 0.36, "n": 150, "n_valid": 98, "n_passages": 150}
    (tmp_path / "matched" / "m__asymmetry_metrics.json").write_text(
        json.dumps({"per_dataset": {"squad_v2": g, "drop": {**g, "auc_logit_diff": 0.1}}}))
    (r,) = matched_rows(tmp_path, "m")
    assert (r["auc"], r["auc_excludes_chance"], r["n"]) == (0.64, "above", 150)
    assert r["no_verdict_share"] == pytest.approx(52 / 150)
    assert r["source"] == "matched/m__asymmetry_metrics.json"
