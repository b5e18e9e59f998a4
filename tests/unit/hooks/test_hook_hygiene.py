"""Issue 12 items 3 and 7: every entry point leaves the model as it came, and runs it in eval mode.

After ANY failing call (a bad layer, a bad hook name, masks that do not fit, an exception
raised in the middle of the forward) the model has exactly the hooks it had (counted on every
module), its attention kernel and training flags, and its logits equal a clean run bit for bit.
A model whose query heads are not a multiple of its key/value heads is a named error before any
forward; an architecture without module paths is refused by the nnsight backend by name. With
dropout on and the model in training mode, patching clean == corrupt gives exactly equal logit
differences and attribution exactly 0, and the caller's training mode comes back.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from interp.core.errors import (
    BackendError,
    HookError,
    InterpError,
    LayerSpecError,
    ModelSpecError,
    StageError,
)
from interp.hooks.backends import get_backend
from interp.hooks.capture import hooked
from interp.hooks.guard import hook_counts, inference_guard
from interp.hooks.recorder import record_rows
from interp.judging.prompts import get_template, render
from interp.judging.residual_features import extract_features, residual_stream
from interp.methods.patching import Patch, Patcher, patch
from interp.methods.steering import steer_judge
from interp.methods.transfer import cross_model_patching
from interp.models.loading import ModelHandle, load_model
from interp.models.points import decoder_layers
from interp.testing import tiny_llama

CTX = "The Eiffel Tower is in Paris. It was finished in 1889."
Q = "When was the Eiffel Tower finished?"


class Bomb:
    """A forward pre-hook on layer 1's MLP that raises while armed (registered once, counted)."""

    def __init__(self, model):
        self.armed = False
        self.handle = decoder_layers(model)[1].mlp.register_forward_pre_hook(self)

    def __call__(self, mod, args):
        if self.armed:
            raise RuntimeError("boom in the middle of the forward")


@pytest.fixture(scope="module")
def setup(tiny_tokenizer):
    h = tiny_llama(tiny_tokenizer, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, seed=3)
    donor = tiny_llama(tiny_tokenizer, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, seed=4)
    tpl = get_template()
    clean = render(tiny_tokenizer, tpl, "eval", context=CTX, question=Q, answer="Paris")
    corrupt = render(tiny_tokenizer, tpl, "eval", context=CTX, question=Q, answer="Lyon")
    bomb = Bomb(h.model)
    # transformers installs its output-capturing hooks for good on the first forward with
    # output_attentions=True (the eager recorder): install them before anything is counted
    record_rows(h, corrupt.input_ids, attn="eager")
    return h, donor, clean, corrupt, bomb


def _state(h):
    ids = torch.tensor([[5, 9, 17, 33, 65, 129, 200, 7]])
    with torch.no_grad():
        logits = h.model(input_ids=ids).logits
    return (hook_counts(h.model), h.model.config._attn_implementation,
            [m.training for m in h.model.modules()], logits)


def _assert_unchanged(h, before):
    hooks, attn, training, logits = _state(h)
    assert hooks == before[0]
    assert attn == before[1]
    assert training == before[2]
    assert torch.equal(logits, before[3])  # bit for bit


def _hooked_forward(h, ids):
    with hooked(h.model, cache=["blocks.0.hook_resid_post"],
                edits={"blocks.1.attn.hook_z": lambda z: z * 1.0}):
        h.model(input_ids=torch.tensor([ids]))


def _steer(h, corrupt):
    steer_judge(h, corrupt.input_ids, corrupt.token_spans["context"], {1: None}, [1.0, 4.0],
                band=[1])


def _prefix(h, corrupt):
    get_backend(h, "hf").prefix_cache(torch.tensor([corrupt.input_ids[:5]]))


