"""Tests for interp.judging.grading: official SQuAD/DROP metrics, parsers and the rule oracle."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from interp.core.errors import GradingError
from interp.judging.grading import (
    BaseOracle,
    OracleResult,
    RuleOracle,
    drop_em_f1,
    extract_answer,
    is_abstention,
    negated_at,
    normalize_answer,
    oracle_tokens,
    parse_verdict,
    split_spans,
    squad_em,
    squad_f1,
)
from interp.methods.agreement import label_agreement, oracle_agreement

BUNDLED = Path(__file__).resolve().parents[3] / "interp" / "bundled"


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
    # any dataset name other than "drop" (a user's file stem) is graded extractively
    assert oracle.grade("Paris", ["Paris"], dataset="my_qa") == OracleResult(True, 1.0, 1.0, "em")
    with pytest.raises(GradingError, match="dataset"):
        oracle.grade("Paris", ["Paris"], dataset="")
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
        ("Paris, France", ["Paris"], "hotpotqa", True, "f1"),  # a qualifier, not a candidate
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


# ---------------------------------------------------------------- negation scope (issue 11.4)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        # negations that are not right before the verdict word
        ("The answer is not entirely correct.", False),
        ("The proposed answer isn't quite correct.", False),
        ("The answer is neither correct nor complete.", False),
        ("The answer is neither complete nor correct.", False),
        ("The candidate is not a correct answer.", False),
        ("That is not the correct answer.", False),
        ("That\u2019s not correct", False),
        ("I don't think the answer is correct.", False),
        ("The answer is not, in fact, correct.", False),
        ("The answer never is correct", False),
        ("No, that is incorrect.", False),
        ("Not really, incorrect.", False),  # "Not really," does not reach past its comma
        # negations whose scope ends before the verdict word
        ("The answer does not include the unit, but it is correct.", True),
        ("The answer does not include the unit but is correct.", True),
        ("Although not verbatim, the answer is correct.", True),
        ("The answer is correct; it is not wrong.", True),
        ("Not only is the answer correct, it is complete.", True),
        ("No, correct.", True),
        # double negation flips once; the first verdict word decides
        ("Not incorrect", True),
        ("Correct, not incorrect", True),
        # noun phrases: a predicate is a verdict, a subject is not
        ("Paris is the correct answer.", True),
        ("The correct answer is: X", None),
        ("The correct answer would be 1943.", None),
        ("Incorrect. The correct answer is Paris.", False),
        ("It\u2019s correct.", True),
        # prompt echoes
        ("The answer is correct or not?", None),
        ("Is the answer correct or not? Correct", True),
    ],
)
def test_parse_verdict_negation_scope(reply, expected):
    """Negations anywhere earlier in the verdict word's clause flip it; clause ends stop them."""
    assert parse_verdict(reply) is expected


@pytest.mark.parametrize(
    ("text", "word", "expected"),
    [
        ("It is not 1850", "1850", True),
        ("Not Paris", "Paris", True),
        ("Paris, not Lyon", "Paris", False),
        ("Paris, not Lyon", "Lyon", True),
        ("It was not Lyon; it was Paris", "Paris", False),
        ("He never lived in Paris", "Paris", True),
        ("The answer is not, in fact, Paris", "Paris", True),
        ("Not only Paris", "Paris", False),
        ("Paris", "Paris", False),
        # a relative clause's negation ends at the main clause's verb
        ("The 40% of eligible voters who did not vote was 32.9% of the total", "32.9", False),
        ("The answer which does not appear verbatim is correct", "correct", False),
        ("The city which is not Paris is Lyon", "Paris", True),
        ("The voters who did not vote", "vote", True),
        ("The answer that does not appear verbatim is correct", "correct", True),  # a limit
    ],
)
def test_negated_at(text, word, expected):
    """The one negation-scope rule shared by verdict parsing and the rule oracle."""
    assert negated_at(text, text.rindex(word)) is expected


# ---------------------------------------------------------------- rule oracle (issues 11.5, 12.2)


def _grade(pred, golds, dataset="squad_v2", **extras):
    res = RuleOracle().grade(pred, golds, dataset=dataset, extras=extras or None)
    return res.label, res.rule


