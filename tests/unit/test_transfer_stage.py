"""The transfer stage end to end on a tiny random model: files, table, resume, invalidation."""

from __future__ import annotations

import json

import pytest
import torch

from interp.errors import LayerSpecError, TransferError
from interp.stages.transfer import TransferConfig, run


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].clone()


def test_transfer_stage_on_tiny_model(tiny, tmp_path):
    cfg = TransferConfig(max_train_examples=4, eval_limit=2, train_batch_size=4,
                         hard_negative_attempts=2, hard_negative_max_new_tokens=4,
                         max_new_tokens=4, verdict_max_new_tokens=2, patch_examples=1,
                         patch_layers=[1], n_boot=50, rank=2, max_length=400)
    probe = tiny.tokenizer("Hello there")["input_ids"]
    before = _logits(tiny.model, probe)
    s = run(tmp_path, tiny, cfg, log=lambda x: None)
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
    assert len(patching["adapters"]["lora_eval"]["patched_a_to_b"]) == patching["n_prompts"]
    sets = {n: [json.loads(x) for x in (td / "train_sets" / f"{n}.jsonl").open()]
            for n in ("lora_gen", "lora_eval", "lora_both")}
    assert {n: len(v) for n, v in sets.items()} == {n: 4 for n in sets}
    meta = json.loads((td / "adapters" / "lora_eval" / "interp_adapter.json").read_text())
    assert meta["config"]["rank"] == 2 and meta["config"]["datasets"] == ["squad_v2"]
    for f in ("transfer_matrix.png", "transfer_acceptance.png", "transfer_patching.png"):
        assert (tmp_path / "figures" / f).exists()
    # a second call with a changed evaluation setting redoes the evaluation, not the training
    cfg.eval_limit = 1
    u = run(tmp_path, tiny, cfg, log=lambda x: None)
    assert u["train_seconds"] == s["train_seconds"] and u["headline"]["base"]["squad_v2"]["n"] == 1
    # a changed training setting without overwrite is refused
    cfg.rank = 4
    with pytest.raises(TransferError, match="another transfer config.*rank: 2 -> 4"):
        run(tmp_path, tiny, cfg, log=lambda x: None)


def test_bad_patch_layers_fail_before_training(tiny, tmp_path):
    cfg = TransferConfig(patch_layers="0-7")
    with pytest.raises(LayerSpecError, match="0-1"):
        run(tmp_path, tiny, cfg, log=lambda x: None)
    assert not (tmp_path / "transfer" / "hard_negatives.jsonl").exists()
