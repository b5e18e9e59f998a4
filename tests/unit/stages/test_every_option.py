"""Every declared option of every stage does what its docstring says, or it would not be there.

The census (:func:`test_every_option_is_exercised_by_a_test`) fails when a stage config gains a
field that no test names, by field or by flag; the tests below exercise the options that only
the census named before: each is set to a value other than its default and its effect on the
computation is asserted.
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from interp.core.contract import SPECS
from interp.core.errors import LayerSpecError, PromptError
from interp.core.options import cli_options
from interp.methods import transfer as transfer_methods
from interp.methods.transfer import HardNegativeSettings, mine_hard_negatives
from interp.stages.patching import PatchingConfig
from interp.stages.transfer import TransferConfig

TESTS = Path(__file__).resolve().parents[2]


def test_every_option_is_exercised_by_a_test():
    text = "\n".join(p.read_text(encoding="utf-8") for p in TESTS.rglob("*.py")
                     if p.name != Path(__file__).name)
    text += "\n".join(p.read_text(encoding="utf-8") for p in TESTS.rglob("*.toml"))
    text += Path(__file__).read_text(encoding="utf-8").split("def test_every_option_is", 1)[1]
    unnamed = []
    for s in SPECS:
        decls = {o.name: o.decls for o in cli_options(s.config_class)}
        for f in fields(s.config_class):
            names = [f.name, *(d for d in decls.get(f.name, ()) if d.startswith("--"))]
            if not any(re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text) for n in names):
                unnamed.append(f"{s.name}.{f.name}")
    assert unnamed == []


# --- the hard-negative miner's settings, shared by transfer and patching -----------------------

@pytest.mark.parametrize("config", [TransferConfig, PatchingConfig])
def test_the_miner_samples_with_the_configured_template_temperature_and_top_p(
        config, tiny, qa_example, monkeypatch):
    cfg = config(hard_negative_template="reference", hard_negative_temperature=0.3,
                 hard_negative_top_p=0.55, hard_negative_attempts=1,
                 hard_negative_max_new_tokens=3)
    settings = HardNegativeSettings.from_config(cfg, batch_size=2, templates_path=None)
    assert (settings.hard_negative_template, settings.hard_negative_temperature,
            settings.hard_negative_top_p) == ("reference", 0.3, 0.55)
    seen, templates = {}, []
    real_template = transfer_methods.get_template

    def get_template(name, path=None):
        templates.append(name)
        return real_template(name, path)

    def sample_answers(handle, prompts, **kw):
        seen.update(kw)
        return ["Lyon"] * len(prompts)

    monkeypatch.setattr(transfer_methods, "get_template", get_template)
    monkeypatch.setattr(transfer_methods, "sample_answers", sample_answers)
    rows = mine_hard_negatives(tiny, [qa_example(0, "Paris")], _rule(), settings,
                               log=lambda s: None)
    assert templates == ["reference"]
    assert (seen["temperature"], seen["top_p"], seen["max_new_tokens"]) == (0.3, 0.55, 3)
    assert rows[0]["hard_negative"] == "Lyon"


def _rule():
    from interp.judging.grading import RuleOracle

    return RuleOracle()


# --- templates_path: a stage reads its templates from the file -------------------------------

def _templates_file(tmp_path: Path) -> Path:
    p = tmp_path / "mine.toml"
    p.write_text('[terse]\ngen_user = "{context} {question}"\n'
                 'eval_user = "{context} {question} {answer}"\n')
    return p


def test_the_asymmetry_stage_reads_its_templates_from_templates_path(tmp_path):
    from interp.stages.asymmetry import AsymmetryConfig, run
    from interp.store.rundir import RunDir

    path = _templates_file(tmp_path)
    with pytest.raises(PromptError, match=r"unknown template 'default'; known: \['terse'\]"):
        run(RunDir(tmp_path / "a"), None, AsymmetryConfig(templates_path=str(path), limit=1))


def test_the_transfer_stage_reads_its_templates_from_templates_path(tmp_path, tiny):
    from interp.stages.transfer import run
    from interp.store.rundir import RunDir

    path = _templates_file(tmp_path)
    with pytest.raises(PromptError, match=r"unknown template 'default'; known: \['terse'\]"):
        run(RunDir(tmp_path / "t"), tiny, TransferConfig(templates_path=str(path)),
            log=lambda s: None)


def test_the_reasoning_stage_reads_its_templates_from_templates_path(tmp_path):
    from interp.stages.reasoning import ReasoningConfig

    cfg = ReasoningConfig(templates_path=str(_templates_file(tmp_path)), template="terse")
    from interp.judging.prompts import get_template

    assert get_template(cfg.template, cfg.templates_path).gen_user == "{context} {question}"
    with pytest.raises(PromptError, match="known: \\['terse'\\]"):
        get_template(ReasoningConfig(templates_path=cfg.templates_path).template,
                     cfg.templates_path)


# --- transfer: weight decay reaches the optimizer --------------------------------------------

def test_weight_decay_reaches_the_optimizer(tiny, lora_cfg, tmp_path, monkeypatch):
    import torch

    from interp.methods.lora import train_adapter

    seen = []
    real = torch.optim.AdamW

    def adamw(params, **kw):
        seen.append(kw["weight_decay"])
        return real(params, **kw)

    monkeypatch.setattr(torch.optim, "AdamW", adamw)
    cfg = lora_cfg(weight_decay=0.25, epochs=1)
    ids = tiny.tokenizer.encode("a b c d e f")
    train_adapter(tiny, [{"input_ids": ids, "labels": ids}], cfg, tmp_path / "adapters/x",
                  name="x", log=lambda s: None)
    assert seen == [0.25]


# --- probe options ----------------------------------------------------------------------------

def _probe_data(n=40, d=6, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.5
    x = rng.normal(size=(n, 2, d)) + y[:, None, None] * 1.5
    return {"last": x, "mean": x[:, :, ::-1].copy()}, y


def test_sweep_all_runs_every_probe_at_every_cell_and_top_k_otherwise():
    from interp.analysis.stats import make_folds
    from interp.methods.probing import sweep

    feats, y = _probe_data()
    folds = make_folds(y, 3, 0)
    kw = dict(probes=("logreg", "svm"), top_k=1, log=lambda s: None, progress=False)
    some = sweep(feats, y, [0, 1], folds, **kw)
    every = sweep(feats, y, [0, 1], folds, sweep_all=True, **kw)
    assert sum(r["probe"] == "svm" for r in some) == 1
    assert sum(r["probe"] == "svm" for r in every) == 4


def test_mlp_hidden_and_mlp_alpha_shape_the_mlp_probe():
    from interp.methods.probing import fit_probe
    from interp.stages.probe import ProbeConfig

    feats, y = _probe_data()
    kw = ProbeConfig(mlp_hidden=7, mlp_alpha=3.0).fit_kw()
    probe = fit_probe(feats["last"][:, 0], y, "mlp", **kw)
    assert probe.weights[0].shape == (6, 7)
    small = fit_probe(feats["last"][:, 0], y, "mlp", **{**kw, "mlp_alpha": 1e-4})
    assert np.abs(probe.weights[0]).sum() < np.abs(small.weights[0]).sum()  # the L2 penalty


def test_transfer_min_per_class_excludes_a_dataset_with_too_few_of_a_class():
    from interp.methods.probing import cross_dataset_transfer
    from interp.stages.probe import ProbeConfig

    feats, y = _probe_data(n=60)
    y[40:] = True
    y[40:43] = False  # the third dataset: 3 wrong answers
    ds = np.array(["a"] * 20 + ["b"] * 20 + ["c"] * 20)
    x = feats["last"][:, 0]
    loose = cross_dataset_transfer(x, y, ds, "logreg", folds=2, seed=0,
                                   min_per_class=ProbeConfig(transfer_min_per_class=3)
                                   .transfer_min_per_class)
    strict = cross_dataset_transfer(x, y, ds, "logreg", folds=2, seed=0,
                                    min_per_class=ProbeConfig(transfer_min_per_class=4)
                                    .transfer_min_per_class)
    assert "c" in loose["datasets"] and "c" in strict["excluded"]
    assert "needs >= 4 of each" in strict["excluded"]["c"]


# --- audit: the detector's layers ------------------------------------------------------------

def test_detector_layers_are_checked_against_the_model():
    from interp.stages.audit import AuditConfig

    AuditConfig(detector_layers="1-3").check(4)
    with pytest.raises(LayerSpecError):
        AuditConfig(detector_layers="9").check(4)


def test_select_by_ranks_the_cells_the_other_probes_run_at():
    from interp.analysis.stats import make_folds
    from interp.methods.probing import sweep
    from interp.stages.probe import ProbeConfig

    feats, y = _probe_data(seed=3)
    folds = make_folds(y, 3, 0)
    for metric in ("auc", "f1"):
        rows = sweep(feats, y, [0, 1], folds, probes=("logreg", "svm"), top_k=1,
                     select_by=ProbeConfig(select_by=metric).select_by, log=lambda s: None,
                     progress=False)
        best = max((r for r in rows if r["probe"] == "logreg"), key=lambda r: r[metric])
        (svm,) = [r for r in rows if r["probe"] == "svm"]
        assert (svm["layer"], svm["pool"]) == (best["layer"], best["pool"])


def test_permute_within_dataset_keeps_each_dataset_s_labels_in_the_null(tiny, tmp_path):
    from interp.stages.probe import ProbeConfig
    from interp.stages.probe import run as run_probes
    from interp.testing import synthetic_probe_run

    run = synthetic_probe_run(tmp_path / "run", tiny, 9, 15)
    base = dict(folds=3, top_k=1, batch_size=4, seed=0, pools=["last"], permutations=2,
                tasks=["eval"])
    pooled = run_probes(run, tiny, ProbeConfig(**base), log=lambda s: None)
    within = run_probes(run, tiny, ProbeConfig(**base, permute_within="dataset"),
                        log=lambda s: None)
    assert pooled["tasks"]["eval"]["permutation"]["within"] is None
    assert within["tasks"]["eval"]["permutation"]["within"] == "strata"


def test_oracle_endpoint_configures_the_served_oracle_and_is_checked_first(tmp_path):
    from interp.core.errors import ConfigError
    from interp.stages.asymmetry import AsymmetryConfig, run
    from interp.store.rundir import RunDir

    cfg = AsymmetryConfig(oracle="openai:judge", oracle_endpoint={"base_url": "http://x/v1",
                                                                  "temprature": 0})
    with pytest.raises(ConfigError, match=r"asymmetry\.oracle_endpoint.*temprature"):
        run(RunDir(tmp_path / "a"), None, cfg)
