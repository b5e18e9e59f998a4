"""Tests of interp.transfer (Study 3): refusals, hard negatives, training sets, loss masks,
LoRA training / resumption, base-model isolation, adapter mismatch, cross-model patching."""

from __future__ import annotations

import json

import pytest
import torch

from interp.data import QAExample
from interp.grading import RuleOracle, normalize_answer
from interp.prompts import get_template
from interp.transfer import (
    TransferConfig,
    TransferError,
    build_training_sets,
    cross_model_patching,
    encode_example,
    end_of_turn_id,
    is_refusal,
    load_adapter,
    mine_hard_negatives,
    model_fingerprint,
    patched_logit_diffs,
    resid_post,
    rotation_answer,
    train_adapter,
    training_pool,
)


def _ex(i: int, ans: str, ctx: str = "Some context.") -> QAExample:
    return QAExample(id=f"r{i}", dataset="squad_v2", context=ctx, question=f"Question {i}?",
                     answers=(ans,), answerable=True, split="train")


def _tiny_cfg(**kw) -> TransferConfig:
    base = dict(rank=4, alpha=8, dropout=0.0, lr=1e-2, epochs=2, train_batch_size=2,
                warmup_steps=1, checkpoint_every=1, max_length=256, seed=3)
    base.update(kw)
    return TransferConfig(**base)


# --- config and refusals ---------------------------------------------------------------------


def test_unknown_config_key_is_a_clear_error():
    with pytest.raises(TransferError, match=r"\[transfer\]: unknown config keys.*'rnak'.*known"):
        TransferConfig.from_mapping({"rnak": 4})
    with pytest.raises(TransferError, match="patch_positions"):
        TransferConfig(patch_positions="middle")


@pytest.mark.parametrize("text", [
    "I need more information to answer this.", "This cannot be determined.",
    "Without more context I can't say", "As an AI, I don't have that information",
    "I'm not sure", "Unknown", "Please provide the context.", "There is no way to know.",
    "No, that's impossible. The answer is not known", "A short phrase, not a sentence",
])
def test_refusals_are_filtered(text):
    assert is_refusal(text)


@pytest.mark.parametrize("text", ["Paris", "1945", "Napoleon Bonaparte", "the Normans",
                                  "Determined Productions", "no. 5"])
def test_answers_are_not_refusals(text):
    assert not is_refusal(text)


def test_missing_train_split_is_a_clear_error(tokenizer):
    cfg = TransferConfig(datasets=["drop"])
    with pytest.raises(TransferError, match="train split of 'drop'.*squad_v2"):
        training_pool(cfg, tokenizer, get_template("default"), log=lambda s: None)


# --- hard negatives ----------------------------------------------------------------------------


def test_rotation_never_returns_this_records_gold():
    pool = [_ex(0, "Paris"), _ex(1, "paris"), _ex(2, "The Paris"), _ex(3, "London"),
            _ex(4, "Berlin")]
    oracle = RuleOracle()
    for seed in range(5):
        ans, donor = rotation_answer(0, pool, oracle, seed=seed)
        assert ans in ("London", "Berlin") and donor in ("r3", "r4")
        assert normalize_answer(ans) != normalize_answer(pool[0].answers[0])
    # every other gold equals this gold: nothing usable
    same = [_ex(0, "Paris"), _ex(1, "Paris.")]
    assert rotation_answer(0, same, oracle, seed=0) == (None, None)


def test_mine_hard_negatives_logs_attempts_and_falls_back(tiny):
    pool = [_ex(i, a) for i, a in enumerate(["Paris", "London", "Berlin", "Rome"])]
    cfg = _tiny_cfg(hard_negative_attempts=2, hard_negative_max_new_tokens=4, batch_size=4)
    rows = mine_hard_negatives(tiny, pool, RuleOracle(), cfg, log=lambda s: None)
    assert [r["id"] for r in rows] == [ex.id for ex in pool]
    oracle = RuleOracle()
    for r, ex in zip(rows, pool):
        assert 1 <= len(r["attempts"]) <= 2
        kept = [a for a in r["attempts"] if a["decision"] == "kept"]
        assert len(kept) <= 1 and (not kept or r["attempts"][-1] is kept[0])
        assert r["fallback"] == (not kept) == (r["source"] == "rotation")
        assert not oracle.grade(r["hard_negative"], ex.answers, dataset="squad_v2").label
        assert not is_refusal(r["hard_negative"])
        if r["fallback"]:
            assert len(r["attempts"]) == 2 and r["hard_negative"] in {"Paris", "London",
                                                                     "Berlin", "Rome"}
    # seeded: the same call gives the same attempts
    again = mine_hard_negatives(tiny, pool, RuleOracle(), cfg, log=lambda s: None)
    assert again == rows


