"""The transfer stage on the bundled model and real SQuAD records (one optimizer step).

The four records are the first four of the bundled SQuAD 2.0 validation split (four passages)
with their contexts cut to 300 characters (:func:`interp.testing.rehearsal_datasets`), one
file whose passages the stage deals out in turn (:func:`interp.data.load_study_split`): the 1st
and 3rd are evaluated on, the 2nd and 4th trained on. The stage's every step runs as on the
whole records, on prompts about half as long (the patching at every position most of all).
"""

from __future__ import annotations

import json

import pytest
import torch

from interp.core.names import safe_name
from interp.judging.grading import RuleOracle
from interp.judging.prompts import get_template
from interp.stages.transfer import TransferConfig, run
from interp.testing import rehearsal_datasets


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].clone()


@pytest.mark.integration
def test_transfer_stage_end_to_end(bundled, tmp_path):
    # one optimizer step per adapter: the bundled model trains at minutes per step on a busy
    # 2-core CPU
    data = rehearsal_datasets(tmp_path / "data", n=4, max_chars=300, names=("squad_v2",))
    cfg = TransferConfig(datasets=[data["squad_v2"]], max_train_examples=2, eval_limit=2,
                         train_batch_size=2,
                         patch_examples=1, patch_layers=[29], n_boot=50,
                         hard_negative_attempts=1, judge_base_answers=False,
                         max_new_tokens=16)
    before = _logits(bundled.model, bundled.tokenizer("Hello there")["input_ids"])
    s = run(tmp_path, bundled, cfg, log=lambda x: None)
    assert torch.equal(_logits(bundled.model, bundled.tokenizer("Hello there")["input_ids"]),
                       before)
    table = json.loads((tmp_path / "transfer" / "table.json").read_text())
    assert set(table["self"]) == {"base", "lora_gen", "lora_eval", "lora_both"}
    for m in table["self"].values():
        g = m["squad_v2"]               # the file's records keep their dataset's name
        assert g["n"] == 2 and g["delta"] == pytest.approx(g["EA"] - g["GA"])
    hn = [json.loads(x) for x in (tmp_path / "transfer" / "hard_negatives.jsonl").open()]
    assert len(hn) == 2
    assert s["hard_negative_fallback_rate"] == sum(r["fallback"] for r in hn) / 2
    # the base evaluation equals Study 1's harness on the same records
    from interp.data import load_study_split
    from interp.methods.asymmetry import evaluate_examples

    val = load_study_split(data["squad_v2"], "validation", limit=2)
    trained = [r["id"] for r in hn]                 # the pool: the file's other passages
    assert trained == [e.id for e in load_study_split(data["squad_v2"], "train")]
    assert not set(trained) & {e.id for e in val}
    recs = evaluate_examples(bundled, val,
                             template=get_template("default"), oracle=RuleOracle(),
                             max_new_tokens=cfg.max_new_tokens,
                             verdict_max_new_tokens=cfg.verdict_max_new_tokens)
    evals = tmp_path / "transfer" / "eval"
    base = [json.loads(x) for x in (evals / f"base__{safe_name(data['squad_v2'])}.jsonl").open()]
    assert [r["answer"] for r in recs] == [r["answer"] for r in base]
    assert [r["logit_diff"] for r in recs] == pytest.approx([r["logit_diff"] for r in base])
    for f in ("transfer_matrix.png", "transfer_acceptance.png", "transfer_patching.png"):
        assert (tmp_path / "figures" / f).exists()
    # a second call redoes nothing
    t = run(tmp_path, bundled, cfg, log=lambda x: None)
    assert t["train_seconds"] == s["train_seconds"]
