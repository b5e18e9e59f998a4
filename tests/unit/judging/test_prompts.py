"""Prompt rendering: spans located in the rendered chat text and mapped to token positions.

The tests take the fixture ``tok``: here the tiny code-built tokenizer; the integration tests
(``tests/integration/test_prompts.py``) collect the same tests with the bundled SmolLM2 one.
"""

from __future__ import annotations

import pytest

from interp.judging.prompts import (
    PromptError,
    Template,
    get_template,
    load_templates,
    render,
)

CTX = "The Normans were a people in Normandy. In 911 Rollo founded the duchy; it cost 3.5 million."
Q = "Who founded the duchy?"


@pytest.fixture()
def tok(tiny_tokenizer):
    return tiny_tokenizer


def test_bundled_templates_are_valid():
    """All bundled variants load and the default one uses every eval field once."""
    t = load_templates()
    assert {"default", "reference", "closed_book"} <= set(t)
    assert "{answer}" in t["default"].eval_user


@pytest.mark.parametrize("task", ["gen", "eval"])
def test_spans_cover_their_text(tok, task):
    """Char spans hold the field text; every position has one label; span tokens decode back."""
    p = render(tok, get_template(), task, context=CTX, question=Q,
               answer="Rollo" if task == "eval" else None)
    assert p.text[slice(*p.char_spans["context"])] == CTX
    assert p.text[slice(*p.char_spans["question"])] == Q
    assert len(p.labels) == len(p.input_ids)
    assert set(p.labels) <= {"context", "question", "candidate", "template"}
    s, e = p.token_spans["context"]
    assert tok.decode(p.input_ids[s:e]).strip() == CTX
    s, e = p.token_spans["question"]
    assert tok.decode(p.input_ids[s:e]).strip() == Q
    if task == "eval":
        s, e = p.token_spans["candidate"]
        assert tok.decode(p.input_ids[s:e]).strip() == "Rollo"
    else:
        assert "candidate" not in p.token_spans
    # the rendered text re-tokenizes to the same ids (no BOS doubling, no lost tokens)
    assert tok.decode(p.input_ids) == p.text
    # the chat template's system turn and role markers are template positions
    assert p.labels[0] == "template" and p.labels[-1] == "template"


def test_candidate_equal_to_context_words(tok):
    """A candidate that also occurs in the context is located at its own field."""
    p = render(tok, get_template(), "eval", context=CTX, question=Q, answer="Normandy")
    s, e = p.char_spans["candidate"]
    assert s > p.char_spans["question"][1]
    assert p.text[s:e] == "Normandy"


def test_gen_and_eval_share_context_tokens(tok):
    """Same context format in both tasks (paper 3.1): identical context token ids."""
    g = render(tok, get_template(), "gen", context=CTX, question=Q)
    v = render(tok, get_template(), "eval", context=CTX, question=Q, answer="Rollo")
    gs, ge = g.token_spans["context"]
    vs, ve = v.token_spans["context"]
    assert g.input_ids[gs:ge] == v.input_ids[vs:ve]


def test_template_errors(tmp_path):
    """Unknown fields, missing fields and unknown variants are refused with names."""
    with pytest.raises(PromptError, match="unknown fields"):
        Template(name="x", gen_user="{context} {question} {foo}", eval_user="{question}{answer}")
    with pytest.raises(PromptError, match="lacks"):
        Template(name="x", gen_user="{context}", eval_user="{question}{answer}")
    with pytest.raises(PromptError, match="known"):
        get_template("nope")


def test_a_byte_level_token_with_its_leading_space_belongs_to_the_field_it_starts():
    from interp.judging.prompts import check_spans, label_positions

    text = "Context: Sample input"
    spans = {"context": (9, 21)}
    offsets = [(0, 8), (8, 15), (15, 21)]  # "Context:", "ĠSample" with its space, "Ġinput"
    labels = label_positions(text, offsets, spans)
    assert labels == ["template", "context", "context"]
    check_spans(text, offsets, spans, {"context": (1, 3)})


