"""The patching stage on the bundled model and a finished asymmetry run of real records."""

from __future__ import annotations

import shutil

import pytest

from interp.stages.patching import PatchingConfig, run
from interp.store import RunDir


@pytest.mark.integration
def test_bundled_quick_run_patching(bundled, quick_run, tmp_path):
    shutil.copytree(quick_run.path, tmp_path / "run")
    run_dir = RunDir(tmp_path / "run")
    cfg = PatchingConfig.from_mapping({"pairs": ["candidate-swap", "task-swap"],
                                       "kinds": ["resid"], "limit": 1, "layer_stride": 10,
                                       "per_position": False})
    summary = run(run_dir, bundled, cfg, log=lambda s: None)
    assert summary["candidate-swap/resid"]["n_pairs"] >= 1
    assert summary["candidate-swap/resid"]["layers"] == [0, 10, 20]
    sp = summary["candidate-swap/resid"]["span_effect_by_layer"]["all"]
    assert all(abs(v - 1.0) < 1e-3 for v in sp.values())
