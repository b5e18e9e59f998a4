"""Prompt rendering with the bundled SmolLM2 tokenizer.

Every test of ``tests/unit/judging/test_prompts.py`` runs again here with ``tok`` = the bundled
tokenizer, plus what only SmolLM2's chat template does.
"""

from __future__ import annotations

import pytest

from interp.judging.prompts import get_template, render
from tests.unit.judging.test_prompts import *  # noqa: F403 - the same tests, collected with this `tok`
from tests.unit.judging.test_prompts import CTX, Q

pytestmark = pytest.mark.integration


@pytest.fixture()
def tok(tokenizer):
    return tokenizer


def test_default_system_prompt_is_template(tok):
    """SmolLM2's chat template inserts its own system turn when a variant has none."""
    p = render(tok, get_template("closed_book"), "eval", context=CTX, question=Q,
               answer="Rollo")
    assert p.text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    first = p.token_spans["question"][0]
    assert set(p.labels[:first]) == {"template"}
    s, e = p.token_spans["candidate"]
    assert tok.decode(p.input_ids[s:e]).strip() == "Rollo"


@pytest.mark.parametrize("which, n_instruction", [("smol_tok", 24), ("qwen_tok", 21)])
def test_matched_template_has_equal_instructions(request, which, n_instruction):
    """``matched``: one system prompt and instructions of equal token length (both tokenizers).

    On real records, the tokens before the context (system turn, "Context: ") are the same in
    gen and eval, and the instruction (the sentence after the last field) spans as many tokens
    in gen as in eval: the tokens lying inside its characters in the rendered prompt.
    """
    from interp.data import load_examples

    def instruction_tokens(p, instruction):
        start = p.text.rindex(instruction)
        enc = tok(p.text, add_special_tokens=False, return_offsets_mapping=True)
        assert enc["input_ids"] == p.input_ids
        return sum(start <= s and e <= start + len(instruction) for s, e in enc["offset_mapping"])

    tok = request.getfixturevalue(which)
    tpl = get_template("matched")
    assert tpl.gen_system == tpl.eval_system
    gen_instr, eval_instr = (u.rsplit("\n\n", 1)[1] for u in (tpl.gen_user, tpl.eval_user))
    for ex in load_examples("squad_v2", limit=4) + load_examples("drop", limit=4):
        g = render(tok, tpl, "gen", context=ex.context, question=ex.question)
        e = render(tok, tpl, "eval", context=ex.context, question=ex.question,
                   answer=ex.answers[0])
        head = g.token_spans["context"][0]
        assert head == e.token_spans["context"][0] and g.input_ids[:head] == e.input_ids[:head]
        assert instruction_tokens(g, gen_instr) == n_instruction
        assert instruction_tokens(e, eval_instr) == n_instruction
