"""Generation and evaluation prompts, rendered with the chat template, with labelled spans.

Algorithm (one prompt):

1. Take a template variant (TOML data in ``interp/templates/``, or a user file) and fill its
   user message piece by piece, recording the character range of each field: ``context``,
   ``question``, ``candidate`` (the ``{answer}`` field of the eval prompt) and ``reference``.
2. Render the messages with the tokenizer's chat template (``add_generation_prompt=True``), and
   locate the user message in the rendered text, so every field's range is known in the
   RENDERED string; check that ``rendered[start:end]`` is the field text.
3. Tokenize the rendered text with offsets (no special tokens added when the chat template
   rendered it: the template already holds BOS and role markers, as in transformers'
   ``apply_chat_template(tokenize=True)``). Every token position gets exactly one span label
   (:func:`label_positions`): a token belongs to a field when they share at least one
   NON-WHITESPACE character, or when it lies entirely inside the field (a blank line inside a
   context); a token sharing non-whitespace with two fields goes to the one with more;
   everything else is ``template`` (BOS, a system prompt the chat template injects,
   instructions, role markers, and tokens that touch a field only on whitespace, such as
   ``ĠĊ`` after a field that ends in a space, or a SentencePiece ``▁word`` whose offsets include
   the space before it). So spans of adjacent fields never share a token, every field's tokens
   are contiguous, and they decode to its text up to surrounding whitespace. A field's token span is
   ``[first, last + 1)`` of the positions labelled with it. Offsets are read through the
   tokenizer's normaliser (:func:`normalised_offsets`): a character the normaliser folded into
   a token (a combining accent composed to NFC by the bundled Qwen's tokenizer) belongs to that
   token, so a context with decomposed accents keeps its text in its span; the prompt's text
   is the user's, never normalised.

The last position of the prompt is where the model predicts the first output token: for the eval
prompt it is the *verdict position* (paper section 3.2 reads its attention row).

A stored QA record's prompts are rendered again, for the studies that read a run, only through
:func:`rerender` / :func:`record_prompts`, which check the result against the token spans and
length the record stored (another tokenizer, template or template file is refused).
"""

from __future__ import annotations

import string
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from interp.core.errors import PromptError, RunDirError
from interp.core.inputs import read_toml
from interp.core.names import did_you_mean

SPANS = ("context", "question", "candidate", "template")
"""Span labels; every prompt position has exactly one. ``reference`` counts as its own field
when a template uses it, and is reported under that name."""

SELF_CHECK_USER = ('Judge whether your answer is correct given the context. Reply with '
                   'exactly "Correct" or "Incorrect".')
"""The self-check's verdict question when a template names none (:func:`render_self_check`):
the default eval instruction with "the proposed answer" as "your answer"."""

JUDGES = ("word", "reasoning")
"""How a template's judge replies (:attr:`Template.judge`)."""

_FIELD_TO_SPAN = {"context": "context", "question": "question", "answer": "candidate",
                  "reference": "reference"}


@dataclass(frozen=True)
class Template:
    """One template variant: system and user message formats for T_gen and T_eval.

    ``judge`` is how the judge replies: ``"word"`` (the paper's one-word verdict) or
    ``"reasoning"`` (it reasons first and ends with a verdict line,
    :mod:`interp.judging.reasoning`). ``self_user`` is the verdict question of the self-check
    (:func:`render_self_check`), asked as a new user turn after the generator's own answer;
    "" means :data:`SELF_CHECK_USER`. It has no fields (the context, question and answer are
    already in the conversation).
    """

    name: str
    gen_user: str
    eval_user: str
    gen_system: str = ""
    eval_system: str = ""
    description: str = ""
    judge: str = "word"
    self_user: str = ""

    def __post_init__(self) -> None:
        if self.judge not in JUDGES:
            raise PromptError(f"template {self.name!r}: judge must be one of {list(JUDGES)}, "
                              f"not {self.judge!r}")
        for task, fmt, need in (("gen", self.gen_user, {"question"}),
                                ("eval", self.eval_user, {"question", "answer"})):
            names = [f for _, f, _, _ in string.Formatter().parse(fmt) if f is not None]
            unknown = set(names) - set(_FIELD_TO_SPAN)
            if unknown:
                raise PromptError(f"template {self.name!r} ({task}) has unknown fields "
                                  f"{sorted(unknown)}; allowed: {sorted(_FIELD_TO_SPAN)}")
            if missing := need - set(names):
                raise PromptError(f"template {self.name!r} ({task}) lacks {sorted(missing)}")
            if len(names) != len(set(names)):
                raise PromptError(f"template {self.name!r} ({task}) repeats a field")
        if any(f is not None for _, f, _, _ in string.Formatter().parse(self.self_user)):
            raise PromptError(f"template {self.name!r}: self_user takes no fields (the "
                              f"conversation already holds the context, question and answer)")


