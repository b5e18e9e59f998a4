"""The pairwise judge with order swap: which of two answers is right, asked in both orders.

Setting (docs/pairwise.md): the judge sees the context, the question and two answers, one
right and one wrong, and replies "A" or "B" (:func:`interp.judging.prompts.render_pairwise`).
Every pair is judged in both orders: ``right_first`` (the right answer is A) and
``right_second`` (it is B). Position bias is the best-known failure of pairwise judges
(Zheng et al. 2023, "Judging LLM-as-a-judge with MT-Bench and Chatbot Arena", section 3.3:
swap the positions and count the consistent verdicts; Shi et al. 2024, "Judging the Judges",
arXiv 2406.07791; Tan et al. 2024, JudgeBench).

Pairs (:func:`build_judge_pairs`), from a run's ok records with a gold answer:

* ``hard_negative``: the first gold answer vs a closed-book hard negative that the run's
  oracle graded Incorrect (the patching stage's store, or one the record carries);
* ``model``: the first gold answer vs the model's own answer, when the run's oracle graded it
  Incorrect.

Score: the letter score ``s = log P("A") - log P("B")`` (nats) of the whole replies the chat
template gives the two letters (:func:`letter_replies`; scored as :mod:`interp.judging.verdict`
scores verdicts). With ``s1`` the score in order ``right_first`` and ``s2`` in ``right_second``:

* content term ``c = (s1 - s2) / 2`` (> 0: the judge prefers the right answer, wherever it is);
* position term ``p = (s1 + s2) / 2`` (> 0: it prefers the first slot, whatever is in it); so
  ``s1 = c + p`` and ``s2 = -c + p`` exactly.

The order-averaged judge (:func:`order_averaged`): each candidate's score is the judge's
preference for it averaged over both orders, ``+c`` for the right answer and ``-c`` for the
wrong one, so position bias cancels (a judge that always answers "A" scores 0 for both).
Its *pair accuracy* is the share of pairs whose right answer scores above its wrong one
(``c > 0``; a tie counts one half): the AUC over each pair's own two candidates. Its *AUC*
pools the candidates of all pairs (right ones positive), as a verdict judge's AUC does.

Choices (:func:`order_outcomes`): the judge picks A when ``s > 0`` (B otherwise), so order 1
is right when ``s1 > 0`` and order 2 when ``s2 <= 0``.
A pair is *consistent* when the same answer wins in both orders; *accuracy* counts a pair as
right only when both orders are right (an inconsistent pair is a miss); a *flip towards
first* picks A in both orders, *towards second* B in both. Position consistency is the share
of consistent pairs (MT-Bench's "consistency"); preference fairness is here the share of
flips towards second minus the share towards first (0: no lean; > 0 recency, < 0 primacy:
Shi et al.'s sign convention; their normalised score rescales these counts and is not
reproduced).

Inside (:func:`measure_pair`), at the verdict position:

1. Activation patching of the ``right_second`` run (clean) into the ``right_first`` run
   (corrupt), the last position only (positions before answer A are the same tokens in both
   orders; from it on, no position holds the same thing in both): the residual stream after
   each block (``hook_resid_post``) and each query head's output (``attn.hook_z``) in the
   band's layers. Effect ``(s_patched - s1) / (s2 - s1)``: the share of the swap's change
   that the unit carries (1: the patch alone turns the verdict around as the swap does).
   Patching the last block's residual is 1 by construction: a control, not a finding.
2. Direct logit attribution of the letters' first-token logit difference to each head and MLP
   in both orders (:func:`interp.methods.lens.direct_logit_attribution`); a unit's position
   term is the mean of its two attributions, its content term half their difference, so the
   units' position terms sum to the total position term (up to the folded norm).
3. Attention: the verdict position's mass on answer A and on answer B over the band, in both
   orders (:func:`interp.hooks.recorder.context_mass`), from step 2's forward.
4. The logit lens of ``s`` at every layer in both orders, hence the content and position
   terms per layer: for one-token letters read from step 2's forward (the residual stream
   summed from its components), else :func:`interp.methods.lens.reply_lens`.

Steps 2-4 read step 1's two scored forwards (the clean order's whole prompt, the corrupt
order's verdict token over the key/value cache of its prefix) rather than forwards of their
own: one full forward per order.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from interp.core.errors import StageError
from interp.judging.prompts import render_pairwise
from interp.models.points import hook_name

__all__ = ["MIN_SWAP_NATS", "ORDERS", "SOURCES", "JudgePair", "build_judge_pairs", "letter_replies",
           "measure_pair", "order_averaged", "order_outcomes", "render_orders", "score_orders",
           "split_passages"]

SOURCES = ("hard_negative", "model")
"""Where a pair's wrong answer comes from (module docstring)."""
ORDERS = ("right_first", "right_second")
"""The two orders every pair is judged in."""
LETTERS = ("A", "B")
MIN_SWAP_NATS = 1.0
"""The mean change of the letter score under the swap (``s2 - s1``, nats) below which
patching shares of it rest on a small denominator (the patching stage's ``min_gap`` of the
findings study): the heads figure says so, and the findings report does not read them."""


