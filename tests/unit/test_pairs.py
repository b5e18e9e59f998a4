"""Clean/corrupt pair builders: candidate sources, alignment rule, task-swap position map."""

from __future__ import annotations

import pytest

from interp.errors import PatchingError
from interp.pairs import (
    build_pairs,
)
from interp.prompts import get_template


def test_build_pairs_limit_refusals_and_kinds(tokenizer, toy_records):
    tpl = get_template()
    pairs, refused = build_pairs(toy_records, "candidate-swap", tpl, tokenizer,
                                 log=lambda s: None)
    assert len(pairs) + len(refused) == 4 and len(pairs) >= 3
    assert all(set(r) == {"id", "dataset", "reason"} for r in refused)
    two, _ = build_pairs(toy_records, "task-swap", tpl, tokenizer, limit=2, log=lambda s: None)
    assert [p.record_id for p in two] == ["r1", "r2"]
    short, refused = build_pairs(toy_records, "task-swap", tpl, tokenizer, max_tokens=10,
                                 log=lambda s: None)
    assert not short and "max_tokens 10" in refused[0]["reason"]
    with pytest.raises(PatchingError, match="unknown pair kind"):
        build_pairs(toy_records, "swap", tpl, tokenizer)