@pytest.mark.parametrize(
    ("pred", "golds", "dataset", "expected"),
    [
        # negation before a gold mention fails the answer
        ("Not Paris", ["Paris"], "squad_v2", (False, "negated")),
        ("It is not 1850", ["1850"], "squad_v2", (False, "negated")),
        ("It is not 1850", ["1850"], "drop", (False, "negated")),
        ("The Normans did not come from Normandy", ["Normandy"], "hotpotqa", (False, "negated")),
        ("Paris, not Lyon", ["Paris"], "squad_v2", (True, "contained")),
        ("not guilty", ["not guilty"], "squad_v2", (True, "em")),
        # verbose answers that contain the gold and name no competing candidate pass
        ("The Norman architecture had its origins in the Kingdom of Sicily, but it was later "
         "influenced by Byzantine and Islamic architecture", ["Kingdom of Sicily"], "squad_v2",
         (True, "contained")),
        ("1970s and later", ["the 1970s"], "squad_v2", (True, "contained")),
        ("Paris, France", ["Paris"], "squad_v2", (True, "f1")),
        ("Paris, France", ["Paris"], "hotpotqa", (True, "f1")),
        ("Paris and so on", ["Paris"], "squad_v2", (True, "contained")),
        # alternatives fail
        ("Paris or Lyon", ["Paris"], "squad_v2", (False, "hedge")),
        ("either 1850 or 1851", ["1850"], "squad_v2", (False, "hedge")),
        ("either 1850 or 1851", ["1850"], "drop", (False, "hedge")),
        ("Paris/Lyon", ["Paris"], "squad_v2", (False, "hedge")),
        ("Bengals, Cowboys", ["Bengals"], "drop", (False, "list")),
        ("Bengals and Cowboys", ["Bengals"], "drop", (False, "list")),
        ("The Normans, Franks, Vikings and Saxons", ["the Normans"], "musique", (False, "list")),
        # a multi-span gold is not a list of alternatives
        ("Cowboys and Bengals", ["Bengals, Cowboys"], "drop", (True, "f1")),
    ],
)
def test_rule_oracle_negation_and_competing_candidates(pred, golds, dataset, expected):
    """Issue 11 item 5: negated golds fail, verbose answers pass, alternatives fail."""
    assert _grade(pred, golds, dataset) == expected


def test_rule_oracle_multi_span_gold_is_not_alternatives():
    """With the record's span structure, listing every gold span is the answer, not a hedge."""
    spans = {"answer_spans": ["Bengals", "Cowboys"]}
    assert _grade("Cowboys and Bengals", ["Bengals, Cowboys"], "drop", **spans) == (True, "em")
    assert _grade("Cowboys, Bengals, Jets", ["Bengals, Cowboys"], "drop", **spans) == (
        False, "list")


@pytest.mark.parametrize(
    ("pred", "gold", "dataset", "expected"),
    [
        ("1.0", "10", "squad_v2", (False, "numbers")),
        ("3.14", "314", "squad_v2", (False, "numbers")),
        ("0,1", "01", "squad_v2", (False, "numbers")),
        ("1.0", "1", "squad_v2", (True, "em")),
        ("0,1", "01", "drop", (False, "numbers")),
        ("1.0", "10", "drop", (False, "numbers")),
        ("1,000", "1000", "squad_v2", (True, "em")),
        ("1,000", "1000", "drop", (True, "em")),
        ("$1,000.50", "1000.5", "squad_v2", (True, "em")),
        ("10,00", "1000", "squad_v2", (False, "numbers")),  # not a thousands group
        ("3.5 million", "3.5 million", "hotpotqa", (True, "em")),
        ("35 million", "3.5 million", "hotpotqa", (False, "numbers")),
        ("1990s", "the 1990s", "squad_v2", (True, "em")),
    ],
)
def test_rule_oracle_parses_numbers_before_punctuation(pred, gold, dataset, expected):
    """Issue 12 item 2: the oracle's label reads numbers before punctuation is stripped."""
    assert _grade(pred, [gold], dataset) == expected


def test_official_metrics_keep_their_number_blind_spot():
    """The official functions stay as the scripts are (the oracle label does the numbers)."""
    assert squad_em("1.0", ["10"]) == 1.0 and squad_em("3.14", ["314"]) == 1.0
    assert squad_em("0,1", ["01"]) == 1.0 and squad_em("1.0", ["1"]) == 0.0
    assert drop_em_f1("0,1", ["01"]) == (1.0, 1.0)
    res = RuleOracle().grade("1.0", ["10"], dataset="squad_v2")
    assert (res.label, res.em, res.f1) == (False, 1.0, 1.0)  # official values reported


