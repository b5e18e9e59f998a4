"""Study 3 methods: config, refusals, training pool, hard negatives, training sets."""

from __future__ import annotations

import pytest

from interp.core.errors import StageError
from interp.judging.grading import RuleOracle, normalize_answer
from interp.judging.prompts import get_template
from interp.methods.transfer import (
    build_training_sets,
    choose_learning_rates,
    holdout_split,
    is_refusal,
    judge_balanced_accuracy,
    mine_hard_negatives,
    rotation_answer,
    selection_score,
    training_pool,
)
from interp.stages.transfer import TransferConfig

# --- config and refusals ---------------------------------------------------------------------


def test_unknown_config_key_is_a_clear_error():
    with pytest.raises(StageError, match=r"\[transfer\]: unknown config keys.*'rnak'.*known"):
        TransferConfig.from_mapping({"rnak": 4})
    with pytest.raises(StageError, match="patch_positions"):
        TransferConfig(patch_positions="middle")


@pytest.mark.parametrize("text", [
    "I need more information to answer this.", "This cannot be determined.",
    "Without more context I can't say", "As an AI, I don't have that information",
    "I'm not sure", "Unknown", "Please provide the context.", "There is no way to know.",
    "No, that's impossible. The answer is not known", "A short phrase, not a sentence",
])
def test_refusals_are_filtered(text):
    assert is_refusal(text)


@pytest.mark.parametrize("text", ["Paris", "1945", "Napoleon Bonaparte", "the Normans",
                                  "Determined Productions", "no. 5"])
def test_answers_are_not_refusals(text):
    assert not is_refusal(text)


def test_missing_train_split_is_a_clear_error(tokenizer):
    cfg = TransferConfig(datasets=["drop"])
    with pytest.raises(StageError, match="train split of 'drop'.*squad_v2"):
        training_pool(cfg, tokenizer, get_template("default"), log=lambda s: None)


def test_a_file_of_one_passage_has_no_train_side_and_says_so(tokenizer, tmp_path):
    from interp.data import load_examples, save_examples

    one = save_examples(load_examples("squad_v2", limit=1), tmp_path / "one.jsonl")
    cfg = TransferConfig(datasets=[str(one)])
    with pytest.raises(StageError, match="gives no train record.*at least two passages"):
        training_pool(cfg, tokenizer, get_template("default"), log=lambda s: None)


# --- hard negatives ----------------------------------------------------------------------------


def test_rotation_never_returns_this_records_gold(qa_example):
    pool = [qa_example(i, a) for i, a in enumerate(["Paris", "paris", "The Paris", "London",
                                                    "Berlin"])]
    oracle = RuleOracle()
    for seed in range(5):
        ans, donor = rotation_answer(0, pool, oracle, seed=seed)
        assert ans in ("London", "Berlin") and donor in ("r3", "r4")
        assert normalize_answer(ans) != normalize_answer(pool[0].answers[0])
    # every other gold equals this gold: nothing usable
    same = [qa_example(0, "Paris"), qa_example(1, "Paris.")]
    assert rotation_answer(0, same, oracle, seed=0) == (None, None)


def test_mine_hard_negatives_logs_attempts_and_falls_back(tiny, qa_example, lora_cfg):
    pool = [qa_example(i, a) for i, a in enumerate(["Paris", "London", "Berlin", "Rome"])]
    cfg = lora_cfg(hard_negative_attempts=2, hard_negative_max_new_tokens=4, batch_size=4)
    rows = mine_hard_negatives(tiny, pool, RuleOracle(), cfg, log=lambda s: None)
    assert [r["id"] for r in rows] == [ex.id for ex in pool]
    oracle = RuleOracle()
    for r, ex in zip(rows, pool):
        assert 1 <= len(r["attempts"]) <= 2
        kept = [a for a in r["attempts"] if a["decision"] == "kept"]
        assert len(kept) <= 1 and (not kept or r["attempts"][-1] is kept[0])
        assert r["fallback"] == (not kept) == (r["source"] == "rotation")
        assert not oracle.grade(r["hard_negative"], ex.answers, dataset="squad_v2").label
        assert not is_refusal(r["hard_negative"])
        if r["fallback"]:
            assert len(r["attempts"]) == 2 and r["hard_negative"] in {"Paris", "London",
                                                                     "Berlin", "Rome"}
    # seeded: the same call gives the same attempts
    again = mine_hard_negatives(tiny, pool, RuleOracle(), cfg, log=lambda s: None)
    assert again == rows


# --- training sets ----------------------------------------------------------------


def test_training_sets_are_balanced_and_mixed(qa_example):
    pool = [qa_example(i, f"answer {i}") for i in range(10)]
    negs = [{"hard_negative": f"wrong {i}", "source": "closed_book"} for i in range(10)]
    sets = build_training_sets(pool, negs, seed=0)
    assert {k: len(v) for k, v in sets.items()} == {"lora_gen": 10, "lora_eval": 10,
                                                     "lora_both": 10}
    ev = sets["lora_eval"]
    assert sum(it["label"] for it in ev) == 5
    for it, ex in zip(ev, pool):
        assert it["target"] == ("Correct" if it["label"] else "Incorrect")
        assert it["answer"] == (ex.answers[0] if it["label"] else f"wrong {ex.id[1:]}")
    assert all(it["target"] == ex.answers[0] for it, ex in zip(sets["lora_gen"], pool))
    both = sets["lora_both"]
    assert sum(it["task"] == "gen" for it in both) == 5
    assert sum(it["task"] == "eval" and it["label"] for it in both) in (2, 3)


# --- the learning rate, chosen on held-out training records ----------------------------------


