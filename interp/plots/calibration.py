"""The calibration figures, drawn from ``DIR/calibration/summary.json`` (never live models)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from interp.plots.common import COLORS, footnote, plt, save

__all__ = ["plot_calibration", "plot_directions"]

_TITLES = {"judge": "fresh judge: p_correct", "p_true": "self-check: P(True)",
           "answer_prob": "generator: exp(mean token log-prob)",
           "probe_eval": "probe, eval prompt (verdict position)",
           "probe_gen": "probe, generation prompt (before answering)"}


def _ci(x: Mapping[str, Any] | None, key: str) -> str:
    if not x or x.get(key) is None:
        return "-"
    ci = x.get("ci") if key == "value" else x.get(f"{key}_ci")
    return f"{x[key]:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def _reliability(summary: Mapping[str, Any], signal: str, out_dir: Path) -> Path:
    """One signal's reliability diagram: equal-mass bins (left), equal-width (right)."""
    g = summary["all"]
    card = g["cards"][signal]
    nb = summary["binning"]["n_bins"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), sharey=True)
    for ax, binning, name in zip(axes, ("mass", "width"), ("equal-mass", "equal-width")):
        rows = card["reliability"][binning]
        conf = np.array([r["confidence"] for r in rows])
        acc = np.array([r["accuracy"] for r in rows])
        lo = np.array([r["accuracy_ci"][0] for r in rows])
        hi = np.array([r["accuracy_ci"][1] for r in rows])
        ax.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle="--",
                label="perfect calibration")
        ax.errorbar(conf, acc, yerr=[acc - lo, hi - acc], fmt="o-", color=COLORS["eval"],
                    capsize=2, markersize=4, label="bins (share right, Wilson 95%)")
        for c, a, r in zip(conf, acc, rows):
            ax.annotate(str(r["n"]), (c, a), textcoords="offset points", xytext=(4, -9),
                        fontsize=6.5, color="#555555")
        ax.axhline(card["accuracy"], color=COLORS["gen"], linewidth=0.7, linestyle=":",
                   label=f"share right overall ({card['accuracy']:.2f})")
        ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("mean predicted probability in the bin")
        ax.set_title(f"{nb} {name} bins: ECE {_ci(card['ece'][binning], 'value')}", fontsize=9)
    axes[0].set_ylabel("share of answers right (y*)")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{summary.get('model')}: {_TITLES.get(signal, signal)}\nAUROC "
                 f"{_ci(card, 'auc')}, Brier {_ci(card, 'brier')}; n = {card['n']}, "
                 f"{card['n_passages']} passages", fontsize=10)
    fig.tight_layout()
    notes = ["numbers beside the points: records in the bin; CIs of AUROC, ECE and Brier: "
             "bootstrap over passages"]
    if g.get("note"):
        notes.append(g["note"])
    footnote(fig, notes)
    return save(fig, out_dir, f"calibration_reliability_{signal}")


def _band(ax: Any, x: Any, stats: list[Mapping[str, Any]], key: str, color: str,
          label: str) -> None:
    y = np.array([s.get(key) if s.get(key) is not None else np.nan for s in stats], float)
    lo = np.array([(s.get("ci") or [np.nan, np.nan])[0] for s in stats], float)
    hi = np.array([(s.get("ci") or [np.nan, np.nan])[1] for s in stats], float)
    ax.plot(x, y, "o-", markersize=3, color=color, label=label)
    ax.fill_between(x, lo, hi, color=color, alpha=0.18, linewidth=0)