@dataclass(frozen=True)
class JudgePair:
    """One right and one wrong answer to a record's question.

    Attributes:
        dataset, record_id: the record; passage: its passage group (dataset + context hash).
        source: one of :data:`SOURCES`.
        right: the first gold answer; wrong: an answer the run's oracle graded Incorrect.
        context, question: the record's.
    """

    dataset: str
    record_id: str
    passage: str
    source: str
    right: str
    wrong: str
    context: str
    question: str

    @property
    def key(self) -> str:
        """``{record_id}__{source}``: the pair's name among its dataset's parts."""
        return f"{self.record_id}__{self.source}"


def _norm(s: str) -> str:
    return " ".join(s.lower().strip(" .").split())


def _same(a: str, b: str) -> bool:
    return _norm(a) == _norm(b)


def build_judge_pairs(records: Sequence[Mapping[str, Any]], passages: Sequence[str],
                      negatives: Mapping[tuple[str, str], str], *,
                      sources: Sequence[str] = SOURCES, limit: int | None = None
                      ) -> tuple[list[JudgePair], list[dict[str, Any]]]:
    """Pairs from a run's records (module docstring), at most ``limit`` per dataset.

    Args:
        records: ok records (``answers``, ``answer``, ``oracle_label``, ``context``, ...).
        passages: each record's passage group (:func:`interp.analysis.stats.passage_groups`).
        negatives: ``(dataset, id) -> hard negative`` graded Incorrect by the run's oracle.
        sources: which kinds of pair to build, in this order per record.
        limit: pairs per dataset (None: all).

    Returns:
        ``(pairs, skipped)``; ``skipped`` rows name the record, the source and a reason:
        ``no_gold``, ``no_wrong_answer`` or ``same_answers`` (the wrong answer reads as the
        right one).

    Raises:
        StageError: an unknown source.
    """
    if bad := [s for s in sources if s not in SOURCES]:
        raise StageError("pairwise", f"unknown pair source {bad[0]!r}; use {list(SOURCES)}")
    pairs: list[JudgePair] = []
    skipped: list[dict[str, Any]] = []
    count: dict[str, int] = {}
    for rec, passage in zip(records, passages):
        ds, rid = rec["dataset"], str(rec["id"])
        gold = next((a.strip() for a in rec.get("answers") or [] if a.strip()), None)
        for src in sources:
            if limit is not None and count.get(ds, 0) >= limit:
                break
            wrong = negatives.get((ds, rid)) if src == "hard_negative" else (
                (rec.get("answer") or "").strip() if rec.get("oracle_label") is False else None)
            why = ("no_gold" if gold is None else "no_wrong_answer" if not wrong else
                   "same_answers" if _same(gold, wrong) else None)
            if why:
                skipped.append({"dataset": ds, "id": rid, "source": src, "reason": why})
                continue
            pairs.append(JudgePair(ds, rid, passage, src, gold, wrong.strip(), rec["context"],
                                   rec["question"]))
            count[ds] = count.get(ds, 0) + 1
    return pairs, skipped


def letter_replies(tokenizer: Any) -> Any:
    """The whole replies "A" and "B" as the chat template gives them, as ``VerdictReplies``.

    The first reply (``correct``) is "A", the second (``incorrect``) "B", so every verdict
    scorer and the patching engine read ``log P(A) - log P(B)``.

    Raises:
        PromptError: a letter the chat template cannot separate.
    """
    from interp.judging.verdict import VerdictReplies, reply_tokens

    a, b = (tuple(reply_tokens(tokenizer, w)) for w in LETTERS)
    if a == b:
        raise StageError("pairwise", "the replies A and B tokenize alike; cannot score the choice")
    return VerdictReplies(a, b, {w: tokenizer.convert_ids_to_tokens(list(r))
                                 for w, r in zip(LETTERS, (a, b))})


