"""Clean/corrupt prompt pairs for activation patching, built from a run's records.

Two kinds (paper section 3.2), rendered with the run's template (:func:`interp.prompts.render`):

1. ``candidate-swap`` (:func:`candidate_swap_pair`): the SAME eval prompt with a right candidate
   (clean: a gold answer) and a wrong one (corrupt). Wrong candidates, in order: the model's
   own wrong answer (``own``); a hard negative from the record (``hard_negative``);
   ``own_trimmed``: the model's own wrong answer cut to its first k tokens, k within one of
   the gold's token count, decoded; answer rotation (``rotation``) = a gold answer of another
   record of the same dataset, as the paper's section 3.3 fallback. A candidate equal to a
   gold answer (normalised) is never used. Alignment rule (:func:`check_candidate_alignment`):
   the candidate spans must have the SAME number of tokens at the SAME positions, and every
   token outside the candidate span must be identical; the builder searches wrong candidates
   (in the order above) x gold aliases for the first combination that satisfies it. Pairs
   that do not are refused with the first differing position (:class:`PairError`). No padding
   is done, so a position means the same token slot in both runs.
2. ``task-swap`` (:func:`task_swap_pair`): clean = the generation prompt, corrupt = the eval
   prompt (the judge) with the record's own answer. The context token ids must be identical
   (checked, else refused with the first differing context offset); context position ``i`` of
   the eval prompt takes the generator's activation at context position ``i`` of the gen
   prompt (``pos_map``); every other position maps to -1 (never patched). Because the generator
   emits no verdict, task-swap sweeps report raw changes (patched - judge).

:func:`build_pairs` applies one builder to every record, up to ``limit`` built pairs per
dataset (refused records do not count), and returns the refusals with their reasons.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from interp.errors import PairError, PatchingError
from interp.prompts import RenderedPrompt, Template, render

__all__ = [
    "PAIR_KINDS",
    "PatchPair",
    "build_pairs",
    "candidate_swap_pair",
    "check_candidate_alignment",
    "task_swap_pair",
]

PAIR_KINDS = ("candidate-swap", "task-swap")


@dataclass
class PatchPair:
    """A clean/corrupt pair built from one record.

    Attributes:
        kind: ``candidate-swap`` or ``task-swap``.
        record_id, dataset: the record.
        clean, corrupt: rendered prompts (task-swap: clean = gen prompt, corrupt = eval prompt).
        pos_map: corrupt position -> clean position (-1 where nothing corresponds),
            ``[len(corrupt)]``.
        start: first corrupt position that can differ or be patched.
        clean_answer, corrupt_answer, corrupt_source: the candidates (candidate-swap) and where
            the wrong one came from (``own``, ``hard_negative``, ``own_trimmed``, ``rotation``).
    """

    kind: str
    record_id: str
    dataset: str
    clean: RenderedPrompt
    corrupt: RenderedPrompt
    pos_map: list[int]
    start: int
    clean_answer: str = ""
    corrupt_answer: str = ""
    corrupt_source: str = ""

    @property
    def key(self) -> str:
        """File-safe identity ``dataset__id``."""
        return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self.dataset}__{self.record_id}")


def _norm(s: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", s.lower()).split())


def check_candidate_alignment(clean: RenderedPrompt, corrupt: RenderedPrompt,
                              record_id: str = "?") -> int:
    """Check the candidate-swap alignment rule; return the first differing position.

    Raises:
        PairError: lengths or candidate spans differ, or a token outside the candidate span
            differs (the message shows that position and both tokens).
    """
    cs, xs = clean.token_spans.get("candidate"), corrupt.token_spans.get("candidate")
    if len(clean) != len(corrupt) or cs != xs:
        raise PairError(f"record {record_id}: candidate spans {cs} (clean) and {xs} (corrupt), "
                        f"prompt lengths {len(clean)} and {len(corrupt)}: the candidates must "
                        f"have equal token length at the same positions")
    first = None
    for i, (a, b) in enumerate(zip(clean.input_ids, corrupt.input_ids)):
        if a != b:
            if not cs[0] <= i < cs[1]:
                raise PairError(f"record {record_id}: tokens differ outside the candidate span "
                                f"{cs} at position {i} ({a} vs {b}, labels "
                                f"{clean.labels[i]!r}/{corrupt.labels[i]!r})")
            first = i if first is None else first
    if first is None:
        raise PairError(f"record {record_id}: clean and corrupt prompts are identical")
    return first


def _wrong_candidates(tokenizer: Any, rec: Mapping[str, Any], golds: Sequence[str],
                      pool: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(wrong answer, source) in the order of the module docstring, without gold answers."""
    rid = str(rec.get("id"))
    own = rec["answer"] if rec.get("oracle_label") is False and rec.get("answer") else None
    wrongs: list[tuple[str, str]] = [(own, "own")] if own else []
    for hn in ([rec["hard_negative"]] if rec.get("hard_negative") else []) + list(
            rec.get("hard_negatives") or []):
        wrongs.append((hn, "hard_negative"))
    if own:
        # own answer cut to about the gold's token length (its first k tokens, decoded)
        own_ids = tokenizer(own, add_special_tokens=False)["input_ids"]
        for g in golds:
            k = len(tokenizer(" " + g, add_special_tokens=False)["input_ids"])
            for kk in (k, k - 1, k + 1):
                if 0 < kk < len(own_ids):
                    wrongs.append((tokenizer.decode(own_ids[:kk]).strip(), "own_trimmed"))
    ids = [str(r.get("id")) for r in pool]
    k = ids.index(rid) if rid in ids else -1
    for r in list(pool[k + 1:]) + list(pool[: max(k, 0)]):
        for a in r.get("answers", []):
            wrongs.append((a, "rotation"))
    gold_norm = {_norm(g) for g in golds}
    return [(w, s) for w, s in dict.fromkeys(wrongs) if w.strip() and _norm(w) not in gold_norm]


