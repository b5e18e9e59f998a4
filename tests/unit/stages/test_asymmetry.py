"""Study 1 harness: metrics against hand computations, resume, config checks, skips."""

from __future__ import annotations

import json

import numpy as np
import pytest

from interp.core.errors import ConfigError, RunDirError
from interp.data import load_examples
from interp.judging.grading import RuleOracle
from interp.judging.prompts import get_template, rerender
from interp.judging.verdict import score_verdicts
from interp.methods.asymmetry import compute_metrics, evaluate_examples, group_metrics
from interp.stages.asymmetry import AsymmetryConfig
from interp.stages.asymmetry import run as run_asymmetry
from interp.store.rundir import RunDir


def _rec(y, v, p=0.5, ds="squad_v2", i=0, ctx=None):
    ld = float(np.log(p / (1 - p)))
    return {"id": str(i), "dataset": ds, "status": "ok", "oracle_label": y, "verdict": v,
            "context": f"passage {i}" if ctx is None else ctx,
            "logprob_correct": float(np.log(0.4 * p)),
            "logprob_incorrect": float(np.log(0.4 * (1 - p))),
            "logit_diff": ld, "p_correct": p, "verdict_coverage": 0.4, "model": "m"}


def test_group_metrics_by_hand():
    """GA, EA, EA_forced, Delta, verdict split, acceptance rates and McNemar on a known table."""
    # (y*, verdict, p_correct): 3 correct answers, 5 wrong answers
    rows = [(True, True, 0.9), (True, True, 0.3), (True, False, 0.8),
            (False, True, 0.6), (False, True, 0.2), (False, True, 0.1), (False, False, 0.7),
            (False, None, 0.4)]
    recs = [_rec(y, v, p=p, i=k) for k, (y, v, p) in enumerate(rows)]
    m = group_metrics(recs, n_boot=500)
    assert m["n"] == 8 and m["n_passages"] == 8
    assert m["few_passages"] is True and m["note"].startswith("only 8 passages (< 10)")
    assert m["GA"] == pytest.approx(3 / 8)
    assert m["EA"] == pytest.approx(3 / 8)  # right: T/T, T/T, F/F
    # forced choice p > 0.5: T/.9 T/.8 right; F/.2 F/.1 F/.4 right -> 5 of 8
    assert m["EA_forced"] == pytest.approx(5 / 8)
    assert m["delta"] == pytest.approx(0.0)
    assert m["delta_forced"] == pytest.approx(2 / 8)
    # on the 7 records with a parsed verdict: EA 3/7, GA 3/7 (the None one was a wrong answer)
    assert (m["n_valid"], m["EA_valid"], m["GA_valid"]) == (7, pytest.approx(3 / 7),
                                                          pytest.approx(3 / 7))
    assert m["delta_valid"] == pytest.approx(0.0)
    assert m["n_passages_valid"] == 7  # the passages behind delta_valid, not all 8
    drop = group_metrics([r for r in recs if r["verdict"] is not None], n_boot=0)
    assert drop["delta"] == pytest.approx(m["delta_valid"])   # = dropping those records
    # a right answer without a verdict: counted wrong, it hides the judge's edge
    hid = group_metrics([_rec(True, None, i=0), _rec(False, False, i=1),
                         _rec(False, True, i=2)], n_boot=0)
    assert hid["delta"] == pytest.approx(1 / 3 - 1 / 3)
    assert (hid["EA_valid"], hid["GA_valid"], hid["delta_valid"]) == (0.5, 0.0, 0.5)
    assert m["verdicts"] == {"accept": 5, "reject": 2, "none": 1}
    assert sum(m["verdicts"].values()) == m["n"]
    assert m["verdict_shares"] == {"accept": 5 / 8, "reject": 2 / 8, "none": 1 / 8}
    assert m["verdicts_by_label"] == {"correct": {"accept": 2, "reject": 1, "none": 0},
                                      "incorrect": {"accept": 3, "reject": 1, "none": 1}}
    assert m["invalid_verdicts"] == 1
    assert m["acceptance_rate"] == pytest.approx(5 / 8)
    assert m["acceptance_rate_valid"] == pytest.approx(5 / 7)
    assert m["acceptance_rate_correct"] == pytest.approx(2 / 3)
    assert m["acceptance_rate_incorrect"] == pytest.approx(3 / 5)
    assert m["acceptance_rate_incorrect_valid"] == pytest.approx(3 / 4)
    assert m["acceptance_rate_correct_forced"] == pytest.approx(2 / 3)
    assert m["acceptance_rate_incorrect_forced"] == pytest.approx(2 / 5)
    assert m["mean_verdict_coverage"] == pytest.approx(0.4)
    # b: gen right & judge wrong = 1 (T/F); c: gen wrong & judge right = 1 (F/F)
    assert m["mcnemar"]["b"] == 1 and m["mcnemar"]["c"] == 1
    # pairs (y* Correct, y* Incorrect) ranked right: 0.9 beats 5, 0.3 beats 2, 0.8 beats 5
    assert m["auc_logit_diff"] == pytest.approx(12 / 15)
    lo, hi = m["auc_logit_diff_ci"]
    assert 0 <= lo <= 12 / 15 <= hi <= 1
    for key in ("delta", "delta_forced", "delta_valid", "GA", "EA_forced",
                "acceptance_rate_incorrect"):
        lo, hi = m[f"{key}_ci"]
        assert lo <= m[key] <= hi


