"""benchmarks/gpu_check.py, the dry run on the CPU (the full check needs an NVIDIA GPU).

A smoke test of the script's whole path on 1 record per dataset and the first two stages: the
stand-in is built, the paper config runs with swapped sources, the CPU-vs-device comparison
measures span mass and logit_diff (here CPU against itself: exactly 0), two shards of the
first dataset's one record (the second shard owns none) merged equal one process, the device
map (half the blocks offloaded to disk) equals the plain load exactly, the report is written;
the paper-shaped stand-in's step (``benchmarks/standin.py`` in a child process, on its reduced
form at 64 tokens) gives a row per method and prints docs/performance.md's table.
The full dry run (every stage, 3 records per dataset) is
``benchmarks/gpu_check.sh --device cpu``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.rehearsal

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def test_gpu_check_dry_run(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    status = mod.main(["--device", "cpu", "--records", "1", "--only", "asymmetry,attention",
                       "--shard-records", "2", "--standin-lengths", "64", "--out",
                       str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0, out
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(report["timings"]) == {"asymmetry", "attention"}
    assert report["timings"]["asymmetry"]["records"] == 4
    a = report["agreement"]
    assert (a["n_records"], a["n_prompts"]) == (4, 8)
    assert a["span_mass_max_abs_diff"] == 0.0 and a["logit_diff_max_abs_diff"] == 0.0
    assert a["agree"] and a["runtime_device"]["dtype"] == "bfloat16"
    assert len(a["logit_diff_cpu"]) == 4 and all(abs(x) > 0 for x in a["logit_diff_cpu"])
    sh = report["shards"]
    assert sh["records"] == 1 and sh["same_answers_and_verdicts"] and sh["agree"]  # shard 1: none
    assert sh["logit_diff_max_abs_diff"] == 0.0  # batches of one prompt: bit-identical
    dm = report["device_map"]
    assert dm["agree"] and dm["span_mass_max_abs_diff"] == dm["logit_diff_max_abs_diff"] == 0.0
    assert "records/s" in out and "AGREE" in out and report["peak_gpu_memory_mib"] is None
    st = report["standin"]
    assert st["status"] == "done" and (st["layers"], st["width"], st["lengths"]) == (2, 256, [64])
    assert sorted(r["method"] for r in st["rows"]) == ["dla", "forward", "lens", "record", "rows"]
    assert all(r["tokens"] == 64 and r["wall_s"] > 0 for r in st["rows"])
    # what record wrote: 2 layers x 32 heads x 64^2 float16 patterns, and more (resid, z)
    (rec,) = [r for r in st["rows"] if r["method"] == "record"]
    assert rec["disk_bytes"] > 2 * 32 * 64 * 64 * 2
    assert "| plain forward (Study 1's prefill) | " in out and "64 tokens: peak MiB / CPU-s" in out
    if not torch.cuda.is_available():             # refused before any work, one line
        assert mod.main(["--device", "cuda", "--out", str(tmp_path / "x")]) == 2
        assert "no CUDA device visible" in capsys.readouterr().out
        assert not (tmp_path / "x").exists()
