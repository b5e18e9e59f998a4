"""Cross-judging on two tiny random models: given answers, labels, metrics, the matrix."""

from __future__ import annotations

import json

import numpy as np
import pytest

from interp.core.errors import ConfigError, RunDirError
from interp.core.io import read_json, write_jsonl
from interp.methods.asymmetry import group_metrics
from interp.methods.cross_judge import judge_matrix, load_answer_source, source_metrics
from interp.run.cross_grid import cross_probe
from interp.stages.asymmetry import AsymmetryConfig, run
from interp.store import RunDir
from interp.testing import rehearsal_datasets, tiny_checkpoint

N = 8


def _quiet(_: str) -> None:
    pass


def _give_right_answers(run_dir, every: int = 2) -> None:
    """Make every ``every``-th answer of a run its gold answer (y* Correct under the rule)."""
    rd = RunDir(run_dir)
    recs = rd.read_records(status=None)
    for i, r in enumerate(recs):
        if r["status"] == "ok" and i % every == 0:
            r["answer"] = r["generation"] = r["answers"][0]
            r["oracle_label"] = True
            r["verdict"], r["verdict_source"] = True, "word"
    write_jsonl(rd.records_path, recs)


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """Two tiny models, their self runs (B's with half its answers right) and both cross runs."""
    root = tmp_path_factory.mktemp("cross")
    models = {"A": str(tiny_checkpoint(root / "ma", seed=0)),
              "B": str(tiny_checkpoint(root / "mb", seed=1, n_layers=3))}
    data = rehearsal_datasets(root / "data", n=N, names=("squad_v2",))["squad_v2"]
    base = dict(datasets=[data], limit=N, batch_size=N, n_boot=200, max_new_tokens=6,
                device="cpu")
    for m in models:
        run(root / m, None, AsymmetryConfig(model=models[m], **base), log=_quiet)
        _give_right_answers(root / m, every=2 if m == "B" else 3)
    for j, s in (("A", "B"), ("B", "A")):
        run(root / f"{j}_on_{s}", None,
            AsymmetryConfig(model=models[j], answers_from=str(root / s), **base), log=_quiet)
    return root, models, base


def test_cross_run_judges_the_source_answers_with_its_labels(grid):
    root, models, _ = grid
    src = {(r["dataset"], r["id"]): r for r in RunDir(root / "B").read_records()}
    judged = RunDir(root / "A_on_B").read_records()
    assert len(judged) == len(src) == N
    for r in judged:
        s = src[(r["dataset"], r["id"])]
        assert r["answer"] == s["answer"] and r["generation"] == s["generation"]
        assert r["oracle_label"] == s["oracle_label"] and r["oracle"] == s["oracle"]
        assert r["model"] == models["A"]
        assert r["answer_source"] == {"model": models["B"], "run": str(root / "B")}
    m = read_json(root / "A_on_B" / "metrics.json")
    (block,) = m["answer_sources"].values()
    ga = np.mean([s["oracle_label"] for s in src.values()])
    assert block["GA"] == pytest.approx(ga) == pytest.approx(0.5)
    assert block["delta"] == pytest.approx(block["EA"] - block["GA"])
    assert block["judge"] == [models["A"]]
    assert "answer_sources" not in read_json(root / "A" / "metrics.json")  # self runs unchanged


def test_cross_run_refuses_another_template_oracle_or_records(grid):
    root, models, base = grid
    cfg = dict(base, model=models["A"], answers_from=str(root / "B"))
    with pytest.raises(ConfigError, match="template 'default', this run asks for 'reference'"):
        run(root / "x1", None, AsymmetryConfig(**{**cfg, "template": "reference"}), log=_quiet)
    with pytest.raises(ConfigError, match="oracle 'rule'"):
        run(root / "x2", None, AsymmetryConfig(**{**cfg, "oracle": "model:x"}), log=_quiet)
    with pytest.raises(RunDirError, match="no manifest.json"):
        run(root / "x3", None, AsymmetryConfig(**{**cfg, "answers_from": str(root / "nowhere")}),
            log=_quiet)
    assert not (root / "x1").exists() and not (root / "x3").exists()
    # a stored label the rule oracle does not give is refused (another oracle version)
    bad = root / "B_bad"
    import shutil

    shutil.copytree(root / "B", bad)
    recs = RunDir(bad).read_records(status=None)
    recs[1]["oracle_label"] = not recs[1]["oracle_label"]
    write_jsonl(RunDir(bad).records_path, recs)
    with pytest.raises(RunDirError, match=r"differs from 1 selected example.*oracle_label"):
        run(root / "x4", None, AsymmetryConfig(**{**cfg, "answers_from": str(bad)}), log=_quiet)


def test_source_metrics_group_by_answer_source(grid):
    root, models, _ = grid
    recs = RunDir(root / "A_on_B").read_records() + RunDir(root / "A").read_records()
    blocks = source_metrics(recs, n_boot=50)
    assert sorted(b["answer_source"]["model"] for b in blocks.values()) == sorted(models.values())
    assert sum(b["n"] for b in blocks.values()) == 2 * N