def test_oracle_tokens():
    assert oracle_tokens("$1,000.50 in 1.0 days") == ["1000.5", "in", "1", "day"]
    assert oracle_tokens("2000 Summer Olympics, countries, Paris, class, bus, Newcomen's") == [
        "2000", "summer", "olympic", "country", "paris", "class", "bus", "newcomen"]
    assert oracle_tokens("0,1") == ["0", "1"]
    assert oracle_tokens("01") == ["1"]
    assert oracle_tokens("U.S. 1990s 57-yard, the 3rd") == ["us", "1990s", "57", "yard", "3rd"]
    assert oracle_tokens("1,0000") == ["1", "0"]
    assert oracle_tokens("") == []


CTX = ("The 1900 Summer Olympics were held in Paris, France. Lyon bid for the 1968 Games, and "
       "France later hosted them in Grenoble. The capital of France is Paris.")


@pytest.mark.parametrize(
    ("pred", "question", "expected"),
    [
        # "Paris, France" is one phrase of the context: a qualifier
        ("Paris, France", "Where were the 1900 Summer Olympics held?", (True, "f1")),
        # "France" restates the question
        ("Paris, France", "What is the capital of France?", (True, "f1")),
        # "Lyon" is another candidate the passage offers
        ("Paris, Lyon", "Where were the 1900 Summer Olympics held?", (False, "list")),
        ("Paris and Grenoble", "Where were the 1900 Summer Olympics held?", (False, "list")),
        # the question's own options
        ("Paris, Lyon", "Was it held in Paris or Lyon?", (False, "list")),
    ],
)
def test_rule_oracle_competing_candidates_from_context(pred, question, expected):
    """Step 3e with the record's question and context."""
    assert _grade(pred, ["Paris"], "hotpotqa", question=question, context=CTX) == expected


def test_hard_negative_paris_france_is_not_a_wrong_answer():
    """Hard negatives are mined with oracle.grade: "Paris, France" is no wrong answer.

    transfer.py passes the record's question and context; "Paris, France" for gold "Paris" is
    judged correct, so it is never kept as a wrong answer; "Lyon" still is.
    """
    oracle = RuleOracle()
    extras = {"question": "What is the capital of France?", "context": CTX}
    assert oracle.grade("Paris, France", ["Paris"], dataset="squad_v2", extras=extras).label
    assert oracle.grade("Paris, France", ["Paris"], dataset="squad_v2").label
    assert not oracle.grade("Lyon", ["Paris"], dataset="squad_v2", extras=extras).label
    assert not oracle.grade("Not Paris", ["Paris"], dataset="squad_v2", extras=extras).label


# ---------------------------------------------------------------- oracle agreement


class _TableOracle(BaseOracle):
    """Labels from a table keyed by prediction (a second rater with known answers)."""

    def __init__(self, table, name):
        self.table, self.name = table, name

    def grade(self, prediction, answers, *, dataset, answerable=True, extras=None):
        return OracleResult(self.table[prediction], 0.0, 0.0, f"table:{prediction}")


def _records(preds):
    return [{"id": f"q{i}", "dataset": "squad_v2", "question": f"Q{i}?", "context": "C.",
             "answers": ["Paris"], "answer": p, "status": "ok"} for i, p in enumerate(preds)]


def test_label_agreement_kappa_by_hand():
    # a = [T, T, F, F, T], b = [T, F, F, F, T]: p_o = 0.8; p_e = 0.6*0.4 + 0.4*0.6 = 0.48;
    # kappa = (0.8 - 0.48) / (1 - 0.48) = 0.6153846...
    out = label_agreement([1, 1, 0, 0, 1], [1, 0, 0, 0, 1])
    assert out["n"] == 5 and out["agreement"] == pytest.approx(0.8)
    assert out["kappa"] == pytest.approx(0.32 / 0.52)
    assert out["confusion"] == {"a_correct_b_correct": 2, "a_correct_b_incorrect": 1,
                                "a_incorrect_b_correct": 0, "a_incorrect_b_incorrect": 2}
    assert out["n_disagreements"] == 1 and out["disagreements"] == [
        {"index": 1, "a": True, "b": False}]
    # perfect disagreement on a balanced set: kappa = -1
    assert label_agreement([1, 0], [0, 1])["kappa"] == pytest.approx(-1.0)
    # both raters constant and equal: kappa is 0/0, reported as NaN with a note
    deg = label_agreement([1, 1, 1], [1, 1, 1])
    assert math.isnan(deg["kappa"]) and "same label" in deg["kappa_note"]
    assert deg["agreement"] == 1.0
    with pytest.raises(GradingError):
        label_agreement([], [])
    with pytest.raises(GradingError):
        label_agreement([1], [1, 0])


