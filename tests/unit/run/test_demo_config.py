"""The demo config (``make demo``) asks for what its figures need: checked without a model.

Which records fit its token budgets needs the bundled tokenizers:
``tests/integration/test_demo_records.py``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from interp.stages.patching import PatchingConfig
from interp.stages.steering import SteeringConfig

DEMO = Path(__file__).resolve().parents[3] / "experiments" / "demo.toml"


def test_demo_steers_judge_and_generator_on_both_oracle_labels_within_the_patching_budget():
    cfg = tomllib.loads(DEMO.read_text())
    steer = SteeringConfig.from_mapping(cfg["steering"])
    patch = PatchingConfig.from_mapping(cfg["patching"])
    assert set(steer.tasks) == {"eval", "gen"}       # the generator panel has a line
    assert steer.per_label and steer.limit >= 1      # acceptance | Correct and | Incorrect
    assert steer.max_tokens is not None and patch.max_tokens is not None
    assert steer.max_tokens <= patch.max_tokens      # the records steered fit the patching too
    assert "candidate-swap" in patch.pairs and patch.limit >= 1
    # one pair per dataset: a 1-nat threshold left both SmolLM2 pairs out (gaps -0.84, +0.25)
    assert patch.min_gap <= 0.25
    # and it is the first that clears min_gap: Qwen's first pairs of each dataset all had
    # |gap| < 0.2 (-0.12, +0.16; -0.02, -0.07), which emptied its figure; the 3rd SQuAD 2.0
    # and DROP candidates clear it (+0.35, +0.68)
    assert patch.limit_kept
    for ds in ("squad_v2", "drop"):                  # the datasets whose prompts fit
        assert ds in cfg["asymmetry"]["datasets"] and cfg["asymmetry"]["limit"][ds] >= 8


def test_every_shipped_config_passes_the_pipelines_check():
    """Each ``experiments/*.toml`` is one ``run_config`` would accept.

    No unknown key or stage, every stage table valid: a typo is refused here, not after a run
    of hours started.
    """
    import pytest

    from interp.run.pipeline import _check, load_config
    from interp.stages.asymmetry import AsymmetryConfig

    configs = sorted(DEMO.parent.glob("*.toml"))
    assert {"findings.toml", "findings_gap.toml", "findings_matched.toml",
            "findings_pool.toml", "findings_steer.toml", "findings_views.toml"} <= {
                p.name for p in configs}
    for path in configs:
        cfg = load_config(path)
        stages = _check(cfg, path, None)
        asym = dict(cfg.get("asymmetry", {}))   # as run_config builds one per model
        for spec in asym.pop("models", [asym.pop("model", "smollm2-135m-instruct")]):
            AsymmetryConfig.from_mapping({**asym, "model": spec})
        assert isinstance(stages, dict), path
    # the gap-filter sensitivity runs the study's own records: its Study 1 is the study's
    study, gap = (tomllib.loads((DEMO.parent / n).read_text())
                  for n in ("findings.toml", "findings_gap.toml"))
    assert gap["asymmetry"] == study["asymmetry"]
    g, s = (PatchingConfig.from_mapping(c["patching"]) for c in (gap, study))
    assert g.pairs == ["candidate-swap"] and g.min_gap < s.min_gap and g.limit >= 150
    # the wider pool extends the study's records (a prefix of it: interp.data.round_robin)
    pool = tomllib.loads((DEMO.parent / "findings_pool.toml").read_text())
    pa, sa = pool["asymmetry"], study["asymmetry"]
    assert all(pa["limit"][d] >= n for d, n in sa["limit"].items())
    assert {k: v for k, v in pa.items() if k not in ("limit", "models")} == {
        k: v for k, v in sa.items() if k not in ("limit", "models")}
    p = PatchingConfig.from_mapping(pool["patching"])
    assert p.min_gap == s.min_gap and p.limit >= max(pa["limit"].values())
    # steering past x4 selects the study's steering records: the same records, filters and
    # band, only the factors differ (x1 stays: the unsteered reference)
    steer = tomllib.loads((DEMO.parent / "findings_steer.toml").read_text())
    assert steer["asymmetry"] == study["asymmetry"]
    assert {k: v for k, v in steer["steering"].items() if k != "alphas"} == {
        k: v for k, v in study["steering"].items() if k != "alphas"}
    assert 1 in steer["steering"]["alphas"] and min(steer["steering"]["alphas"][1:]) > max(
        study["steering"]["alphas"])
    # the two new views read the study's records and its mined hard negatives (seeded)
    views = tomllib.loads((DEMO.parent / "findings_views.toml").read_text())
    assert views["asymmetry"] == study["asymmetry"] and {"lens", "pairwise"} <= set(views)
    assert not {"lens", "pairwise"} & set(study)    # one run folder each: one library version
    with pytest.raises(Exception, match="bogus"):
        _check({**gap, "patching": {**gap["patching"], "bogus": 1}}, "x.toml", None)


def test_first_is_the_demo_on_one_model_one_dataset_and_fewer_records():
    """``make first`` runs every stage the demo runs, on SmolLM2 and SQuAD 2.0 alone.

    Its stage tables are the demo's (so its output has the demo's shape), but for the probe's
    layers (the sweeps cost CPU per layer); its records are fewer.
    """
    demo = tomllib.loads(DEMO.read_text())
    first = tomllib.loads((DEMO.parent / "first.toml").read_text())
    assert set(first) == set(demo)
    assert first["asymmetry"]["models"] == ["smollm2-135m-instruct"]
    assert first["asymmetry"]["datasets"] == ["squad_v2"]
    assert first["asymmetry"]["limit"]["squad_v2"] < demo["asymmetry"]["limit"]["squad_v2"]
    for stage in ("attention", "patching", "steering"):
        assert first[stage] == demo[stage], stage
    assert {k: v for k, v in first["probe"].items() if k != "layers"} == demo["probe"]
    assert first["out"] == "runs/first" and first["name"] == "first"
