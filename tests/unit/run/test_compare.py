"""Two models side by side: ``interp run`` on a grid of two tiny models of different shapes."""

from __future__ import annotations

import json

import pytest

from interp.plots.compare import model_colors
from interp.run.compare import comparison_rows, format_markdown, write_comparison
from interp.run.pipeline import model_slug, run_config
from interp.stages.asymmetry import write_metrics
from interp.stages.probe import ProbeConfig
from interp.stages.probe import run as run_probes
from interp.testing import rehearsal_datasets, synthetic_probe_run, tiny_checkpoint, tiny_llama


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("grid")
    a = tiny_checkpoint(root / "tiny-a", template="chatml", arch="llama", n_layers=3,
                        d_model=32, n_heads=4, n_kv_heads=2, seed=0)
    b = tiny_checkpoint(root / "tiny-b", template="llama3", arch="qwen2", n_layers=4,
                        d_model=56, n_heads=14, n_kv_heads=2, seed=1)
    data = rehearsal_datasets(root / "data", n=2, max_chars=150, names=("squad_v2", "drop"))
    cfg = {"name": "grid", "out": str(root / "runs"), "figures": str(root / "figs"),
           "publish": True,
           "asymmetry": {"models": [str(a), str(b)], "datasets": list(data.values()),
                         "limit": 2, "oracle": "rule", "max_new_tokens": 4,
                         "verdict_max_new_tokens": 4, "batch_size": 4, "n_boot": 50},
           "attention": {"band": "last2", "n_boot": 50, "figures": False}}
    summary = run_config(cfg, log=lambda s: None)
    return root, cfg, summary, (str(a), str(b))


def test_one_table_with_a_row_per_model_and_dataset(grid):
    root, _, summary, (a, b) = grid
    table = json.loads((root / "runs" / "comparison.json").read_text())
    assert table["models"] == [a, b]
    rows = table["rows"]
    assert [(r["model"], r["dataset"]) for r in rows] == [
        (m, d) for m in (a, b) for d in ("drop", "squad_v2", "overall")]
    assert [r["n_layers"] for r in rows] == [3] * 3 + [4] * 3
    assert {r["band"] for r in rows[:3]} == {"1-2"} and {r["band"] for r in rows[3:]} == {"2-3"}
    for spec in (a, b):                         # numbers are the run's own, copied exactly
        run = root / "runs" / model_slug(spec)
        metrics = json.loads((run / "metrics.json").read_text())
        att = json.loads((run / "attention" / "summary.json").read_text())
        mine = {r["dataset"]: r for r in rows if r["model"] == spec}
        # 4 records each: the ok ones are in the table; a tiny random model may generate
        # nothing for one (status no_answer, counted apart, never judged)
        assert mine["overall"]["n"] == metrics["overall"]["n"] == 4 - sum(
            (metrics.get("no_answer") or {}).values())
        assert metrics["overall"]["n"] >= 2
        assert mine["drop"]["GA"] == metrics["per_dataset"]["drop"]["GA"]
        assert mine["overall"]["delta"] == metrics["overall"]["delta"]
        assert mine["squad_v2"]["ctx_eval"] == att["per_dataset"]["squad_v2"]["eval"][
            "context"]["mean"]
        assert mine["overall"]["context_ratio"] == pytest.approx(att["overall"]["context_ratio"])
        assert 0.0 < mine["overall"]["ctx_gen"] < 1.0
        assert mine["overall"]["probe_auc"] is None      # the probe stage did not run
    md = (root / "runs" / "comparison.md").read_text().splitlines()
    assert md[0].startswith("| model | dataset | n | passages | GA | EA |")
    table_lines = [x for x in md if x.startswith("|")]
    assert len(table_lines) == 2 + 6
    # every group here has 2 passages (< 10): flagged in the json, starred and explained in md
    assert all(r["few_passages"] is True for r in rows)
    assert [x.split(" | ")[3] for x in table_lines[2:5]] == ["2*", "2*", "4*"]
    assert "\\* " + a + " drop: only 2 passages (< 10)" in "\n".join(md)
    drop = rows[0]
    assert f"[{drop['delta_ci'][0]:.3f}, {drop['delta_ci'][1]:.3f}]" in table_lines[2]
    assert summary[a]["run_dir"] != summary[b]["run_dir"]


def test_figures_put_the_models_side_by_side(grid):
    root, cfg, _, (a, b) = grid
    for name in ("models_asymmetry.png", "models_attention.png", "comparison.json",
                 "comparison.md"):
        assert (root / "figs" / name).stat().st_size > 1000 or name.endswith(("json", "md"))
    for spec in (a, b):                          # each model's own figures, prefixed
        assert (root / "figs" / f"{model_slug(spec)}__asymmetry.png").exists()
    assert (root / "runs" / "figures" / "models_attention.png").exists()
    assert not (root / "runs" / "figures" / "models_probes.png").exists()
    colors = model_colors([a, b])
    assert len(set(colors.values())) == 2


