"""Study 2: span mass, activations, the summary, and the stage on a tiny run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from interp.analysis.span_mass import SPANS, span_mass, summarize, top_heads
from interp.core.errors import ConfigError, LayerSpecError, StageError
from interp.core.vocab import attention_backend
from interp.hooks.recorder import record_rows
from interp.judging.prompts import get_template, render
from interp.stages import attention as stage
from interp.store.rundir import RunDir
from interp.testing import synthetic_probe_run


def _prompt(tokenizer, task="eval"):
    return render(tokenizer, get_template("default"), task,
                  context="The Eiffel Tower is in Paris. It was finished in 1889.",
                  question="When was the Eiffel Tower finished?", answer="1889")


def test_span_mass_sums_to_one_and_matches_positions(tiny):
    p = _prompt(tiny.tokenizer)
    assert set(p.labels) <= set(SPANS)
    rows = record_rows(tiny, p.input_ids).rows
    m = span_mass(rows, p.labels)
    assert m.shape == (tiny.n_layers, tiny.n_heads, 4)
    torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:2]), atol=1e-5, rtol=0)
    for j, s in enumerate(SPANS):
        pos = p.span_positions(s)
        torch.testing.assert_close(m[..., j], rows[..., pos].sum(-1), atol=1e-6, rtol=0)
    g = _prompt(tiny.tokenizer, "gen")
    mg = span_mass(record_rows(tiny, g.input_ids).rows, g.labels)
    assert mg[..., SPANS.index("candidate")].abs().max() == 0
    with pytest.raises(StageError, match="labels"):
        span_mass(rows, p.labels[:-1])


def test_activations_are_consistent(tiny):
    p = _prompt(tiny.tokenizer)
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
    with pytest.raises(StageError, match="exact recorder only .backend='hf' without "
                       "attn., not backend='hf', attn='eager'"):
        record_rows(tiny, p.input_ids, backend="hf", attn="eager", act_layers=[0])
    with pytest.raises(StageError, match="exact recorder only.*not backend='nnsight'"):
        record_rows(tiny, p.input_ids, backend="nnsight", act_layers=[0])
    with pytest.raises(StageError, match="unknown backend 'eager'.*write backend='hf', "
                       "attn='eager'"):
        record_rows(tiny, p.input_ids, backend="eager")
    with pytest.raises(StageError, match="attn='eager': the 'hf' backend only, not "
                       "'nnsight'"):
        record_rows(tiny, p.input_ids, backend="nnsight", attn="eager")
    with pytest.raises(StageError, match="attn='sdpa': the recorder's check path is "
                       "attn='eager'"):
        record_rows(tiny, p.input_ids, attn="sdpa")
    with pytest.raises(StageError, match="unknown backend 'tlens'"):
        record_rows(tiny, p.input_ids, backend="tlens")


def test_summary_against_manual_means():
    rng = np.random.default_rng(0)
    n, n_l, n_h = 6, 4, 3
    mass = {t: rng.dirichlet(np.ones(4), size=(n, n_l, n_h)).astype(np.float32)
            for t in ("gen", "eval")}
    spans = {"gen": {"n_tokens": 40, "token_spans": {"context": [5, 25], "question": [26, 30]}},
             "eval": {"n_tokens": 50, "token_spans": {"context": [5, 25], "question": [26, 30],
                                                      "candidate": [33, 35]}}}
    # records 0-1 and 2-3 share a passage: dataset "a" has 2 passages, "b" 2, overall 4
    records = [{"id": str(i), "dataset": "a" if i < 4 else "b", "oracle_label": i % 2 == 0,
                "context": f"passage {min(i // 2, 2) if i < 4 else i}", "prompts": spans,
                "verdict": [True, False][i % 2] if i < 5 else None} for i in range(n)]
    s = summarize(records, mass, SPANS, [2, 3], n_boot=200)
    sel = slice(0, 4)
    g = mass["gen"][sel][:, 2:4, :, 0].mean()
    e = mass["eval"][sel][:, 2:4, :, 0].mean()
    a = s["per_dataset"]["a"]
    assert a["n"] == 4 and a["n_passages"] == 2 and s["overall"]["n_passages"] == 4
    assert a["few_passages"] is True and a["note"].startswith("only 2 passages")
    assert s["definitions"]["context_ratio"].startswith("ratio of means")
    assert a["gen"]["context"]["mean"] == pytest.approx(g, rel=1e-5)
    assert a["context_ratio"] == pytest.approx(g / e, rel=1e-5)
    lo, hi = a["gen"]["context"]["ci"]
    assert lo <= g <= hi
    # per record band means -> a mean of log ratios (geometric), content shares, mass per token
    bg = mass["gen"][sel][:, 2:4].mean(axis=(1, 2)).astype(np.float64)  # [4, span]
    be = mass["eval"][sel][:, 2:4].mean(axis=(1, 2)).astype(np.float64)
    geo = np.exp(np.mean(np.log(bg[:, 0] / be[:, 0])))
    assert a["context_ratio_geometric"] == pytest.approx(geo, rel=1e-5)
    assert a["context_log_ratio"] == pytest.approx(np.log(geo), rel=1e-5)
    share_g = bg[:, 0] / bg[:, :3].sum(1)   # random masses; a real gen prompt has no candidate
    share_e = be[:, 0] / be[:, :3].sum(1)
    assert a["content_context_share"]["eval"]["mean"] == pytest.approx(share_e.mean(), rel=1e-5)
    assert a["content_context_share_ratio"] == pytest.approx(share_g.mean() / share_e.mean(),
                                                             rel=1e-5)
    # context / (context + question): the spans both prompts have (SPANS[0:2])
    cq_g, cq_e = bg[:, 0] / bg[:, :2].sum(1), be[:, 0] / be[:, :2].sum(1)
    assert a["context_question_share"]["gen"]["mean"] == pytest.approx(cq_g.mean(), rel=1e-5)
    assert a["context_question_share_ratio"] == pytest.approx(cq_g.mean() / cq_e.mean(),
                                                              rel=1e-5)
    mpt = a["mass_per_token"]
    assert mpt["eval"]["candidate"]["mean"] == pytest.approx((be[:, 2] / 2).mean(), rel=1e-5)
    assert mpt["eval"]["template"]["mean"] == pytest.approx((be[:, 3] / 24).mean(), rel=1e-5)
    assert mpt["gen"]["template"]["mean"] == pytest.approx((bg[:, 3] / 16).mean(), rel=1e-5)
    assert mpt["gen"]["candidate"] == {"mean": None, "ci": None}
    for key in ("context_ratio", "context_ratio_geometric", "content_context_share_ratio",
                "context_question_share_ratio"):
        lo, hi = a[f"{key}_ci"]
        assert lo <= a[key] <= hi
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
    with pytest.raises(StageError, match="dataset"):
        top_heads(s, dataset="nope")


def test_config_refuses_unknown_keys_and_backends():
    with pytest.raises(ConfigError, match=r"\[attention\]: unknown config keys"):
        stage.AttentionConfig.from_mapping({"layer": "last8"})
    with pytest.raises(StageError, match="unknown backend 'tlens'; use one of"):
        stage.AttentionConfig.from_mapping({"backend": "tlens"})
    # "eager", a backend value before it became an attention option, still reads as one
    assert stage.AttentionConfig.from_mapping({"backend": "eager"}).backend == "eager"
    assert attention_backend("eager", StageError.of("attention")) == ("hf", "eager")
    assert attention_backend("nnsight", StageError.of("attention")) == ("nnsight", None)


@pytest.fixture(scope="module")
def tiny_run(tiny, tmp_path_factory):
    """Two ok records per dataset (hotpotqa, squad_v2) with their prompts' spans."""
    return synthetic_probe_run(tmp_path_factory.mktemp("tiny_run") / "run", tiny, 2, 2)