def candidate_swap_pair(tokenizer: Any, template: Template, rec: Mapping[str, Any],
                        pool: Sequence[Mapping[str, Any]] = ()) -> PatchPair:
    """Build the candidate-swap pair of a record (module docstring, kind 1).

    Args:
        tokenizer: the run's tokenizer.
        template: the run's template.
        rec: an ``ok`` record (needs ``answers``; ``answer`` and ``oracle_label`` for ``own``;
            optional ``hard_negative`` / ``hard_negatives``).
        pool: records of the same dataset whose gold answers serve for answer rotation.

    Raises:
        PairError: no gold answer, or no (gold, wrong) combination satisfies the alignment
            rule (the message shows the first differing position of the first combination).
    """
    golds = [a for a in rec.get("answers", []) if a.strip()]
    rid = str(rec.get("id"))
    if not golds:
        raise PairError(f"record {rid}: no gold answer (unanswerable?)")
    wrongs = _wrong_candidates(tokenizer, rec, golds, pool)
    if not wrongs:
        raise PairError(f"record {rid}: no wrong candidate (own answer correct, no hard "
                        f"negative, no other record to rotate from)")
    kw = {"context": rec["context"], "question": rec["question"], "reference": golds[0]}
    cache: dict[str, RenderedPrompt] = {}

    def rend(a: str) -> RenderedPrompt:
        if a not in cache:
            cache[a] = render(tokenizer, template, "eval", answer=a, **kw)
        return cache[a]

    first_err = None
    for w, src in wrongs:
        for g in golds:
            clean, corrupt = rend(g), rend(w)
            try:
                start = check_candidate_alignment(clean, corrupt, rid)
            except PairError as err:
                first_err = first_err or err
                continue
            return PatchPair("candidate-swap", rid, rec.get("dataset", ""), clean, corrupt,
                             list(range(len(corrupt))), start, g, w, src)
    raise PairError(f"no aligned candidate pair ({len(wrongs)} wrong x {len(golds)} gold "
                    f"candidates tried); first refusal: {first_err}")