def load_templates(path: str | Path | None = None) -> dict[str, Template]:
    """Read template variants from a TOML file (default: the bundled ``paper.toml``).

    Raises:
        interp.core.errors.ConfigError: the file is missing or not TOML.
        PromptError: a variant with unknown keys or fields.
    """
    if path is None:
        text = resources.files("interp").joinpath("templates/paper.toml").read_text()
    else:
        return _templates(read_toml(path, "templates"), path)
    return _templates(tomllib.loads(text), "the bundled templates")


def _templates(data: dict[str, Any], where: Any) -> dict[str, Template]:
    out = {}
    for name, body in data.items():
        try:
            out[name] = Template(name=name, **body)
        except TypeError as err:
            raise PromptError(f"{where}: template [{name}]: {err}") from None
    return out


def get_template(name: str = "default", path: str | Path | None = None) -> Template:
    """One template variant by name.

    Raises:
        PromptError: the name is not in the file (the message lists the names that are).
    """
    templates = load_templates(path)
    if name not in templates:
        raise PromptError(f"unknown template {name!r}{did_you_mean(name, templates)}; known: "
                          f"{sorted(templates)}")
    return templates[name]


@dataclass
class RenderedPrompt:
    """A prompt rendered with the chat template and tokenized, with labelled spans.

    Attributes:
        task: ``"gen"`` or ``"eval"``.
        text: the rendered string fed to the tokenizer.
        input_ids: token ids, ``[seq]`` (BOS included when the template or tokenizer adds one).
        char_spans: field -> ``(start, end)`` character range in ``text``.
        token_spans: span -> ``(start, end)`` token range, end exclusive.
        labels: span label of every position, ``len(labels) == len(input_ids)``.
    """

    task: str
    text: str
    input_ids: list[int]
    char_spans: dict[str, tuple[int, int]]
    token_spans: dict[str, tuple[int, int]]
    labels: list[str] = field(repr=False)

    def __len__(self) -> int:
        return len(self.input_ids)

    def span_positions(self, span: str) -> list[int]:
        """Positions labelled ``span`` (``template`` positions are not contiguous)."""
        return [i for i, lab in enumerate(self.labels) if lab == span]

    def to_record(self) -> dict[str, Any]:
        """JSON-safe summary for records.jsonl: length and token spans."""
        return {"n_tokens": len(self.input_ids),
                "token_spans": {k: list(v) for k, v in self.token_spans.items()}}


def _fill(fmt: str, values: dict[str, str], spans_of: Mapping[str, str] = _FIELD_TO_SPAN
          ) -> tuple[str, dict[str, tuple[int, int]]]:
    out, spans, pos = [], {}, 0
    for literal, name, _, _ in string.Formatter().parse(fmt):
        out.append(literal)
        pos += len(literal)
        if name is not None:
            if name not in values:
                raise PromptError(f"no value for template field {{{name}}}")
            val = values[name]
            spans[spans_of[name]] = (pos, pos + len(val))
            out.append(val)
            pos += len(val)
    return "".join(out), spans