def test_stage_tables_resume_and_freshness(tiny, tiny_run, tmp_path):
    import shutil

    run = RunDir(shutil.copytree(tiny_run.path, tmp_path / "run"))
    cfg = stage.AttentionConfig(band="last2", limit=1, n_boot=20, figures=False)
    s = stage.run(run, tiny, cfg, log=lambda m: None)
    assert set(s["per_dataset"]) == {"squad_v2", "hotpotqa"} and s["band"] == [0, 1]
    df = pd.read_parquet(run.path / "attention" / "span_mass.parquet")
    tot = df.groupby(["id", "task", "layer", "head"])["mass"].sum()
    assert len(tot) == 2 * 2 * tiny.n_layers * tiny.n_heads
    assert np.allclose(tot.values, 1.0, atol=1e-5)
    # resume: fresh recordings are kept; rows asked for later, or another model, redo them
    assert stage.record(run, tiny, cfg, log=lambda m: None) == 0
    rows = stage.AttentionConfig(band="last2", limit=1, save_rows=True)
    assert stage.record(run, tiny, rows, log=lambda m: None) == 2
    assert stage.record(run, tiny, rows, log=lambda m: None) == 0
    other = type(tiny)(model=tiny.model, tokenizer=tiny.tokenizer, spec=tiny.spec,
                       info={**tiny.info, "sha256": "f" * 64})
    assert stage.record(run, other, cfg, log=lambda m: None) == 2
    # a larger limit only adds the new records
    more = stage.AttentionConfig(band="all", limit=2)
    assert stage.record(run, other, more, log=lambda m: None) == 2
    # the default band adapts to the 2-layer model; a band the user chose is checked
    assert stage.write_tables(run, stage.AttentionConfig(figures=False))["band"] == [0, 1]
    with pytest.raises(LayerSpecError, match="cannot take the last 3"):
        stage.write_tables(run, stage.AttentionConfig(band="last3", figures=False))


