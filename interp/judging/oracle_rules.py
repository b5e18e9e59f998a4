"""The rule oracle's steps, one function each.

Composed by :class:`interp.judging.grading.RuleOracle`.

The rule itself, numbered, is in :class:`interp.judging.grading.RuleOracle`'s docstring; this module
holds its normalisation (:func:`oracle_tokens`: numbers parsed before punctuation is stripped;
:func:`arithmetic_results`: a worked sum read as its result), the question-echo check
(:func:`restates_question`, 3g) and one function per step that needs more than a line: the
hedge check (:func:`hedges`, step 3b), negated gold mentions (:func:`gold_negated`, 3c),
competing candidates (:func:`competing` and :func:`other_option_first`, 3e), yes/no answers
(:func:`yes_no`, 3f) and the span match (:func:`best_window_f1`, 3h). Tokens are lists of
strings from :func:`oracle_tokens`.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cached_property

from interp.judging.parsing import negated_at, words
from interp.judging.qa_metrics import split_spans

__all__ = [
    "FUNCTION_WORDS",
    "HEDGE_TOKENS",
    "MAX_CANDIDATE_TOKENS",
    "Context",
    "Tok",
    "arithmetic_results",
    "best_window_f1",
    "choice_options",
    "competing",
    "contains_at",
    "gold_negated",
    "hedges",
    "oracle_tokens",
    "other_option_first",
    "restates_question",
    "token_f1",
    "tokenize",
    "yes_no",
]

HEDGE_TOKENS = frozenset({"or", "either", "whether"})
"""Normalised words that offer alternatives ("Paris or Lyon") unless the gold contains them."""
MAX_CANDIDATE_TOKENS = 4
"""Longest list item (in oracle tokens) that counts as an answer-like candidate; longer items
are prose ("but it was later influenced by ...")."""

# --------------------------------------------------------------------------------------------
# The oracle's normalisation: numbers first, then SQuAD's
# --------------------------------------------------------------------------------------------

_PUNCT = frozenset(string.punctuation)
_ARTICLE_WORDS = frozenset({"a", "an", "the"})
_NUM = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\w)(?!\.\d)")


@dataclass(frozen=True)
class Tok:
    """One oracle token: its normalised text, the offset where it starts, whether a number."""

    text: str
    start: int
    number: bool


def _canonical_number(s: str) -> str:
    try:
        d = Decimal(s.replace(",", ""))
    except InvalidOperation:  # pragma: no cover - _NUM only matches valid numbers
        return s
    return str(int(d)) if d == d.to_integral_value() else format(d.normalize(), "f")


_NO_FOLD = frozenset({"does", "has", "his", "its", "yes", "this", "thus", "always", "perhaps",
                      "across", "besides", "towards", "whereas", "unless", "was", "hers", "ours",
                      "yours", "theirs", "news", "series", "species", "means"})


def _singular(w: str) -> str:
    """Fold a plural ("games" -> "game", "cities" -> "city", "Newcomen's" -> "newcomen").

    Not after s, u or i ("class", "bus", "Paris"), not a few function words, not a token that
    starts with a digit ("1990s" is a decade, not 1990).
    """
    if len(w) < 4 or not w.endswith("s") or w.endswith(("ss", "us", "is")) or w in _NO_FOLD \
            or w[0].isdigit():
        return w
    return w[:-3] + "y" if w.endswith("ies") and len(w) > 4 else w[:-1]


def tokenize(text: str) -> list[Tok]:
    """:func:`oracle_tokens` with each token's start offset in ``text`` and number flag."""
    out: list[Tok] = []

    def add_words(piece: str, start: int) -> None:
        w = "".join(ch for ch in unicodedata.normalize("NFKD", piece.lower())
                    if ch not in _PUNCT and not unicodedata.combining(ch))
        if w and w not in _ARTICLE_WORDS:
            out.append(Tok(_singular(w), start, False))

    for chunk in re.finditer(r"\S+", text):
        s, pos = chunk.group(), 0
        for m in _NUM.finditer(s):
            add_words(s[pos:m.start()], chunk.start() + pos)
            out.append(Tok(_canonical_number(m.group()), chunk.start() + m.start(), True))
            pos = m.end()
        add_words(s[pos:], chunk.start() + pos)
    return out


