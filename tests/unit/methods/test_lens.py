"""The verdict lens (interp.methods.lens): its equalities and the pitfalls its docstring names."""

from __future__ import annotations

import pytest
import torch

from interp.core.errors import StageError
from interp.judging.prompts import get_template, render
from interp.judging.verdict import score_verdicts, verdict_replies
from interp.methods.lens import (
    TunedLens,
    direct_logit_attribution,
    first_agreeing_layer,
    fit_tuned_lens,
    lens_kl,
    readout,
    reply_lens,
    residual_stack,
    token_lens,
)
from interp.testing import tiny_llama, tiny_tokenizer

KW = {"context": "The Eiffel Tower is in Paris. It was built in 1889.",
      "question": "Where is the tower?"}


@pytest.fixture(scope="module", params=["untied", "tied"])
def model(request):
    """A tiny model whose tokenizer splits both replies (Correct = 2 tokens, Incorrect = 3)."""
    tok = tiny_tokenizer(vocab_size=280)
    m = tiny_llama(tok, n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, seed=2,
                   tied=request.param == "tied")
    with torch.no_grad():   # a final norm with a non-trivial gain, as trained models have
        m.model.model.norm.weight.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(0))
    return m


@pytest.fixture(scope="module")
def prompt(model):
    return render(model.tokenizer, get_template(), "eval", answer="Paris", **KW).input_ids


def test_tied_and_untied_unembeddings_are_the_ones_the_model_uses(model):
    ro = readout(model.model)
    assert ro.weight is model.model.get_output_embeddings().weight
    emb = model.model.get_input_embeddings().weight
    assert ro.tied == (ro.weight.data_ptr() == emb.data_ptr())
    assert ro.tied == bool(model.model.config.tie_word_embeddings)


def test_last_layer_of_the_lens_is_the_models_whole_reply_logit_difference(model, prompt):
    r = verdict_replies(model.tokenizer)
    assert len(r.incorrect) > 1            # the multi-token reply the lens must teacher-force
    out = reply_lens(model, prompt, r.ids)
    ld = out["logprobs"][0] - out["logprobs"][1]
    ref = float(score_verdicts(model, [prompt], replies=r).logit_diff[0])
    assert float(ld[-1]) == pytest.approx(ref, abs=1e-4)
    assert float(out["model"][0] - out["model"][1]) == pytest.approx(ref, abs=1e-4)
    assert ld.shape == (model.n_layers + 1,)
    # a first-token score is another number: the whole reply is what is read
    first = residual_stack(model, prompt, [-1])[1][0].log_softmax(-1)
    assert abs(float(first[r.correct[0]] - first[r.incorrect[0]]) - ref) > 1e-3


def test_each_layer_is_normalised_with_its_own_scale(model, prompt):
    ro = readout(model.model)
    stack, _ = residual_stack(model, prompt, [-1, -2])
    base = ro.logits(stack)
    scaled = ro.logits(stack * torch.tensor([2.0, 3.0, 7.0, 20.0])[:, None, None])
    assert torch.allclose(base, scaled, atol=1e-3)
    # normalising every layer by the LAST layer's scale (the old pitfall) reads other logits
    s_last = ro.scale(stack[-1])
    wrong = (stack * s_last * ro.norm.weight) @ ro.weight.T
    assert not torch.allclose(base[0], wrong[0], atol=1e-2)
    assert torch.allclose(base[-1], wrong[-1], atol=1e-4)


def test_hf_last_hidden_state_is_after_the_final_norm_and_the_lens_does_not_read_it(model,
                                                                                    prompt):
    x = torch.tensor([prompt])
    hs = model.model(input_ids=x, output_hidden_states=True).hidden_states
    stack, logits = residual_stack(model, prompt, [-1])
    ro = readout(model.model)
    assert torch.allclose(hs[-1][0, -1], ro.norm(stack[-1, 0]), atol=1e-5)
    assert torch.allclose(hs[1][0, -1], stack[1, 0], atol=1e-5)       # block 0's output
    assert torch.allclose(ro.logits(stack[-1, 0]), logits[0], atol=1e-4)
    assert not torch.allclose(ro.logits(hs[-1][0, -1]), logits[0], atol=1e-2)  # normed twice


