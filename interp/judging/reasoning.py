"""The reasoning judge: it reasons before its verdict, and everything is read after its reasoning.

A template with ``judge = "reasoning"`` (``[reasoning]`` in ``interp/templates/paper.toml``;
the think-then-verdict control of seed 002, the paper's "Related seed: reasoning judges") asks
the judge to check the candidate against the context step by step and to end with a final
line ``Verdict: Correct`` or ``Verdict: Incorrect``. Algorithm, per eval prompt
(:func:`judge_reasoning`):

1. Decode greedily (:func:`interp.judging.prefill.run_prompts`, no stop string) until the end of
turn
   or ``max_reasoning_tokens`` (``reasoning_stop``: ``"eos"`` or ``"max_new_tokens"``, the
   budget). The whole reply is kept.
2. Verdict (:func:`parse_final_verdict`): read after the reasoning markup, as every verdict
   reader is (:func:`interp.judging.parsing.reasoning_end`: the text after the last
   ``</think>``; a reply cut inside its ``<think>`` has no verdict, whatever draft it holds),
   the LAST verdict line of the reply decides, a line
   that starts (after markdown such as ``**``, ``#``, ``>``, ``-``) with ``Verdict`` or
   ``Final verdict`` and a colon, whose rest :func:`interp.judging.parsing.parse_verdict` reads
   (negation-aware: ``Verdict: not correct`` rejects; an echo ``Correct or Incorrect``
   decides nothing). A reply whose last line instead ENDS with the verdict phrase inside a
   sentence (``... Therefore, the final line is: Verdict: Correct.``, ``... The final line is
   "Verdict: Incorrect".``: only closing quotes, markdown and ``.``/``!`` after its one to
   three words) has that *inline verdict*, provided the phrase is the line's only
   ``Verdict:`` (an echo ``end with "Verdict: Correct" or "Verdict: Incorrect".`` decides
   nothing). Neither: no verdict (None), counted as no verdict, never as a rejection; verdict
   words inside the reasoning do not count.
3. Reasoning (:func:`split_reasoning`): the reply's tokens before that verdict line or inline
   verdict phrase (its opening quotes and markdown included; the whole reply when there is
   none).
4. Verdict sequence: prompt + reasoning + a newline when the reasoning is not empty and does
   not end in one + the tokens the two endings share (:func:`verdict_endings`: ``Verdict:``).
   Its last position is the *verdict position*, the position that emits the verdict word;
   ``verdict_position_own`` says whether the judge's own reply continued with exactly these
   tokens and then a verdict word there (so that position emitted its verdict).
5. Forced choice: one prefill of the verdict sequence (:func:`interp.judging.prefill.run_prompts`
   with ``tail``) gives ``log P(shared tokens | prompt + reasoning)`` and, from its cache,
   ``log P(word tokens | verdict sequence)`` of each ending; their sums are the whole-ending
   log-probabilities of ``Verdict: Correct`` and ``Verdict: Incorrect`` teacher-forced after
   the judge's own reasoning, turned into ``logit_diff``, ``p_correct`` and
   ``verdict_coverage`` as in :mod:`interp.judging.verdict`.
6. Attention at the verdict position: the same prefill's last-token rows ``[n_layers,
   n_heads, pos]`` (:func:`interp.hooks.recorder.batch_rows`). Labels (:func:`sequence_labels`):
   the prompt's own (:attr:`interp.judging.prompts.RenderedPrompt.labels`), ``reasoning`` for the
   judge's reasoning tokens, ``template`` for the inserted newline and the shared ending
   tokens, so every position has one label and each row's span masses
   (:func:`interp.analysis.span_mass.span_mass`) sum to 1.
7. Attention while reasoning (``reasoning_attention``): one forward of the verdict sequence
   with full patterns (:func:`interp.hooks.recorder.record_stream`); for every position that
   emits a reasoning token (the prompt's last position and every reasoning token but the
   last) its row's span masses, averaged over those positions: ``[n_layers, n_heads,
   n_spans]`` ("does it read the context while it reasons?").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from interp.analysis.span_mass import SPANS, span_mass
from interp.core.errors import PromptError
from interp.core.vocab import MAX_REASONING_TOKENS
from interp.hooks.recorder import record_stream
from interp.judging.parsing import parse_verdict, reasoning_end
from interp.judging.prefill import run_prompts
from interp.judging.prompts import RenderedPrompt
from interp.judging.verdict import VERDICT_WORDS, VerdictScores
from interp.models.loading import ModelHandle

__all__ = ["MAX_REASONING_TOKENS", "REASONING_SPANS", "FinalVerdict", "ReasoningJudgement",
           "VerdictEndings", "judge_reasoning", "parse_final_verdict", "sequence_labels",
           "split_reasoning", "verdict_endings"]

REASONING_SPANS = (*SPANS, "reasoning")
"""Span order of the reasoning judge's masses (``reasoning``: its own generated tokens)."""
VERDICT_LINE_FORMAT = "Verdict: {}"
"""The final line the reasoning template asks for, with ``Correct`` or ``Incorrect``."""

