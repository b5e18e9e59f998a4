"""The hooked model and its activation cache (interp.hooks.model, interp.hooks.cache).

Ground truths computed another way on tiny random models: the patterns' last rows are the
recorder's rows and sum to 1; the final norm applied to the accumulated residual stream gives
the model's logits; direct logit attributions sum to the logit difference; every hook point
read by every backend, through run_with_cache and through forward, equals the hf reading; the
objects the field uses (a TransformerLens bridge, an nnsight LanguageModel) wrap and are
produced on the same weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp.core.errors import BackendError, HookError
from interp.data import QAExample
from interp.hooks.cache import POINTS, ActivationCache, act_name
from interp.hooks.model import HookedModel
from interp.judging.cases import case
from interp.models.loading import load_model
from interp.testing import tiny_llama

IDS = [5, 9, 17, 33, 65, 129, 7, 250]


@pytest.fixture(scope="module")
def on_disk(tiny_tokenizer, tmp_path_factory):
    """A tiny GQA Llama saved and loaded back (a TransformerLens bridge boots from a path)."""
    path = tmp_path_factory.mktemp("tiny_hooked")
    h = tiny_llama(tiny_tokenizer, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, seed=3)
    h.model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return load_model(str(path), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def hf_run(on_disk):
    return HookedModel(on_disk).run_with_cache(IDS)


def test_run_with_cache_holds_every_point_with_batch_axis(on_disk, hf_run):
    logits, cache = hf_run
    n = len(IDS)
    assert logits.shape == (1, n, on_disk.model.config.vocab_size)
    assert len(cache) == 2 * len(POINTS)
    assert cache["pattern", 1].shape == (1, 4, n, n)
    assert cache["z", 0].shape == (1, n, 4, 16) and cache["k", 0].shape == (1, n, 2, 16)
    assert cache["resid_post", -1] is cache["blocks.1.hook_resid_post"]
    assert "blocks.1.hook_mlp_out" in cache and "blocks.2.hook_mlp_out" not in cache
    # attention rows sum to 1; the pattern's last row is the recorder's exact last row
    torch.testing.assert_close(cache["pattern", 0].sum(-1), torch.ones(1, 4, n))
    assert cache.rows.shape == (2, 4, n)
    for layer in (0, 1):
        torch.testing.assert_close(cache["pattern", layer][0, :, -1], cache.rows[layer],
                                   atol=1e-6, rtol=0)
    # the residual stream adds up: resid_post = resid_mid + mlp_out = resid_pre + attn + mlp
    torch.testing.assert_close(cache["resid_post", 0], cache["resid_pre", 0]
                               + cache["attn_out", 0] + cache["mlp_out", 0], atol=1e-5, rtol=0)
    torch.testing.assert_close(cache["resid_pre", 1], cache["resid_post", 0])


def test_accumulated_resid_and_logit_attrs_reproduce_the_logits(on_disk, hf_run):
    logits, cache = hf_run
    stack = cache.accumulated_resid(apply_ln=True)
    assert stack.shape == (3, 1, len(IDS), 64)
    torch.testing.assert_close(on_disk.model.lm_head(stack[-1]), logits, atol=1e-5, rtol=0)
    assert cache.accumulated_resid(pos=-1).shape == (3, 1, 1, 64)
    attrs = cache.logit_attrs(3, 4)
    true = float(logits[0, -1, 3] - logits[0, -1, 4])
    assert attrs["heads"].shape == (2, 4) and attrs["mlp"].shape == (2,)
    assert attrs["sum"] == pytest.approx(true, abs=1e-4)
    assert attrs["total"] == pytest.approx(true, abs=1e-4)
    assert abs(true) > 0.1  # a difference worth attributing, not 0 = 0


def test_names_filter_shorthand_and_one_line_errors(on_disk):
    model = HookedModel(on_disk)
    _, cache = model.run_with_cache(IDS, names=["resid_post", "blocks.-1.attn.hook_pattern"],
                                    logits="last")
    assert sorted(cache) == ["blocks.0.hook_resid_post", "blocks.1.attn.hook_pattern",
                             "blocks.1.hook_resid_post"]
    logits, cache = model.run_with_cache(IDS, names=lambda n: n.endswith("hook_z"),
                                         logits="last")
    assert logits.shape[1] == 1 and sorted(cache) == ["blocks.0.attn.hook_z",
                                                       "blocks.1.attn.hook_z"]
    with pytest.raises(KeyError, match="was not cached.*hook_z at layers"):
        cache["resid_post", 0]
    with pytest.raises(HookError, match="out of range"):
        model.run_with_cache(IDS, names=["blocks.5.hook_resid_post"])
    with pytest.raises(HookError, match="unknown activation 'resid'"):
        model.run_with_cache(IDS, names=["resid"])
    with pytest.raises(HookError, match="one non-empty prompt"):
        model.run_with_cache([])
    with pytest.raises(BackendError, match="unknown backend 'tl'.*transformer_lens"):
        HookedModel(on_disk, backend="tl")
    assert act_name("pattern", -1, 2) == "blocks.1.attn.hook_pattern"


@pytest.mark.parametrize("backend", ["transformer_lens", "nnsight"])
@pytest.mark.parametrize("point", POINTS)
def test_every_point_every_backend_agrees_with_hf(on_disk, hf_run, backend, point):
    """run_with_cache and forward(cache_hooks) of each backend read what hf reads."""
    logits, cache = hf_run
    model = HookedModel(on_disk, backend=backend)
    got_logits, got = model.run_with_cache(IDS, names=[point])
    torch.testing.assert_close(got_logits, logits, atol=1e-4, rtol=0)
    for layer in (0, 1):
        torch.testing.assert_close(got[point, layer], cache[point, layer], atol=1e-4, rtol=0)
    if point != "attn.hook_pattern":  # the pattern is not a patchable module input/output
        names = [act_name(point, x) for x in (0, 1)]
        fwd = model.forward(torch.tensor([IDS]), cache_hooks=names)
        for name in names:
            torch.testing.assert_close(fwd.acts[name], cache[name], atol=1e-4, rtol=0)


def test_hooks_edit_then_leave_the_model_as_it_was(on_disk):
    model = HookedModel(on_disk)
    ids = torch.tensor([IDS])
    clean = model.model(input_ids=ids).logits
    zero = {"blocks.1.attn.hook_z": lambda z: torch.zeros_like(z)}
    with model.hooks(edits=zero, cache=["blocks.1.attn.hook_z"]) as acts:
        edited = model.model(input_ids=ids).logits
    assert torch.count_nonzero(acts["blocks.1.attn.hook_z"]) == 0
    assert (edited - clean).abs().max() > 1e-3
    torch.testing.assert_close(model.model(input_ids=ids).logits, clean, atol=0, rtol=0)


def test_field_objects_on_the_same_weights(on_disk, hf_run):
    logits, cache = hf_run
    model = HookedModel(on_disk)
    weight = on_disk.model.model.layers[0].self_attn.o_proj.weight
    bridge = model.to_transformer_lens()
    # the bridge's own modules around the model's own parameter tensors
    assert any(p is weight for p in bridge.original_model.parameters())
    _, tl_cache = bridge.run_with_cache(torch.tensor([IDS]))
    torch.testing.assert_close(tl_cache["blocks.1.attn.hook_pattern"][0, :, -1], cache.rows[1],
                               atol=1e-5, rtol=0)
    # a bridge the user booted wraps back onto the same tensors, unmodified modules
    again = HookedModel.wrap(bridge)
    assert again.model.model.layers[0].self_attn.o_proj.weight is weight
    assert type(again.model.model.layers[0]).__name__ == "LlamaDecoderLayer"
    # (the reference recorded every pattern, so its outputs were computed from them as eager
    # attention does: equal to SDPA's up to float rounding)
    torch.testing.assert_close(again.run_with_cache(IDS, names=[])[0], logits, atol=1e-5,
                               rtol=0)
    # nnsight: the very model, no copy
    assert HookedModel.wrap(model.to_nnsight()).model is on_disk.model
    assert HookedModel.wrap(on_disk.model, on_disk.tokenizer).model is on_disk.model
    with pytest.raises(BackendError, match="needs its tokenizer"):
        HookedModel.wrap(on_disk.model)
    with pytest.raises(BackendError, match="cannot wrap a dict"):
        HookedModel.wrap({})


def test_transformer_lens_patching_runs_on_the_bridge(on_disk):
    """TransformerLens's own patching utility runs on to_transformer_lens().

    Patching the residual stream at the one position where clean and corrupt differ restores
    the clean metric; elsewhere it leaves the corrupt one.
    """
    import transformer_lens.patching as tl_patching

    bridge = HookedModel(on_disk).to_transformer_lens()
    clean = torch.tensor([IDS])
    corrupt = clean.clone()
    corrupt[0, 3] = 34
    _, clean_cache = bridge.run_with_cache(clean)

    def metric(lg):
        return lg[0, -1, 3] - lg[0, -1, 4]

    with torch.no_grad():
        clean_m, corrupt_m = float(metric(bridge(clean))), float(metric(bridge(corrupt)))
    out = tl_patching.get_act_patch_resid_pre(bridge, corrupt, clean_cache, metric)
    assert out.shape == (2, len(IDS))
    assert float(out[0, 3]) == pytest.approx(clean_m, abs=1e-4)
    assert float(out[0, 0]) == pytest.approx(corrupt_m, abs=1e-4)
    assert abs(clean_m - corrupt_m) > 1e-3


def test_case_prompts_and_span_mass(on_disk, tiny_tokenizer):
    ex = QAExample(id="q1", dataset="squad_v2", context="Paris is the capital of France.",
                   question="What is the capital of France?", answers=["Paris"])
    c = case(tiny_tokenizer, ex)
    assert c.judge is None and c.gold == "Paris"
    judge = c.judging("Lyon")
    s, e = judge.token_spans["candidate"]
    assert tiny_tokenizer.decode(judge.input_ids[s:e]).strip() == "Lyon"
    model = HookedModel(on_disk)
    _, cache = model.run_with_cache(judge, names=[])
    assert isinstance(cache, ActivationCache) and len(cache) == 0
    ctx = [i for i, lab in enumerate(judge.labels) if lab == "context"]
    want = float(cache.rows[:, :, ctx].sum(-1).double().mean())
    assert cache.span_mass("context", "all") == pytest.approx(want, abs=1e-7)
    total = sum(cache.span_mass(sp, "all") for sp in ("context", "question", "candidate",
                                                      "template"))
    assert total == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(HookError, match="unknown span 'answer'"):
        cache.span_mass("answer")
    _, bare = model.run_with_cache(judge.input_ids, names=[])
    with pytest.raises(HookError, match="no span labels"):
        bare.span_mass("context")


def test_patching_from_python_keeps_the_gap_rule(on_disk, tiny_tokenizer):
    """patch_pair on case_pair gives the CLI's pairs; the gap rule and orientation hold."""
    from interp.core.errors import StageError
    from interp.methods.pairs import case_pair
    from interp.methods.patching import PatchResult, patch, patch_pair

    ex = QAExample(id="q1", dataset="squad_v2", context="Paris is the capital of France.",
                   question="What is the capital of France?", answers=["Paris"])
    c = case(tiny_tokenizer, ex)
    model = HookedModel(on_disk)
    pair = case_pair(c, "candidate-swap", wrong="Lyon")
    assert pair.clean.token_spans["candidate"] and pair.corrupt_answer == "Lyon"
    full = patch_pair(model, pair, hook="blocks.0.hook_resid_pre", unit="all", min_gap=0)
    # patching every position of the residual stream before block 0 restores the clean run
    assert full.patched[0] == pytest.approx(full.clean, abs=1e-4)
    ruled = patch_pair(model, pair, hook="blocks.0.hook_resid_pre", unit="all", min_gap=1e9)
    assert not ruled.measurable and np.isnan(ruled.effect[0]) and "min_gap" in ruled.note
    with pytest.raises(StageError, match="no unit 'question'.*its units"):
        patch_pair(model, pair, hook="blocks.0.hook_resid_pre", unit="question")
    with pytest.raises(StageError, match="generator prompt is not a judge prompt"):
        patch(on_disk, c.gen, pair.corrupt, hook="blocks.0.hook_resid_post")
    with pytest.raises(StageError, match="needs the wrong answer"):
        case_pair(c, "candidate-swap")
    # orientation: a pair whose clean score is below its corrupt one reads 1 when restored
    lo = PatchResult(clean=-2.0, corrupt=1.0, patched=np.array([-2.0, 1.0, -0.5]),
                     logprob_correct=np.zeros(3), logprob_incorrect=np.zeros(3), min_gap=1.0)
    np.testing.assert_allclose(lo.effect, [1.0, 0.0, 0.5])
    assert "below the corrupt" in lo.note
    small = PatchResult(clean=0.2, corrupt=-0.16, patched=np.array([-4.66]),
                        logprob_correct=np.zeros(1), logprob_incorrect=np.zeros(1), min_gap=1.0)
    assert np.isnan(small.effect[0]) and "0.36 < min_gap 1.0" in small.note