_OPERAND = r"(?<![\w.])\(?-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?\)?"
_OPS = "-+*/x\u00d7\u2212\u00f7"
_ARITHMETIC = re.compile(
    rf"({_OPERAND}(?:\s*[{_OPS}]\s*{_OPERAND})+)\s*=\s*({_OPERAND})")


def _number(s: str) -> Decimal:
    return Decimal(s.strip("()").replace(",", ""))


def _evaluate(expr: str) -> Decimal | None:
    """The value of ``a op b op ...`` (``* /`` before ``+ -``); None if not computable."""
    parts = re.split(rf"\s*([{_OPS}])\s*(?=\(?-?\d)", expr.strip())
    try:
        nums, ops = [_number(parts[0])], parts[1::2]
        terms: list[Decimal] = []
        for op, num in zip(ops, parts[2::2]):
            v = _number(num)
            if op in "*x\u00d7":
                nums[-1] *= v
            elif op in "/\u00f7":
                nums[-1] /= v
            else:
                terms.append(nums.pop())
                nums.append(-v if op in "-\u2212" else v)
        return sum(terms + nums, Decimal(0))
    except (InvalidOperation, ZeroDivisionError, ArithmeticError):
        return None


def arithmetic_results(text: str) -> str:
    """The text with each worked sum replaced by its result ("14,506 + 6,000 = 20,506" -> "20,506").

    An answer that shows its arithmetic states one number, the result after the last "=";
    the operands are working, not competing answers (DROP's counting and difference questions).
    Only a chain of numbers joined by ``+ - * / x`` and closed by ``=`` and a number is
    rewritten, and only when the sum holds (``*`` and ``/`` before ``+`` and ``-``): a wrong
    sum ("6 / 3 = 20506") keeps its operands, which then compete with the result. Prose
    numbers ("1,000 in 1990") are left alone.

    Args:
        text: An answer.

    Returns:
        The answer with each ``a op b ... = r`` replaced by ``r``.
    """
    def result(m: re.Match[str]) -> str:
        value = _evaluate(m.group(1))
        return m.group(2) if value is not None and value == _number(m.group(2)) else m.group()

    return _ARITHMETIC.sub(result, text)


def oracle_tokens(text: str) -> list[str]:
    r"""The rule oracle's normalisation: numbers are parsed BEFORE punctuation is stripped.

    Steps: split on whitespace; inside each chunk, read every number that stands alone
    (not glued to letters: "1990s" and "3rd" stay words) as ``\d+(.\d+)?`` or with true
    thousands groups (``1,000``, ``12,345.5``) and write it canonically (``"1.0"`` -> ``"1"``,
    ``"1,000"`` -> ``"1000"``, ``"01"`` -> ``"1"``, ``"1.50"`` -> ``"1.5"``); a comma that is
    not a thousands separator separates two numbers (``"0,1"`` -> ``"0"``, ``"1"``); the rest
    of the chunk is lower-cased and loses ``string.punctuation`` as in SQuAD's
    :func:`normalize_answer` ("U.S." -> "us") and its accents ("Yucatán" -> "yucatan");
    articles are dropped; plurals are folded
    ("Olympics" -> "olympic", "countries" -> "country", "Newcomen's" -> "newcomen"; not after
    s, u or i: "Paris", "bus", "class" stay; "1990s" stays).

    Args:
        text: An answer or gold string.

    Returns:
        The tokens. ``oracle_tokens("$1,000.50 in 1.0 days") == ["1000.5", "in", "1", "day"]``.
    """
    return [t.text for t in tokenize(text)]


def contains_at(pred: Sequence[str], gold: Sequence[str]) -> list[int]:
    """Start indices where ``gold`` occurs as a contiguous run of ``pred`` ([] if none)."""
    n = len(gold)
    if n == 0:
        return []
    return [i for i in range(len(pred) - n + 1) if list(pred[i:i + n]) == list(gold)]