# (name, call(h, donor, clean, corrupt), error class, message pattern); None: the bomb raises
BAD_INPUT = [
    ("hooked: bad hook name", lambda h, d, c, k: hooked(h.model, cache=["blocks.0.hook_zz"])
     .__enter__(), HookError, r"unknown hook point 'blocks.0.hook_zz'.*L in 0..1"),
    ("hooked: bad layer", lambda h, d, c, k: hooked(h.model, cache=[
        "blocks.0.hook_resid_pre", "blocks.7.hook_resid_post"]).__enter__(), HookError,
     r"layer 7 .* valid layers: 0..1"),
    ("record_rows: act_layers [0, 99]", lambda h, d, c, k: record_rows(
        h, k.input_ids, act_layers=[0, 99]), LayerSpecError,
     r"layer 99 is out of range; valid layers are 0-1"),
    ("record_rows: nnsight act_layers", lambda h, d, c, k: record_rows(
        h, k.input_ids, backend="nnsight", act_layers=[0]), InterpError, "exact recorder only"),
    ("hf forward: bad hook", lambda h, d, c, k: get_backend(h, "hf").forward(
        torch.tensor([k.input_ids]), cache_hooks=["blocks.2.hook_resid_pre"]), HookError,
     r"layer 2 .* valid layers: 0..1"),
    ("hf forward: mask without source", lambda h, d, c, k: get_backend(h, "hf").forward(
        torch.tensor([k.input_ids]), masks={"blocks.0.hook_resid_pre": torch.ones(
            1, len(k), dtype=torch.bool)}), BackendError, "no source activation"),
    ("hf forward: mask of wrong shape", lambda h, d, c, k: get_backend(h, "hf").forward(
        torch.tensor([k.input_ids]), masks={"blocks.1.attn.hook_z": torch.ones(
            1, len(k), dtype=torch.bool)}, sources={"blocks.1.attn.hook_z": torch.zeros(
                len(k), 4, 16)}), BackendError, r"must be bool \[1, \d+, 4\]"),
    ("nnsight forward: bad hook", lambda h, d, c, k: get_backend(h, "nnsight").forward(
        torch.tensor([k.input_ids]), cache_hooks=["blocks.-3.hook_resid_pre"]), HookError,
     r"layer -3 .* valid layers: 0..1"),
    ("nnsight forward: short source", lambda h, d, c, k: get_backend(h, "nnsight").forward(
        torch.tensor([k.input_ids]), masks={"blocks.0.hook_resid_pre": torch.ones(
            1, len(k), dtype=torch.bool)}, sources={"blocks.0.hook_resid_pre": torch.zeros(
                3, 64)}), BackendError, r"source of 'blocks.0.hook_resid_pre' must be \[\d+, 64\] "
                                        r"\(pos of the ids, d_model\), got \[3, 64\]"),
    ("hf forward: source of wrong width", lambda h, d, c, k: get_backend(h, "hf").forward(
        torch.tensor([k.input_ids]), masks={"blocks.1.attn.hook_z": torch.ones(
            1, len(k), 4, dtype=torch.bool)}, sources={"blocks.1.attn.hook_z": torch.zeros(
                len(k), 64)}), BackendError, r"must be \[\d+, 4, 16\] \(pos of the ids, heads, "
                                             r"head_dim\)"),
    ("patch: bad layer", lambda h, d, c, k: patch(h, c.input_ids, k.input_ids,
                                                  hook="blocks.9.hook_resid_post"),
     HookError, r"layer 9 .* valid layers: 0..1"),
    ("patcher: bad position", lambda h, d, c, k: Patcher(h, c.input_ids, k.input_ids).run(
        [Patch("blocks.1.hook_resid_post", (len(k),))]), InterpError,
     r"position \d+ outside the corrupt prompt"),
    ("patcher: bad head", lambda h, d, c, k: Patcher(h, c.input_ids, k.input_ids).run(
        [Patch("blocks.1.attn.hook_z", None, (4,))]), InterpError, r"heads \[4\] out of range"),
    ("cross-model: bad layer", lambda h, d, c, k: cross_model_patching(
        h, d, [k.input_ids], layers=[0, 2]), StageError, r"\[2\] out of range.*0..1"),
    ("residual_stream: bad mask", lambda h, d, c, k: residual_stream(
        h, torch.tensor([k.input_ids]), torch.ones(1, 3)), StageError, "the same shape"),
]

