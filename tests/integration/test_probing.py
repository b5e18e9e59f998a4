"""Probes on the bundled model and real records."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from interp.analysis.stats import passage_groups
from interp.core.errors import StageError
from interp.judging.prompts import rerender
from interp.stages.probe import ProbeConfig
from interp.stages.probe import run as run_probes
from interp.store.rundir import RunDir
from tests.equivalence.test_batching import hook_outputs

pytestmark = pytest.mark.integration


def test_bundled_quick_run(bundled, quick_run, tmp_path):
    """Real records re-render; the study runs (or names the class counts when too few).

    The bundled model's last hidden state is after the final norm, as on the tiny model.
    """
    run = RunDir(tmp_path / "q")
    shutil.copytree(quick_run.path, run.path)
    recs = run.read_records()
    for r in recs:
        for task in ("eval", "gen"):
            rerender(r, task, bundled.tokenizer)
    ids = torch.tensor([bundled.tokenizer("Hello there, judge.")["input_ids"]])
    got, out = hook_outputs(bundled, ids)
    n = bundled.n_layers
    assert torch.allclose(out.hidden_states[n - 1], got[n - 2])
    assert torch.allclose(out.hidden_states[n], bundled.model.model.norm(got[n - 1]), atol=1e-5)
    y = np.array([r["oracle_label"] for r in recs])
    cfg = ProbeConfig(folds=2, layers=[0, 15, 29], probes=["logreg", "svm"], top_k=1)
    g = np.array(passage_groups(recs))          # the folds count passages, not records
    n_c, n_i = len(set(g[y].tolist())), len(set(g[~y].tolist()))
    if min(n_c, n_i) < 2:
        with pytest.raises(StageError, match=f"y\\*=Correct {n_c}, y\\*=Incorrect {n_i}"):
            run_probes(run, bundled, cfg, log=lambda s: None)
    else:
        res = run_probes(run, bundled, cfg, log=lambda s: None)
        assert res["layers"] == [0, 15, 29] and res["best"]["layer"] in (0, 15, 29)
