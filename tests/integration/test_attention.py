"""Study 2 on the bundled model and real records: tables, resume, the heads command, errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from interp import cli
from interp.core.errors import LayerSpecError, RunDirError
from interp.stages import attention as stage
from interp.store.rundir import RunDir

pytestmark = pytest.mark.integration


def test_run_tables_resume_and_bad_input(bundled, quick_run, tmp_path):
    run = RunDir(shutil.copytree(quick_run.path, tmp_path / "run"))
    cfg = stage.AttentionConfig(limit=1, n_boot=50, band="24-29")
    s = stage.run(run, bundled, cfg, log=lambda m: None)
    assert set(s["per_dataset"]) == {"squad_v2", "hotpotqa"}
    df = pd.read_parquet(run.path / "attention" / "span_mass.parquet")
    assert set(df.columns) == {"id", "dataset", "task", "layer", "head", "span", "mass"}
    tot = df.groupby(["id", "task", "layer", "head"])["mass"].sum()
    assert len(tot) == 2 * 2 * bundled.n_layers * bundled.n_heads
    assert np.allclose(tot.values, 1.0, atol=1e-4)
    for name in ("attention_layerwise", "attention_heads_context", "attention_context_ratio"):
        assert (run.path / "figures" / f"{name}.png").exists()
    # resume: nothing recorded again
    assert stage.record(run, bundled, cfg, log=lambda m: None) == 0
    # the CLI lists heads from the stored summary
    res = CliRunner().invoke(cli.app, ["heads", "--run", str(run.path), "--top", "3"])
    assert res.exit_code == 0, res.output
    assert "gen minus eval" in res.output
    res = CliRunner().invoke(cli.app, ["heads", "--run", str(run.path), "--layers", "31"])
    assert res.exit_code == 2 and "valid layers are 0-29" in res.output
    # a record whose stored spans do not match names the record
    good = run.records_path.read_text()
    recs = run.read_records(status=None)
    bad = recs[1]
    bad["prompts"]["eval"]["token_spans"]["context"][0] += 1
    run.records_path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(RunDirError, match=bad["id"]):
        stage.record(run, bundled, stage.AttentionConfig(limit=2), log=lambda m: None)
    # (its recording, made by the harness's one pass, is of the unchanged record)
    with pytest.raises(RunDirError, match=f"another version of record .*{bad['id']}"):
        stage.load_masses(run)
    run.records_path.write_text(good)
    # layers outside the model name the valid range
    with pytest.raises(LayerSpecError, match="valid layers are 0-29"):
        stage.write_tables(run, stage.AttentionConfig(band="28-33", figures=False),
                           n_layers=30)
    # a run without records
    empty = RunDir(tmp_path / "empty")
    empty.path.mkdir()
    shutil.copy(run.manifest_path, empty.manifest_path)
    empty.records_path.write_text("")
    with pytest.raises(RunDirError, match="no ok record"):
        stage.record(empty, bundled, cfg, log=lambda m: None)
    with pytest.raises(RunDirError, match="no attention recordings"):
        stage.load_masses(empty)