# --- training sets and loss masks ----------------------------------------------------------------


def test_training_sets_are_balanced_and_mixed():
    pool = [_ex(i, f"answer {i}") for i in range(10)]
    negs = [{"hard_negative": f"wrong {i}", "source": "closed_book"} for i in range(10)]
    sets = build_training_sets(pool, negs, seed=0)
    assert {k: len(v) for k, v in sets.items()} == {"lora_gen": 10, "lora_eval": 10,
                                                     "lora_both": 10}
    ev = sets["lora_eval"]
    assert sum(it["label"] for it in ev) == 5
    for it, ex in zip(ev, pool):
        assert it["target"] == ("Correct" if it["label"] else "Incorrect")
        assert it["answer"] == (ex.answers[0] if it["label"] else f"wrong {ex.id[1:]}")
    assert all(it["target"] == ex.answers[0] for it, ex in zip(sets["lora_gen"], pool))
    both = sets["lora_both"]
    assert sum(it["task"] == "gen" for it in both) == 5
    assert sum(it["task"] == "eval" and it["label"] for it in both) in (2, 3)


def test_loss_mask_covers_only_the_answer(tokenizer):
    tpl = get_template("default")
    eot = end_of_turn_id(tokenizer)
    assert tokenizer.convert_ids_to_tokens(eot) == "<|im_end|>"
    item = {"task": "gen", "context": "The sky is blue.", "question": "What colour is the sky?",
            "target": "blue"}
    enc = encode_example(tokenizer, tpl, item)
    supervised = [t for t, lab in zip(enc["input_ids"], enc["labels"]) if lab != -100]
    assert supervised == tokenizer("blue", add_special_tokens=False)["input_ids"] + [eot]
    n_prompt = enc["labels"].index(next(x for x in enc["labels"] if x != -100))
    assert all(x == -100 for x in enc["labels"][:n_prompt])
    assert enc["labels"][n_prompt:] == enc["input_ids"][n_prompt:]
    # the full sequence equals the chat template's own rendering of the exchange
    sys_msg = [{"role": "system", "content": tpl.gen_system}]
    from interp.prompts import render

    user = render(tokenizer, tpl, "gen", context=item["context"], question=item["question"])
    full = tokenizer.apply_chat_template(
        sys_msg + [{"role": "user", "content": tpl.gen_user.format(
            context=item["context"], question=item["question"])},
            {"role": "assistant", "content": "blue"}], tokenize=False)
    assert tokenizer.decode(enc["input_ids"]).startswith(user.text)
    assert full.startswith(tokenizer.decode(enc["input_ids"]))
    ev = encode_example(tokenizer, tpl, {**item, "task": "eval", "answer": "red",
                                         "target": "Incorrect"})
    sup = [t for t, lab in zip(ev["input_ids"], ev["labels"]) if lab != -100]
    assert tokenizer.decode(sup[:-1]) == "Incorrect" and sup[-1] == eot


# --- training, resumption, isolation of the base model -----------------------------------------


def _encoded(tokenizer, n=6):
    tpl = get_template("default")
    pool = [_ex(i, ["blue", "red", "green"][i % 3], ctx=f"Item {i} is coloured.")
            for i in range(n)]
    negs = [{"hard_negative": "purple", "source": "rotation"} for _ in pool]
    sets = build_training_sets(pool, negs, seed=0)
    return [encode_example(tokenizer, tpl, it) for it in sets["lora_both"]]


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].clone()


def test_training_resumes_and_base_model_is_untouched(tiny, tokenizer, tmp_path):
    enc = _encoded(tokenizer)
    cfg = _tiny_cfg()
    probe = enc[0]["input_ids"]
    before = _logits(tiny.model, probe)
    state_before = {k: v.clone() for k, v in tiny.model.state_dict().items()}

    full = train_adapter(tiny, enc, cfg, tmp_path / "a" / "adapters" / "x", name="x",
                         log=lambda s: None)
    assert full["n_steps"] == 6 and len(full["losses"]) == 6
    assert full["losses"][-1] < full["losses"][0]
    # interrupted after 2 steps, then resumed from the checkpoint
    part = train_adapter(tiny, enc, cfg, tmp_path / "b" / "adapters" / "x", name="x",
                         stop_after_steps=2, log=lambda s: None)
    assert part == {"name": "x", "stopped_at_step": 2}
    assert (tmp_path / "b" / "checkpoints" / "x" / "state.json").exists()
    assert not (tmp_path / "b" / "adapters" / "x" / "interp_adapter.json").exists()
    msgs: list[str] = []
    resumed = train_adapter(tiny, enc, cfg, tmp_path / "b" / "adapters" / "x", name="x",
                            log=msgs.append)
    assert any("resumed from step 2" in m for m in msgs)
    assert resumed["losses"] == pytest.approx(full["losses"], rel=1e-5, abs=1e-6)
    from safetensors.torch import load_file

    wa = load_file(str(tmp_path / "a" / "adapters" / "x" / "adapter_model.safetensors"))
    wb = load_file(str(tmp_path / "b" / "adapters" / "x" / "adapter_model.safetensors"))
    assert wa.keys() == wb.keys() and len(wa) > 0
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)

    # loading the adapter: its model differs, the base model does not change at all
    adapted = load_adapter(tiny, tmp_path / "a" / "adapters" / "x")
    assert adapted.spec == "tiny-llama+x"
    after_adapter = _logits(adapted.model, probe)
    assert not torch.allclose(after_adapter, before)
    assert torch.equal(_logits(tiny.model, probe), before)
    for k, v in tiny.model.state_dict().items():
        assert torch.equal(v, state_before[k]), k
    assert not any("lora" in n for n, _ in tiny.model.named_modules())
    # a finished adapter is not retrained
    again = train_adapter(tiny, enc, cfg, tmp_path / "a" / "adapters" / "x", name="x",
                          log=lambda s: None)
    assert again["losses"] == full["losses"]


