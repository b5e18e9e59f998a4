"""The Llama-3 chat family on the code-built tokenizer and a tiny model: one BOS, end of turn.

Llama 3's tokenizer prepends ``<|begin_of_text|>`` when special tokens are added and its chat
template starts with it too; its turns end with ``<|eot_id|>``, which is not the EOS token of the
base tokenizer. These are the faults a ChatML-only test suite cannot see.
"""

from __future__ import annotations

import pytest
import torch

from interp.judging.generation import generate
from interp.judging.prompts import get_template, render
from interp.methods.steering import steer_generator
from interp.methods.transfer import sample_answers
from interp.models.loading import end_of_turn_ids, load_model
from interp.testing import LLAMA31_ROPE_SCALING, llama31_checkpoint, tiny_llama, tiny_tokenizer


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


class _Script(torch.nn.Module):
    """An output layer that emits a fixed token sequence, one token per forward call."""

    def __init__(self, vocab: int, script: list[int]):
        super().__init__()
        self.vocab, self.script, self.calls = vocab, script, 0

    def forward(self, x):
        out = torch.full((*x.shape[:-1], self.vocab), -10.0)
        out[..., self.script[min(self.calls, len(self.script) - 1)]] = 10.0
        self.calls += 1
        return out


def _llama3_release_tokenizer():
    """Llama-3-Instruct as first released: EOS and pad ``<|end_of_text|>``.

    ``<|eot_id|>`` is only an added token of tokenizer.json, not a named special token.
    """
    tok = tiny_tokenizer(template="llama3")
    tok.pad_token = tok.eos_token
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    assert eot not in tok.all_special_ids                  # the case: not a named special
    return tok, eot


@pytest.mark.parametrize("follow", ["<|eot_id|>", "<|start_header_id|>"])
def test_reply_stops_at_template_turn_end_even_if_not_a_named_special(follow):
    """"Paris" then the end of turn (or, missed, the next header): the answer is "Paris"."""
    from interp.models.loading import stop_ids

    tok, eot = _llama3_release_tokenizer()
    assert end_of_turn_ids(tok) == [eot, tok.eos_token_id]
    assert tok.convert_tokens_to_ids("<|start_header_id|>") in stop_ids(tok)
    paris = tok("Paris", add_special_tokens=False)["input_ids"]
    after = tok("assistant<|end_header_id|>\n\nParis", add_special_tokens=False)["input_ids"]
    script = paris + tok.convert_tokens_to_ids([follow]) + after
    p = render(tok, get_template(), "gen", context="Paris is in France.",
               question="Where is it?")
    h = tiny_llama(tok, n_layers=2, seed=0)
    h.model.lm_head = _Script(len(tok), script)
    (g,) = generate(h, [p.input_ids], max_new_tokens=12, stop_strings=())
    assert (g.text, g.token_ids, g.stop) == ("Paris", paris, "eos")
    h.model.lm_head = _Script(len(tok), script)
    assert sample_answers(h, [p.input_ids], seed=0, max_new_tokens=12) == ["Paris"]
    h.model.lm_head = _Script(len(tok), [script[0]] + script)   # one call per alpha batch
    steered = steer_generator(h, p.input_ids, p.token_spans["context"], {1: None}, [1.0],
                              band=[1], max_new_tokens=12)
    assert steered["generations"] == ["Paris"]
