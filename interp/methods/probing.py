"""Residual-stream probes (representation-as-a-judge): does the judge know more than it says?

Seed 003 (*Representation-as-a-Judge*, "semantic capacity asymmetry"): a small model's hidden
states often encode the evaluation signal its spoken verdict misses. Here the probe target is
the oracle label ``y* = oracle_label`` of each record (positive class: Correct), and the verbal
judge is the same model's ``verdict`` and whole-reply verdict score (``logit_diff``,
:mod:`interp.judging.verdict`) on the same records (paper section 3.1).

Algorithm (the run-directory work, caches and ``results.json`` are
:mod:`interp.stages.probe`; this module takes tensors and labels and gives numbers):

1. Records: the ``ok`` records of an asymmetry run; each record's eval prompt (candidate = the
   record's extracted ``answer``) and gen prompt are rendered again and checked against the
   record (:func:`interp.judging.prompts.rerender`).
2-3. Residual stream and pools (:mod:`interp.judging.residual_features`): ``resid_post`` of every
   layer L (TransformerLens ``blocks.L.hook_resid_post``, before the final norm), pooled per
   layer over the prompt's real positions: ``last`` (the verdict position of the eval prompt),
   ``candidate`` (mean over the candidate span; eval prompt only), ``mean``, ``max``, ``min``.
4. Probes (scikit-learn, :func:`fit_probe`): ``StandardScaler`` fitted on the training fold,
   then a class-balanced ``LogisticRegression`` (``logreg``, the first probe), a
   class-balanced ``LinearSVC`` (``svm``) and a small ``MLPClassifier`` (``mlp``, balanced
   sample weights).
   ``StratifiedGroupKFold(folds, shuffle=True, random_state=seed)`` with one group per passage
   (dataset + context hash; SQuAD and DROP ask several questions about one passage): the same
   folds for every layer, pool, probe and for the verbal judge; no record and no passage is in
   both a train and a test fold (:func:`interp.analysis.stats.make_folds`).
5. Sweep (:func:`sweep`): the first probe is cross-validated at every (layer, pool); the
   others at the ``top_k`` (layer, pool) of the first by the selection metric (``select_by``:
   CV ROC AUC by default, or CV F1), or at every cell with ``sweep_all``. Per cell: accuracy,
   balanced accuracy, F1 of Correct, macro F1 and ROC AUC, mean and std over folds.
6. Questions answered in ``DIR/probes/results.json``: the best (probe, layer, pool) of the eval
   prompt; the probe against the verbal judge on the same records and folds (EA, F1 of the
   verdict, ROC AUC of the whole-reply ``logit_diff``, and McNemar on out-of-fold
   predictions), also with the cell chosen by nested cross-validation
   (:func:`nested_selection`: each test fold's cell chosen on its training records alone); a
   gen-prompt probe (does the residual stream before answering predict
   whether the model's own answer will be right?); cross-dataset transfer of the best eval
   probe (train on all records of one dataset, test on another's, for datasets with both
   classes).
7. The best probe of each kind and task is refitted on all records and saved as ``.npz`` plus
   ``.json`` (scaler mean/scale, coef, intercept; MLP weight matrices), never pickles; the
   figure ``DIR/figures/probes.png`` is drawn from ``results.json``.

Source: seed 003 (INSPECTOR: hidden states, pooled mean/last/min/max, logistic regression
first, also linear SVM and MLP, cross-validated per layer); the paper's "Related seed:
representation-as-a-judge".
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from jaxtyping import Bool, Float
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler
from sklearn.svm import LinearSVC

from interp.analysis.stats import (
    binary_metrics,
    cluster_bootstrap_auc_difference,
    fold_summary,
    make_folds,
    mcnemar,
    roc_auc,
    strata_indices,
)
from interp.core.errors import StageError
from interp.core.io import atomic_path, finite, read_json, write_json
from interp.core.progress import tqdm
from interp.core.vocab import PROBES
from interp.store.records import Record, check_verdict_scores

__all__ = ["METRICS", "PROBES", "TASKS", "FittedProbe", "balanced_weights", "best_row",
           "cross_dataset_transfer", "cross_validate", "fit_probe", "judge_metrics",
           "nested_selection", "paired_auc", "permutation_null", "probe_vs_judge", "sweep"]

TASKS = ("eval", "gen")
METRICS = ("accuracy", "balanced_accuracy", "f1", "f1_macro", "auc")

Features = Float[np.ndarray, "n layer d_model"]
"""One pool's features of ``n`` prompts: ``[n, n_layers, d_model]``."""


# ---------------------------------------------------------------------------------------------
# Step 4: probes
# ---------------------------------------------------------------------------------------------