def test_adapter_of_another_base_model_is_refused(tiny, tokenizer, tmp_path):
    from interp.testing import tiny_llama

    enc = _encoded(tokenizer, n=2)
    train_adapter(tiny, enc, _tiny_cfg(epochs=1), tmp_path / "adapters" / "x", name="x",
                  log=lambda s: None)
    other = tiny_llama(tokenizer, n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, seed=1)
    with pytest.raises(TransferError, match="another base model.*n_layers: adapter 2 vs "
                                            "model 3"):
        load_adapter(other, tmp_path / "adapters" / "x")
    with pytest.raises(TransferError, match="no trained adapter"):
        load_adapter(tiny, tmp_path)
    meta = json.loads((tmp_path / "adapters" / "x" / "interp_adapter.json").read_text())
    assert meta["base"] == model_fingerprint(tiny)


# --- patching across models --------------------------------------------------------------------


def test_cross_model_patching_ground_truths(tiny, tokenizer, tmp_path):
    enc = _encoded(tokenizer, n=4)
    train_adapter(tiny, enc, _tiny_cfg(epochs=1, lr=5e-2), tmp_path / "adapters" / "x",
                  name="x", log=lambda s: None)
    adapted = load_adapter(tiny, tmp_path / "adapters" / "x")
    p = enc[0]["input_ids"][:40]
    rb, lb = resid_post(tiny.model, p)
    ra, la = resid_post(adapted.model, p)
    assert rb.shape == (2, 40, 64)
    # hooks on the resid stream see what output_hidden_states reports
    with torch.inference_mode():
        hs = tiny.model(input_ids=torch.tensor([p]), output_hidden_states=True).hidden_states
    torch.testing.assert_close(rb[0], hs[1][0])
    from interp.prompts import verdict_token_ids

    ids = verdict_token_ids(tokenizer)
    # patching the base's own residual changes nothing; the adapter's at all positions of the
    # last layer reproduces the adapter's logits (LoRA leaves the final norm and unembedding)
    same = patched_logit_diffs(tiny.model, p, rb, [0, 1], ids)
    assert same == pytest.approx([float(lb[ids[0]] - lb[ids[1]])] * 2, abs=1e-4)
    last = patched_logit_diffs(tiny.model, p, ra, [1], ids)
    assert last[0] == pytest.approx(float(la[ids[0]] - la[ids[1]]), abs=1e-4)
    res = cross_model_patching(tiny, adapted, [p, enc[1]["input_ids"][:30]], positions="all")
    assert res["fraction_a_to_b"][-1] == pytest.approx(1.0, abs=1e-3)
    assert res["fraction_b_to_a"][-1] == pytest.approx(1.0, abs=1e-3)
    # batched rows equal one-layer-at-a-time runs
    one = [patched_logit_diffs(tiny.model, p, ra, [L], ids, positions="last")[0]
           for L in (0, 1)]
    both = patched_logit_diffs(tiny.model, p, ra, [0, 1], ids, positions="last")
    assert both == pytest.approx(one, abs=1e-4)
    with pytest.raises(TransferError, match="valid layers: 0..1"):
        cross_model_patching(tiny, adapted, [p], layers=[5])


# --- the whole study on the tiny model ------------------------------------------------------------


