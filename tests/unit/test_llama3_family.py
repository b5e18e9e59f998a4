"""The Llama-3 chat family on the code-built tokenizer and a tiny model: one BOS, end of turn.

Llama 3's tokenizer prepends ``<|begin_of_text|>`` when special tokens are added and its chat
template starts with it too; its turns end with ``<|eot_id|>``, which is not the EOS token of the
base tokenizer. These are the faults a ChatML-only test suite cannot see.
"""

from __future__ import annotations

import pytest
import torch

from interp.generation import generate
from interp.models import end_of_turn_ids, load_model
from interp.prompts import get_template, render
from interp.steering import steer_generator
from interp.testing import LLAMA31_ROPE_SCALING, llama31_checkpoint, tiny_llama, tiny_tokenizer
from interp.transfer import sample_answers


@pytest.fixture(scope="module")
def ltok():
    return tiny_tokenizer(template="llama3")


def test_llama3_tokenizer_adds_bos_and_the_template_has_it(ltok):
    bos, eot = ltok.convert_tokens_to_ids(["<|begin_of_text|>", "<|eot_id|>"])
    assert ltok("Paris")["input_ids"][0] == bos                      # like Llama 3's tokenizer
    assert ltok("Paris", add_special_tokens=False)["input_ids"][0] != bos
    p = render(ltok, get_template(), "eval", context="Rollo founded Normandy in 911.",
               question="Who founded Normandy?", answer="Rollo")
    assert p.input_ids.count(bos) == 1 and p.input_ids[0] == bos     # exactly one BOS, first
    assert p.text.count("Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024") == 1
    injected = p.text.index("Cutting")
    assert all(p.labels[i] == "template" for i, _ in enumerate(p.input_ids)
               if i < p.token_spans["context"][0])                   # date lines: template
    assert injected < p.char_spans["context"][0]
    for span, text in (("context", "Rollo founded Normandy in 911."),
                       ("question", "Who founded Normandy?"), ("candidate", "Rollo")):
        s, e = p.token_spans[span]
        assert ltok.decode(p.input_ids[s:e]).strip() == text
    assert end_of_turn_ids(ltok) == [eot, ltok.eos_token_id] and eot != ltok.eos_token_id


def _always(handle, token_id):
    """Make the model emit ``token_id`` at every step (a biased output layer)."""
    head = torch.nn.Linear(handle.model.config.hidden_size, handle.model.config.vocab_size,
                           bias=True)
    head.weight.data.zero_()
    head.bias.data.zero_()
    head.bias.data[token_id] = 10.0
    handle.model.lm_head = head
    return handle


def test_generation_stops_at_eot_not_only_eos(ltok):
    """The checkpoint's EOS is <|end_of_text|>; generation still stops at <|eot_id|>."""
    h = _always(tiny_llama(ltok, n_layers=2, seed=0), ltok.convert_tokens_to_ids("<|eot_id|>"))
    assert h.model.generation_config.eos_token_id == ltok.eos_token_id
    p = render(ltok, get_template(), "gen", context="Rollo founded Normandy.",
               question="Who founded Normandy?")
    (g,) = generate(h, [p.input_ids], max_new_tokens=8, stop_strings=())
    assert (g.stop, g.token_ids, g.text) == ("eos", [], "")
    comma = ltok.convert_tokens_to_ids(",")
    h2 = _always(tiny_llama(ltok, n_layers=2, seed=0), comma)
    (g2,) = generate(h2, [p.input_ids], max_new_tokens=5, stop_strings=())
    assert (g2.stop, g2.token_ids) == ("max_new_tokens", [comma] * 5)   # the control
    assert sample_answers(h, [p.input_ids], seed=0, max_new_tokens=4) == [""]
    calls = []
    hook = h.model.register_forward_hook(lambda *a: calls.append(1))
    steered = steer_generator(h, p.input_ids, p.token_spans["context"], {1: None}, [0.5, 2.0],
                              band=[1], max_new_tokens=4)
    hook.remove()
    assert steered["generations"] == ["", ""] and len(calls) == 2   # the prompt only (5 if
    # the loop ran on: its EOS set used to be the checkpoint's, without <|eot_id|>)
    steered2 = steer_generator(h2, p.input_ids, p.token_spans["context"], {1: None}, [1.0],
                               band=[1], max_new_tokens=3)
    assert steered2["generations"] == [",,,"]                        # the control


def test_llama31_checkpoint_round_trips(tmp_path):
    """The saved checkpoint loads with interp's loader in bfloat16 with its Llama 3.1 facts."""
    path = llama31_checkpoint(tmp_path / "ck", n_layers=4)
    h = load_model(str(path), device="cpu", dtype="bfloat16")
    cfg = h.model.config
    assert (h.n_layers, h.n_heads, h.n_kv_heads, cfg.hidden_size) == (4, 8, 2, 64)
    assert {k: cfg.rope_scaling[k] for k in LLAMA31_ROPE_SCALING} == LLAMA31_ROPE_SCALING
    assert cfg.rope_scaling["rope_theta"] == 500000.0 and cfg.max_position_embeddings == 131072
    assert next(h.model.parameters()).dtype == torch.bfloat16
    assert h.info["eot_tokens"] == ["<|eot_id|>", "<|end_of_text|>"]
    assert h.tokenizer("x")["input_ids"][0] == h.tokenizer.bos_token_id  # post-processor saved
    assert h.info["source"] == "local" and len(h.info["sha256"]) == 64
