"""LoRA adapters: loss masks, training and resumption, base-model isolation, fingerprints."""

from __future__ import annotations

import json

import pytest
import torch

from interp.core.errors import StageError
from interp.judging.prompts import get_template
from interp.methods.lora import (
    encode_example,
    load_adapter,
    model_fingerprint,
    train_adapter,
)
from interp.methods.transfer import build_training_sets
from interp.models.loading import end_of_turn_ids


def test_loss_mask_covers_only_the_answer(tokenizer):
    tpl = get_template("default")
    eot = end_of_turn_ids(tokenizer)[0]
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
    from interp.judging.prompts import render

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


def _encoded(tokenizer, make, n=6):
    tpl = get_template("default")
    pool = [make(i, ["blue", "red", "green"][i % 3], ctx=f"Item {i} is coloured.")
            for i in range(n)]
    negs = [{"hard_negative": "purple", "source": "rotation"} for _ in pool]
    sets = build_training_sets(pool, negs, seed=0)
    return [encode_example(tokenizer, tpl, it) for it in sets["lora_both"]]


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].clone()


def test_training_resumes_and_base_model_is_untouched(tiny, tokenizer, tmp_path, qa_example,
                                                      lora_cfg):
    enc = _encoded(tokenizer, qa_example)
    cfg = lora_cfg()
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
    # the saved adapter replaces its checkpoint: a checkpoint on disk is unfinished training
    assert not (tmp_path / "a" / "checkpoints" / "x").exists()
    assert not (tmp_path / "b" / "checkpoints" / "x").exists()
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
    # the PeftModel (forward(**kwargs)) takes its cache under the base model's keyword
    from interp.models.kv_cache import cache_kwarg
    assert cache_kwarg(adapted.model) == cache_kwarg(tiny.model)
    # a finished adapter is not retrained
    again = train_adapter(tiny, enc, cfg, tmp_path / "a" / "adapters" / "x", name="x",
                          log=lambda s: None)
    assert again["losses"] == full["losses"]


def test_adapter_of_another_base_model_is_refused(tiny, tokenizer, tmp_path, qa_example,
                                                  lora_cfg):
    from interp.testing import tiny_llama

    enc = _encoded(tokenizer, qa_example, n=2)
    train_adapter(tiny, enc, lora_cfg(epochs=1), tmp_path / "adapters" / "x", name="x",
                  log=lambda s: None)
    other = tiny_llama(tokenizer, n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, seed=1)
    with pytest.raises(StageError, match="another base model.*n_layers: adapter 2 vs "
                                            "model 3"):
        load_adapter(other, tmp_path / "adapters" / "x")
    with pytest.raises(StageError, match="no trained adapter"):
        load_adapter(tiny, tmp_path)
    meta = json.loads((tmp_path / "adapters" / "x" / "interp_adapter.json").read_text())
    assert meta["base"] == model_fingerprint(tiny)


@pytest.mark.parametrize("fault", ["missing", "mis_prefixed"])
def test_adapter_file_with_missing_or_misprefixed_keys_is_refused(tiny, tokenizer, tmp_path,
                                                                  qa_example, lora_cfg, fault):
    """The peft library would load it with a warning and leave the model equal to its base."""
    from safetensors.torch import load_file, save_file

    enc = _encoded(tokenizer, qa_example, n=2)
    ad = tmp_path / "adapters" / "x"
    train_adapter(tiny, enc, lora_cfg(epochs=1), ad, name="x", log=lambda s: None)
    probe = enc[0]["input_ids"]
    assert not torch.allclose(_logits(load_adapter(tiny, ad).model, probe),
                              _logits(tiny.model, probe))     # the intact adapter acts
    w = load_file(str(ad / "adapter_model.safetensors"))
    gone = sorted(k for k in w if "lora_B" in k)
    if fault == "missing":
        w = {k: v for k, v in w.items() if k not in gone}
    else:
        w = {k.replace("base_model.model.", "base_model.model.decoder.", 1): v
             for k, v in w.items()}
    save_file(w, str(ad / "adapter_model.safetensors"), metadata={"format": "pt"})
    word = "lacks" if fault == "missing" else "unexpected"
    with pytest.raises(StageError, match=f"adapter_model.safetensors.*{word}.*lora_"):
        load_adapter(tiny, ad)


def test_a_checkpoint_of_another_training_or_with_mixed_files_is_started_again(
        tiny, tokenizer, tmp_path, qa_example, lora_cfg):
    """A checkpoint restored from elsewhere is resumed only if it is this training's, whole."""
    import shutil

    from interp.core.io import read_json, write_json

    enc = _encoded(tokenizer, qa_example)
    cfg = lora_cfg()
    ck = tmp_path / "checkpoints" / "x"
    msgs: list[str] = []

    def stop_after(n, config=cfg, items=enc):
        return train_adapter(tiny, items, config, tmp_path / "adapters" / "x", name="x",
                             stop_after_steps=n, log=msgs.append)

    assert stop_after(2) == {"name": "x", "stopped_at_step": 2}
    state = read_json(ck / "state.json")
    assert state["global_step"] == 2 and state["trains"]["n_steps"] == 6
    assert set(state["files_sha256"]) == {"lora.safetensors", "optimizer.pt", "rng.pt"}
    # the same training resumes
    assert stop_after(1) == {"name": "x", "stopped_at_step": 3}
    assert any("resumed from step 2/6" in m for m in msgs)
    # another learning rate, or another training set of the same size: started again
    other = lora_cfg(lr=3e-2)
    msgs.clear()
    assert stop_after(1, config=other) == {"name": "x", "stopped_at_step": 1}
    assert any("is of another training" in m for m in msgs)
    assert not any("resumed" in m for m in msgs)
    msgs.clear()
    assert stop_after(1, items=enc[::-1], config=other) == {"name": "x", "stopped_at_step": 1}
    assert any("is of another training" in m for m in msgs)
    # a copy that mixes files of two steps (taken while training wrote one): started again
    assert stop_after(1, items=enc[::-1], config=other)["stopped_at_step"] == 2
    shutil.copy(ck / "lora.safetensors", tmp_path / "lora_step2")
    assert stop_after(1, items=enc[::-1], config=other)["stopped_at_step"] == 3
    shutil.copy(tmp_path / "lora_step2", ck / "lora.safetensors")
    msgs.clear()
    assert stop_after(1, items=enc[::-1], config=other)["stopped_at_step"] == 1
    assert any("has files from different steps" in m for m in msgs)
    # a checkpoint written before hashes and settings were recorded is resumed as it was
    state = read_json(ck / "state.json")
    write_json(ck / "state.json", {k: v for k, v in state.items()
                                   if k not in ("files_sha256", "trains")})
    msgs.clear()
    assert stop_after(1, items=enc[::-1], config=other)["stopped_at_step"] == 2
    assert any("resumed from step 1/6" in m for m in msgs)