def test_direct_logit_attribution_sums_to_the_first_token_logit_difference(model, prompt):
    r = verdict_replies(model.tokenizer)
    d = direct_logit_attribution(model, prompt, r.correct[0], r.incorrect[0])
    assert d["heads"].shape == (model.n_layers, model.n_heads)
    assert d["sum"] == pytest.approx(d["total"], abs=1e-4)
    first = residual_stack(model, prompt, [-1])[1][0]
    assert d["total"] == pytest.approx(float(first[r.correct[0]] - first[r.incorrect[0]]),
                                       abs=1e-4)
    assert float(d["heads"].abs().sum()) > 0 and float(d["mlp"].abs().sum()) > 0


def test_the_attributions_components_sum_to_the_residual_stream_at_every_layer(model, prompt):
    r = verdict_replies(model.tokenizer)
    d = direct_logit_attribution(model, prompt, r.correct[0], r.incorrect[0], stack=True)
    stack, _ = residual_stack(model, prompt, [-1])                 # [layer, 1, d_model]
    assert d["stack"].shape == (model.n_layers + 1, stack.shape[-1])
    assert torch.allclose(d["stack"].float(), stack[:, 0].float(), atol=1e-4)


def test_the_attributions_forward_records_the_attention_rows_the_recorder_records(model,
                                                                                  prompt):
    from interp.hooks.recorder import record_rows

    r = verdict_replies(model.tokenizer)
    plain = direct_logit_attribution(model, prompt, r.correct[0], r.incorrect[0])
    d = direct_logit_attribution(model, prompt, r.correct[0], r.incorrect[0], rows=True)
    rows = record_rows(model, prompt).rows
    assert d["rows"].shape == (model.n_layers, model.n_heads, len(prompt))
    assert torch.allclose(d["rows"], rows, atol=1e-6)
    assert torch.allclose(d["rows"].sum(-1), torch.ones(model.n_layers, model.n_heads),
                          atol=1e-5)
    assert d["total"] == pytest.approx(plain["total"], abs=1e-5)
    assert torch.allclose(d["heads"], plain["heads"], atol=1e-5)


def test_token_lens_targets_the_gold_token_against_the_models_best_other(model, prompt):
    out = token_lens(model, prompt, target=5)
    logits = residual_stack(model, prompt, [-1])[1][0]
    other = logits.clone()
    other[5] = -float("inf")
    assert out["distractor"] == int(other.argmax())
    assert float(out["logit_diff"][-1]) == pytest.approx(out["model"], abs=1e-4)
    assert out["rank"] == int((logits > logits[5]).sum())
    with pytest.raises(StageError, match="outside the vocabulary"):
        token_lens(model, prompt, target=10**6)


@pytest.mark.parametrize(("curve", "layer"), [
    ([1.0, 2.0, 3.0], 0), ([-1.0, 2.0, 3.0], 1), ([1.0, -2.0, 3.0], 2), ([1.0, 2.0, -3.0], 2),
    ([-1.0, -2.0, -3.0], 0), ([0.0, 1.0, 1.0], 1), ([5.0], 0)])
def test_first_agreeing_layer(curve, layer):
    assert first_agreeing_layer(curve) == layer


@pytest.mark.parametrize(("curve", "strict", "skip1"), [
    ([1.0, -2.0, 3.0], 2, 0),                 # one disagreeing layer forgiven
    ([-1.0, -1.0, -1.0, 1.0, -1.0], 4, 0),    # one layer before the last flips every reading
    ([1.0, -1.0, -1.0, 1.0, -1.0], 4, 1),     # the forgiven layer is the only one
    ([1.0, -1.0, 1.0, 1.0, -1.0], 4, 4),      # two disagreeing layers: nothing forgiven
    ([1.0, 2.0, -3.0], 2, 2), ([5.0], 0, 0)])
def test_first_agreeing_layer_letting_one_layer_disagree(curve, strict, skip1):
    assert first_agreeing_layer(curve) == strict
    assert first_agreeing_layer(curve, skip=1) == skip1
    assert first_agreeing_layer(curve, skip=len(curve)) == next(
        i for i, x in enumerate(curve) if (x > 0) == (curve[-1] > 0))
    with pytest.raises(StageError, match="skip must be >= 0"):
        first_agreeing_layer(curve, skip=-1)


def _training_stack(model, n_prompts=12):
    texts = [f"Question {i}: what is {i} plus {i + 1}? The context says many things." * 2
             for i in range(n_prompts)]
    stacks, logits = [], []
    for t in texts:
        ids = model.tokenizer(t)["input_ids"][:40]
        s, lg = residual_stack(model, ids, list(range(8, len(ids))))
        stacks.append(s)
        logits.append(lg)
    return torch.cat(stacks, 1), torch.cat(logits)