MID_FORWARD = [
    ("hooked", lambda h, d, c, k: _hooked_forward(h, k.input_ids)),
    ("record_rows hf", lambda h, d, c, k: record_rows(h, k.input_ids, act_layers=[0, 1],
                                                      patterns=True)),
    ("record_rows eager", lambda h, d, c, k: record_rows(h, k.input_ids, attn="eager")),
    ("record_rows nnsight", lambda h, d, c, k: record_rows(h, k.input_ids, backend="nnsight")),
    ("hf forward", lambda h, d, c, k: get_backend(h, "hf").forward(
        torch.tensor([k.input_ids]), cache_hooks=["blocks.1.attn.hook_z"])),
    ("hf prefix cache", lambda h, d, c, k: _prefix(h, k)),
    ("nnsight forward", lambda h, d, c, k: get_backend(h, "nnsight").forward(
        torch.tensor([k.input_ids]), cache_hooks=["blocks.0.hook_resid_post"])),
    ("patch hf", lambda h, d, c, k: patch(h, c.input_ids, k.input_ids,
                                          hook="blocks.0.hook_resid_post")),
    ("patch nnsight", lambda h, d, c, k: patch(h, c.input_ids, k.input_ids,
                                               hook="blocks.1.attn.hook_z", backend="nnsight")),
    ("attribution", lambda h, d, c, k: Patcher(h, c.input_ids, k.input_ids).attribution()),
    ("attention steering", lambda h, d, c, k: _steer(h, k)),
    ("cross-model (receiver)", lambda h, d, c, k: cross_model_patching(h, d, [k.input_ids])),
    ("cross-model (donor)", lambda h, d, c, k: cross_model_patching(d, h, [k.input_ids])),
    ("probe features", lambda h, d, c, k: extract_features(h, [c, k], batch_size=2)),
]


@pytest.mark.parametrize("name,call,error,match", BAD_INPUT, ids=[b[0] for b in BAD_INPUT])
def test_bad_input_is_one_clear_error_and_leaves_the_model_as_it_was(setup, name, call, error,
                                                                     match):
    h, donor, clean, corrupt, _ = setup
    before = _state(h)
    with pytest.raises(error, match=match) as err:
        call(h, donor, clean, corrupt)
    assert "\n" not in str(err.value)
    _assert_unchanged(h, before)


@pytest.mark.parametrize("name,call", MID_FORWARD, ids=[m[0] for m in MID_FORWARD])
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_an_exception_mid_forward_leaves_the_model_as_it_was(setup, name, call, training):
    h, donor, clean, corrupt, bomb = setup
    h.model.train(training)
    try:
        before = _state(h)
        assert sum(n[1] for n in before[0].values()) == 1  # the bomb itself
        bomb.armed = True
        try:
            with pytest.raises(Exception, match="boom"):
                call(h, donor, clean, corrupt)
        finally:
            bomb.armed = False
        _assert_unchanged(h, before)
        call(h, donor, clean, corrupt)  # and the same call works afterwards
        _assert_unchanged(h, before)
    finally:
        h.model.eval()


def test_query_heads_not_a_multiple_of_kv_heads_is_a_named_error(tiny_tokenizer, tmp_path,
                                                                 setup):
    _, _, clean, corrupt, _ = setup
    bad = tiny_llama(tiny_tokenizer, n_layers=2, d_model=48, n_heads=6, n_kv_heads=4)
    msg = r"6 query heads and 4 key/value heads: query heads must be a multiple"
    calls = [lambda: record_rows(bad, corrupt.input_ids),
             lambda: record_rows(bad, corrupt.input_ids, attn="eager"),
             lambda: patch(bad, clean.input_ids, corrupt.input_ids,
                           hook="blocks.0.hook_resid_pre"),
             lambda: Patcher(bad, clean.input_ids, corrupt.input_ids).attribution(),
             lambda: extract_features(bad, [corrupt]),
             lambda: hooked(bad.model, cache=["blocks.0.hook_resid_pre"]).__enter__()]
    for call in calls:
        with pytest.raises(ModelSpecError, match=msg):
            call()
        assert hook_counts(bad.model) == {}
    # and at load time, from the config, before the weights are read
    bad.model.save_pretrained(tmp_path / "ckpt")
    tiny_tokenizer.save_pretrained(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"not read")
    with pytest.raises(ModelSpecError, match=msg):
        load_model(str(tmp_path / "ckpt"), device="cpu", dtype="float32")


def test_nnsight_and_tlens_refuse_other_architectures_by_name(tiny_tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tiny_tokenizer), n_embd=32, n_layer=2,
                                      n_head=2, bos_token_id=0, eos_token_id=0)).eval()
    h = ModelHandle(model=gpt2, tokenizer=tiny_tokenizer, spec="gpt2", info={})
    names = r"supported architectures are \['llama', 'mistral', 'qwen2', 'qwen3'\], not " \
            r"GPT2LMHeadModel \(model_type 'gpt2'\)"
    with pytest.raises(BackendError, match="the nnsight backend: " + names):
        get_backend(h, "nnsight")
    with pytest.raises(BackendError, match="the nnsight backend: " + names):
        record_rows(h, [1, 2, 3], backend="nnsight")
    with pytest.raises(BackendError, match="the transformer_lens backend: " + names):
        get_backend(h, "transformer_lens")
    with pytest.raises(HookError, match="interp's hook points: " + names):
        patch(h, [1, 2, 3], [1, 2, 4], hook="blocks.0.hook_resid_pre")
    assert hook_counts(gpt2) == {}