_VERDICT_LINE = re.compile(r"^[\s>#*_\-]*(?:final\s+)?verdict\s*[*_]*\s*:\s*(?P<rest>.*)$",
                           re.IGNORECASE)
_VERDICT_PHRASE = re.compile(r"verdict\s*[*_]*\s*:", re.IGNORECASE)
_CLOSING = " \t\"'*_`.!"
"""What may follow an inline verdict's words: closing quotes, markdown, ``.`` and ``!``."""
_OPENING = "\"'*_`"
"""Opening quotes and markdown that belong to an inline verdict phrase (not the reasoning)."""


@dataclass(frozen=True)
class FinalVerdict:
    """The verdict of a reasoning reply (module docstring, step 2).

    Attributes:
        verdict: True (Correct), False (Incorrect) or None (no verdict line decides).
        start: character offset in the reply where the deciding line (or inline verdict
            phrase) starts (None: none).
        line: that line or phrase (None: none).
        inline: the verdict is an inline verdict ending the last line, not a verdict line.
    """

    verdict: bool | None
    start: int | None = None
    line: str | None = None
    inline: bool = False


def parse_final_verdict(text: str) -> FinalVerdict:
    r"""The last verdict line of a reasoning reply and its verdict (module docstring, step 2).

    The reply is first read after its reasoning markup
    (:func:`interp.judging.parsing.reasoning_end`, the rule every verdict reader shares):
    only the text after the last ``</think>`` is searched, and a reply cut inside its
    ``<think>`` has no verdict, whatever draft verdict line it holds.

    Examples: ``"...\nVerdict: Correct"`` -> True; ``"Verdict: Correct\n...\nVerdict:
    Incorrect"`` -> False (the last line decides); ``"**Verdict:** Incorrect"`` -> False;
    ``"Verdict: Not correct"`` -> False; ``"The answer is correct."`` -> None (no verdict line).

    Args:
        text: the judge's whole reply.

    Returns:
        The :class:`FinalVerdict`.

    Source:
        Project rule (no official counterpart); the rest of the line is read by
        :func:`interp.judging.parsing.parse_verdict`.
    """
    offset = reasoning_end(text)
    if offset is None:  # cut inside its <think>: a draft verdict there decides nothing
        return FinalVerdict(verdict=None)
    fv = _final_verdict(text[offset:])
    return fv if fv.start is None or not offset else replace(fv, start=fv.start + offset)


def _final_verdict(text: str) -> FinalVerdict:
    """:func:`parse_final_verdict` on a reply without reasoning markup."""
    lines = text.splitlines(keepends=True)
    starts, pos = [], 0
    for ln in lines:
        starts.append(pos)
        pos += len(ln)
    last = text.rstrip()
    last_start = last.rfind("\n") + 1  # where the reply's last non-empty line starts
    for start, ln in zip(reversed(starts), reversed(lines)):
        m = _VERDICT_LINE.match(ln.rstrip("\r\n"))
        if m and (v := parse_verdict(m.group("rest"))) is not None:
            if start < last_start and (inline := _inline_verdict(last, last_start)):
                return inline  # an inline verdict on a later line than the verdict line
            return FinalVerdict(verdict=v, start=start, line=ln.strip())
    return _inline_verdict(last, last_start) or FinalVerdict(verdict=None)


def _inline_verdict(text: str, line_start: int) -> FinalVerdict | None:
    """Step 2's inline verdict: the last line of ``text`` (from ``line_start``) ends with it."""
    phrases = list(_VERDICT_PHRASE.finditer(text, line_start))
    if len(phrases) != 1:  # none, or an echo naming both verdicts
        return None
    m = phrases[0]
    rest = text[m.end():].rstrip(_CLOSING).lstrip(" \t" + _OPENING)
    if not rest or len(rest.split()) > 3 or (v := parse_verdict(rest)) is None:
        return None
    start = m.start()
    while start > line_start and text[start - 1] in _OPENING:
        start -= 1
    return FinalVerdict(verdict=v, start=start, line=text[start:].strip(), inline=True)


@dataclass(frozen=True)
class VerdictEndings:
    """Token ids of the two final verdict lines (module docstring, steps 4-5).

    Attributes:
        shared: tokens both endings start with (``Verdict:``).
        words: the rest of each ending, ``(Correct, Incorrect)`` order.
        newline: tokens of the newline put before an ending that would not start a line.
    """

    shared: tuple[int, ...]
    words: tuple[tuple[int, ...], tuple[int, ...]]
    newline: tuple[int, ...]


