"""The self-check prompt, the cache patching and blocking equalities, and the probe signal.

Tiny random models: patching a prompt's own state changes nothing, blocking no key changes
nothing, and a real patch or block does change the verdict (so the equalities can fail).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp.core.errors import PromptError
from interp.hooks.capture import hooked
from interp.hooks.steering import Steer, steering
from interp.judging.prompts import (
    SELF_CHECK_USER,
    Template,
    get_template,
    render,
    render_self_check,
)
from interp.judging.verdict import score_verdicts, verdict_replies
from interp.methods.calibration import (
    BLOCK_ALPHA,
    block_verdict_attention,
    control_positions,
    cosine,
    oof_probe,
    patch_verdict_position,
    probe_direction,
    random_cosine_band,
    self_check,
    states_after_answer,
    verdict_direction,
)

CONTEXT = "The Eiffel Tower is in Paris. It was finished in 1889."
QUESTION = "Where is the Eiffel Tower?"


@pytest.fixture(scope="module")
def prompts(tiny):
    tpl = get_template()
    kw = {"context": CONTEXT, "question": QUESTION}
    return {"gen": render(tiny.tokenizer, tpl, "gen", **kw),
            "eval": render(tiny.tokenizer, tpl, "eval", answer="Paris", **kw),
            "self": render_self_check(tiny.tokenizer, tpl, answer="Paris", **kw)}


def test_self_check_is_the_generator_conversation_with_its_answer_and_a_question(tiny, prompts):
    gen, sc = prompts["gen"], prompts["self"]
    # the generator's prompt is a prefix: its answer follows as the assistant turn it produced
    assert sc.input_ids[:len(gen)] == gen.input_ids
    a, b = sc.token_spans["candidate"]
    assert a == len(gen)
    assert tiny.tokenizer.decode(sc.input_ids[a:b]).strip() == "Paris"
    assert tiny.tokenizer.convert_ids_to_tokens(sc.input_ids[b]) == "<|im_end|>"
    for span in ("context", "question"):
        s, e = sc.token_spans[span]
        assert sc.token_spans[span] == gen.token_spans[span]
        assert tiny.tokenizer.decode(sc.input_ids[s:e]).strip() in (CONTEXT, QUESTION)
    assert SELF_CHECK_USER in sc.text and sc.text.endswith("<|im_start|>assistant\n")
    assert control_positions(sc) == [b + 1]
    with pytest.raises(PromptError, match="non-empty answer"):
        render_self_check(tiny.tokenizer, get_template(), context=CONTEXT, question=QUESTION,
                          answer="  ")
    with pytest.raises(PromptError, match="self_user takes no fields"):
        Template(name="x", gen_user="{question}", eval_user="{question} {answer}",
                 self_user="Is {answer} right?")


def _states_at(tiny, ids, pos):
    hooks = [f"blocks.{L}.hook_resid_pre" for L in range(tiny.n_layers)]
    with torch.no_grad(), hooked(tiny.model, cache=hooks) as acts:
        tiny.model(input_ids=torch.tensor([ids]))
    return torch.stack([acts[h][0, pos] for h in hooks])


def test_patching_the_prompts_own_state_changes_nothing(tiny, prompts):
    ev = prompts["eval"].input_ids
    replies = verdict_replies(tiny.tokenizer)
    ref = float(score_verdicts(tiny, [ev]).logit_diff[0])
    own = patch_verdict_position(tiny, ev, _states_at(tiny, ev, len(ev) - 1), replies)
    assert own["base"]["logit_diff"] == pytest.approx(ref, abs=1e-5)
    assert np.allclose(own["logit_diff"], ref, atol=1e-5)
    # the generator conversation's state after the answer is another state: it moves the verdict
    sc = prompts["self"]
    after = _states_at(tiny, sc.input_ids, sc.token_spans["candidate"][1])
    assert torch.allclose(states_after_answer(tiny, sc), after, atol=1e-6)
    other = patch_verdict_position(tiny, ev, after, replies,
                                   control=_states_at(tiny, ev, len(ev) - 1))
    assert other["layers"] == [0, 1]
    assert max(abs(x - ref) for x in other["logit_diff"]) > 1e-3
    # the control patched with the prompt's own state: nothing changes, by the same path
    assert np.allclose(other["control_logit_diff"], ref, atol=1e-5)
    one = patch_verdict_position(tiny, ev, after, replies, layers=[1])
    assert one["logit_diff"] == pytest.approx(other["logit_diff"][1:], abs=1e-6)
    with pytest.raises(ValueError, match="states must be"):
        patch_verdict_position(tiny, ev, torch.zeros(3, 64), replies)


def test_blocking_no_key_changes_nothing_and_a_blocked_key_gets_no_attention(tiny, prompts):
    sc = prompts["self"]
    ids = sc.input_ids
    replies = verdict_replies(tiny.tokenizer)
    ref = score_verdicts(tiny, [ids])
    none = block_verdict_attention(tiny, ids, [], replies)
    assert none["logit_diff"] == pytest.approx(float(ref.logit_diff[0]), abs=1e-5)
    after = sc.token_spans["candidate"][1]
    blocked = block_verdict_attention(tiny, ids, [after], replies)
    assert abs(blocked["logit_diff"] - none["logit_diff"]) > 1e-4
    st = Steer(units={0: None, 1: None}, keys=(0, 1), alphas=[BLOCK_ALPHA], positions=[after])
    with torch.no_grad(), steering(tiny, st):
        tiny.model(input_ids=torch.tensor([ids]), use_cache=False)
    for row in st.rows.values():                       # [batch, head, key]
        assert float(row[0, :, after].abs().max()) == 0.0
        assert torch.allclose(row[0].sum(-1), torch.ones(row.shape[1]), atol=1e-5)
    with pytest.raises(ValueError, match="must lie in"):
        block_verdict_attention(tiny, ids, [len(ids) - 1], replies)


def test_self_check_scores_and_answer_probability_by_hand(tiny, prompts):
    sc = prompts["self"]
    replies = verdict_replies(tiny.tokenizer)
    r = self_check(tiny, sc, replies, max_new_tokens=3)
    ref = score_verdicts(tiny, [sc.input_ids])
    assert r["logit_diff"] == pytest.approx(float(ref.logit_diff[0]), abs=1e-5)
    assert r["verdict_coverage"] == pytest.approx(float(ref.coverage[0]), abs=1e-5)
    a, b = sc.token_spans["candidate"]
    with torch.no_grad():
        logits = tiny.model(input_ids=torch.tensor([sc.input_ids[:b]])).logits[0]
    lp = torch.log_softmax(logits.double(), -1)
    want = [float(lp[i - 1, sc.input_ids[i]]) for i in range(a, b)]
    assert r["answer_tokens"] == b - a
    assert r["answer_logprob_mean"] == pytest.approx(np.mean(want), abs=1e-4)
    assert r["states"].shape == (tiny.n_layers, 64)
    assert torch.allclose(r["states"], _states_at(tiny, sc.input_ids, b), atol=1e-6)
    assert r["block"]["none"]["logit_diff"] == pytest.approx(r["logit_diff"], abs=1e-5)
    assert r["block"]["control_positions"] == [b + 1]
    assert isinstance(r["verdict_text"], str)


def test_oof_probe_chooses_the_informative_layer_on_training_folds():
    rng = np.random.default_rng(0)
    n, d = 120, 8
    y = rng.uniform(size=n) < 0.4
    feats = rng.normal(size=(n, 3, d))
    feats[:, 2, 0] += 2.5 * y                              # layer 2 carries the label
    groups = [f"p{i // 2}" for i in range(n)]
    out = oof_probe(feats, y, groups, [0, 1, 2], folds=4, inner_folds=3, seed=0)
    assert out["chosen"] == [2, 2, 2, 2]
    p = out["p"]
    assert np.isfinite(p).all() and (p > 0).all() and (p < 1).all()
    from interp.analysis.stats import roc_auc
    assert roc_auc(y, p) > 0.85
    # unweighted: the mean probability is near the base rate, not 0.5
    assert abs(p.mean() - y.mean()) < 0.08


def test_probe_direction_and_cosines():
    rng = np.random.default_rng(1)
    v = np.zeros(16)
    v[3] = 1.0
    y = rng.uniform(size=300) < 0.5
    X = rng.normal(size=(300, 16)) + 3.0 * np.outer(y, v)
    w = probe_direction(X, y)
    assert np.linalg.norm(w) == pytest.approx(1.0) and cosine(w, v) > 0.9
    assert cosine(v, -v) == pytest.approx(-1.0)
    assert random_cosine_band(576) == pytest.approx(1.959964 / 24, rel=1e-5)


def test_verdict_direction_is_the_first_tokens_unembedding_difference(tiny):
    replies = verdict_replies(tiny.tokenizer)
    d = verdict_direction(tiny, replies)
    W = tiny.model.get_output_embeddings().weight.detach().double()
    assert np.allclose(d["unembed"], (W[replies.correct[0]] - W[replies.incorrect[0]]).numpy())
    gamma = tiny.model.model.norm.weight.detach().double().numpy()
    assert np.allclose(d["read"], d["unembed"] * gamma)
    assert d["tokens"] == tiny.tokenizer.convert_ids_to_tokens([replies.correct[0],
                                                                replies.incorrect[0]])


def test_the_stage_writes_cards_tables_and_figures_and_resumes(tmp_path):
    from interp.core.errors import StageError
    from interp.stages import calibration as stage
    from interp.testing import synthetic_probe_run, tiny_llama, tiny_tokenizer

    tok = tiny_tokenizer(vocab_size=280)
    handle = tiny_llama(tok, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, seed=3)
    run = synthetic_probe_run(tmp_path / "run", handle, n_good=6, n_bad=6)
    cfg = stage.CalibrationConfig(folds=2, inner_folds=2, n_bins=4, n_boot=50,
                                  max_new_tokens=2, probe_layers=[0, 1], progress=False)
    logs: list[str] = []
    s = stage.run(run, handle, cfg, log=logs.append)
    g = s["all"]
    assert s["n_records"] == 12 and set(g["cards"]) == set(stage.SIGNALS)
    card = g["cards"]["judge"]
    recs = run.read_records(status="ok")
    from interp.analysis.calibration import brier
    assert card["brier"] == pytest.approx(brier([r["oracle_label"] for r in recs],
                                                 [r["p_correct"] for r in recs]))
    assert card["ece"]["mass"]["n_bins"] == 4 and len(card["reliability"]["width"]) <= 4
    # blocking no key re-scores the self-check by another path to the same number (the
    # synthetic run's stored judge scores are noise, so the patch check is no identity here)
    assert s["checks"]["max_abs_block_none_minus_self_logit_diff"] < 1e-4
    assert len(g["patch"]["delta_auc"]) == handle.n_layers
    assert len(s["probe"]["eval"]["angles"]) == handle.n_layers
    assert {"judge", "self_check"} <= set(g["self_vs_judge"])
    assert set(s["datasets"]) == {"hotpotqa", "squad_v2"}
    for name in [*stage.SIGNALS, "cache"]:
        prefix = "calibration_cache" if name == "cache" else f"calibration_reliability_{name}"
        assert (run.path / "figures" / f"{prefix}.png").is_file()
    rows = (run.path / "calibration" / "records.jsonl").read_text().splitlines()
    assert len(rows) == 12
    text = stage.format_summary(s)
    assert "p_true" in text and "ECE" in text
    parts = sorted((run.path / "calibration" / "parts").glob("*.json"))
    before = {p: p.stat().st_mtime_ns for p in parts}
    s2 = stage.run(run, handle, cfg, log=logs.append)
    assert {p: p.stat().st_mtime_ns for p in parts} == before
    assert s2["all"]["cards"] == g["cards"]
    with pytest.raises(StageError, match="n_bins"):
        stage.CalibrationConfig.from_mapping({"n_bins": 1})