@dataclass
class FittedProbe:
    """A probe fitted on standardised features, storable without pickles.

    ``score(X) = f((X - mean) / scale)`` where ``f`` is linear (``coef @ z + intercept``) for
    ``logreg``/``svm`` and a ReLU MLP (``weights``/``biases``, logistic output) for ``mlp``.
    Positive scores mean "Correct".

    Attributes:
        kind: ``logreg``, ``svm`` or ``mlp``.
        mean: the scaler's ``[d]`` mean.
        scale: the scaler's ``[d]`` scale.
        coef: ``[d]`` weights (linear probes).
        intercept: the linear probes' bias.
        weights: MLP layer matrices (``mlp`` only).
        biases: MLP layer bias vectors (``mlp`` only).
        meta: JSON-safe description (task, layer, pool, hook point, record count...).
    """

    kind: str
    mean: Float[np.ndarray, " d"]
    scale: Float[np.ndarray, " d"]
    coef: Float[np.ndarray, " d"] | None = None
    intercept: float = 0.0
    weights: list[np.ndarray] = field(default_factory=list)
    biases: list[np.ndarray] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def decision(self, X: Float[np.ndarray, "n d"]) -> Float[np.ndarray, " n"]:
        """Scores ``[n]`` (log-odds for logreg/mlp, margin for svm) of features ``[n, d]``."""
        z = (np.asarray(X, dtype=np.float64) - self.mean) / self.scale
        if self.kind in ("logreg", "svm"):
            return z @ self.coef + self.intercept
        a = z
        for W, b in zip(self.weights[:-1], self.biases[:-1]):
            a = np.maximum(a @ W + b, 0.0)
        return (a @ self.weights[-1] + self.biases[-1]).ravel()

    def predict(self, X: Float[np.ndarray, "n d"]) -> Bool[np.ndarray, " n"]:
        """Predicted labels ``[n]`` (True = Correct): score > 0."""
        return self.decision(X) > 0

    def save(self, stem: str | Path) -> tuple[Path, Path]:
        """Write ``stem.npz`` (arrays) and ``stem.json`` (meta, and the linear weights), atomically.

        Returns:
            The two paths.
        """
        stem = Path(stem)
        arrays = {"mean": self.mean, "scale": self.scale}
        if self.coef is not None:
            arrays.update(coef=self.coef, intercept=np.array([self.intercept]))
        for i, (W, b) in enumerate(zip(self.weights, self.biases)):
            arrays[f"W{i}"], arrays[f"b{i}"] = W, b
        with atomic_path(stem.with_suffix(".npz")) as tmp:
            np.savez(tmp, **arrays)
        doc = {"kind": self.kind, "meta": self.meta, "n_mlp_layers": len(self.weights),
               "score": "((x - scaler_mean) / scaler_scale) @ coef + intercept > 0 => Correct"
               if self.coef is not None else "ReLU MLP on standardised x; logit > 0 => Correct",
               "scaler_mean": self.mean.tolist(), "scaler_scale": self.scale.tolist()}
        if self.coef is not None:
            doc.update(coef=self.coef.tolist(), intercept=float(self.intercept))
        write_json(stem.with_suffix(".json"), doc)
        return stem.with_suffix(".npz"), stem.with_suffix(".json")

    @classmethod
    def load(cls, stem: str | Path) -> FittedProbe:
        """Read a probe written by :meth:`save` (``stem.npz`` + ``stem.json``)."""
        stem = Path(stem)
        doc = read_json(stem.with_suffix(".json"))
        with np.load(stem.with_suffix(".npz"), allow_pickle=False) as z:
            arr = {k: finite(z[k], path=stem.with_suffix(".npz"), name=k) for k in z.files}
        n = doc["n_mlp_layers"]
        return cls(kind=doc["kind"], mean=arr["mean"], scale=arr["scale"],
                   coef=arr.get("coef"), intercept=float(arr["intercept"][0])
                   if "intercept" in arr else 0.0,
                   weights=[arr[f"W{i}"] for i in range(n)],
                   biases=[arr[f"b{i}"] for i in range(n)], meta=doc["meta"])


def balanced_weights(y: Bool[np.ndarray, " n"]) -> Float[np.ndarray, " n"]:
    """Sample weights ``n / (2 n_class)``: both classes weigh the same in total."""
    n, pos = len(y), int(y.sum())
    w_pos, w_neg = n / (2 * max(pos, 1)), n / (2 * max(n - pos, 1))
    return np.where(y, w_pos, w_neg)


