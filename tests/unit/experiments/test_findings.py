"""The findings report.

Its cells are the published summaries' numbers, and the committed page is the table those
files give.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from experiments.findings.report import BEGIN, END, claims, render, update_doc

ROOT = Path(__file__).resolve().parents[3]
MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]


def _cells(fig_dir: Path, models=MODELS) -> dict[str, dict]:
    return {r["claim"]: r["cells"] for r in claims(fig_dir, models)}


def test_docs_findings_is_the_table_of_the_committed_summaries():
    """Every number of the report's tables is the number in figures/findings/*.json.

    The main page holds the headline table, its claims page the full one; the main page stays
    a page a reader reads in minutes (at most 12 KB).
    """
    from experiments.findings.report import HEAD_BEGIN, HEAD_END, render_headline, report_pages

    stale = ("stale: run `python -m experiments.findings figures/findings docs/findings.md`")
    main = (ROOT / "docs/findings.md").read_text()
    head = main.split(HEAD_BEGIN, 1)[1].split(HEAD_END, 1)[0].strip()
    assert head == render_headline(ROOT / "figures/findings", MODELS).strip(), stale
    full = (ROOT / "docs/findings/claims.md").read_text()
    block = full.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == render(ROOT / "figures/findings", MODELS).strip(), stale
    from experiments.findings.report import REPRO_BEGIN, REPRO_END, render_reproduce

    repro = (ROOT / "docs/findings/reproduce.md").read_text()
    block = repro.split(REPRO_BEGIN, 1)[1].split(REPRO_END, 1)[0].strip()
    assert block == render_reproduce(ROOT / "figures/findings", MODELS).strip(), stale
    assert [p.name for p in report_pages(ROOT / "docs/findings.md")] == [
        "findings.md", "claims.md", "reproduce.md"]
    assert len(main.encode()) <= 12_000


def test_each_source_names_the_commands_that_make_it():
    """A summary's folder and name give its config, stage, seed run and publishing step."""
    from experiments.findings.report import reproduce_command

    assert reproduce_command("m__attention_summary.json: overall.context_ratio") == (
        "interp run experiments/findings.toml --only attention && "
        "python -m experiments.findings --collect runs/findings figures/findings")
    assert reproduce_command("matched/m__asymmetry_metrics.json: x") == (
        "interp run experiments/findings_matched.toml --only asymmetry && "
        "python -m experiments.findings --collect runs/findings_matched figures/findings/matched")
    assert reproduce_command("steer/m__steering_summary.json: x").startswith(
        "python -m experiments.findings --seed-run runs/findings runs/findings_steer && "
        "interp run experiments/findings_steer.toml --only steering && ")
    # the pool runs whole (Study 1 on more records, then patching) and publishes itself
    assert reproduce_command("pool/m__patching_summary.json: x") == (
        "python -m experiments.findings --seed-run runs/findings runs/findings_pool "
        "smollm2-135m-instruct && interp run experiments/findings_pool.toml")
    assert reproduce_command("m__judges__o__probes_results.json: x") == (
        "interp run experiments/findings.toml")
    assert reproduce_command("gap/m__heads_held_out.json: x").startswith(
        "python -m experiments.findings.held_out_heads runs/findings_gap/m ")
    assert reproduce_command("views/m__pairwise_summary.json: x") == (
        "python -m experiments.findings --seed-run runs/findings runs/findings_views && "
        "interp run experiments/findings_views.toml --only pairwise && "
        "python -m experiments.findings --collect runs/findings_views figures/findings/views")
    for bad in ("other/m__attention_summary.json: x", "m__unknown.json: x"):
        with pytest.raises(ValueError):
            reproduce_command(bad)


def test_cells_read_the_published_fields_on_real_summaries():
    """On the committed quickstart study (figures/, real records): each cell is its field."""
    fig = ROOT / "figures"
    cells = _cells(fig)
    for m in MODELS:
        met = json.loads((fig / f"{m}__asymmetry_metrics.json").read_text())
        att = json.loads((fig / f"{m}__attention_summary.json").read_text())
        sq = met["per_dataset"]["squad_v2"]
        c = cells["GA > EA on SQuAD 2.0 (3.1)"][m]
        assert (c.value, list(c.ci), c.n, c.n_passages) == (sq["delta"], sq["delta_ci"],
                                                            sq["n"], sq["n_passages"])
        r = cells["the judge reads the context 3-5x less (3.2)"][m]
        assert r.value == att["overall"]["context_ratio"]
        assert list(r.ci) == att["overall"]["context_ratio_ci"]
        assert r.text().startswith(f"{att['overall']['context_ratio']:.2f} [")
        # a CI on the threshold's side decides; one across it does not
        lo, hi = sq["delta_ci"]
        assert c.verdict.startswith("yes" if hi < 0 else "no" if lo > 0 else "undecided")
        a = cells["... does the judge tell right from wrong? SQuAD 2.0 (control)"][m]
        assert (a.value, a.ci and list(a.ci), a.n) == (
            sq["auc_logit_diff"], sq.get("auc_logit_diff_ci"), sq["n"])
        assert f"{sq['acceptance_rate_correct']:.0%} of the {sq['n_oracle_correct']} right" \
            in a.verdict
        # the matched control is not in figures/: said, not invented
        assert cells["... under the matched template (control)"][m].verdict == "not measured"
        assert cells["... under the matched template (control)"][m].text() == "-"


def _write(d: Path, name: str, obj: dict) -> None:
    (d / name).parent.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(json.dumps(obj))


def test_degenerate_and_few_passage_cells_are_marked(tmp_path):
    g = {"n": 4, "n_passages": 4, "delta": 0.0, "delta_ci": [0.0, 0.0],
         "delta_forced": 0.0, "delta_forced_ci": [0.0, 0.0], "acceptance_rate_forced": 1.0}
    _write(tmp_path, "m__asymmetry_metrics.json", {"per_dataset": {"squad_v2": g,
                                                                   "drop": {**g, "n_passages": 12,
                                                                            "delta": -0.2,
                                                                            "delta_ci": [-0.3,
                                                                                         -0.1]}}})
    cells = _cells(tmp_path, ["m"])
    sq = cells["GA > EA on SQuAD 2.0 (3.1)"]["m"].verdict
    assert sq == "degenerate (CI of zero width) (4 passages only)"
    f = cells["GA > EA with the forced choice, SQuAD 2.0"]["m"].verdict
    assert "the forced choice accepts every answer" in f
    assert cells["GA > EA on DROP (3.1)"]["m"].verdict == "yes"