def test_tuned_lens_last_layer_is_the_model_and_it_beats_the_logit_lens_held_out(model, prompt,
                                                                                 tmp_path):
    ro = readout(model.model)
    stack, logits = _training_stack(model)
    n = stack.shape[1]
    tr, te = slice(0, n * 3 // 4), slice(n * 3 // 4, n)
    steps = []
    lens = fit_tuned_lens(ro, stack[:, tr], logits[tr], kl_steps=5, batch=16,
                          on_step=lambda i, loss: steps.append(loss))
    assert len(steps) == 5
    kl_logit = lens_kl(ro, stack[:, te], logits[te])
    kl_tuned = lens_kl(ro, stack[:, te], logits[te], lens)
    assert float(kl_logit[-1]) == pytest.approx(0.0, abs=1e-4)
    assert float(kl_tuned[-1]) == pytest.approx(0.0, abs=1e-4)
    assert float(kl_tuned[:-1].mean()) < float(kl_logit[:-1].mean())
    r = verdict_replies(model.tokenizer)
    a, b = reply_lens(model, prompt, r.ids), reply_lens(model, prompt, r.ids, lens=lens)
    assert torch.allclose(a["logprobs"][:, -1], b["logprobs"][:, -1], atol=1e-4)
    path = lens.save(tmp_path / "t.safetensors", {"k": "v"})
    back = TunedLens.load(path)
    assert torch.equal(back.weight, lens.weight) and torch.equal(back.bias, lens.bias)


def test_tuned_lens_refuses_too_few_positions_and_bad_settings(model):
    ro = readout(model.model)
    stack, logits = _training_stack(model, n_prompts=1)
    with pytest.raises(StageError, match="training positions"):
        fit_tuned_lens(ro, stack[:, :4], logits[:4])
    with pytest.raises(StageError, match="kl_steps"):
        fit_tuned_lens(ro, stack, logits, kl_steps=-1)


def test_reply_lens_refuses_empty_input(model, prompt):
    with pytest.raises(StageError):
        reply_lens(model, prompt, [[]])
    with pytest.raises(StageError, match="outside a prompt"):
        residual_stack(model, prompt, [len(prompt)])


def test_a_mapping_of_lenses_reads_each_from_the_same_forwards(model, prompt):
    r = verdict_replies(model.tokenizer)
    lens = TunedLens(model.n_layers, model.model.config.hidden_size)
    with torch.no_grad():
        for p in lens.parameters():
            p.add_(0.01 * torch.randn_like(p))
    both = reply_lens(model, prompt, r.ids, lens={"logit": None, "tuned": lens})
    torch.testing.assert_close(both["logprobs"]["logit"], reply_lens(model, prompt, r.ids)
                               ["logprobs"])
    torch.testing.assert_close(both["logprobs"]["tuned"],
                               reply_lens(model, prompt, r.ids, lens=lens)["logprobs"])
    g = token_lens(model, prompt, 5, lens={"logit": None, "tuned": lens})
    torch.testing.assert_close(g["logit_diff"]["tuned"],
                               token_lens(model, prompt, 5, lens=lens)["logit_diff"])


def test_first_token_reading_at_the_last_layer_is_the_attribution_target(model, prompt):
    r = verdict_replies(model.tokenizer)
    out = reply_lens(model, prompt, r.ids)
    first = out["first_logprobs"][0] - out["first_logprobs"][1]
    d = direct_logit_attribution(model, prompt, r.correct[0], r.incorrect[0])
    assert abs(float(first[-1]) - d["total"]) < 1e-4


def test_the_stage_writes_curves_checks_and_figures_and_resumes(tmp_path, monkeypatch):
    from interp.stages import lens as stage
    from interp.testing import synthetic_probe_run

    tok = tiny_tokenizer(vocab_size=280)
    handle = tiny_llama(tok, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, seed=3)
    run = synthetic_probe_run(tmp_path / "run", handle, n_good=3, n_bad=3)
    cfg = stage.LensConfig(limit=2, band="all", train_datasets=["squad_v2"], train_limit=8,
                           train_positions=4, heldout=0.5, ridge=0.1, kl_steps=2, kl_batch=8,
                           n_boot=50, progress=False)
    logs: list[str] = []
    s = stage.run(run, handle, cfg, log=logs.append)
    assert s["n_records"] == 4 and set(s["judge"]) == {"logit", "tuned"}
    assert len(s["judge"]["logit"]["logit_diff"]) == handle.n_layers + 1
    assert set(s["gen"]) == {"logit", "tuned"} and set(s["judge_first"]) == {"logit", "tuned"}
    assert all(v < 1e-4 for v in s["checks"].values()), s["checks"]
    assert s["tuned_lens"]["n_passages"]["heldout"] >= 1
    assert (run.path / "figures" / "lens_layers.png").is_file()
    assert (run.path / "figures" / "lens_attribution.png").is_file()
    parts = sorted((run.path / "lens" / "parts").glob("*.json"))
    assert len(parts) == 4
    before = {p: p.stat().st_mtime_ns for p in parts}
    again = stage._records(run, handle, cfg, overwrite=False, log=logs.append)
    assert again[2] == 0 and {p: p.stat().st_mtime_ns for p in parts} == before
    # a restored state keeps the parts and the lens's report, not its weights: with every part
    # fresh, nothing is trained again and the summary is the same
    (run.path / "lens" / "tuned_lens.safetensors").unlink()
    def no_training(*a, **k):
        raise AssertionError("the tuned lens was trained again")
    with monkeypatch.context() as m:
        m.setattr(stage, "_training_positions", no_training)
        s2 = stage.run(run, handle, cfg, log=logs.append)
    assert s2["judge"] == s["judge"] and s2["tuned_lens"] == s["tuned_lens"]
    assert not (run.path / "lens" / "tuned_lens.safetensors").exists()
    # one stale part (removed) needs the lens: it is trained again, to the same translators
    parts[0].unlink()
    s3 = stage.run(run, handle, cfg, log=logs.append)
    assert s3["judge"] == s["judge"] and (run.path / "lens" / "tuned_lens.safetensors").exists()
    assert "constant" in stage.format_summary(s) or 0 < s["judge"]["logit"][
        "final_positive_share"] < 1
    # the logit lens's intervals and the attribution's do not depend on whether the tuned
    # lens's blocks were computed beside them (one bootstrap stream per block)
    rows = stage._records(run, handle, cfg, overwrite=False, log=logs.append)[0]
    info = {**handle.info, "n_layers": handle.n_layers}
    both = stage.summarise(rows, cfg, info, None)
    plain = stage.summarise([{**r, **{t: {k: v for k, v in r[t].items() if k != "tuned"}
                                      for t in stage.TASKS if r.get(t)}} for r in rows],
                            cfg, info, None)
    assert set(plain["judge"]) == {"logit"}
    for t in stage.TASKS:
        assert plain[t]["logit"] == both[t]["logit"]
    assert plain["attribution"] == both["attribution"]


def test_the_stage_refuses_a_bad_setting_before_model_work(tmp_path):
    from interp.stages import lens as stage

    with pytest.raises(StageError):
        stage.LensConfig(heldout=1.5).validate()
    with pytest.raises(StageError):
        stage.LensConfig.from_mapping({"train_positions": 1}).validate()


def _with_final_norm(kind: str, d_model: int = 64):
    """A tiny Llama whose final norm is ``kind``, with a random gain (and bias) as trained."""
    tok = tiny_tokenizer(vocab_size=280)
    m = tiny_llama(tok, n_layers=3, d_model=d_model, n_heads=4, n_kv_heads=2, seed=3)
    gen = torch.Generator().manual_seed(1)
    norm = {"llama_rms": m.model.model.norm,
            "torch_rms": torch.nn.RMSNorm(d_model, eps=1e-6),
            "layer": torch.nn.LayerNorm(d_model, eps=1e-5),
            "layer_no_affine": torch.nn.LayerNorm(d_model, elementwise_affine=False),
            "layer_no_bias": torch.nn.LayerNorm(d_model, bias=False)}[kind]
    with torch.no_grad():
        if getattr(norm, "weight", None) is not None:
            norm.weight.uniform_(0.5, 2.0, generator=gen)
        if getattr(norm, "bias", None) is not None:
            norm.bias.normal_(0.0, 1.0, generator=gen)
    m.model.model.norm = norm.requires_grad_(False)
    return m


@pytest.mark.parametrize("kind", ["llama_rms", "torch_rms", "layer", "layer_no_affine",
                                  "layer_no_bias"])
def test_attributions_sum_to_the_logit_difference_on_every_supported_final_norm(kind):
    """The sum test on each norm the lens folds.

    RMSNorm (transformers', torch's) and LayerNorm (with gain and bias, gain only, neither);
    the lens's last layer is the model's own logits on each.
    """
    m = _with_final_norm(kind)
    prompt = render(m.tokenizer, get_template(), "eval", answer="Paris", **KW).input_ids
    r = verdict_replies(m.tokenizer)
    d = direct_logit_attribution(m, prompt, r.correct[0], r.incorrect[0])
    first = residual_stack(m, prompt, [-1])[1][0]
    assert d["total"] == pytest.approx(float(first[r.correct[0]] - first[r.incorrect[0]]),
                                       abs=1e-4)
    assert abs(d["total"]) > 0.1
    assert d["sum"] == pytest.approx(d["total"], abs=1e-4)
    assert (d["norm_bias"] != 0.0) == (kind == "layer")
    stack, logits = residual_stack(m, prompt, [-1])
    assert torch.allclose(readout(m.model).logits(stack[-1]), logits, atol=1e-4)


def test_a_layernorm_folded_as_an_rmsnorm_misses_the_total():
    """The fault this fold fixes: RMSNorm's fold on a LayerNorm model sums to another number."""
    m = _with_final_norm("layer")
    prompt = render(m.tokenizer, get_template(), "eval", answer="Paris", **KW).input_ids
    r = verdict_replies(m.tokenizer)
    d = direct_logit_attribution(m, prompt, r.correct[0], r.incorrect[0])
    ro = readout(m.model)
    assert ro.kind == "layer"
    h = residual_stack(m, prompt, [-1])[0][-1, 0].double()
    w = ro.weight.double()
    as_rms = float(torch.rsqrt(h.pow(2).mean() + 1e-5) * ro.norm.weight.double()
                   * (w[r.correct[0]] - w[r.incorrect[0]]) @ h)
    assert abs(as_rms - d["total"]) > 0.1


def test_an_unsupported_final_norm_is_refused_in_one_line():
    class ScaleNorm(torch.nn.Module):      # not a norm the lens knows
        def forward(self, x):
            return x / x.norm(dim=-1, keepdim=True)

    class GemmaRMSNorm(torch.nn.Module):   # an RMSNorm by name whose gain is 1 + weight
        def __init__(self, d):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.full((d,), 0.5))
            self.eps = 1e-6

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)

    m = _with_final_norm("llama_rms")
    prompt = render(m.tokenizer, get_template(), "eval", answer="Paris", **KW).input_ids
    r = verdict_replies(m.tokenizer)
    m.model.model.norm = ScaleNorm()
    with pytest.raises(StageError, match="final norm is a ScaleNorm;.*RMSNorm and LayerNorm"):
        readout(m.model)
    m.model.model.norm = GemmaRMSNorm(64)
    with pytest.raises(StageError, match="GemmaRMSNorm does not compute a rms norm") as e:
        direct_logit_attribution(m, prompt, r.correct[0], r.incorrect[0])
    assert "\n" not in str(e.value)


