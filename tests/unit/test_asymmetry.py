"""Study 1 harness: metrics against hand computations, resume, config checks, skips."""

from __future__ import annotations

import json

import numpy as np
import pytest

from interp.asymmetry import compute_metrics, evaluate_examples, group_metrics, rerender
from interp.data import load_examples
from interp.errors import ConfigError
from interp.grading import RuleOracle
from interp.prompts import get_template
from interp.stages.asymmetry import AsymmetryConfig
from interp.stages.asymmetry import run as run_asymmetry
from interp.store import RunDir, RunDirError


def _rec(y, v, p=0.5, ds="squad_v2", i=0):
    return {"id": str(i), "dataset": ds, "status": "ok", "oracle_label": y, "verdict": v,
            "p_correct": p, "model": "m"}


def test_group_metrics_by_hand():
    """GA, EA, Delta, acceptance rates, invalid count and McNemar counts on a known table."""
    # (y*, verdict): 3 correct answers, 5 wrong answers
    rows = [(True, True), (True, True), (True, False),
            (False, True), (False, True), (False, True), (False, False), (False, None)]
    recs = [_rec(y, v, p=0.9 if y else 0.2, i=k) for k, (y, v) in enumerate(rows)]
    m = group_metrics(recs, n_boot=500)
    assert m["n"] == 8
    assert m["GA"] == pytest.approx(3 / 8)
    assert m["EA"] == pytest.approx(3 / 8)  # right: T/T, T/T, F/F
    assert m["delta"] == pytest.approx(0.0)
    assert m["acceptance_rate_correct"] == pytest.approx(2 / 3)
    assert m["acceptance_rate_incorrect"] == pytest.approx(3 / 5)
    assert m["invalid_verdicts"] == 1
    # b: gen right & judge wrong = 1 (T/F); c: gen wrong & judge right = 1 (F/F)
    assert m["mcnemar"]["b"] == 1 and m["mcnemar"]["c"] == 1
    assert m["auc_p_correct"] == pytest.approx(1.0)
    lo, hi = m["delta_ci"]
    assert lo <= m["delta"] <= hi
    assert m["GA_ci"][0] <= m["GA"] <= m["GA_ci"][1]


def test_bootstrap_ci_is_paired():
    """When the judge is right exactly when the generator is, Delta's CI collapses to 0."""
    # a judge that accepts everything is right exactly on the oracle-correct answers
    recs = [_rec(k % 3 == 0, True, i=k) for k in range(30)]
    m = group_metrics(recs, n_boot=300)
    assert m["delta_ci"] == [0.0, 0.0]


def test_compute_metrics_per_dataset():
    """Per-dataset groups and the overall group; skipped records are counted apart."""
    recs = [_rec(True, True, ds="a", i=1), _rec(False, True, ds="b", i=2),
            {"id": "3", "dataset": "b", "status": "skipped", "reason": "too long"}]
    m = compute_metrics(recs, n_boot=50)
    assert m["per_dataset"]["a"]["GA"] == 1.0
    assert m["per_dataset"]["b"]["acceptance_rate_incorrect"] == 1.0
    assert m["overall"]["n"] == 2
    assert m["skipped"] == {"a": 0, "b": 1}


def test_evaluate_examples_records(tiny):
    """Records carry the fields the later studies read, with consistent types."""
    exs = load_examples("squad_v2", limit=2)
    recs = evaluate_examples(tiny, exs, template=get_template(), oracle=RuleOracle(),
                             max_new_tokens=4, verdict_max_new_tokens=3, batch_size=2)
    for r, ex in zip(recs, exs):
        assert r["status"] == "ok" and r["id"] == ex.id
        assert isinstance(r["oracle_label"], bool)
        assert r["verdict"] in (True, False, None)
        assert 0.0 <= r["p_correct"] <= 1.0
        assert r["p_correct"] == pytest.approx(1 / (1 + np.exp(-r["logit_diff"])), abs=1e-6)
        spans = r["prompts"]["eval"]["token_spans"]
        assert set(spans) >= {"context", "question"}
        assert r["prompts"]["gen"]["n_tokens"] < r["prompts"]["eval"]["n_tokens"]


def test_too_long_prompt_is_skipped_with_reason(tiny):
    """A prompt beyond the model's positions is skipped and the reason recorded."""
    exs = load_examples("musique", limit=1)
    old = tiny.model.config.max_position_embeddings
    tiny.model.config.max_position_embeddings = 256
    try:
        (r,) = evaluate_examples(tiny, exs, template=get_template(), oracle=RuleOracle(),
                                 max_new_tokens=4, batch_size=1)
    finally:
        tiny.model.config.max_position_embeddings = old
    assert r["status"] == "skipped" and "256 positions" in r["reason"]