def test_controls_of_study_1_and_2_are_rows_of_their_own(tmp_path):
    """Study 1 and 2's controls: rows and notes of their own.

    No-verdict replies, the parsed-only delta, a by-construction exception, per-dataset ratios
    and the like-with-like share.
    """
    sq = {"n": 150, "n_passages": 150, "delta": -0.14, "delta_ci": [-0.25, -0.04],
          "verdicts": {"accept": 47, "reject": 46, "none": 57}, "n_valid": 93,
          "delta_valid": 0.02, "delta_valid_ci": [-0.1, 0.14]}
    mu = {"n": 30, "n_passages": 30, "GA": 0.0, "delta": 0.33, "delta_ci": [0.17, 0.5]}
    _write(tmp_path, "m__asymmetry_metrics.json", {"per_dataset": {"squad_v2": sq,
                                                                   "musique": mu}})
    ratio = {"n": 30, "n_passages": 30, "context_ratio": 2.5, "context_ratio_ci": [2.3, 2.7]}
    _write(tmp_path, "m__attention_summary.json", {
        "overall": {"n": 360, "n_passages": 229, "context_ratio": 3.4,
                    "context_ratio_ci": [3.3, 3.5], "context_question_share_ratio": 1.04,
                    "context_question_share_ratio_ci": [0.99, 1.08]},
        "per_dataset": {"hotpotqa": ratio}})
    cells = _cells(tmp_path, ["m"])
    c = cells["GA > EA on SQuAD 2.0 (3.1)"]["m"]
    assert c.verdict == ("yes; 57 of 150 replies without a verdict, counted wrong; its control "
                         "(SQuAD 2.0, replies with a verdict only) reads undecided")
    assert c.decision == "undecided"  # supported by itself, not by its control
    v = cells["... SQuAD 2.0, replies with a verdict only (control)"]["m"]
    assert (v.value, v.n, v.verdict) == (0.02, 93, "undecided")
    mc = cells["MuSiQue the exception: EA >= GA (3.1)"]["m"].verdict
    assert mc == "yes, by construction: GA = 0 of 30 (a control, not a finding)"
    h = cells["... HotpotQA"]["m"]
    assert (h.value, h.n, h.verdict) == (2.5, 30, "less: under 3x")
    assert h.source.endswith("per_dataset.hotpotqa.context_ratio")
    head = cells["the judge reads the context 3-5x less (3.2)"]["m"]
    assert head.verdict == ("yes, 3-5x; its control (renormalised to context+question, the "
                            "spans both prompts have) reads contradicted")
    # 3.4x in mass, 1.04x relative to the question: the control contradicts the claim
    assert head.decision == "reversed under control"
    like = cells["... renormalised to context+question, the spans both prompts have (control)"]
    assert like["m"].verdict == "gone (CI spans 1)"
    # over 1 but far under the claim: said so, not "survives"
    att = json.loads((tmp_path / "m__attention_summary.json").read_text())
    att["overall"]["context_question_share_ratio_ci"] = [1.03, 1.05]
    att["overall"]["content_context_share_ratio"] = 3.2
    att["overall"]["content_context_share_ratio_ci"] = [3.1, 3.3]
    _write(tmp_path, "m__attention_summary.json", att)
    cells = _cells(tmp_path, ["m"])
    like = cells["... renormalised to context+question, the spans both prompts have (control)"]
    assert like["m"].verdict == "gen > eval, but under 3x"
    share = cells["... renormalised to context+question+candidate (control)"]["m"]
    assert share.verdict == "survives (gen > eval, 3x or more)"
    # the audit: low context mass for a wrong verdict, with the no-verdict share of the wrong
    _write(tmp_path, "m__audit_summary.json", {"n_unparseable": 111, "n_wrong": 244, "overall": {
        "n_passages": 229, "signals": {"context_mass": {"auc": 0.58, "ci": [0.52, 0.63],
                                                        "n": 360}}}})
    au = _cells(tmp_path, ["m"])["low context reading flags a wrong verdict (audit)"]["m"]
    assert (au.value, au.n, au.n_passages) == (0.58, 360, 229)
    assert au.verdict == ("predicts, pooled over datasets; 111 of the 244 wrong verdicts are "
                          "no verdict")