def test_tuned_lens_training_prompts_longer_than_the_models_positions_are_skipped(
        monkeypatch):
    """The tuned lens trains only on prompts the model reads; the printout counts the rest."""
    import interp.methods.lens as lens_methods
    from interp.core.errors import StageError
    from interp.stages import lens as stage

    tok = tiny_tokenizer(vocab_size=280)
    handle = tiny_llama(tok, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, seed=3)
    monkeypatch.setattr(lens_methods, "residual_stack", lambda h, ids, pos: len(ids))
    cfg = stage.LensConfig(train_datasets=["squad_v2"], train_limit=8, train_positions=4,
                           progress=False)
    every, _ = stage._training_positions(handle, cfg, print)
    room = sorted(every)[len(every) // 2]
    monkeypatch.setattr(handle.model.config, "max_position_embeddings", room)
    logs: list[str] = []
    kept, groups = stage._training_positions(handle, cfg, logs.append)
    assert kept == [n for n in every if n <= room] and len(groups) == len(kept)
    n_long = sum(n > room for n in every)
    assert n_long > 0 and logs == [
        f"[lens] {n_long} of {len(every)} tuned-lens training prompts skipped: longer than the "
        f"model's {room} positions (first: tuned-lens training prompt has "
        f"{next(n for n in every if n > room)} tokens; it exceeds the model's {room} positions)"]
    monkeypatch.setattr(handle.model.config, "max_position_embeddings", 4)
    with pytest.raises(StageError, match="no tuned-lens training prompt fits the model's 4 "):
        stage._training_positions(handle, cfg, logs.append)