def check_spans(text: str, offsets: Sequence[tuple[int, int]],
                char_spans: Mapping[str, tuple[int, int]],
                token_spans: Mapping[str, tuple[int, int]]) -> None:
    """Refuse a span whose tokens do not hold every non-whitespace character of its field.

    Offsets vary between tokenizers: a byte-level ``Ġword`` token may include the space before
    the word (then it belongs to the field it starts, :func:`label_positions`), and some
    tokenizers report offsets one character off. Whatever the tokenizer, the field's first
    and last non-whitespace characters, and every one between, must lie inside the offsets
    of the span's tokens; otherwise a token was lost (or a wrong one taken) at its edge.

    Raises:
        PromptError: a field with non-whitespace text that its tokens do not cover (one line
            naming the field and the first character they miss).
    """
    for name, (fs, fe) in char_spans.items():
        need = [i for i in range(fs, fe) if not text[i].isspace()]
        if not need or name not in token_spans:
            continue
        a, b = token_spans[name]
        covered = set()
        for s, e in offsets[a:b]:
            covered.update(range(s, e))
        if missing := [i for i in need if i not in covered]:
            i = missing[0]
            raise PromptError(
                f"span {name!r} loses its text at character {i - fs} ({text[i]!r} of "
                f"{text[fs:fe][:30]!r}): the tokenizer's offsets do not cover the field "
                f"(tokens {a}-{b}); a tokenizer with other offsets, not supported")


def normalised_offsets(tokenizer: Any, text: str, offsets: Sequence[tuple[int, int]]
                       ) -> list[tuple[int, int]]:
    """Token offsets mapped through the tokenizer's normaliser onto every character it read.

    A tokenizer whose normaliser composes characters (NFC, as the bundled Qwen's does: ``e`` +
    U+0301 COMBINING ACUTE ACCENT becomes ``é``) reports the composed character's offsets as
    its first original character only, so the combining mark lies in no token's offsets
    although its token holds it. Each such character (a run of non-whitespace between one
    token's end and the next token's start) is given to the token before it, the token the
    normaliser folded it into. A tokenizer without a normaliser keeps its offsets unchanged,
    so offsets that truly lose text are still refused (:func:`check_spans`).

    Args:
        tokenizer: a fast Hugging Face tokenizer.
        text: the text it encoded.
        offsets: ``(start, end)`` per token, ``(0, 0)`` for added special tokens.

    Returns:
        The offsets, each token's end extended over the characters its normaliser folded in.

    Source:
        Project rule; the alignments are those of Hugging Face tokenizers'
        ``NormalizedString``, which align a composed character to its first source character.
    """
    out = [tuple(o) for o in offsets]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if getattr(backend, "normalizer", None) is None:
        return out
    real = [i for i, (s, e) in enumerate(out) if e > s]
    for i, j in zip(real, real[1:] + [None]):
        s, e = out[i]
        stop = len(text) if j is None else out[j][0]
        while e < stop and not text[e].isspace():
            e += 1
        out[i] = (s, e)
    return out


def label_positions(text: str, offsets: list[tuple[int, int]],
                    char_spans: dict[str, tuple[int, int]]) -> list[str]:
    """One span label per token position: the field it shares most non-whitespace with.

    A token belongs to a field when their character ranges share at least one
    non-whitespace character of ``text``, or when the token lies entirely inside the field
    (whitespace between two words of a field stays in it). Whitespace a token shares with a
    field at the field's edge never makes it part of the field. A token sharing
    non-whitespace with several fields goes to the one with the most (the first listed on a
    tie); any other token is ``template``.

    Args:
        text: the tokenized string.
        offsets: ``(start, end)`` character range of each token in ``text`` (``(0, 0)`` for
            tokens with no characters, such as an added BOS).
        char_spans: field -> ``(start, end)`` character range in ``text``.

    Returns:
        ``len(offsets)`` labels, each a key of ``char_spans`` or ``"template"``.

    Example:
        SentencePiece offsets include the space before a word: tokens ``<s> ▁Sample ▁input``
        have offsets ``(0, 0), (0, 6), (6, 12)`` on ``"Sample input"``; the field
        ``"Sample "`` = ``(0, 7)`` gets token 1 only, the field ``"input"`` = ``(7, 12)``
        token 2 only.
    """
    nonws = [0]  # nonws[i] = number of non-whitespace characters in text[:i]
    for ch in text:
        nonws.append(nonws[-1] + (not ch.isspace()))
    labels = []
    for s, e in offsets:
        best, best_n = "template", 0
        for name, (fs, fe) in char_spans.items():
            lo, hi = max(s, fs), min(e, fe)
            n = nonws[hi] - nonws[lo] if hi > lo else 0
            if n > best_n:
                best, best_n = name, n
            elif best_n == 0 and fs <= s < e <= fe:  # whitespace inside the field
                best = name
        labels.append(best)
    return labels


