"""Reading model text: answer extraction, verdict parsing, abstention, negation scope.

Deterministic parsers of greedy generations and judge replies (project rules; there is no
official counterpart):

* :func:`extract_answer`: the answer string inside a raw generation.
* :func:`parse_verdict`: a judge reply -> True ("Correct"), False ("Incorrect") or None.
* :func:`is_abstention`: whether a generation refuses or abstains.
* :func:`negated_at`: whether a position of a text lies in the scope of a negation. The rule
  oracle uses it too (:class:`interp.judging.grading.RuleOracle`), so "not correct" in a verdict and
  "not Paris" in an answer are read by one mechanism.

Negation scope (:func:`negated_at`), in numbered steps:

1. The text is split into words (``isn't`` and ``it's`` are one word each), numbers and
   punctuation.
2. The *clause* of a position runs back to the nearest clause boundary: ``.`` ``!`` ``?`` ``;``
   ``:`` or a newline, or one of the conjunctions in :data:`CLAUSE_CONJUNCTIONS` ("but",
   "although", "and", ...). Commas split the clause into comma segments.
3. Negators (:data:`NEGATORS`: "not", "never", "neither", "nor", "cannot", "hardly", and every
   word ending in "n't") negate what follows them in their comma segment; "not only", "not
   just" and "not merely" are not negations.
4. A negator in an earlier comma segment of the same clause still applies when it *dangles*:
   it follows an auxiliary verb ("is", "does", ...) or is a contraction ("isn't"), and nothing
   but adverbs (:data:`FILLER_WORDS`) follows it in its segment: "The answer is not, in fact,
   correct". "Not really, incorrect" does not dangle (no auxiliary before "Not").
   A negator inside a relative clause (after "who", "which", "whom" or "whose" in its comma
   segment) ends at the main clause's linking verb (:data:`COPULAS`, at least one word after
   the negator): in "The 40% of voters who did not vote was 32.9%" the "32.9%" is not
   negated, nor "correct" in "The answer which does not appear verbatim is correct".
5. The position is negated when at least one negator applies. Negations do not cancel in
   pairs, except that a negated verdict word flips once: "not incorrect" reads as correct.

Known limits (all would need a parser): a relative clause opened by "that" ("The answer that
does not appear verbatim is correct" reads as negated: "that" also opens complement clauses), and
doubt ("It is not clear whether the answer is correct" reads as negated).
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = [
    "ABSTENTION_PATTERNS",
    "AUXILIARIES",
    "CLAUSE_CONJUNCTIONS",
    "FILLER_WORDS",
    "NEGATORS",
    "RELATIVE_PRONOUNS",
    "extract_answer",
    "is_abstention",
    "negated_at",
    "parse_verdict",
    "reasoning_end",
    "strip_reasoning",
    "words",
]

# --------------------------------------------------------------------------------------------
# Answer extraction
# --------------------------------------------------------------------------------------------

_ANSWER_PREFIX = re.compile(
    r"^\s*(?:\*\*)?(?:(?:the\s+)?(?:final\s+|correct\s+|short\s+)?answer"
    r"(?:\s+to\s+(?:this|the|your)\s+question)?\s*(?:is\s*(?:that\b)?\s*:?|:)"
    r"|(?:ans|a)\s*:)(?:\*\*)?\s*",
    re.IGNORECASE,
)
_WRAPPERS = (("**", "**"), ('"', '"'), ("'", "'"), ("\u201c", "\u201d"), ("\u2018", "\u2019"),
             ("`", "`"))
_ABBREV = re.compile(r"(?:[A-Za-z]{1,3}\.){2,}$")


REASONING_OPEN = re.compile(r"<(think|thinking|reasoning)>", re.I)
REASONING_CLOSE = re.compile(r"</(think|thinking|reasoning)>", re.I)
"""The reasoning markup of reasoning models (DeepSeek-R1, Qwen3, QwQ style ``<think>``)."""


def reasoning_end(text: str) -> int | None:
    """Where a reply's text after its reasoning starts: the one rule every verdict reader uses.

    * ``<think> ... </think> reply`` and ``... </think> reply`` (the opening tag sent in the
      chat template, only the closing one generated): the offset just after the LAST closing
      tag.
    * ``<think> ...`` without a closing tag (the reply was cut inside its reasoning): None, so
      nothing written inside the reasoning (a draft ``Verdict: Correct`` included) decides a
      verdict or becomes an answer.
    * No markup: 0 (the whole reply).

    Every reader of model text goes through this function: :func:`strip_reasoning` (and so
    :func:`extract_answer` and :func:`parse_verdict`), the reasoning judge's
    :func:`interp.judging.reasoning.parse_final_verdict` and the served LLM oracle.

    Args:
        text: a raw reply.

    Returns:
        A character offset into ``text``, or None when the reasoning was cut.
    """
    closes = list(REASONING_CLOSE.finditer(text))
    if closes:
        return closes[-1].end()
    return None if REASONING_OPEN.search(text) else 0


def strip_reasoning(text: str) -> str | None:
    """The part of a reply after its reasoning (:func:`reasoning_end`'s rule).

    Args:
        text: a raw reply.

    Returns:
        The reply after its reasoning, or None when the reasoning was cut.
    """
    start = reasoning_end(text)
    return None if start is None else text[start:]


def _unwrap(s: str) -> str:
    for left, right in _WRAPPERS:
        if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
            inner = s[len(left):-len(right)]
            if right not in inner:
                return inner.strip()
    return s


def extract_answer(text: str) -> str:
    """Turn a raw greedy generation into the answer string.

    Steps, in order: keep only the text after the reasoning markup (:func:`strip_reasoning`; an
    answer cut inside its reasoning is ""); strip whitespace; repeatedly drop a leading answer
    prefix ("Answer:", "A:", "Ans:", "The answer is", "The final answer is:", also wrapped in
    ``**``); cut at the first newline (the generation stop rule); unwrap one pair of surrounding
    quotes, backticks or ``**``; drop ONE trailing sentence period; unwrap once more (for
    ``"Paris".``).

    The period is kept only when the last token is an abbreviation made of dotted letters
    ("U.S.", "D.C.", "e.g."); numbers keep their inner dots and commas ("3.5", "$1,000.50")
    and lose only a sentence-final period ("1939." -> "1939").

    Args:
        text: The raw generation.

    Returns:
        The extracted answer (may be empty).

    Source:
        Project rule (no official counterpart); the newline stop matches the generation stop.
    """
    after = strip_reasoning(text)
    if after is None:  # cut inside its reasoning: no answer
        return ""
    s = after.strip()
    while (m := _ANSWER_PREFIX.match(s)) and m.end() > 0:
        s = s[m.end():].lstrip()
    s = _unwrap(s.split("\n", 1)[0].strip())
    if s.endswith(".") and not s.endswith("..") and not _ABBREV.search(s.split()[-1]):
        s = s[:-1].rstrip()
    return _unwrap(s)


# --------------------------------------------------------------------------------------------
# Negation scope
# --------------------------------------------------------------------------------------------

NEGATORS = frozenset({"not", "never", "neither", "nor", "cannot", "hardly"})
"""Words that negate what follows them in their clause (plus every word ending in "n't")."""
CLAUSE_CONJUNCTIONS = frozenset({"but", "although", "though", "whereas", "while", "yet",
                                 "because", "since", "and"})
"""Conjunctions that start a new clause: a negation before them does not reach past them."""
AUXILIARIES = frozenset({"is", "are", "was", "were", "be", "been", "being", "am", "do", "does",
                         "did", "can", "could", "will", "would", "should", "may", "might",
                         "must", "shall", "has", "have", "had", "seems", "seem", "appears",
                         "appear", "looks", "look", "sounds", "remains"})
"""Verbs after which a "not" negates the predicate (used by the dangling rule, step 4)."""
COPULAS = frozenset({"is", "are", "was", "were", "be", "been", "being", "am", "seems", "seem",
                     "appears", "appear", "looks", "sounds", "remains"})
"""Linking verbs: "X is the correct answer" (a verdict) vs "The correct answer is X" (not)."""
FILLER_WORDS = frozenset({"entirely", "quite", "really", "exactly", "necessarily", "fully",
                          "completely", "totally", "strictly", "actually", "very", "so", "too",
                          "at", "all", "even", "wholly", "altogether", "precisely", "always"})
"""Adverbs that may stand between a dangling negator and the end of its comma segment."""
_NOT_A_NEGATION = frozenset({"only", "just", "merely"})
_HARD = frozenset({".", "!", "?", ";", ":", "\n"})
_TOKEN = re.compile(r"[^\W\d_]+(?:['\u2019][^\W\d_]+)*|\d+(?:[.,]\d+)*|\n|[^\w\s]")


@lru_cache(maxsize=4096)
def words(text: str) -> tuple[tuple[str, int], ...]:
    """Split text into ``(token, start offset)`` pairs: words, numbers, punctuation, newlines.

    Words keep inner apostrophes ("isn't", "it's"); curly apostrophes are folded to ``'`` in
    the token (offsets refer to the original text). Tokens are lower-cased.

    Args:
        text: Any text.

    Returns:
        The tokens in order, each with the offset of its first character.
    """
    return tuple((m.group().lower().replace("\u2019", "'"), m.start())
                 for m in _TOKEN.finditer(text))


def _is_negator(tokens: tuple[tuple[str, int], ...], j: int) -> bool:
    w = tokens[j][0]
    if w.endswith("n't"):
        return True
    if w not in NEGATORS:
        return False
    return not (w == "not" and j + 1 < len(tokens) and tokens[j + 1][0] in _NOT_A_NEGATION)


def _clause_start(tokens: tuple[tuple[str, int], ...], i: int) -> int:
    j = i - 1
    while j >= 0 and tokens[j][0] not in _HARD and tokens[j][0] not in CLAUSE_CONJUNCTIONS:
        j -= 1
    return j + 1


def _dangles(tokens: tuple[tuple[str, int], ...], j: int, seg_end: int) -> bool:
    w = tokens[j][0]
    attached = w.endswith("n't") or (j > 0 and (tokens[j - 1][0] in AUXILIARIES
                                                 or tokens[j - 1][0].endswith("'s")))
    return attached and all(tokens[k][0] in FILLER_WORDS for k in range(j + 1, seg_end))


RELATIVE_PRONOUNS = frozenset({"who", "which", "whom", "whose"})
"""Words that open a relative clause: a negation inside one ends at the main clause's verb."""


def _relative_closed(tokens: tuple[tuple[str, int], ...], seg: int, j: int, i: int) -> bool:
    """Whether the negator at ``j`` sits in a relative clause that ends before ``i`` (step 4)."""
    if not any(tokens[r][0] in RELATIVE_PRONOUNS for r in range(seg, j)):
        return False
    return any(tokens[k][0] in COPULAS for k in range(j + 2, i))


def _negated_index(tokens: tuple[tuple[str, int], ...], i: int) -> bool:
    start = _clause_start(tokens, i)
    commas = [k for k in range(start, i) if tokens[k][0] == ","]
    last_seg = commas[-1] + 1 if commas else start
    if any(_is_negator(tokens, j) and not _relative_closed(tokens, last_seg, j, i)
           for j in range(last_seg, i)):
        return True
    bounds = [start, *[c + 1 for c in commas]]
    for seg_start, seg_end in zip(bounds, commas):
        if any(_is_negator(tokens, j) and _dangles(tokens, j, seg_end)
               for j in range(seg_start, seg_end)):
            return True
    return False


def negated_at(text: str, pos: int) -> bool:
    """Whether the word starting at character ``pos`` lies in the scope of a negation.

    The rule is the module docstring's "Negation scope" (clause-bounded, comma segments,
    dangling negators). Examples: in "The answer is not entirely correct." the word "correct"
    is negated; in "It is not 1850" the "1850" is; in "Paris, not Lyon" "Paris" is not; in
    "The answer does not include the unit, but it is correct" "correct" is not.

    Args:
        text: The text.
        pos: Character offset of the word (a token start; a position inside a token is
            treated as that token).

    Returns:
        True iff a negator applies to the word at ``pos``.
    """
    tokens = words(text)
    i = next((k for k, (_, s) in enumerate(tokens) if s >= pos), len(tokens))
    if i < len(tokens) and tokens[i][1] > pos and i > 0:
        i -= 1  # pos inside the previous token
    return _negated_index(tokens, i)


# --------------------------------------------------------------------------------------------
# Verdicts
# --------------------------------------------------------------------------------------------

_VERDICT_WORDS = frozenset({"correct", "incorrect"})
_ALTERNATION = frozenset({"or", "/", "|"})
_DETERMINERS = frozenset({"the", "a", "an"})


def _pair_members(tokens: tuple[tuple[str, int], ...]) -> set[int]:
    """Indices of verdict words inside an alternative pair ("Correct or Incorrect")."""
    out: set[int] = set()
    for i, (w, _) in enumerate(tokens):
        if w not in _VERDICT_WORDS or i + 1 >= len(tokens) or tokens[i + 1][0] not in _ALTERNATION:
            continue
        j = i + 2
        if j < len(tokens) and tokens[j][0] == "not":
            j += 1
        if j >= len(tokens) or tokens[j][0] in _VERDICT_WORDS or tokens[j - 1][0] == "not":
            out.add(i)
            if j < len(tokens) and tokens[j][0] in _VERDICT_WORDS:
                out.add(j)
    return out


def _is_noun_phrase_use(tokens: tuple[tuple[str, int], ...], i: int) -> bool:
    """Whether verdict word ``i`` is an attributive "the/a correct X" outside a predicate.

    A subject such as "The correct answer is X" is skipped; a predicate such as "That is not
    the correct answer" (a linking verb earlier in the clause) is a verdict.
    """
    j = i - 1
    while j >= 0 and tokens[j][0] == "*":
        j -= 1
    if j < 0 or tokens[j][0] not in _DETERMINERS:
        return False
    start = _clause_start(tokens, i)
    return not any(tokens[k][0] in COPULAS or tokens[k][0].endswith("'s")
                   or (tokens[k][0].endswith("n't") and tokens[k][0][:-3] in COPULAS)
                   for k in range(start, j))


def parse_verdict(text: str, candidate: str | None = None) -> bool | None:
    """Parse a judge reply into a verdict.

    First the reasoning markup goes (:func:`strip_reasoning`): only the text after
    ``</think>`` is read, and a reply cut inside its reasoning has no verdict. Then the rule,
    in order:

    1. Find the verdict words ``correct`` / ``incorrect`` (whole words, any case; markdown
       such as ``**Correct**`` is fine; "correctly" is not a verdict word).
    2. Skip words of an alternative pair, a prompt echo: "Correct or Incorrect",
       "correct/incorrect", "correct or not".
    3. Skip a noun-phrase use "the/a/an (in)correct X" that is not the complement of a linking
       verb in its clause: "The correct answer is: X" states another answer (skipped), while
       "That is not the correct answer" and "The candidate is not a correct answer" are
       verdicts.
    4. The first remaining word decides: "correct" -> True, "incorrect" -> False, flipped
       once when the word lies in the scope of a negation (:func:`negated_at`: "not", "n't",
       "never", "neither ... nor", ... anywhere earlier in its clause, e.g. "The answer is not
       entirely correct", "isn't quite correct", "is neither correct nor complete").
    5. Later words are ignored: "Incorrect. The correct answer is Paris." -> False, and
       "Correct, not incorrect" -> True (the first verdict word is "Correct").
    6. Only when no verdict word decides and ``candidate`` (the judged answer) is given: a
       reply "The correct answer is[:] X" accepts the candidate when X occurs word for word
       in the candidate or starts with it (articles and punctuation aside; the reply's last
       word may be cut off, as verdicts are a few tokens long): 'The correct answer is: The
       Communist regime initiated the "B' for 'The Communist regime initiated the "Bricks
       for Warsaw" campaign ...', "The correct answer is: 10 times." for "The Cowboys scored
       10 times in the first half". It rejects the candidate otherwise ("The correct answer
       is 1816." for "1815"). A reply whose only word may be the cut-off start of a
       candidate word ("The correct answer is 1" for "1970s") and an empty X ("The correct
       answer is:") stay None. Without ``candidate``, None.

    "Yes"/"No", "right"/"wrong" and other words are NOT verdicts (the judge prompt asks for
    exactly "Correct" or "Incorrect").

    Args:
        text: The judge's raw reply.
        candidate: The answer the judge was asked about (enables step 6).

    Returns:
        True (Correct), False (Incorrect) or None (no verdict word, e.g. "", "Yes",
        "Correct or Incorrect", "The correct answer is: X" without a candidate).

    Source:
        Project rule (no official counterpart).
    """
    after = strip_reasoning(text)
    if after is None:  # cut inside its reasoning: nothing in it decides
        return None
    text = after
    tokens = words(text)
    pairs = _pair_members(tokens)
    for i, (w, _) in enumerate(tokens):
        if w not in _VERDICT_WORDS or i in pairs or _is_noun_phrase_use(tokens, i):
            continue
        return (w == "correct") != _negated_index(tokens, i)
    return None if candidate is None else _restated_answer(text, candidate)


_RESTATED = re.compile(r"\bthe\s+correct\s+answer(?:\s+to\s+(?:this|the)\s+question)?\s*"
                       r"(?:is|would\s+be|should\s+be|was)?\s*(?::|\bthat\b)?(?P<rest>[^\n]*)",
                       re.IGNORECASE)


def _content(text: str) -> list[str]:
    return [w for w, _ in words(text) if (w[0].isalnum()) and w not in _DETERMINERS]


def _restated_answer(text: str, candidate: str) -> bool | None:
    """Step 6 of :func:`parse_verdict`: "The correct answer is X" against the candidate."""
    m = _RESTATED.search(text)
    if not m:
        return None
    said, cand = _content(m.group("rest")), _content(candidate)
    if not said or not cand:
        return None
    # the reply may end inside its last word ("... the \"B"): compare that word as a prefix
    cut = text.rstrip().lower().endswith(said[-1])
    n = len(said)
    for i in range(len(cand) - n + 1):
        window = cand[i:i + n]
        if window[:-1] == said[:-1] and (window[-1] == said[-1]
                                         or (cut and window[-1].startswith(said[-1]))):
            return None if n == 1 and window[-1] != said[-1] else True
    if n > len(cand) and said[:len(cand)] == cand:
        return True  # X extends the candidate ("Paris, France" for "Paris")
    return False


# --------------------------------------------------------------------------------------------
# Abstentions
# --------------------------------------------------------------------------------------------

_NEED = r"(?:information|context|details?|data|evidence)"
ABSTENTION_PATTERNS: tuple[str, ...] = (
    rf"\bi (?:would |will )?need more {_NEED}\b",
    rf"\bmore {_NEED} (?:is |would be )?(?:needed|required)\b",
    rf"\b(?:not enough|insufficient) {_NEED}\b",
    r"\b(?:cannot|can ?not|can't|could not|couldn't) (?:be )?"
    r"(?:determined?|answered|answer|inferred|infer|found|tell|say|know)\b",
    r"\b(?:impossible|unable|not possible) to (?:determine|answer|tell|say|know|infer)\b",
    r"\bnot (?:explicitly |directly |specifically |clearly )?"
    r"(?:mentioned|stated|specified|provided|given|included|answerable|known)\b",
    r"\bunanswerable\b",
    r"\bi (?:do not|don't|dont) know\b",
    r"\bno (?:relevant |such |clear )?(?:answer|information|mention|indication|way to)\b",
    r"\b(?:context|passage|text|document|article|paragraph|source|information)s? "
    r"(?:provided |given |above )?(?:does|do|did)(?: not|n't)\b",
    r"\b(?:is|are|was|were|remains?) (?:unknown|unclear|not clear)\b",
    r"\bi(?: am|'m) (?:sorry|not sure|unable)\b",
    r"^\W*(?:unknown|none|n/?a|not applicable)\W*$",
)
"""Regexes (searched case-insensitively, curly apostrophes folded to ``'``) that mark a refusal
or abstention: "I need more information", "cannot be determined", "not mentioned in the
context", "unanswerable", "I don't know", "no answer", "not enough information", "the context
does not ...", "it is unknown", and whole answers "unknown"/"none"/"N/A"."""

_ABSTENTION_RE = re.compile("|".join(f"(?:{p})" for p in ABSTENTION_PATTERNS), re.IGNORECASE)


def is_abstention(text: str) -> bool:
    """Whether a generation refuses or abstains instead of answering.

    Used to score SQuAD 2.0 unanswerable questions (abstaining is the correct answer) and to
    drop refusals when mining hard negatives.

    Args:
        text: A raw generation or an extracted answer.

    Returns:
        True iff any of :data:`ABSTENTION_PATTERNS` matches.

    Source:
        Project rule (no official counterpart).
    """
    return bool(_ABSTENTION_RE.search(text.replace("\u2019", "'")))
