"""Tests for interp.grading: official SQuAD/DROP metrics, parsers and the rule oracle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interp.grading import (
    BaseOracle,
    OracleResult,
    RuleOracle,
    drop_em_f1,
    extract_answer,
    is_abstention,
    normalize_answer,
    parse_verdict,
    split_spans,
    squad_em,
    squad_f1,
)

BUNDLED = Path(__file__).resolve().parents[2] / "interp" / "bundled"


# ---------------------------------------------------------------- SQuAD v2.0 official metrics


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Cat, sat!", "cat sat"),
        ("  An   apple\ta day ", "apple day"),
        ("theatre", "theatre"),  # articles only as whole words
        ("U.S. $1,000.50", "us 100050"),
        ("", ""),
    ],
)
def test_normalize_answer(raw, expected):
    """Official SQuAD normalisation."""
    assert normalize_answer(raw) == expected


def test_squad_f1_by_hand():
    """Token F1 computed by hand."""
    # pred [cat, sat], gold [cat, sat, down]: P = 1, R = 2/3, F1 = 2PR/(P+R) = 0.8
    assert squad_f1("the cat sat", ["a cat sat down"]) == pytest.approx(0.8)
    assert squad_em("the cat sat", ["a cat sat down"]) == 0.0


def test_squad_multiset_overlap_and_max_over_golds():
    """Multiset overlap and max over golds."""
    # pred [cat, cat], gold [cat]: multiset overlap 1, P = 1/2, R = 1 -> F1 = 2/3
    assert squad_f1("cat cat", ["cat"]) == pytest.approx(2 / 3)
    assert squad_f1("Denver Broncos", ["Broncos", "Denver Broncos"]) == 1.0
    assert squad_em("the Denver Broncos.", ["Broncos", "Denver Broncos"]) == 1.0
    assert squad_f1("Paris", ["London"]) == 0.0


def test_squad_unanswerable_semantics():
    """Empty golds score the no-answer string."""
    assert squad_em("", []) == 1.0 and squad_f1("", []) == 1.0
    assert squad_em("  the . ", []) == 1.0  # normalises to ""
    assert squad_em("Paris", []) == 0.0 and squad_f1("Paris", []) == 0.0
    # golds that normalise to "" are dropped; all dropped -> no-answer gold
    assert squad_em("", ["the", "."]) == 1.0
    assert squad_f1("", ["Paris"]) == 0.0


# ---------------------------------------------------------------- DROP official metrics


def test_drop_number_normalisation():
    """DROP canonicalises numbers."""
    assert drop_em_f1("2,206", ["2206"]) == (1.0, 1.0)
    assert drop_em_f1("3.0", ["3"]) == (1.0, 1.0)
    assert drop_em_f1("3.5", ["3.5"]) == (1.0, 1.0)


def test_drop_numbers_must_match():
    """DROP F1 is 0 when numbers differ."""
    assert drop_em_f1("43", ["64"]) == (0.0, 0.0)
    # a span with the wrong number scores 0 even though "yard" overlaps
    assert drop_em_f1("43 yard", ["64 yard"]) == (0.0, 0.0)
    # max over golds: "43" matches the second gold
    assert drop_em_f1("43", ["64", "43"]) == (1.0, 1.0)


def test_drop_hyphen_tokenisation_and_rounding():
    """DROP splits on hyphens and rounds F1."""
    # "57-yard" -> bag {57.0, yard} vs {57.0}: P = 1/2, R = 1, F1 = 0.666.. rounded to 0.67
    assert drop_em_f1("57-yard", ["57"]) == (0.0, 0.67)


def test_drop_multi_span_bag_alignment():
    """Multi-span answers align bags one-to-one."""
    assert drop_em_f1("Bengals, Cowboys", [["Cowboys", "Bengals"]]) == (1.0, 1.0)
    assert drop_em_f1("Bengals and Cowboys", ["Cowboys, Bengals"], multi_span=True) == (1.0, 1.0)
    assert drop_em_f1(["Cowboys", "Bengals"], [["Bengals", "Cowboys"]]) == (1.0, 1.0)
    # one of two gold spans: aligned F1s [1, 0] averaged -> 0.5
    assert drop_em_f1("Bengals", [["Cowboys", "Bengals"]]) == (0.0, 0.5)
    # three predicted spans for two gold spans: mean over max(2, 3) bags = 2/3
    assert drop_em_f1("Bengals, Cowboys, Jets", [["Cowboys", "Bengals"]]) == (0.0, 0.67)
    # the record form: '100 Peso note, 500 Pesos note' split on ", " only when multi-span
    golds = ["100 Peso note, 500 Pesos note", "500 Pesos note", "100, 500"]
    assert drop_em_f1("500 Pesos note and 100 Peso note", golds, multi_span=True) == (1.0, 1.0)


def test_drop_single_span_with_comma_is_not_split():
    """A single span keeps its comma."""
    gold = ["The town of Motul, Yucatan"]
    assert drop_em_f1("the town of Motul, Yucatan", gold) == (1.0, 1.0)
    assert drop_em_f1("Motul", ["Motul, Yucatan"]) == (0.0, 0.67)


def test_drop_empty_golds():
    """Blank golds are skipped."""
    assert drop_em_f1("1943", ["", "1943"]) == (1.0, 1.0)
    assert drop_em_f1("1943", [""]) == (0.0, 0.0)
    assert drop_em_f1("1943", []) == (0.0, 0.0)


def test_split_spans():
    """Prediction span splitting."""
    assert split_spans("Bengals, Cowboys and Jets") == ["Bengals", "Cowboys", "Jets"]
    assert split_spans("A, B, and C") == ["A", "B", "C"]
    assert split_spans("1,000") == ["1,000"]
    assert split_spans("Bengals or Cowboys") == ["Bengals or Cowboys"]
    assert split_spans("  ") == [""]


# ---------------------------------------------------------------- extract_answer


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  Paris  ", "Paris"),
        ("1939.", "1939"),
        ("3.5", "3.5"),
        ("3.5.", "3.5"),
        ("$1,000.50", "$1,000.50"),
        ("$1,000.50.", "$1,000.50"),
        ("U.S.", "U.S."),
        ("Washington, D.C.", "Washington, D.C."),
        ("St. Louis.", "St. Louis"),
        ("Paris.\nQuestion: What is the capital of Italy?", "Paris"),
        ("Answer: Tony Romo", "Tony Romo"),
        ("A: 12", "12"),
        ("The answer is Tony Romo.", "Tony Romo"),
        ("The final answer is: 42", "42"),
        ("**Answer:** Normandy", "Normandy"),
        ("Answer:\nNormandy", "Normandy"),
        ('"Paris"', "Paris"),
        ('"Paris".', "Paris"),
        ("\u201cParis.\u201d", "Paris"),
        ("**Paris**", "Paris"),
        ('"A" and "B"', '"A" and "B"'),
        ("A dog.", "A dog"),  # the article "A" is not an "A:" prefix
        ("Wait...", "Wait..."),
        ("", ""),
    ],
)
def test_extract_answer(raw, expected):
    """Answer extraction from greedy generations."""
    assert extract_answer(raw) == expected


# ---------------------------------------------------------------- parse_verdict


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Correct", True),
        ("Incorrect", False),
        ("correct.", True),
        ("**Correct**", True),
        ("**Incorrect**", False),
        ("Incorrect. The answer should be 1943, the correct year.", False),
        ("Correct. It is not incorrect.", True),
        ("Not correct", False),
        ("The answer isn't correct.", False),
        ("The answer is correct", True),
        ("The proposed answer is incorrect", False),
        ("Correct or Incorrect", None),
        ("correct/incorrect? Incorrect", False),
        ("", None),
        ("Yes", None),
        ("No", None),
        ("The answer was given correctly", None),
    ],
)
def test_parse_verdict(reply, expected):
    """Judge verdict parsing."""
    assert parse_verdict(reply) is expected


# ---------------------------------------------------------------- is_abstention


@pytest.mark.parametrize(
    "text",
    [
        "I need more information to answer this question.",
        "This cannot be determined from the context.",
        "The answer is not mentioned in the context.",
        "Unanswerable",
        "I don\u2019t know.",
        "There is no answer in the passage.",
        "Not enough information.",
        "The context does not say who founded it.",
        "The provided text doesn't mention this.",
        "Unknown",
        "N/A",
        "None",
        "It is unclear from the passage.",
        "I'm sorry, but I can't answer that.",
        "It is impossible to determine.",
    ],
)
def test_is_abstention_true(text):
    """Refusals are detected."""
    assert is_abstention(text)


@pytest.mark.parametrize(
    "text",
    ["Paris", "Tony Romo", "1943", "The Unknown Soldier", "No", "Normandy", "none of them won", ""],
)
def test_is_abstention_false(text):
    """Answers are not refusals."""
    assert not is_abstention(text)


# ---------------------------------------------------------------- oracles


def test_rule_oracle_interface():
    """RuleOracle implements BaseOracle."""
    oracle = RuleOracle()
    assert isinstance(oracle, BaseOracle) and oracle.name == "rule"
    res = oracle.grade("Paris", ["Paris"], dataset="squad_v2")
    assert res == OracleResult(True, 1.0, 1.0, "em")
    with pytest.raises(ValueError):
        oracle.grade("Paris", ["Paris"], dataset="triviaqa")
    with pytest.raises(TypeError):
        BaseOracle()  # abstract


@pytest.mark.parametrize(
    ("pred", "golds", "dataset", "label", "rule"),
    [
        ("the Normans", ["Normans"], "squad_v2", True, "em"),
        ("Romo", ["Tony Romo"], "squad_v2", True, "f1"),  # F1 0.67 >= 0.6
        ("Patrick Ewing", ["Patrick Crayton"], "squad_v2", False, "no_match"),  # F1 0.5
        ("It was founded in 1850 by the Normans", ["the Normans"], "musique", True, "contained"),
        (
            "The Normans, Franks, Vikings, Saxons, Danes and many other peoples of the region",
            ["the Normans"],
            "musique",
            False,
            "list",
        ),
        ("Normans or Vikings", ["Normans"], "hotpotqa", False, "hedge"),
        ("Paris, France", ["Paris"], "hotpotqa", False, "list"),
        ("March 1944", ["March 1943"], "squad_v2", False, "numbers"),
        ("Chicago", ["Lyon"], "hotpotqa", False, "no_match"),
        ("I don't know", ["Lyon"], "hotpotqa", False, "abstained"),
    ],
)
def test_rule_oracle_extractive(pred, golds, dataset, label, rule):
    """Rule oracle on SQuAD, HotpotQA and MuSiQue."""
    res = RuleOracle().grade(pred, golds, dataset=dataset)
    assert (res.label, res.rule) == (label, rule)


def test_rule_oracle_unanswerable():
    """Abstaining is correct on unanswerable questions."""
    oracle = RuleOracle()
    res = oracle.grade("The context does not say.", [], dataset="squad_v2", answerable=False)
    assert res == OracleResult(True, 1.0, 1.0, "unanswerable:abstained")
    assert oracle.grade("", [], dataset="squad_v2", answerable=False).label
    res = oracle.grade("Mr. White", [], dataset="squad_v2", answerable=False)
    assert res == OracleResult(False, 0.0, 0.0, "unanswerable:answered")


def test_rule_oracle_drop():
    """Rule oracle on DROP numbers and multi-span answers."""
    oracle = RuleOracle()
    assert oracle.grade("2,206", ["2210", "2206"], dataset="drop").rule == "em"
    res = oracle.grade("3 touchdowns", ["3"], dataset="drop")
    assert (res.label, res.em, res.f1, res.rule) == (True, 0.0, 0.67, "contained")
    assert oracle.grade("4 touchdowns", ["3"], dataset="drop").label is False
    assert oracle.grade("43 or 64", ["43"], dataset="drop").rule == "hedge"
    assert oracle.grade("Bengals, Cowboys", ["Bengals"], dataset="drop").label is False
    spans = {"answer_spans": ["Bengals", "Cowboys"]}
    assert oracle.grade("Cowboys and Bengals", ["Bengals, Cowboys"], dataset="drop",
                        extras=spans).rule == "em"
    res = oracle.grade("Bengals", ["Bengals, Cowboys"], dataset="drop", extras=spans)
    assert (res.label, res.f1) == (False, 0.5)
    explicit = {"gold_spans": [["Cowboys", "Bengals"]]}
    assert oracle.grade("Bengals, Cowboys", ["ignored"], dataset="drop", extras=explicit).label


def test_rule_oracle_accepts_every_bundled_gold():
    """Every bundled gold answer grades as correct."""
    oracle, n = RuleOracle(), 0
    for path in sorted(BUNDLED.glob("*/*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            for gold in rec["answers"] or ["Not enough information."]:
                res = oracle.grade(extract_answer(gold), rec["answers"], dataset=rec["dataset"],
                                   answerable=rec["answerable"], extras=rec)
                assert res.label, (path.name, rec["id"], gold, res)
                n += 1
    assert n > 1000


@pytest.mark.parametrize("text,expected", [
    ("The correct answer is: Carson Palmer", None),
    ("Correct. The correct answer is Bielany Forest.", True),
    ("The proposed answer is incorrect. The correct answer is 1", False),
    ("The answer is correct", True),
])
def test_parse_verdict_skips_the_correct_answer_noun_phrase(text, expected):
    """'the correct answer is X' asserts another answer; it is not a verdict."""
    assert parse_verdict(text) is expected


@pytest.mark.parametrize("text,expected", [
    ("The answer to this question is: England", "England"),
    ("The answer to the question is that Hobson argued", "Hobson argued"),
])
def test_extract_answer_long_prefixes(text, expected):
    """Sentence-style prefixes the small model produces are dropped."""
    assert extract_answer(text) == expected