def verdict_endings(tokenizer: Any) -> VerdictEndings:
    """Tokenize ``Verdict: Correct`` and ``Verdict: Incorrect`` and split off their shared part.

    Raises:
        PromptError: the endings share no token, or one ending holds nothing past the shared
            part (its verdict word could not be scored).
    """
    ids = [tuple(tokenizer(VERDICT_LINE_FORMAT.format(w), add_special_tokens=False)["input_ids"])
           for w in VERDICT_WORDS]
    n = 0
    while n < min(map(len, ids)) and ids[0][n] == ids[1][n]:
        n += 1
    if n == 0 or n == min(map(len, ids)):
        raise PromptError(f"the verdict lines {VERDICT_LINE_FORMAT!r} tokenize to {ids}: no "
                          f"shared start or no word past it; cannot score the reasoning judge")
    newline = tuple(tokenizer("\n", add_special_tokens=False)["input_ids"])
    return VerdictEndings(shared=ids[0][:n], words=(ids[0][n:], ids[1][n:]), newline=newline)


def split_reasoning(tokenizer: Any, token_ids: Sequence[int], start: int | None) -> int:
    """How many of a reply's tokens come before character ``start`` of its decoded text.

    Args:
        tokenizer: the model's tokenizer.
        token_ids: the reply's tokens (decoded with ``skip_special_tokens=True`` to its text).
        start: where the verdict line starts in that text (None: the whole reply reasons).

    Returns:
        The largest ``k`` with ``len(decode(token_ids[:k])) <= start`` (binary search; the
        decoded length grows with ``k``), or ``len(token_ids)`` when ``start`` is None.
    """
    if start is None:
        return len(token_ids)
    lo, hi = 0, len(token_ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.decode(list(token_ids[:mid]), skip_special_tokens=True)) <= start:
            lo = mid
        else:
            hi = mid - 1
    return lo


def sequence_labels(prompt: RenderedPrompt, n_reasoning: int, n_forced: int) -> list[str]:
    """One span label per position of a verdict sequence (module docstring, step 6).

    Args:
        prompt: the eval prompt (its labels cover its positions).
        n_reasoning: reasoning tokens after it.
        n_forced: forced tokens after those (inserted newline and shared ending tokens).

    Returns:
        ``len(prompt) + n_reasoning + n_forced`` labels.
    """
    return [*prompt.labels, *["reasoning"] * n_reasoning, *["template"] * n_forced]


@dataclass
class ReasoningJudgement:
    """What the reasoning judge did with one eval prompt (module docstring).

    Attributes:
        text: the whole reply (reasoning and verdict line).
        token_ids: the reply's tokens (end-of-turn id excluded).
        stop: ``"eos"`` (end of turn) or ``"max_new_tokens"`` (the budget).
        verdict: the parsed :class:`FinalVerdict`.
        n_reasoning: tokens of the reply before the verdict line.
        sequence: the verdict sequence's token ids (prompt + reasoning + forced tokens).
        labels: its span labels, ``len(labels) == len(sequence)``.
        verdict_position_own: the reply emitted its verdict word at the verdict position.
        scores: ``logprob_correct``, ``logprob_incorrect``, ``logit_diff``, ``p_correct``,
            ``verdict_coverage`` of the two endings (nats;
            :class:`interp.judging.verdict.VerdictScores`).
        verdict_mass: span masses of the verdict position's rows ``[n_layers, n_heads,
            n_spans]`` in :data:`REASONING_SPANS` order (None when not recorded).
        reasoning_mass: mean span masses over the positions that emit reasoning tokens
            ``[n_layers, n_heads, n_spans]`` (None when not recorded).
        endings: the token ids of the two whole endings scored (``{"Correct": [...], ...}``).
    """

    text: str
    token_ids: list[int]
    stop: str
    verdict: FinalVerdict
    n_reasoning: int
    sequence: list[int]
    labels: list[str] = field(repr=False)
    verdict_position_own: bool
    scores: dict[str, float]
    endings: dict[str, list[int]] = field(default_factory=dict)
    verdict_mass: Float[Tensor, "layer head span"] | None = None
    reasoning_mass: Float[Tensor, "layer head span"] | None = None

    @property
    def verdict_position(self) -> int:
        """Index of the verdict position in :attr:`sequence` (its last position)."""
        return len(self.sequence) - 1

    def to_fields(self) -> dict[str, Any]:
        """The record fields of the judgement (JSON-safe; the masses are stored apart)."""
        reasoning = self.text[:self.verdict.start] if self.verdict.start is not None \
            else self.text
        return {"verdict": self.verdict.verdict, "verdict_reply_ids": self.endings,
                "verdict_source": "none" if self.verdict.line is None else
                "inline_verdict" if self.verdict.inline else "verdict_line",
                "verdict_text": self.text, "reasoning": reasoning,
                "verdict_line": self.verdict.line, "reasoning_tokens": self.n_reasoning,
                "reply_tokens": len(self.token_ids), "reasoning_stop": self.stop,
                "hit_budget": self.stop == "max_new_tokens",
                "verdict_position": self.verdict_position,
                "verdict_position_own": self.verdict_position_own, **self.scores}


