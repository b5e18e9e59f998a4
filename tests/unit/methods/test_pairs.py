"""Clean/corrupt pair builders: alignment, corrupt sources, the oracle invariant, skip reasons."""

from __future__ import annotations

from dataclasses import replace

import pytest

from interp.core.errors import PairError, StageError
from interp.judging.grading import RuleOracle
from interp.judging.prompts import get_template, render
from interp.methods.pairs import (
    align_positions,
    build_pairs,
    candidate_swap_pair,
    control_pair,
    gen_eval_pair,
)


def test_align_positions_prefix_suffix_and_middle():
    # unequal lengths: the middle maps to -1, the suffix from the end
    pm, p, mid = align_positions([1, 2, 3, 4, 5, 9, 9], [1, 2, 3, 7, 7, 7, 9, 9])
    assert (pm, p, mid) == ([0, 1, 2, -1, -1, -1, 5, 6], 3, (0, 0))
    # equal lengths: identity, the middle [2, 4) patched only as a whole
    assert align_positions([1, 2, 3, 4, 9], [1, 2, 8, 8, 9]) == ([0, 1, 2, 3, 4], 2, (2, 4))
    # a shared tail inside the candidate belongs to the suffix
    pm, p, mid = align_positions([1, 5, 6, 9], [1, 7, 5, 6, 9])
    assert (pm, p, mid) == ([0, -1, 1, 2, 3], 1, (0, 0))
    with pytest.raises(PairError, match="identical") as err:
        align_positions([1, 2], [1, 2])
    assert err.value.reason == "identical_prompts"
    # the reverse pair (noising: the clean prompt takes the corrupt run's activations) is
    # aligned by the inverse map on every position both maps pair up
    for a, b in (([1, 2, 3, 4, 5, 9, 9], [1, 2, 3, 7, 7, 7, 9, 9]), ([1, 5, 6, 9], [1, 7, 5, 6, 9]),
                 ([1, 2, 3, 4, 9], [1, 2, 8, 8, 9])):
        fwd, _, _ = align_positions(a, b)
        rev, _, _ = align_positions(b, a)
        assert {(i, j) for i, j in enumerate(fwd) if j >= 0} == \
            {(j, i) for i, j in enumerate(rev) if j >= 0}


def test_candidate_sources_in_order_and_the_oracle_invariant(tokenizer, toy_records):
    tpl, oracle = get_template(), RuleOracle()
    r1, r2, r3, r4 = toy_records
    # own wrong answer first
    p = candidate_swap_pair(tokenizer, tpl, r2, oracle, mine=lambda r: ["never asked"])
    assert (p.corrupt_source, p.clean_answer, p.corrupt_answer) == ("own", "1889", "1890")
    pm, prefix, _ = align_positions(p.clean.input_ids, p.corrupt.input_ids)
    # the first patchable position: after the shared prefix, past the unmatched middle
    assert p.pos_map == pm and p.start == p.patchable()[0]
    assert p.start == next(i for i in range(prefix, len(pm)) if pm[i] >= 0)
    assert p.corrupt.input_ids[-1] == p.clean.input_ids[-1] and p.pos_map[-1] == len(p.clean) - 1
    # own answer right: a stored hard negative, graded by the oracle ("paris" is rejected: it
    # is the gold of r3 up to case), then the miner
    asked = []
    rec = {**r3, "hard_negatives": ["paris", "Lyon"]}
    p = candidate_swap_pair(tokenizer, tpl, rec, oracle,
                            mine=lambda r: asked.append(r["id"]) or ["Rome"])
    assert (p.corrupt_source, p.corrupt_answer, asked) == ("hard_negative", "Lyon", [])
    p = candidate_swap_pair(tokenizer, tpl, r3, oracle, mine=lambda r: ["Paris, France", "Rome"])
    assert (p.corrupt_source, p.corrupt_answer) == ("mined", "Rome")
    # nothing the oracle grades Incorrect: skipped with a reason, never another gold
    with pytest.raises(PairError, match="no answer the oracle grades Incorrect") as err:
        candidate_swap_pair(tokenizer, tpl, r4, oracle, mine=lambda r: ["france"])
    assert err.value.reason == "no_incorrect_answer"
    with pytest.raises(PairError) as err:
        candidate_swap_pair(tokenizer, tpl, {**r1, "answers": [" "]}, oracle)
    assert err.value.reason == "no_gold"
    # the invariant, over every record and source: no corrupt answer is oracle-correct
    pairs, _ = build_pairs([{**r, "hard_negatives": ["Paris", "1889", "Lyon"]}
                            for r in toy_records], "candidate-swap", tpl, tokenizer,
                           oracle=oracle, mine=lambda r: ["France", "Rome"], log=lambda s: None)
    assert len(pairs) == 4
    for p, r in zip(pairs, toy_records):
        assert not oracle.grade(p.corrupt_answer, r["answers"], dataset="toy").label