def _messages(template: Template, task: str, *, context: str, question: str,
              answer: str | None, reference: str | None
              ) -> tuple[list[dict[str, str]], dict[str, str], dict[str, tuple[int, int]]]:
    """The chat messages of a task, the field values and the fields' ranges in the user turn."""
    if task not in ("gen", "eval"):
        raise PromptError(f"task must be 'gen' or 'eval', not {task!r}")
    fmt = template.gen_user if task == "gen" else template.eval_user
    system = template.gen_system if task == "gen" else template.eval_system
    if task == "eval" and answer is None:
        raise PromptError("the eval prompt needs a candidate answer")
    values = {"context": context, "question": question, "answer": answer or "",
              "reference": reference or ""}
    user, user_spans = _fill(fmt, values)
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}]
    return messages, values, user_spans


def chat_messages(template: Template, task: str, *, context: str, question: str,
                  answer: str | None = None, reference: str | None = None
                  ) -> list[dict[str, str]]:
    """The chat messages :func:`render` renders (system turn if the variant has one, user turn).

    What a model behind a chat endpoint is sent: the server applies its own chat template.

    Raises:
        PromptError: unknown task, or an eval prompt without a candidate.
    """
    return _messages(template, task, context=context, question=question, answer=answer,
                     reference=reference)[0]


def render(
    tokenizer: Any,
    template: Template,
    task: str,
    *,
    context: str,
    question: str,
    answer: str | None = None,
    reference: str | None = None,
) -> RenderedPrompt:
    """Render the T_gen or T_eval prompt and label every token position (module docstring).

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template and offset mapping (fast).
        template: the variant to use.
        task: ``"gen"`` or ``"eval"``.
        context: the example's passage.
        question: the example's question.
        answer: the candidate answer (eval only).
        reference: a gold answer (only for templates with ``{reference}``).

    Returns:
        The :class:`RenderedPrompt`.

    Raises:
        PromptError: unknown task, a missing candidate, or a field that cannot be found at its
            recorded place in the rendered text (a chat template that rewrites content).
    """
    messages, values, user_spans = _messages(template, task, context=context,
                                             question=question, answer=answer,
                                             reference=reference)
    return _tokenize(tokenizer, task, messages, user_spans,
                     {k: values["answer" if k == "candidate" else k] for k in user_spans})


def _locate(text: str, content: str, start: int = 0, *, last: bool = True) -> tuple[int, int]:
    """``(base, shift)``: where ``content`` lies in ``text``.

    ``shift`` is the leading whitespace a chat template trimmed (Llama 3 does ``| trim``).

    Raises:
        PromptError: the chat template rewrote the content.
    """
    find = text.rfind if last else text.find
    base, shift = find(content, start), 0
    if base < 0:
        base = find(content.strip(), start)
        shift = len(content) - len(content.lstrip())
    if base < 0:
        raise PromptError("the chat template rewrote a message; cannot locate spans")
    return base, shift


def _tokenize(tokenizer: Any, task: str, messages: list[dict[str, str]],
              user_spans: Mapping[str, tuple[int, int]], span_text: Mapping[str, str]
              ) -> RenderedPrompt:
    """Steps 2-3 of the module algorithm: render the chat, locate the fields, label tokens."""
    user = messages[-1]["content"]
    templated = bool(getattr(tokenizer, "chat_template", None))
    if templated:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        base, shift = _locate(text, user)
    else:  # a base model without a chat template: plain text
        text, base, shift = user + "\n", 0, 0
    char_spans = {k: (s + base - shift, e + base - shift) for k, (s, e) in user_spans.items()}
    return _label(tokenizer, task, text, char_spans, span_text, templated)


