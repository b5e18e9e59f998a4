"""Pair builders on the bundled tokenizer (the alignment rule needs equal candidate lengths)."""

from __future__ import annotations

import pytest

from interp.errors import PairError
from interp.pairs import candidate_swap_pair, check_candidate_alignment, task_swap_pair
from interp.prompts import get_template, render

pytestmark = pytest.mark.integration


def test_alignment_rule(tokenizer, patch_prompts, toy_records):
    tpl = get_template()
    clean, corrupt = patch_prompts
    ctx, q = toy_records[0]["context"], toy_records[0]["question"]
    start = check_candidate_alignment(clean, corrupt)
    assert start == clean.token_spans["candidate"][0]
    other = render(tokenizer, tpl, "eval", context=ctx.replace("1889", "1890"), question=q,
                   answer="Lyon")
    with pytest.raises(PairError, match="outside the candidate span .* at position"):
        check_candidate_alignment(clean, other)
    longer = render(tokenizer, tpl, "eval", context=ctx, question=q,
                    answer="the city of Lyon in France")
    with pytest.raises(PairError, match="equal token length"):
        check_candidate_alignment(clean, longer)
    with pytest.raises(PairError, match="identical"):
        check_candidate_alignment(clean, clean)


def test_pairs_from_records(tokenizer, toy_records):
    tpl = get_template()
    recs = toy_records
    p = candidate_swap_pair(tokenizer, tpl, recs[1], recs)
    assert p.corrupt_source == "own" and p.clean_answer == "1889"
    assert p.clean.token_spans["candidate"] == p.corrupt.token_spans["candidate"]
    assert p.key == "toy__r2"
    p3 = candidate_swap_pair(tokenizer, tpl, recs[2], recs)  # own answer right: rotation
    assert p3.corrupt_source == "rotation" and p3.corrupt_answer != "Paris"
    with pytest.raises(PairError, match="no wrong candidate"):
        candidate_swap_pair(tokenizer, tpl, recs[2], [])
    t = task_swap_pair(tokenizer, tpl, recs[0])
    c0, c1 = t.corrupt.token_spans["context"]
    g0, _ = t.clean.token_spans["context"]
    assert t.corrupt.input_ids[c0:c1] == t.clean.input_ids[g0:g0 + c1 - c0]
    assert t.pos_map[c0] == g0 and t.pos_map[c0 - 1] == -1 and t.start == c0