def test_steering_patching_and_probe_cells(tmp_path):
    eff = {"mean": -0.1, "ci": [-0.2, -0.05], "n": 120}
    s = {"eval": {"4.0": {"overall": {"n_passages": 90, "vs_alpha1": {
        "ea_forced": {"mean": 0.04, "ci": [-0.01, 0.09], "n": 120}, "accept_incorrect": eff}}}},
         "control": {"eval": {"4.0": {"overall": {"n_passages": 90, "vs_alpha1": {
             "ea_forced": {"mean": 0.0, "ci": [-0.02, 0.02], "n": 120}}}}}}}
    s["context_minus_control"] = {"eval": {"4.0": {"overall": {"n": 120, "n_passages": 90,
                                                               "logit_diff": {
        "mean": -0.27, "ci": [-0.36, -0.17], "n": 120, "n_passages": 90},
        "logit_diff_correct": {"mean": -0.2, "ci": [-0.3, -0.1], "n": 19, "n_passages": 19},
        "logit_diff_incorrect": {"mean": -0.3, "ci": [-0.4, -0.2], "n": 101, "n_passages": 80},
    }}}}
    s["eval"]["4.0"]["overall"]["vs_alpha1"]["accept_correct"] = {
        "mean": 0.0, "ci": [0.0, 0.0], "n": 19, "n_passages": 19}
    _write(tmp_path, "m__steering_summary.json", s)
    _write(tmp_path, "m__patching_summary.json", {"candidate-swap/resid": {
        "n_pairs_kept": 31, "n_passages": 30, "top_units": [
            {"layer": 7, "head": -1, "span": "candidate", "ratio": 0.4, "ci": [0.2, 0.6]}]}})
    _write(tmp_path, "m__probes_results.json", {"n_records": 300, "n_passages": 200, "tasks": {
        "eval": {"best": {"auc": 0.8}, "vs_judge": {"judge_same_folds": {"auc": 0.6}},
                 "permutation": {"n": 100, "p_value": 0.0099}}}})
    cells = _cells(tmp_path, ["m"])
    up = cells["steering the judge's context x4 makes it right more often"]["m"]
    assert (up.value, up.n, up.n_passages, up.verdict) == (
        0.04, 120, 90, "undecided; its control (x4, context minus control, on right answers "
                       "(helping would raise it)) reads contradicted")
    # steering that pushes right answers down too is a shift, not better judging
    assert up.decision == "reversed under control"
    rej = cells["... x4: acceptance of wrong answers"]["m"]
    assert rej.verdict == "down" and rej.text() == "-0.100 [-0.200, -0.050] (n=120, p=90)"
    assert cells["... x4: the same factor on the non-context keys (control)"]["m"].value == 0.0
    cmc = cells["... x4, context minus control, per record"]["m"]
    assert (cmc.value, cmc.n, cmc.verdict) == (-0.27, 120, "context moves it more down")
    # by the oracle's label: down on right answers is the wrong way, on wrong ones the right
    r = cells["... x4, context minus control, on right answers (helping would raise it)"]["m"]
    assert (r.n, r.n_passages, r.verdict) == (19, 19, "context moves it more down: the wrong way")
    w = cells["... x4, context minus control, on wrong answers (helping would lower it)"]["m"]
    assert (w.n, w.verdict) == (101, "context moves it more down: the right way")
    # a subgroup's own passages, not the group's
    ac = cells["... x4: acceptance of right answers"]["m"]
    assert (ac.n, ac.n_passages) == (19, 19) and ac.verdict.endswith("no verdict flipped")
    p = cells["where the verdict is decided: candidate swap, residual stream"]["m"]
    assert (p.value, p.n, p.verdict) == (0.4, 31, "top unit L7 candidate")
    # a residual-stream sweep by span (no per-position units) has only top_spans
    _write(tmp_path, "m__patching_summary.json", {"candidate-swap/resid": {
        "n_pairs_kept": 23, "n_passages": 20, "top_units": [], "top_spans": [
            {"layer": 28, "head": -1, "span": "verdict", "ratio": 1.05, "ci": [0.98, 1.13]}]}})
    sp = _cells(tmp_path, ["m"])["where the verdict is decided: candidate swap, residual stream"]
    assert (sp["m"].value, sp["m"].n) == (1.05, 23)
    assert sp["m"].verdict == ("top unit L28 verdict (under 30 kept pairs: 23); the verdict "
                               "position's residual stream feeds the output: near automatic")
    assert sp["m"].decision == "control"
    # a unit patched on one pair of 30 is passed over for one patched on 20
    _write(tmp_path, "m__patching_summary.json", {"gen-to-eval/heads": {
        "n_pairs_kept": 30, "n_passages": 28, "top_units": [
            {"layer": 18, "head": 4, "ratio": -0.32, "n_pairs": 1, "n_passages": 1},
            {"layer": 16, "head": 4, "ratio": -0.2, "ci": [-0.3, -0.1], "n_pairs": 20,
             "n_passages": 19}]}})
    g = _cells(tmp_path, ["m"])["... generator's run into the judge's: attention heads"]["m"]
    assert (g.value, g.n, g.n_passages) == (-0.2, 20, 19)
    assert g.verdict == ("top unit L16.H4; rank 2: the 1 above rest on under half the 30 "
                         "pairs; -0.20 is not a share of the gap")
    assert g.decision == "not measurable"
    assert g.source.endswith("gen-to-eval/heads.top_units[1].ratio")
    _write(tmp_path, "m__patching_summary.json", {"gen-to-eval/heads": {
        "n_pairs_kept": 30, "n_passages": 28, "top_units": [
            {"layer": 18, "head": 4, "ratio": -0.32, "n_pairs": 1, "n_passages": 1},
            {"layer": 16, "head": 4, "ratio": -0.2, "n_pairs": 5, "n_passages": 5}]}})
    g = _cells(tmp_path, ["m"])["... generator's run into the judge's: attention heads"]["m"]
    assert (g.value, g.n) == (-0.2, 5) and g.verdict == (
        "top unit L16.H4; no listed unit is patched in half the 30 pairs, this one in 5; "
        "-0.20 is not a share of the gap (5 passages only)")  # flagged: under 10 passages
    assert sp["m"].source.endswith("candidate-swap/resid.top_spans[0].ratio")
    # a control with equal system prompts: no pair is built, the cell says why
    _write(tmp_path / "matched_swap", "m__patching_summary.json", {
        "system-prompt-control/resid": {"n_pairs": 0, "n_pairs_kept": 0, "n_skipped": 360,
                                        "skipped_by_reason": {"control_identity": 289,
                                                              "too_long": 71}}})
    c = _cells(tmp_path, ["m"])["... the matched template's system-prompt control"]["m"]
    assert c.value is None and c.decision == "control" and c.verdict == (
        "identical by construction: 289 of 360 records' two prompts share the context's "
        "prefix (equal system prompts), so no position differs; 71 too long")
    pr = cells["a probe on the judge's residual stream beats its verdict score"]["m"]
    assert pr.value == 0.8 and "judge AUC 0.60" in pr.verdict
    assert "(100 perms, pooled)" in pr.verdict
    # the paired comparison, when the summary has it, is the cell (its CI decides)
    _write(tmp_path, "m__probes_results.json", {"n_records": 300, "n_passages": 200, "tasks": {
        "eval": {"best": {"auc": 0.8}, "permutation": {"n": 100, "p_value": 0.0099},
                 "vs_judge": {"judge_same_folds": {"auc": 0.6}, "auc_paired": {
                     "probe": 0.78, "judge": 0.61, "probe_minus_judge": 0.17,
                     "ci": [0.05, 0.3], "n": 300, "n_passages": 190}}}}})
    pr = _cells(tmp_path, ["m"])[
        "a probe on the judge's residual stream beats its verdict score"]["m"]
    assert (pr.value, pr.ci, pr.n, pr.n_passages) == (0.17, [0.05, 0.3], 300, 190)
    # the grid's best cell was chosen on the folds it is scored on: never supported
    assert pr.verdict.startswith("undecided (the selection is not held out): probe 0.78, "
                                 "judge 0.61") and pr.decision == "undecided"
    assert "p=0.0099 (100 perms, pooled)" in pr.verdict
    assert "chosen on the folds it is scored on" in pr.verdict
    # with the nested selection (each test fold's cell chosen on its training records), that
    # comparison decides, and the optimistic one is said beside it
    r = json.loads((tmp_path / "m__probes_results.json").read_text())
    nested = {"chosen": [{"probe": "mlp", "layer": 3, "pool": "last"}] * 4 +
              [{"probe": "logreg", "layer": 5, "pool": "max"}], "n_distinct": 2,
              "auc_paired_within_dataset": {"probe": 0.7, "judge": 0.61,
                                            "probe_minus_judge": 0.09, "ci": [0.01, 0.2],
                                            "n": 300, "n_passages": 190},
              "auc_paired": {"probe": 0.72, "judge": 0.61, "probe_minus_judge": 0.11,
                             "ci": [0.02, 0.2], "n": 300, "n_passages": 190}}
    r["tasks"]["eval"]["vs_judge"]["nested"] = nested
    _write(tmp_path, "m__probes_results.json", r)
    pn = _cells(tmp_path, ["m"])[
        "a probe on the judge's residual stream beats its verdict score"]["m"]
    assert (pn.value, pn.ci, pn.decision) == (0.09, [0.01, 0.2], "supported")
    assert pn.verdict.startswith("probe higher: probe 0.70, judge 0.61; pooled +0.11")
    assert "(2 distinct of 5 folds)" in pn.verdict and pn.source.endswith(
        "tasks.eval.vs_judge.nested.auc_paired_within_dataset.probe_minus_judge")
    del r["tasks"]["eval"]["vs_judge"]["nested"]
    _write(tmp_path, "m__probes_results.json", r)
    # within datasets, when the summary has it, decides; the pooled one and the dataset's own
    # AUC are said beside it
    r = json.loads((tmp_path / "m__probes_results.json").read_text())
    r["tasks"]["eval"]["vs_judge"].update(auc_dataset_only=0.68, auc_paired_within_dataset={
        "probe": 0.6, "judge": 0.55, "probe_minus_judge": 0.05, "ci": [-0.05, 0.15], "n": 300,
        "n_passages": 190})
    _write(tmp_path, "m__probes_results.json", r)
    pr = _cells(tmp_path, ["m"])[
        "a probe on the judge's residual stream beats its verdict score"]["m"]
    assert (pr.value, pr.ci) == (0.05, [-0.05, 0.15])
    assert pr.verdict.startswith("undecided: probe 0.60, judge 0.55; pooled +0.17, the dataset "
                                 "alone 0.68")
    # the generation prompt's probe is a row of its own, read from tasks.gen
    r["tasks"]["gen"] = copy.deepcopy(r["tasks"]["eval"])
    r["tasks"]["gen"]["vs_judge"]["auc_paired_within_dataset"]["probe_minus_judge"] = 0.16
    _write(tmp_path, "m__probes_results.json", r)
    gp = _cells(tmp_path, ["m"])["... a probe on the generation prompt, before the answer"]["m"]
    assert gp.value == 0.16 and gp.source.endswith(
        "tasks.gen.vs_judge.auc_paired_within_dataset.probe_minus_judge")
    # across models: the cross-judged run's published probe results, and the answers' own
    # model's self-judge on the same folds from cross_probe.json
    across = "... on the other model's answers (across models)"
    assert _cells(tmp_path, ["m"])[across]["m"].value is None
    _write(tmp_path, "m__judges__o__probes_results.json", r)
    xp = _cells(tmp_path, ["m"])[across]["m"]
    assert (xp.value, xp.ci, xp.n) == (0.05, [-0.05, 0.15], 300)
    assert xp.verdict.startswith("undecided: probe 0.60, judge 0.55") and xp.verdict.endswith(
        "; on o's answers") and xp.source.startswith("m__judges__o__probes_results.json: ")
    _write(tmp_path, "cross_probe.json", {"entries": [
        {"judge": "m", "answers_of": "o", "source_self_judge_folds": {"auc": 0.57}},
        {"judge": "o", "answers_of": "m", "source_self_judge_folds": {"auc": 0.9}}]})
    xp = _cells(tmp_path, ["m"])[across]["m"]
    assert xp.verdict.endswith("; on o's answers; o judging them itself 0.57 (same folds)")


def test_update_doc_keeps_the_prose_and_refuses_a_doc_without_markers(tmp_path):
    doc = tmp_path / "f.md"
    doc.write_text(f"intro\n{BEGIN}\nSTALE-BLOCK\n{END}\nafter\n")
    update_doc(doc, tmp_path / "none", ["m"])
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith("\nafter\n") and "STALE-BLOCK" not in text
    assert "| claim | measured |" in text
    (tmp_path / "g.md").write_text("no markers\n")
    with pytest.raises(ValueError, match="has no"):
        update_doc(tmp_path / "g.md", tmp_path, ["m"])
    assert (tmp_path / "g.md").read_text() == "no markers\n"


def test_collect_publishes_what_a_partial_study_has(tmp_path):
    from experiments.findings.report import collect

    run = tmp_path / "out" / "m"
    (run / "attention").mkdir(parents=True)
    (run / "figures").mkdir()
    (run / "metrics.json").write_text('{"per_dataset": {}}')
    (run / "attention/summary.json").write_text('{"overall": {}}')
    (run / "figures/asymmetry.png").write_bytes(b"png")
    (tmp_path / "out" / "no-metrics").mkdir()  # an unfinished model: nothing published
    (tmp_path / "out" / "figures").mkdir()  # the cross-judging matrix and its figure
    (tmp_path / "out" / "cross_judge.json").write_text("{}")
    (tmp_path / "out" / "figures" / "cross_judge.png").write_bytes(b"png")
    got = collect(tmp_path / "out", tmp_path / "fig")
    assert got == {"m": ["asymmetry", "attention"]}
    names = sorted(p.name for p in (tmp_path / "fig").iterdir())
    assert names == ["cross_judge.json", "cross_judge.png", "m__asymmetry.png",
                     "m__asymmetry_metrics.json", "m__attention_summary.json", "progress.json"]
    assert json.loads((tmp_path / "fig/progress.json").read_text()) == got
    # a later collect from a machine holding only another model keeps m's entry
    shutil.rmtree(run)
    other = tmp_path / "out" / "n"
    other.mkdir()
    (other / "metrics.json").write_text('{"per_dataset": {}}')
    got = collect(tmp_path / "out", tmp_path / "fig")
    assert got == {"m": ["asymmetry", "attention"], "n": ["asymmetry"]}
    assert json.loads((tmp_path / "fig/progress.json").read_text()) == got