def test_bad_inputs_of_the_front_door_are_one_line(on_disk, hf_run, tiny_tokenizer):
    """Every bad input a user can pass is a one-line error before any forward."""
    from interp.core.errors import PromptError
    from interp.methods.pairs import case_pair
    from interp.methods.patching import patch_pair

    model = HookedModel(on_disk)
    _, cache = hf_run
    vocab = on_disk.model.config.vocab_size
    for prompt, match in ((torch.tensor([0.7, 1.9]), "must be integers"),
                          ([1, 2, vocab], f"0..{vocab - 1}"), ([1, -5, 3], "0..."),
                          (["a b", "c d"], "cannot read token ids"), (None, "cannot read"),
                          (torch.ones(2, 3, dtype=torch.long), "one non-empty prompt"),
                          (torch.ones(4097, dtype=torch.long), "exceeds the model's 4096")):
        with pytest.raises(HookError, match=match):
            model.run_with_cache(prompt, names=[])
    assert model.to_tokens({"input_ids": [[5, 9]]}).tolist() == [[5, 9]]
    _, c2 = model.run_with_cache(IDS, names=[("resid_post", 1)])
    assert list(c2) == ["blocks.1.hook_resid_post"]
    with pytest.raises(HookError, match="names must be"):
        model.run_with_cache(IDS, names=123)
    assert 3 not in cache and ("resid_post", "x") not in cache and "resid_post" not in cache
    with pytest.raises(HookError, match="must be an integer"):
        cache["resid_post", "x"]
    with pytest.raises(HookError, match="named by a string"):
        cache[3]
    with pytest.raises(HookError, match="position 100 is outside"):
        cache.accumulated_resid(pos=100)
    with pytest.raises(HookError, match="position 100 is outside"):
        cache.logit_attrs(3, 4, pos=100)
    with pytest.raises(HookError, match="outside the vocabulary"):
        cache.logit_attrs(3, vocab)
    with pytest.raises(BackendError, match="with its LM head"):
        HookedModel.wrap(on_disk.model.model, on_disk.tokenizer)
    with pytest.raises(PromptError, match="lacks \\['context', 'question'\\]"):
        case(tiny_tokenizer, {"id": 1})
    with pytest.raises(PromptError, match="not a NoneType"):
        case(tiny_tokenizer, None)
    ex = QAExample(id="q1", dataset="squad_v2", context="Paris is the capital of France.",
                   question="What is the capital of France?", answers=["Paris"])
    with pytest.raises(PromptError, match="empty"):
        case(tiny_tokenizer, ex).judging(None)
    pair = case_pair(case(tiny_tokenizer, ex), "candidate-swap", wrong="Lyon")
    with pytest.raises(BackendError, match="unknown backend 'nnsite'"):
        patch_pair(model, pair, hook="blocks.0.hook_resid_pre", unit="all", backend="nnsite")


