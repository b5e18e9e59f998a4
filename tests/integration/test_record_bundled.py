"""``interp record`` and ``interp view`` on the bundled model and real records."""

from __future__ import annotations

import shutil
from html import escape as html_escape

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from interp import cli
from interp.hooks.recorder import record_rows
from interp.judging.prompts import record_prompts
from interp.run.view import write_view
from interp.stages import record as stage
from interp.store.recordings import load_activations
from interp.store.rundir import RunDir

pytestmark = pytest.mark.integration


def test_record_spans_float16_on_real_records(bundled, quick_run, tmp_path):
    run = RunDir(shutil.copytree(quick_run.path, tmp_path / "run"))
    cfg = stage.RecordConfig(limit=1, layers="last2", positions="spans", dtype="float16")
    summary = stage.run(run, bundled, cfg, log=lambda m: None)
    assert summary["n_records"] == 2  # one squad_v2 + one hotpotqa
    rec = run.read_records()[0]
    p = record_prompts(rec, bundled.tokenizer)["eval"]
    rows = record_rows(bundled, p.input_ids).rows
    a = load_activations(run, rec["id"], "eval", "blocks.29.attn.hook_pattern")
    assert a.tensor.dtype == torch.float16 and a.tensor.shape[1] == len(a.positions)
    assert a.positions[-1] == len(p) - 1 and a.labels == p.labels
    assert (a.tensor[:, -1].float() - rows[29]).abs().max() < 2e-3  # float16 rounding
    assert {a.labels[i] for i in a.positions[:-1]} == {"context", "question", "candidate"}
    z = load_activations(run, rec["id"], "eval", "attn.hook_z")
    assert z.layers == [28, 29] and z.tensor.shape == (2, len(a.positions), 9, 64)
    s = summary["span_to_span"]
    assert s["band"] == [28, 29] and s["overall"]["n"] == 2
    last = s["overall"]["eval"]["mean"][s["query_spans"].index("last")]
    assert abs(sum(last) - 1) < 1e-4
    assert (run.path / "figures" / "record_span_to_span.png").exists()
    df = pd.read_parquet(run.path / "record" / "span_to_span.parquet")
    assert len(df) == 2 * 2 * 2 * 9 * 5 * 4  # records, tasks, layers, heads, query x key spans
    res = CliRunner().invoke(cli.app, ["record", "--run", str(run.path), "--limit", "1",
                                       "--tables-only", "--layers", "last2"])
    assert res.exit_code == 0, res.output
    assert "span-to-span attention, band layers 28-29" in res.output
    res = CliRunner().invoke(cli.app, ["record", "--run", str(run.path), "--positions", "x"])
    assert res.exit_code == 2 and "positions must be one of" in res.output


def test_view_of_a_real_record(bundled, quick_run, tmp_path):
    rec = quick_run.read_records()[0]
    path = write_view(quick_run, bundled, rec["id"], tmp_path / "v.html")
    html = path.read_text()
    assert html_escape(rec["answer"]) in html
    assert '"band": [22, 23, 24, 25, 26, 27, 28, 29]' in html  # last8 of 30 layers
    res = CliRunner().invoke(cli.app, ["view", "--run", str(quick_run.path), "--id", "nope"])
    assert res.exit_code == 2 and "no ok record with id 'nope'" in res.output