FUNCTION_WORDS = frozenset({"of", "in", "on", "at", "to", "for", "and", "by", "with", "from",
                             "as", "is", "was", "s"})


def restates_question(pred: Sequence[str], gold: Sequence[str], q_toks: Sequence[str]) -> bool:
    """Whether every mention of a gold token in the prediction restates the question.

    A mention restates the question when it lies inside a run of two or more prediction
    tokens that the question holds contiguously: for "Communication complexity is an example
    of what type of measure?" (gold "complexity"), both "communication complexity" and
    "communication complexity is an example of a computational measure" only echo the
    question, while "a complexity measure" names the gold.

    Args:
        pred: The prediction's oracle tokens.
        gold: The gold's oracle tokens.
        q_toks: The question's oracle tokens.

    Returns:
        True iff the prediction mentions a gold token and every mention is such an echo.
    """
    gold_set, n = set(gold), len(pred)
    echoed = [False] * n
    for i in range(n - 1):
        j = i + 2
        if not contains_at(q_toks, pred[i:j]):
            continue
        while j < n and contains_at(q_toks, pred[i:j + 1]):
            j += 1
        echoed[i:j] = [True] * (j - i)
    mentions = [i for i, t in enumerate(pred) if t in gold_set]
    return bool(mentions) and all(echoed[i] for i in mentions)


def best_window_f1(pred: Sequence[str], gold: Sequence[str]) -> float:
    """Highest token F1 between the gold and a span of the prediction of similar length.

    Spans are contiguous, from one token shorter (golds of 3+ tokens; else the gold's length)
    to two tokens longer than the gold ("James Conant" inside a sentence vs "James Bryant
    Conant": 0.8; "Patrick" inside "Patrick Ewing" is no span for "Patrick Crayton").
    """
    n = len(gold)
    best = 0.0
    for size in range(n - 1 if n >= 3 else n, n + 3):
        for i in range(0, max(0, len(pred) - size) + 1):
            best = max(best, token_f1(pred[i:i + size], gold))
    return best


def token_f1(pred: Sequence[str], gold: Sequence[str]) -> float:
    """SQuAD's token F1 (multiset overlap) on already normalised tokens."""
    if not pred or not gold:
        return float(list(pred) == list(gold))
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0
    p, r = same / len(pred), same / len(gold)
    return 2 * p * r / (p + r)


@dataclass(frozen=True)
class Context:
    """The record's question and context, tokenised on first use."""

    question: str
    context: str

    @cached_property
    def q_toks(self) -> list[str]:
        """The question's oracle tokens."""
        return oracle_tokens(self.question)

    @cached_property
    def c_toks(self) -> list[str]:
        """The context's oracle tokens."""
        return oracle_tokens(self.context)


def gold_negated(pred: str, p: Sequence[Tok], g_toks: Sequence[str]) -> bool:
    """Step 3c: whether a gold mention (or, without one, the first gold token) is negated."""
    p_toks = [t.text for t in p]
    starts = contains_at(p_toks, g_toks)
    if not starts:
        gold_set = set(g_toks)
        starts = [i for i, t in enumerate(p_toks) if t in gold_set][:1]
    return any(negated_at(pred, p[i].start) for i in starts)


_WH_WORDS = frozenset({"which", "who", "whom", "whose", "what", "when", "where", "how"})
_OPTION_END = re.compile(r"\s+(?:is|are|was|were|has|have|had|did|does|do)\b.*$", re.IGNORECASE)


def choice_options(question: str) -> list[set[str]]:
    """The two options of a choice question ("Who was born earlier, A or B?").

    Returns the tokens that tell them apart, or [] when the question offers no choice.
    """
    found = list(re.finditer(r"([^,:;?]*)\s+or\s+([^,:;?]*)", question))
    if not found:
        return []
    m = found[-1]
    right = oracle_tokens(_OPTION_END.sub("", m.group(2)))
    left = oracle_tokens(m.group(1))[-max(1, len(right)):]  # options run parallel
    skip = FUNCTION_WORDS | _WH_WORDS
    a, b = set(left) - set(right) - skip, set(right) - set(left) - skip
    return [a, b] if a and b else []