def test_a_non_finite_value_in_a_recording_is_named_and_nothing_is_nulled(tiny, tiny_run,
                                                                         tmp_path):
    """``interp attention`` (its tables) on a recording holding a NaN: one line, nothing lost.

    The line names the file, the record and the hook point; the finished summary stays.
    """
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    from interp.core.errors import RunDirError
    from interp.stages.stored import rows_path

    run = RunDir(shutil.copytree(tiny_run.path, tmp_path / "run"))
    cfg = stage.AttentionConfig(band="last2", limit=1, n_boot=20, figures=False)
    stage.run(run, tiny, cfg, log=lambda m: None)
    summary = (run.path / "attention/summary.json").read_bytes()
    rec = [r for r in run.read_records() if rows_path(run, r).exists()][-1]
    path = rows_path(run, rec)
    with safe_open(str(path), "pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    tensors["mass.eval"][1, 0, 0] = float("nan")
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(RunDirError) as err:
        stage.write_tables(run, cfg)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(
        f"{path}: mass.eval of record {rec['dataset']}/{rec['id']} holds 1 non-finite value(s) "
        f"(NaN first, at index [1, 0, 0]): a damaged or diverged part; delete {path}")
    assert (run.path / "attention/summary.json").read_bytes() == summary


def test_finite_names_the_record_of_a_row_and_passes_integers():
    import torch

    from interp.core.errors import RunDirError
    from interp.core.io import finite

    x = torch.zeros(3, 4)
    x[2, 1] = float("inf")
    with pytest.raises(RunDirError, match=r"f.safetensors: last of record squad_v2/c holds 1 "
                                          r"non-finite value\(s\) \(Inf first, at index \[2, 1\]"):
        finite(x, path="f.safetensors", name="last", rows=["squad_v2/a", "squad_v2/b",
                                                            "squad_v2/c"])
    assert finite(torch.arange(3), path="f", name="ids") is not None
    assert finite(np.ones(2), path="f", name="w") is not None
