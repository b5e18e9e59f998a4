"""The patching stage on the bundled model and a finished asymmetry run of real records."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from interp.judging.grading import RuleOracle
from interp.stages.patching import PatchingConfig, run
from interp.store.rundir import RunDir


@pytest.mark.integration
def test_bundled_quick_run_patching(bundled, quick_run, tmp_path):
    shutil.copytree(quick_run.path, tmp_path / "run")
    run_dir = RunDir(tmp_path / "run")
    cfg = PatchingConfig.from_mapping({"pairs": ["candidate-swap", "gen-to-eval"],
                                       "kinds": ["resid"], "limit": 1, "layer_stride": 10,
                                       "per_position": False, "top_k": 4, "n_boot": 50,
                                       "hard_negative_attempts": 3, "progress": False})
    summary = run(run_dir, bundled, cfg, log=lambda s: None)
    cs = summary["candidate-swap/resid"]
    assert cs["layers"] == [0, 10, 20]
    assert sum(cs["pairs_by_source"].values()) == cs["n_pairs"] >= 1
    assert set(cs["pairs_by_source"]) <= {"own", "hard_negative", "mined"}
    pairs = pd.read_parquet(run_dir.path / "patching/candidate-swap/resid/pairs.parquet")
    recs = {(r["dataset"], r["id"]): r for r in run_dir.read_records()}
    for _, p in pairs.iterrows():  # the invariant on real records
        r = recs[(p.dataset, p.id)]
        assert not RuleOracle().grade(p.corrupt_answer, r["answers"], dataset=p.dataset).label
    ge = summary["gen-to-eval/resid"]
    assert sorted(ge["by_layer"]) == [0, 10, 20]
    # resid_pre of layer 0 at the last position holds the same token in both prompts
    assert ge["by_layer"][0]["mean_d_ld"] == pytest.approx(0.0, abs=1e-4)
