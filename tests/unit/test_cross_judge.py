"""Cross-judging on two tiny random models: given answers, labels, metrics, the matrix."""

from __future__ import annotations

import json

import numpy as np
import pytest

from interp.asymmetry import group_metrics
from interp.cross_judge import judge_matrix, load_answer_source, source_metrics
from interp.errors import ConfigError, RunDirError
from interp.stages.asymmetry import AsymmetryConfig, run
from interp.store import RunDir, read_json, write_jsonl
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
        run(AsymmetryConfig(model=models[m], **base), root / m, log=_quiet)
        _give_right_answers(root / m, every=2 if m == "B" else 3)
    for j, s in (("A", "B"), ("B", "A")):
        run(AsymmetryConfig(model=models[j], answers_from=str(root / s), **base),
            root / f"{j}_on_{s}", log=_quiet)
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
        run(AsymmetryConfig(**{**cfg, "template": "reference"}), root / "x1", log=_quiet)
    with pytest.raises(ConfigError, match="oracle 'rule'"):
        run(AsymmetryConfig(**{**cfg, "oracle": "model:x"}), root / "x2", log=_quiet)
    with pytest.raises(RunDirError, match="no manifest.json"):
        run(AsymmetryConfig(**{**cfg, "answers_from": str(root / "nowhere")}), root / "x3",
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
        run(AsymmetryConfig(**{**cfg, "answers_from": str(bad)}), root / "x4", log=_quiet)


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