def other_option_first(p_toks: Sequence[str], g_toks: Sequence[str], ctx: Context) -> bool:
    """Step 3e (choice questions): the option the prediction names first is its answer."""
    options = choice_options(ctx.question)
    if not options:
        return False
    gold = set(g_toks)
    mine = max(options, key=lambda o: len(o & gold))
    if not mine & gold:
        return False

    def first(opt: set[str]) -> int:
        return next((i for i, t in enumerate(p_toks) if t in opt), len(p_toks))

    other = options[1] if mine is options[0] else options[0]
    return first(other) < min(first(mine), len(p_toks))


_POLAR_STOP = frozenset({"are", "is", "was", "were", "did", "do", "doe", "does", "both", "same",
                         "have", "has", "had", "be", "been", "can", "could", "either"})
_NEGATIVE = frozenset({"not", "never", "neither", "nor", "cannot", "different", "differ"})


def yes_no(pred: str, p_toks: Sequence[str], g_toks: Sequence[str],
            ctx: Context) -> str | None:
    """Step 3f (yes/no golds): "yes" or "no" for an answer that restates the question.

    "Both Cynthia Mort and George Archainbaud are American" says "yes"; negated, "no". None
    when the step does not apply (another gold, an explicit yes/no, no restatement).
    """
    if len(g_toks) != 1 or g_toks[0] not in ("yes", "no") or not ctx.question:
        return None
    if "yes" in p_toks or "no" in p_toks:
        return None  # an explicit answer: the match below decides
    content = set(ctx.q_toks) - FUNCTION_WORDS - _POLAR_STOP - _WH_WORDS
    if not content or len(content & set(p_toks)) < 0.8 * len(content):
        return None
    negative = any(w in _NEGATIVE or w.endswith("n't") for w, _ in words(pred))
    return "no" if negative else "yes"


def hedges(pred: str, gold: Sequence[str]) -> bool:
    """Step 3b: a hedge word or a slash between words that the gold lacks.

    Parentheses give an alias, not an alternative: "the Central Secretariat (or Zhongshu
    Sheng)" does not hedge.
    """
    bare = re.sub(r"\([^()]*\)", " ", pred)
    g_toks = {t for s in gold for t in oracle_tokens(s)}
    if (HEDGE_TOKENS & set(oracle_tokens(bare))) - g_toks:
        return True
    return bool(re.search(r"\w\s*/\s*\w", bare)) and not any("/" in s for s in gold)


def answer_like(item: str, toks: Sequence[str]) -> bool:
    if not toks or len(toks) > MAX_CANDIDATE_TOKENS:
        return False
    bare = re.sub(r"^(?:[\W_]+|(?:the|a|an)\s+)+", "", item, flags=re.IGNORECASE)
    return bool(bare) and (bare[0].isupper() or bare[0].isdigit())


def competing(pred: str, gold: Sequence[str], g_toks: Sequence[str], drop: bool,
               ctx: Context) -> bool:
    """Step 3e: whether the prediction lists a candidate that competes with the gold."""
    items = split_spans(pred)
    if len(items) <= sum(len(split_spans(s)) for s in gold):
        return False
    toks = [oracle_tokens(it) for it in items]
    gold_set = set(g_toks)
    holding = [k for k, t in enumerate(toks) if gold_set & set(t)]
    if not holding or any(len(toks[k]) > len(g_toks) + 3 for k in holding):
        return False  # the gold is not a list item, or it sits in prose
    others = [k for k in range(len(items)) if k not in holding and answer_like(items[k], toks[k])]
    if len(others) >= 2 or (others and drop):
        return True
    q_toks, c_toks = ctx.q_toks, ctx.c_toks
    for k in others:
        if contains_at(q_toks, toks[k]):
            if "or" in q_toks:
                return True  # one of the question's options
            continue  # restates the question ("Paris, France" for "... capital of France?")
        joined = [*toks[holding[-1]], *toks[k]] if holding[-1] < k else [*toks[k],
                                                                         *toks[holding[0]]]
        if c_toks and contains_at(c_toks, toks[k]) and not contains_at(c_toks, joined):
            return True
    return False
