"""Tests of Study 2: last-token attention rows, span mass, tables, backends."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from interp.attention import (
    SPANS,
    AttentionConfig,
    AttentionError,
    load_masses,
    parse_layers,
    record_prompts,
    record_rows,
    record_run,
    run_attention,
    span_mass,
    summarize,
    top_heads,
    write_tables,
)
from interp.prompts import get_template, render
from interp.store import RunDir, RunDirError


def _prompt(tokenizer, task="eval"):
    return render(tokenizer, get_template("default"), task,
                  context="The Eiffel Tower is in Paris. It was finished in 1889.",
                  question="When was the Eiffel Tower finished?", answer="1889")


# --------------------------------------------------------------------------------- unit ---


def test_parse_layers():
    assert parse_layers("last8", 32) == list(range(24, 32))
    assert parse_layers(None, 30) == list(range(22, 30))
    assert parse_layers("24-31", 32) == list(range(24, 32))
    assert parse_layers("all", 3) == [0, 1, 2]
    assert parse_layers("0-1,5", 8) == [0, 1, 5]
    assert parse_layers([-1], 4) == [3]
    for bad in ("24-35", "last40", "30", "x-y", "5-3"):
        with pytest.raises(AttentionError, match="valid layers are 0-29|cannot parse"):
            parse_layers(bad, 30)


def test_hf_rows_are_exact_and_sum_to_one(tiny, tokenizer):
    ids = _prompt(tokenizer).input_ids
    hf = record_rows(tiny, ids).rows
    eager = record_rows(tiny, ids, backend="eager").rows
    assert hf.shape == (tiny.n_layers, tiny.n_heads, len(ids))
    torch.testing.assert_close(hf.sum(-1), torch.ones(hf.shape[:2]), atol=1e-5, rtol=0)
    assert (hf - eager).abs().max().item() <= 1e-5
    # the handle's kernel is restored after recording
    assert tiny.model.config._attn_implementation == "sdpa"


def test_gqa_rows_match_manual_attention(tiny, tokenizer):
    """Ground truth computed by hand from hooked q/k projections and RoPE (layer 0)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    ids = torch.tensor(_prompt(tokenizer).input_ids)[None]
    model = tiny.model
    attn = model.model.layers[0].self_attn
    seen = {}
    h = model.model.layers[0].input_layernorm.register_forward_hook(
        lambda m, i, o: seen.setdefault("x", o))
    with torch.no_grad():
        model(ids)
    h.remove()
    x = seen["x"]
    d = attn.head_dim
    q = attn.q_proj(x).view(1, -1, tiny.n_heads, d).transpose(1, 2)
    k = attn.k_proj(x).view(1, -1, tiny.n_kv_heads, d).transpose(1, 2)
    pos = torch.arange(ids.shape[1])[None]
    cos, sin = model.model.rotary_emb(x, pos)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    group = tiny.n_heads // tiny.n_kv_heads
    want = torch.stack([torch.softmax(q[0, hq, -1] @ k[0, hq // group].T / d ** 0.5, -1)
                        for hq in range(tiny.n_heads)])
    got = record_rows(tiny, ids[0]).rows[0]
    assert (got - want).abs().max().item() < 1e-5


def test_span_mass_sums_to_one_and_matches_positions(tiny, tokenizer):
    p = _prompt(tokenizer)
    assert set(p.labels) <= set(SPANS)
    rows = record_rows(tiny, p.input_ids).rows
    m = span_mass(rows, p.labels)
    assert m.shape == (tiny.n_layers, tiny.n_heads, 4)
    torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:2]), atol=1e-5, rtol=0)
    for j, s in enumerate(SPANS):
        pos = p.span_positions(s)
        torch.testing.assert_close(m[..., j], rows[..., pos].sum(-1), atol=1e-6, rtol=0)
    g = _prompt(tokenizer, "gen")
    mg = span_mass(record_rows(tiny, g.input_ids).rows, g.labels)
    assert mg[..., SPANS.index("candidate")].abs().max() == 0
    with pytest.raises(AttentionError, match="labels"):
        span_mass(rows, p.labels[:-1])