def test_bootstrap_ci_is_paired():
    """When the judge is right exactly when the generator is, Delta's CI collapses to 0."""
    # a judge that accepts everything is right exactly on the oracle-correct answers
    recs = [_rec(k % 3 == 0, True, i=k) for k in range(30)]
    m = group_metrics(recs, n_boot=300)
    assert m["delta_ci"] == [0.0, 0.0]
    assert m["n_passages"] == 30 and m["few_passages"] is False and m["note"] is None


def test_metrics_resample_passages():
    """Questions sharing a passage are resampled together.

    3 passages give a wider Delta CI than the same records each on its own passage, and the
    group carries the flag.
    """
    recs = [_rec(k < 10 or (10 <= k < 20 and k % 2 == 0), k >= 10, i=k) for k in range(30)]
    alone = group_metrics(recs, n_boot=2000)
    shared = group_metrics([{**r, "context": f"passage {int(r['id']) // 10}"} for r in recs],
                           n_boot=2000)
    assert (alone["n_passages"], shared["n_passages"]) == (30, 3)
    assert shared["few_passages"] and not alone["few_passages"]
    assert alone["GA"] == shared["GA"] == pytest.approx(15 / 30)

    def width(ci):
        return ci[1] - ci[0]

    assert width(shared["delta_ci"]) > 1.5 * width(alone["delta_ci"])
    assert width(shared["GA_ci"]) > 1.5 * width(alone["GA_ci"])


def test_records_without_the_whole_reply_score_are_refused():
    old = {k: v for k, v in _rec(True, True).items() if k != "verdict_coverage"}
    with pytest.raises(RunDirError, match="no whole-reply verdict score"):
        group_metrics([old])


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
        assert 0.0 < r["verdict_coverage"] <= 1.0
        assert r["logit_diff"] == pytest.approx(r["logprob_correct"] - r["logprob_incorrect"])
        assert r["verdict_source"] in ("word", "restated_answer", "none")
    # the record's score is the whole-reply score of its eval prompt (interp.judging.verdict)
    ids = [rerender(r, "eval", tiny.tokenizer).input_ids for r in recs]
    sc = score_verdicts(tiny, ids).rows()
    for r, row in zip(recs, sc):
        for k, v in row.items():
            assert r[k] == pytest.approx(v, abs=1e-6)
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
    m = run_asymmetry(tmp_path, tiny, cfg, log=lambda s: None)
    assert m["overall"]["n"] == 2
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    # simulate a crash mid-write: a cut last line is repaired and redone
    with open(tmp_path / "records.jsonl", "a") as f:
        f.write('{"id": "cut')
    cfg.limit = 3
    m = run_asymmetry(tmp_path, tiny, cfg, log=lambda s: None)
    recs = RunDir(tmp_path).read_records()
    assert m["overall"]["n"] == 3 and len(recs) == 3
    assert [json.loads(x)["id"] for x in lines] == [r["id"] for r in recs[:2]]
    assert (tmp_path / "figures" / "asymmetry.png").exists()
    bad = AsymmetryConfig(**{**cfg.__dict__, "template": "reference"})
    with pytest.raises(RunDirError, match="template"):
        run_asymmetry(tmp_path, tiny, bad, log=lambda s: None)
    # extending the run with another dataset: metrics (and the manifest) cover both
    more = AsymmetryConfig(**{**cfg.__dict__, "datasets": ["drop"], "limit": 1})
    m = run_asymmetry(tmp_path, tiny, more, log=lambda s: None)
    assert set(m["per_dataset"]) == {"squad_v2", "drop"} and m["overall"]["n"] == 4
    assert RunDir(tmp_path).manifest()["config"]["datasets"] == ["squad_v2", "drop"]
    # metrics.json recomputed by hand from records.jsonl
    written = json.loads((tmp_path / "metrics.json").read_text())
    recs = RunDir(tmp_path).read_records()
    for name, group in [*written["per_dataset"].items(), ("overall", written["overall"])]:
        sel = [r for r in recs if name in ("overall", r["dataset"])]
        forced = [(r["p_correct"] > 0.5) == r["oracle_label"] for r in sel]
        assert group["EA_forced"] == sum(forced) / len(sel)
        assert sum(group["verdicts"].values()) == group["n"] == len(sel)
        assert group["mean_verdict_coverage"] == pytest.approx(
            np.mean([r["verdict_coverage"] for r in sel]), abs=1e-12)
        assert group["few_passages"] is True and group["n_passages"] <= 4
    assert all(0.0 < r["verdict_coverage"] <= 1.0 for r in recs)


