"""One decision rule for every row of the findings report, applied uniformly and both ways.

Each row of :data:`experiments.findings.claims.CLAIMS` is first read by its extractor (its
estimate, 95% passage-cluster CI and a decision against the claim's threshold); then
:func:`apply_rules` applies the same five steps to every row, in this order, as its
:class:`Rule` in :data:`RULES` declares them:

(a) **threshold**: the CI against the claim's threshold (the extractor's :func:`decide`; the
    rule names the threshold in words);
(c) **coverage and degenerate cases**: a row whose CI has zero width (every passage resample
    gave one value: a judge that accepts or rejects all, no verdict that moved) decides
    nothing and reads ``not measurable``; so does a row whose judge's coverage is under its
    floor (:func:`coverage`: the generated verdicts' share with a verdict, the forced choice's
    probability mass, both under :data:`MIN_COVERAGE`; a pairwise judge that answers one
    letter in :data:`interp.stages.pairwise.ONE_LETTER_SHARE` of pairs or more);
(b) **discriminability**: a claim about judging is testable only when the judge tells right
    from wrong answers: some judge AUC of the row (:func:`judge_aucs`, the AUC of
    ``logit_diff`` against y*) has a CI that excludes 0.5; else ``not testable: judge at
    chance`` (for such a judge EA = a GA + (1 - a)(1 - GA): arithmetic on GA and an
    acceptance rate a, not judging);
(e) **selection**: a row whose unit was chosen on the same pairs it is tested on reads
    ``exploratory (selected and tested on the same pairs)`` instead of supported or
    contradicted;
(d) **controls, both ways** (:func:`controlled`): a control that contradicts a claim makes it
    ``reversed under control``; a contradicted claim whose control supports it is reversed
    too; a decided claim whose control is undecided, not measurable or not testable becomes
    ``undecided``.

A row whose summaries publish no judge AUC (older summaries) keeps its reading in step (b).

Every rule is declared, never defaulted: ``tests/unit/experiments/test_findings.py``
enumerates every row and fails on one whose rule leaves any of (a)-(e) unsaid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from experiments.findings.claims import (
    MIN_COVERAGE,
    STEER_FACTORS,
    Cell,
    _get,
    _read,
    steer_claims,
)

__all__ = ["DECIDED", "EXPLORATORY", "NOT_TESTABLE", "PRIMARY", "REVERSED", "RULES", "Rule",
           "apply_rules", "ci_p_value", "controlled", "coverage", "holm", "judge_aucs"]

NOT_TESTABLE = "not testable: judge at chance"
REVERSED = "reversed under control"
EXPLORATORY = "exploratory (selected and tested on the same pairs)"
DECIDED = ("supported", "contradicted")


@dataclass(frozen=True)
class Rule:
    """How the uniform rule reads one row; every field must be said (none is defaulted).

    Attributes:
        threshold: (a) what the CI is compared with, in words ("0", "0.5", "3-5x", ...).
        judge: (b) the judge AUCs that must show discrimination: ``"SUB:DATASET"`` entries
            (a run's ``asymmetry_metrics.json`` under ``SUB``, one dataset or ``overall``),
            ``"transfer:ADAPTER"``, ``"cross"`` (both judges of each pair); at least one of
            them must have a CI that excludes 0.5. Empty: not a claim about judging, and
            ``not_judging`` says why.
        not_judging: (b) why the precondition does not apply (empty when ``judge`` is set).
        coverage: (c) ``"verdict:SUB:DATASET"`` (share of replies with a verdict), ``"forced:
            SUB:DATASET"`` (P(Correct) + P(Incorrect)), ``"steer:SUB:ALPHA"`` (the steered
            judge's forced-choice coverage), ``"pairwise"`` (one-letter share), or
            ``"n/a: why"``.
        controls: (d) the claims rows that control this one (decided both ways), or empty
            with ``no_control`` saying why.
        no_control: (d) why the row has no control row (empty when ``controls`` is set).
        selection: (e) ``"none"`` (no unit is selected), ``"held out"`` (chosen on other
            passages) or ``"same"`` (chosen on the pairs it is tested on: exploratory).
    """

    threshold: str
    judge: tuple[str, ...]
    not_judging: str
    coverage: str
    controls: tuple[str, ...]
    no_control: str
    selection: str

    def problems(self) -> list[str]:
        """Which of (a)-(e) this rule leaves unsaid (empty: none)."""
        out = []
        if not self.threshold:
            out.append("(a) no threshold")
        if bool(self.judge) == bool(self.not_judging):
            out.append("(b) give judge AUCs or why the row is not about judging, not both")
        if not self.coverage or not (self.coverage.startswith(("verdict:", "forced:", "steer:",
                                                                "n/a: "))
                                     or self.coverage == "pairwise"):
            out.append("(c) no coverage check")
        if bool(self.controls) == bool(self.no_control):
            out.append("(d) give control rows or why there is none, not both")
        if self.selection not in ("none", "held out", "same"):
            out.append("(e) selection must be none, held out or same")
        return out


def _dataset_aucs(path: Path, datasets: Sequence[str] | None, label: str
                  ) -> list[tuple[str, float, list[float]]]:
    """Per-dataset AUCs of ``logit_diff`` of one published Study 1 summary (measured only)."""
    per = _get(_read(path), "per_dataset") or {}
    return [(f"{label} {d}", g["auc_logit_diff"], g["auc_logit_diff_ci"])
            for d, g in sorted(per.items()) if (datasets is None or d in datasets)
            and g.get("auc_logit_diff") is not None and g.get("auc_logit_diff_ci")]


def judge_aucs(fig_dir: Path, model: str, spec: Sequence[str]) -> list[tuple[str, float,
                                                                             list[float]]]:
    """The judge AUCs a row's precondition reads: ``[(where, auc, ci)]`` (measured ones only).

    Always within one dataset: pooled over datasets an AUC also rewards a score that knows
    each dataset's base rate. ``SUB:overall`` gives every dataset's AUC of that run;
    ``cross`` every dataset's AUC of the model's own run, of its run judging the other
    model's answers and of the other model judging its answers; ``transfer:ADAPTER`` the
    adapter's judge on the base model's answers.
    """
    out = []
    for s in spec:
        if s == "cross":
            for p in sorted({*fig_dir.glob(f"{model}__*asymmetry_metrics.json"),
                             *fig_dir.glob(f"*__judges__{model}__asymmetry_metrics.json")}):
                out += _dataset_aucs(p, None, p.name.removesuffix("__asymmetry_metrics.json")
                                     .replace("__judges__", " judging "))
            continue
        if s.startswith("transfer:"):
            adapter = s.split(":", 1)[1]
            t = _read(fig_dir / f"{model}__transfer_table.json")
            for ds, g in (_get(t, "judge_base_answers", adapter) or {}).items():
                if g.get("auc_logit_diff") is not None and g.get("auc_logit_diff_ci"):
                    out.append((f"{adapter} judge, {ds}", g["auc_logit_diff"],
                                g["auc_logit_diff_ci"]))
            continue
        sub, ds = s.split(":")
        out += _dataset_aucs(fig_dir / f"{sub}{model}__asymmetry_metrics.json",
                             None if ds == "overall" else [ds], sub.strip("/") or "default")
    return out


def coverage(fig_dir: Path, model: str, spec: str) -> tuple[bool, str] | None:
    """Whether a row's judge covers enough of its answers: ``(too_low, why)`` or None.

    None when the spec says ``n/a`` or the summary is missing.
    """
    if spec.startswith("n/a"):
        return None
    if spec == "pairwise":
        from interp.stages.pairwise import ONE_LETTER_SHARE

        one = _get(_read(fig_dir / f"views/{model}__pairwise_summary.json"), "one_letter")
        if not one or one.get("share") is None:
            return None
        return (one["share"] >= ONE_LETTER_SHARE,
                f"the pairwise judge answers {one['letter']} in {one['share']:.0%} of pairs "
                f"(one-letter from {ONE_LETTER_SHARE:.0%})")
    kind, sub, key = spec.split(":")
    if kind == "steer":
        s = _read(fig_dir / f"{sub}{model}__steering_summary.json")
        c = _get(s, "eval", key, "overall", "verdict_coverage", "mean")
        if c is None:
            return None
        return (c < MIN_COVERAGE, f"the steered judge's two verdict replies hold {c:.0%} of "
                                  f"its probability at x{float(key):g} (floor {MIN_COVERAGE:.0%})")
    m = _read(fig_dir / f"{sub}{model}__asymmetry_metrics.json")
    g = _get(m, "overall") if key == "overall" else _get(m, "per_dataset", key)
    if not g or not g.get("n"):
        return None
    if kind == "verdict":
        share = 1 - (_get(g, "verdicts", "none") or 0) / g["n"]
        return (share < MIN_COVERAGE, f"a verdict on {share:.0%} of replies (floor "
                                      f"{MIN_COVERAGE:.0%})")
    c = g.get("mean_verdict_coverage")
    if c is None:
        return None
    return (c < MIN_COVERAGE, f"the two verdict replies hold {c:.0%} of the judge's "
                              f"probability (floor {MIN_COVERAGE:.0%})")


def _zero_width(ci: Sequence[float] | None) -> bool:
    return bool(ci) and None not in ci and ci[0] == ci[1]


def _one_cell(cell: Cell, rule: Rule, fig_dir: Path, model: str) -> Cell:
    """Steps (c), (b) and (e) of the module docstring on one cell."""
    if cell.value is None or cell.decision in ("control", "not measured"):
        return cell
    d, v = cell.decision, cell.verdict
    if d in DECIDED and _zero_width(cell.ci):
        d = "not measurable"
        if "zero width" not in v:
            v += "; a CI of zero width (one value on every resample) decides nothing"
    cov = coverage(fig_dir, model, rule.coverage)
    if cov is not None and cov[0] and d != "not measurable":
        d, v = "not measurable", f"{v}; {cov[1]}"
    if rule.judge and d != "not measurable":
        aucs = judge_aucs(fig_dir, model, rule.judge)
        if aucs and not any(ci[0] > 0.5 or ci[1] < 0.5 for _, _, ci in aucs):
            d = NOT_TESTABLE
            v += "; judge AUC " + ", ".join(f"{a:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] ({w})"
                                            for w, a, ci in aucs)
    if rule.selection == "same" and d in DECIDED:
        v += f"; read {d} on the pairs its unit was chosen on"
        d = EXPLORATORY
    return replace(cell, decision=d, verdict=v)


def controlled(rows: list[dict[str, Any]], controls: Mapping[str, Sequence[str]]
               ) -> list[dict[str, Any]]:
    """Step (d): every control decides its claim both ways.

    Args:
        rows: ``[{"claim", "cells": {model: Cell}}]`` after steps (a)-(c), (e).
        controls: claim -> the claims of its control rows.

    A claim (supported, undecided or not testable) whose control reads contradicted reads
    ``reversed under control``, as does a contradicted claim whose control reads supported; a
    supported or contradicted claim whose control reads undecided, not measurable or not
    testable reads ``undecided``. Each change names the control and its reading.
    """
    by = {r["claim"]: r for r in rows}
    for r in rows:
        for name in controls.get(r["claim"], ()):
            ctrl = by.get(name)
            if ctrl is None:
                continue
            what = name.removeprefix("... ").removesuffix(" (control)")
            for m, h in r["cells"].items():
                c = ctrl["cells"].get(m)
                if c is None or c.value is None or h.value is None or c.decision == "control":
                    continue
                new = None
                if c.decision == "contradicted" and h.decision in (
                        "supported", "undecided", NOT_TESTABLE):
                    new = REVERSED
                elif c.decision == "supported" and h.decision == "contradicted":
                    new = REVERSED
                elif h.decision in DECIDED and c.decision in (
                        "undecided", "not measurable", NOT_TESTABLE):
                    new = "undecided"
                if new:
                    r["cells"][m] = replace(h, decision=new, verdict=(
                        f"{h.verdict}; its control ({what}) reads {c.decision}"))
    return rows


PRIMARY: dict[str, tuple[str, tuple[float, ...]]] = {
    "GA > EA on SQuAD 2.0 (3.1)": ("H1: the model generates better than it judges on SQuAD "
                                   "2.0, EA - GA < 0", (0.0,)),
    "GA > EA on DROP (3.1)": ("H2: the same on DROP", (0.0,)),
    "GA > EA on HotpotQA (3.1)": ("H3: the same on HotpotQA", (0.0,)),
    "the judge reads the context 3-5x less (3.2)": (
        "H4: the generator's last token puts 3-5x the judge's attention on the context",
        (3.0, 5.0)),
    "LoRA-Gen over-accepts (3.3)": ("H5: LoRA-Gen's judge accepts more of the base's wrong "
                                    "answers than the base judge", (0.0,)),
    "LoRA-Eval degrades generation (3.3)": ("H6: LoRA-Eval lowers GA", (0.0,)),
}
"""The primary rows: the paper's own claims, with their hypotheses and the bounds a CI-based
test compares with (the nearest to the estimate); corrected together for multiplicity
(:func:`holm`). Every other row is exploratory: read at 95% without correction, a lead for
another study, not a finding."""


def ci_p_value(value: float, ci: Sequence[float], null: float) -> float | None:
    """A two-sided p-value of ``value`` against ``null`` from its 95% interval.

    The normal approximation: se = (hi - lo) / (2 x 1.96), z = (value - null) / se. None for
    an interval of zero width (no evidence of precision).
    """
    from math import erfc, sqrt

    lo, hi = ci
    if hi <= lo:
        return None
    z = (value - null) / ((hi - lo) / (2 * 1.959964))
    return erfc(abs(z) / sqrt(2))


def holm(p: Mapping[str, float], alpha: float = 0.05) -> dict[str, float]:
    """Holm's step-down adjusted p-values (Holm 1979), each capped at 1 and kept monotone.

    A hypothesis is rejected at family-wise level ``alpha`` when its adjusted p is under it.
    """
    order = sorted(p, key=lambda k: p[k])
    out, run = {}, 0.0
    for i, k in enumerate(order):
        run = max(run, min(1.0, (len(order) - i) * p[k]))
        out[k] = run
    return out


def _holm_rows(rows: list[dict[str, Any]], alpha: float = 0.05) -> None:
    """The primary rows of each model, Holm-corrected.

    The family is every primary row with an interval (whatever it decides); a supported or
    contradicted row whose adjusted p is not under ``alpha`` reads undecided. Each primary
    row gets ``row["holm"] = {model: adjusted p}``, which the tables print.
    """
    by = {r["claim"]: r for r in rows if r["claim"] in PRIMARY}
    models = {m for r in by.values() for m in r["cells"]}
    for m in models:
        ps = {}
        for name, r in by.items():
            c = r["cells"][m]
            if c.value is not None and c.ci and None not in c.ci:   # every tested primary row
                null = min(PRIMARY[name][1], key=lambda b: abs(b - c.value))
                if (p := ci_p_value(c.value, c.ci, null)) is not None:
                    ps[name] = p
        for name, q in holm(ps, alpha).items():
            c = by[name]["cells"][m]
            by[name].setdefault("holm", {})[m] = q
            if c.decision in DECIDED and q >= alpha:
                by[name]["cells"][m] = replace(c, decision="undecided", verdict=(
                    f"{c.verdict}; {c.decision} at 95%, not after Holm's correction over "
                    f"{len(ps)} primary rows"))


def apply_rules(rows: list[dict[str, Any]], fig_dir: str | Path) -> list[dict[str, Any]]:
    """Steps (a)-(e) on every row (module docstring), then Holm over the primary rows.

    Rows without a rule are refused.

    Raises:
        KeyError: a row with no :data:`RULES` entry.
    """
    d = Path(fig_dir)
    for r in rows:
        rule = RULES[r["claim"]]
        r["cells"] = {m: _one_cell(c, rule, d, m) for m, c in r["cells"].items()}
        r["primary"] = PRIMARY.get(r["claim"], ("", ()))[0]
    rows = controlled(rows, {c: RULES[c].controls for c in RULES})
    _holm_rows(rows)
    return rows


def _r(threshold: str, judge: tuple[str, ...] | str = (), cov: str = "n/a: no judge verdicts",
       controls: tuple[str, ...] | str = (), selection: str = "none") -> Rule:
    """A :class:`Rule`: a string ``judge`` / ``controls`` is the reason there is none."""
    return Rule(threshold, judge if isinstance(judge, tuple) else (),
                judge if isinstance(judge, str) else "", cov,
                controls if isinstance(controls, tuple) else (),
                controls if isinstance(controls, str) else "", selection)


_MT = "... SQuAD 2.0 under the matched template (control)"
_NOT_J_ATT = "about attention, not the verdict"
_NOT_J_PATCH = "about which unit carries a logit difference, not whether the judge is right"
_NOT_J_PROBE = "compares the probe's AUC with the judge's: the judge's chance level is part of " \
               "the estimate"
_IS_CTRL = "it is a control row"
_MOVES = "the logit difference moves whether or not the judge is right"
_NULL_IS_CHANCE = "an AUROC's null is chance, 0.5: no other baseline"
_RANKS = ("a change of the judge's ranking is itself the test of discrimination: a judge at "
          "chance can gain it")


def _steer_rules(a: str, sub: str) -> dict[str, Rule]:
    """The rules of one steering factor's rows (:func:`experiments.findings.claims.steer_claims`).

    The claim (EA_forced up) is controlled by the change of the judge's AUC, by the same
    change minus the non-context control's, and by the context-minus-control logit
    difference on right and on wrong answers: a threshold shift that makes a mostly wrong
    sample "right more often" without better ranking reads undecided or reversed.
    """
    n, cov = steer_claims(a), f"steer:{sub}:{float(a):.1f}"
    cmc = "it is already context minus control"
    return {
        n["ea"]: _r("0", (":overall",), cov, (n["auc"], n["cmc_auc"], n["cmc_right"],
                                              n["cmc_wrong"], n["ctrl"])),
        n["auc"]: _r("0", _RANKS, cov, (n["cmc_auc"],)),
        n["gap"]: _r("0", _RANKS, cov, (n["auc"],)),
        n["wrong"]: _r("0", (":overall",), cov, (n["cmc_wrong"],)),
        n["right"]: _r("0 (no decrease)", (":overall",), cov, (n["cmc_right"],)),
        n["ld"]: _r("0", _MOVES, cov, (n["ctrl_ld"], n["cmc"])),
        n["ctrl"]: _r("0", (":overall",), cov, _IS_CTRL),
        n["ctrl_ld"]: _r("0", _MOVES, cov, _IS_CTRL),
        n["cmc"]: _r("0", _MOVES, cov, cmc),
        n["cmc_auc"]: _r("0", _RANKS, cov, cmc),
        n["cmc_right"]: _r("0", (":overall",), cov, cmc),
        n["cmc_wrong"]: _r("0", (":overall",), cov, cmc),
    }

RULES: dict[str, Rule] = {
    "GA > EA on SQuAD 2.0 (3.1)": _r(
        "0", (":squad_v2",), "verdict::squad_v2",
        (_MT, "... SQuAD 2.0, replies with a verdict only (control)",
         "... SQuAD 2.0, matched template, replies with a verdict only (control)")),
    _MT: _r("0", ("matched/:squad_v2",), "verdict:matched/:squad_v2", _IS_CTRL),
    "... SQuAD 2.0, replies with a verdict only (control)": _r(
        "0", (":squad_v2",), "verdict::squad_v2", _IS_CTRL),
    "... SQuAD 2.0, matched template, replies with a verdict only (control)": _r(
        "0", ("matched/:squad_v2",), "verdict:matched/:squad_v2", _IS_CTRL),
    "GA > EA on DROP (3.1)": _r(
        "0", (":drop",), "verdict::drop",
        ("... DROP under the matched template (control)",
         "... DROP, replies with a verdict only (control)")),
    "... DROP under the matched template (control)": _r(
        "0", ("matched/:drop",), "verdict:matched/:drop", _IS_CTRL),
    "... DROP, replies with a verdict only (control)": _r(
        "0", (":drop",), "verdict::drop", _IS_CTRL),
    "GA > EA on HotpotQA (3.1)": _r(
        "0", (":hotpotqa",), "verdict::hotpotqa",
        "the study ran no matched-template or verdict-only control on HotpotQA"),
    "MuSiQue the exception: EA >= GA (3.1)": _r(
        "0", (":musique",), "verdict::musique",
        "a judge that gives one reply decides it by construction; the row says so"),
    "GA > EA with the forced choice, SQuAD 2.0": _r(
        "0", (":squad_v2",), "forced::squad_v2",
        "the AUC of the same scores is its precondition (b), not a control"),
    "... does the judge tell right from wrong? SQuAD 2.0 (control)": _r(
        "0.5", "it is the discriminability measure itself", "forced::squad_v2", _IS_CTRL),
    "... DROP (control)": _r(
        "0.5", "it is the discriminability measure itself", "forced::drop", _IS_CTRL),
    "the judge reads the context 3-5x less (3.2)": _r(
        "3-5x", _NOT_J_ATT, "n/a: attention of every record, no verdict needed",
        ("... under the matched template (control)",
         "... renormalised to context+question+candidate (control)",
         "... renormalised to context+question, the spans both prompts have (control)",
         "... matched template, renormalised to context+question (control)")),
    **{f"... {ds}": _r("3-5x", _NOT_J_ATT, "n/a: attention of every record, no verdict needed",
                       "a subgroup of the row above, whose controls apply")
       for ds in ("SQuAD 2.0", "DROP", "HotpotQA", "MuSiQue")},
    **{c: _r("3-5x", _NOT_J_ATT, "n/a: attention of every record, no verdict needed", _IS_CTRL)
       for c in ("... under the matched template (control)",
                 "... renormalised to context+question+candidate (control)",
                 "... renormalised to context+question, the spans both prompts have (control)",
                 "... matched template, renormalised to context+question (control)")},
    "the judge barely reads the candidate (3.2)": _r(
        "the context's mass per token", _NOT_J_ATT,
        "n/a: attention of every record, no verdict needed", "mass per token is its own "
        "normalisation"),
    "LoRA-Gen over-accepts (3.3)": _r(
        "0", ("transfer:base", "transfer:lora_gen"),
        "n/a: the extractor reads the adapter judge's verdict share",
        "the paired base judge is the estimate's own baseline"),
    "LoRA-Eval degrades generation (3.3)": _r(
        "0", "about generation accuracy", "n/a: GA needs no judge",
        "the paired base model is the estimate's own baseline"),
    **{k: v for a, sub in STEER_FACTORS for k, v in _steer_rules(a, sub).items()},
    "the generator knows when its answer is right (its answer probability, SQuAD 2.0)": _r(
        "0.5", "about the generator's own answer probability, not a judge",
        "n/a: every record has an answer probability", _NULL_IS_CHANCE),
    "... its residual stream before answering (probe on the generation prompt)": _r(
        "0.5", "about the generator's residual stream, not a judge",
        "n/a: every record has a generation prompt", _NULL_IS_CHANCE),
    "... the fresh judge of the same records reads it": _r(
        "0.5", "it is the judge's AUC itself, the precondition's own measure",
        "verdict:calibration/:squad_v2", _NULL_IS_CHANCE),
    "the self-check in the generator's conversation reads it better than the fresh judge": _r(
        "0", "a paired change of AUC between two judges is itself a test of discrimination",
        "verdict:calibration/:squad_v2", "the fresh judge on the same records is the paired "
        "estimate's own baseline"),
    "the state after the answer carries it into the fresh judge (patched at the best layer)": _r(
        "0", _RANKS, "n/a: the forced choice's logit difference, every record",
        "another record's state is the estimate's own baseline (own - control)",
        selection="same"),
    "the self-check's verdict reads the position after the answer (blocked)": _r(
        "the adjacent position's change", _MOVES,
        "n/a: the self-check's logit difference, every record",
        "the adjacent position's interval is the estimate's own threshold"),
    "adding the generator's correctness direction makes the judge rank better (held out)": _r(
        "0", _RANKS, "n/a: the forced choice's logit difference, every record",
        "random directions of equal norm are in the summary per seed (own_minus_random), "
        "not a row", selection="held out"),
    "lowering the generator's context attention (x0.25) lowers GA": _r(
        "0", "about generation accuracy", "n/a: GA needs no judge",
        "the non-context keys at the same factor are in the summary, not a row"),
    "where the verdict is decided: candidate swap, residual stream": _r(
        "0.5", _NOT_J_PATCH, "n/a: pairs kept by the swap's gap, said in the cell",
        ("... system-prompt control",), selection="same"),
    "... attention heads": _r("0.5", _NOT_J_PATCH, "n/a: pairs kept by the swap's gap",
                              ("... system-prompt control",), selection="same"),
    **{c: _r("0.5", _NOT_J_PATCH, "n/a: pairs kept by the swap's gap",
             ("... system-prompt control",), selection="same")
       for c in ("... candidate swap on every bundled SQuAD 2.0 and DROP record, residual "
                 "stream (a larger sample that contains the study's pairs: not a "
                 "replication)",
                 "... candidate swap on every bundled SQuAD 2.0 and DROP record, attention "
                 "heads (a larger sample that contains the study's pairs: not a replication)",
                 "... candidate swap kept at 0.5 nat, residual stream (the gap filter's "
                 "sensitivity; its pairs contain the 1-nat pairs: not a replication)",
                 "... candidate swap kept at 0.5 nat, attention heads (the gap filter's "
                 "sensitivity; its pairs contain the 1-nat pairs: not a replication)",
                 "... generator's run into the judge's: residual stream",
                 "... generator's run into the judge's: attention heads")},
    **{c: _r("0.5", _NOT_J_PATCH, "n/a: pairs kept by the swap's gap",
             ("... the matched template's system-prompt control",), selection="same")
       for c in ("... candidate swap under the matched template, whose judge separates right "
                 "from wrong (SmolLM2), residual stream",
                 "... candidate swap under the matched template, whose judge separates right "
                 "from wrong (SmolLM2), attention heads")},
    "... the matched template's system-prompt control": _r(
        "0.5", _NOT_J_PATCH, "n/a: pairs kept by the swap's gap", _IS_CTRL, selection="same"),
    "... the top head, chosen on half the passages, restores it on the other half (held out)":
        _r("0.5", _NOT_J_PATCH, "n/a: pairs kept by the swap's gap",
           "chosen on disjoint passages: the selection is its control", selection="held out"),
    "... system-prompt control": _r("0.5", _NOT_J_PATCH, "n/a: pairs kept by the swap's gap",
                                    _IS_CTRL, selection="same"),
    "a probe on the judge's residual stream beats its verdict score": _r(
        "0", _NOT_J_PROBE, "n/a: the probe reads every record",
        "the judge on the same records and folds is the estimate's baseline",
        selection="held out"),
    "... a probe on the generation prompt, before the answer": _r(
        "0", _NOT_J_PROBE, "n/a: the probe reads every record", "as above",
        selection="held out"),
    "... on the other model's answers (across models)": _r(
        "0", _NOT_J_PROBE, "n/a: the probe reads every record", "as above",
        selection="held out"),
    "low context reading flags a wrong verdict (audit)": _r(
        "0.5", (":overall",), "verdict::overall",
        "chance (0.5) is its threshold; no control row"),
    "a reasoning judge judges better": _r(
        "0", (":overall",), "n/a: the extractor reads both judges' verdict shares",
        ("... forced choice after its reasoning (control)",)),
    "... forced choice after its reasoning (control)": _r(
        "0", (":overall",), "n/a: the extractor reads both judges' coverage", _IS_CTRL),
    "... tells right from wrong better (forced choice)": _r(
        "0", (":overall",), "n/a: the extractor reads both judges' coverage",
        "the one-word judge, paired, is the estimate's baseline"),
    "... and reads the context more at its verdict (3.2, reasoning judge)": _r(
        "0", _NOT_J_ATT, "n/a: attention at the verdict position",
        "the one-word judge, paired, is the estimate's baseline"),
    "the judge's verdict forms later than the generator's answer (logit lens)": _r(
        "the generator's CI", "when a reading forms, not whether it is right",
        "n/a: the extractor flags a final reading of one sign on 95% of records",
        "the generator's answer token is the comparison itself"),
    "... through the tuned lens": _r(
        "the generator's CI", "when a reading forms, not whether it is right",
        "n/a: as above", "as above"),
    "a pairwise judge prefers the right answer wherever it stands": _r(
        "0", "it is the pairwise judge's discriminability itself", "pairwise",
        "the swapped order of each pair is inside the estimate"),
    "... and one slot whatever it holds (position bias)": _r(
        "0", "about position, not correctness", "n/a: a one-letter judge is the finding",
        "the swapped order of each pair is inside the estimate"),
    "... its verdict survives the swap more often than not": _r(
        "0.5", "about consistency under the swap, not correctness", "pairwise",
        "the swapped order of each pair is inside the estimate"),
    "... the top head of the swap, chosen on half the passages, carries it on the other half "
    "(held out)": _r("0", _NOT_J_PATCH, "pairwise",
                     "chosen on disjoint passages: the selection is its control",
                     selection="held out"),
    "... the fewest units carrying half the position term, chosen on half the passages, "
    "carry half on the other half (held out)": _r(
        "0.5", _NOT_J_PATCH, "n/a: the position term needs no verdict",
        "chosen on disjoint passages: the selection is its control", selection="held out"),
    "a model judges its own answers better than another's (3.1, self vs other)": _r(
        "0", ("cross",), "n/a: EA counts no-verdict replies wrong; the cell gives both GAs",
        "the other model's answers' GA is given in the cell"),
    "... better than the other model judges them (same answers)": _r(
        "0", ("cross",), "n/a: as above", "the same answers judged by both: paired"),
}
"""Each claims row's :class:`Rule`, keyed by its claim (every row has one)."""