def _forced(tokenizer: Any, ends: VerdictEndings, reply: Sequence[int], k: int) -> list[int]:
    """Step 4: the forced tokens after ``reply[:k]`` (newline when needed, shared tokens)."""
    text = tokenizer.decode(list(reply[:k]), skip_special_tokens=True)
    newline = list(ends.newline) if text and not text.endswith("\n") else []
    return newline + list(ends.shared)


def _reasoning_mass(handle: ModelHandle, seq: Sequence[int], labels: Sequence[str],
                    first: int, last: int) -> Tensor:
    """Step 7: mean span masses of the rows of query positions ``[first, last)``."""
    out = torch.zeros(handle.n_layers, handle.n_heads, len(REASONING_SPANS))

    def sink(name: str, start: int, value: Tensor) -> None:
        layer = int(name.split(".")[1])
        rows = value[:, first:last]  # [heads, n_q, pos]
        m = span_mass(rows, labels, REASONING_SPANS).mean(1)  # [heads, n_spans]
        out[layer, start:start + len(m)] = m

    record_stream(handle, list(seq), sink, layers=range(handle.n_layers), points=())
    return out


def judge_reasoning(
    handle: ModelHandle,
    prompts: Sequence[RenderedPrompt],
    *,
    max_reasoning_tokens: int = MAX_REASONING_TOKENS,
    batch_size: int = 8,
    rows: bool = True,
    reasoning_attention: bool = False,
    progress: str | None = None,
) -> list[ReasoningJudgement]:
    """Run the reasoning judge on eval prompts (the whole module algorithm).

    Args:
        handle: the judge model.
        prompts: rendered eval prompts of a ``judge = "reasoning"`` template.
        max_reasoning_tokens: token budget of a reply (step 1).
        batch_size: prompts per forward.
        rows: record the verdict position's attention (step 6).
        reasoning_attention: also record the attention while reasoning (step 7; one more
            forward per prompt with full patterns).
        progress: a tqdm description (None: no bar).

    Returns:
        One :class:`ReasoningJudgement` per prompt, in order.

    Raises:
        PromptError: the verdict lines cannot be scored with this tokenizer
            (:func:`verdict_endings`), before any decoding.
    """
    tok = handle.tokenizer
    ends = verdict_endings(tok)
    replies = run_prompts(handle, [p.input_ids for p in prompts], batch_size=batch_size,
                          max_new_tokens=max_reasoning_tokens, stop_strings=(),
                          progress=progress and f"{progress} reasoning")
    parts = []
    for p, r in zip(prompts, replies):
        fv = parse_final_verdict(r.text)
        k = split_reasoning(tok, r.token_ids, fv.start)
        forced = _forced(tok, ends, r.token_ids, k)
        n_f = len(forced)
        own = fv.verdict is not None and list(r.token_ids[k:k + n_f]) == forced and any(
            r.token_ids[k + n_f:k + n_f + len(w)] == list(w) for w in ends.words)
        parts.append((fv, k, [*p.input_ids, *r.token_ids[:k], *forced], own))
    n_shared = len(ends.shared)
    passes = run_prompts(handle, [seq for _, _, seq, _ in parts], batch_size=batch_size,
                         max_new_tokens=0, continuations=ends.words, tail=n_shared,
                         rows=rows, progress=progress and f"{progress} verdict")
    lps = torch.tensor([[v.tail_logprob + float(x) for x in v.logprobs] for v in passes],
                       dtype=torch.float64).reshape(-1, 2)
    scores = VerdictScores(logprob_correct=lps[:, 0], logprob_incorrect=lps[:, 1]).rows()
    out = []
    for p, r, (fv, k, seq, own), v, sc in zip(prompts, replies, parts, passes, scores):
        labels = sequence_labels(p, k, len(seq) - len(p) - k)
        j = ReasoningJudgement(text=r.text, token_ids=list(r.token_ids), stop=r.stop,
                               verdict=fv, n_reasoning=k, sequence=seq, labels=labels,
                               verdict_position_own=own, scores=sc,
                               endings={w: [*ends.shared, *x]
                                        for w, x in zip(VERDICT_WORDS, ends.words)})
        if v.rows is not None:
            j.verdict_mass = span_mass(v.rows, labels, REASONING_SPANS)
        if reasoning_attention and k:
            j.reasoning_mass = _reasoning_mass(handle, seq, labels, len(p) - 1, len(p) + k - 1)
        out.append(j)
    return out