def render_orders(tokenizer: Any, template: Any, pair: JudgePair) -> tuple[Any, Any]:
    """The pair's prompts in both orders: ``(right_first, right_second)``."""
    kw = {"context": pair.context, "question": pair.question}
    return (render_pairwise(tokenizer, template, answer_a=pair.right, answer_b=pair.wrong, **kw),
            render_pairwise(tokenizer, template, answer_a=pair.wrong, answer_b=pair.right, **kw))


def order_outcomes(s1: Any, s2: Any) -> dict[str, np.ndarray]:
    """Per pair: right in each order, consistent, accurate, flips, content and position terms.

    Args:
        s1: letter scores ``log P(A) - log P(B)`` (nats) in order ``right_first``,
            ``[n_pairs]``.
        s2: the same in order ``right_second``, ``[n_pairs]``.

    Returns:
        Arrays ``[n_pairs]``: ``right_first``, ``right_second``, ``consistent``, ``accurate``,
        ``flip_first``, ``flip_second`` (booleans as floats) and ``content``, ``position``
        (nats).
    """
    s1, s2 = np.asarray(s1, dtype=float), np.asarray(s2, dtype=float)
    a1, a2 = s1 > 0, s2 > 0          # the judge picks A (a score of exactly 0 picks B)
    r1, r2 = a1, ~a2
    return {"right_first": r1.astype(float), "right_second": r2.astype(float),
            "consistent": (r1 == r2).astype(float), "accurate": (r1 & r2).astype(float),
            "flip_first": (a1 & a2).astype(float),
            "flip_second": (~a1 & ~a2).astype(float),
            "content": (s1 - s2) / 2, "position": (s1 + s2) / 2}


def order_averaged(s1: Any, s2: Any, passages: Sequence[Any], rng: np.random.Generator,
                   n_boot: int) -> dict[str, Any]:
    """The order-averaged judge: how well the two orders' mean preference ranks right over wrong.

    Each candidate's score is the judge's preference for it averaged over both orders (module
    docstring): the right answer's is the content term ``c = (s1 - s2) / 2`` (its preference
    as A in order 1, ``s1``, and as B in order 2, ``-s2``), the wrong answer's ``-c``.
    Position bias cancels: a judge whose score does not depend on what is in each slot
    (``s1 == s2``) scores every candidate 0, and both measures below are exactly 0.5.
    Scores averaged over both orders as Wang et al. 2023's "Balanced Position Calibration"
    ("Large Language Models are not Fair Evaluators", arXiv 2305.17926).

    Args:
        s1: letter scores ``log P("A") - log P("B")`` (nats) with the right answer as A,
            ``[n_pairs]``.
        s2: the same with the right answer as B, ``[n_pairs]``.
        passages: ``[n_pairs]`` passage group of each pair (the bootstrap's clusters).
        rng: the generator (advanced by two cluster resamplings).
        n_boot: resamples of the passages (``<= 0``: no intervals).

    Returns:
        ``{"pair_accuracy": {"mean", "ci", "n", "n_passages"}`` (share of pairs with
        ``c > 0``, ties one half), ``"auc": {"auc", "ci", "n", "n_pos", "n_neg",
        "n_clusters"}`` (ROC AUC of the ``2 n_pairs`` candidates' scores, right answers
        positive), ``"no_content_share"`` (share of pairs with ``c == 0``: nothing read from
        the answers), ``"excludes_chance"`` (``"above"`` / ``"below"`` when the AUC's 95%
        interval lies on one side of 0.5, else False; None without an interval),
        ``"n", "n_passages"}``; 95% passage-cluster percentile bootstrap intervals
        (:func:`interp.analysis.stats.mean_stat`,
        :func:`interp.analysis.stats.cluster_bootstrap_auc`).

    Raises:
        StageError: ``s1``, ``s2`` and ``passages`` of different lengths, or no pair.
    """
    from interp.analysis.stats import cluster_bootstrap_auc, mean_stat

    s1, s2 = np.asarray(s1, dtype=float), np.asarray(s2, dtype=float)
    g = [str(p) for p in passages]
    if not (len(s1) == len(s2) == len(g)) or not len(g):
        raise StageError("pairwise",
                         f"order_averaged needs one s1, s2 and passage per pair (got "
                         f"{len(s1)}, {len(s2)}, {len(g)}), and at least one pair")
    c = (s1 - s2) / 2
    y = np.r_[np.ones(len(c), bool), np.zeros(len(c), bool)]
    auc = cluster_bootstrap_auc(y, np.r_[c, -c], g + g, rng, n_boot)
    ci = auc["ci"]
    return {"pair_accuracy": mean_stat((c > 0) + 0.5 * (c == 0), g, rng, n_boot),
            "auc": auc, "no_content_share": float(np.mean(c == 0)),
            "excludes_chance": (None if ci is None else "above" if ci[0] > 0.5 else
                                "below" if ci[1] < 0.5 else False),
            "n": len(c), "n_passages": len(set(g))}


