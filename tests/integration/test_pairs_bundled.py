"""Pair builders on the bundled tokenizer: the prefix/suffix alignment of real candidates."""

from __future__ import annotations

import pytest

from interp.core.errors import PairError
from interp.judging.grading import RuleOracle
from interp.judging.prompts import get_template
from interp.methods.pairs import candidate_swap_pair, gen_eval_pair

pytestmark = pytest.mark.integration


def test_alignment_of_candidates_of_other_lengths(tokenizer, toy_records):
    tpl, oracle = get_template(), RuleOracle()
    r1 = toy_records[0]  # gold "Gustave Eiffel's company", own answer "Paris"
    p = candidate_swap_pair(tokenizer, tpl, r1, oracle)
    nc, nx = len(p.clean), len(p.corrupt)
    assert p.corrupt_source == "own" and nc > nx
    c0, c1 = p.corrupt.token_spans["candidate"]
    # the shared prefix ends where the candidates start; the suffix (template text after the
    # candidate and the verdict position) maps from the end; the candidate is unmapped
    assert p.start == c1 and p.pos_map[:c0] == list(range(c0))
    assert p.pos_map[c0:c1] == [-1] * (c1 - c0) and p.middle == (0, 0)
    assert p.pos_map[c1:] == list(range(c1 + nc - nx, nc))
    assert p.clean.input_ids[p.pos_map[-1]] == p.corrupt.input_ids[-1]
    assert "candidate" not in p.span_units() and p.span_units()["verdict"] == [nx - 1]
    # a "wrong" answer the oracle grades Correct is never used (issue 15's Kingdom of Sicily)
    rec = {**r1, "answers": ["the Kingdom of Sicily"], "oracle_label": True,
           "hard_negatives": ["Kingdom of Sicily,"]}
    with pytest.raises(PairError, match="no answer the oracle grades Incorrect"):
        candidate_swap_pair(tokenizer, tpl, rec, oracle)


def test_gen_to_eval_maps_the_last_position(tokenizer, toy_records):
    p = gen_eval_pair(tokenizer, get_template(), toy_records[0], "gen-to-eval")
    assert p.patchable() == [len(p.corrupt) - 1]
    # both prompts end with the same generation prompt of the chat template
    assert p.clean.input_ids[-3:] == p.corrupt.input_ids[-3:]