def _cache(summary: Mapping[str, Any], out_dir: Path) -> Path | None:
    """The cache test: patching by layer, blocking against its control, the probe's angle.

    Patching: the change of AUC and of the logit difference by layer.
    """
    g = summary["all"]
    pt, bl, pr = g.get("patch"), (g.get("block") or {}).get("logit_diff"), summary.get("probe")
    if not (pt or bl or pr):
        return None
    panels = [k for k, v in (("patch", pt), ("block", bl), ("probe", pr)) if v]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.3 * len(panels), 4.2), squeeze=False)
    ax = dict(zip(panels, axes[0]))
    a1, a2, a3 = ax.get("patch"), ax.get("block"), ax.get("probe")
    if pt:
        x = np.array(pt["layers"])
        _band(a1, x, pt["delta_auc"], "difference", COLORS["eval"],
              f"AUC(patched) - AUC(fresh judge) (fresh judge's AUC "
              f"{pt['base_auc']:.2f})" if pt["base_auc"] is not None else "AUC change")
        if pt.get("control_delta_auc"):
            _band(a1, x, pt["control_delta_auc"], "difference", "#999999",
                  "control: another record's state after its answer")
        a1b = a1.twinx()
        _band(a1b, x, pt["delta_logit_diff"], "mean", COLORS["gen"],
              "mean change of the logit difference (nats, right axis)")
        a1b.set_ylabel("change of the logit difference (nats)", color=COLORS["gen"])
        a1.axhline(0, color="grey", linewidth=0.6)
        a1.set_xlabel("layer L (blocks.L.hook_resid_pre patched at the verdict position)")
        a1.set_ylabel("change of AUC", color=COLORS["eval"])
        a1.set_title("the generator's state after its answer,\npatched into the fresh judge",
                     fontsize=9)
        h1, l1 = a1.get_legend_handles_labels()
        h2, l2 = a1b.get_legend_handles_labels()
        a1.legend(h1 + h2, l1 + l2, fontsize=7, loc="best")
    if bl:
        names = [("cache_minus_none", "after the answer"), ("control_minus_none", "control")]
        vals = [bl[k]["mean"] for k, _ in names]
        err = [[v - (bl[k]["ci"] or [v, v])[0] for (k, _), v in zip(names, vals)],
               [(bl[k]["ci"] or [v, v])[1] - v for (k, _), v in zip(names, vals)]]
        a2.bar([0, 1], vals, yerr=err, capsize=4, color=[COLORS["eval"], "#999999"])
        a2.set_xticks([0, 1])
        a2.set_xticklabels([f"block: {n}\nAUC change {_ci(bl['auc'][k2], 'difference')}"
                            for (_, n), k2 in zip(names, ("cache", "control"))], fontsize=7.5)
        a2.axhline(0, color="grey", linewidth=0.6)
        a2.set_ylabel("mean change of the logit difference (nats)")
        a2.set_title("self-check: the verdict position's attention\nto one position blocked",
                     fontsize=9)
    if pr:
        band = summary["random_band"]
        for task, color in (("eval", COLORS["eval"]), ("gen", COLORS["gen"])):
            a = pr[task]["angles"]
            a3.plot([r["layer"] for r in a], [r["cos_read"] for r in a], "o-", markersize=3,
                    color=color, label=f"probe on the {task} prompt's last position")
        a3.axhspan(-band, band, color="grey", alpha=0.2,
                   label=f"95% of random directions (+/-{band:.3f})")
        tok = summary.get("direction_tokens") or ["Correct[0]", "Incorrect[0]"]
        a3.set_xlabel("layer of the probe (resid_post)")
        a3.set_ylabel("cosine")
        a3.set_title(f"probe direction vs gamma * (W_U[{tok[0]}] - W_U[{tok[1]}])", fontsize=9)
        a3.legend(fontsize=7, loc="best", framealpha=0.6)
    fig.suptitle(f"{summary.get('model')}: does the judge read what the generator cached? "
                 f"n = {g['n']}, {g['n_passages']} passages", fontsize=10)
    fig.tight_layout()
    notes = ["bands and bars: 95% bootstrap over passages; AUC changes are paired (same "
             "resamples)"]
    sc = (g.get("self_vs_judge") or {}).get("self_check") or {}
    if sc.get("no_verdict") == 0 and sc.get("accept_right") == sc.get("accept_wrong") in (0.0,
                                                                                         1.0):
        notes.append("the self-check's greedy verdict is the same on every record: its "
                     "balanced accuracy is 0.5 by construction")
    if g.get("note"):
        notes.append(g["note"])
    footnote(fig, notes)
    return save(fig, out_dir, "calibration_cache")


