"""``cross_judge = true`` in an ``interp run`` config: every model judges every other's answers.

Algorithm of :func:`run_cross` (after every model's own study, :mod:`interp.run.pipeline`):

1. For each judge J and each other model G of ``[asymmetry] models``: the asymmetry stage with
   ``answers_from = out/<G>`` into ``out/<J>__judges__<G>/`` (J's config, so J's device and
   dtype; the source's template and oracle, checked, :mod:`interp.methods.cross_judge`), then the
   configured stages among ``stages`` (default attention, probe, audit) on that run with J
   (the probe stage on its ``eval`` task only, :func:`cross_stage_config`).
2. ``out/cross_judge.json`` (:func:`interp.methods.cross_judge.judge_matrix`: the judge x
   answer-source matrix with self on the diagonal, and the paired passage-bootstrap "self
   minus other" per judge), its text in ``out/cross_judge.txt`` and
   ``out/figures/cross_judge.png``.
3. When the probe stage ran on the cross-judged runs: ``out/cross_probe.json`` (one
   :func:`cross_probe` entry per (J, G)) and
   ``out/figures/cross_probe_layers.png``.

Source: ``docs/cross_judging.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from interp.analysis.stats import make_folds, passage_groups
from interp.core.errors import ConfigError, RunDirError
from interp.core.io import atomic_write_text, read_json, write_json
from interp.core.names import cross_name
from interp.core.options import config_from_table
from interp.methods.cross_judge import format_matrix, judge_matrix, ok_by_key
from interp.methods.probing import judge_metrics
from interp.models.loading import load_model
from interp.plots.cross import plot_cross_probe, plot_judge_matrix
from interp.stages import STAGES, asymmetry
from interp.stages.probe import ProbeConfig, load_probe_records
from interp.store import RunDir
from interp.store.records import limit_per_dataset, qa_key

__all__ = ["CrossJudgeConfig", "cross_dir", "cross_probe", "cross_stage_config", "run_cross"]

CROSS_STAGES = ("attention", "probe", "audit")
"""The stages that may run on the cross-judged runs (the rest are per-model studies)."""


def cross_stage_config(name: str, scfg: Any) -> Any:
    """A stage's config as it runs on a cross-judged run.

    The probe stage keeps only its ``eval`` task: a cross-judged run holds the judge J's eval
    prompts of another model's answers, which :func:`cross_probe` reads;
    its ``gen`` prompts are J's own generator prompts with another model's labels, which no
    result reads (about half the stage's time). Other stages run as configured.
    """
    if name == "probe" and list(scfg.tasks) != ["eval"]:
        return replace(scfg, tasks=["eval"])
    return scfg


@dataclass
class CrossJudgeConfig:
    """The ``cross_judge`` entry of an experiment config (``true`` or a table).

    Attributes:
        stages: the stages run on every cross-judged run, among :data:`CROSS_STAGES` and only
            those the config has a table for.
        n_boot: bootstrap resamples of the matrix CIs.
        seed: seed of those resamples.
    """

    stages: list[str] = field(default_factory=lambda: list(CROSS_STAGES))
    n_boot: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        if bad := [s for s in self.stages if s not in CROSS_STAGES]:
            raise ConfigError(f"[cross_judge] stages {bad} cannot run on cross-judged runs "
                              f"here; choose from {list(CROSS_STAGES)}")

    @classmethod
    def from_value(cls, value: Any, models: Sequence[str]) -> CrossJudgeConfig | None:
        """``true`` / a table -> a config; ``false`` / absent -> None.

        Raises:
            ConfigError: another value, an unknown key, or fewer than two models.
        """
        if value is None or value is False:
            return None
        if value is True:
            cfg = cls()
        elif isinstance(value, Mapping):
            cfg = config_from_table(cls, value, "cross_judge")
        else:
            raise ConfigError(f"cross_judge must be true, false or a table, not {value!r}")
        if len(models) < 2:
            raise ConfigError(f"cross_judge needs two or more [asymmetry] models, not "
                              f"{list(models)}")
        return cfg


def cross_dir(out: Path, judge_slug: str, source_slug: str) -> Path:
    """``out/<judge>__judges__<source>``: the run of one judge on one other model's answers."""
    return out / cross_name(judge_slug, source_slug)


def run_cross(acfgs: Mapping[str, asymmetry.AsymmetryConfig], stage_cfgs: Mapping[str, Any],
              cfg: CrossJudgeConfig, out: Path, slug: Callable[[str], str], *,
              overwrite: bool = False, log: Callable[[str], None] = print,
              texts: list[str] | None = None) -> dict[str, Any]:
    """Steps 1-3 of the module docstring; return the matrix.

    Args:
        acfgs: ``{model spec: its asymmetry config}`` (each model's own run is ``out/<slug>``).
        stage_cfgs: the configured stages' configs.
        cfg: the cross-judging settings.
        out: the grid folder.
        slug: model spec -> run folder name (:func:`interp.run.pipeline.model_slug`).
        overwrite: as ``interp run --overwrite``.
        log: progress lines.
        texts: summary texts are appended here.

    Returns:
        The content of ``out/cross_judge.json``.
    """
    texts = texts if texts is not None else []
    runs: dict[str, dict[str, Path]] = {j: {j: out / slug(j)} for j in acfgs}
    stages = [s for s in cfg.stages if s in stage_cfgs]
    for judge, acfg in acfgs.items():
        handle = load_model(judge, device=acfg.device, dtype=acfg.dtype)
        for source in acfgs:
            if source == judge:
                continue
            d = cross_dir(out, slug(judge), slug(source))
            runs[judge][source] = d
            log(f"== {judge} judges {source}'s answers -> {d}")
            t0 = time.perf_counter()
            m = asymmetry.run(d, handle, replace(acfg, answers_from=str(out / slug(source))),
                              overwrite=overwrite, log=log)
            texts += [f"## {judge} judging {source}'s answers ({d}/metrics.json)",
                      asymmetry.format_summary(m)]
            log(f"{texts[-1]}\n== took {time.perf_counter() - t0:.0f} s")
            for name in stages:
                result = STAGES[name].run(RunDir(d), handle,
                                          cross_stage_config(name, stage_cfgs[name]),
                                          overwrite=overwrite, log=log)
                if text := STAGES[name].format_summary(result):
                    texts += [f"## {judge} judging {source}'s answers: {name}", text]
    matrix = judge_matrix({j: {s: str(p) for s, p in row.items()} for j, row in runs.items()},
                          n_boot=cfg.n_boot, seed=cfg.seed)
    write_json(out / "cross_judge.json", matrix)
    text = format_matrix(matrix)
    atomic_write_text(out / "cross_judge.txt", text + "\n")
    texts += ["## cross-judging", text]
    png = plot_judge_matrix(matrix, out / "figures")
    log(f"{text}\n== cross-judging matrix: {out / 'cross_judge.json'}, {png}")
    if "probe" in stages:
        entries = [cross_probe(runs[j][s], runs[s][s], self_run=runs[j][j])
                   for j in runs for s in runs[j] if s != j]
        write_json(out / "cross_probe.json", {"entries": entries})
        log(f"== cross-model probes: {out / 'cross_probe.json'}, "
            f"{plot_cross_probe(entries, out / 'figures')}")
    return matrix


# ---------------------------------------------------------------------------------------------
# Representation as a judge, across models (step 5 of interp.methods.cross_judge)
# ---------------------------------------------------------------------------------------------


def _per_layer(results: Mapping[str, Any]) -> dict[str, Any]:
    """Per-layer CV AUC of the first probe on the eval prompt, one curve per pool."""
    task = results["tasks"]["eval"]
    first = results["config"]["probes"][0]
    layers = list(results["layers"])
    out: dict[str, Any] = {"probe": first, "layers": layers, "pools": {}}
    for pool in task["pools"]:
        rows = {r["layer"]: r for r in task["grid"] if r["probe"] == first and r["pool"] == pool}
        out["pools"][pool] = {"auc": [rows[L]["auc"] if L in rows else None for L in layers],
                              "auc_std": [rows[L]["auc_std"] if L in rows else None
                                          for L in layers]}
    return out


def cross_probe(cross_run: str | Path, source_run: str | Path, *,
                self_run: str | Path | None = None) -> dict[str, Any]:
    """Probes of the judge's residual stream on another model's answers (module step 5).

    Reads the probe stage's ``probes/results.json`` of the cross-judged run (the judge J's
    features on the eval prompts of the source model G's answers: J never generated them) and
    scores, on the SAME records and the SAME folds (:func:`interp.analysis.stats.make_folds` with
    the probe run's folds, seed and passage groups), G's own verdicts on those answers
    (:func:`interp.methods.probing.judge_metrics` of the source records).

    Args:
        cross_run: the run in which J judged G's answers, with ``probes/results.json``.
        source_run: G's self-evaluation run (the answers' source).
        self_run: J's own self-evaluation run; its per-layer curve is added when its probe
            stage ran (other answers, so another y*: context, not a paired comparison).

    Returns:
        ``{"judge", "answers_of", "n_records", "class_counts", "majority_baseline_accuracy",
        "cv", "per_layer", "best", "permutation", "judge_verbal_folds",
        "source_self_judge_folds", "source_self_judge_overall", "self_per_layer"}``; every
        ``*_folds`` AUC is the mean over the same test folds as the probe's.

    Raises:
        RunDirError: no probe results in ``cross_run`` (names ``interp probe``), or a source
            record missing or with another label than the judged one.
    """
    path = Path(cross_run) / "probes" / "results.json"
    if not path.exists():
        raise RunDirError(f"{path} does not exist: run `interp probe --run {cross_run}` first")
    res = read_json(path)
    cfg = ProbeConfig.from_mapping(res["config"])
    records = limit_per_dataset(load_probe_records(RunDir(cross_run)), cfg.limit)
    y = np.array([bool(r["oracle_label"]) for r in records])
    groups = np.array(passage_groups(records))
    folds = make_folds(y, cfg.folds, cfg.seed, groups=groups)
    src = ok_by_key(RunDir(source_run))
    aligned = []
    for r in records:
        s = src.get(qa_key(r))
        if s is None or bool(s["oracle_label"]) != bool(r["oracle_label"]) or (
                s.get("answer") != r.get("answer")):
            raise RunDirError(f"{source_run} has no ok record {'/'.join(qa_key(r))} with "
                              f"the judged answer and label: not the source of {cross_run}")
        aligned.append(s)
    theirs = judge_metrics(aligned, folds)
    out = {"judge": res["model"], "answers_of": str(aligned[0].get("model")),
           "cross_run": str(cross_run), "source_run": str(source_run),
           "n_records": len(records), "n_passages": res["n_passages"],
           "class_counts": res["class_counts"],
           "majority_baseline_accuracy": res["majority_baseline_accuracy"], "cv": res["cv"],
           "per_layer": _per_layer(res), "best": res["tasks"]["eval"]["best"],
           "selection_note": res["selection_note"],
           "permutation": res["tasks"]["eval"].get("permutation"),
           "judge_verbal_folds": res["judge"]["folds"],
           "source_self_judge_folds": theirs["folds"],
           "source_self_judge_overall": theirs["overall"], "self_per_layer": None}
    self_res = Path(self_run) / "probes" / "results.json" if self_run else None
    if self_res is not None and self_res.exists():
        out["self_per_layer"] = _per_layer(read_json(self_res))
    return out