def test_transfer_cells_read_the_paired_differences_and_the_selection(tmp_path):
    def e(mean, lo, hi):
        return {"mean": mean, "ci": [lo, hi], "n": 100, "n_passages": 98}
    t = {"vs_base": {"lora_gen": {"overall": {"accept_wrong_base_answers": e(0.3, 0.2, 0.4)}},
                     "lora_eval": {"overall": {"GA": e(-0.05, -0.12, 0.01)}}},
         "lr": {"lora_gen": 3e-4, "lora_eval": 1e-4},
         "lr_selection": {"candidates": {"0.0003": {"lora_gen": {"collapsed": True}},
                                         "0.0001": {"lora_eval": {"collapsed": False}}}}}
    _write(tmp_path, "m__transfer_table.json", t)
    cells = _cells(tmp_path, ["m"])
    g = cells["LoRA-Gen over-accepts (3.3)"]["m"]
    assert g.text() == "+0.30 [+0.20, +0.40] (n=100, p=98)"
    assert g.verdict == ("yes (lr 0.0003, chosen on held-out train records; its judge "
                         "collapsed to one reply there)")
    ev = cells["LoRA-Eval degrades generation (3.3)"]["m"]
    assert ev.verdict == "undecided (lr 0.0001, chosen on held-out train records)"
    t["vs_base"]["lora_eval"]["overall"]["GA"] = e(-0.1, -0.2, -0.02)
    _write(tmp_path, "m__transfer_table.json", t)
    assert _cells(tmp_path, ["m"])["LoRA-Eval degrades generation (3.3)"]["m"].verdict.startswith(
        "yes (lr")
    # a rate taken because no rate could be scored is said so
    t["lr_selection"]["chosen_by"] = {"lora_gen": "smallest rate: no rate could be scored"}
    _write(tmp_path, "m__transfer_table.json", t)
    assert _cells(tmp_path, ["m"])["LoRA-Gen over-accepts (3.3)"]["m"].verdict.startswith(
        "yes (lr 0.0003, smallest rate: no rate could be scored;")
    # a judge that answers instead of judging accepts nothing: the cell says so
    t["vs_base"]["lora_gen"]["overall"]["accept_wrong_base_answers"] = e(-0.35, -0.48, -0.22)
    t["judge_base_answers"] = {"lora_gen": {"squad_v2": {"n": 100, "verdicts": {
        "accept": 0, "reject": 0, "none": 100}}}}
    _write(tmp_path, "m__transfer_table.json", t)
    lg = _cells(tmp_path, ["m"])["LoRA-Gen over-accepts (3.3)"]["m"]
    assert "; its judge gave no verdict on 100 of 100 (a verdict on 0%" in lg.verdict
    assert lg.decision == "not measurable"  # a degenerate judge, not a finding