def test_last_position_pairs_and_the_control(tokenizer, toy_records):
    tpl = get_template()
    r = toy_records[0]
    g2e = gen_eval_pair(tokenizer, tpl, r, "gen-to-eval")
    assert g2e.clean.task == "gen" and g2e.corrupt.task == "eval"
    assert g2e.pos_map == [-1] * (len(g2e.corrupt) - 1) + [len(g2e.clean) - 1]
    assert g2e.patchable() == [len(g2e.corrupt) - 1] and g2e.position_units() == []
    assert g2e.span_units()["verdict"] == [len(g2e.corrupt) - 1]
    e2g = gen_eval_pair(tokenizer, tpl, r, "eval-to-gen")
    assert (e2g.clean.task, e2g.corrupt.task) == ("eval", "gen")
    with pytest.raises(StageError, match="direction"):
        gen_eval_pair(tokenizer, tpl, r, "gen-to-gen")
    c = control_pair(tokenizer, tpl, r)
    (c0, c1), (g0, _) = c.corrupt.token_spans["context"], c.clean.token_spans["context"]
    assert c.pos_map[c0] == g0 and c.pos_map[c0 - 1] == -1 and c.start == c0
    assert c.span_units() == {"context": list(range(c0, c1)), "all": list(range(c0, c1))}
    # equal system prompts: the context is in the shared prefix, identical by construction
    same = replace(tpl, eval_system=tpl.gen_system)
    with pytest.raises(PairError, match="identical by construction") as err:
        control_pair(tokenizer, same, r)
    assert err.value.reason == "control_identity"


def test_build_pairs_limit_skips_and_kinds(tokenizer, toy_records):
    tpl = get_template()
    pairs, skipped = build_pairs(toy_records, "candidate-swap", tpl, tokenizer,
                                 log=lambda s: None)
    assert [p.record_id for p in pairs] == ["r1", "r2"]
    assert [(s["id"], s["reason"]) for s in skipped] == [("r3", "no_incorrect_answer"),
                                                          ("r4", "no_incorrect_answer")]
    two, _ = build_pairs(toy_records, "gen-to-eval", tpl, tokenizer, limit=2,
                         log=lambda s: None)
    assert [p.record_id for p in two] == ["r1", "r2"]
    short, skipped = build_pairs(toy_records, "eval-to-gen", tpl, tokenizer, max_tokens=10,
                                 log=lambda s: None)
    assert not short and {s["reason"] for s in skipped} == {"too_long"}
    with pytest.raises(StageError, match="unknown pair kind"):
        build_pairs(toy_records, "task-swap", tpl, tokenizer)


def test_equal_length_prefers_a_wrong_answer_of_the_gold_s_length(tokenizer, toy_records):
    """With equal_length the candidate span corresponds position by position (a unit)."""
    tpl, oracle = get_template(), RuleOracle()
    r2 = toy_records[1]                      # gold "1889"
    kw = {"context": r2["context"], "question": r2["question"], "reference": "1889"}

    def n_tokens(ans):
        return len(render(tokenizer, tpl, "eval", answer=ans, **kw))

    same = next(w for w in ("1890", "1898", "Rome", "1", "the")
                if n_tokens(w) == n_tokens("1889"))
    long_wrong = "the year eighteen hundred and ninety"
    rec = {**r2, "answer": long_wrong, "hard_negatives": [same]}
    plain = candidate_swap_pair(tokenizer, tpl, rec, oracle)
    assert plain.corrupt_answer == long_wrong and "candidate" not in plain.span_units()
    asked = []
    equal = candidate_swap_pair(tokenizer, tpl, rec, oracle, equal_length=True,
                                mine=lambda r: asked.append(1) or ["never"])
    assert (equal.corrupt_answer, equal.corrupt_source, asked) == (same, "hard_negative", [])
    assert len(equal.corrupt) == len(equal.clean) and equal.span_units()["candidate"]
    a, b = equal.middle
    assert 0 < b - a and equal.corrupt.input_ids[a:b] != equal.clean.input_ids[a:b]
    # none of the gold's length: the first usable one, as without the preference
    rec = {**r2, "answer": long_wrong, "hard_negatives": []}
    first = candidate_swap_pair(tokenizer, tpl, rec, oracle, equal_length=True,
                                mine=lambda r: ["also far too long an answer"])
    assert first.corrupt_answer == long_wrong
    # another record's gold of the gold's length is the last resort (never its own gold, never
    # one of another length, never without equal_length)
    others = ["1889", long_wrong, same]
    other = candidate_swap_pair(tokenizer, tpl, rec, oracle, equal_length=True,
                                mine=lambda r: ["also far too long an answer"], others=others)
    assert (other.corrupt_answer, other.corrupt_source) == (same, "other_gold")
    assert other.span_units()["candidate"]
    assert candidate_swap_pair(tokenizer, tpl, rec, oracle, others=others).corrupt_answer \
        == long_wrong
    assert candidate_swap_pair(tokenizer, tpl, rec, oracle, equal_length=True,
                               others=["1889", long_wrong]).corrupt_answer == long_wrong


def test_the_patching_stage_skips_a_pair_longer_than_the_models_positions(tokenizer, toy_records,
                                                                          monkeypatch):
    """One positions rule: a pair whose prompt and verdict reply exceed the model is skipped."""
    from interp.stages.patching import _fits_then
    from interp.testing import tiny_llama

    handle = tiny_llama(tokenizer, n_layers=1, d_model=32, n_heads=4, n_kv_heads=2)
    p = candidate_swap_pair(tokenizer, get_template(), toy_records[1], RuleOracle())
    n = max(len(p.clean), len(p.corrupt))
    seen = []
    check = _fits_then(handle, lambda pair: seen.append(pair) or None, reply=2)
    assert check(p) is None and seen == [p]          # fits: the gap filter decides
    monkeypatch.setattr(handle.model.config, "max_position_embeddings", n + 1)
    why = check(p)
    assert why == {"reason": "too_long", "message": f"patching prompt has {n} tokens; with 2 "
                   f"for the verdict reply it exceeds the model's {n + 1} positions"}
    assert seen == [p]                                # never scored