def test_probe_columns_and_figure(tiny, tiny_tokenizer, tmp_path):
    """Two probed runs (different depths): probe AUC and judge AUC per model, the probe figure."""
    deeper = tiny_llama(tiny_tokenizer, n_layers=3, seed=2)
    runs = {}
    for spec, handle in (("tiny-2", tiny), ("tiny-3", deeper)):
        run = synthetic_probe_run(tmp_path / spec, handle)
        write_metrics(run)
        res = run_probes(run, handle, ProbeConfig(folds=3, top_k=1, pools=["last"], tasks=["eval"],
                                                  probes=["logreg"]), log=lambda s: None)
        runs[spec] = (run.path, res)
    comp = write_comparison(tmp_path / "grid", {s: p for s, (p, _) in runs.items()})
    rows = [r for r in comparison_rows({s: p for s, (p, _) in runs.items()})
            if r["dataset"] == "overall"]
    for row, (spec, (_, res)) in zip(rows, runs.items()):
        assert row["model"] == spec
        assert (row["probe_auc"], row["probe_layer"]) == (res["best"]["auc"],
                                                         res["best"]["layer"])
        # the judge AUC beside the probe is the same-folds one; the pooled one kept apart
        assert row["judge_auc"] == res["judge"]["folds"]["auc"]
        assert row["judge_auc_pooled"] == res["judge"]["overall"]["auc"]
        grid_cells = [c for c in res["tasks"]["eval"]["grid"] if c.get("auc") is not None]
        assert row["probe_cells"] == len(grid_cells) > 1
        assert row["probe_auc"] == max(c["auc"] for c in grid_cells)
    assert [p.name for p in comp["figures"]] == ["models_asymmetry.png", "models_probes.png"]
    md = format_markdown(rows)
    assert "| tiny-3 | overall |" in md
    assert f"(best of {rows[1]['probe_cells']}: logreg L{rows[1]['probe_layer']} last)" in md
    assert "probe best-of-N CV AUC" in md and "judge AUC (same folds)" in md


def test_probe_headline_names_the_permuted_cell():
    """The permutation p is reported with its count and the probe kind whose cell it tests."""
    from interp.run.compare import probe_headline
    cell = {"probe": "svm", "layer": 3, "pool": "candidate", "auc": 0.85}
    res = {"tasks": {"eval": {
        "best": cell, "grid": [cell, {**cell, "probe": "logreg", "auc": 0.83},
                               {**cell, "layer": 1, "auc": None}],
        "permutation": {"n": 2, "probe": "logreg", "observed": 0.83, "p_value": 1 / 3}}},
        "judge": {"overall": {"auc": 0.66}, "folds": {"auc": 0.62}}}
    h = probe_headline(res)
    assert (h["probe_auc"], h["probe_cells"], h["judge_auc"], h["judge_auc_pooled"]) == (
        0.85, 2, 0.62, 0.66)
    assert (h["probe_perm_p"], h["probe_perm_n"], h["probe_perm_probe"]) == (1 / 3, 2, "logreg")
    row = {"model": "m", "dataset": "overall", "n": 9, "n_passages": 12, "few_passages": False,
           **h}
    md = format_markdown([row])
    assert "| 12 |" in md and "12*" not in md
    assert "0.33 (2 perms, best logreg cell, AUC 0.830)" in md
    # res has no n_records: nothing to judge the fit by, no flag
    assert h["probe_fit_note"] is None and "0.850 (best" in md
    # a probe fit on 6 records and a zero-width interval are marked in the cell and below
    small = probe_headline({**res, "n_records": 6, "class_counts": {"correct": 3,
                                                                     "incorrect": 3}})
    md = format_markdown([{**row, **small, "delta_ci": [0.5, 0.5]}])
    assert "0.850* (best of 2" in md and "\\* m probe: fit on only 6 records" in md
    assert "[0.500, 0.500] (zero width)" in md
    assert "(zero width): every bootstrap resample gave the same value" in md


def test_dataset_labels_star_small_groups():
    from interp.plots.compare import dataset_labels
    tables = {"a": {"per_dataset": {"d": {"n": 3, "n_passages": 2, "few_passages": True}},
                    "overall": {"n": 30, "n_passages": 12, "few_passages": False}},
              "b": {"per_dataset": {"d": {"n": 3, "n_passages": 3, "few_passages": True}},
                    "overall": {"n": 30, "n_passages": 12, "few_passages": False}}}
    labels, notes = dataset_labels(tables, ["d", "overall"])
    assert labels == ["d\nn=3\n2,3 passages*", "overall\nn=30\n12 passages"]
    assert notes == ["* d: only 2 passages (< 10): questions about one passage are not "
                     "independent, so this group has few independent units"]


def _gfm_tables(text):
    """(header cells, body rows of cells) of each table, as a GFM parser reads them."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    tables, cur, row, cell = [], None, None, None
    for t in tokens:
        if t.type == "table_open":
            cur = []
        elif t.type == "tr_open":
            row = []
        elif t.type in ("th_open", "td_open"):
            cell = ""
        elif t.type == "inline" and cell is not None:
            cell = t.content
        elif t.type in ("th_close", "td_close"):
            row.append(cell)
            cell = None
        elif t.type == "tr_close":
            cur.append(row)
        elif t.type == "table_close":
            tables.append(cur)
    return tables


@pytest.mark.parametrize("source", ["format_markdown", "committed"])
def test_comparison_md_is_one_markdown_table_with_a_cell_per_column(source):
    """A pipe inside a header or cell (``acc|y*=I``) must not split it into two cells."""
    from pathlib import Path

    from interp.run.compare import _MD_COLUMNS

    if source == "committed":
        text = (Path(__file__).parents[3] / "figures" / "comparison.md").read_text()
    else:
        row = {"model": "a|b", "dataset": "overall", "n": 3, "n_passages": 2,
               "few_passages": True, "GA": 0.5, "acceptance_rate_incorrect": 0.25}
        text = format_markdown([row, {**row, "model": "c"}])
    (table,) = _gfm_tables(text)
    names = [name for _, name in _MD_COLUMNS]
    assert table[0] == [n.replace("|", "\\|") for n in names] or table[0] == names
    assert "acc|y*=I" in names and len(table[0]) == len(names)
    assert all(len(r) == len(names) for r in table[1:]) and len(table) >= 3