def test_judge_matrix_cells_and_paired_self_minus_other(grid):
    root, models, _ = grid
    runs = {models["A"]: {models["A"]: root / "A", models["B"]: root / "A_on_B"},
            models["B"]: {models["B"]: root / "B", models["A"]: root / "B_on_A"}}
    mx = judge_matrix(runs, n_boot=300, seed=1)
    self_a = group_metrics(RunDir(root / "A").read_records(), n_boot=0)  # the doctored records
    assert mx["cells"][models["A"]][models["A"]]["EA"] == self_a["EA"] > 0
    assert mx["cells"][models["A"]][models["B"]]["GA"] == pytest.approx(0.5)
    d = mx["self_minus_other"][models["A"]][models["B"]]

    def ea(path):
        rs = {(r["dataset"], r["id"]): r for r in RunDir(path).read_records()}
        return {k: r["verdict"] is not None and r["verdict"] == r["oracle_label"]
                for k, r in rs.items()}

    a, b = ea(root / "A"), ea(root / "A_on_B")
    want = np.mean([a[k] - b[k] for k in a])
    assert d["n"] == N and d["EA_diff"] == pytest.approx(want)
    lo, hi = d["EA_diff_ci"]
    assert lo <= d["EA_diff"] <= hi and lo < hi
    sj = mx["self_judge_minus_other"][models["B"]][models["A"]]
    bb, ab = ea(root / "B"), ea(root / "A_on_B")
    assert sj["EA_diff"] == pytest.approx(np.mean([bb[k] - ab[k] for k in bb]))
    json.dumps(mx)  # JSON-safe


def test_answer_source_chains_through_a_cross_judged_source(grid):
    """A cross-judged run used as a source passes on who generated the answers."""
    root, models, _ = grid
    src = load_answer_source(root / "A_on_B")
    key = next(iter(src.records))
    assert src.given(key).source == {"model": models["B"], "run": str(root / "B")}


def test_interp_run_cross_judge_fills_the_matrix(grid, tmp_path):
    """`interp run` with two models and cross_judge = true: cross runs, stages, matrix, figure."""
    from interp.run.pipeline import run_config

    root, models, base = grid
    cfg = {"name": "cross", "out": str(tmp_path / "grid"), "cross_judge": True,
           "asymmetry": {"models": [models["A"], models["B"]], "datasets": base["datasets"],
                         "limit": 4, "batch_size": 4, "n_boot": 100, "max_new_tokens": 4,
                         "device": "cpu"},
           "attention": {"band": "all", "n_boot": 50, "figures": False}}
    run_config(cfg, log=_quiet)
    out = tmp_path / "grid"
    mx = read_json(out / "cross_judge.json")
    assert mx["judges"] == mx["sources"] == [models["A"], models["B"]]
    for j in mx["judges"]:
        assert all(mx["cells"][j][s]["n"] == 4 for s in mx["sources"])
    cross = out / "ma__judges__mb"
    assert mx["cells"][models["A"]][models["B"]]["run"] == str(cross)
    assert (cross / "attention" / "summary.json").exists()  # a stage on the cross-judged run
    assert {r["answer"] for r in RunDir(cross).read_records()} == {
        r["answer"] for r in RunDir(out / "mb").read_records()}
    assert (out / "figures" / "cross_judge.png").exists()
    assert "self minus other" in (out / "cross_judge.txt").read_text()
    with pytest.raises(ConfigError, match="two or more"):
        run_config({**cfg, "asymmetry": {**cfg["asymmetry"], "models": [models["A"]]}},
                   log=_quiet)


def test_cross_stage_config_keeps_the_probe_eval_task_only():
    from interp.run.cross_grid import cross_stage_config
    from interp.stages.attention import AttentionConfig
    from interp.stages.probe import ProbeConfig

    cfg = ProbeConfig(tasks=["eval", "gen"], permutations=100)
    got = cross_stage_config("probe", cfg)
    assert got.tasks == ["eval"] and got.permutations == 100 and cfg.tasks == ["eval", "gen"]
    att = AttentionConfig()
    assert cross_stage_config("attention", att) is att


def test_cli_answers_from(grid, tmp_path):
    from typer.testing import CliRunner

    from interp.cli import app

    root, models, base = grid
    res = CliRunner().invoke(app, ["asymmetry", "--model", models["A"], "--dataset",
                                   base["datasets"][0], "--limit", "3", "--max-new-tokens", "4",
                                   "--answers-from", str(root / "B"), "--out",
                                   str(tmp_path / "cli")])
    assert res.exit_code == 0, res.output
    assert all(r["answer_source"]["model"] == models["B"]
               for r in RunDir(tmp_path / "cli").read_records())
    res = CliRunner().invoke(app, ["asymmetry", "--model", models["A"], "--dataset",
                                   base["datasets"][0], "--limit", "3", "--answers-from",
                                   str(root / "B"), "--template", "reference", "--out",
                                   str(tmp_path / "cli2")])
    assert res.exit_code == 2 and "judge with the source's template" in res.output