def test_logit_attrs_takes_token_strings_as_transformer_lens_does(on_disk, hf_run):
    """A one-token string is its id (TransformerLens ``logit_attrs(tokens=...)``); else one line."""
    _, cache = hf_run
    tok = on_disk.tokenizer
    a, b = (tok.encode(s, add_special_tokens=False) for s in ("Correct", "Incorrect"))
    assert len(a) == len(b) == 1 and a != b
    by_id, by_str = cache.logit_attrs(a[0], b[0]), cache.logit_attrs("Correct", "Incorrect")
    np.testing.assert_array_equal(by_str["heads"], by_id["heads"])
    assert by_str["total"] == by_id["total"] and abs(by_id["total"]) > 0
    assert cache.logit_attrs(torch.tensor(a[0]), b[0])["total"] == by_id["total"]
    # the same difference, swapped, is the negative: the strings went to the right side
    assert cache.logit_attrs("Incorrect", "Correct")["total"] == pytest.approx(-by_id["total"])
    several = tok.encode("Yes", add_special_tokens=False)
    assert len(several) > 1
    with pytest.raises(HookError, match=rf"^'Yes' is {len(several)} tokens \[.*not one: pass"):
        cache.logit_attrs("Yes", "Correct")
    for bad in (1.5, None, True, ["Correct"]):
        with pytest.raises(HookError, match=r"^a token is an id \(int\) or a string of one"):
            cache.logit_attrs(bad, b[0])
    bare_lm = ActivationCache(dict(cache), n_layers=2, model=on_disk.model)  # a causal LM
    assert bare_lm.logit_attrs(a[0], b[0])["total"] == pytest.approx(by_id["total"], abs=1e-9)
    with pytest.raises(HookError, match="without the model's tokenizer"):
        bare_lm.logit_attrs("Correct", 4)