def task_swap_pair(tokenizer: Any, template: Template, rec: Mapping[str, Any]) -> PatchPair:
    """Build the task-swap pair of a record: generator (clean) -> judge (corrupt).

    Raises:
        PairError: a prompt lacks a context span, the context spans differ in length, or a
            context token differs (the message shows the first differing context offset).
    """
    rid = str(rec.get("id"))
    ref = (rec.get("answers") or [""])[0]
    gen = render(tokenizer, template, "gen", context=rec["context"], question=rec["question"],
                 reference=ref)
    ev = render(tokenizer, template, "eval", context=rec["context"], question=rec["question"],
                answer=rec.get("answer", ""), reference=ref)
    if "context" not in gen.token_spans or "context" not in ev.token_spans:
        raise PairError(f"record {rid}: a prompt has no context span")
    (a, b), (c, d) = gen.token_spans["context"], ev.token_spans["context"]
    g_ids, e_ids = gen.input_ids[a:b], ev.input_ids[c:d]
    for i, (x, y) in enumerate(zip(g_ids, e_ids)):
        if x != y:
            raise PairError(f"record {rid}: context tokens differ at context offset {i} (gen "
                            f"position {a + i}: {x}, eval position {c + i}: {y})")
    if len(g_ids) != len(e_ids):
        raise PairError(f"record {rid}: context spans have {len(g_ids)} (gen) and {len(e_ids)} "
                        f"(eval) tokens; first differing context offset "
                        f"{min(len(g_ids), len(e_ids))}")
    pos_map = [-1] * len(ev)
    for i in range(d - c):
        pos_map[c + i] = a + i
    return PatchPair("task-swap", rid, rec.get("dataset", ""), gen, ev, pos_map, c,
                     corrupt_answer=rec.get("answer", ""), corrupt_source="own")


def build_pairs(records: Sequence[Mapping[str, Any]], kind: str, template: Template,
                tokenizer: Any, *, limit: int | None = None, max_tokens: int | None = None,
                log: Callable[[str], None] = print) -> tuple[list[PatchPair], list[dict]]:
    """Pairs of ``kind`` from ``ok`` records, at most ``limit`` built pairs per dataset.

    Args:
        records: the run's ``ok`` records, in their order (rotation draws from the same
            dataset's records).
        kind: ``candidate-swap`` or ``task-swap``.
        template: the run's template.
        tokenizer: the run's tokenizer.
        limit: built pairs per dataset (refused records do not count; None: all).
        max_tokens: refuse pairs with a longer prompt (CPU time).
        log: a line per refusal.

    Returns:
        ``(pairs, refused)`` where ``refused`` lists ``{"id", "dataset", "reason"}``.

    Raises:
        PatchingError: an unknown pair kind (lists the valid ones).
    """
    if kind not in PAIR_KINDS:
        raise PatchingError(f"unknown pair kind {kind!r}; valid: {list(PAIR_KINDS)}")
    by_ds: dict[str, list] = {}
    for r in records:
        by_ds.setdefault(r["dataset"], []).append(r)
    pairs, refused = [], []
    for ds, rs in by_ds.items():
        n_ok = 0
        for r in rs:
            if limit is not None and n_ok >= limit:
                break
            try:
                p = (candidate_swap_pair(tokenizer, template, r, rs) if kind == "candidate-swap"
                     else task_swap_pair(tokenizer, template, r))
                if max_tokens and max(len(p.clean), len(p.corrupt)) > max_tokens:
                    raise PairError(f"record {r['id']}: {len(p.corrupt)} tokens > max_tokens "
                                    f"{max_tokens}")
            except PairError as err:
                refused.append({"id": r["id"], "dataset": ds, "reason": str(err)})
                log(f"[{ds}] refused {r['id']}: {err}")
                continue
            pairs.append(p)
            n_ok += 1
    return pairs, refused