def fit_probe(X: Float[np.ndarray, "n d"], y: Bool[np.ndarray, " n"], kind: str = "logreg", *,
              C: float = 1.0, mlp_hidden: int = 64, mlp_alpha: float = 1e-2,
              seed: int = 0, balanced: bool = True) -> FittedProbe:
    """Fit one probe on standardised features (module docstring, step 4).

    Args:
        X: ``[n, d]`` features.
        y: ``[n]`` bool labels (True = y* Correct).
        kind: ``logreg`` (class-balanced L2 logistic regression, lbfgs), ``svm``
            (class-balanced ``LinearSVC``) or ``mlp`` (one ReLU hidden layer, balanced sample
            weights, adam).
        C: inverse regularisation of logreg and svm.
        mlp_hidden: hidden units of the MLP.
        mlp_alpha: L2 penalty of the MLP.
        seed: the MLP's initialisation and the SVM's coordinate-descent order (so a fit is
            reproducible).
        balanced: weigh both classes equally (the default, for accuracy on a rare class);
            False fits ``logreg`` unweighted, so ``sigmoid(decision)`` estimates ``P(y | x)``
            at the data's base rate (what a calibration measure reads,
            :mod:`interp.methods.calibration`; ``svm`` and ``mlp`` stay balanced).

    Returns:
        The :class:`FittedProbe`.

    Raises:
        StageError: unknown kind or a single class in ``y``.
    """
    y = np.asarray(y, dtype=bool)
    if kind not in PROBES:
        raise StageError("probe", f"unknown probe {kind!r}; known: {list(PROBES)}")
    if y.all() or not y.any():
        raise StageError("probe",
                         f"cannot fit a probe on one class (n={len(y)}, correct={int(y.sum())})")
    scaler = StandardScaler().fit(X)
    Z = scaler.transform(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        if kind == "mlp":
            mlp = MLPClassifier(hidden_layer_sizes=(mlp_hidden,), alpha=mlp_alpha, max_iter=300,
                                random_state=seed)
            mlp.fit(Z, y, sample_weight=balanced_weights(y))
            return FittedProbe(kind, scaler.mean_, scaler.scale_,
                               weights=[w.copy() for w in mlp.coefs_],
                               biases=[b.copy() for b in mlp.intercepts_])
        if kind == "logreg":
            clf = LogisticRegression(C=C, class_weight="balanced" if balanced else None,
                                     max_iter=2000).fit(Z, y)
        else:
            clf = LinearSVC(C=C, class_weight="balanced", max_iter=5000, dual="auto",
                            random_state=seed).fit(Z, y)
    return FittedProbe(kind, scaler.mean_, scaler.scale_, coef=clf.coef_[0].copy(),
                       intercept=float(clf.intercept_[0]))


Folds = Sequence[tuple[np.ndarray, np.ndarray]]
"""``(train_idx, test_idx)`` pairs (:func:`interp.analysis.stats.make_folds`)."""


def cross_validate(X: Float[np.ndarray, "n d"], y: Bool[np.ndarray, " n"], folds: Folds,
                   kind: str = "logreg", **fit_kw: Any
                   ) -> tuple[dict[str, Any], Float[np.ndarray, " n"]]:
    """Cross-validate one probe on given folds.

    Args:
        X: ``[n, d]`` features.
        y: ``[n]`` bool labels.
        folds: ``(train_idx, test_idx)`` pairs (:func:`interp.analysis.stats.make_folds`).
        kind: probe kind.
        **fit_kw: passed to :func:`fit_probe`.

    Returns:
        ``(summary, oof_scores)``: metric means, ``*_std`` and ``*_n_folds`` over folds and
        the undefined folds (:func:`interp.analysis.stats.fold_summary`), and the out-of-fold score
        of every example ``[n]``.
    """
    per_fold, oof = [], np.zeros(len(y))
    for tr, te in folds:
        p = fit_probe(X[tr], y[tr], kind, **fit_kw)
        s = p.decision(X[te])
        oof[te] = s
        per_fold.append(binary_metrics(y[te], s > 0, s))
    return fold_summary(per_fold, METRICS, _class_counts(y, folds)), oof


def _class_counts(y: Bool[np.ndarray, " n"], folds: Folds) -> list[tuple[int, int]]:
    """Each test fold's ``(n_correct, n_incorrect)``."""
    return [(int(y[te].sum()), int((~y[te]).sum())) for _, te in folds]


def _verdict_balanced_accuracy(y: np.ndarray, accepted: np.ndarray, rejected: np.ndarray
                               ) -> float | None:
    """(accepted right + rejected wrong) / 2; a reply without a verdict is in neither.

    None with one class (as :func:`interp.analysis.stats.binary_metrics`).
    """
    if y.all() or not y.any():
        return None
    return float((accepted[y].mean() + rejected[~y].mean()) / 2)


def judge_metrics(records: Sequence[Record] | Sequence[Mapping[str, Any]],
                  folds: Folds | None = None) -> dict[str, Any]:
    """The verbal judge scored like a probe, overall and on the probes' test folds.

    ``EA`` = accuracy of the parsed verdict against y* (an unparseable verdict counts as wrong,
    as in :func:`interp.methods.asymmetry.group_metrics`); balanced accuracy likewise counts
    it wrong on both sides (neither an acceptance of a right answer nor a rejection of a wrong
    one: the definition of Study 1's ``balanced_accuracy``); for F1 an unparseable verdict
    counts as "Incorrect"; the AUC is that of the whole-reply verdict score
    ``logit_diff`` = log P("Correct") - log P("Incorrect") (:mod:`interp.judging.verdict`), and
    ``EA_forced`` the accuracy of its forced choice ``p_correct > 0.5``.

    Returns:
        ``{"overall": {EA, EA_forced, accuracy, balanced_accuracy, f1, f1_macro, auc,
        invalid_verdicts}, "folds": {metric means and stds over the test folds}}`` (``folds``
        only when given).

    Raises:
        RunDirError: a record without the whole-reply verdict score.
    """
    check_verdict_scores(records)
    y = np.array([bool(r["oracle_label"]) for r in records])
    v = [r.get("verdict") for r in records]
    pred = np.array([x is True for x in v])
    right = np.array([x is not None and x == t for x, t in zip(v, y)])
    score = np.array([float(r["logit_diff"]) for r in records])
    rejected = np.array([x is False for x in v])
    overall = {"EA": float(right.mean()), **binary_metrics(y, pred, score),
               "EA_forced": float(((score > 0) == y).mean()),
               "invalid_verdicts": int(sum(x is None for x in v))}
    overall["accuracy"] = overall["EA"]
    overall["balanced_accuracy"] = _verdict_balanced_accuracy(y, pred, rejected)
    out: dict[str, Any] = {"overall": overall}
    if folds is not None:
        per = []
        for _, te in folds:
            m = binary_metrics(y[te], pred[te], None if score is None else score[te])
            m["accuracy"] = float(right[te].mean())
            m["balanced_accuracy"] = _verdict_balanced_accuracy(y[te], pred[te], rejected[te])
            per.append(m)
        out["folds"] = fold_summary(per, METRICS, _class_counts(y, folds))
    return out


def probe_vs_judge(best: Mapping[str, Any], oof: Float[np.ndarray, " n"],
                   y: Bool[np.ndarray, " n"], records: Sequence[Mapping[str, Any]],
                   judge_folds: Mapping[str, Any], *, groups: Sequence[Any] | None = None,
                   n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The best cell's probe against the verbal judge on the same records and folds.

    Besides the fold means, the paired comparison that decides "does the probe beat the
    judge": the AUC of the probe's pooled out-of-fold scores and of the judge's whole-reply
    ``logit_diff`` on the same records, their difference, and passage-cluster bootstrap CIs
    from the same resamples (:func:`interp.analysis.stats.cluster_bootstrap_auc_difference`). The
    probe's cell was selected on these folds, so its AUC is optimistic by the selection; the
    permutation null (:func:`permutation_null`) tests the best cell against shuffled labels,
    and :func:`nested_selection` gives out-of-fold scores whose cell never saw its test fold,
    for the same paired comparison (:func:`paired_auc`) with the selection held out.

    Pooled over datasets, an AUC also rewards knowing WHICH dataset a record is from (their
    GAs differ: 0.40 on SQuAD 2.0 and 0 on MuSiQue for SmolLM2), which the probe can read off
    the prompt and the judge's ``logit_diff`` does not use; ``auc_dataset_only`` is the AUC of
    that knowledge alone (each record scored by its dataset's base rate, in-sample), and
    ``auc_paired_within_dataset`` the same comparison over pairs within one dataset
    (:func:`interp.analysis.stats.stratified_auc`), which that knowledge cannot raise.

    Args:
        best: the best sweep row (metric means and stds).
        oof: ``[n]`` its out-of-fold scores.
        y: ``[n]`` labels.
        records: the ``n`` records (``verdict``, ``logit_diff``).
        judge_folds: :func:`judge_metrics` ``["folds"]`` on the same folds.
        groups: ``[n]`` passage ids for the CIs (None: one per record).
        n_boot: bootstrap resamples (0: no CIs).
        seed: seed of the resamples.

    Returns:
        Both sides' metrics, their differences, ``auc_paired`` and
        ``auc_paired_within_dataset`` (each ``{"probe", "probe_ci", "judge", "judge_ci",
        "probe_minus_judge", "ci", "n", "n_passages"}``), ``auc_dataset_only``, McNemar of
        right/wrong on out-of-fold predictions and the probe's out-of-fold accuracy.
    """
    probe_right = (oof > 0) == y
    v = [r.get("verdict") for r in records]
    judge_right = np.array([x is not None and x == t for x, t in zip(v, y)])
    ds = [r.get("dataset", "") for r in records]
    base = np.empty(len(y))
    for idx in strata_indices(ds):   # each record scored by its dataset's base rate
        base[idx] = y[idx].mean()
    return {
        "probe": {m: best[m] for m in METRICS} | {f"{m}_std": best[f"{m}_std"] for m in METRICS},
        "judge_same_folds": judge_folds,
        "delta_accuracy_probe_minus_EA": best["accuracy"] - judge_folds["accuracy"],
        "delta_auc_probe_minus_p_correct": (best["auc"] - judge_folds["auc"])
        if best["auc"] is not None and judge_folds["auc"] is not None else None,
        **paired_auc(oof, y, records, groups=groups, n_boot=n_boot, seed=seed),
        "auc_dataset_only": roc_auc(y, base),
        "mcnemar_probe_vs_verdict": mcnemar(probe_right, judge_right),
        "oof_accuracy": float(probe_right.mean()),
    }


def paired_auc(scores: Float[np.ndarray, " n"], y: Bool[np.ndarray, " n"],
               records: Sequence[Mapping[str, Any]], *, groups: Sequence[Any] | None = None,
               n_boot: int = 2000, seed: int = 0) -> dict[str, dict[str, Any]]:
    """A probe's out-of-fold scores against the judge's ``logit_diff``: paired AUCs with CIs.

    Both AUCs and their difference come from the same passage-cluster resamples
    (:func:`interp.analysis.stats.cluster_bootstrap_auc_difference`), pooled and within
    datasets (pairs of one dataset only, which knowing the dataset cannot raise).

    Args:
        scores: ``[n]`` the probe's out-of-fold decision scores.
        y: ``[n]`` labels.
        records: the ``n`` records (``logit_diff``, ``dataset``).
        groups: ``[n]`` passage ids (None: one per record).
        n_boot: bootstrap resamples (0: no CIs).
        seed: seed of the resamples.

    Returns:
        ``{"auc_paired", "auc_paired_within_dataset"}``, each ``{"probe", "probe_ci", "judge",
        "judge_ci", "probe_minus_judge", "ci", "n", "n_passages"}``.
    """
    ld = np.array([float(r["logit_diff"]) for r in records])
    ds = [r.get("dataset", "") for r in records]
    grp = list(range(len(y))) if groups is None else list(groups)

    def paired(strata: Sequence[Any] | None) -> dict[str, Any]:
        d = cluster_bootstrap_auc_difference(y, scores, ld, grp, np.random.default_rng(seed),
                                             n_boot, strata=strata)
        return {"probe": d["auc_a"], "probe_ci": d["ci_a"], "judge": d["auc_b"],
                "judge_ci": d["ci_b"], "probe_minus_judge": d["difference"], "ci": d["ci"],
                "n": d["n"], "n_passages": d["n_clusters"]}

    return {"auc_paired": paired(None), "auc_paired_within_dataset": paired(ds)}


# ---------------------------------------------------------------------------------------------
# Steps 5-6: sweep, selection, permutation null, transfer
# ---------------------------------------------------------------------------------------------


def sweep(feats: Mapping[str, Features], y: Bool[np.ndarray, " n"], layers: Sequence[int],
          folds: Folds, *, probes: Sequence[str] = PROBES, select_by: str = "auc",
          top_k: int = 5, sweep_all: bool = False, fit_kw: Mapping[str, Any] | None = None,
          log: Callable[[str], None] = print, progress: bool = True,
          n_jobs: int = 1) -> list[dict[str, Any]]:
    """Cross-validate probes over (layer, pool) cells (module docstring, step 5).

    Args:
        feats: ``{pool: [n, n_layers, d]}``.
        y: ``[n]`` labels.
        layers: layers to probe.
        folds: shared CV folds.
        probes: probe kinds; the first runs at every cell.
        select_by: ``auc`` or ``f1``: ranks the first probe's cells.
        top_k: cells, best first, at which the other probes run.
        sweep_all: run every probe at every cell instead.
        fit_kw: passed to :func:`fit_probe` (``C``, ``mlp_hidden``, ``mlp_alpha``, ``seed``).
        log: progress lines.
        progress: a progress bar per probe kind (cells done, rate, ETA; each cell is one
            k-fold cross-validation).
        n_jobs: processes that cross-validate cells at once (:mod:`joblib`); every cell's
            result is the same as in one process.

    Returns:
        Rows ``{probe, layer, pool, accuracy, accuracy_std, ..., auc, auc_std}``.
    """
    rows: list[dict[str, Any]] = []
    kw = dict(fit_kw or {})
    first, rest = probes[0], probes[1:]
    t0 = time.perf_counter()
    cells = [(L, p) for p in feats for L in layers]
    for (L, p), summ in zip(cells, _cross_validate_cells(
            feats, y, cells, folds, first, kw, n_jobs,
            tqdm(total=len(cells), desc=f"probe {first} (layer x pool)", unit="cell",
                 disable=not progress, leave=False))):
        rows.append({"probe": first, "layer": L, "pool": p, **summ})
    log(f"[probe] {first}: {len(cells)} cells x {len(folds)} folds in "
        f"{time.perf_counter() - t0:.0f} s")
    if rest:
        ranked = sorted(rows, key=lambda r: -(r[select_by] or 0.0))
        chosen = cells if sweep_all else [(r["layer"], r["pool"]) for r in ranked[:top_k]]
        for kind in rest:
            t0 = time.perf_counter()
            for (L, p), summ in zip(chosen, _cross_validate_cells(
                    feats, y, chosen, folds, kind, kw, n_jobs,
                    tqdm(total=len(chosen), desc=f"probe {kind}", unit="cell",
                         disable=not progress, leave=False))):
                rows.append({"probe": kind, "layer": L, "pool": p, **summ})
            log(f"[probe] {kind}: {len(chosen)} cells in {time.perf_counter() - t0:.0f} s")
    return rows


def _cross_validate_cells(feats: Mapping[str, Features], y: np.ndarray,
                          cells: Sequence[tuple[int, str]], folds: Folds, kind: str,
                          kw: Mapping[str, Any], n_jobs: int, bar: Any) -> list[dict[str, Any]]:
    """:func:`cross_validate`'s summary of each ``(layer, pool)`` cell, in order.

    With ``n_jobs > 1`` the cells go to that many :mod:`joblib` worker processes (each cell is
    independent and deterministic, so the results are the ones of one process; ``n_jobs = 1``
    runs them in this process); ``bar`` advances as cells finish.
    """
    from joblib import Parallel, delayed

    out = []
    jobs = (delayed(cross_validate)(feats[p][:, L], y, folds, kind, **kw) for L, p in cells)
    with bar:
        for summ, _ in Parallel(n_jobs=n_jobs, return_as="generator")(jobs):
            out.append(summ)
            bar.update(1)
    return out


def best_row(rows: Sequence[Mapping[str, Any]], select_by: str,
             probe: str | None = None) -> dict[str, Any]:
    """The row with the highest mean CV ``select_by``, optionally among one probe kind's rows.

    Ties go to the higher other metric (``f1`` or ``auc``), then to the earlier layer.
    """
    other = "f1" if select_by == "auc" else "auc"
    cand = [r for r in rows if probe is None or r["probe"] == probe]
    return dict(max(cand, key=lambda r: (r[select_by] or 0.0, r[other] or 0.0, -r["layer"])))


def nested_selection(feats: Mapping[str, Features], y: Bool[np.ndarray, " n"],
                     layers: Sequence[int], folds: Folds, groups: Sequence[Any], *,
                     inner_folds: int, seed: int, probes: Sequence[str] = PROBES,
                     select_by: str = "auc", top_k: int = 5, sweep_all: bool = False,
                     fit_kw: Mapping[str, Any] | None = None, n_jobs: int = 1,
                     log: Callable[[str], None] = print) -> dict[str, Any]:
    """Out-of-fold scores of a probe whose cell is chosen without its test fold (nested CV).

    The sweep's best cell (:func:`best_row`) is the maximum over many cells scored on the very
    folds that rank them, so its score is optimistic. Here each outer fold's cell is chosen
    on that fold's training records alone, by the same sweep (:func:`sweep`: same probes,
    ``select_by``, ``top_k``) cross-validated on ``inner_folds`` folds built from those records
    and their passages; the chosen cell is then fitted on the whole training part and scores
    the outer test fold. The outer test folds see neither the selection nor the fit, so the
    pooled out-of-fold scores estimate the whole procedure "sweep, pick the best, use it"
    (nested cross-validation: Varma & Simon 2006; Cawley & Talbot 2010, section 5.3).

    Args:
        feats: ``{pool: [n, n_layers, d]}``.
        y: ``[n]`` bool labels.
        layers: layers swept.
        folds: the outer ``(train, test)`` folds (the sweep's own, so the judge is read on the
            same folds).
        groups: ``[n]`` passage ids (the inner folds keep passages whole too).
        inner_folds: k of the inner folds.
        seed: seed of the inner folds.
        probes: probe kinds; the first runs at every cell (as for :func:`sweep`).
        select_by: ``auc`` or ``f1``: what chooses each fold's cell.
        top_k: cells at which the other probes run.
        sweep_all: every probe at every cell instead.
        fit_kw: passed to :func:`fit_probe`.
        n_jobs: processes per inner sweep (the result does not depend on it).
        log: progress lines.

    Returns:
        ``{"oof": [n] out-of-fold scores, "chosen": one {probe, layer, pool, inner
        select_by value} per outer fold, "n_distinct": distinct cells chosen, "inner_folds"}``.

    Raises:
        StageError: an outer training part with too few passages of a class for the inner
            folds (:func:`interp.analysis.stats.make_folds`).
    """
    g = np.asarray(groups)
    oof = np.zeros(len(y))
    chosen: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for k, (tr, te) in enumerate(tqdm(folds, desc="nested selection", unit="fold",
                                      leave=False)):
        inner = make_folds(y[tr], inner_folds, seed + 1 + k, groups=g[tr],
                           what=f"outer fold {k + 1}'s training records")
        sub = {p: f[tr] for p, f in feats.items()}
        rows = sweep(sub, y[tr], layers, inner, probes=probes, select_by=select_by,
                     top_k=top_k, sweep_all=sweep_all, fit_kw=fit_kw, log=lambda _: None,
                     progress=False, n_jobs=n_jobs)
        b = best_row(rows, select_by)
        fp = fit_probe(feats[b["pool"]][tr, b["layer"]], y[tr], b["probe"], **dict(fit_kw or {}))
        oof[te] = fp.decision(feats[b["pool"]][te, b["layer"]])
        chosen.append({"probe": b["probe"], "layer": b["layer"], "pool": b["pool"],
                       select_by: b[select_by]})
    log(f"[probe] nested selection: {len(folds)} outer folds in "
        f"{time.perf_counter() - t0:.0f} s")
    return {"oof": oof, "chosen": chosen, "inner_folds": inner_folds,
            "n_distinct": len({(c["probe"], c["layer"], c["pool"]) for c in chosen})}


def permutation_null(feats: Mapping[str, Features], y: Bool[np.ndarray, " n"],
                     layers: Sequence[int], observed: float, *, n_permutations: int, folds: int,
                     seed: int, probe: str = "logreg", select_by: str = "auc",
                     fit_kw: Mapping[str, Any] | None = None,
                     groups: np.ndarray | None = None,
                     strata: Sequence[Any] | None = None,
                     done: Sequence[float | None] = (),
                     on_step: Callable[[list[float | None]], None] | None = None,
                     log: Callable[[str], None] = print, n_jobs: int = 1) -> dict[str, Any]:
    """Selection-aware permutation test of the best (layer, pool) cell of one probe.

    The best cell is the maximum over many cells, so its CV score is optimistic. Here the
    labels are permuted ``n_permutations`` times (``numpy`` generator seeded with ``seed``),
    folds are rebuilt on each permuted labelling (same groups, seed ``seed + 1 + i``), the
    probe's whole grid is cross-validated again, and the best cell's ``select_by`` is kept:
    the distribution of "the best score the search finds when labels carry no signal"
    (a max-statistic permutation test; Westfall & Young 1993, Ojala & Garriga 2010).

    Args:
        feats: ``{pool: [n, n_layers, d]}``.
        y: ``[n]`` bool labels.
        layers: layers swept.
        observed: the real best cell's ``select_by`` value of ``probe``.
        n_permutations: label permutations.
        folds: k of the k-fold splits.
        seed: seed of the permutations and folds.
        probe: the probe kind swept.
        select_by: ``auc`` or ``f1``.
        fit_kw: passed to :func:`fit_probe`.
        groups: ``[n]`` passage ids for the folds (see :func:`interp.analysis.stats.make_folds`).
        strata: ``[n]`` stratum of each example (e.g. its dataset), or None: labels are then
            permuted within each stratum only, so every stratum keeps its share of positives
            and a probe that only tells the strata apart scores as well under the null as on
            the real labels (the null of "nothing beyond the stratum's base rate").
        done: the outcomes of the first permutations from an interrupted call (each the best
            score, or None where its folds could not be built): they are kept, the generator
            is advanced past them, and the loop resumes at permutation ``len(done)``, so the
            result equals an uninterrupted call's.
        on_step: called after every permutation with every outcome until then (the stage's
            checkpoint).
        log: progress lines.
        n_jobs: processes per sweep (:func:`sweep`; the outcomes do not depend on it).

    Returns:
        ``{"n", "skipped", "metric", "probe", "observed", "null" (list), "null_mean",
        "null_q95", "p_value", "within"}`` with ``p_value = (1 + #{null >= observed}) /
        (1 + n)``; ``within`` says whether labels were permuted within strata.
    """
    rng = np.random.default_rng(seed)
    cells = None if strata is None else strata_indices(strata)

    def permute() -> np.ndarray:
        if cells is None:
            return rng.permutation(y)
        yp = np.array(y, copy=True)
        for idx in cells:
            yp[idx] = rng.permutation(y[idx])
        return yp

    outcomes: list[float | None] = list(done)[:n_permutations]
    for _ in outcomes:
        permute()   # the generator's state as after those permutations
    t0 = time.perf_counter()
    for i in tqdm(range(len(outcomes), n_permutations), total=n_permutations,
                  initial=len(outcomes), desc="permutation null", unit="sweep", leave=False):
        yp = permute()
        try:
            fp = make_folds(yp, folds, seed + 1 + i, groups=groups)
        except StageError:   # the permuted positives fell into fewer passages than folds
            outcomes.append(None)
        else:
            rows = sweep(feats, yp, layers, fp, probes=[probe], fit_kw=fit_kw,
                         log=lambda _: None, progress=False, n_jobs=n_jobs)
            outcomes.append(float(best_row(rows, select_by)[select_by] or 0.0))
        if on_step is not None:
            on_step(outcomes)
    log(f"[probe] permutation null: {n_permutations} sweeps ({len(done)} resumed) in "
        f"{time.perf_counter() - t0:.0f} s")
    null = [x for x in outcomes if x is not None]
    skipped = len(outcomes) - len(null)
    arr = np.array(null)
    return {"n": len(null), "skipped": skipped, "metric": select_by, "probe": probe,
            "observed": observed, "null": null,
            "null_mean": float(arr.mean()) if len(arr) else None,
            "null_q95": float(np.quantile(arr, 0.95)) if len(arr) else None,
            "p_value": float((1 + (arr >= observed).sum()) / (1 + len(arr))),
            "within": "strata" if strata is not None else None}


def cross_dataset_transfer(X: Float[np.ndarray, "n d"], y: Bool[np.ndarray, " n"],
                           ds: np.ndarray, kind: str, *, folds: int, seed: int,
                           min_per_class: int = 2, fit_kw: Mapping[str, Any] | None = None,
                           groups: np.ndarray | None = None) -> dict[str, Any]:
    """Train a probe on all records of one dataset and test it on another's (module step 6).

    Args:
        X: one (layer, pool) feature matrix ``[n, d]``.
        y: ``[n]`` labels.
        ds: ``[n]`` dataset names.
        kind: probe kind.
        folds: k of the within-dataset cross-validation (the diagonal of the table).
        seed: fold seed.
        min_per_class: fewest records of each class a dataset needs to take part.
        fit_kw: passed to :func:`fit_probe`.
        groups: ``[n]`` passage ids (within-dataset folds keep passages together).

    Returns:
        ``{"datasets": eligible, "excluded": {name: why}, "pairs": [{train, test, n_train,
        n_test, metrics...}], "possible": at least two eligible datasets}``.
    """
    eligible, excluded = [], {}
    for d in sorted(set(ds.tolist())):
        yd = y[ds == d]
        n_c, n_i = int(yd.sum()), int((~yd).sum())
        if min(n_c, n_i) < min_per_class:
            excluded[d] = f"y*=Correct {n_c}, y*=Incorrect {n_i} (needs >= {min_per_class} " \
                          f"of each)"
        else:
            eligible.append(d)
    kw = dict(fit_kw or {})
    pairs = []
    for a in eligible:
        probe = fit_probe(X[ds == a], y[ds == a], kind, **kw)
        for b in eligible:
            row: dict[str, Any] = {"train": a, "test": b, "n_train": int((ds == a).sum()),
                                   "n_test": int((ds == b).sum())}
            if a == b:
                yd = y[ds == a]
                gd = None if groups is None else groups[ds == a]
                k = min(folds, int(yd.sum()), int((~yd).sum()))
                if gd is not None:
                    k = min(k, len(set(gd[yd].tolist())), len(set(gd[~yd].tolist())))
                if k >= 2:
                    summ, _ = cross_validate(X[ds == a], yd, make_folds(yd, k, seed, groups=gd),
                                             kind, **kw)
                    row.update({m: summ[m] for m in METRICS}, note=f"within-dataset {k}-fold CV")
                else:
                    row.update({m: None for m in METRICS}, note="too few for CV")
            else:
                s = probe.decision(X[ds == b])
                row.update(binary_metrics(y[ds == b], s > 0, s))
            pairs.append(row)
    return {"datasets": eligible, "excluded": excluded, "pairs": pairs,
            "possible": len(eligible) >= 2}
