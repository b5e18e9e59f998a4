"""A model spread by a device map (CPU + disk offload) computes what a plain load computes.

SmolLM2 in float32 with its last 10 blocks offloaded to a folder on disk (accelerate keeps
their weights on the ``meta`` device between forwards): span masses of the recorder, the
whole-reply ``logit_diff``, an activation-patching effect, a steering effect and the saved
head outputs (``result_last``, which reads ``o_proj`` weights outside a forward) equal the plain
load's within 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp.analysis.span_mass import span_mass
from interp.core.errors import ModelSpecError
from interp.data import load_examples
from interp.hooks.recorder import record_rows
from interp.judging.prompts import get_template, render
from interp.judging.verdict import score_verdicts
from interp.methods.pairs import align_positions
from interp.methods.patching import patch
from interp.methods.steering import steer_judge
from interp.models.loading import check_device_map, load_model, result_facts, runtime_facts

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def offloaded(tmp_path_factory):
    """Its own load of the bundled SmolLM2: another placement (blocks 20-29 offloaded to disk).

    Not the session's ``bundled``: a device map is fixed at load time, and the test compares
    the two loads.
    """
    dm = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu",
          "lm_head": "cpu", **{f"model.layers.{i}": "cpu" if i < 20 else "disk"
                               for i in range(30)}}
    return load_model("smollm2-135m-instruct", device="cpu", dtype="float32", device_map=dm,
                      offload_folder=tmp_path_factory.mktemp("offload"))


def test_offloaded_model_equals_plain_load(bundled, offloaded):
    assert offloaded.info["device_map"]["model.layers.25"] == "disk"
    assert offloaded.model.model.layers[25].self_attn.o_proj.weight.device.type == "meta"
    assert offloaded.device == torch.device("cpu")
    assert result_facts(runtime_facts(offloaded)) == result_facts(runtime_facts(bundled))
    ex = load_examples("squad_v2", limit=1)[0]
    tpl = get_template()
    p = render(bundled.tokenizer, tpl, "eval", context=ex.context, question=ex.question,
               answer=ex.answers[0])
    wrong = render(bundled.tokenizer, tpl, "eval", context=ex.context, question=ex.question,
                   answer="Paris")
    pos_map = align_positions(p.input_ids, wrong.input_ids)[0]
    got = {}
    for name, h in (("plain", bundled), ("offloaded", offloaded)):
        rec = record_rows(h, p.input_ids, act_layers=[3, 25])
        res = {"mass": span_mass(rec.rows, p.labels).numpy(),
               "result_last": rec.acts["result_last"].numpy(),
               "logit_diff": score_verdicts(h, [p.input_ids, wrong.input_ids]).logit_diff}
        pr = patch(h, p.input_ids, wrong.input_ids, hook="blocks.24.hook_resid_post",
                   positions=[-1], pos_map=pos_map)
        res["patch"] = np.array([pr.effect[0], pr.patched[0], pr.clean, pr.corrupt])
        band = list(range(22, 30))
        st = steer_judge(h, p.input_ids, p.token_spans["context"], {x: None for x in band},
                         [0.25, 1.0, 4.0], band=band)
        res["steer_ld"], res["steer_mass"] = st["logit_diff"], st["context_mass"]
        got[name] = res
    assert set(got["plain"]) == set(got["offloaded"])
    for key, want in got["plain"].items():
        np.testing.assert_allclose(got["offloaded"][key], want, atol=1e-5, rtol=0, err_msg=key)
    # the effects are real numbers, not zeros that would agree by construction
    assert abs(got["plain"]["steer_ld"][0] - got["plain"]["steer_ld"][2]) > 1e-2
    assert np.abs(got["plain"]["result_last"]).max() > 1e-3


def test_placement_options_are_checked_before_loading(tmp_path):
    with pytest.raises(ModelSpecError, match="offload-folder"):
        check_device_map({"model.layers.0": "disk"})
    with pytest.raises(ModelSpecError, match="need --device-map"):
        check_device_map(None, max_memory={"cpu": "1GiB"})
    with pytest.raises(ModelSpecError, match="use one of auto"):
        check_device_map("everywhere")
    assert check_device_map("auto", {"0": "1GiB", "cpu": "2GiB"}, tmp_path) == {
        "device_map": "auto", "max_memory": {0: "1GiB", "cpu": "2GiB"},
        "offload_folder": str(tmp_path)}


def test_lora_on_an_offloaded_model_is_refused_in_one_line(offloaded, tmp_path):
    """Offloaded blocks live on the meta device: peft cannot wrap them, nor train them."""
    from interp.core.errors import StageError
    from interp.methods.lora import load_adapter, train_adapter
    from interp.stages.transfer import TransferConfig

    ids = offloaded.tokenizer.encode("Paris is the capital of France.")
    with pytest.raises(StageError, match=r"^training the LoRA adapter x needs every weight "
                                            r"of smollm2-135m-instruct in memory, but its "
                                            r"device_map offloads 10 modules"):
        train_adapter(offloaded, [{"input_ids": ids, "labels": ids}], TransferConfig(),
                      tmp_path / "adapters/x", name="x", log=lambda s: None)
    with pytest.raises(StageError, match="^loading a LoRA adapter needs every weight"):
        load_adapter(offloaded, tmp_path / "adapters/x")
    assert not (tmp_path / "adapters").exists() and not (tmp_path / "checkpoints").exists()