def plot_calibration(summary: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """``calibration_reliability_{signal}.png`` for every signal and ``calibration_cache.png``.

    Reliability diagrams: per bin the mean predicted probability against the share of
    answers right (Wilson 95% bars), equal-mass and equal-width bins side by side, with the
    signal's AUROC, ECE and Brier score and their passage-cluster CIs. The cache figure:
    the change of the fresh judge's AUC and logit difference when the generator's state after
    its answer is patched in, by layer; the self-check's change when its verdict position may
    not attend to that position, against the control; the cosine of the probe's direction with
    the verdict's readout direction by layer.

    Returns:
        The PNG paths written.
    """
    out_dir = Path(out_dir)
    paths = [plot_directions(summary, out_dir)] if summary.get("directions") else []
    if not summary.get("all"):
        return paths
    paths += [_reliability(summary, s, out_dir) for s in summary["all"]["cards"]]
    if (p := _cache(summary, out_dir)) is not None:
        paths.append(p)
    return paths


_KINDS = {"gen_on_gen": ("generator direction, generator states", COLORS["gen"], "-"),
          "gen_on_judge": ("generator direction, judge states", COLORS["gen"], "--"),
          "judge_on_judge": ("judge direction, judge states", COLORS["eval"], "-"),
          "judge_on_gen": ("judge direction, generator states", COLORS["eval"], "--")}


def plot_directions(summary: Mapping[str, Any], out_dir: str | Path) -> Path:
    """``calibration_directions.png``: one correctness direction or two.

    Top: the cosine of the generator's and the judge's directions per layer (mass-mean and
    logistic) against the random band and the label-permutation null; the cross-decoding
    AUCs per layer, one panel per estimator. Bottom: the causal sweep, the generator's
    direction added at the judge's verdict position against random directions of equal norm:
    verdict flips, the change of AUC and of (acceptance of right - acceptance of wrong).

    Returns:
        The PNG path.
    """
    d = summary["directions"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.4))
    a = axes[0, 0]
    band = d["random_band"]
    for m, color in (("mass_mean", COLORS["gen"]), ("logistic", COLORS["eval"])):
        rows = d["cosine"][m]
        x = [r["layer"] for r in rows]
        a.plot(x, [r["cos"] for r in rows], "o-", markersize=3, color=color, label=m)
        if rows and rows[0].get("perm_q95") is not None:
            a.plot(x, [r["perm_q95"] for r in rows], ":", color=color,
                   label=f"{m}: 95% of |cos| under shuffled labels")
        elif rows and rows[0].get("perm_max") is not None:
            a.plot(x, [r["perm_max"] for r in rows], ":", color=color,
                   label=f"{m}: largest |cos| of {rows[0]['perm_n']} shuffled labels "
                         f"(too few for a 95th pct)")
    a.axhspan(-band, band, color="grey", alpha=0.2,
              label=f"95% of random directions (+/-{band:.3f})")
    a.axhline(0, color="grey", linewidth=0.6)
    a.set_xlabel("layer (resid_post)")
    a.set_ylabel("cosine(generator direction, judge direction)")
    a.set_title("the two directions' cosine (all records)", fontsize=9)
    a.legend(fontsize=6.5, loc="best", framealpha=0.6)
    for a, m in zip(axes[0, 1:], ("mass_mean", "logistic")):
        for kind, (label, color, ls) in _KINDS.items():
            rows = d["cross_decoding"][m][kind]
            x = np.array([r["layer"] for r in rows])
            y = np.array([np.nan if r["auc"] is None else r["auc"] for r in rows])
            lo = np.array([(r["ci"] or [np.nan, np.nan])[0] for r in rows], float)
            hi = np.array([(r["ci"] or [np.nan, np.nan])[1] for r in rows], float)
            a.plot(x, y, ls, color=color, marker="o" if ls == "-" else "s", markersize=2.5,
                   label=label)
            a.fill_between(x, lo, hi, color=color, alpha=0.10 if ls == "-" else 0.06,
                           linewidth=0)
        a.axhline(0.5, color="grey", linewidth=0.6)
        a.set_ylim(0.2, 0.9)
        a.set_xlabel("layer (resid_post)")
        a.set_ylabel("out-of-fold AUC against y*")
        a.set_title(f"cross-decoding, {m} directions (folds by passage)", fontsize=9)
        a.legend(fontsize=6.5, loc="lower right", framealpha=0.6)
    st = d.get("steer")
    if st:
        x = np.array(st["norms"], float)
        panels = (("flip_share", "mean", "share of verdicts flipped"),
                  ("delta_auc", "difference", "change of the verdict logit difference's AUC"),
                  ("delta_accept_gap", "difference",
                   "change of (accept right - accept wrong)"))
        for a, (key, val, label) in zip(axes[1], panels):
            _band(a, x, [o[key] for o in st["own"]], val, COLORS["gen"],
                  "generator's direction (mass-mean)")
            if key == "delta_auc":
                for s in range(len(st["random_seeds"][0])):
                    a.plot(x, [seeds[s]["delta_auc"]["difference"]
                               for seeds in st["random_seeds"]], "x:", color="#777777",
                           markersize=4, label="random directions (one line per seed)"
                           if s == 0 else None)
            else:
                _band(a, x, [r[key] for r in st["random"]], val, "#777777",
                      f"random directions (mean of {len(st['random_seeds'][0])} seeds)")
            a.axhline(0, color="grey", linewidth=0.6)
            a.set_xscale("log", base=2)
            a.set_xticks(x)
            a.set_xticklabels([f"{v:g}" for v in x])
            a.set_xlabel("added norm (x median |resid_post| at the layer, training records)")
            a.set_ylabel(label)
            a.legend(fontsize=6.5, loc="best", framealpha=0.6)
        layers = sorted({f["layer"] for f in st["folds"]})
        axes[1, 1].set_title(f"steering the judge's verdict position at layer "
                             f"{', '.join(map(str, layers))} (chosen per fold on training "
                             f"passages)\nheld-out records; base AUC {st['base_auc']:.2f}",
                             fontsize=9)
    else:
        for a in axes[1]:
            a.axis("off")
    fig.suptitle(f"{summary.get('model')}: one correctness direction or two? n = {d['n']}, "
                 f"{d['n_passages']} passages; generator states: {d['pool']} over its answer "
                 f"tokens", fontsize=10)
    fig.tight_layout()
    footnote(fig, ["bands: 95% bootstrap over passages; AUC changes paired (same resamples); "
                   "every steered record's direction, layer and norm come from other passages"])
    return save(fig, Path(out_dir), "calibration_directions")
