"""Study 1 on the bundled model and real records."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.integration


def test_quick_run_metrics(quick_run):
    """The bundled model's run: metrics.json agrees with the records."""
    m = json.loads((quick_run.path / "metrics.json").read_text())
    recs = quick_run.read_records()
    assert m["overall"]["n"] == len(recs) == 6
    ga = np.mean([r["oracle_label"] for r in recs])
    assert m["overall"]["GA"] == pytest.approx(ga)
    manifest = quick_run.manifest()
    assert manifest["model"]["sha256"] and manifest["model"]["n_layers"] == 30