def test_state_keeps_the_json_of_a_run_and_restores_it_without_overwriting(tmp_path):
    from experiments.findings.state import STATE_MAX_PART_BYTES, restore_state, save_state

    run = tmp_path / "runs" / "findings" / "m"
    files = {"records.jsonl": "{}\n", "manifest.json": "{}", "steering/parts/a.json": "{}",
             "transfer/select/lr_0.001/heldout/lora_gen.jsonl": "{}\n",
             # left out: tensors and figures (as whole folders)
             "probes/features_eval.safetensors": "x" * (STATE_MAX_PART_BYTES + 1),  # too big
             # a part marked not saved, whatever its size (states: cheap to make again)
             "calibration/directions/states/squad_v2__r1.safetensors": "s",
             "figures/steering.json": "{}", ".writer.json": "{}",
             # kept whole, whatever the size: an unfinished training's checkpoint, an adapter
             "transfer/adapters/lora_gen/adapter_model.safetensors": "w",
             "transfer/checkpoints/lora_eval/state.json": "{}",
             "transfer/checkpoints/lora_eval/optimizer.pt": "o" * (STATE_MAX_PART_BYTES + 1),
             # a declared part (an attention recording) is kept; an undeclared tensor is not
             "attention/records/squad_v2/r1.safetensors": "t", "attention/other.safetensors": "t",
             "record/squad_v2/r1/index.json": "{}"}
    for rel, text in files.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(text)
    state = tmp_path / "state"
    assert save_state(tmp_path / "runs", state, ["findings", "findings_matched"]) == 8
    kept = sorted(str(p.relative_to(state)) for p in state.rglob("*") if p.is_file())
    assert kept == ["findings/m/attention/records/squad_v2/r1.safetensors",
                    "findings/m/manifest.json", "findings/m/records.jsonl",
                    "findings/m/steering/parts/a.json",
                    "findings/m/transfer/adapters/lora_gen/adapter_model.safetensors",
                    "findings/m/transfer/checkpoints/lora_eval/optimizer.pt",
                    "findings/m/transfer/checkpoints/lora_eval/state.json",
                    "findings/m/transfer/select/lr_0.001/heldout/lora_gen.jsonl"]
    assert (run.parent / ".state").exists()  # runs/findings is now the state's
    # a part a stage removed as stale goes from the state too; a missing out is left alone
    # (and a finished training's checkpoint, which it removes when it saves the adapter)
    (run / "steering/parts/a.json").unlink()
    (run / "transfer/checkpoints/lora_eval/optimizer.pt").unlink()
    assert save_state(tmp_path / "runs", state, ["findings"]) == 6
    assert not (state / "findings/m/steering/parts/a.json").exists()
    assert not (state / "findings/m/transfer/checkpoints/lora_eval/optimizer.pt").exists()
    # a finished stage (its summary.json written) keeps its records, not its trainings
    (run / "transfer/summary.json").write_text("{}")
    (state / "findings/m/transfer/summary.json").write_text("{}")  # as a save would leave
    assert save_state(tmp_path / "runs", state, ["findings"]) == 6  # summary in, adapter out
    assert not (state / "findings/m/transfer/adapters").exists()  # emptied folders go too
    assert not (state / "findings/m/transfer/adapters/lora_gen/adapter_model.safetensors").exists()
    assert (state / "findings/m/transfer/summary.json").exists()
    (run / "transfer/summary.json").unlink()
    assert save_state(tmp_path / "runs", state, ["findings"]) == 6
    assert (state / "findings/m/transfer/adapters/lora_gen/adapter_model.safetensors").exists()
    assert save_state(tmp_path / "none", state, ["findings"]) == 0
    assert (state / "findings/m/records.jsonl").exists()
    # restored where the run folder is missing (a fresh machine), never into one that exists
    fresh = tmp_path / "fresh"
    (fresh / "findings_matched").mkdir(parents=True)
    (state / "findings_matched/m").mkdir(parents=True)
    (state / "findings_matched/m/records.jsonl").write_text("{}\n")
    said = []
    assert restore_state(state, fresh, log=said.append) == 6
    assert said == [f"{fresh / 'findings_matched'} exists: kept as it is, nothing restored "
                    f"into it"]
    assert (fresh / "findings/m/records.jsonl").read_text() == "{}\n"
    assert not (fresh / "findings_matched/m").exists()
    assert restore_state(tmp_path / "no-state", fresh) == 0
    # a run started beside a saved state (not restored from it) may not replace it
    with pytest.raises(ValueError, match="was not restored from .*nothing saved"):
        save_state(fresh, state, ["findings", "findings_matched"])
    assert (state / "findings_matched/m/records.jsonl").exists()
    # the restored one may: it mirrors the state again; not onto another state
    assert save_state(fresh, state, ["findings"]) == 6
    other = tmp_path / "other"
    (other / "findings/x").mkdir(parents=True)
    (other / "findings/x/records.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="was not restored from"):
        save_state(fresh, other, ["findings"])
    assert (other / "findings/x/records.jsonl").exists()


def test_seed_run_starts_a_second_run_from_study_1_and_never_overwrites(tmp_path, capsys):
    from experiments.findings.report import main
    from experiments.findings.state import seed_run

    src, dst = tmp_path / "findings", tmp_path / "findings_gap"
    files = {"m/records.jsonl": "{}\n", "m/manifest.json": "{}", "m/metrics.json": "{}",
             "m/patching/hard_negatives.jsonl": "{}\n", "m/steering/parts/a.json": "{}",
             "m__judges__n/records.jsonl": "{}\n",  # a cross-judging run: not a Study 1
             "n/records.jsonl": "{}\n", "n/manifest.json": "{}", "half/manifest.json": "{}"}
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    (dst / "n").mkdir(parents=True)
    (dst / "n/records.jsonl").write_text("mine\n")  # its own run: kept
    said = []
    assert seed_run(src, dst, log=said.append) == 4
    assert sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file()) == [
        "m/manifest.json", "m/metrics.json", "m/patching/hard_negatives.jsonl",
        "m/records.jsonl", "n/records.jsonl"]
    assert (dst / "n/records.jsonl").read_text() == "mine\n"
    assert said == [f"{dst / 'n'} has records: kept as it is"]
    assert seed_run(src, dst, log=said.append) == 0  # again: nothing to do
    with pytest.raises(FileNotFoundError, match="holds no run directory with records"):
        seed_run(tmp_path / "half-missing", dst)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["--seed-run", str(src / "half"), str(dst)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and " holds no run directory" in err
    main(["--seed-run", str(src), str(tmp_path / "third")])
    assert capsys.readouterr().out == f"6 files copied from {src} into {tmp_path / 'third'}\n"
    assert (tmp_path / "third/n/manifest.json").exists()
    # only the models asked for; one it lacks is refused before anything is copied
    assert seed_run(src, tmp_path / "fourth", ["n"], log=said.append) == 2
    assert sorted(p.name for p in (tmp_path / "fourth").iterdir()) == ["n"]
    with pytest.raises(FileNotFoundError, match=r"no run directory with records.jsonl for \['x'\]"):
        seed_run(src, tmp_path / "fifth", ["m", "x"])
    assert not (tmp_path / "fifth").exists()


def test_findings_command_refuses_wrong_calls_in_one_line(tmp_path, capsys):
    from experiments.findings.report import main

    for argv in (["--restore-state", "x"], ["--save-state", "a", "b"], ["--bogus", "a", "b"],
                 ["only-one"], ["--seed-run", "a"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and capsys.readouterr().err.startswith("usage:")
    for argv, what in ((["--restore-state", str(tmp_path / "nope"), "runs"], "the saved state"),
                       ([str(tmp_path / "nofig"), str(tmp_path / "doc.md")],
                        "the findings folder")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"error: {what} ") and ("nope" in err or "nofig" in err)
    main(["--help"])
    assert capsys.readouterr().out.startswith("usage:")


def test_reasoning_cells_say_the_no_verdict_shares_and_have_the_forced_control(tmp_path):
    """No verdict line loses EA by construction: the cell says so, beside its control."""
    def stat(word, reasoning, lo, hi):
        return {"word": word, "reasoning": reasoning, "delta": reasoning - word,
                "delta_ci": [lo, hi]}
    _write(tmp_path, "m__reasoning_side_by_side.json", {"m": {"overall": {
        "n": 120, "n_passages": 84, "EA": stat(0.45, 0.05, -0.5, -0.3),
        "EA_forced": stat(0.30, 0.34, -0.05, 0.12),
        "no_verdict_share": stat(0.3, 0.95, 0.5, 0.8),
        "verdict_context_mass": stat(0.060, 0.085, 0.01, 0.04),
        "discrimination_forced": stat(0.01, 0.03, -0.1, 0.15)}}})
    cells = _cells(tmp_path, ["m"])
    ea = cells["a reasoning judge judges better"]["m"]
    assert (ea.value, ea.n, ea.n_passages) == (pytest.approx(-0.40), 120, 84)
    assert ea.verdict == ("reasoning lower (0.05 vs 0.45); no verdict: reasoning 95%, one word "
                          "30%, counted wrong; reasoning judge: a verdict on 5% (under 50%)")
    assert ea.decision == "not measurable"  # a judge that gives a verdict on 5% of its answers
    fc = cells["... forced choice after its reasoning (control)"]["m"]
    assert (fc.value, fc.verdict) == (pytest.approx(0.04), "undecided")
    assert fc.source.endswith("overall.EA_forced.delta")
    gap = cells["... tells right from wrong better (forced choice)"]["m"]
    assert (gap.value, gap.verdict) == (pytest.approx(0.02), "undecided")
    mass = cells["... and reads the context more at its verdict (3.2, reasoning judge)"]["m"]
    assert mass.verdict == "reasoning higher" and mass.text() == (
        "+0.025 [+0.010, +0.040] (n=120, p=84)")


def test_a_judge_with_one_reply_for_every_answer_is_flagged(tmp_path):
    """EA = 1 - GA when the judge rejects everything (EA = GA when it accepts everything)."""
    g = {"n": 30, "n_passages": 30, "GA": 0.1, "EA": 0.9, "delta": 0.8, "delta_ci": [0.53, 1.0],
         "acceptance_rate": 0.0, "verdicts": {"correct": 0, "incorrect": 30, "none": 0},
         "delta_forced": 0.0, "delta_forced_ci": [0.0, 0.0], "acceptance_rate_forced": 1.0}
    _write(tmp_path, "m__asymmetry_metrics.json",
           {"per_dataset": {"musique": g, "squad_v2": {**g, "acceptance_rate": 0.5}}})
    cells = _cells(tmp_path, ["m"])
    mu = cells["MuSiQue the exception: EA >= GA (3.1)"]["m"].verdict
    assert mu == ("yes: the judge rejects every answer, so EA = 1 - GA by construction "
                  "(a control, not a finding)")
    forced = cells["GA > EA with the forced choice, SQuAD 2.0"]["m"].verdict
    assert forced.endswith("the forced choice accepts every answer, so EA = GA by construction")
    assert cells["GA > EA on SQuAD 2.0 (3.1)"]["m"].verdict == "no"  # 50% accepted: a judge
    # replies without a verdict are not one reply: they count wrong whatever the label
    g2 = {**g, "verdicts": {"correct": 0, "incorrect": 20, "none": 10}}
    _write(tmp_path, "m__asymmetry_metrics.json", {"per_dataset": {"musique": g2}})
    mu2 = _cells(tmp_path, ["m"])["MuSiQue the exception: EA >= GA (3.1)"]["m"].verdict
    assert "by construction" not in mu2 and "10 of 30 replies without a verdict" in mu2


def test_the_packed_state_is_deterministic_checked_and_round_trips(tmp_path):
    from experiments.findings import restore_archived, save_archived
    from experiments.findings.state import SUMS, UNPACKED, pack_state, part_of, unpack_state

    assert part_of("findings/m/steering/parts/a.json") == "findings/m/steering"
    assert part_of("findings/m/records.jsonl") == "findings/m"
    assert part_of("findings/summary.json") == "findings"
    run = tmp_path / "runs/findings/m"
    (run / "steering/parts").mkdir(parents=True)
    (run / "patching/parts").mkdir(parents=True)
    (run / "records.jsonl").write_text('{"id": 1}\n')
    (run / "steering/parts/a.json").write_text('{"x": 2}')
    (run / "patching/parts/p.json").write_text('{"p": 0}')
    packed = tmp_path / "git/state.parts"
    assert save_archived(tmp_path / "runs", packed, ["findings"]).startswith("3 files kept in")
    parts = {p.relative_to(packed).as_posix() for p in packed.rglob("*.tar.xz")}
    assert parts == {"findings/m.tar.xz", "findings/m/steering.tar.xz",
                     "findings/m/patching.tar.xz"}
    first = {p: (packed / p).read_bytes() for p in parts}
    # the same files pack to the same bytes (git keeps one copy), whatever their mtimes
    import os
    os.utime(run / "records.jsonl", (1, 1))
    save_archived(tmp_path / "runs", packed, ["findings"])
    assert {p: (packed / p).read_bytes() for p in parts} == first
    digest = (tmp_path / "runs" / UNPACKED / ".sha256").read_text().strip()
    assert pack_state(tmp_path / "runs" / UNPACKED, tmp_path / "again.parts") == digest
    # a save that changes one stage's files rewrites that part only: the others keep their
    # bytes and their modification times (nothing written)
    stamps = {p: (packed / p).stat().st_mtime_ns for p in parts}
    (run / "steering/parts/b.json").write_text('{"y": 3}')
    save_archived(tmp_path / "runs", packed, ["findings"])
    changed = {p for p in parts if (packed / p).read_bytes() != first[p]}
    assert changed == {"findings/m/steering.tar.xz"}
    assert all((packed / p).stat().st_mtime_ns == stamps[p] for p in parts - changed)
    # and only that part is compressed again (the others' input digests are unchanged); a
    # part whose bytes no longer match its sum is made again
    from experiments.findings import state as st

    made = []
    real = st._tar_xz
    st_tar = lambda folder, files: made.append(len(files)) or real(folder, files)  # noqa: E731
    monkey = pytest.MonkeyPatch()
    monkey.setattr(st, "_tar_xz", st_tar)
    try:
        save_archived(tmp_path / "runs", packed, ["findings"])
        assert made == []
        (run / "steering/parts/c.json").write_text('{"z": 4}')
        save_archived(tmp_path / "runs", packed, ["findings"])
        assert made == [3]
        (packed / "findings/m/patching.tar.xz").write_bytes(b"cut short")
        pack_state(tmp_path / "runs" / UNPACKED, packed)
        assert made == [3, 1] and (packed / "findings/m/patching.tar.xz").read_bytes() == \
            first["findings/m/patching.tar.xz"]
    finally:
        monkey.undo()
    (run / "steering/parts/c.json").unlink()
    save_archived(tmp_path / "runs", packed, ["findings"])
    # a fresh machine restores it; a run that exists is kept
    fresh = tmp_path / "fresh"
    assert restore_archived(packed, fresh) == f"4 files restored from {packed}"
    assert (fresh / "findings/m/steering/parts/a.json").read_text() == '{"x": 2}'
    # a stale stage goes from the packed state too, with its part
    import shutil
    shutil.rmtree(run / "patching")
    save_archived(tmp_path / "runs", packed, ["findings"])
    assert not (packed / "findings/m/patching.tar.xz").exists()
    assert unpack_state(packed, tmp_path / "u") == 3
    assert not (tmp_path / "u/findings/m/patching").exists()
    # a damaged part is refused in one line, and nothing is unpacked
    part = packed / "findings/m/steering.tar.xz"
    part.write_bytes(part.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ValueError, match=f"steering.tar.xz has sha256 .* not .* as {SUMS} "
                                         f"records"):
        unpack_state(packed, tmp_path / "v")
    assert not (tmp_path / "v").exists()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        unpack_state(tmp_path / "none.parts", tmp_path / "w")
    # an archive of an older layout (a file) is refused in one line
    (tmp_path / "old.tar.xz").write_bytes(b"x")
    with pytest.raises(ValueError, match="is not a folder: a saved state is a folder"):
        restore_archived(tmp_path / "old.tar.xz", tmp_path / "w")


def _tree(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_a_truncated_part_with_a_rewritten_checksum_loses_nothing(tmp_path):
    """A damaged part whose sum was written for its cut bytes loses nothing.

    ``--restore-state`` and ``--save-state``: one line, exit 2, the unpacked state and the runs
    untouched.
    """
    import hashlib
    import os
    import subprocess
    import sys

    from experiments.findings import save_archived
    from experiments.findings.state import SUMS, UNPACKED

    runs = tmp_path / "runs"
    run = runs / "findings/m"
    (run / "steering/parts").mkdir(parents=True)
    (run / "records.jsonl").write_text('{"id": 1}\n' * 2000)
    (run / "steering/parts/a.json").write_text('{"x": 2}')
    packed = tmp_path / "git/state.parts"
    save_archived(runs, packed, ["findings"])
    # the unpacked state holds work saved since the packed state (a later part)
    (runs / UNPACKED / "findings/m/steering/parts/b.json").write_text('{"y": 3}')
    part = packed / "findings/m.tar.xz"
    good, sums = part.read_bytes(), (packed / SUMS).read_text()
    part.write_bytes(good[:len(good) // 2])
    (packed / SUMS).write_text(sums.replace(hashlib.sha256(good).hexdigest(),
                                            hashlib.sha256(good[:len(good) // 2]).hexdigest()))
    before = _tree(runs)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    for argv in (["--restore-state", str(packed), str(runs)],
                 ["--save-state", str(runs), str(packed), "findings"]):
        r = subprocess.run([sys.executable, "-m", "experiments.findings", *argv],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith(f"error: {part} does not extract"), r.stderr
        assert f"{runs / UNPACKED} kept as it was" in r.stderr
        assert _tree(runs) == before
        assert not [p.name for p in runs.iterdir() if p.name.endswith(
            (".unpacking", ".replaced", ".restoring"))]
    # with nothing unpacked yet (a fresh machine), the same: nothing made
    fresh = tmp_path / "fresh"
    r = subprocess.run([sys.executable, "-m", "experiments.findings", "--restore-state",
                        str(packed), str(fresh)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "nothing unpacked" in r.stderr, r.stderr
    assert not fresh.exists() or not any(fresh.iterdir())
    # the part taken back whole restores as before
    part.write_bytes(good)
    (packed / SUMS).write_text(sums)
    r = subprocess.run([sys.executable, "-m", "experiments.findings", "--restore-state",
                        str(packed), str(fresh)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (fresh / "findings/m/records.jsonl").read_text() == '{"id": 1}\n' * 2000


def test_a_restore_that_fails_half_way_leaves_no_run_folder(tmp_path, monkeypatch):
    from experiments.findings import state

    src = tmp_path / "state/findings"
    (src / "m").mkdir(parents=True)
    for i in range(3):
        (src / f"m/p{i}.json").write_text("{}")
    real, calls = state.shutil.copy2, []

    def full_disk(a, b):
        calls.append(a)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(a, b)

    monkeypatch.setattr(state.shutil, "copy2", full_disk)
    with pytest.raises(OSError, match="No space left"):
        state.restore_state(tmp_path / "state", tmp_path / "runs")
    assert not (tmp_path / "runs/findings").exists()
    assert [p.name for p in (tmp_path / "runs").iterdir()] == []
    monkeypatch.setattr(state.shutil, "copy2", real)
    assert state.restore_state(tmp_path / "state", tmp_path / "runs") == 3



@pytest.mark.parametrize("ci, threshold, sign, want", [
    ([0.1, 0.3], 0.0, +1, "supported"), ([-0.3, -0.1], 0.0, +1, "contradicted"),
    ([-0.1, 0.2], 0.0, +1, "undecided"), ([0.0, 0.0], 0.0, +1, "contradicted"),
    ([-0.3, -0.1], 0.0, -1, "supported"), ([0.1, 0.3], 0.0, -1, "contradicted"),
    ([0.0, 0.0], 0.0, -1, "contradicted"), ([0.0, 0.0], 0.0, 0, "supported"),
    ([-0.2, 0.1], 0.0, 0, "undecided"), ([-0.2, -0.1], 0.0, 0, "contradicted"),
    ([0.55, 0.7], 0.5, +1, "supported"), ([0.45, 0.6], 0.5, +1, "undecided"),
    (None, 0.0, +1, "undecided"), ([None, 0.2], 0.0, +1, "undecided"),
])
def test_a_ci_decides_a_claim_only_when_it_excludes_the_threshold(ci, threshold, sign, want):
    from experiments.findings.claims import decide

    assert decide(ci, threshold, sign) == want


def test_controls_decide_a_claim_both_ways():
    """(d): every control decides its claim both ways.

    A contradicting control reverses a claim; a supporting one reverses a contradicted claim;
    an undecided one leaves a decided claim undecided; a subgroup is not a control.
    """
    from experiments.findings.claims import Cell
    from experiments.findings.rules import NOT_TESTABLE, REVERSED, controlled

    def row(claim, decision):
        return {"claim": claim, "cells": {"m": Cell(1.0, [0.5, 1.5], 10, 10, "yes",
                                                    decision=decision)}}

    rows = controlled([row("A", "supported"), row("a control", "undecided"),
                       row("B", "supported"), row("a subgroup", "contradicted"),
                       row("another control", "supported"),
                       row("C", "contradicted"), row("its control", "undecided"),
                       row("D", "undecided"), row("D's control", "contradicted"),
                       row("E", "contradicted"), row("E's control", "supported"),
                       row("F", NOT_TESTABLE), row("F's control", "contradicted")],
                      {"A": ["a control"], "B": ["another control"], "C": ["its control"],
                       "D": ["D's control"], "E": ["E's control"], "F": ["F's control"]})
    got = {r["claim"]: r["cells"]["m"] for r in rows}
    assert (got["A"].decision, got["A"].verdict) == (
        "undecided", "yes; its control (a control) reads undecided")
    assert got["B"].decision == "supported"   # a subgroup is not a control; the control agrees
    assert got["C"].decision == "undecided"   # a contradiction needs its controls too
    assert got["D"].decision == got["E"].decision == got["F"].decision == REVERSED


def test_every_claims_row_declares_each_step_of_the_rule():
    """(a)-(e) for every row.

    A threshold, the discriminability precondition or why not, a coverage check or why not,
    its controls or why none, and how its unit was selected.
    """
    from experiments.findings.claims import CLAIMS
    from experiments.findings.rules import RULES, Rule

    names = [c[0] for c in CLAIMS]
    assert sorted(names) == sorted(RULES), "every row has exactly one rule"
    bad = {n: RULES[n].problems() for n in names if RULES[n].problems()}
    assert not bad, bad
    for n in names:   # a control named by a rule is a row of the table
        assert set(RULES[n].controls) <= set(names), n
    # the check itself fails on a rule that skips a step
    assert Rule("", (), "", "x", (), "", "maybe").problems() == [
        "(a) no threshold", "(b) give judge AUCs or why the row is not about judging, not both",
        "(c) no coverage check", "(d) give control rows or why there is none, not both",
        "(e) selection must be none, held out or same"]


def _study1(d: Path, model: str, auc_ci, *, sub: str = "", none: int = 0, ci=(-0.3, -0.1),
            coverage: float = 0.9) -> None:
    g = {"n": 100, "n_passages": 100, "GA": 0.5, "EA": 0.3, "delta": -0.2, "delta_ci": list(ci),
         "verdicts": {"accept": 50, "reject": 50 - none, "none": none},
         "acceptance_rate": 0.5, "auc_logit_diff": sum(auc_ci) / 2,
         "auc_logit_diff_ci": list(auc_ci), "mean_verdict_coverage": coverage}
    (d / sub).mkdir(parents=True, exist_ok=True)
    (d / f"{sub}{model}__asymmetry_metrics.json").write_text(json.dumps(
        {"per_dataset": {"squad_v2": g}, "overall": g}))


def test_a_claim_about_judging_needs_a_judge_that_discriminates(tmp_path):
    """(b) and (c) on a Study 1 row.

    GA > EA with a judge whose AUC CI spans 0.5 is not testable, whatever its CI says; with one
    whose AUC CI excludes 0.5 the CI decides; coverage under the floor and a CI of zero width
    are not measurable.
    """
    from experiments.findings.rules import NOT_TESTABLE

    claim = "GA > EA on SQuAD 2.0 (3.1)"
    _study1(tmp_path, "chance", (0.45, 0.62))
    _study1(tmp_path, "good", (0.6, 0.8))
    _study1(tmp_path, "mute", (0.6, 0.8), none=60)
    _study1(tmp_path, "flat", (0.6, 0.8), ci=(-0.2, -0.2))
    for m in ("chance", "good", "mute", "flat"):   # controls that agree
        _study1(tmp_path, m, (0.6, 0.8), sub="matched/")
    cells = _cells(tmp_path, ["chance", "good", "mute", "flat"])[claim]
    assert cells["chance"].decision == NOT_TESTABLE
    assert "judge AUC 0.54 [0.45, 0.62] (default squad_v2)" in cells["chance"].verdict
    assert cells["good"].decision == "supported"
    assert cells["mute"].decision == "not measurable" and "a verdict on 40%" in \
        cells["mute"].verdict
    assert cells["flat"].decision == "not measurable" and "zero width" in cells["flat"].verdict


def test_a_degenerate_measurement_is_not_measurable_and_says_why(tmp_path):
    g = {"n": 30, "n_passages": 30, "GA": 0.0, "EA": 0.8, "delta": 0.8, "delta_ci": [0.6, 0.9],
         "acceptance_rate": 0.2, "verdicts": {"accept": 6, "reject": 8, "none": 16}}
    one = {"n": 30, "n_passages": 30, "GA": 0.4, "EA": 0.6, "delta": 0.2,
           "delta_ci": [0.1, 0.3], "acceptance_rate": 0.0}
    _write(tmp_path, "m__asymmetry_metrics.json", {"per_dataset": {"musique": g, "drop": one}})
    cells = _cells(tmp_path, ["m"])
    mu = cells["MuSiQue the exception: EA >= GA (3.1)"]["m"]
    assert mu.decision == "not measurable" and "GA = 0 of 30" in mu.verdict
    dr = cells["GA > EA on DROP (3.1)"]["m"]
    assert dr.decision == "not measurable" and "rejects every answer" in dr.verdict
    low = {**one, "acceptance_rate": 0.3, "verdicts": {"accept": 5, "reject": 5, "none": 20}}
    _write(tmp_path, "m__asymmetry_metrics.json", {"per_dataset": {"drop": low}})
    dr = _cells(tmp_path, ["m"])["GA > EA on DROP (3.1)"]["m"]
    assert dr.decision == "not measurable" and "a verdict on 33%, under 50%" in dr.verdict


def test_the_held_out_head_is_chosen_on_one_half_and_measured_on_the_other():
    from experiments.findings.held_out_heads import choose, halves, held_out

    passages = [f"p{i}" for i in range(8)]
    a, b = halves(passages)
    assert a | b == set(passages) and not a & b and len(a) == len(b) == 4

    def part(passage, effects):  # clean 2, corrupt 0: a head's ld is its restored share x 2
        return {"meta": {"passage": passage, "clean_ld": 2.0, "corrupt_ld": 0.0},
                "rows": [{"layer": 1, "head": h, "verified": True, "ld": 2.0 * e}
                         for h, e in effects.items()]}

    parts = [part(p, {0: 0.9, 1: 0.95} if p in a else {0: 0.9}) for p in passages]
    parts[0]["rows"] = parts[0]["rows"][:1] if passages[0] in a else parts[0]["rows"]
    got = choose(parts, a)
    assert got["head"] in ("L1.H0", "L1.H1") and got["n_selection_pairs"] == 4
    assert choose(parts, b) == {"head": "L1.H0", "ratio": pytest.approx(0.9), "n_pairs": 4,
                                "n_selection_pairs": 4}
    test = {"pairs": [{"passage": p, "clean_ld": 2.0, "corrupt_ld": 0.0,
                       "heads": {"L1.H0": {"denoised_ld": 1.6}}} for p in passages]}
    r = held_out(test, "L1.H0", b)
    assert r["value"] == pytest.approx(0.8) and r["n"] == 4
    assert held_out(test, "L9.H9", b) is None  # the head test did not patch it


def _stat(mean, lo, hi, n=200, p=60):
    return {"mean": mean, "ci": [lo, hi], "n": n, "n_passages": p}


def test_lens_cells_compare_the_judge_with_the_generator_and_name_a_constant_verdict(tmp_path):
    row, tuned = ("the judge's verdict forms later than the generator's answer (logit lens)",
                  "... through the tuned lens")
    assert _cells(tmp_path, ["m"])[row]["m"].value is None
    curves = {"first_agreeing_depth": _stat(0.8, 0.75, 0.85), "final_positive_share": 0.6,
              "n": 200, "n_passages": 60}
    whole = {**curves, "first_agreeing_depth": _stat(0.02, 0.0, 0.05)}
    gen = {"first_agreeing_depth": _stat(0.5, 0.4, 0.6), "final_positive_share": 0.3,
           "n": 150, "n_passages": 50}
    _write(tmp_path, "views/m__lens_summary.json", {
        "judge_first": {"logit": curves, "tuned": {
            **curves, "first_agreeing_depth": _stat(0.55, 0.5, 0.62)}},
        "judge": {"logit": whole}, "gen": {"logit": gen, "tuned": gen}})
    cells = _cells(tmp_path, ["m"])
    c = cells[row]["m"]
    assert (c.value, c.decision) == (0.8, "supported")    # 0.75 > 0.6: wholly above
    assert c.verdict.startswith("judge 0.80 [0.75, 0.85] of depth (whole reply 0.02), "
                                "generator 0.50")
    assert c.source.endswith("judge_first.logit.first_agreeing_depth.mean")
    assert cells[tuned]["m"].decision == "undecided"       # the intervals overlap
    # one layer decides it: letting one later layer disagree, the judge's depth falls under
    # the generator's, so a strict "supported" is not a finding
    _write(tmp_path, "views/m__lens_summary.json", {
        "judge_first": {"logit": {**curves, "first_agreeing_depth_skip1": _stat(
            0.1, 0.05, 0.15)}},
        "gen": {"logit": {**gen, "first_agreeing_depth_skip1": _stat(0.45, 0.35, 0.55)}}})
    c = _cells(tmp_path, ["m"])[row]["m"]
    assert (c.value, c.decision) == (0.8, "undecided")
    assert "one layer decides it: letting one later layer disagree, judge 0.10 [0.05, 0.15], " \
           "generator 0.45 [0.35, 0.55] (contradicted)" in c.verdict
    # ... and where both readings decide alike, the strict one stands
    _write(tmp_path, "views/m__lens_summary.json", {
        "judge_first": {"logit": {**curves, "first_agreeing_depth_skip1": _stat(
            0.7, 0.65, 0.75)}},
        "gen": {"logit": {**gen, "first_agreeing_depth_skip1": _stat(0.45, 0.35, 0.55)}}})
    c = _cells(tmp_path, ["m"])[row]["m"]
    assert c.decision == "supported" and "one layer" not in c.verdict
    # a judge whose final verdict is Correct on 97% of records: agreement is about one class
    _write(tmp_path, "views/m__lens_summary.json", {
        "judge_first": {"logit": {**curves, "final_positive_share": 0.97}},
        "gen": {"logit": gen}})
    c = _cells(tmp_path, ["m"])[row]["m"]
    assert c.decision == "not measurable" and "favours Correct on 97% of records" in c.verdict
    # ... and a generator whose gold token loses to another on 96% of records
    _write(tmp_path, "views/m__lens_summary.json", {
        "judge_first": {"logit": curves},
        "gen": {"logit": {**gen, "final_positive_share": 0.04}}})
    c = _cells(tmp_path, ["m"])[row]["m"]
    assert c.decision == "not measurable" and "favours another token on 96%" in c.verdict


def test_pairwise_cells_read_both_orders_and_call_a_one_letter_judge_so(tmp_path):
    content = "a pairwise judge prefers the right answer wherever it stands"
    position = "... and one slot whatever it holds (position bias)"
    consistent = "... its verdict survives the swap more often than not"
    heads = ("... the top head of the swap, chosen on half the passages, carries it on the "
             "other half (held out)")
    units = ("... the fewest units carrying half the position term, chosen on half the "
             "passages, carry half on the other half (held out)")
    assert _cells(tmp_path, ["m"])[content]["m"].value is None

    def summary(flip_first, flip_second, consistent_, content_, position_, gap):
        return {"outcomes": {"all": {
            "consistent": _stat(consistent_, consistent_ - 0.05, consistent_ + 0.05),
            "accurate": _stat(0.5, 0.45, 0.55), "flip_first": _stat(flip_first, 0, 1),
            "flip_second": _stat(flip_second, 0, 1),
            "content": _stat(content_, content_ - 0.3, content_ + 0.3),
            "position": _stat(position_, position_ - 0.2, position_ + 0.2)}},
            "patching": {"gap": _stat(gap, gap - 0.5, gap + 0.5)},
            "held_out": {"order_heads": [{"unit": "L3.H1", "select_share": 0.6,
                                          "test": {"share": 0.4, "ci": [0.2, 0.6], "n": 100,
                                                   "n_passages": 30}}],
                         "position_units": {"units": ["L4.H0", "L5.MLP"], "select_share": 0.7,
                                            "test": {"share": 0.45, "ci": [0.3, 0.6], "n": 100,
                                                     "n_passages": 30}}}}

    _write(tmp_path, "views/m__pairwise_summary.json", summary(0.2, 0.1, 0.7, 1.5, -0.5, -3.0))
    cells = _cells(tmp_path, ["m"])
    assert (cells[content]["m"].value, cells[content]["m"].decision) == (1.5, "supported")
    p = cells[position]["m"]
    assert p.decision == "supported" and p.verdict.startswith("towards the second slot")
    assert cells[consistent]["m"].decision == "supported"            # 0.65 > 0.5
    h = cells[heads]["m"]
    assert (h.value, h.decision) == (0.4, "supported") and h.verdict.startswith("L3.H1")
    u = cells[units]["m"]
    assert (u.value, u.decision) == (0.45, "undecided") and "L4.H0, L5.MLP" in u.verdict
    # a judge that answers A in both orders of every pair: consistency 0 by construction, and
    # a swap that moves its score by 0.1 nat leaves the patching shares without a denominator
    _write(tmp_path, "views/m__pairwise_summary.json", summary(1.0, 0.0, 0.0, 0.05, 2.2, -0.1))
    cells = _cells(tmp_path, ["m"])
    c = cells[consistent]["m"]
    assert c.decision == "not measurable" and c.verdict.endswith(
        "the judge answers A in both orders of every pair")
    assert cells[position]["m"].verdict.startswith("towards the first slot")
    assert cells[content]["m"].decision == "undecided"
    h = cells[heads]["m"]
    assert h.decision == "not measurable" and "under 1 nat" in h.verdict
    # one unit carrying 4x the total: its terms and the others' cancel, it is not a share
    r = summary(1.0, 0.0, 0.0, 0.05, 2.2, -0.1)
    r["held_out"]["position_units"]["test"]["share"] = 4.2
    _write(tmp_path, "views/m__pairwise_summary.json", r)
    u = _cells(tmp_path, ["m"])[units]["m"]
    assert u.decision == "not measurable" and "4.20 is not a share" in u.verdict


def test_holm_and_ci_p_values_by_hand():
    """Holm (1979): p sorted 0.01, 0.02, 0.04 over 3 -> 0.03, 0.04, 0.04 (monotone)."""
    from experiments.findings.rules import PRIMARY, RULES, ci_p_value, holm

    assert holm({"a": 0.04, "b": 0.01, "c": 0.02}) == pytest.approx(
        {"b": 0.03, "c": 0.04, "a": 0.04})
    assert holm({"a": 0.6, "b": 0.5}) == {"b": 1.0, "a": 1.0}
    # a 95% interval that touches the null gives p = 0.05; a zero-width one gives none
    assert ci_p_value(1.96, [0.0, 3.92], 0.0) == pytest.approx(0.05, abs=1e-4)
    assert ci_p_value(1.0, [1.0, 1.0], 0.0) is None
    assert set(PRIMARY) <= set(RULES) and len(PRIMARY) >= 5


def test_the_replication_split_is_by_passage_committed_and_read_by_no_selection():
    """The replication split is by passage, committed, and read by no selection.

    The committed ids are the rule's on the bundled validation records (a fifth of the
    passages, every question of a passage on one side), and no code but the replication
    module names the file.
    """
    from experiments.findings.replication import IDS_FILE, SHARE, in_split, replication_ids
    from interp.data import passage_key

    recs = []
    for ds in ("squad_v2", "drop", "hotpotqa", "musique"):
        path = ROOT / "interp" / "bundled" / ds / "validation.jsonl"
        recs += [{**json.loads(x), "dataset": ds} for x in path.read_text().splitlines()]
    ids = json.loads(IDS_FILE.read_text())["ids"]
    every = replication_ids(recs)
    for ds, kept in ids.items():
        assert set(kept) <= set(every[ds])
    by_passage: dict[str, set[bool]] = {}
    for r in recs:
        by_passage.setdefault(passage_key(r), set()).add(in_split(passage_key(r)))
    assert all(len(v) == 1 for v in by_passage.values())
    share = sum(in_split(p) for p in by_passage) / len(by_passage)
    assert abs(share - 1 / SHARE) < 0.05
    code = [p for p in (*ROOT.joinpath("interp").rglob("*.py"),
                        *ROOT.joinpath("experiments").rglob("*.py"))]
    assert [p.name for p in code if "IDS_FILE" in p.read_text()] == ["replication.py"]
    # the report only names it in a sentence
    assert sorted(p.name for p in code if "replication_ids" in p.read_text()) == [
        "replication.py", "report.py"]


def test_a_bound_that_prints_as_its_threshold_gets_the_digit_that_decides():
    from experiments.findings.claims import Cell

    assert Cell(0.59, [0.502, 0.681], n=150).text() == "0.59 [0.502, 0.681] (n=150)"
    assert Cell(0.59, [0.4976, 0.68]).text() == "0.59 [0.498, 0.680]"
    assert Cell(0.59, [0.5, 0.68]).text() == "0.59 [0.50, 0.68]"      # on it: nothing to show
    assert Cell(0.2, [0.11, 0.3]).text() == "0.20 [0.11, 0.30]"
    assert Cell(0.01, [-0.0004, 0.02], fmt="+.3f").text() == "+0.010 [-0.0004, +0.0200]"