def test_hook_name_errors_list_every_point_and_name_the_users_hook(on_disk):
    """A typo suggests the closest full name; an out-of-range layer names the hook asked for.

    Through run_with_cache, the cache and module hooks alike; the list has attn.hook_pattern.
    """
    model = HookedModel(on_disk)
    typo = r"^unknown hook point 'blocks\.1\.attn\.hook_patern' \(did you mean " \
           r"'blocks\.1\.attn\.hook_pattern'\?\); valid: blocks\.\{L\}\.\{point\} with L in " \
           r"0\.\.1 and point in \[.*'attn\.hook_pattern'\]$"
    with pytest.raises(HookError, match=typo):
        model.run_with_cache(IDS, names=["blocks.1.attn.hook_patern"])
    _, cache = model.run_with_cache(IDS, names=["blocks.1.attn.hook_pattern"])
    with pytest.raises(HookError, match=typo):
        cache["blocks.1.attn.hook_patern"]
    try:
        model.run_with_cache(IDS, names=["blocks.0.hook_resid_psot"])
    except HookError as e:      # every valid point is listed
        assert all(f"'{p}'" in str(e) for p in POINTS) and "\n" not in str(e)
        assert "did you mean 'blocks.0.hook_resid_post'" in str(e)
    out = r"^layer 99 of 'blocks\.99\.attn\.hook_pattern' is out of range: the model has 2 " \
          r"layers; valid layers: 0\.\.1 \(or -2\.\.-1 from the end\)$"
    with pytest.raises(HookError, match=out):
        model.run_with_cache(IDS, names=["blocks.99.attn.hook_pattern"])
    with pytest.raises(HookError, match=out):
        cache["blocks.99.attn.hook_pattern"]
    with pytest.raises(HookError, match=r"^layer -3 of 'blocks\.-3\.attn\.hook_z' is out"):
        model.run_with_cache(IDS, names=["blocks.-3.attn.hook_z"])
    with pytest.raises(HookError, match=r"'block\.1\.hook_resid_post' \(did you mean "
                                        r"'blocks\.1\.hook_resid_post'\?\)"):
        model.run_with_cache(IDS, names=["block.1.hook_resid_post"])
    with pytest.raises(HookError, match=r"unknown activation 'patern' \(did you mean 'pattern'"):
        cache["patern", 1]
    # module hooks: the same helper; the pattern is not a module hook point, and says so
    with pytest.raises(HookError, match=r"^layer 7 of 'blocks\.7\.hook_resid_pre' is out"):
        with model.hooks(cache=["blocks.7.hook_resid_pre"]):
            pass
    with pytest.raises(HookError, match="not a point here.*read by run_with_cache"):
        with model.hooks(cache=["blocks.0.attn.hook_pattern"]):
            pass


def test_span_mass_without_spans_says_what_was_run_and_what_to_run(on_disk):
    model = HookedModel(on_disk)
    for prompt, what in (("The capital of France is", r"a plain string \('The capital"),
                         (IDS, "bare token ids"), ({"input_ids": IDS}, "a mapping")):
        _, cache = model.run_with_cache(prompt, names=[])
        with pytest.raises(HookError, match=rf"^this cache has no span labels: it was run on "
                                            rf"{what}.*run a prompt with spans.*RenderedPrompt"):
            cache.span_mass("context")
        assert cache.to("cpu").source == cache.source