def test_a_span_whose_tokens_lose_its_text_is_refused_in_one_line():
    from interp.judging.prompts import check_spans, label_positions

    text = "Context: Sample input"
    spans = {"context": (9, 21)}
    # offsets one character late: "ĠSample" reported at (10, 16), so "S" is in no token
    offsets = [(0, 9), (10, 16), (16, 21)]
    labels = label_positions(text, offsets, spans)
    token_spans = {"context": (labels.index("context"), len(labels))}
    with pytest.raises(PromptError, match=r"^span 'context' loses its text at character 0 "
                                          r"\('S' of 'Sample input'\)"):
        check_spans(text, offsets, spans, token_spans)


def test_every_bundled_tokenizer_covers_its_fields(tokenizer):
    from interp.judging.prompts import get_template, render

    p = render(tokenizer, get_template("default"), "eval", context="Sample input text.",
               question="What is it?", answer="Sample")
    for name, (a, b) in p.token_spans.items():
        assert a < b, name


DECOMPOSED = ("Le cafe\u0301 est a\u0300 Paris. Rene\u0301 y e\u0301tait.",
              "Ou\u0300 est le cafe\u0301?", "Rene\u0301")
"""A context, question and candidate whose accents are decomposed (``e`` + U+0301)."""


def test_decomposed_accents_render_with_full_spans_through_an_nfc_normaliser():
    """A tokenizer that composes to NFC (as the bundled Qwen's does) keeps full spans.

    It folds each combining accent into the token of its letter; the spans keep every
    character of their field.
    """
    import unicodedata

    from tokenizers import normalizers

    from interp.judging.prompts import normalised_offsets
    from interp.testing import tiny_tokenizer

    nfc = tiny_tokenizer()
    nfc.backend_tokenizer.normalizer = normalizers.NFC()
    ctx, q, cand = DECOMPOSED
    p = render(nfc, get_template(), "eval", context=ctx, question=q, answer=cand)
    assert p.text[slice(*p.char_spans["context"])] == ctx           # the user's text, as given
    for name, field in (("context", ctx), ("question", q), ("candidate", cand)):
        a, b = p.token_spans[name]
        assert nfc.decode(p.input_ids[a:b]).strip() == unicodedata.normalize("NFC", field)
    # the raw offsets leave each accent out; the mapped ones give it to its letter's token
    enc = nfc(ctx, add_special_tokens=False, return_offsets_mapping=True)
    accent = ctx.index("\u0301")
    assert not any(s <= accent < e for s, e in enc["offset_mapping"])
    assert any(s <= accent < e for s, e in normalised_offsets(nfc, ctx, enc["offset_mapping"]))


def test_offsets_of_a_tokenizer_without_a_normaliser_are_not_moved():
    from interp.judging.prompts import normalised_offsets
    from interp.testing import tiny_tokenizer

    plain = tiny_tokenizer()
    assert plain.backend_tokenizer.normalizer is None
    offsets = [(0, 9), (10, 16), (16, 21)]   # a gap a normaliser did not make stays a gap
    assert normalised_offsets(plain, "Context: Sample input", offsets) == offsets


def test_the_fewshot_judge_shows_train_examples_and_no_validation_passage():
    """The few-shot judge's worked examples come from the TRAIN split only.

    Whole bundled SQuAD 2.0 TRAIN records (passage, question), two graded Correct with their
    gold answer and two Incorrect with another answer; no passage of any bundled validation
    file appears in the prompt.
    """
    import json
    import re
    from pathlib import Path

    t = get_template("fewshot")
    root = Path(__file__).resolve().parents[3] / "interp" / "bundled"
    train = {r["id"]: r for r in map(json.loads, (root / "squad_v2/train.jsonl").open())}
    ids = re.findall(r"\b[0-9a-f]{24}\b", t.description)
    assert len(ids) == 4
    verdicts = re.findall(r"Verdict: (Correct|Incorrect)", t.eval_user)
    assert sorted(verdicts) == ["Correct", "Correct", "Incorrect", "Incorrect"]
    for rid in ids:
        r = train[rid]
        assert f"Context: {r['context']}\nQuestion: {r['question']}\n" in t.eval_user
        block = t.eval_user.split(f"Question: {r['question']}\n", 1)[1].split("\n\n", 1)[0]
        answer, verdict = re.match(r"Proposed answer: (.*)\nVerdict: (\w+)", block).groups()
        assert (verdict == "Correct") == (answer in r["answers"]) and answer in r["context"]
    for f in root.glob("*/validation.jsonl"):
        for r in map(json.loads, f.open()):
            assert r["context"] not in t.eval_user
