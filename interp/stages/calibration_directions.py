"""The calibration stage's ``directions`` part: one correctness direction or two.

Methods: :mod:`interp.methods.directions`. Run by :func:`interp.stages.calibration.run` when
``directions`` is set, on the stage's own records (the same records, the same ``y``: the
oracle's label of the model's own answer, the same passage folds).

Algorithm of :func:`run_directions`:

1. States, per record (``DIR/calibration/directions/states/{dataset}__{id}.safetensors``,
   reused when fresh): ``resid_post`` of every layer at the generator's reply tokens (its
   conversation: the self-check prompt up to the end of its reply; the mean over the reply's
   tokens and the last one, both kept) and at the fresh judge prompt's verdict position.
2. Directions and their cosine per layer (:func:`interp.methods.directions.direction_cosines`,
   all records, with the label-permutation null) and cross-decoding out-of-fold by passage
   (:func:`interp.methods.directions.cross_decode`), AUCs with passage-cluster CIs.
3. The causal test, per outer fold (the same passage folds): the layer is chosen on the
   fold's training records alone (:func:`interp.methods.directions.choose_layer`), the
   generator's mass-mean direction is fitted on them at that layer, the norm unit is the
   median norm of the judge's ``resid_post`` there over them, and every test record's judge
   prompt is run with ``norm x direction`` added at its verdict position, and with
   ``directions_seeds`` random unit directions of the same norms
   (:func:`interp.methods.directions.steer_verdict`;
   ``DIR/calibration/directions/steer/{dataset}__{id}.json``, reused when fresh). Every
   record is scored by directions fitted on other passages only.
4. Summary ``DIR/calibration/summary.json`` key ``directions`` (:func:`summarise_directions`)
   and the figure ``DIR/figures/calibration_directions.png``.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from interp.analysis.stats import (
    ClusterBootstrap,
    cluster_bootstrap_auc,
    cluster_bootstrap_auc_difference,
    mean_stat,
    roc_auc,
)
from interp.core.contract import spec
from interp.core.io import is_fresh, load_tensors, read_json, save_tensors, signature, write_json
from interp.core.progress import resumed, tqdm
from interp.models.loading import ModelHandle
from interp.stages.configs.calibration import CalibrationConfig
from interp.store.records import qa_key
from interp.store.rundir import RunDir

__all__ = ["accept_gap_change", "format_directions", "run_directions", "summarise_directions"]

_STATES = next(p for p in spec("calibration").parts if p.label == "direction states")
_STEER = next(p for p in spec("calibration").parts if p.label == "direction steering")


def _states(run_dir: RunDir, handle: ModelHandle, cfg: CalibrationConfig,
            records: Sequence[Mapping[str, Any]], facts: Mapping[str, Any],
            self_prompt: Callable[[Mapping[str, Any]], Any], eval_prompt:
            Callable[[Mapping[str, Any]], Any], log: Callable[[str], None]
            ) -> tuple[np.ndarray, np.ndarray]:
    """Step 1: ``(G [n, n_layers, d], J [n, n_layers, d])`` (G in ``cfg.direction_pool``)."""
    from interp.hooks.model import HookedModel
    from interp.methods.directions import answer_states, verdict_states

    model = HookedModel(handle)
    G, J = [], []
    with tqdm(total=len(records), desc="direction states", unit="record",
              disable=not cfg.progress) as bar:
        for rec in records:
            sc, ev = self_prompt(rec), eval_prompt(rec)
            sig = signature({"model": handle.spec, "sha256": handle.info.get("sha256"),
                             **facts, "point": "resid_post", "version": 1,
                             "ids": {"self": sc.input_ids, "eval": ev.input_ids,
                                     "answer": list(sc.token_spans["candidate"])}})
            f = _STATES.path(run_dir.path, rec["dataset"], rec["id"])
            if is_fresh(f, sig):
                t = load_tensors(f)
                resumed(bar)
            else:
                a = answer_states(model, sc)
                t = {"gen_mean": a["mean"], "gen_last": a["last"],
                     "judge": verdict_states(model, ev.input_ids)}
                f.parent.mkdir(parents=True, exist_ok=True)
                save_tensors(f, t, {"signature": sig})
                bar.update(1)
            G.append(t[f"gen_{cfg.direction_pool}"].numpy())
            J.append(t["judge"].numpy())
    log(f"[calibration] direction states of {len(records)} records")
    return np.stack(G).astype(np.float64), np.stack(J).astype(np.float64)


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, np.float64).tobytes()).hexdigest()[:16]


def _steer(run_dir: RunDir, handle: ModelHandle, cfg: CalibrationConfig,
           records: Sequence[Mapping[str, Any]], G: np.ndarray, J: np.ndarray, y: np.ndarray,
           groups: Sequence[str], split: Sequence[tuple[Sequence[int], Sequence[int]]],
           facts: Mapping[str, Any], eval_prompt: Callable[[Mapping[str, Any]], Any]
           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Step 3: ``(per-record steering rows in the records' order, per-fold facts)``."""
    import torch

    from interp.hooks.model import HookedModel
    from interp.judging.verdict import verdict_replies
    from interp.methods.directions import choose_layer, mass_mean_direction, random_directions

    model = HookedModel(handle)
    replies = verdict_replies(handle.tokenizer)
    layers = list(range(handle.n_layers))
    norms = [float(x) for x in cfg.direction_norms]
    rows: list[dict[str, Any] | None] = [None] * len(records)
    fold_facts = []
    with tqdm(total=len(records), desc="direction steering", unit="record",
              disable=not cfg.progress) as bar:
        for k, (tr, te) in enumerate(split):
            tr, te = np.asarray(tr), np.asarray(te)
            ch = choose_layer(G[tr], y[tr], [groups[i] for i in tr], layers,
                              folds=cfg.inner_folds, seed=cfg.seed)
            L = ch["layer"]
            u = mass_mean_direction(G[tr, L], y[tr])
            unit = float(np.median(np.linalg.norm(J[tr, L], axis=1)))
            rand = random_directions(u.shape[0], cfg.direction_seeds,
                                     seed=zlib.crc32(f"{cfg.seed}/{k}".encode()))
            dirs = np.vstack([u[None], rand])                    # [1 + seeds, d]
            vec = np.concatenate([dirs * (m * unit) for m in norms])   # [norms*(1+seeds), d]
            fold_facts.append({"fold": k, "layer": L, "inner_auc": ch["auc"],
                               "norm_unit": unit, "n_train": int(len(tr)),
                               "n_test": int(len(te))})
            vt = torch.tensor(vec, dtype=torch.float32)
            for i in te:
                rec = records[int(i)]
                ev = eval_prompt(rec)
                sig = signature({"model": handle.spec, "sha256": handle.info.get("sha256"),
                                 **facts, "replies": replies.id_lists(), "layer": L,
                                 "vectors": _digest(vec), "ids": ev.input_ids, "version": 1})
                f = _STEER.path(run_dir.path, rec["dataset"], rec["id"])
                if is_fresh(f, sig):
                    part = read_json(f)["part"]
                    resumed(bar)
                else:
                    r = _steer_rows(model, ev.input_ids, L, vt, replies, len(norms),
                                           1 + cfg.direction_seeds)
                    part = {"id": rec["id"], "dataset": rec["dataset"], "fold": k, "layer": L,
                            "norms": norms, "norm_unit": unit, **r}
                    write_json(f, {"signature": sig, "part": part})
                    bar.update(1)
                rows[int(i)] = part
    return [r for r in rows if r is not None], fold_facts