def _rec(y: bool, verdict: bool | None) -> dict:
    return {"oracle_label": y, "verdict": verdict, "status": "ok"}


def test_judge_balanced_accuracy_scores_a_constant_judge_at_most_half():
    # 3 right answers, 1 wrong: accepting all is right 3/4 times (EA 0.75) but balanced 0.5
    recs = [_rec(True, True)] * 3 + [_rec(False, True)]
    assert judge_balanced_accuracy(recs) == 0.5
    # a missing verdict is wrong on either label
    assert judge_balanced_accuracy([_rec(True, None), _rec(False, None)]) == 0.0
    # right on 2 of 3 correct answers and 1 of 1 wrong: (2/3 + 1) / 2
    recs = [_rec(True, True), _rec(True, True), _rec(True, False), _rec(False, False)]
    assert judge_balanced_accuracy(recs) == pytest.approx((2 / 3 + 1) / 2)
    # one label only: undefined (rejecting every wrong answer is not a judge scoring 1)
    assert judge_balanced_accuracy([_rec(False, False)]) is None
    assert judge_balanced_accuracy([]) is None


def test_selection_score_follows_the_rule_and_marks_collapse():
    own = [_rec(True, True), _rec(False, None), _rec(False, True), _rec(False, False)]
    judged = [_rec(True, True), _rec(True, False), _rec(False, False), _rec(False, False)]
    gen = selection_score("lora_gen", own=own)
    ev = selection_score("lora_eval", judged=judged)
    both = selection_score("lora_both", own=own, judged=judged)
    assert gen["score"] == gen["GA"] == 0.25 and gen["collapsed"] is None
    assert ev["score"] == ev["judge_balanced_accuracy"] == 0.75
    assert both["score"] == pytest.approx((0.25 + 0.75) / 2)
    assert not ev["collapsed"] and ev["accept_share"] == 0.25 and ev["n_judged"] == 4
    flat = selection_score("lora_eval", judged=[_rec(True, False), _rec(False, False)])
    assert flat["collapsed"] and flat["score"] == 0.5 and flat["accept_share"] == 0.0
    # records that failed (not ok) do not count; a missing side leaves the score undefined
    assert selection_score("lora_gen", own=own + [{"status": "error"}])["n_own"] == 4
    assert selection_score("lora_both", own=own)["score"] is None
    with pytest.raises(StageError, match="no selection rule for adapter 'lora_x'"):
        selection_score("lora_x", own=own)


def test_choose_learning_rates_ranks_collapsed_judges_last_and_ties_to_the_smaller_rate():
    def s(score, collapsed=False):
        return {"score": score, "collapsed": collapsed}
    scores = {1e-4: {"lora_gen": s(0.2, None), "lora_eval": s(0.6)},
              3e-4: {"lora_gen": s(0.4, None), "lora_eval": s(0.6)},
              1e-3: {"lora_gen": s(None, None), "lora_eval": s(0.5, True)}}
    got = choose_learning_rates(scores)
    assert {a: c["lr"] for a, c in got.items()} == {"lora_gen": 3e-4, "lora_eval": 1e-4}
    assert got["lora_gen"]["by"] == "held-out score"
    # a collapsed judge loses to one that is not, even with a higher score
    got = choose_learning_rates({1e-4: {"lora_eval": s(0.55)}, 1e-3: {"lora_eval": s(0.9, True)}})
    assert got["lora_eval"]["lr"] == 1e-4
    got = choose_learning_rates({1e-3: {"lora_gen": s(None)}, 1e-4: {"lora_gen": s(None)}})
    assert got == {"lora_gen": {"lr": 1e-4, "by": "smallest rate: no rate could be scored"}}


def test_holdout_split_spreads_the_held_out_records_over_the_pool():
    train, held = holdout_split(10, 3)
    assert held == [1, 5, 8] and sorted(train + held) == list(range(10))
    with pytest.raises(StageError, match="select_holdout = 10 must be between 1"):
        holdout_split(10, 10)


def test_lr_grid_settings_are_checked_before_any_work():
    assert TransferConfig(lr_grid=[3e-4, 1e-4, 3e-4]).lr_grid == [1e-4, 3e-4]
    with pytest.raises(StageError, match="lr_grid must list learning rates > 0"):
        TransferConfig(lr_grid=[0.0, 1e-4])
    with pytest.raises(StageError, match=r"select_holdout \(80\) must be under "
                                            r"max_train_examples \(80\)"):
        TransferConfig(lr_grid=[1e-4], select_holdout=80)


def test_mine_hard_negatives_prefer_samples_on_then_keeps_the_first(tiny, qa_example, lora_cfg):
    """A kept answer that is not preferred is held back; the first one held is the result."""
    pool = [qa_example(i, a) for i, a in enumerate(["Paris", "London", "Berlin", "Rome"])]
    cfg = lora_cfg(hard_negative_attempts=3, hard_negative_max_new_tokens=4, batch_size=4)
    plain = mine_hard_negatives(tiny, pool, RuleOracle(), cfg, rotation=False,
                                log=lambda s: None)
    never = mine_hard_negatives(tiny, pool, RuleOracle(), cfg, rotation=False,
                                prefer=lambda k, a: False, log=lambda s: None)
    for p, n in zip(plain, never):
        held = [a["answer"] for a in n["attempts"] if a["decision"] == "kept_not_preferred"]
        assert "kept" not in [a["decision"] for a in n["attempts"]]
        assert n["hard_negative"] == (held[0] if held else None)
        # the first attempt is the same draw: the plain miner kept it where it was usable
        if held and n["attempts"][0]["decision"] == "kept_not_preferred":
            assert p["hard_negative"] == held[0]
