"""The pairwise judge with order swap: pairs, prompts, outcomes, the stage (tiny models)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from interp.core.errors import PromptError, StageError
from interp.judging.prompts import PairwiseTemplate, get_pairwise_template, render_pairwise
from interp.judging.verdict import score_verdicts
from interp.methods.pairwise import (
    build_judge_pairs,
    letter_replies,
    measure_pair,
    order_averaged,
    order_outcomes,
    render_orders,
    score_orders,
    split_passages,
)
from interp.store.rundir import RunDir
from interp.testing import tiny_llama, tiny_tokenizer

REC = {"dataset": "squad_v2", "id": "r1", "context": "The Eiffel Tower is in Paris.",
       "question": "Where is the tower?", "answers": ["Paris"], "answer": "Lyon",
       "oracle_label": False}


@pytest.fixture(scope="module")
def handle():
    tok = tiny_tokenizer(vocab_size=280)
    return tiny_llama(tok, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, seed=5)


def test_spans_hold_exactly_each_answer_and_the_orders_trade_places(handle):
    pair = build_judge_pairs([REC], ["p1"], {}, sources=["model"])[0][0]
    p1, p2 = render_orders(handle.tokenizer, get_pairwise_template(), pair)
    for p, (a, b) in ((p1, ("Paris", "Lyon")), (p2, ("Lyon", "Paris"))):
        for span, text in (("answer_a", a), ("answer_b", b), ("question", REC["question"])):
            s, e = p.token_spans[span]
            assert handle.tokenizer.decode(p.input_ids[s:e]).strip() == text
    swap = {"Answer A: Paris": "Answer A: Lyon", "Answer B: Lyon": "Answer B: Paris"}
    text = p1.text
    for a, b in swap.items():
        text = text.replace(a, b)
    assert text == p2.text
    assert p1.input_ids[-3:] == p2.input_ids[-3:]


def test_pair_building_keeps_only_a_wrong_answer_that_differs_from_gold():
    recs = [REC, {**REC, "id": "r2", "oracle_label": True},
            {**REC, "id": "r3", "answer": " paris. "}, {**REC, "id": "r4", "answers": []}]
    pairs, skipped = build_judge_pairs(recs, ["a", "b", "c", "d"], {("squad_v2", "r2"): "Rome"})
    assert [(p.record_id, p.source, p.wrong) for p in pairs] == [("r1", "model", "Lyon"),
                                                               ("r2", "hard_negative", "Rome")]
    why = {(s["id"], s["source"]): s["reason"] for s in skipped}
    assert why[("r2", "model")] == "no_wrong_answer" and why[("r3", "model")] == "same_answers"
    assert why[("r4", "model")] == "no_gold"
    assert len(build_judge_pairs(recs * 3, list("abcdefghijkl"), {}, limit=2)[0]) == 2
    with pytest.raises(StageError, match="unknown pair source"):
        build_judge_pairs(recs, list("abcd"), {}, sources=["gold"])


def test_outcomes_follow_the_definitions_on_constructed_scores():
    # s1 > 0 right in order 1; s2 < 0 right in order 2
    o = order_outcomes([2.0, 1.0, -1.0, -2.0], [-2.0, 3.0, -1.0, 0.5])
    assert o["accurate"].tolist() == [1, 0, 0, 0]
    assert o["consistent"].tolist() == [1, 0, 0, 1]
    assert o["flip_first"].tolist() == [0, 1, 0, 0]
    assert o["flip_second"].tolist() == [0, 0, 1, 0]
    assert np.allclose(o["content"] + o["position"], [2.0, 1.0, -1.0, -2.0])
    assert np.allclose(o["position"] - o["content"], [-2.0, 3.0, -1.0, 0.5])


def test_order_averaged_judge_gives_a_one_letter_judge_exactly_chance():
    rng = np.random.default_rng(0)
    ps = [f"p{i}" for i in range(30)]
    # answers "A" whatever the slots hold: the same score in both orders, no content
    a = order_averaged([3.0] * 30, [3.0] * 30, ps, rng, 200)
    assert a["pair_accuracy"]["mean"] == 0.5 and a["auc"]["auc"] == 0.5
    assert a["pair_accuracy"]["ci"] == [0.5, 0.5] and a["auc"]["ci"] == [0.5, 0.5]
    assert a["no_content_share"] == 1.0 and a["excludes_chance"] is False
    # a judge that always picks the right answer, wherever it stands
    r = order_averaged([1.0 + i for i in range(30)], [-1.0] * 30, ps, rng, 200)
    assert r["pair_accuracy"]["mean"] == 1.0 and r["auc"]["auc"] == 1.0
    assert r["excludes_chance"] == "above" and r["n"] == 30 and r["n_passages"] == 30


def test_order_averaged_judge_on_constructed_scores_and_a_position_shift():
    # content c = (s1 - s2) / 2 = [2, -1, 0.5, 0]
    s1, s2 = [2.0, 1.0, 1.5, 3.0], [-2.0, 3.0, 0.5, 3.0]
    a = order_averaged(s1, s2, ["a", "a", "b", "c"], np.random.default_rng(0), 100)
    assert a["pair_accuracy"]["mean"] == pytest.approx((1 + 0 + 1 + 0.5) / 4)
    # right [2, -1, .5, 0] vs wrong [-2, 1, -.5, 0]: 4 + 1 + 3 + 2.5 of 16 pairs
    assert a["auc"]["auc"] == pytest.approx(10.5 / 16)
    assert a["no_content_share"] == 0.25 and a["n_passages"] == 3
    # a position term added to both orders changes nothing
    b = order_averaged(np.add(s1, 7.0), np.add(s2, 7.0), ["a", "a", "b", "c"],
                       np.random.default_rng(0), 100)
    assert b == a
    with pytest.raises(StageError, match="one s1, s2 and passage per pair"):
        order_averaged([1.0], [1.0, 2.0], ["a"], np.random.default_rng(0), 10)


def test_the_passage_split_is_stable_and_disjoint():
    ps = [f"p{i}" for i in range(200)] * 2
    side = split_passages(ps)
    by = {}
    for p, s in zip(ps, side):
        by.setdefault(p, set()).add(s)
    assert all(len(v) == 1 for v in by.values())
    assert 60 < side.count("select") / 2 < 140
    assert split_passages(ps[::-1]) == side[::-1]


def test_a_template_must_use_every_field_once():
    with pytest.raises(PromptError, match="exactly once"):
        PairwiseTemplate(name="x", user="{context} {question} {answer_a}")
    with pytest.raises(PromptError, match="unknown pairwise template 'pairwse'.*pairwise"):
        get_pairwise_template("pairwse")
    with pytest.raises(PromptError, match="two non-empty answers"):
        render_pairwise(None, get_pairwise_template(), context="c", question="q",
                        answer_a=" ", answer_b="b")


def test_measurements_agree_with_the_model_and_patching_the_last_block_is_the_swap(handle):
    pair = build_judge_pairs([REC], ["p1"], {}, sources=["model"])[0][0]
    tpl = get_pairwise_template()
    replies = letter_replies(handle.tokenizer)
    m = measure_pair(handle, pair, tpl, replies, [0, 1], batch_size=4)
    p1, p2 = render_orders(handle.tokenizer, tpl, pair)
    with torch.no_grad():
        own = score_verdicts(handle, [p1.input_ids, p2.input_ids], replies=replies)
    ld = (own.logprob_correct - own.logprob_incorrect).tolist()
    assert m["s1"] == pytest.approx(ld[0], abs=1e-4) and m["s2"] == pytest.approx(ld[1], abs=1e-4)
    assert m["patch"]["resid"][-1] == pytest.approx(m["s2"], abs=1e-4)   # the control
    assert len(m["patch"]["heads"]) == 2 and len(m["patch"]["heads"][0]) == 4
    assert m["patch"]["head_layers"] == [0, 1]
    for order in ("right_first", "right_second"):
        d = m["dla"][order]
        assert d["sum"] == pytest.approx(d["total"], abs=1e-6)
        assert m["lens"][order][-1] == pytest.approx(m["s1" if order == "right_first"
                                                       else "s2"], abs=1e-4)
        assert all(0 <= v <= 1 for v in m["mass"][order].values())


def _flat(d, key=""):
    """Every number of a measure_pair result, by its path."""
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _flat(v, f"{key}/{k}")
    elif isinstance(d, list) and d and isinstance(d[0], (list, dict)):
        for i, v in enumerate(d):
            yield from _flat(v, f"{key}[{i}]")
    else:
        yield key, np.asarray(d, dtype=float)


def test_the_fused_measurement_equals_each_steps_own_forwards_in_two_full_forwards(handle):
    from interp.judging.verdict import VerdictReplies
    from interp.methods.pairwise import _measure_pair_unfused

    recs = [REC, {**REC, "id": "r2", "answer": "Berlin, the capital of Germany"},
            {**REC, "id": "r3", "context": "Mount Fuji is the highest peak in Japan, near "
             "Tokyo.", "question": "What is the highest peak in Japan?",
             "answers": ["Mount Fuji"], "answer": "Kilimanjaro"}]
    pairs = build_judge_pairs(recs, ["p1", "p2", "p3"], {}, sources=["model"])[0]
    tpl = get_pairwise_template()
    one = letter_replies(handle.tokenizer)
    two = VerdictReplies(one.correct + one.incorrect, one.incorrect + one.correct,
                         {"A": ["A", "B"], "B": ["B", "A"]})   # letters of two tokens
    band, bs = [0, 1], 3
    n_rows = handle.n_layers + len(band) * handle.n_heads
    seen: list[int] = []

    def count(module, args, kwargs):
        seen.append(int(kwargs["input_ids"].shape[1]))

    hook = handle.model.model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        for pair in pairs:
            p1, p2 = render_orders(handle.tokenizer, tpl, pair)
            for replies in (one, two):
                seen.clear()
                got = measure_pair(handle, pair, tpl, replies, band, batch_size=bs)
                fused = list(seen)
                seen.clear()
                want = _measure_pair_unfused(handle, pair, tpl, replies, band, batch_size=bs)
                old = list(seen)
                a, b = dict(_flat(got)), dict(_flat(want))
                assert a.keys() == b.keys() and len(a) > 10
                for k in a:
                    assert a[k].shape == b[k].shape, k
                    assert np.abs(a[k] - b[k]).max() <= 1e-5, (k, a[k], b[k])
                assert got["s1"] == want["s1"] and got["s2"] == want["s2"]   # same forwards
                assert got["patch"] == want["patch"]
                full = sorted(n for n in fused if n > 1)
                if replies is one:
                    # the clean order's whole prompt, the corrupt order's up to the verdict
                    # position; then one-token steps over the key/value caches: the verdict
                    # token of the corrupt order and one per batch of patched rows
                    assert full == sorted([len(p1) - 1, len(p2)])
                    assert fused.count(1) == 1 + -(-n_rows // bs)
                    assert sorted(n for n in old if n > 1) == sorted(
                        [len(p1) - 1, len(p2), len(p1), len(p2)])
                else:
                    # the same two and the lens's own forward per order and letter; the
                    # one-token steps also score each letter's second token over the cache
                    # of every scored run (the two orders and each batch of patched rows)
                    lens = [len(p) + 1 for p in (p1, p2) for _ in range(2)]
                    assert full == sorted([len(p1) - 1, len(p2)] + lens)
                    batches = -(-n_rows // bs)
                    assert fused.count(1) == 1 + batches + 2 * (2 + batches)
    finally:
        hook.remove()
    from interp.core.errors import StageError
    from interp.methods.patching import Patcher

    with pytest.raises(StageError, match="only 'clean' and 'corrupt' runs exist"):
        Patcher(handle, p2.input_ids, p2.input_ids).ensure_clean([], extra_hooks={"donor": None})


def test_behaviour_only_scores_equal_the_full_measurement_in_one_forward_per_order(handle):
    pair = build_judge_pairs([REC], ["p1"], {}, sources=["model"])[0][0]
    tpl = get_pairwise_template()
    replies = letter_replies(handle.tokenizer)
    full = measure_pair(handle, pair, tpl, replies, [0, 1], batch_size=4)
    p1, p2 = render_orders(handle.tokenizer, tpl, pair)
    seen: list[int] = []

    def count(module, args, kwargs):
        x = kwargs.get("input_ids")
        x = x if x is not None else kwargs.get("inputs_embeds")
        seen.append(int(x.shape[1]))

    hook = handle.model.model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        got = score_orders(handle, pair, tpl, replies)
    finally:
        hook.remove()
    assert got["s1"] == pytest.approx(full["s1"], abs=1e-5)
    assert got["s2"] == pytest.approx(full["s2"], abs=1e-5)
    assert got["n_tokens"] == [len(p1), len(p2)]
    longest_reply = max(len(r) for r in replies.ids)
    # one forward of each order's whole prompt; the rest are reply tokens through its cache
    assert sorted(n for n in seen if n > longest_reply) == sorted([len(p1), len(p2)])


def test_the_stage_writes_outcomes_held_out_heads_and_figures_and_resumes(tmp_path, handle):
    from interp.stages import pairwise as stage
    from interp.testing import synthetic_probe_run

    run = synthetic_probe_run(tmp_path / "run", handle, n_good=6, n_bad=6)
    recs = run.read_records()
    (run.path / "patching").mkdir()
    (run.path / "patching" / "hard_negatives.jsonl").write_text("".join(
        json.dumps({"dataset": r["dataset"], "id": r["id"], "hard_negative": "Nowhere"}) + "\n"
        for r in recs))
    cfg = stage.PairwiseConfig(limit=None, band="all", top_k=2, batch_size=8, n_boot=50,
                               progress=False)
    logs: list[str] = []
    s = stage.run(run, handle, cfg, log=logs.append)
    assert s["n_pairs"] == 12 and s["skipped"] == {"no_wrong_answer": 6, "same_answers": 6}
    o = s["outcomes"]["all"]
    assert o["accurate"]["mean"] <= o["consistent"]["mean"]
    assert o["consistent"]["mean"] + o["flip_first"]["mean"] + o["flip_second"]["mean"] \
        == pytest.approx(1.0)
    assert all(v < 1e-4 for v in s["checks"].values()), s["checks"]
    assert s["patching"]["resid"][-1]["share"] == pytest.approx(1.0, abs=1e-4)
    h = s["held_out"]
    assert h["n_select"] + h["n_test"] == 12 and len(h.get("order_heads", [])) in (0, 2)
    for name in ("pairwise_orders", "pairwise_heads"):
        assert (run.path / "figures" / f"{name}.png").is_file()
    built = [json.loads(line) for line in (run.path / "pairwise" / "pairs.jsonl").open()]
    assert sum(b["built"] for b in built) == 12
    parts = sorted((run.path / "pairwise" / "parts").glob("*.json"))
    before = {p: p.stat().st_mtime_ns for p in parts}
    assert stage._parts(run, handle, cfg, overwrite=False, log=logs.append)[2] == 0
    assert {p: p.stat().st_mtime_ns for p in parts} == before
    assert "consistency" in stage.format_summary(s)
    # the order-averaged judge, over all and per source: the method on the stored scores
    stored = [json.loads(p.read_text())["pairwise"] for p in parts]
    avg = s["order_averaged"]
    assert set(avg) == set(s["outcomes"]) and avg["all"]["n"] == 12
    c = np.array([(p["s1"] - p["s2"]) / 2 for p in stored])
    assert avg["all"]["pair_accuracy"]["mean"] == pytest.approx(np.mean(c > 0))
    assert avg["all"]["auc"]["auc"] == pytest.approx(
        np.mean([(a > b) + 0.5 * (a == b) for a in c for b in -c]))
    assert "averaged over both orders: pair accuracy" in stage.format_summary(s)
    # behaviour only, in a copy without the parts: the same outcomes from the scores alone
    bcfg = stage.PairwiseConfig(limit=None, band="all", n_boot=50, progress=False,
                                behaviour_only=True)
    other = RunDir(shutil.copytree(run.path, tmp_path / "other"))
    shutil.rmtree(other.path / "pairwise")
    shutil.rmtree(other.path / "figures", ignore_errors=True)
    quick = stage.run(other, handle, bcfg, log=logs.append)
    assert quick["behaviour_only"] and "patching" not in quick and "held_out" not in quick
    for k in ("accurate", "consistent", "flip_first", "flip_second", "content", "position"):
        assert quick["outcomes"]["all"][k]["mean"] == pytest.approx(o[k]["mean"], abs=1e-5), k
    assert quick["order_averaged"]["all"]["auc"]["auc"] == pytest.approx(
        avg["all"]["auc"]["auc"], abs=1e-6)
    assert "consistency" in stage.format_summary(quick)
    assert not list((other.path / "figures").glob("pairwise_*.png"))
    assert stage._parts(other, handle, bcfg, overwrite=False, log=logs.append)[2] == 0
    # where the full measurement is fresh, behaviour only keeps it and it stays fresh
    assert stage._parts(run, handle, bcfg, overwrite=False, log=logs.append)[2] == 0
    assert stage._parts(run, handle, cfg, overwrite=False, log=logs.append)[2] == 0
    # a judge that answers one letter in both orders of (nearly) every pair is named so
    side = max(o["flip_first"]["mean"], o["flip_second"]["mean"])
    assert (s["one_letter"] is not None) == (side >= stage.ONE_LETTER_SHARE)
    one = {**s, "one_letter": {"letter": "A", "share": 0.96}}
    assert "a one-letter judge: A in both orders on 96% of pairs" in stage.format_summary(one)
    # a run that builds no pair is refused before it writes anything: the finished run's
    # list of pairs stays as it was
    (run.path / "patching" / "hard_negatives.jsonl").unlink()
    listed = (run.path / "pairwise" / "pairs.jsonl").read_bytes()
    with pytest.raises(StageError, match="none of its records has a hard negative: "
                                            "`interp patch --pairs candidate-swap` mines them"):
        stage.run(run, handle, stage.PairwiseConfig(sources=("hard_negative",), limit=None,
                                                    band="all", progress=False),
                  log=logs.append)
    assert (run.path / "pairwise" / "pairs.jsonl").read_bytes() == listed


def test_pairs_longer_than_the_models_positions_are_skipped_with_the_reason_and_counted(
        tmp_path, handle, monkeypatch):
    """``interp pairwise`` on a model of fewer positions than some pairs' prompts need."""
    from interp.stages import pairwise as stage
    from interp.testing import synthetic_probe_run

    run = synthetic_probe_run(tmp_path / "run", handle, n_good=6, n_bad=6)
    recs = run.read_records()
    (run.path / "patching").mkdir()
    (run.path / "patching" / "hard_negatives.jsonl").write_text("".join(
        json.dumps({"dataset": r["dataset"], "id": r["id"],
                    "hard_negative": "Nowhere" + " else" * (i % 4)}) + "\n"
        for i, r in enumerate(recs)))
    template = get_pairwise_template()
    pairs, _ = build_judge_pairs(recs, stage.passage_groups(recs), stage._negatives(run, recs),
                                 sources=stage.PairwiseConfig().sources, limit=None)
    need = max(map(len, letter_replies(handle.tokenizer).ids))
    longest = {p.key: max(map(len, render_orders(handle.tokenizer, template, p))) + need
               for p in pairs}
    room = sorted(longest.values())[len(longest) // 2]   # about half the pairs fit
    too_long = sum(n > room for n in longest.values())
    assert 0 < too_long < len(pairs)
    monkeypatch.setattr(handle.model.config, "max_position_embeddings", room)
    logs: list[str] = []
    cfg = stage.PairwiseConfig(limit=None, band="all", top_k=2, batch_size=8, n_boot=50,
                               progress=False)
    s = stage.run(run, handle, cfg, log=logs.append)
    assert s["n_pairs"] == len(pairs) - too_long and s["skipped"]["too_long"] == too_long
    said = [x for x in logs if "pairwise prompts skipped" in x]
    assert said and said[0].startswith(
        f"[pairwise] {too_long} of {len(pairs)} pairwise prompts skipped: longer than the "
        f"model's {room} positions (first: pairwise prompt has ")
    listed = [json.loads(x) for x in (run.path / "pairwise/pairs.jsonl").open()]
    cut = [x for x in listed if x.get("reason") == "too_long"]
    assert len(cut) == too_long and all(
        x["detail"].endswith(f"for the letter reply it exceeds the model's {room} positions")
        for x in cut)
    # a model on which no pair fits is refused in one line, the finished list kept
    before = (run.path / "pairwise/pairs.jsonl").read_bytes()
    monkeypatch.setattr(handle.model.config, "max_position_embeddings", 8)
    with pytest.raises(StageError, match="no pair's prompt fits the model's 8 positions"):
        stage.run(run, handle, cfg, log=logs.append)
    assert (run.path / "pairwise/pairs.jsonl").read_bytes() == before


def test_the_config_refuses_bad_values_before_model_work():
    from interp.stages.configs.pairwise import PairwiseConfig

    with pytest.raises(StageError, match="did you mean 'model'"):
        PairwiseConfig(sources=["modle"]).validate()
    with pytest.raises(StageError, match="sources is empty"):
        PairwiseConfig.from_mapping({"sources": []})
    with pytest.raises(PromptError, match="unknown pairwise template"):
        PairwiseConfig(template="x").validate()