def test_oracle_agreement_on_records():
    preds = ["Paris", "Not Paris", "Lyon", "Paris, France", "Paris or Lyon", "It is Paris"]
    hand = {"Paris": True, "Not Paris": False, "Lyon": False, "Paris, France": True,
            "Paris or Lyon": False, "It is Paris": False}  # a deliberately strict rater
    recs = _records(preds) + [{"id": "skip", "status": "skipped", "reason": "too long"}]
    out = oracle_agreement(recs, RuleOracle(), _TableOracle(hand, "hand"), max_examples=3)
    assert out["oracle_a"] == "rule" and out["oracle_b"] == "hand" and out["n"] == 6
    assert out["confusion"] == {"a_correct_b_correct": 2, "a_correct_b_incorrect": 1,
                                "a_incorrect_b_correct": 0, "a_incorrect_b_incorrect": 3}
    # p_o = 5/6; p_e = (3/6)(2/6) + (3/6)(4/6) = 0.5; kappa = (5/6 - 0.5) / 0.5 = 2/3
    assert out["kappa"] == pytest.approx(2 / 3)
    (d,) = out["disagreements"]
    assert (d["id"], d["answer"], d["a"], d["b"], d["rule_a"]) == (
        "q5", "It is Paris", True, False, "contained")
    with pytest.raises(GradingError, match="no gradable"):
        oracle_agreement(recs[-1:], RuleOracle(), RuleOracle())
    with pytest.raises(GradingError, match="'answer'"):
        oracle_agreement([{"id": "x", "answers": ["a"], "dataset": "drop"}], RuleOracle(),
                         RuleOracle())


@pytest.mark.parametrize(
    ("pred", "gold", "question", "dataset", "expected"),
    [
        # a span of a long answer nearly matching the gold
        ("The school was led by James Conant, who was the president from 1933 to 1953",
         "James Bryant Conant", "Who led the school?", "squad_v2", (True, "f1_span")),
        ("The machine model that deviates is a random access machine", "random access machines",
         "What is an example of a machine model?", "squad_v2", (True, "contained")),  # plural
        ("The Patrick Ewing pass", "Patrick Crayton", "Who caught it?", "squad_v2",
         (False, "no_match")),
        # the question's own words are no evidence
        ("Bielany Forest is the remaining part of the Masovian Primeval Forest", "Kabaty Forest",
         "What forest is by Warsaw's southern border?", "squad_v2", (False, "question_words")),
        ("communication complexity is an example of a computational measure", "complexity",
         "Communication complexity is an example of what type of measure?", "squad_v2",
         (False, "question_words")),
        # one normalisation for both models' answers: a short echo of the question fails too,
        # a gold phrase outside the echo passes
        ("communication complexity", "complexity",
         "Communication complexity is an example of what type of measure?", "squad_v2",
         (False, "question_words")),
        ("communication complexity is an example of a computational complexity measure",
         "complexity measures", "Communication complexity is an example of what type of "
         "measure?", "squad_v2", (True, "contained")),
        ("a complexity measure", "complexity",
         "Communication complexity is an example of what type of measure?", "squad_v2",
         (True, "f1")),
        # a negation the answer takes over from the question stays in its relative clause: the
        # gold is not negated (the competing 40% still fails this answer, as the hand grader)
        ("The 40% of eligible voters who did not vote was 32.9% of the total voting population",
         "32.9%", "What percentage of Scotland's voting population failed to actually vote?",
         "squad_v2", (False, "numbers")),
        ("The share of voters who did not vote was 32.9%", "32.9%",
         "What percentage of Scotland's voting population failed to actually vote?",
         "squad_v2", (True, "contained")),
        ("Voters who did not vote were not 32.9%", "32.9%",
         "What percentage of Scotland's voting population failed to actually vote?",
         "squad_v2", (False, "negated")),
        # an answer that shows its sum states the result; a wrong sum keeps its operands
        ("14,506 + 6,000 = 20,506", "20506", "How many more people lived there in 2010?",
         "drop", (True, "em")),
        ("14,506 + 6,000 = 20,506", "20506", "How many more people lived there in 2010?",
         "squad_v2", (True, "em")),
        ("2 + 3 * 4 = 14 yards", "14", "How many yards?", "drop", (True, "contained")),
        ("6 + 3 = 20506", "20506", "How many people?", "drop", (False, "numbers")),
        ("14,506 + 6,000 = 20,506", "14506", "How many people lived there in 2000?", "drop",
         (False, "numbers")),
        # ... unless the question offers the gold as a choice
        ("Derrick Mason caught the shorter touchdown pass", "Derrick Mason",
         "Who caught the shorter touchdown pass, Todd Heap or Derrick Mason?", "drop",
         (True, "contained")),
        # parentheses give an alias, not an alternative
        ("The Central Region was ruled by the Central Secretariat (or Zhongshu Sheng)",
         "Central Secretariat", "Who governed the Central Region in the Yuan?", "squad_v2",
         (True, "contained")),
        ("The Central Secretariat or the Bureau", "Central Secretariat",
         "Who governed the Central Region in the Yuan?", "squad_v2", (False, "hedge")),
    ],
)
def test_rule_oracle_sentence_answers(pred, gold, question, dataset, expected):
    """Sentence answers of a small model, graded with the record's question."""
    assert _grade(pred, [gold], dataset, question=question) == expected