def test_run_transfer_on_tiny_model(tiny, tmp_path):
    from interp.transfer import run_transfer

    cfg = TransferConfig(max_train_examples=4, eval_limit=2, train_batch_size=4,
                         hard_negative_attempts=2, hard_negative_max_new_tokens=4,
                         max_new_tokens=4, verdict_max_new_tokens=2, patch_examples=1,
                         patch_layers=[1], n_boot=50, rank=2, max_length=400)
    probe = tiny.tokenizer("Hello there")["input_ids"]
    before = _logits(tiny.model, probe)
    s = run_transfer(cfg, tmp_path, handle=tiny, log=lambda x: None)
    assert torch.equal(_logits(tiny.model, probe), before)
    td = tmp_path / "transfer"
    table = json.loads((td / "table.json").read_text())
    assert set(table["self"]) == {"base", "lora_gen", "lora_eval", "lora_both"}
    assert set(table["judge_base_answers"]) == set(table["self"])
    for m in table["self"].values():
        g = m["squad_v2"]
        assert g["n"] == 2 and g["delta"] == pytest.approx(g["EA"] - g["GA"])
    base = [json.loads(x) for x in (td / "eval" / "base__squad_v2.jsonl").open()]
    judged = [json.loads(x) for x in
              (td / "eval" / "lora_gen__squad_v2__judge_base_answers.jsonl").open()]
    assert [r["answer"] for r in judged] == [r["answer"] for r in base]
    hn = [json.loads(x) for x in (td / "hard_negatives.jsonl").open()]
    assert len(hn) == 4 and s["pool"] == 4
    assert s["hard_negative_fallback_rate"] == sum(r["fallback"] for r in hn) / 4
    patching = json.loads((td / "patching.json").read_text())
    assert patching["adapters"]["lora_eval"]["layers"] == [1]
    for f in ("transfer_matrix.png", "transfer_acceptance.png", "transfer_patching.png"):
        assert (tmp_path / "figures" / f).exists()
    # a second call with a changed evaluation setting redoes the evaluation, not the training
    cfg.eval_limit = 1
    u = run_transfer(cfg, tmp_path, handle=tiny, log=lambda x: None)
    assert u["train_seconds"] == s["train_seconds"] and u["headline"]["base"]["squad_v2"]["n"] == 1
    # a changed training setting without overwrite is refused
    cfg.rank = 4
    with pytest.raises(TransferError, match="another transfer config.*rank: 2 -> 4"):
        run_transfer(cfg, tmp_path, handle=tiny, log=lambda x: None)


# --- integration ---------------------------------------------------------------------------------


@pytest.mark.integration
def test_run_transfer_end_to_end(bundled, tmp_path):
    from interp.transfer import run_transfer

    # one optimizer step per adapter: the bundled model trains at minutes per step on a busy
    # 2-core CPU
    cfg = TransferConfig(max_train_examples=2, eval_limit=2, train_batch_size=2,
                         patch_examples=1, patch_layers=[29], n_boot=50,
                         hard_negative_attempts=1, judge_base_answers=False,
                         max_new_tokens=16)
    before = _logits(bundled.model, bundled.tokenizer("Hello there")["input_ids"])
    s = run_transfer(cfg, tmp_path, handle=bundled, log=lambda x: None)
    assert torch.equal(_logits(bundled.model, bundled.tokenizer("Hello there")["input_ids"]),
                       before)
    table = json.loads((tmp_path / "transfer" / "table.json").read_text())
    assert set(table["self"]) == {"base", "lora_gen", "lora_eval", "lora_both"}
    for m in table["self"].values():
        g = m["squad_v2"]
        assert g["n"] == 2 and g["delta"] == pytest.approx(g["EA"] - g["GA"])
    hn = [json.loads(x) for x in (tmp_path / "transfer" / "hard_negatives.jsonl").open()]
    assert len(hn) == 2
    assert s["hard_negative_fallback_rate"] == sum(r["fallback"] for r in hn) / 2
    # the base evaluation equals Study 1's harness on the same records
    from interp.asymmetry import evaluate_examples
    from interp.data import load_examples

    recs = evaluate_examples(bundled, load_examples("squad_v2", limit=2),
                             template=get_template("default"), oracle=RuleOracle(),
                             max_new_tokens=cfg.max_new_tokens,
                             verdict_max_new_tokens=cfg.verdict_max_new_tokens)
    base = [json.loads(x) for x in (tmp_path / "transfer" / "eval" / "base__squad_v2.jsonl")
            .open()]
    assert [r["answer"] for r in recs] == [r["answer"] for r in base]
    assert [r["logit_diff"] for r in recs] == pytest.approx([r["logit_diff"] for r in base])
    for f in ("transfer_matrix.png", "transfer_acceptance.png", "transfer_patching.png"):
        assert (tmp_path / "figures" / f).exists()
    # a second call redoes nothing
    t = run_transfer(cfg, tmp_path, handle=bundled, log=lambda x: None)
    assert t["train_seconds"] == s["train_seconds"]