def test_chunk_batches_must_be_a_count():
    with pytest.raises(ConfigError, match="chunk_batches must be a whole number >= 1, not 0"):
        AsymmetryConfig(chunk_batches=0)


def test_limit_table_must_name_configured_datasets():
    with pytest.raises(ConfigError, match=r"limit names datasets \['musique'\]"):
        AsymmetryConfig(datasets=["squad_v2"], limit={"musique": 2})


def test_unknown_config_key():
    """Config tables with unknown keys are refused with the known ones listed."""
    with pytest.raises(ValueError, match="known"):
        AsymmetryConfig.from_mapping({"modle": "x"})


def test_run_config_runs_stages_and_copies_figures_and_tables(tiny, tmp_path):
    """`interp run CONFIG`: grid + attention stage; figures and tables land in the figures folder.

    Only with ``publish = true``: without it the figures stay in the run directory. An unknown
    stage, or an unknown key in a stage table, is refused before anything runs.
    """
    from interp.run.pipeline import run_config

    model_dir = tmp_path / "tiny-model"
    tiny.model.save_pretrained(model_dir)
    tiny.tokenizer.save_pretrained(model_dir)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'''name = "t"
out = "{tmp_path / 'runs'}"
figures = "{tmp_path / 'figs'}"
publish = true
description = "a tiny grid"
[asymmetry]
models = ["{model_dir}"]
datasets = ["squad_v2", "drop"]
limit = {{ squad_v2 = 2, drop = 1 }}
max_new_tokens = 4
n_boot = 50
[attention]
band = "all"
n_boot = 50
''')
    lines: list[str] = []
    summary = run_config(cfg, log=lines.append)
    (spec, entry), = summary.items()
    assert entry["metrics"]["overall"]["n"] == 3  # the limit table: 2 SQuAD + 1 DROP
    assert entry["metrics"]["per_dataset"]["drop"]["n"] == 1
    # it says what it is, how long each stage took, and where the figures and table are
    assert lines[0] == "== t: a tiny grid" and lines[-1] == "== this was a tiny grid."
    assert any(x.startswith("== stage attention took ") for x in lines)
    assert lines[-2] == (f"== done. Figures: {tmp_path / 'figs'}. Summary table: "
                         f"{tmp_path / 'runs' / 'summary.txt'} (numbers: "
                         f"{tmp_path / 'runs' / 'summary.json'}).")
    text = (tmp_path / "runs" / "summary.txt").read_text()
    assert "asymmetry" in text and "attention" in text and "overall" in text
    figs = {p.name for p in (tmp_path / "figs").iterdir()}
    assert {"asymmetry.png", "asymmetry_metrics.json", "attention_summary.json",
            "attention_layerwise.png"} <= figs
    copied = json.loads((tmp_path / "figs" / "asymmetry_metrics.json").read_text())
    assert copied == json.loads((tmp_path / "runs").glob("*/metrics.json").__next__().read_text())
    draft = tmp_path / "draft.toml"
    draft.write_text(cfg.read_text().replace("publish = true", "publish = false").replace(
        "figs", "draft_figs"))
    lines: list[str] = []
    run_config(draft, log=lines.append)
    assert not (tmp_path / "draft_figs").exists()
    assert "not updated (the config does not say publish = true)" in lines[-3]
    assert lines[-2].startswith(f"== done. Figures: {tmp_path / 'runs'}/")  # the run's own
    bad = tmp_path / "bad.toml"
    bad.write_text(cfg.read_text() + "[atention]\nlayers = 'all'\n")
    with pytest.raises(ConfigError, match=r"unknown keys or stages \['atention'\]"):
        run_config(bad)
    # a bad key inside a stage table is refused before any model is loaded
    bad.write_text(cfg.read_text().replace('band = "all"', 'layer = "all"'))
    with pytest.raises(ConfigError, match=r"\[attention\]: unknown config keys \['layer'\]"):
        run_config(bad)