def _steer_rows(model: Any, ids: Sequence[int], layer: int, vectors: Any,
                       replies: Any, n_norms: int, n_dirs: int) -> dict[str, Any]:
    """:func:`interp.methods.directions.steer_verdict` reshaped per norm and direction.

    Returns:
        ``{"base", "own": [n_norms], "random": [n_norms][n_dirs - 1]}`` logit differences
        (nats), ``own`` the generator's direction's.
    """
    from interp.methods.directions import steer_verdict

    r = steer_verdict(model, ids, layer, vectors, replies)
    ld = np.array(r["logit_diff"]).reshape(n_norms, n_dirs)
    return {"base": r["base"], "own": ld[:, 0].tolist(), "random": ld[:, 1:].tolist()}


def accept_gap_change(y: np.ndarray, acc_a: np.ndarray, acc_b: np.ndarray,
                      groups: Sequence[str], rng: np.random.Generator, n_boot: int
                      ) -> dict[str, Any]:
    """Change of (acceptance of right answers - acceptance of wrong answers), ``a`` minus ``b``.

    ``acc`` is 1 where the verdict accepts (forced choice: logit difference > 0), or a share
    (a mean over random directions). The gap ``mean(acc | y) - mean(acc | not y)`` of each, on
    the same passage-cluster resamples (:class:`interp.analysis.stats.ClusterBootstrap`), so
    the interval of the change is paired.

    Returns:
        ``{"a", "b", "difference", "ci"}`` (gaps and their change; ``ci`` None without
        resamples or a class).
    """
    y = np.asarray(y, bool)
    a, b = np.asarray(acc_a, np.float64), np.asarray(acc_b, np.float64)

    def gap(w: np.ndarray, acc: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return (w @ (acc * y)) / (w @ y) - (w @ (acc * ~y)) / (w @ (~y))

    one = np.ones((1, len(y)))
    out: dict[str, Any] = {"a": None, "b": None, "difference": None, "ci": None}
    if not y.any() or y.all():
        return out
    ga, gb = float(gap(one, a)[0]), float(gap(one, b)[0])
    out.update(a=ga, b=gb, difference=ga - gb)
    bs = ClusterBootstrap(list(groups), n_boot, rng)
    if bs.weights is not None:
        out["ci"] = bs.interval(gap(bs.weights, a) - gap(bs.weights, b))
    return out


def _auc(d: Mapping[str, Any]) -> dict[str, Any]:
    return {"a": d["auc_a"], "b": d["auc_b"], "difference": d["difference"], "ci": d["ci"]}


def summarise_directions(y: np.ndarray, groups: Sequence[str], cos: Mapping[str, Any],
                         cross: Mapping[str, Any], steer: Sequence[Mapping[str, Any]],
                         fold_facts: Sequence[Mapping[str, Any]], *, d_model: int,
                         n_boot: int, seed: int) -> dict[str, Any]:
    """Steps 2-3's numbers with passage-cluster CIs (module docstring).

    Returns:
        ``{"cosine": {method: [per layer]}, "random_band", "cross_decoding": {method:
        {kind: [per layer {"layer", "auc", "ci"}]}}, "steer": {"folds", "norms", "own":
        [per norm], "random": [per norm], "random_seeds": [per norm [per seed]],
        "own_minus_random": [per norm]}}``; each norm's block holds ``flip_share``,
        ``delta_logit_diff``, ``delta_auc`` and ``delta_accept_gap`` with CIs.
    """
    from interp.methods.calibration import random_cosine_band

    def rng(block: str) -> np.random.Generator:
        return np.random.default_rng([seed, zlib.crc32(block.encode())])

    y = np.asarray(y, bool)
    out: dict[str, Any] = {"cosine": cos, "random_band": random_cosine_band(d_model)}
    cd: dict[str, Any] = {}
    for m, kinds in cross["scores"].items():
        cd[m] = {}
        for kind, S in kinds.items():
            cd[m][kind] = []
            for i, L in enumerate(cross["layers"]):
                a = cluster_bootstrap_auc(y, S[i], groups, rng(f"cd/{m}/{kind}/{L}"), n_boot)
                cd[m][kind].append({"layer": int(L), "auc": a["auc"], "ci": a["ci"]})
    out["cross_decoding"] = cd
    if not steer:
        return out
    base = np.array([r["base"] for r in steer])
    own = np.array([r["own"] for r in steer])                    # [n, norms]
    rand = np.array([r["random"] for r in steer])                # [n, norms, seeds]
    norms = steer[0]["norms"]

    def block(ld: np.ndarray, tag: str) -> dict[str, Any]:
        flips = np.sign(ld) != np.sign(base)
        return {"flip_share": mean_stat(flips, groups, rng(f"{tag}/flip"), n_boot),
                "delta_logit_diff": mean_stat(ld - base, groups, rng(f"{tag}/ld"), n_boot),
                "delta_auc": _auc(cluster_bootstrap_auc_difference(
                    y, ld, base, groups, rng(f"{tag}/auc"), n_boot)),
                "delta_accept_gap": accept_gap_change(y, ld > 0, base > 0, groups,
                                                      rng(f"{tag}/gap"), n_boot)}

    st: dict[str, Any] = {"folds": list(fold_facts), "norms": norms, "own": [], "random": [],
                          "random_seeds": [], "own_minus_random": [],
                          "base_auc": roc_auc(y, base),
                          "base_accept_gap": float((base[y] > 0).mean() - (base[~y] > 0).mean())
                          if y.any() and not y.all() else None}
    for k, m in enumerate(norms):
        st["own"].append(block(own[:, k], f"own/{k}"))
        seeds = [block(rand[:, k, s], f"rand/{k}/{s}") for s in range(rand.shape[2])]
        st["random_seeds"].append(seeds)
        rflip = (np.sign(rand[:, k]) != np.sign(base)[:, None]).mean(1)
        racc = (rand[:, k] > 0).mean(1)
        st["random"].append({
            "flip_share": mean_stat(rflip, groups, rng(f"rm/{k}/flip"), n_boot),
            "delta_logit_diff": mean_stat(rand[:, k].mean(1) - base, groups,
                                          rng(f"rm/{k}/ld"), n_boot),
            "delta_auc_seeds": [s["delta_auc"]["difference"] for s in seeds],
            "delta_accept_gap": accept_gap_change(y, racc, base > 0, groups,
                                                  rng(f"rm/{k}/gap"), n_boot)})
        oflip = (np.sign(own[:, k]) != np.sign(base)).astype(float)
        st["own_minus_random"].append({
            "norm": m,
            "flip_share": mean_stat(oflip - rflip, groups, rng(f"omr/{k}/flip"), n_boot),
            "delta_logit_diff": mean_stat(own[:, k] - rand[:, k].mean(1), groups,
                                          rng(f"omr/{k}/ld"), n_boot),
            "auc_seeds": [_auc(cluster_bootstrap_auc_difference(
                y, own[:, k], rand[:, k, s], groups, rng(f"omr/{k}/auc/{s}"), n_boot))
                for s in range(rand.shape[2])],
            "delta_accept_gap": accept_gap_change(y, own[:, k] > 0, racc, groups,
                                                  rng(f"omr/{k}/gap"), n_boot)})
    out["steer"] = st
    return out


def run_directions(run_dir: RunDir, handle: ModelHandle, cfg: CalibrationConfig,
                   records: Sequence[Mapping[str, Any]], groups: Sequence[str],
                   facts: Mapping[str, Any], *, self_prompt: Callable[[Mapping[str, Any]], Any],
                   eval_prompt: Callable[[Mapping[str, Any]], Any],
                   log: Callable[[str], None] = print) -> dict[str, Any]:
    """Steps 1-3 of the module algorithm on the calibration stage's records.

    Args:
        run_dir: the run directory.
        handle: the model (the run's).
        cfg: the stage's config (``direction_*`` settings, ``folds``, ``inner_folds``,
            ``seed``, ``C``, ``n_boot``).
        records: the stage's records (non-empty generations).
        groups: their passage ids.
        facts: the stage's result-relevant runtime facts.
        self_prompt: record -> the self-check prompt (the generator's conversation).
        eval_prompt: record -> the fresh judge's eval prompt.
        log: where messages go.

    Returns:
        :func:`summarise_directions`'s summary plus ``{"pool", "n", "n_passages"}``.

    Raises:
        ProbeError: too few passages of a class for ``folds`` (before the steering runs).
    """
    from interp.methods.directions import cross_decode, direction_cosines

    y = np.array([bool(r["oracle_label"]) for r in records])
    G, J = _states(run_dir, handle, cfg, records, facts, self_prompt, eval_prompt, log)
    layers = list(range(handle.n_layers))
    cross = cross_decode(G, J, y, groups, layers, folds=cfg.folds, seed=cfg.seed, C=cfg.C)
    cross["layers"] = layers
    cos = direction_cosines(G, J, y, layers, C=cfg.C, n_perm=cfg.direction_perms,
                            seed=cfg.seed)
    steer, fold_facts = _steer(run_dir, handle, cfg, records, G, J, y, groups,
                               cross["folds"], facts, eval_prompt)
    ids = ["/".join(qa_key(r)) for r in records]
    if len(steer) != len(ids):
        raise RuntimeError("a record fell in no test fold")     # make_folds covers every one
    order = {("/".join((p["dataset"], p["id"]))): p for p in steer}
    steer = [order[k] for k in ids]
    s = summarise_directions(y, groups, cos, cross, steer, fold_facts,
                             d_model=G.shape[2], n_boot=cfg.n_boot, seed=cfg.seed)
    return {"pool": cfg.direction_pool, "n": len(records), "n_passages": len(set(groups)),
            "point": "resid_post", **s}


def _ci(x: Mapping[str, Any], key: str, p: str = "+.2f") -> str:
    v = x.get(key)
    if v is None:
        return "-"
    ci = x.get("ci")
    return f"{v:{p}}" + (f" [{ci[0]:{p}}, {ci[1]:{p}}]" if ci else "")


def _perm_words(row: Mapping[str, Any]) -> str:
    """A cosine row's label-permutation level in words (its 95th pct, else the largest)."""
    if row.get("perm_q95") is not None:
        return f"label-permutation 95%: {row['perm_q95']:.3f}"
    if row.get("perm_max") is not None:
        return f"label permutations' largest of {row['perm_n']}: {row['perm_max']:.3f}"
    return "no label permutation"


def format_directions(d: Mapping[str, Any]) -> str:
    """The directions part in a few lines: best cosine, cross-decoding, the causal sweep."""
    lines = [f"directions ({d['pool']} over the answer tokens; resid_post): {d['n']} records, "
             f"{d['n_passages']} passages; random band +/-{d['random_band']:.3f}"]
    for m, rows in d["cosine"].items():
        top = max(rows, key=lambda r: abs(r["cos"]))
        lines.append(f"  {m}: largest |cos| {top['cos']:+.3f} at layer {top['layer']} "
                     f"({_perm_words(top)})")
        cd = d["cross_decoding"][m]
        best = max(range(len(cd["gen_on_judge"])),
                   key=lambda i: cd["gen_on_judge"][i]["auc"] or 0)
        lines.append(f"  {m}: gen direction on judge states, best AUC "
                     f"{_ci(cd['gen_on_judge'][best], 'auc', '.2f')} at layer "
                     f"{cd['gen_on_judge'][best]['layer']} (gen on gen there "
                     f"{_ci(cd['gen_on_gen'][best], 'auc', '.2f')})")
    st = d.get("steer")
    if st:
        lines.append(f"  steering layers by fold {[f['layer'] for f in st['folds']]}; base AUC "
                     f"{st['base_auc']:.2f}")
        for k, m in enumerate(st["norms"]):
            o, r = st["own"][k], st["random"][k]
            lines.append(f"  x{m:g} median norm: flips own {_ci(o['flip_share'], 'mean', '.2f')}"
                         f" random {_ci(r['flip_share'], 'mean', '.2f')}; dAUC own "
                         f"{_ci(o['delta_auc'], 'difference')}; d(accept right - wrong) own "
                         f"{_ci(o['delta_accept_gap'], 'difference')} random "
                         f"{_ci(r['delta_accept_gap'], 'difference')}")
    return "\n".join(lines)
