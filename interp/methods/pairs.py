"""Clean/corrupt prompt pairs for activation patching, built from a run's records.

Four kinds (paper section 3.2), rendered with the run's template
(:func:`interp.judging.prompts.render`):

1. ``candidate-swap`` (:func:`candidate_swap_pair`): the SAME eval prompt with a gold answer
   (clean, the first gold) and an answer the run's oracle grades Incorrect (corrupt). Wrong
   answers, in order, the first usable one is taken: the model's own answer when the run's
   oracle graded it Incorrect (``own``; its label is the record's); a hard negative stored in
   the record (``hard_negative`` / ``hard_negatives``; graded by the oracle); a hard negative
   mined closed-book for the record (``mined``, as in Study 3: :func:`interp.methods.transfer.
   mine_hard_negatives`, seeded, without the answer-rotation fallback; asked only when the
   others fail). Candidates are never another question's gold and never cut to a length. No
   usable answer: the record is skipped with reason ``no_incorrect_answer``.
   Alignment (:func:`align_positions`): tokens equal from the start form the shared prefix
   (identity map; identical activations), tokens equal from the end form the shared suffix
   (everything after the candidate, the verdict position included; corrupt position ``i`` maps
   to clean ``i - n_corrupt + n_clean``). The differing middle (the candidate's tokens) maps
   ``i -> i`` when both middles have the same length, and is then patched only as a whole
   (span units); otherwise it maps to -1 and is never patched.
2. ``gen-to-eval`` (:func:`gen_eval_pair`): clean = the generation prompt, corrupt = the eval
   prompt with the record's own answer; only the LAST position corresponds (the position that
   predicts the answer's first token, and the verdict position). Patching it carries the
   generator's last-position state into the judge; the judge's verdict score is measured.
3. ``eval-to-gen``: the reverse: clean = the eval prompt, corrupt = the generation prompt, last
   position only. What is measured is the verdict score of the patched GENERATION prompt:
   ``log P("Correct") - log P("Incorrect")`` as the reply to the generation prompt, the
   generator's forced choice between the two verdict words and their coverage (how much the
   generator wants to say either). Normalised, ``(LD_patched - LD_gen) / (LD_eval - LD_gen)``
   is the share of the judge's verdict preference that its last-position state at that layer
   carries into the generator (1 at the last layer's ``hook_resid_post`` by construction).
4. ``system-prompt-control`` (:func:`control_pair`; was "task swap"): clean = the generation
   prompt, corrupt = the eval prompt; context position ``i`` of the eval prompt takes the
   generator's activation at context position ``i``. The context precedes the question and
   the instruction, so in a causal model its residuals differ between the two prompts only
   through what comes before it: the system prompt. With equal system prompts they are
   identical (no patchable position: skipped with reason ``control_identity``). A CONTROL by
   construction, not a finding.

:func:`build_pairs` applies one builder to the records, up to ``limit`` built pairs per
dataset (skipped records do not count), and returns the skipped records with a reason code
(:attr:`interp.core.errors.PairError.reason`) and message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from interp.analysis.stats import passage_groups
from interp.core.contract import flat_key
from interp.core.errors import PairError, StageError
from interp.core.vocab import PAIR_KINDS
from interp.judging.cases import Case
from interp.judging.grading import RuleOracle
from interp.judging.prompts import RenderedPrompt, Template, render

__all__ = [
    "CORRUPT_SOURCES",
    "PAIR_KINDS",
    "SKIP_REASONS",
    "PatchPair",
    "align_positions",
    "build_pairs",
    "candidate_swap_pair",
    "case_pair",
    "control_pair",
    "gen_eval_pair",
]

CORRUPT_SOURCES = ("own", "hard_negative", "mined")
"""Where a candidate-swap corrupt answer came from (module docstring, kind 1)."""
SKIP_REASONS = ("no_gold", "no_incorrect_answer", "identical_prompts", "too_long",
                "no_context", "context_differs", "control_identity")
"""Reason codes of skipped records."""

Miner = Callable[[Mapping[str, Any]], Sequence[str]]
"""``record -> closed-book hard negatives`` (already graded Incorrect by the oracle)."""


def shared_prefix(clean_ids: Sequence[int], corrupt_ids: Sequence[int]) -> int:
    """Length of the common token prefix of two prompts.

    Run on one model, position ``i`` below it has identical activations in both runs (causal
    attention: the same tokens at the same positions up to ``i``).
    """
    n = 0
    for a, b in zip(clean_ids, corrupt_ids):
        if a != b:
            break
        n += 1
    return n


def patchable_positions(clean_ids: Sequence[int], corrupt_ids: Sequence[int],
                        pos_map: Sequence[int], *, same_model: bool = True) -> list[int]:
    """Corrupt positions a patch can change (:mod:`interp.methods.patching` step 1).

    A position is patchable when it maps to a clean position and is not a no-op: a position
    in the shared prefix (:func:`shared_prefix`) that maps to itself takes an activation
    identical to its own (always the case for one model; another donor model has no shared
    prefix).
    """
    s = shared_prefix(clean_ids, corrupt_ids) if same_model else 0
    return [i for i, m in enumerate(pos_map) if m >= 0 and not (i < s and m == i)]


@dataclass
class PatchPair:
    """A clean/corrupt pair built from one record.

    Attributes:
        kind: one of :data:`PAIR_KINDS`.
        record_id, dataset: the record; passage: its passage group (dataset + context hash).
        clean, corrupt: rendered prompts.
        pos_map: corrupt position -> clean position (-1 where nothing corresponds),
            ``[len(corrupt)]``.
        start: first patchable corrupt position
            (:func:`interp.methods.patching.patchable_positions`).
        middle: ``[a, b)``: corrupt positions patched only as a whole (candidate-swap with
            equal middles), else an empty range.
        clean_answer, corrupt_answer, corrupt_source: the candidates and where the wrong one
            came from (:data:`CORRUPT_SOURCES`; ``own`` for the other kinds).
    """

    kind: str
    record_id: str
    dataset: str
    clean: RenderedPrompt
    corrupt: RenderedPrompt
    pos_map: list[int]
    start: int
    passage: str = ""
    middle: tuple[int, int] = (0, 0)
    clean_answer: str = ""
    corrupt_answer: str = ""
    corrupt_source: str = ""

    @property
    def key(self) -> str:
        """File-safe identity ``dataset__id``."""
        return flat_key(self.dataset, self.record_id)

    def patchable(self) -> list[int]:
        """Every corrupt position a patch can change."""
        return patchable_positions(self.clean.input_ids, self.corrupt.input_ids, self.pos_map)

    def position_units(self) -> list[int]:
        """Single positions that correspond one to one (the middle excluded).

        Candidate swap only: the other kinds patch one position (``verdict``) or a span.
        """
        if self.kind != "candidate-swap":
            return []
        a, b = self.middle
        return [i for i in self.patchable() if not a <= i < b]

    def span_units(self) -> dict[str, list[int]]:
        """Span name -> its patchable corrupt positions (spans with none are left out).

        Spans, in this order: ``verdict`` (the last position), the corrupt prompt's labels
        (``candidate`` only when its middle is patched as a whole: equal lengths), ``all``.
        """
        ok = set(self.patchable())
        out: dict[str, list[int]] = {"verdict": [i for i in (len(self.corrupt) - 1,)
                                                 if i in ok]}
        for lab in dict.fromkeys(self.corrupt.labels):
            if lab == "candidate" and self.kind == "candidate-swap" and \
                    self.middle[1] <= self.middle[0]:
                continue
            out[lab] = [i for i in self.corrupt.span_positions(lab) if i in ok]
        out["all"] = sorted(ok)
        return {k: v for k, v in out.items() if v}


def align_positions(clean_ids: Sequence[int], corrupt_ids: Sequence[int]
                    ) -> tuple[list[int], int, tuple[int, int]]:
    """Align two prompts that differ in one stretch (module docstring, kind 1).

    Returns:
        ``(pos_map, prefix, middle)``: the corrupt -> clean map, the shared prefix length and
        the corrupt positions ``[a, b)`` of the differing middle when it is mapped ``i -> i``
        (equal lengths), else an empty range.

    Raises:
        PairError: identical prompts (reason ``identical_prompts``).
    """
    nc, nx = len(clean_ids), len(corrupt_ids)
    p = shared_prefix(clean_ids, corrupt_ids)
    if p == nc == nx:
        raise PairError("clean and corrupt prompts are identical", "identical_prompts")
    s = 0
    while s < min(nc, nx) - p and clean_ids[nc - 1 - s] == corrupt_ids[nx - 1 - s]:
        s += 1
    pos_map = [i if i < p else i - nx + nc if i >= nx - s else (i if nc == nx else -1)
               for i in range(nx)]
    return pos_map, p, ((p, nx - s) if nc == nx else (0, 0))


def _norm(s: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", s.lower()).split())


def _check_length(p: RenderedPrompt, rid: str, max_tokens: int | None) -> None:
    if max_tokens and len(p) > max_tokens:
        raise PairError(f"record {rid}: {len(p)} tokens > max_tokens {max_tokens}", "too_long")


def _stored_negatives(rec: Mapping[str, Any]) -> list[str]:
    hn = [rec["hard_negative"]] if rec.get("hard_negative") else []
    return hn + list(rec.get("hard_negatives") or [])


def _incorrect(oracle: Any, answer: str, rec: Mapping[str, Any], golds: Sequence[str]) -> bool:
    g = oracle.grade(answer, golds, dataset=rec.get("dataset", ""), answerable=True,
                     extras={"context": rec.get("context", ""), "question": rec.get("question")})
    return not g.label


def candidate_swap_pair(tokenizer: Any, template: Template, rec: Mapping[str, Any],
                        oracle: Any, *, mine: Miner | None = None,
                        max_tokens: int | None = None, equal_length: bool = False,
                        others: Sequence[str] = ()) -> PatchPair:
    """Build the candidate-swap pair of a record (module docstring, kind 1).

    Args:
        tokenizer: the run's tokenizer.
        template: the run's template.
        rec: an ``ok`` record (``answers``; ``answer`` and ``oracle_label`` for ``own``;
            optional ``hard_negative`` / ``hard_negatives``).
        oracle: the run's oracle (:class:`interp.judging.grading.BaseOracle`).
        mine: closed-book hard negatives of the record, called only when neither the own
            answer nor a stored negative is usable.
        max_tokens: skip longer prompts (reason ``too_long``), checked before any mining.
        equal_length: prefer a wrong answer whose tokens are as many as the gold's (the
            candidate span then corresponds position by position and is patched as a unit);
            the first usable answer otherwise. Mining is asked only when no earlier answer is
            usable, or none has the gold's length.
        others: with ``equal_length``, the last resort: gold answers of OTHER records of the
            same dataset (:func:`build_pairs` passes them in record order), tried only where
            their prompt has the gold's token length and the oracle grades them Incorrect for
            this question (source ``other_gold``: a fluent answer of the right type that is
            wrong here, the counterfactual of answer-swap designs).

    Raises:
        PairError: no gold answer (``no_gold``), a prompt longer than ``max_tokens``
            (``too_long``), no answer the oracle grades Incorrect (``no_incorrect_answer``).
    """
    golds = [a for a in rec.get("answers", []) if a.strip()]
    rid = str(rec.get("id"))
    if not golds:
        raise PairError(f"record {rid}: no gold answer (unanswerable?)", "no_gold")
    kw = {"context": rec["context"], "question": rec["question"], "reference": golds[0]}
    clean = render(tokenizer, template, "eval", answer=golds[0], **kw)
    _check_length(clean, rid, max_tokens)
    gold_norm = {_norm(g) for g in golds}
    tried: list[str] = []

    def candidates() -> Any:
        own = rec.get("answer") or ""
        if rec.get("oracle_label") is False and own.strip():
            yield own, "own"
        for a in _stored_negatives(rec):
            yield a, "hard_negative"
        for a in (mine(rec) if mine else ()):
            yield a, "mined"
        if equal_length:
            for a in others:
                if a.strip() and _norm(a) not in gold_norm and len(render(
                        tokenizer, template, "eval", answer=a, **kw)) == len(clean):
                    yield a, "other_gold"

    first: PatchPair | None = None
    for answer, src in candidates():
        if not answer.strip() or _norm(answer) in gold_norm or (
                src != "own" and not _incorrect(oracle, answer, rec, golds)):
            tried.append(f"{src} {answer!r} rejected")
            continue
        corrupt = render(tokenizer, template, "eval", answer=answer, **kw)
        _check_length(corrupt, rid, max_tokens)
        try:
            pos_map, _, middle = align_positions(clean.input_ids, corrupt.input_ids)
        except PairError:
            tried.append(f"{src} {answer!r} renders the gold's prompt")
            continue
        pair = PatchPair("candidate-swap", rid, rec.get("dataset", ""), clean, corrupt,
                         pos_map, 0, passage_groups([rec])[0], middle, golds[0], answer, src)
        pair.start = min(pair.patchable())
        if not equal_length or len(corrupt) == len(clean):
            return pair
        first = first or pair
        tried.append(f"{src} {answer!r} is not of the gold's length")
    if first is not None:
        return first
    raise PairError(f"record {rid}: no answer the oracle grades Incorrect (own answer "
                    f"{'correct' if rec.get('oracle_label') else 'unusable'}; tried: "
                    f"{'; '.join(tried) or 'no stored or mined hard negative'})",
                    "no_incorrect_answer")


def _gen_and_eval(tokenizer: Any, template: Template, rec: Mapping[str, Any],
                  max_tokens: int | None) -> tuple[RenderedPrompt, RenderedPrompt]:
    rid = str(rec.get("id"))
    ref = (rec.get("answers") or [""])[0]
    gen = render(tokenizer, template, "gen", context=rec["context"], question=rec["question"],
                 reference=ref)
    ev = render(tokenizer, template, "eval", context=rec["context"], question=rec["question"],
                answer=rec.get("answer", ""), reference=ref)
    _check_length(ev, rid, max_tokens)
    return gen, ev


def gen_eval_pair(tokenizer: Any, template: Template, rec: Mapping[str, Any],
                  direction: str = "gen-to-eval", *, max_tokens: int | None = None
                  ) -> PatchPair:
    """Build the last-position pair of a record (module docstring, kinds 2 and 3).

    Args:
        tokenizer: the run's tokenizer.
        template: the run's template.
        rec: an ``ok`` record (the eval prompt's candidate is its own ``answer``).
        direction: ``gen-to-eval`` (generator -> judge) or ``eval-to-gen``.
        max_tokens: skip longer eval prompts (``too_long``).

    Raises:
        StageError: an unknown direction.
        PairError: a prompt longer than ``max_tokens``.
    """
    if direction not in ("gen-to-eval", "eval-to-gen"):
        raise StageError("patching",
                         f"direction must be gen-to-eval or eval-to-gen, not {direction!r}")
    gen, ev = _gen_and_eval(tokenizer, template, rec, max_tokens)
    clean, corrupt = (gen, ev) if direction == "gen-to-eval" else (ev, gen)
    pos_map = [-1] * (len(corrupt) - 1) + [len(clean) - 1]
    return PatchPair(direction, str(rec.get("id")), rec.get("dataset", ""), clean, corrupt,
                     pos_map, len(corrupt) - 1, passage_groups([rec])[0],
                     corrupt_answer=rec.get("answer", ""), corrupt_source="own")


def control_pair(tokenizer: Any, template: Template, rec: Mapping[str, Any], *,
                 max_tokens: int | None = None) -> PatchPair:
    """Build the system-prompt control of a record (module docstring, kind 4).

    Raises:
        PairError: a prompt without a context span (``no_context``), context tokens that
            differ (``context_differs``, with the first differing offset), no position whose
            activation can differ (``control_identity``: equal system prompts), a prompt
            longer than ``max_tokens`` (``too_long``).
    """
    rid = str(rec.get("id"))
    gen, ev = _gen_and_eval(tokenizer, template, rec, max_tokens)
    if "context" not in gen.token_spans or "context" not in ev.token_spans:
        raise PairError(f"record {rid}: a prompt has no context span", "no_context")
    (a, b), (c, d) = gen.token_spans["context"], ev.token_spans["context"]
    g_ids, e_ids = gen.input_ids[a:b], ev.input_ids[c:d]
    if g_ids != e_ids:
        k = next((i for i, (x, y) in enumerate(zip(g_ids, e_ids)) if x != y),
                 min(len(g_ids), len(e_ids)))
        raise PairError(f"record {rid}: context tokens differ at context offset {k} (gen "
                        f"{len(g_ids)} tokens, eval {len(e_ids)})", "context_differs")
    pos_map = [-1] * len(ev)
    for i in range(d - c):
        pos_map[c + i] = a + i
    ok = patchable_positions(gen.input_ids, ev.input_ids, pos_map)
    if not ok:
        raise PairError(f"record {rid}: the context lies in the prompts' shared prefix (equal "
                        f"system prompts): its activations are identical by construction",
                        "control_identity")
    return PatchPair("system-prompt-control", rid, rec.get("dataset", ""), gen, ev, pos_map,
                     ok[0], passage_groups([rec])[0], corrupt_answer=rec.get("answer", ""),
                     corrupt_source="own")


def build_pairs(records: Sequence[Mapping[str, Any]], kind: str, template: Template,
                tokenizer: Any, *, oracle: Any = None, mine: Miner | None = None,
                limit: int | None = None, max_tokens: int | None = None,
                equal_length: bool = False,
                accept: Callable[[PatchPair], Mapping[str, Any] | None] | None = None,
                log: Callable[[str], None] = print) -> tuple[list[PatchPair], list[dict]]:
    """Pairs of ``kind`` from ``ok`` records, at most ``limit`` accepted pairs per dataset.

    Args:
        records: the run's ``ok`` records, in their order.
        kind: one of :data:`PAIR_KINDS`.
        template: the run's template.
        tokenizer: the run's tokenizer.
        oracle: the run's oracle (candidate-swap; default
            :class:`interp.judging.grading.RuleOracle`).
        mine: closed-book hard negatives per record (candidate-swap; None: none mined).
        limit: accepted pairs per dataset (skipped records do not count; None: all).
        max_tokens: skip pairs with a longer prompt (CPU time).
        equal_length: candidate-swap: prefer wrong answers of the gold's token length, the
            other records' gold answers of the same dataset last (:func:`candidate_swap_pair`).
        accept: called on each built pair; None keeps it, a mapping ``{"reason", "message",
            ...}`` skips it with those fields (the patching stage's ``limit_kept``: a pair
            whose ``|gap|`` is under ``min_gap``). None: every built pair is kept.
        log: a line per skipped record.

    Returns:
        ``(pairs, skipped)`` where ``skipped`` lists ``{"id", "dataset", "reason", "message"}``.

    Raises:
        StageError: an unknown pair kind (lists the valid ones).
    """
    if kind not in PAIR_KINDS:
        raise StageError("patching", f"unknown pair kind {kind!r}; valid: {list(PAIR_KINDS)}")
    if oracle is None:
        oracle = RuleOracle()
    build: dict[str, Callable[[Mapping[str, Any]], PatchPair]] = {
        "candidate-swap": lambda r: candidate_swap_pair(
            tokenizer, template, r, oracle, mine=mine, max_tokens=max_tokens,
            equal_length=equal_length, others=[
                (o.get("answers") or [""])[0] for o in by_ds.get(r["dataset"], ())
                if o is not r] if equal_length else ()),
        "gen-to-eval": lambda r: gen_eval_pair(tokenizer, template, r, "gen-to-eval",
                                               max_tokens=max_tokens),
        "eval-to-gen": lambda r: gen_eval_pair(tokenizer, template, r, "eval-to-gen",
                                               max_tokens=max_tokens),
        "system-prompt-control": lambda r: control_pair(tokenizer, template, r,
                                                        max_tokens=max_tokens)}
    by_ds: dict[str, list] = {}
    for r in records:
        by_ds.setdefault(r["dataset"], []).append(r)
    pairs, skipped = [], []
    for ds, rs in by_ds.items():
        n_ok = 0
        for r in rs:
            if limit is not None and n_ok >= limit:
                break
            try:
                p = build[kind](r)
            except PairError as err:
                skipped.append({"id": r["id"], "dataset": ds, "reason": err.reason,
                                "message": str(err)})
                log(f"[{kind}] {ds} {r['id']} skipped ({err.reason}): {err}")
                continue
            if accept is not None and (why := accept(p)) is not None:
                skipped.append({"id": r["id"], "dataset": ds, **why})
                log(f"[{kind}] {ds} {r['id']} skipped ({why['reason']}): {why['message']}")
                continue
            pairs.append(p)
            n_ok += 1
    return pairs, skipped


def case_pair(c: Case, kind: str, *, wrong: str | None = None) -> PatchPair:
    """The clean/corrupt pair of a :class:`interp.judging.cases.Case`, as the CLI builds it.

    The Python entry to the pair kinds of ``interp patch --pairs`` (module docstring): the same
    prompts, position maps and units as :func:`build_pairs` gives for a record.

    Args:
        c: the case (``case(tokenizer, record_or_example)``).
        kind: ``candidate-swap`` (clean: the gold answer judged; corrupt: ``wrong`` judged),
            ``gen-to-eval`` (generator -> judge, last position) or ``eval-to-gen`` (judge ->
            generator; the generator prompt is scored with the verdict replies on purpose:
            its forced choice between the two words).
        wrong: the wrong answer of a candidate swap (a hard negative, the model's own wrong
            answer, a counterfactual of the gold's token length so that the candidate span is
            patched as a unit).

    Raises:
        StageError: an unknown kind, or a candidate swap without ``wrong``.
        PairError: no gold answer, a wrong answer that is the gold, or a judge prompt missing
            (a case without the model's own answer for the last-position kinds).
    """
    rid, ds = c.id, c.dataset
    if kind == "candidate-swap":
        if not c.answers:
            raise PairError(f"record {rid}: no gold answer (unanswerable?)", "no_gold")
        if not wrong or not wrong.strip():
            raise StageError("patching", "a candidate swap needs the wrong answer: case_pair(c, "
                                         "'candidate-swap', wrong='...')")
        if _norm(wrong) in {_norm(g) for g in c.answers}:
            raise PairError(f"record {rid}: {wrong!r} is a gold answer", "no_incorrect_answer")
        clean, corrupt = c.judging(c.gold), c.judging(wrong)
        pos_map, _, middle = align_positions(clean.input_ids, corrupt.input_ids)
        pair = PatchPair(kind, rid, ds, clean, corrupt, pos_map, 0, "", middle, c.gold, wrong,
                         "given")
        pair.start = min(pair.patchable())
        return pair
    if kind not in ("gen-to-eval", "eval-to-gen"):
        raise StageError("patching", f"unknown pair kind {kind!r}; from a case: candidate-swap, "
                                     f"gen-to-eval, eval-to-gen")
    if c.judge is None:
        raise PairError(f"record {rid}: the case has no judge prompt (no own answer): build it "
                        f"from a record of a finished run", "no_incorrect_answer")
    clean, corrupt = (c.gen, c.judge) if kind == "gen-to-eval" else (c.judge, c.gen)
    pos_map = [-1] * (len(corrupt) - 1) + [len(clean) - 1]
    return PatchPair(kind, rid, ds, clean, corrupt, pos_map, len(corrupt) - 1, "",
                     corrupt_answer=c.answer or "", corrupt_source="own")
