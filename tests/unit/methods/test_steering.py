"""Attention steering on a tiny random model.

Exactness at alpha = 1, the mass it reaches, bad input, head specs, and the stage's tables,
summary and resume.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from interp.core.errors import StageError
from interp.hooks.recorder import record_rows
from interp.hooks.steering import Steer, steering
from interp.judging.prompts import get_template, render
from interp.judging.verdict import verdict_replies
from interp.methods.steering import parse_heads, steer_generator, steer_judge
from interp.models.kv_cache import continuation_logprobs, output_cache
from interp.stages.steering import SteeringConfig, run
from interp.testing import synthetic_probe_run


@pytest.fixture(scope="module")
def prompt(tiny):
    return render(tiny.tokenizer, get_template(), "eval",
                  context="The Eiffel Tower is in Paris. It was finished in 1889.",
                  question="Where is the Eiffel Tower?", answer="Rome")


def test_alpha_one_reproduces_the_unsteered_run_exactly(tiny, prompt):
    ids = torch.tensor([prompt.input_ids])
    ctx = prompt.token_spans["context"]
    with torch.no_grad():
        plain = tiny.model(input_ids=ids, use_cache=False).logits
        with steering(tiny, Steer(units={0: None, 1: None}, keys=ctx, alphas=[1.0])):
            steered = tiny.model(input_ids=ids, use_cache=False).logits
    assert torch.equal(plain, steered)
    # the judge's whole-reply score at alpha = 1 is the unsteered cached computation, bit for bit
    out = steer_judge(tiny, prompt.input_ids, ctx, {0: None, 1: None}, [1.0], band=[0, 1])
    with torch.no_grad():
        pre = output_cache(tiny.model(input_ids=ids[:, :-1], use_cache=True))
        last = tiny.model(input_ids=ids[:, -1:], cache=pre, use_cache=True)
        lp = continuation_logprobs(tiny.model, last.logits[:, -1], output_cache(last),
                                   torch.ones(1, ids.shape[1], dtype=torch.long),
                                   verdict_replies(tiny.tokenizer).ids).double().numpy()
    assert out["logprob_correct"][0] == lp[0, 0] and out["logprob_incorrect"][0] == lp[0, 1]
    # and the rows it records are the recorder's
    rows = record_rows(tiny, prompt.input_ids).rows
    ref = rows[:, :, ctx[0]:ctx[1]].sum(-1).mean().item()
    assert out["context_mass"][0] == pytest.approx(ref, abs=1e-6)


def test_steering_reaches_the_renormalised_mass_on_steered_heads_only(tiny, prompt):
    ids = torch.tensor([prompt.input_ids])
    ctx = prompt.token_spans["context"]
    base = record_rows(tiny, prompt.input_ids).rows  # [layer, head, pos]
    st = Steer(units={1: [0, 2]}, keys=ctx, alphas=[0.25, 4.0])
    with torch.no_grad(), steering(tiny, st):
        tiny.model(input_ids=ids.expand(2, -1), use_cache=False)
    m = base[1, :, ctx[0]:ctx[1]].sum(-1)
    for row, a in enumerate((0.25, 4.0)):
        got = st.rows[1][row, :, ctx[0]:ctx[1]].sum(-1)
        want = m.clone()
        want[[0, 2]] = a * m[[0, 2]] / (a * m[[0, 2]] + 1 - m[[0, 2]])
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        # layer 0 is not steered: its rows are the unsteered ones
        torch.testing.assert_close(st.rows[0][row], base[0], atol=1e-6, rtol=0)
    # within a head the context keys keep their proportions (only the total is scaled)
    r0, r1 = st.rows[1][0, 0, ctx[0]:ctx[1]], base[1, 0, ctx[0]:ctx[1]]
    torch.testing.assert_close(r0 / r0.sum(), r1 / r1.sum(), atol=1e-5, rtol=0)


def test_bad_steering_input(tiny, prompt):
    ctx = prompt.token_spans["context"]
    for st, msg in ((Steer({1: None}, ctx, [0.0]), "alpha must be a finite number > 0"),
                    (Steer({5: None}, ctx, [1.0]), r"layers \[5\] out of range; valid: 0..1"),
                    (Steer({1: [7]}, ctx, [1.0]), "heads .7. out of range"),
                    (Steer({1: None}, (5, 5), [1.0]), "key span")):
        with pytest.raises(StageError, match=msg), steering(tiny, st):
            pass
    with pytest.raises(StageError, match="3 rows but 2 alphas"), torch.no_grad(), \
            steering(tiny, Steer({1: None}, ctx, [1.0, 2.0])):
        tiny.model(input_ids=torch.tensor([prompt.input_ids] * 3), use_cache=False)
    assert tiny.model.config._attn_implementation == "sdpa"  # restored after the error
    with pytest.raises(StageError, match="unknown backend 'eager'; valid: "):
        steer_judge(tiny, prompt.input_ids, ctx, {1: None}, [1.0], band=[1], backend="eager")
    with pytest.raises(StageError, match="^steering: the 'hf' or 'transformer_lens' "
                       "backend only, not 'nnsight'$"):
        steer_judge(tiny, prompt.input_ids, ctx, {1: None}, [1.0], band=[1], backend="nnsight")
    with pytest.raises(StageError, match="alpha must be a finite number > 0"):
        steer_judge(tiny, prompt.input_ids, ctx, {1: None}, [0.0], band=[1],
                    backend="transformer_lens")


def test_parse_heads():
    assert parse_heads("all", [2, 3], 4) == {2: None, 3: None}
    assert parse_heads("3.1, 2.0,3.2", [0], 4) == {3: [1, 2], 2: [0]}
    ranked = [{"layer": 5, "head": 1}, {"layer": 4, "head": 0}, {"layer": 5, "head": 3}]
    assert parse_heads("top-diff:2", [0], 4, ranked=ranked) == {5: [1], 4: [0]}
    with pytest.raises(StageError, match="interp attention"):
        parse_heads("top-diff:2", [0], 4)
    with pytest.raises(StageError, match="head outside 0..3"):
        parse_heads("1.4", [0], 4)
    with pytest.raises(StageError, match="use 'all'"):
        parse_heads("heads", [0], 4)


def test_generator_at_alpha_one_decodes_the_unsteered_answer(tiny):
    from interp.judging.generation import generate

    p = render(tiny.tokenizer, get_template(), "gen",
               context="The Eiffel Tower is in Paris.", question="Where is it?")
    out = steer_generator(tiny, p.input_ids, p.token_spans["context"], {0: None, 1: None},
                          [1.0, 8.0], band=[0, 1], max_new_tokens=6)
    ref = generate(tiny, [p.input_ids], max_new_tokens=6)[0].text
    assert out["generations"][0] == ref
    assert out["context_mass"][1] > out["context_mass"][0]


def _run_stage(tiny, tmp_path, n: int, **table):
    """The stage on a synthetic run of ``n`` good and ``n`` bad records (band 0-1, quiet)."""
    run_dir = synthetic_probe_run(tmp_path / "run", tiny, n_good=n, n_bad=n)
    cfg = SteeringConfig.from_mapping({"band": "0-1", "progress": False, **table})
    s = run(run_dir, tiny, cfg, log=lambda m: None)
    return run_dir, cfg, s, pd.read_parquet(run_dir.path / "steering/rows.parquet")


def test_stage_tables_summary_and_resume(tiny, tmp_path):
    run_dir, cfg, s, df = _run_stage(tiny, tmp_path, 3, alphas="0.5,1,2", limit=2,
                                     max_new_tokens=4, n_boot=50)
    assert len(df) == 4 * 3 * 2 and s["n_records"] == 4
    ev = df[(df.task == "eval") & (df.alpha == 1.0)]
    o = s["eval"]["1.0"]["overall"]
    assert o["ea_forced"]["mean"] == pytest.approx(float(np.mean(ev.verdict == ev.y_star)))
    acc = ev[~ev.y_star].verdict.mean()
    assert o["accept_incorrect"]["mean"] == pytest.approx(float(acc))
    assert o["logit_diff"]["mean"] == pytest.approx(float(ev.logit_diff.mean()))
    assert s["gen"]["1.0"]["overall"]["changed_vs_alpha1"] == 0.0
    # the context mass reached grows with alpha
    cm = [s["eval"][a]["overall"]["context_mass"]["mean"] for a in ("0.5", "1.0", "2.0")]
    assert cm[0] < cm[1] < cm[2]
    assert (run_dir.path / "figures/steering.png").exists()
    with pytest.raises(StageError, match="include 1"):
        SteeringConfig.from_mapping({"alphas": [0.5, 2]})
    # resume: the parts are read back, the summary is the same
    stored = json.loads((run_dir.path / "steering/summary.json").read_text())
    again = run(run_dir, tiny, cfg, log=lambda m: None)
    assert json.loads(json.dumps(again)) == stored
    # summarised again from the stored parts, without the model: the same summary
    from interp.stages.steering import summarise_stored

    assert json.loads(json.dumps(summarise_stored(run_dir, cfg, log=lambda m: None))) == stored
    with pytest.raises(StageError, match="no rows for"):
        summarise_stored(run_dir, SteeringConfig.from_mapping(
            {"alphas": [1, 3], "limit": 2, "progress": False}), log=lambda m: None)


def _eval_rows(n_records: int, y_star: list[bool]) -> pd.DataFrame:
    rows = []
    for i in range(n_records):
        for a in (0.5, 1.0):
            rows.append({"id": f"r{i}", "passage": f"p{i}", "dataset": "squad_v2",
                         "task": "eval", "alpha": a, "context_mass": 0.1 * a,
                         "verdict": True, "y_star": y_star[i], "logit_diff": 1.0,
                         "verdict_coverage": 0.9})
    return pd.DataFrame(rows)


def test_summary_flags_few_passages_and_the_figure_says_what_is_missing():
    """Under 10 passages the summary, its text and the figure say so.

    An empty group's line is named in the legend; coinciding lines get distinct markers/styles.
    """
    from interp.plots.common import plt
    from interp.plots.steering import judge_panel
    from interp.stages.steering import format_summary, summarise

    cfg = SteeringConfig(alphas=[0.5, 1.0], tasks=["eval"], n_boot=20)
    few = summarise(_eval_rows(4, [False] * 4), cfg, [0], {}, "m")
    assert (few["n_passages"], few["few_passages"]) == (4, True)
    assert few["note"].startswith("only 4 passages (< 10)")
    assert few["eval"]["0.5"]["overall"]["few_passages"] is True
    text = format_summary(few)
    assert "4 records, 4 passages*" in text and "* only 4 passages (< 10)" in text
    # every resample of 4 identical rows gives one value: the interval says so
    assert "acc|I 1.00 [1.00,1.00] (zero width)" in text
    assert "(zero width): every bootstrap resample on 4 passages gave the same value" in text
    many = summarise(_eval_rows(10, [True] * 5 + [False] * 5), cfg, [0], {}, "m")
    assert (many["few_passages"], many["note"]) == (False, None)
    assert "passages*" not in format_summary(many) and "\n* " not in format_summary(many)

    fig, ax = plt.subplots()
    labels = judge_panel(ax, few)   # every answer oracle-incorrect: acc|C has no record
    assert "acceptance | oracle Correct: no oracle-correct record (not drawn)" in labels
    fig2, ax2 = plt.subplots()
    judge_panel(ax2, many)          # EA = acc|C = 1 at both alphas: same values, both visible
    lines = [ln for ln in ax2.get_lines() if ln.get_marker() in ("o", "s", "^")]
    assert len({(ln.get_marker(), ln.get_linestyle()) for ln in lines}) == 3
    assert len({tuple(ln.get_xdata()) for ln in lines}) == 3    # dodged on the alpha axis
    plt.close(fig)
    plt.close(fig2)


def test_control_keys_are_non_context_and_as_many():
    from interp.hooks.steering import control_keys

    # 40 positions, context [10, 20): 28 candidates (not 0, not 39, not 10..19) -> 10 of them
    keys = control_keys(40, (10, 20))
    assert len(keys) == 10 and keys == sorted(set(keys))
    assert not any(10 <= k < 20 for k in keys) and 0 not in keys and 39 not in keys
    assert keys[0] == 1 and keys[-1] == 38  # spread over the prompt, both ends
    # a context longer than the rest of the prompt: every non-context key but the two ends
    assert control_keys(12, (2, 10)) == [1, 10]
    with pytest.raises(StageError, match="inside a prompt of 12"):
        control_keys(12, (2, 13))


def test_control_steering_moves_only_the_listed_keys(tiny, prompt):
    """A steered key list's mass renormalises as a span's does.

    The context's share of the rest is untouched, and alpha = 1 changes nothing.
    """
    from interp.hooks.steering import control_keys

    ids = torch.tensor([prompt.input_ids])
    ctx = prompt.token_spans["context"]
    pos = control_keys(len(prompt.input_ids), ctx)
    base = record_rows(tiny, prompt.input_ids).rows  # [layer, head, pos]
    st = Steer(units={1: None}, keys=ctx, alphas=[1.0, 4.0], positions=pos)
    with torch.no_grad(), steering(tiny, st):
        tiny.model(input_ids=ids.expand(2, -1), use_cache=False)
    m = base[1][:, pos].sum(-1)
    torch.testing.assert_close(st.rows[1][0], base[1], atol=1e-6, rtol=0)  # alpha 1
    torch.testing.assert_close(st.rows[1][1][:, pos].sum(-1), 4 * m / (4 * m + 1 - m),
                               atol=1e-5, rtol=0)
    c0, c1 = base[1][:, ctx[0]:ctx[1]].sum(-1), st.rows[1][1][:, ctx[0]:ctx[1]].sum(-1)
    torch.testing.assert_close(c1, c0 / (4 * m + 1 - m), atol=1e-5, rtol=0)
    j = steer_judge(tiny, prompt.input_ids, ctx, {1: None}, [1.0, 4.0], band=[1], positions=pos)
    assert j["steered_mass"][1] > j["steered_mass"][0] and j["context_mass"][1] < \
        j["context_mass"][0]
    plain = steer_judge(tiny, prompt.input_ids, ctx, {1: None}, [1.0, 4.0], band=[1])
    assert j["logit_diff"][0] == plain["logit_diff"][0]  # alpha 1: the same batch, unsteered
    assert j["logit_diff"][1] != plain["logit_diff"][1]
    with pytest.raises(StageError, match="non-empty list of positions"), \
            steering(tiny, Steer({1: None}, ctx, [1.0], positions=[])):
        pass


def test_stage_with_the_control(tiny, tmp_path):
    _, _, s, df = _run_stage(tiny, tmp_path, 2, alphas="1,4", limit=2, keys="context,control",
                             max_new_tokens=3, n_boot=20)
    assert sorted(df["keys"].unique()) == ["context", "control"]
    c = df[(df["keys"] == "control") & (df.task == "eval")]
    assert len(c) == s["n_records"] * 2
    o = s["control"]["eval"]["4.0"]["overall"]
    assert o["steered_mass"]["mean"] == pytest.approx(float(c[c.alpha == 4].steered_mass.mean()))
    assert o["n_keys"] == pytest.approx(float(c.n_keys.mean()))
    # at alpha 1 the control rows are the context rows (nothing is steered)
    e = df[(df.task == "eval") & (df.alpha == 1)].sort_values(["keys", "id"])
    a, b = e[e["keys"] == "context"], e[e["keys"] == "control"]
    np.testing.assert_array_equal(a.logit_diff.to_numpy(), b.logit_diff.to_numpy())
    assert "control judge alpha" in __import__("interp.stages.steering", fromlist=["x"]) \
        .format_summary(s)
    with pytest.raises(StageError, match="keys must be among"):
        SteeringConfig.from_mapping({"keys": ["context", "question"]})


def test_context_minus_control_is_the_per_record_difference_of_the_paired_effects():
    """Synthetic rows: 6 records on 4 passages; right answers on 2 of them."""
    from interp.stages.steering import summarise

    rows = []
    for i in range(6):
        for keys, gain in (("context", -0.5 * i), ("control", -0.1 * i)):
            for a in (1.0, 4.0):
                ld = 1.0 + (gain if a == 4.0 else 0.0)
                rows.append({"id": f"r{i}", "passage": f"p{i % 4}", "dataset": "squad_v2",
                             "task": "eval", "keys": keys, "alpha": a, "context_mass": 0.1,
                             "steered_mass": 0.1, "n_keys": 5, "verdict": ld > 0,
                             "y_star": i < 2, "logit_diff": ld, "verdict_coverage": 0.5})
    cfg = SteeringConfig(alphas=[1.0, 4.0], tasks=["eval"], keys=["context", "control"],
                         n_boot=50)
    s = summarise(pd.DataFrame(rows), cfg, [0], {}, "m")
    d = s["context_minus_control"]["eval"]["4.0"]["overall"]
    # per record (-0.5 i) - (-0.1 i) = -0.4 i, i = 0..5: mean -1.0
    assert d["logit_diff"]["mean"] == pytest.approx(-1.0) and d["n"] == 6
    assert d["n_passages"] == 4 and d["logit_diff"]["ci"][0] <= -1.0 <= d["logit_diff"]["ci"][1]
    # verdicts flip (ld <= 0) under the context keys for i >= 2 (the 4 wrong answers), never
    # under the control's; the right answers (i = 0, 1) keep theirs
    assert d["accept_incorrect"]["mean"] == pytest.approx(-1.0)
    assert d["accept_correct"]["mean"] == 0.0
    # logit_diff by the oracle's label: right answers -0.4 * (0, 1), wrong -0.4 * (2..5)
    assert d["logit_diff_correct"]["mean"] == pytest.approx(-0.2)
    assert d["logit_diff_incorrect"]["mean"] == pytest.approx(-1.4)
    assert (d["logit_diff_correct"]["n"], d["logit_diff_incorrect"]["n"]) == (2, 4)
    # a subgroup's passages are its own: the 2 right answers are on 2 passages, not 4
    ev = s["eval"]["4.0"]["overall"]["vs_alpha1"]
    assert ev["accept_correct"]["n_passages"] == 2 and ev["accept_incorrect"]["n_passages"] == 4
    assert ev["logit_diff"]["n_passages"] == 4
    # the ranking: at x1 every logit_diff is 1.0 (AUC 0.5, all ties); at x4 the right answers
    # (1.0, 0.5) sit above the wrong ones under both key sets (AUC 1.0): +0.5 each, 0 apart
    assert (ev["auc"]["mean"], ev["auc"]["auc_alpha1"], ev["auc"]["auc_alpha"]) == (0.5, 0.5, 1.0)
    assert s["control"]["eval"]["4.0"]["overall"]["vs_alpha1"]["auc"]["mean"] == 0.5
    assert d["auc"]["mean"] == 0.0 and d["auc"]["ci"] == [0.0, 0.0]
    # acceptance of right minus wrong: the context flips the 4 wrong answers, not the right
    assert ev["accept_gap"]["mean"] == 1.0 and d["accept_gap"]["mean"] == 1.0
    assert s["eval"]["4.0"]["overall"]["auc"]["mean"] == 1.0


def test_a_threshold_shift_is_right_more_often_without_ranking_better():
    """Every logit_diff lowered by the same 1.5 nats: EA_forced rises, the AUC does not move.

    10 records on 10 passages, 2 right answers; at x1 the judge accepts all 10 (EA 0.2), at
    x4 it rejects those under 1.5 nats: the 8 wrong ones and 1 right one (EA 0.9).
    """
    from interp.stages.steering import summarise

    ld1 = [2.0, 1.0, 1.4, 1.3, 1.2, 1.1, 0.9, 0.8, 0.7, 0.6]
    rows = [{"id": f"r{i}", "passage": f"p{i}", "dataset": "squad_v2", "task": "eval",
             "keys": "context", "alpha": a, "context_mass": 0.1, "steered_mass": 0.1,
             "n_keys": 5, "y_star": i < 2, "logit_diff": x - (1.5 if a == 4.0 else 0.0),
             "verdict": x - (1.5 if a == 4.0 else 0.0) > 0, "verdict_coverage": 0.5}
            for i, x in enumerate(ld1) for a in (1.0, 4.0)]
    cfg = SteeringConfig(alphas=[1.0, 4.0], tasks=["eval"], n_boot=200)
    ev = summarise(pd.DataFrame(rows), cfg, [0], {}, "m")["eval"]["4.0"]["overall"]["vs_alpha1"]
    assert ev["ea_forced"]["mean"] == pytest.approx(0.7)
    assert ev["auc"]["mean"] == 0.0 and ev["auc"]["ci"] == [0.0, 0.0]
    assert ev["auc"]["auc_alpha"] == ev["auc"]["auc_alpha1"] == pytest.approx(12 / 16)
    # right answers accepted 1 of 2 (was 2), wrong 0 of 8 (was 8): +0.5 for the threshold alone
    assert ev["accept_gap"]["mean"] == pytest.approx(-0.5 + 1.0)


def test_paired_effects_against_alpha_one(tiny, tmp_path):
    _, _, s, df = _run_stage(tiny, tmp_path, 3, alphas="0.25,1,4", limit=3, max_new_tokens=3,
                             n_boot=30)
    ev = df[df.task == "eval"].pivot_table(index="id", columns="alpha", values="logit_diff")
    eff = s["eval"]["4.0"]["overall"]["vs_alpha1"]
    assert eff["logit_diff"]["mean"] == pytest.approx(float((ev[4.0] - ev[1.0]).mean()))
    assert eff["logit_diff"]["n"] == len(ev)
    v = df[df.task == "eval"].pivot_table(index="id", columns="alpha", values="verdict")
    y = df[df.task == "eval"].groupby("id").y_star.first()
    want = float(((v[0.25] > 0) == y).astype(float).mean() - ((v[1.0] > 0) == y).mean())
    assert s["eval"]["0.25"]["overall"]["vs_alpha1"]["ea_forced"]["mean"] == pytest.approx(want)
    assert "vs_alpha1" not in s["eval"]["1.0"]["overall"]
    g = df[df.task == "gen"].pivot_table(index="id", columns="alpha", values="correct")
    assert s["gen"]["4.0"]["overall"]["vs_alpha1"]["ga"]["mean"] == pytest.approx(
        float((g[4.0].astype(float) - g[1.0].astype(float)).mean()))


def test_shares_of_the_parts_then_the_stage_equal_one_process(tiny, tmp_path):
    """Shares of the parts, then the stage, give one process's summary.

    Under torchrun each process steers its share of the records (the contract's
    ``parts_only``), then rank 0's ``run`` finds every part fresh: no part made twice, and
    the shares left the manifest alone.
    """
    from interp.stages.common import share_of_records
    from interp.stages.steering import make_parts

    table = dict(alphas="0.5,1,2", limit=2, max_new_tokens=4, n_boot=50)
    one, cfg, s, _ = _run_stage(tiny, tmp_path / "one", 3, **table)
    split = synthetic_probe_run(tmp_path / "split", tiny, n_good=3, n_bad=3)
    manifest = (split.path / "manifest.json").read_text()
    made = []
    for i in (0, 1):
        with share_of_records(i, 2):
            made.append(make_parts(split, tiny, cfg, log=lambda m: None))
    assert made == [2, 2] and sum(made) == s["n_records"]
    assert (split.path / "manifest.json").read_text() == manifest
    parts = sorted((split.path / "steering/parts").iterdir())
    assert [p.name for p in parts] == sorted(p.name for p in (one.path / "steering/parts")
                                             .iterdir())
    mtimes = [p.stat().st_mtime_ns for p in parts]
    assert run(split, tiny, cfg, log=lambda m: None) == s
    assert [p.stat().st_mtime_ns for p in parts] == mtimes  # rank 0 steered nothing
    assert "steering" in json.loads((split.path / "manifest.json").read_text())["stages"]


def test_the_generators_cap_defaults_to_the_runs(tiny, tmp_path, monkeypatch):
    """Without ``max_new_tokens`` the steered answers get Study 1's cap (the manifest's)."""
    import interp.stages.steering as stage

    seen, real = [], stage.steer_generator
    monkeypatch.setattr(stage, "steer_generator",
                        lambda *a, **k: seen.append(k["max_new_tokens"]) or real(*a, **k))
    run_dir = synthetic_probe_run(tmp_path / "run", tiny, n_good=1, n_bad=1)
    manifest = json.loads((run_dir.path / "manifest.json").read_text())
    manifest["config"]["max_new_tokens"] = cap = 7   # as Study 1 would have recorded it
    (run_dir.path / "manifest.json").write_text(json.dumps(manifest))
    cfg = SteeringConfig.from_mapping({"band": "0-1", "progress": False, "alphas": [1],
                                       "tasks": ["gen"], "limit": 1, "n_boot": 10})
    assert cfg.max_new_tokens is None
    run(run_dir, tiny, cfg, log=lambda m: None)
    assert seen and set(seen) == {cap}