# ---------------------------------------------------------------------------------------------
# Item 7: eval mode
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dropout_model(tiny_tokenizer):
    return tiny_llama(tiny_tokenizer, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, seed=0,
                      attention_dropout=0.5)


def _train_modes(model):
    return [m.training for m in model.modules()]


def test_dropout_is_live_in_training_mode(dropout_model, setup):
    """The premise: in training mode two plain forwards of one prompt differ."""
    ids = torch.tensor([setup[3].input_ids])
    dropout_model.model.train()
    try:
        with torch.no_grad():
            a, b = (dropout_model.model(input_ids=ids).logits for _ in range(2))
        assert not torch.equal(a, b)
    finally:
        dropout_model.model.eval()


@pytest.mark.parametrize("backend", ["hf", "nnsight"])
def test_patching_in_training_mode_is_the_eval_mode_computation(dropout_model, setup, backend):
    """Patching a model left in training mode runs it in eval mode.

    Patching every position restores the clean score, repeated runs are bit-identical, the
    training flags come back, and the numbers are those of the model in eval mode.
    """
    clean, corrupt = setup[2].input_ids, setup[3].input_ids
    model = dropout_model.model
    ref = Patcher(dropout_model, clean, corrupt, backend=backend)  # eval mode
    units = [Patch("blocks.1.attn.hook_z", None, (h,)) for h in range(4)] + [
        Patch("blocks.0.hook_resid_pre")]
    ref_res = ref.run(units)
    model.train()
    model.model.layers[0].eval()  # a mixed mode: each module's own flag must come back
    modes = _train_modes(model)
    try:
        r = patch(dropout_model, clean, corrupt, hook="blocks.0.hook_resid_pre",
                  backend=backend)
        assert float(r.patched[0]) == pytest.approx(r.clean, abs=1e-5)
        assert r.clean != pytest.approx(r.corrupt, abs=1e-3)
        pt = Patcher(dropout_model, clean, corrupt, backend=backend)
        res = pt.run(units)
        assert (pt.clean_ld, pt.corrupt_ld) == (ref.clean_ld, ref.corrupt_ld)
        assert torch.equal(torch.as_tensor(res.patched), torch.as_tensor(ref_res.patched))
        assert _train_modes(model) == modes
        if backend == "hf":
            a1 = Patcher(dropout_model, clean, corrupt).attribution()
            a2 = Patcher(dropout_model, clean, corrupt).attribution()
            assert np.array_equal(a1["resid"], a2["resid"])
            assert np.array_equal(a1["heads"], a2["heads"])
        assert _train_modes(model) == modes
    finally:
        model.eval()
    assert r.clean == ref.clean_ld


def test_recorder_features_and_cross_model_are_deterministic_in_training_mode(dropout_model,
                                                                              setup):
    _, _, clean, corrupt, _ = setup
    model = dropout_model.model
    ref_rows = record_rows(dropout_model, corrupt.input_ids, act_layers=[1]).rows
    ref_feats = extract_features(dropout_model, [clean, corrupt])[0]["last"]
    other = ModelHandle(model=copy.deepcopy(model), tokenizer=dropout_model.tokenizer,
                        spec="copy", info={})
    ref_x = cross_model_patching(dropout_model, other, [corrupt.input_ids], positions="last")
    model.train()
    other.model.train()
    try:
        assert torch.equal(record_rows(dropout_model, corrupt.input_ids, act_layers=[1]).rows,
                           ref_rows)
        assert torch.equal(extract_features(dropout_model, [clean, corrupt])[0]["last"],
                           ref_feats)
        x = cross_model_patching(dropout_model, other, [corrupt.input_ids], positions="last")
        assert x == ref_x and x["mean_abs_change"] == 0.0
        assert all(_train_modes(model)) and all(_train_modes(other.model))
    finally:
        model.eval()


def test_guard_restores_each_modules_flag_whatever_raises(dropout_model):
    model = dropout_model.model
    model.train()
    model.lm_head.eval()
    modes = _train_modes(model)
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with inference_guard(dropout_model, None, model):
                assert not any(_train_modes(model))
                with inference_guard(model):  # nested: the outer mode (eval) comes back
                    pass
                assert not any(_train_modes(model))
                raise RuntimeError("inside")
        assert _train_modes(model) == modes and sum(modes) == len(modes) - 1
    finally:
        model.eval()
