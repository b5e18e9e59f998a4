"""Span labels (issue 12 item 1).

A token is in a field's span only if it shares a non-whitespace character with it (or lies
inside it); adjacent fields never share a token; every span decodes to its field's text
(stripped), for the candidate, context and question, both tasks, both models.
"""

from __future__ import annotations

import pytest

from interp.data import load_examples
from interp.judging.prompts import get_template, label_positions, render

pytestmark = pytest.mark.integration  # these tests read the bundled model files

SMOL = "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-0.5b-instruct"
CTX = "The Normans gave their name to Normandy, a region in France. Their leader was Rollo."


def _sentencepiece_encoding():
    """A SentencePiece-style encoding of 'Sample input'.

    A SentencePiece-style tokenizer built with `tokenizers`: Metaspace, and offsets that
    include the space before a word, as Llama-2/Mistral tokenizers report them.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tk = Tokenizer(models.WordLevel({"<s>": 0, "▁Sample": 1, "▁input": 2, "<unk>": 3},
                                    unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tk.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                      special_tokens=[("<s>", 0)])
    return tk.encode("Sample input")


def test_sentencepiece_offsets_with_leading_space():
    """SentencePiece offsets: each field gets only its own token.

    'Sample ' = (0, 7) gets token 1 only, 'input' = (7, 12) token 2 only, alone or together
    (the space at 6 is inside the offsets of '▁input' but is whitespace).
    """
    enc = _sentencepiece_encoding()
    assert enc.tokens == ["<s>", "▁Sample", "▁input"]
    assert enc.offsets == [(0, 0), (0, 6), (6, 12)]
    text = "Sample input"
    assert label_positions(text, enc.offsets, {"question": (0, 7)}) == [
        "template", "question", "template"]
    assert label_positions(text, enc.offsets, {"candidate": (7, 12)}) == [
        "template", "template", "candidate"]
    assert label_positions(text, enc.offsets, {"question": (0, 7), "candidate": (7, 12)}) == [
        "template", "question", "candidate"]


def test_label_rule_on_handmade_offsets():
    """The labelling rule on hand-made offsets.

    Whitespace shared at a field's edge never counts, whitespace inside a field does; a
    token with non-whitespace in two fields goes to the one with more of it; zero-width tokens
    are template.
    """
    text = "ab cd\n ef"
    spans = {"context": (0, 3), "question": (3, 9)}
    offsets = [(0, 0), (0, 2), (2, 3), (2, 4), (4, 5), (5, 7), (7, 9)]
    assert label_positions(text, offsets, spans) == [
        "template", "context", "context", "question", "question", "question", "question"]
    spans = {"context": (0, 2), "question": (3, 5)}  # ' ' at 2 and '\n ef' are template
    offsets = [(0, 2), (2, 3), (2, 5), (5, 7), (7, 9)]
    assert label_positions(text, offsets, spans) == [
        "context", "template", "question", "template", "template"]
    # 'b c' (1, 4): one non-space char in each field -> the first listed wins the tie
    assert label_positions(text, [(1, 4)], spans) == ["context"]
    assert label_positions(text, [(1, 5)], spans) == ["question"]


def test_candidate_with_trailing_space_smollm(smol_tok):
    """SmolLM2: the candidate 'Paris ' is ['ĠParis'], not ['ĠParis', 'ĠĊ']."""
    p = render(smol_tok, get_template(), "eval", context=CTX, question="Where is Normandy?",
               answer="Paris ")
    s, e = p.token_spans["candidate"]
    assert smol_tok.convert_ids_to_tokens(p.input_ids[s:e]) == ["ĠParis"]
    assert smol_tok.convert_ids_to_tokens(p.input_ids[e:e + 1]) == ["ĠĊ"]  # now template
    assert p.labels[e] == "template"


def test_whitespace_only_candidate_has_no_span(smol_tok):
    """A candidate of spaces holds no non-whitespace: no span, no error."""
    p = render(smol_tok, get_template(), "eval", context=CTX, question="Who?", answer="   ")
    assert "candidate" not in p.token_spans
    assert set(p.token_spans) == {"context", "question"}


@pytest.mark.parametrize(("dataset", "n_expected"), [("squad_v2", 9), ("hotpotqa", 23)])
def test_questions_ending_in_space_leave_the_newline_out(smol_tok, dataset, n_expected):
    """Questions ending in a space leave the newline token out.

    Every bundled question that ends in a space (9 SQuAD 2.0, 23 HotpotQA answerable
    validation questions) spans exactly its stripped text; the newline token after it is
    template, in both tasks.
    """
    examples = [e for e in load_examples(dataset) if e.question.endswith(" ")]
    assert len(examples) == n_expected
    for ex in examples:
        for task in ("gen", "eval"):
            p = render(smol_tok, get_template(), task, context=ex.context, question=ex.question,
                       answer="x" if task == "eval" else None)
            s, e = p.token_spans["question"]
            assert smol_tok.decode(p.input_ids[s:e]).strip() == ex.question.strip()
            assert not any("Ċ" in t for t in smol_tok.convert_ids_to_tokens(p.input_ids[s:e]))
            assert "Ċ" in smol_tok.convert_ids_to_tokens(p.input_ids[e])


def _all_bundled_examples():
    out = []
    for ds, splits in (("squad_v2", ("validation", "train")), ("drop", ("validation",)),
                       ("hotpotqa", ("validation", "train")),
                       ("musique", ("validation", "train"))):
        for split in splits:
            out += load_examples(ds, split=split, include_unanswerable=True)
    return out


def _check_spans(tok, ex, task):
    answer = (ex.answers[0] if ex.answers else "unanswerable") if task == "eval" else None
    p = render(tok, get_template(), task, context=ex.context, question=ex.question,
               answer=answer)
    fields = {"context": ex.context, "question": ex.question, "candidate": answer}
    spans = sorted(p.token_spans.items(), key=lambda kv: kv[1])
    for (_, (_, end)), (_, (start, _)) in zip(spans, spans[1:]):
        assert end <= start  # adjacent fields never share a token
    bad = [name for name, (s, e) in p.token_spans.items()
           if tok.decode(p.input_ids[s:e]).strip() != fields[name].strip()]
    assert set(p.token_spans) == {k for k, v in fields.items() if v is not None and v.strip()}
    return bad


@pytest.mark.parametrize("alias", [SMOL, QWEN])
def test_every_bundled_span_decodes_to_its_field(alias, request):
    """Every span of every bundled record decodes to its field.

    All 2,215 bundled records (every dataset and split), gen and eval prompts, with the
    first gold answer as candidate: each span decodes to its field's stripped text.
    """
    tok = request.getfixturevalue("smol_tok" if alias == SMOL else "qwen_tok")
    examples = _all_bundled_examples()
    assert len(examples) == 2215
    bad = [(ex.dataset, ex.id, task, names) for ex in examples for task in ("gen", "eval")
           if (names := _check_spans(tok, ex, task))]
    assert bad == []


@pytest.mark.parametrize("alias", [SMOL, QWEN])
@pytest.mark.parametrize("task", ["gen", "eval"])
def test_decomposed_accents_render_on_the_bundled_tokenizers(alias, task, request):
    """Contexts with decomposed accents (``e`` + U+0301) render on both bundled tokenizers.

    Qwen's tokenizer composes them (NFC), SmolLM2's keeps the marks as tokens; each span
    decodes to its field.
    """
    import unicodedata

    tok = request.getfixturevalue("smol_tok" if alias == SMOL else "qwen_tok")
    ctx = "Rene\u0301 Descartes e\u0301tait a\u0300 Paris; le cafe\u0301 de\u0301barque."
    q, cand = "Ou\u0300 e\u0301tait Rene\u0301?", "a\u0300 Paris"
    assert (tok.backend_tokenizer.normalizer is not None) == (alias == QWEN)
    p = render(tok, get_template(), task, context=ctx, question=q,
               answer=cand if task == "eval" else None)
    fields = {"context": ctx, "question": q, **({"candidate": cand} if task == "eval" else {})}
    assert set(p.token_spans) == set(fields)
    for name, field in fields.items():
        a, b = p.token_spans[name]
        assert unicodedata.normalize("NFC", tok.decode(p.input_ids[a:b]).strip()) == \
            unicodedata.normalize("NFC", field), name