def test_run_resumes_and_refuses_other_config(tiny, tmp_path):
    """A larger limit adds only new records; a different key config is refused."""
    cfg = AsymmetryConfig(model="tiny-llama", datasets=["squad_v2"], limit=2, batch_size=2,
                          max_new_tokens=4, verdict_max_new_tokens=3, n_boot=50)
    m = run_asymmetry(cfg, tmp_path, handle=tiny, log=lambda s: None)
    assert m["overall"]["n"] == 2
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    # simulate a crash mid-write: a cut last line is repaired and redone
    with open(tmp_path / "records.jsonl", "a") as f:
        f.write('{"id": "cut')
    cfg.limit = 3
    m = run_asymmetry(cfg, tmp_path, handle=tiny, log=lambda s: None)
    recs = RunDir(tmp_path).read_records()
    assert m["overall"]["n"] == 3 and len(recs) == 3
    assert [json.loads(x)["id"] for x in lines] == [r["id"] for r in recs[:2]]
    assert (tmp_path / "figures" / "asymmetry.png").exists()
    bad = AsymmetryConfig(**{**cfg.__dict__, "template": "reference"})
    with pytest.raises(RunDirError, match="template"):
        run_asymmetry(bad, tmp_path, handle=tiny, log=lambda s: None)
    # extending the run with another dataset: metrics (and the manifest) cover both
    more = AsymmetryConfig(**{**cfg.__dict__, "datasets": ["drop"], "limit": 1})
    m = run_asymmetry(more, tmp_path, handle=tiny, log=lambda s: None)
    assert set(m["per_dataset"]) == {"squad_v2", "drop"} and m["overall"]["n"] == 4
    assert RunDir(tmp_path).manifest()["config"]["datasets"] == ["squad_v2", "drop"]


def test_unknown_config_key():
    """Config tables with unknown keys are refused with the known ones listed."""
    with pytest.raises(ValueError, match="known"):
        AsymmetryConfig.from_mapping({"modle": "x"})


def test_run_config_runs_stages_and_copies_figures_and_tables(tiny, tmp_path):
    """`interp run CONFIG`: grid + attention stage; figures and tables land in the figures folder.

    An unknown stage, or an unknown key in a stage table, is refused before anything runs.
    """
    from interp.pipeline import run_config

    model_dir = tmp_path / "tiny-model"
    tiny.model.save_pretrained(model_dir)
    tiny.tokenizer.save_pretrained(model_dir)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'''name = "t"
out = "{tmp_path / 'runs'}"
figures = "{tmp_path / 'figs'}"
[asymmetry]
models = ["{model_dir}"]
datasets = ["squad_v2"]
limit = 2
max_new_tokens = 4
n_boot = 50
[attention]
layers = "all"
n_boot = 50
''')
    summary = run_config(cfg)
    (spec, entry), = summary.items()
    assert entry["metrics"]["overall"]["n"] == 2
    figs = {p.name for p in (tmp_path / "figs").iterdir()}
    assert {"asymmetry.png", "asymmetry_metrics.json", "attention_summary.json",
            "attention_layerwise.png"} <= figs
    copied = json.loads((tmp_path / "figs" / "asymmetry_metrics.json").read_text())
    assert copied == json.loads((tmp_path / "runs").glob("*/metrics.json").__next__().read_text())
    bad = tmp_path / "bad.toml"
    bad.write_text(cfg.read_text() + "[atention]\nlayers = 'all'\n")
    with pytest.raises(ConfigError, match=r"unknown keys or stages \['atention'\]"):
        run_config(bad)
    # a bad key inside a stage table is refused before any model is loaded
    bad.write_text(cfg.read_text().replace('layers = "all"', 'layer = "all"'))
    with pytest.raises(ConfigError, match=r"\[attention\]: unknown config keys \['layer'\]"):
        run_config(bad)


def test_rerender_checks_the_stored_spans(tiny, tmp_path):
    """A record re-renders to its stored spans; a changed span names the record."""
    cfg = AsymmetryConfig(model="tiny-llama", datasets=["squad_v2"], limit=1, max_new_tokens=4,
                          verdict_max_new_tokens=3, n_boot=10)
    run_asymmetry(cfg, tmp_path, handle=tiny, log=lambda s: None)
    (rec,) = RunDir(tmp_path).read_records()
    for task in ("gen", "eval"):
        assert rerender(rec, task, tiny.tokenizer).to_record() == rec["prompts"][task]
    rec["prompts"]["eval"]["token_spans"]["question"][0] += 1
    with pytest.raises(RunDirError, match=f"record squad_v2/{rec['id']}: the re-rendered eval"):
        rerender(rec, "eval", tiny.tokenizer)
    del rec["prompts"]["gen"]
    with pytest.raises(RunDirError, match="has no prompts.gen"):
        rerender(rec, "gen", tiny.tokenizer)