def test_rerender_checks_the_stored_spans(tiny, tmp_path):
    """A record re-renders to its stored spans; a changed span names the record."""
    cfg = AsymmetryConfig(model="tiny-llama", datasets=["squad_v2"], limit=1, max_new_tokens=4,
                          verdict_max_new_tokens=3, n_boot=10)
    run_asymmetry(tmp_path, tiny, cfg, log=lambda s: None)
    (rec,) = RunDir(tmp_path).read_records()
    for task in ("gen", "eval"):
        assert rerender(rec, task, tiny.tokenizer).to_record() == rec["prompts"][task]
    rec["prompts"]["eval"]["token_spans"]["question"][0] += 1
    with pytest.raises(RunDirError, match=f"record squad_v2/{rec['id']}: the re-rendered eval"):
        rerender(rec, "eval", tiny.tokenizer)
    del rec["prompts"]["gen"]
    with pytest.raises(RunDirError, match="has no prompts.gen"):
        rerender(rec, "gen", tiny.tokenizer)


def test_model_oracle_falls_back_to_the_forced_choice(tiny):
    """A reply without a verdict: the oracle model's whole-reply forced choice decides."""
    from interp.judging.grading import ORACLE_SYSTEM, ORACLE_USER, ModelOracle

    oracle = ModelOracle(tiny, max_new_tokens=3)
    ctx, q = "The Eiffel Tower is in Paris.", "Where is the Eiffel Tower?"
    forced = 0
    for pred in ("Paris", "Rome", "Lyon", "France"):
        res = oracle.grade(pred, ["Paris"], dataset="squad_v2",
                           extras={"context": ctx, "question": q})
        if not res.rule.startswith("model:forced_choice("):
            assert res.rule.startswith("model:reply:")
            continue
        forced += 1
        user = ORACLE_USER.format(context=ctx, question=q, gold="Paris", prediction=pred)
        ids = tiny.tokenizer.apply_chat_template(
            [{"role": "system", "content": ORACLE_SYSTEM}, {"role": "user", "content": user}],
            tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        p = float(score_verdicts(tiny, [list(ids)]).p_correct[0])
        assert res.rule.startswith(f"model:forced_choice(p_correct={p:.3f}):")
        assert res.label == (p > 0.5)
    assert forced >= 1 and oracle.counts["forced_choice"] == forced
    assert sum(oracle.counts.values()) == 4
    # unanswerable questions go to the rule oracle, and are counted as such
    oracle.grade("", [], dataset="squad_v2", answerable=False)
    assert oracle.counts["rule"] == 1


def test_oracle_agreement_on_a_run(tiny, tmp_path):
    """Kappa and the confusion table of the rule oracle vs a tiny model oracle, written."""
    from sklearn.metrics import cohen_kappa_score
    from typer.testing import CliRunner

    from interp import cli
    from interp.judging.grading import ModelOracle
    from interp.stages.asymmetry import format_oracle_agreement, oracle_agreement
    from interp.testing import GOOD, synthetic_probe_run

    run = synthetic_probe_run(tmp_path / "run", tiny, 3, 3)
    recs = run.read_records()
    for k, r in enumerate(recs):       # gold = the city of the context: 3 right, 3 wrong answers
        r["answers"] = [GOOD[k % 4]]
    run.records_path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = oracle_agreement(run, ModelOracle(tiny, max_new_tokens=3))
    assert json.loads((tmp_path / "run" / "oracle_agreement.json").read_text())["n"] == 6
    c = res["confusion"]
    assert sum(c.values()) == res["n"] == 6
    assert c["a_correct_b_correct"] + c["a_correct_b_incorrect"] == 3    # the rule oracle
    b = [True] * (c["a_correct_b_correct"] + c["a_incorrect_b_correct"]) + [False] * (
        c["a_correct_b_incorrect"] + c["a_incorrect_b_incorrect"])
    a = [True] * c["a_correct_b_correct"] + [False] * c["a_incorrect_b_correct"] + [True] * (
        c["a_correct_b_incorrect"]) + [False] * c["a_incorrect_b_incorrect"]
    assert res["kappa"] == pytest.approx(cohen_kappa_score(a, b))
    assert res["confusion"] == {"a_correct_b_correct": 3, "a_correct_b_incorrect": 0,
                                "a_incorrect_b_correct": 3, "a_incorrect_b_incorrect": 0}
    assert res["n_disagreements"] == len(res["disagreements"]) == sum(x != y for x, y in zip(a, b))
    assert sum(res["oracle_b_counts"].values()) == 6
    assert "Cohen's kappa" in format_oracle_agreement(res)
    out = CliRunner().invoke(cli.app, ["oracle-agreement", "--run", str(run.path), "--oracle",
                                       "rule"])
    assert out.exit_code == 2 and "must be model:SPEC" in out.output