def test_activations_are_consistent(tiny, tokenizer):
    p = _prompt(tokenizer)
    rec = record_rows(tiny, p.input_ids, act_layers=[0, 1], patterns=True)
    a, n = rec.acts, len(p.input_ids)
    assert rec.layers == [0, 1]
    assert a["resid_pre"].shape == (2, n, 64) and a["resid_post"].shape == (2, n, 64)
    assert a["z"].shape == (2, n, tiny.n_heads, 64 // tiny.n_heads)
    assert a["result_last"].shape == (2, tiny.n_heads, 64)
    assert a["pattern"].shape == (2, tiny.n_heads, n, n)
    torch.testing.assert_close(a["resid_post"][0], a["resid_pre"][1])
    torch.testing.assert_close(a["pattern"][:, :, -1, :], rec.rows[[0, 1]], atol=1e-6, rtol=0)
    # per-head results at the last position sum to the attention block's output there
    out = {}
    hk = tiny.model.model.layers[1].self_attn.o_proj.register_forward_hook(
        lambda m, i, o: out.setdefault("o", o))
    with torch.no_grad():
        tiny.model(torch.tensor(p.input_ids)[None])
    hk.remove()
    torch.testing.assert_close(a["result_last"][1].sum(0), out["o"][0, -1], atol=1e-5,
                               rtol=1e-4)
    with pytest.raises(AttentionError, match="hf"):
        record_rows(tiny, p.input_ids, backend="eager", act_layers=[0])


def test_summary_against_manual_means():
    rng = np.random.default_rng(0)
    n, n_l, n_h = 6, 4, 3
    mass = {t: rng.dirichlet(np.ones(4), size=(n, n_l, n_h)).astype(np.float32)
            for t in ("gen", "eval")}
    records = [{"id": str(i), "dataset": "a" if i < 4 else "b", "oracle_label": i % 2 == 0,
                "verdict": [True, False][i % 2] if i < 5 else None} for i in range(n)]
    s = summarize(records, mass, SPANS, [2, 3], n_boot=200)
    sel = slice(0, 4)
    g = mass["gen"][sel][:, 2:4, :, 0].mean()
    e = mass["eval"][sel][:, 2:4, :, 0].mean()
    a = s["per_dataset"]["a"]
    assert a["n"] == 4
    assert a["gen"]["context"]["mean"] == pytest.approx(g, rel=1e-5)
    assert a["context_ratio"] == pytest.approx(g / e, rel=1e-5)
    lo, hi = a["gen"]["context"]["ci"]
    assert lo <= g <= hi
    assert sum(a["gen"][sp]["mean"] for sp in SPANS) == pytest.approx(1.0, abs=1e-5)
    assert a["by_oracle_label"]["correct"]["n"] == 2
    assert s["overall"]["by_verdict"]["none"]["n"] == 1
    assert s["overall"]["by_verdict"]["Incorrect"]["n"] == 2
    assert s["overall"]["by_verdict"]["Correct"]["n"] == 3
    assert np.allclose(s["overall"]["layerwise"]["eval"]["context"]["mean"],
                       mass["eval"][..., 0].mean(axis=(0, 2)), atol=1e-6)
    heads = top_heads(s, top=3)
    hc = mass["gen"][..., 0].mean(0)
    assert heads["gen"][0]["gen"] == pytest.approx(hc.max(), rel=1e-5)
    assert len(heads["diff"]) == 3
    with pytest.raises(AttentionError, match="dataset"):
        top_heads(s, dataset="nope")


def test_config_refuses_unknown_keys():
    with pytest.raises(AttentionError, match=r"\[attention\]: unknown config keys"):
        AttentionConfig.from_mapping({"layer": "last8"})


# -------------------------------------------------------------------------- integration ---


@pytest.mark.integration
def test_three_backends_agree(bundled, quick_run):
    rec = quick_run.read_records()[0]
    p = record_prompts(rec, bundled)["eval"]
    n = 160  # a prefix keeps the test fast; it still holds template, context and question
    ids, labels = p.input_ids[:n], p.labels[:n]
    assert {"template", "context"} <= set(labels)
    masses = {b: span_mass(record_rows(bundled, ids, backend=b).rows, labels)
              for b in ("hf", "tlens", "nnsight")}
    for b in ("tlens", "nnsight"):
        assert (masses[b] - masses["hf"]).abs().max().item() <= 1e-4, b
    assert bundled.model.config._attn_implementation == "sdpa"
    # the bridge wraps a copy: the handle still dispatches through AttentionInterface
    assert record_rows(bundled, ids[:20]).rows.shape[0] == bundled.n_layers


@pytest.mark.integration
def test_run_tables_resume_and_bad_input(bundled, quick_run, tmp_path):
    from typer.testing import CliRunner

    import interp.cli as cli

    run = RunDir(shutil.copytree(quick_run.path, tmp_path / "run"))
    cfg = AttentionConfig(limit=1, n_boot=50, layers="24-29")
    s = run_attention(run, bundled, cfg, log=lambda m: None)
    assert set(s["per_dataset"]) == {"squad_v2", "hotpotqa"}
    import pandas as pd

    df = pd.read_parquet(run.path / "attention" / "span_mass.parquet")
    assert set(df.columns) == {"id", "dataset", "task", "layer", "head", "span", "mass"}
    tot = df.groupby(["id", "task", "layer", "head"])["mass"].sum()
    assert len(tot) == 2 * 2 * bundled.n_layers * bundled.n_heads
    assert np.allclose(tot.values, 1.0, atol=1e-4)
    for name in ("attention_layerwise", "attention_heads_context", "attention_context_ratio"):
        assert (run.path / "figures" / f"{name}.png").exists()
    # resume: nothing recorded again; a larger limit only adds new records
    assert record_run(run, bundled, cfg, log=lambda m: None) == 0
    # the CLI lists heads from the stored summary
    if not any(c.name == "heads" for c in cli.app.registered_commands):
        cli._register_all()
    res = CliRunner().invoke(cli.app, ["heads", "--run", str(run.path), "--top", "3"])
    assert res.exit_code == 0, res.output
    assert "gen minus eval" in res.output
    res = CliRunner().invoke(cli.app, ["heads", "--run", str(run.path), "--layers", "31"])
    assert res.exit_code == 2 and "valid layers are 0-29" in res.output
    # a record whose stored spans do not match names the record
    recs = run.read_records(status=None)
    bad = recs[1]
    bad["prompts"]["eval"]["token_spans"]["context"][0] += 1
    run.records_path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(AttentionError, match=bad["id"]):
        record_run(run, bundled, AttentionConfig(limit=2), log=lambda m: None)
    # layers outside the model name the valid range
    with pytest.raises(AttentionError, match="valid layers are 0-29"):
        write_tables(run, AttentionConfig(layers="28-33", figures=False), n_layers=30)
    # a run without records
    empty = RunDir(tmp_path / "empty")
    empty.path.mkdir()
    shutil.copy(run.manifest_path, empty.manifest_path)
    empty.records_path.write_text("")
    with pytest.raises(RunDirError, match="no ok record"):
        record_run(empty, bundled, cfg, log=lambda m: None)
    with pytest.raises(RunDirError, match="no attention recordings"):
        load_masses(empty)