def split_passages(passages: Sequence[str], salt: str = "pairwise") -> list[str]:
    """``select`` or ``test`` per item, by a stable hash of its passage: disjoint passages.

    About half the passages fall on each side, whatever order or subset of records is given.
    """
    return ["select" if int(hashlib.sha1(f"{salt}:{p}".encode()).hexdigest()[:8], 16) % 2 == 0
            else "test" for p in passages]


def score_orders(handle: Any, pair: JudgePair, template: Any, replies: Any) -> dict[str, Any]:
    """Behaviour only: both orders' letter scores, one full forward per order.

    Each order's prompt runs once (batch 1, so no padding), and the letters' whole replies are
    teacher-forced through that forward's KV cache (:func:`interp.judging.verdict.
    score_verdicts`); nothing inside the model is read. The content and position terms and the
    outcomes follow from ``s1`` and ``s2`` (:func:`order_outcomes`). The same ``s1`` and
    ``s2`` as :func:`measure_pair`'s, for a study of position consistency over thousands of
    pairs.

    Returns:
        JSON-safe ``{"s1", "s2", "n_tokens": [n1, n2]}`` (nats).

    Raises:
        PromptError: a pair that cannot be rendered.
    """
    from interp.judging.verdict import score_verdicts

    p1, p2 = render_orders(handle.tokenizer, template, pair)
    sc = score_verdicts(handle, [p1.input_ids, p2.input_ids], batch_size=1, replies=replies)
    s1, s2 = (sc.logprob_correct - sc.logprob_incorrect).tolist()
    return {"s1": float(s1), "s2": float(s2), "n_tokens": [len(p1), len(p2)]}


def measure_pair(handle: Any, pair: JudgePair, template: Any, replies: Any,
                 band: Sequence[int], *, batch_size: int = 16) -> dict[str, Any]:
    """Steps 1-4 of the module docstring for one pair, in one full forward per order.

    The order ``right_second`` (the patching's clean run) runs its whole prompt once; the order
    ``right_first`` (the corrupt run) runs its prompt up to the verdict position once, the key/
    value cache every patched row starts from, and the verdict position's token over it
    (:class:`interp.methods.patching.Patcher`, module step 4). Steps 2-4 read those two
    forwards (:func:`interp.methods.lens.attribution_reader` through
    :meth:`Patcher.ensure_clean`'s ``extra_hooks``) instead of forwards of their own. The
    letters' later tokens and the patched rows are one-token steps over the key/value
    caches. Letters of more than one token (no bundled tokenizer's) read the lens from
    :func:`interp.methods.lens.reply_lens`'s own forwards, one per order and letter. The
    outputs equal those of each step's own forwards (:func:`_measure_pair_unfused`) up to
    float rounding (``tests/unit/methods/test_pairwise.py``).

    Args:
        handle: a :class:`interp.models.loading.ModelHandle`.
        pair: the pair.
        template: a :class:`interp.judging.prompts.PairwiseTemplate`.
        replies: :func:`letter_replies`.
        band: layers of the attention masses and of the head patching.
        batch_size: patched rows per forward.

    Returns:
        JSON-safe ``{"s1", "s2", "n_tokens": [n1, n2], "patch": {"resid": [n_layers],
        "head_layers": band, "heads": [len(band)][n_heads]} (patched letter scores, nats),
        "dla": {order: {"heads",
        "mlp", "total", "sum"}}, "mass": {order: {"answer_a", "answer_b", "context"}},
        "lens": {order: [n_layers + 1]}}``.

    Raises:
        PromptError: a pair that cannot be rendered.
    """
    from interp.methods.lens import attribution_reader

    pt, rows, (p1, p2) = _patching_rows(handle, pair, template, replies, band, batch_size)
    read: dict[str, Any] = {}

    def reader(order: str) -> Any:
        @contextlib.contextmanager
        def enter() -> Iterator[None]:
            with attribution_reader(handle, rows=True) as result:
                read[order] = result
                yield
        return enter

    pt.ensure_clean(sorted({p.hook for p in rows}),
                    extra_hooks={"clean": reader("right_second"),
                                 "corrupt": reader("right_first")})
    one = all(len(r) == 1 for r in replies.ids)
    logits = {"right_first": pt.corrupt_logits, "right_second": pt.clean_logits}
    dla = {o: read[o](logits[o], replies.correct[0], replies.incorrect[0], stack=one)
           for o in ORDERS}
    return _pair_result(handle, pt, pt.run(rows), dla, (p1, p2), replies, band)


