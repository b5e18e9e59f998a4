"""The CPU estimate a long command prints before it starts (``interp.core.costs``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from interp.core.costs import CPU_S_PER_UNIT, estimate, format_cpu, units, wall_prior_s
from interp.run.pipeline import _check, load_config, plan

SMOL = "smollm2-135m-instruct"


def test_estimate_sums_the_measured_costs_and_names_what_has_none():
    row = CPU_S_PER_UNIT[SMOL]
    cpu, unknown = estimate(SMOL, {"asymmetry": 10, "patching": 1, "lens": 5})
    assert cpu == pytest.approx(10 * row["asymmetry"] + row["patching"])
    assert unknown == ["lens"]
    assert estimate("my/own-model", {"asymmetry": 3}) == (0, ["asymmetry"])
    assert wall_prior_s(SMOL, "asymmetry", 2) == pytest.approx(row["asymmetry"] / 2)
    assert wall_prior_s("my/own-model", "asymmetry", 2) is None


def test_format_and_units_say_counts_in_words():
    assert format_cpu(59) == "under 1 CPU-minute"
    assert format_cpu(60) == "about 1 CPU-minute" and format_cpu(150) == "about 2 CPU-minutes"
    assert units("patching", 1) == "1 pair" and units("steering", 2) == "2 records"


def test_the_plan_of_make_first_counts_each_stages_units():
    cfg = load_config(Path(__file__).resolve().parents[3] / "experiments" / "first.toml")
    runs = list(_check(cfg, "first.toml", None).items())
    lines = plan({SMOL: {"squad_v2": 10}}, runs)
    assert lines[0].startswith(f"== plan: {SMOL} on 10 squad_v2 records: asymmetry 10 records, "
                               "attention 10 records, probe 10 records, patching 1 pair, "
                               "steering 2 records; about ")
    row = CPU_S_PER_UNIT[SMOL]
    want = 10 * (row["asymmetry"] + row["attention"] + row["probe"]) + row["patching"] \
        + 2 * row["steering"]
    assert lines[-1].startswith(f"== in all {format_cpu(want)} (measured per-record costs")
    # a model with no measured cost says so, and the total says it is a lower bound
    lines = plan({SMOL: {"squad_v2": 10}, "my/own-model": {"squad_v2": 4}}, runs)
    assert lines[1].endswith("; no measured cost") and "and more" in lines[-1]