# ---------------------------------------------------------------- real answers, graded by hand

DATA = Path(__file__).resolve().parents[2] / "data"
HAND_AGREEMENT_MIN = 0.95
"""The rule oracle must agree with careful hand grading on at least 95% of the 210 real answers
in tests/data/hand_graded.jsonl (measured: 203/210 = 0.967, kappa 0.92; the main-branch oracle
of before issue 11: 170/210 = 0.810, kappa 0.42). The rule was refined on earlier sets; on the
last set, graded with the rule frozen (run3, 45 answers), it agreed on 41/45 = 0.911, kappa
0.78 (old oracle 36/45); see tests/data/SOURCES.md."""


def _bundled_records() -> dict[tuple[str, str], dict]:
    out = {}
    for path in sorted(BUNDLED.glob("*/validation.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            out[(rec["dataset"], rec["id"])] = rec
    return out


def test_rule_oracle_agrees_with_hand_grading():
    """Real answers of the bundled model, graded by hand: the rule oracle agrees on >= 95%."""
    hand = [json.loads(line) for line in (DATA / "hand_graded.jsonl").read_text(
        encoding="utf-8").splitlines()]
    bundled = _bundled_records()
    oracle, labels, items = RuleOracle(), [], []
    for h in hand:
        rec = bundled[(h["dataset"], h["id"])]
        assert rec["question"] == h["question"] and rec["answers"] == h["answers"], h["id"]
        res = oracle.grade(h["prediction"], rec["answers"], dataset=rec["dataset"],
                           answerable=rec["answerable"], extras=rec)
        labels.append(res.label)
        items.append({"id": h["id"], "prediction": h["prediction"], "rule": res.rule,
                      "hand_reason": h["reason"]})
    out = label_agreement(labels, [h["label"] for h in hand], items, max_examples=20)
    assert out["n"] == len(hand) == 210
    assert out["agreement"] >= HAND_AGREEMENT_MIN, out["disagreements"]
    assert out["kappa"] >= 0.9, out


def test_parse_verdict_on_real_judge_replies():
    """Every judge reply of the same run reads as a person reads it (given the candidate)."""
    replies = [json.loads(line) for line in (DATA / "judge_replies.jsonl").read_text(
        encoding="utf-8").splitlines()]
    assert len(replies) == 210
    wrong = [(r["reply"], r["label"], parse_verdict(r["reply"], r["candidate"]))
             for r in replies if parse_verdict(r["reply"], r["candidate"]) is not r["label"]]
    assert wrong == []
    # without the candidate, only the 'The correct answer is X' replies lose their verdict
    lost = [r for r in replies if parse_verdict(r["reply"]) is not r["label"]]
    assert len(lost) == 34
    assert all(parse_verdict(r["reply"]) is None and r["reply"].startswith(
        "The correct answer is") for r in lost)


@pytest.mark.parametrize(
    ("reply", "candidate", "expected"),
    [
        ("The correct answer is 1060s.\n", "1060s", True),
        ("The correct answer is: The Communist regime initiated the \"B",
         "The Communist regime initiated the \"Bricks for Warsaw\" campaign", True),
        ("The correct answer is: the 1970s", "1970s", True),  # articles aside
        ("The correct answer is 1816.", "1815", False),
        ("The correct answer is: Kabaty Forest", "Bielany Forest", False),
        ("The correct answer is 1", "1970s and later", None),  # a cut word alone
        ("The correct answer is:\n", "Paris", None),
        ("The proposed answer is incorrect. The correct answer is 1", "1", False),  # word first
        ("Paris is the capital", "Paris", None),  # an echo is no verdict
        ("The correct answer is: X", None, None),
        ("The correct answer is: 10 times.\n", "The Cowboys scored 10 times in the first half",
         True),  # part of the candidate
        ("The correct answer is: 14-14.", "Detroit lost 2-3 to Washington", False),
        ("The correct answer is: Paris, France", "Paris", True),  # extends the candidate
    ],
)
def test_parse_verdict_restated_answer(reply, candidate, expected):
    """Step 6: 'The correct answer is X' accepts or rejects the candidate it is given."""
    assert parse_verdict(reply, candidate) is expected


@pytest.mark.parametrize(
    ("pred", "gold", "question", "expected"),
    [
        # yes/no golds answered by restating the question
        ("Both Cynthia Mort and George Archainbaud are American", "yes",
         "Are both Cynthia Mort and George Archainbaud American?", (True, "yes_no")),
        ("Cynthia Mort and George Archainbaud are not both American", "yes",
         "Are both Cynthia Mort and George Archainbaud American?", (False, "no_match")),
        ("David O. Russell and Tony Gatlif are from different countries", "no",
         "Are David O. Russell and Tony Gatlif from the same country?", (True, "yes_no")),
        ("Tony Gatlif: Tony Gatlif (French)", "no",
         "Are David O. Russell and Tony Gatlif from the same country?", (False, "no_match")),
        ("No, they are not", "no", "Are both American?", (True, "contained")),
        # choice questions: the option named first is the answer
        ("Caroline Wozniacki: Simone Bolelli (born 11 July 1990) is a Danish player",
         "Simone Bolelli", "Who was born earlier, Simone Bolelli or Caroline Wozniacki?",
         (False, "list")),
        ("Delmer Daves has more scope of profession than Phil Rosen", "Delmer Lawrence Daves",
         "Who has more scope of profession, Phil Rosen or  Delmer Daves?", (True, "f1_span")),
        ("Guadarrama National Park", "Sierra de Guadarrama National Park",
         "Which is larger, Garajonay National Park or Guadarrama National Park?", (True, "f1")),
        ("It was held in Lyon", "Lyon", "Was it held in Paris or Lyon?", (True, "contained")),
        ("The Battle of Vienna", "The Siege of Vienna",
         "What happened first, the Siege of Vienna or the Battle of Vienna?", (False, "list")),
        # a gold phrase the question contains is evidence only on choice questions
        ("The 2016 Texas Tech Red Raiders football team represented Texas Tech University",
         "Texas Tech University", "The 1974 Texas Tech Raiders football team represented what "
         "public research university in Lubbock, Texas?", (True, "contained")),
        # accents fold
        ("The town of Motul, Yucatán Peninsula, was a popular destination",
         "The town of Motul, Yucatan", "Which town was a popular destination?", (True, "f1")),
        # plurals fold, decades do not
        ("Sara Symington competed in the 2000 Summer Olympics in Sydney, Australia",
         "2000 Summer Olympic Games", "Which Olympic Games held in Sydney?", (True, "f1_span")),
        ("1990", "the 1990s", "When?", (False, "no_match")),
    ],
)
def test_rule_oracle_yes_no_choice_and_plurals(pred, gold, question, expected):
    """Steps 3e (choice questions), 3f (yes/no) and the plural folding of oracle_tokens."""
    assert _grade(pred, [gold], "hotpotqa", question=question) == expected


def test_oracle_spec_is_parsed_in_one_place(tiny, monkeypatch):
    """Rule | model:SPEC, checked without loading; a registered kind is accepted everywhere."""
    from interp.core.errors import ConfigError
    from interp.judging.grading import (
        ORACLE_KINDS,
        ModelOracle,
        OracleSpec,
        RuleOracle,
        make_oracle,
        parse_oracle_spec,
    )

    assert parse_oracle_spec("rule") == OracleSpec("rule", "")
    assert parse_oracle_spec("model:org/x") == OracleSpec("model", "org/x")
    assert str(parse_oracle_spec("model:org/x")) == "model:org/x"
    for bad in ("model:", "model"):
        with pytest.raises(ConfigError, match=f"oracle '{bad}' names no model: write 'model:SPEC'"):
            parse_oracle_spec(bad)
    for bad in ("llm", "rule:x", ""):
        with pytest.raises(ConfigError, match="use 'rule' or 'model:SPEC'"):
            parse_oracle_spec(bad)
    with pytest.raises(ConfigError, match="unknown oracle 'rule': use 'model:SPEC'"):
        parse_oracle_spec("rule", kinds=["model"])
    assert isinstance(make_oracle("rule"), RuleOracle)
    own = make_oracle(f"model:{tiny.spec}", run_model=tiny)  # the run's model, not reloaded
    assert isinstance(own, ModelOracle) and own.handle is tiny
    monkeypatch.setitem(ORACLE_KINDS, "fixed", (False, lambda arg, **kw: RuleOracle()))
    assert isinstance(make_oracle("fixed"), RuleOracle)
    # every declared kind (openai: among them) stands between
    with pytest.raises(ConfigError, match=r"'rule' or 'model:SPEC' or 'openai:SPEC' or 'fixed'"):
        parse_oracle_spec("nope")


def test_the_openai_oracle_kind_is_known_in_a_fresh_process_without_importing_endpoints():
    """``openai:MODEL`` is declared where the registry lives and imported on first use only.

    A fresh interpreter, so no earlier import in the test session can have filled the table.
    """
    import json
    import subprocess
    import sys

    code = """
import json, sys
from interp.judging.grading import ORACLE_KINDS, make_oracle, parse_oracle_spec
spec = parse_oracle_spec("openai:x")
before = "interp.endpoints.oracle" in sys.modules
torch = "torch" in sys.modules
oracle = make_oracle("openai:my-70b", endpoint={"base_url": "http://127.0.0.1:9/v1"})
print(json.dumps({"spec": [spec.kind, spec.arg], "imported_by_parse": before,
                  "oracle": type(oracle).__module__ + "." + type(oracle).__name__,
                  "name": oracle.name, "resolved": callable(ORACLE_KINDS["openai"][1]),
                  "torch_to_parse": torch}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"spec": ["openai", "x"], "imported_by_parse": False,
                   "oracle": "interp.endpoints.oracle.EndpointOracle", "name": "openai:my-70b",
                   "resolved": True, "torch_to_parse": False}


def test_every_declared_oracle_builder_resolves():
    from interp.judging.grading import ORACLE_KINDS, oracle_builder

    assert set(ORACLE_KINDS) >= {"rule", "model", "openai"}
    for kind in list(ORACLE_KINDS):
        assert callable(oracle_builder(kind)), kind


def test_a_declared_builder_that_does_not_import_is_one_line(monkeypatch):
    from interp.core.errors import ConfigError
    from interp.judging.grading import ORACLE_KINDS, make_oracle

    monkeypatch.setitem(ORACLE_KINDS, "gone", (True, "interp.no_such_module:build"))
    with pytest.raises(ConfigError, match=r"oracle kind 'gone': its builder "
                                          r"'interp.no_such_module:build' does not import"):
        make_oracle("gone:x")


@pytest.mark.parametrize("reply, verdict", [
    ("<think>The candidate looks Correct at first.</think>\nIncorrect", False),
    ("It says Paris, so Incorrect would be wrong... </think> Correct", True),  # opening sent
    ("<think>Checking: the answer is Correct because", None),                  # cut inside
    ("<THINK>correct?</THINK><think>no, incorrect</think>Correct.", True),    # the last close
    ("Incorrect", False),                                                      # no markup
])
def test_reasoning_markup_never_decides_a_verdict(reply, verdict):
    from interp.judging.parsing import parse_verdict

    assert parse_verdict(reply) is verdict


def test_an_answer_is_read_after_its_reasoning_and_a_cut_one_is_empty():
    from interp.judging.parsing import extract_answer, strip_reasoning

    assert extract_answer("<think>Maybe Lyon? No.</think>\nParis") == "Paris"
    assert extract_answer("<think>Maybe Lyon") == ""
    assert strip_reasoning("no markup") == "no markup"