def _patching_rows(handle: Any, pair: JudgePair, template: Any, replies: Any,
                   band: Sequence[int], batch_size: int) -> tuple[Any, list[Any], tuple[Any, Any]]:
    """Step 1's patcher (clean ``right_second``, corrupt ``right_first``), its rows, the prompts."""
    from interp.methods.patching import Patch, Patcher

    p1, p2 = render_orders(handle.tokenizer, template, pair)
    n1, n2 = len(p1), len(p2)
    pos_map = [-1] * (n1 - 1) + [n2 - 1]
    pt = Patcher(handle, p2.input_ids, p1.input_ids, pos_map=pos_map, replies=replies,
                 batch_size=batch_size)
    last = (n1 - 1,)
    rows = [Patch(hook_name(i, "hook_resid_post"), positions=last)
            for i in range(handle.n_layers)] + \
        [Patch(hook_name(i, "attn.hook_z"), positions=last, heads=(j,))
         for i in band for j in range(handle.n_heads)]
    return pt, rows, (p1, p2)


def _pair_result(handle: Any, pt: Any, res: Any, dla: Mapping[str, Mapping[str, Any]],
                 prompts: tuple[Any, Any], replies: Any, band: Sequence[int]) -> dict[str, Any]:
    """:func:`measure_pair`'s dict from the patching, each order's attribution (with its rows)."""
    from interp.hooks.recorder import context_mass
    from interp.methods.lens import lens_logits, readout, reply_lens

    n, h = handle.n_layers, handle.n_heads
    out: dict[str, Any] = {
        "s1": pt.corrupt_ld, "s2": pt.clean_ld, "n_tokens": [len(p) for p in prompts],
        "patch": {"resid": res.patched[:n].tolist(), "head_layers": list(band),
                  "heads": res.patched[n:].reshape(len(band), h).tolist()},
        "dla": {}, "mass": {}, "lens": {}}
    one = all(len(r) == 1 for r in replies.ids)
    for order, p in zip(ORDERS, prompts):
        d = dla[order]
        out["dla"][order] = {"heads": d["heads"].tolist(), "mlp": d["mlp"].tolist(),
                             "total": d["total"], "sum": d["sum"]}
        rec = d["rows"]   # the attention rows of the attribution's own forward
        out["mass"][order] = {k: float(context_mass(rec, band, tuple(p.token_spans[k])))
                              for k in ("answer_a", "answer_b", "context")}
        if one:   # one-token letters: the lens reads the attribution's own forward
            stack = d["stack"].to(handle.device, next(handle.model.parameters()).dtype)
            lg = lens_logits(readout(handle.model), stack[:, None], None)[:, 0]
            lp = lg.log_softmax(-1)[:, [replies.correct[0], replies.incorrect[0]]].T.double()
        else:
            lp = reply_lens(handle, p.input_ids, replies.ids)["logprobs"]
        out["lens"][order] = (lp[0] - lp[1]).tolist()
    return out


def _measure_pair_unfused(handle: Any, pair: JudgePair, template: Any, replies: Any,
                          band: Sequence[int], *, batch_size: int = 16) -> dict[str, Any]:
    """:func:`measure_pair` with each step's own forwards: four full forwards a pair.

    The patcher's clean run and its corrupt run (the prefix, then the verdict position), then
    one attribution forward of each order's whole prompt. The reference that the unit tests
    hold :func:`measure_pair` to and that ``benchmarks/pairwise.py`` times beside it; not
    for studies.
    """
    from interp.methods.lens import direct_logit_attribution

    pt, rows, (p1, p2) = _patching_rows(handle, pair, template, replies, band, batch_size)
    res = pt.run(rows)
    one = all(len(r) == 1 for r in replies.ids)
    dla = {o: direct_logit_attribution(handle, p.input_ids, replies.correct[0],
                                       replies.incorrect[0], stack=one, rows=True)
           for o, p in zip(ORDERS, (p1, p2))}
    return _pair_result(handle, pt, res, dla, (p1, p2), replies, band)