def _label(tokenizer: Any, task: str, text: str, char_spans: dict[str, tuple[int, int]],
           span_text: Mapping[str, str], templated: bool) -> RenderedPrompt:
    """Step 3 of the module algorithm on a rendered text whose fields are located."""
    for k, (s, e) in char_spans.items():
        if text[s:e] != span_text[k]:
            raise PromptError(f"span {k!r} not found at its place in the rendered prompt")
    bos = getattr(tokenizer, "bos_token", None)
    add_special = not templated and not (bos and text.startswith(bos))
    enc = tokenizer(text, add_special_tokens=add_special, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    offsets = normalised_offsets(tokenizer, text, enc["offset_mapping"])
    labels = label_positions(text, offsets, char_spans)
    token_spans = {}
    for name, (s, e) in char_spans.items():
        pos = [i for i, lab in enumerate(labels) if lab == name]
        if not pos and text[s:e].strip():
            raise PromptError(f"span {name!r} holds no token after tokenization")
        if pos:
            if pos[-1] - pos[0] + 1 != len(pos):
                raise PromptError(f"span {name!r} is not contiguous in tokens")
            token_spans[name] = (pos[0], pos[-1] + 1)
    check_spans(text, offsets, char_spans, token_spans)
    return RenderedPrompt(task=task, text=text, input_ids=ids, char_spans=char_spans,
                          token_spans=token_spans, labels=labels)


def render_self_check(tokenizer: Any, template: Template, *, context: str, question: str,
                      answer: str) -> RenderedPrompt:
    """The self-check: the verdict question asked in the generator's own conversation.

    The messages are the generation prompt's (system turn if the variant has one, user turn),
    then ``answer`` as the assistant turn (the generator's own reply), then the template's
    ``self_user`` (default :data:`SELF_CHECK_USER`) as a new user turn, rendered with the
    generation prompt of the chat template; the last position is the self-check's verdict
    position. Spans: ``context`` and ``question`` in the first user turn, ``candidate`` (the
    answer) in the assistant turn, ``template`` elsewhere; ``token_spans["candidate"][1]`` is
    the first position after the answer (for ChatML templates the end-of-turn marker). Task
    name: ``"self"``.

    Args:
        tokenizer: a fast tokenizer with a chat template.
        template: the variant (its ``gen_*`` messages and ``self_user``).
        context: the passage.
        question: the question.
        answer: the generator's reply as it produced it (non-empty).

    Returns:
        The :class:`RenderedPrompt`.

    Raises:
        PromptError: no chat template, an empty answer, or a turn the chat template rewrites.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise PromptError("the self-check needs a chat template (a conversation of turns)")
    if not answer.strip():
        raise PromptError("the self-check needs a non-empty answer")
    msgs, values, user_spans = _messages(template, "gen", context=context, question=question,
                                         answer=None, reference=None)
    user = msgs[-1]["content"]
    msgs = msgs + [{"role": "assistant", "content": answer},
                   {"role": "user", "content": template.self_user or SELF_CHECK_USER}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    base, shift = _locate(text, user, last=False)
    char_spans = {k: (s + base - shift, e + base - shift) for k, (s, e) in user_spans.items()}
    user_end = base - shift + len(user)
    a0, a_shift = _locate(text, answer, user_end, last=False)
    stripped = answer.strip() if a_shift or text[a0:a0 + len(answer)] != answer else answer
    char_spans["candidate"] = (a0, a0 + len(stripped))
    span_text = {**{k: values[k] for k in user_spans}, "candidate": stripped}
    return _label(tokenizer, "self", text, char_spans, span_text, True)


PAIRWISE_FIELDS = {"context": "context", "question": "question", "answer_a": "answer_a",
                   "answer_b": "answer_b"}
"""Fields of a pairwise template -> their span labels (:func:`render_pairwise`)."""


@dataclass(frozen=True)
class PairwiseTemplate:
    """The pairwise judge's messages: question, context and answers A and B, a one-letter reply.

    Attributes:
        name: the variant's name in its TOML file.
        user: the user message format with ``{context}``, ``{question}``, ``{answer_a}`` and
            ``{answer_b}``, each exactly once.
        system: the system message ("" leaves the chat template's default).
        description: what the variant is for.

    Raises:
        PromptError: a format with unknown, missing or repeated fields.
    """

    name: str
    user: str
    system: str = ""
    description: str = ""

    def __post_init__(self) -> None:
        names = [f for _, f, _, _ in string.Formatter().parse(self.user) if f is not None]
        if sorted(names) != sorted(PAIRWISE_FIELDS):
            raise PromptError(f"pairwise template {self.name!r} must use each of "
                              f"{sorted(PAIRWISE_FIELDS)} exactly once, has {names}")


def get_pairwise_template(name: str = "pairwise", path: str | Path | None = None
                          ) -> PairwiseTemplate:
    """A pairwise template by name (default file: the bundled ``templates/pairwise.toml``).

    Raises:
        interp.core.errors.ConfigError: a missing or malformed file.
        PromptError: an unknown name (lists the known ones) or a bad variant.
    """
    if path is None:
        data = tomllib.loads(resources.files("interp").joinpath("templates/pairwise.toml")
                             .read_text())
    else:
        data = read_toml(path, "pairwise templates")
    if name not in data:
        raise PromptError(f"unknown pairwise template {name!r}{did_you_mean(name, data)}; "
                          f"known: {sorted(data)}")
    try:
        return PairwiseTemplate(name=name, **data[name])
    except TypeError as err:
        raise PromptError(f"pairwise template [{name}]: {err}") from None


def render_pairwise(tokenizer: Any, template: PairwiseTemplate, *, context: str, question: str,
                    answer_a: str, answer_b: str) -> RenderedPrompt:
    """Render a pairwise prompt and label every position, as :func:`render` does.

    Spans: ``context``, ``question``, ``answer_a``, ``answer_b`` and ``template``; the last
    position is the verdict position, where the reply "A" or "B" is predicted.

    Raises:
        PromptError: an empty answer, or a field the chat template moves (see :func:`render`).
    """
    if not answer_a.strip() or not answer_b.strip():
        raise PromptError("a pairwise prompt needs two non-empty answers")
    values = {"context": context, "question": question, "answer_a": answer_a,
              "answer_b": answer_b}
    user, spans = _fill(template.user, values, PAIRWISE_FIELDS)
    messages = ([{"role": "system", "content": template.system}] if template.system else []) \
        + [{"role": "user", "content": user}]
    return _tokenize(tokenizer, "pairwise", messages, spans, values)


def rerender(record: Mapping[str, Any], task: str, tokenizer: Any, *,
             templates_path: str | None = None) -> RenderedPrompt:
    """Render a record's ``task`` prompt again, exactly as the harness did, and check it.

    The eval prompt's candidate is the record's extracted ``answer``; the reference (templates
    with ``{reference}``) is the first gold answer, as in
    :func:`interp.methods.asymmetry.evaluate_examples`.

    Args:
        record: an ``ok`` record of ``records.jsonl``.
        task: ``"gen"`` or ``"eval"``.
        tokenizer: the model's tokenizer.
        templates_path: the run's template file (manifest ``config.templates_path``; None for
            the bundled templates).

    Returns:
        The :class:`RenderedPrompt`.

    Raises:
        RunDirError: the record lacks a field or its ``prompts.{task}``, its prompt cannot be
            rendered, or the token spans / length differ from the stored ones (the run was made
            with another tokenizer, template or template file); the message names the record.
    """
    rid = f"{record.get('dataset')}/{record.get('id')}"
    stored = (record.get("prompts") or {}).get(task)
    if not stored:
        raise RunDirError(f"record {rid} has no prompts.{task} (not an ok asymmetry record?); "
                          f"re-run `interp asymmetry`")
    try:
        tpl = get_template(record.get("template") or "default", templates_path)
        answers = record.get("answers") or []
        rp = render(tokenizer, tpl, task, context=record["context"], question=record["question"],
                    answer=record["answer"] if task == "eval" else None,
                    reference=answers[0] if answers else "")
    except KeyError as err:
        raise RunDirError(f"record {rid} lacks the field {err}") from err
    except PromptError as err:
        raise RunDirError(f"record {rid}: cannot render its {task} prompt ({err})") from err
    mine = {k: list(v) for k, v in rp.token_spans.items()}
    theirs = {k: list(v) for k, v in stored["token_spans"].items()}
    if mine != theirs or len(rp) != stored["n_tokens"]:
        raise RunDirError(
            f"record {rid}: the re-rendered {task} prompt ({len(rp)} tokens, spans {mine}) does "
            f"not match the record ({stored['n_tokens']} tokens, spans {theirs}); the run was "
            f"made with another tokenizer, template {record.get('template')!r} or template file")
    return rp


def record_prompts(record: Mapping[str, Any], tokenizer: Any, *,
                   templates_path: str | None = None) -> dict[str, RenderedPrompt]:
    """Both prompts of a record, ``{"gen": ..., "eval": ...}`` (:func:`rerender` each).

    Raises:
        RunDirError: as :func:`rerender`.
    """
    return {t: rerender(record, t, tokenizer, templates_path=templates_path)
            for t in ("gen", "eval")}