def test_cross_probe_scores_both_judges_on_the_probe_folds(grid):
    """Probes of A's residual stream on B's answers, A's and B's verbal judges on its folds."""
    from interp.analysis.stats import make_folds, passage_groups
    from interp.methods.probing import judge_metrics
    from interp.models.loading import load_model
    from interp.plots.cross import plot_cross_probe
    from interp.stages import probe as probe_stage

    root, models, _ = grid
    handle = load_model(models["A"], device="cpu")
    cfg = probe_stage.ProbeConfig(folds=2, probes=["logreg"], tasks=["eval"])
    res = probe_stage.run(RunDir(root / "A_on_B"), handle, cfg, log=_quiet)
    e = cross_probe(root / "A_on_B", root / "B")
    assert e["judge"] == models["A"] and e["answers_of"] == models["B"]
    assert e["class_counts"] == {"correct": 4, "incorrect": 4}
    assert e["per_layer"]["layers"] == [0, 1]
    best = res["tasks"]["eval"]["best"]
    assert e["per_layer"]["pools"][best["pool"]]["auc"][best["layer"]] == best["auc"]
    assert e["judge_verbal_folds"] == res["judge"]["folds"]
    src = RunDir(root / "B").read_records()
    y = np.array([r["oracle_label"] for r in src])
    folds = make_folds(y, 2, 0, groups=np.array(passage_groups(src)))
    assert e["source_self_judge_folds"] == judge_metrics(src, folds)["folds"]
    assert plot_cross_probe([e], root / "figs").exists()
    with pytest.raises(RunDirError, match="not the source"):
        cross_probe(root / "A_on_B", root / "A")


def test_steering_record_and_audit_stages_run_on_a_cross_judged_run(grid, tmp_path):
    """The eval prompt of a cross-judged record has the usual shape: the stages run unchanged."""
    import shutil

    from interp.models.loading import load_model
    from interp.stages import STAGES

    root, models, _ = grid
    d = tmp_path / "A_on_B"
    shutil.copytree(root / "A_on_B", d)
    handle = load_model(models["A"], device="cpu")
    tables = {"steering": {"alphas": [0.5, 1.0], "band": "0-1", "limit": 2, "tasks": ["eval"],
                           "n_boot": 10},
              "record": {"what": "attention", "layers": "all", "limit": 2, "band": "all"},
              "audit": {"band": "all", "folds": 2, "n_boot": 20}}
    for name, table in tables.items():
        stage = STAGES[name]
        cfg = stage.SPEC.config_class.from_mapping(table)
        summary = stage.run(RunDir(d), handle, cfg, log=_quiet)
        assert stage.format_summary(summary)
    assert (d / "steering" / "summary.json").exists() and (d / "record").is_dir()
    assert read_json(d / "audit" / "summary.json")["n"] == N


def test_findings_report_reads_the_matrix_it_is_given(grid, tmp_path):
    """The findings report's self-vs-other rows are the matrix's own numbers, per model."""
    from experiments.findings.report import claims
    from interp.core.names import model_slug

    root, models, _ = grid
    runs = {models["A"]: {models["A"]: root / "A", models["B"]: root / "A_on_B"},
            models["B"]: {models["B"]: root / "B", models["A"]: root / "B_on_A"}}
    mx = judge_matrix(runs, n_boot=200, seed=0)
    (tmp_path / "cross_judge.json").write_text(json.dumps(mx))
    slugs = {m: model_slug(spec) for m, spec in models.items()}
    rows = {r["claim"]: r["cells"] for r in claims(tmp_path, list(slugs.values()))}
    names = ["a model judges its own answers better than another's (3.1, self vs other)",
             "... better than the other model judges them (same answers)"]
    own, same = rows[names[0]], rows[names[1]]
    for m, other in (("A", "B"), ("B", "A")):
        d = mx["self_minus_other"][models[m]][models[other]]
        c = own[slugs[m]]
        assert (c.value, list(c.ci), c.n, c.n_passages) == (
            d["EA_diff"], list(d["EA_diff_ci"]), d["n"], d["n_passages"])
        assert f"of {slugs[other]}'s {d['GA_other']:.2f}" in c.verdict
        s = mx["self_judge_minus_other"][models[m]][models[other]]
        assert (same[slugs[m]].value, same[slugs[m]].n) == (s["EA_diff"], s["n"])
        assert same[slugs[m]].verdict.endswith(f"(judged by {slugs[other]})")
    # a folder without the matrix says so, cell by cell
    empty = claims(tmp_path / "none", [slugs["A"]])
    assert [r["cells"][slugs["A"]].verdict for r in empty if r["claim"] in names] == [
        "not measured", "not measured"]
