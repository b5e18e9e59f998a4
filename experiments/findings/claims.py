"""The claims of the findings report and how each cell is read from a published summary.

:data:`CLAIMS` is the report's rows, in order: ``(claim, measured quantity, extractor)``; an
extractor reads one model's :class:`Cell` from a published findings folder (the ``figures/
findings`` files of :mod:`experiments.findings.report`), and nothing else. Each cell is ``value
[95% CI]
(n, passages)`` and a verdict against the claim: ``yes`` / ``no`` only when the CI excludes
the other side, ``undecided`` when it spans it, ``not measured`` when the study has not
produced the file.

Claims (the paper's section in brackets): Study 1 (3.1), Study 2 and its controls (3.2),
transfer (3.3); then what the paper did not ask: steering with its non-context control,
activation patching, probes, the audit, the reasoning judge, self vs other.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interp.core.names import cross_name, model_slug
from interp.methods.pairwise import MIN_SWAP_NATS

__all__ = ["CLAIMS", "DECISIONS", "MIN_COVERAGE", "Cell", "Extract", "decide"]

DECISIONS = ("supported", "contradicted", "undecided", "not measurable", "control",
             "not measured", "not testable: judge at chance", "reversed under control",
             "exploratory (selected and tested on the same pairs)")
"""What a row can read. ``supported`` / ``contradicted``: the 95% CI lies wholly on the
claim's side of its threshold (zero, 0.5 for an AUC, the claim's own bounds) or wholly on the
other; ``undecided``: it includes the threshold; ``not measurable``: the measurement is
degenerate (coverage under :data:`MIN_COVERAGE`, one class, a judge that gives one reply to
every answer, a value that is not what its name says), and the row says why; ``control``: a
row whose outcome is fixed or nearly so by construction, shown so a reader can check the
machinery, not counted as evidence; ``not measured``: the study has no such file. The last
three come from the one rule every row goes through (:mod:`experiments.findings.rules`): a
claim about judging whose judge does not tell right from wrong answers (its AUC's CI spans
0.5), a claim its control contradicts, and a row whose unit was chosen on the pairs it is
tested on."""
MIN_COVERAGE = 0.5
"""A judge that gives a verdict on fewer than this share of its answers is not measured as a
judge: its EA is mostly the no-verdict replies counted wrong."""


def decide(ci: Sequence[float] | None, threshold: float = 0.0, sign: int = +1) -> str:
    """What a 95% CI decides about a claim on the side of a threshold.

    ``sign`` +1: the claim is that the quantity lies above ``threshold``; -1: below it; 0: not
    below it (no decrease).

    A CI of zero width (every passage resample gave one value) decides only when the claim is
    about that value's side: a constant 0 contradicts "up" and "down" and supports "no
    decrease".

    Returns:
        ``supported``, ``contradicted`` or ``undecided`` (no CI: ``undecided``).
    """
    if ci is None or None in ci:
        return "undecided"
    lo, hi = ci
    if sign == 0:
        return "contradicted" if hi < threshold else "supported" if lo >= threshold else \
            "undecided"
    if sign < 0:
        lo, hi, threshold = -hi, -lo, -threshold
    return "supported" if lo > threshold else "contradicted" if hi < threshold or (
        lo == hi == threshold) else "undecided"



@dataclass(frozen=True)
class Cell:
    """One model's measurement of one claim.

    Attributes:
        value: the point estimate (None: not measured).
        ci: its 95% passage-cluster bootstrap interval (None: none).
        n: records (or pairs) behind it.
        n_passages: distinct passages behind it.
        verdict: the reading in words: which side the CI lies on, and why a case is
            degenerate (``yes`` / ``no`` / ``undecided`` / ``not measured`` or a short phrase).
        source: the published file and key it was read from.
        fmt: the number format.
        decision: what the named control decides about the claim, one of :data:`DECISIONS`
            (:func:`decide`; ``not measured`` when there is no value).
    """

    value: float | None
    ci: Sequence[float] | None = None
    n: int | None = None
    n_passages: int | None = None
    verdict: str = "not measured"
    source: str = ""
    fmt: str = ".2f"
    decision: str = "not measured"

    def text(self) -> str:
        """``value [lo, hi] (n=, p=)``, or ``-`` when not measured."""
        if self.value is None:
            return "-"
        out = f"{self.value:{self.fmt}}"
        if self.ci is not None and None not in self.ci:
            fmt = self.fmt
            # a bound that prints as a threshold (0 or 0.5) but lies off it gets the digit
            # that shows which side it is on (0.502 decides; "0.50" looks as if it did not)
            if (m := re.fullmatch(r"([+]?)\.(\d)f", fmt)) and any(
                    round(b, int(m.group(2))) == t and b != t for b in self.ci
                    for t in (0.0, 0.5)):
                fmt = f"{m.group(1)}.{int(m.group(2)) + 1}f"
            out += f" [{self.ci[0]:{fmt}}, {self.ci[1]:{fmt}}]"
        if self.n is not None:
            out += f" (n={self.n}" + (f", p={self.n_passages}" if self.n_passages else "") + ")"
        return out


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _get(d: Any, *keys: Any) -> Any:
    for k in keys:
        if not isinstance(d, Mapping) or k not in d:
            return None
        d = d[k]
    return d


def _side(ci: Sequence[float] | None, below: float, above: float | None = None) -> str:
    """Which side of a threshold a CI lies on.

    ``yes`` when the whole CI lies over ``above`` (default ``below``), ``no`` when it lies
    under ``below``, ``undecided`` when it touches or spans them; a CI of zero width is
    ``degenerate`` (every resample gave the same value: a constant, not an interval).
    """
    if ci is None or None in ci:
        return "undecided (no CI)"
    if ci[0] == ci[1]:
        return "degenerate (CI of zero width)"
    above = below if above is None else above
    if ci[0] > above:
        return "yes"
    if ci[1] < below:
        return "no"
    return "undecided"


def _few(v: str, n_passages: int | None) -> str:
    """Mark a verdict resting on fewer than :data:`interp.analysis.stats.MIN_PASSAGES` passages."""
    from interp.analysis.stats import MIN_PASSAGES

    return v + (f" ({n_passages} passages only)" if n_passages is not None and
                n_passages < MIN_PASSAGES else "")


def _flip(v: str) -> str:
    return {"yes": "no", "no": "yes"}.get(v, v)


Extract = Callable[[Path, str], Cell]


_ACCEPTANCE = {"delta": "acceptance_rate", "delta_forced": "acceptance_rate_forced",
               "delta_valid": "acceptance_rate_valid"}
"""The acceptance rate behind each EA - GA of the metrics (generated, forced, parsed only)."""


def _one_reply(g: Mapping[str, Any], key: str) -> str | None:
    """Say so when the judge behind ``key`` accepted, or rejected, every answer it scored.

    Then EA = GA (accepts all) or EA = 1 - GA (rejects all) by construction, whatever the
    answers: the row measures GA, not judging. A generated verdict with replies that have no
    verdict is not one reply (those count wrong whatever the label).
    """
    rate = g.get(_ACCEPTANCE[key])
    if rate not in (0.0, 1.0) or (key == "delta" and _get(g, "verdicts", "none")):
        return None
    who = "the forced choice" if key == "delta_forced" else "the judge"
    return (f"{who} {'accepts' if rate else 'rejects'} every answer, so EA = "
            f"{'GA' if rate else '1 - GA'} by construction")


def _delta(dataset: str, key: str = "delta", exception: bool = False, sub: str = "") -> Extract:
    """EA - GA of one dataset: the claim GA > EA (or, ``exception``, not GA > EA).

    ``key`` ``delta_valid`` reads it on the records whose verdict was parsed (the control for
    counting an unparseable reply as a wrong verdict); ``delta`` says how many replies had no
    verdict. A judge that gave one reply to every record, and an exception that holds because
    GA is 0 on every record, say so: Δ is then set by GA alone (:func:`_one_reply`), and the
    row is ``not measurable``, as it is when fewer than :data:`MIN_COVERAGE` of the replies
    have a verdict. ``sub``: another published run (``matched/``: the template control).
    """
    def f(d: Path, m: str) -> Cell:
        name = f"{sub}{m}__asymmetry_metrics.json"
        g = _get(_read(d / name), "per_dataset", dataset)
        if g is None or g.get(key) is None:
            return Cell(None, source=name)
        v = _side(g.get(f"{key}_ci"), 0.0)  # yes: EA > GA
        v = v if exception else _flip(v)
        decision = decide(g.get(f"{key}_ci"), 0.0, +1 if exception else -1)
        if one := _one_reply(g, key):
            v = f"{v}: {one}" + (" (a control, not a finding)" if exception else "")
            decision = "not measurable"
        elif exception and g.get("GA") == 0.0:
            v = f"{v}, by construction: GA = 0 of {g.get('n')} (a control, not a finding)"
            decision = "not measurable"
        cov = g.get("mean_verdict_coverage")
        if key == "delta_forced" and cov is not None and cov < MIN_COVERAGE:
            decision = "not measurable"
            v += (f"; the two verdict replies hold {cov:.0%} of the probability (under "
                  f"{MIN_COVERAGE:.0%}): a choice between replies the judge would not give")
        none = _get(g, "verdicts", "none")
        if key == "delta" and none:
            v = f"{v}; {none} of {g.get('n')} replies without a verdict, counted wrong"
            if g.get("n") and 1 - none / g["n"] < MIN_COVERAGE:
                decision = "not measurable"
                v += f" (a verdict on {1 - none / g['n']:.0%}, under {MIN_COVERAGE:.0%})"
        n, p = g.get("n"), g.get("n_passages")
        if key == "delta_valid":  # the parsed records and their passages (older runs: None)
            n, p = g.get("n_valid"), g.get("n_passages_valid")
        return Cell(g[key], g.get(f"{key}_ci"), n, p, _few(v, p),
                    f"{name}: per_dataset.{dataset}.{key}", decision=decision)
    return f


def _judge_auc(dataset: str) -> Extract:
    """How well the judge's verdict score separates right from wrong answers on one dataset.

    The control of the GA > EA rows: EA mixes judging with the base rate (a judge that rejects
    most answers scores well where most are wrong). The AUC of the whole-reply ``logit_diff``
    against y* does not depend on the base rate; the verdict adds the generated verdicts'
    acceptance of right and of wrong answers.
    """
    def f(d: Path, m: str) -> Cell:
        name = f"{m}__asymmetry_metrics.json"
        g = _get(_read(d / name), "per_dataset", dataset)
        if g is None or g.get("auc_logit_diff") is None:
            return Cell(None, source=name)
        v = {"yes": "separates them", "no": "reversed"}.get(
            _side(g.get("auc_logit_diff_ci"), 0.5), "not distinguishable from chance")
        decision = decide(g.get("auc_logit_diff_ci"), 0.5)
        r, w = g.get("acceptance_rate_correct"), g.get("acceptance_rate_incorrect")
        if r is not None and w is not None:
            v += (f"; it accepts {r:.0%} of the {g.get('n_oracle_correct')} right and {w:.0%} "
                  f"of the {g.get('n_oracle_incorrect')} wrong answers")
        return Cell(g["auc_logit_diff"], g.get("auc_logit_diff_ci"), g.get("n"),
                    g.get("n_passages"), _few(v, g.get("n_passages")),
                    f"{name}: per_dataset.{dataset}.auc_logit_diff", decision=decision)
    return f


def _ratio(key: str, sub: str = "", lo: float = 3.0, hi: float = 5.0,
           control: bool = False, dataset: str | None = None) -> Extract:
    """A gen/eval ratio of the attention summary over the band (overall, or one dataset).

    The claim (3-5x) is checked against ``lo``/``hi``; a ``control`` asks whether the ratio
    stays over 1, and then whether it stays at ``lo`` or more.
    """
    def f(d: Path, m: str) -> Cell:
        name = f"{sub}{m}__attention_summary.json"
        where = ("per_dataset", dataset) if dataset else ("overall",)
        o = _get(_read(d / name), *where)
        if o is None or o.get(key) is None:
            return Cell(None, source=name)
        ci = o.get(f"{key}_ci")
        v = _side(ci, 1.0)
        # the claim, 3-5x, decides a control row too: within both bounds, or wholly outside
        decision = ("supported" if ci and None not in ci and lo <= ci[0] and ci[1] <= hi else
                    "contradicted" if ci and None not in ci and (ci[1] < lo or ci[0] > hi)
                    else "undecided")
        if control and v == "yes" and ci is not None:
            v = ("survives (gen > eval, 3x or more)" if ci[0] >= lo else
                 "gen > eval, but under 3x" if ci[1] < lo else "gen > eval; the CI crosses 3x")
        elif control:
            v = {"no": "reversed (eval > gen)", "undecided": "gone (CI spans 1)"}.get(v, v)
        elif v == "yes" and ci is not None:
            v = "yes, 3-5x" if ci[0] >= lo and ci[1] <= hi else (
                "less: under 3x" if ci[1] < lo else "more: over 5x" if ci[0] > hi else
                "yes; the CI crosses 3x or 5x")
        return Cell(o[key], ci, o.get("n"), o.get("n_passages"), _few(v, o.get("n_passages")),
                    f"{name}: {'.'.join(where)}.{key}", ".2f", decision)
    return f


def _candidate(d: Path, m: str) -> Cell:
    """The judge's attention mass on the candidate.

    ``barely reads`` holds when the candidate gets less attention per token than the context
    (the row's threshold); a short candidate with a small total but more mass per token than
    the context is read closely, not barely: contradicted. (The per-token ratio has no
    interval: both its parts are means over the same records.)
    """
    name = f"{m}__attention_summary.json"
    o = _get(_read(d / name), "overall")
    mpt = _get(o, "mass_per_token", "eval")
    cand, ctx = _get(o, "eval", "candidate"), _get(mpt, "context", "mean")
    if not cand or ctx is None or _get(mpt, "candidate", "mean") is None:
        return Cell(None, source=name)
    per = mpt["candidate"]["mean"] / ctx
    return Cell(cand["mean"], cand.get("ci"), o.get("n"), o.get("n_passages"),
                f"small in total, but per token {per:.1f}x the context's" if per >= 1 else
                f"yes, also per token ({per:.2f}x the context's)",
                f"{name}: overall.eval.candidate, mass_per_token.eval", ".3f",
                "supported" if per < 1 else "contradicted")


def _transfer(adapter: str, metric: str, claim_sign: float) -> Extract:
    """Study 3: an adapter minus the base model, paired per record (``vs_base``, overall).

    ``claim_sign`` is the side the paper's claim predicts (+1: the adapter is higher). The
    verdict adds the learning rate the held-out selection chose and whether its judge
    collapsed to one reply there (``lr_selection``): a collapsed judge "over-accepts" by
    construction.
    """
    def f(d: Path, m: str) -> Cell:
        name = f"{m}__transfer_table.json"
        t = _read(d / name)
        e = _get(t, "vs_base", adapter, "overall", metric)
        if e is None or e.get("mean") is None:
            return Cell(None, source=name)
        v = _side(e.get("ci"), 0.0)
        v = v if claim_sign > 0 else _flip(v)
        decision = decide(e.get("ci"), 0.0, claim_sign)
        lr = _get(t, "lr", adapter)
        sel = _get(t, "lr_selection", "candidates", f"{lr:g}" if lr is not None else "",
                   adapter)
        by = _get(t, "lr_selection", "chosen_by", adapter) or "held-out score"
        if lr is not None:
            v += f" (lr {lr:g}" + ((", chosen on held-out train records"
                                    if by == "held-out score" else f", {by}") if sel else "") + (
                "; its judge collapsed to one reply there" if sel and sel.get("collapsed")
                else "") + ")"
        if sel and sel.get("collapsed") and "base_answers" in metric:
            decision = "not measurable"
        if "base_answers" in metric:  # a reply without a verdict is not an acceptance
            groups = (_get(t, "judge_base_answers", adapter) or {}).values()
            if none := sum(_get(g, "verdicts", "none") or 0 for g in groups):
                n = sum(g.get("n", 0) for g in groups)
                v += f"; its judge gave no verdict on {none} of {n}"
                if n and 1 - none / n < MIN_COVERAGE:
                    decision = "not measurable"
                    v += f" (a verdict on {1 - none / n:.0%}: no judge to measure)"
        return Cell(e["mean"], e.get("ci"), e.get("n"), e.get("n_passages"), v,
                    f"{name}: vs_base.{adapter}.overall.{metric}", "+.2f", decision)
    return f


def _steer(task: str, key: str, alpha: str, control: bool = False, sign: int = +1,
           sub: str = "") -> Extract:
    """A paired effect of steering at ``alpha`` vs 1 (``vs_alpha1``), overall.

    ``sign``: the side the claim predicts (+1 up, -1 down, 0 no decrease); a ``control`` row
    (the non-context keys) reads ``control``: the row that decides is context minus control.
    ``sub``: another published run (``steer/``: the factors past x4).
    """
    def f(d: Path, m: str) -> Cell:
        name = f"{sub}{m}__steering_summary.json"
        s = _read(d / name)
        part = _get(s, "control") if control else s
        g = _get(part, task, alpha, "overall")
        e = _get(g, "vs_alpha1", key)
        if e is None or e.get("mean") is None:
            return Cell(None, source=name)
        v = _side(e.get("ci"), 0.0)
        v = {"yes": "up", "no": "down"}.get(v, v)
        if v.startswith("degenerate") and e["mean"] == 0.0 and key != "logit_diff":
            v += ": no verdict flipped"
        decision = "control" if control else decide(e.get("ci"), 0.0, sign)
        return Cell(e["mean"], e.get("ci"), e.get("n"), e.get("n_passages", g.get("n_passages")),
                    v, f"{name}: {'control.' if control else ''}{task}.{alpha}.overall."
                    f"vs_alpha1.{key}", "+.3f", decision)
    return f


def _steer_vs_control(task: str, key: str, alpha: str, right: float = 0.0,
                      sub: str = "") -> Extract:
    """The context keys' paired effect minus the control's, per record (overall).

    ``right`` (+1 or -1) is the side that would help the judge (``logit_diff`` up on the
    oracle's right answers, down on its wrong ones); the verdict then says which way it went,
    and the claim (the context's attention helps the judge) is supported only the right way.
    Without ``right`` the claim is that the context keys move it more than the control's, in
    either direction.
    """
    def f(d: Path, m: str) -> Cell:
        name = f"{sub}{m}__steering_summary.json"
        e = _get(_read(d / name), "context_minus_control", task, alpha, "overall", key)
        if e is None or e.get("mean") is None:
            return Cell(None, source=name)
        side = _side(e.get("ci"), 0.0)
        v = {"yes": "context moves it more up", "no": "context moves it more down"}.get(
            side, "undecided: no more than the control")
        if right and side in ("yes", "no"):
            v += (": the right way" if (side == "yes") == (right > 0) else ": the wrong way")
        decision = decide(e.get("ci"), 0.0, int(right)) if right else (
            "supported" if side in ("yes", "no") else "undecided")
        return Cell(e["mean"], e.get("ci"), e.get("n"), e.get("n_passages"), v,
                    f"{name}: context_minus_control.{task}.{alpha}.overall.{key}", "+.3f",
                    decision)
    return f


def _patch(kind: str, sub: str = "") -> Extract:
    """The top unit's share of the clean - corrupt logit difference it restores.

    ``sub``: the published folder of another run (``gap/``: the candidate swap at another
    ``min_gap``, experiments/findings_gap.toml; ``pool/``: on every bundled record,
    experiments/findings_pool.toml; ``matched_swap/``: under the matched template, whose
    SmolLM2 judge separates right from wrong, experiments/findings_matched_swap.toml).

    With ``exact = "topk"`` each pair patches only its own top units, so a unit's ratio can
    rest on one pair; the cell takes the first-ranked unit patched on at least half the kept
    pairs, or else the one patched on the most (and says which), with that unit's own pairs
    and passages.

    The claim of a row is that one unit carries most of the swap's effect (its share's CI
    lies over 0.5). A share outside [-0.05, 1.05] is not a share (``not measurable``); a
    residual-stream unit at the verdict position restoring nearly all of it is close to
    automatic there (it feeds the output directly): ``control``. Fewer than
    :data:`interp.analysis.stats.MIN_PASSAGES` passages are flagged.
    """
    def f(d: Path, m: str) -> Cell:
        name = f"{sub}{m}__patching_summary.json"
        s = _get(_read(d / name), kind)
        field = "top_units" if s and s.get("top_units") else "top_spans"
        why = (s or {}).get("skipped_by_reason") or {}
        if s is not None and not s.get("n_pairs") and why.get("control_identity"):
            # no pair built: the two prompts share the context's prefix (equal system prompts)
            rest = {k: v for k, v in why.items() if k != "control_identity"}
            return Cell(None, n=0, verdict=(
                f"identical by construction: {why['control_identity']} of "
                f"{s.get('n_skipped')} records' two prompts share the context's prefix (equal "
                f"system prompts), so no position differs"
                + "".join(f"; {v} {k.replace('_', ' ')}" for k, v in sorted(rest.items()))),
                source=name, decision="control")
        if s is not None and s.get("n_pairs_kept") == 0:   # measured: no pair reached min_gap
            small = s.get("small_gaps") or {}
            gaps = [abs(g["gap"]) for g in s.get("gaps", [])] + (
                [small["max_abs"]] if small.get("max_abs") is not None else [])
            most = f" (largest |gap| {max(gaps):.2f})" if gaps else ""
            return Cell(None, n=0, verdict=f"no pair to sweep: 0 of "
                        f"{s.get('n_pairs', 0) + small.get('n', 0)} scored pairs reach "
                        f"{s.get('min_gap')} nat{most}", source=name)
        if s is None or not s.get(field):
            return Cell(None, source=name)
        kept = s.get("n_pairs_kept") or 0
        units = s[field]   # the residual stream without per_position: its units are spans
        i = next((j for j, u in enumerate(units) if (u.get("n_pairs") or kept) >= kept / 2),
                 None)
        note = "" if kept >= 30 else f" (under 30 kept pairs: {kept})"
        if i is None:   # no unit among each pair's top ones in half the pairs
            i = max(range(len(units)), key=lambda j: (units[j].get("n_pairs") or 0, -j))
            note += (f"; no listed unit is patched in half the {kept} pairs, this one in "
                     f"{units[i].get('n_pairs')}")
        elif i:
            note += f"; rank {i + 1}: the {i} above rest on under half the {kept} pairs"
        u = units[i]
        where = f"L{u['layer']}" + (f".H{u['head']}" if u.get("head", -1) >= 0 else "") + (
            f" {u['span']}" if u.get("span") else "" if u.get("head", -1) >= 0
            else f" pos {u.get('rel_position')}")
        n_pass = u.get("n_passages", s.get("n_passages"))
        decision = "control" if kind.startswith("system-prompt-control") else decide(
            u.get("ci"), 0.5)
        if not -0.05 <= u["ratio"] <= 1.05:
            decision = "not measurable"
            note += f"; {u['ratio']:.2f} is not a share of the gap"
        elif kind.endswith("resid") and u.get("span") == "verdict" and u["ratio"] >= 0.9:
            decision = "control"
            note += "; the verdict position's residual stream feeds the output: near automatic"
        return Cell(u["ratio"], u.get("ci"), u.get("n_pairs", kept), n_pass,
                    _few(f"top unit {where}{note}", n_pass),
                    f"{name}: {kind}.{field}[{i}].ratio", decision=decision)
    return f


def _held_out_head(d: Path, m: str) -> Cell:
    """The candidate swap's top head, chosen on half the passages, on the other half.

    Reads ``gap/{m}__heads_held_out.json`` (:mod:`experiments.findings.held_out_heads`): the
    cell is the first half's held-out share; supported when both halves choose the same head
    and both held-out CIs lie over 0.5, contradicted when both lie under it, not measurable
    when a chosen head has no held-out run (the head test did not patch it).
    """
    name = f"gap/{m}__heads_held_out.json"
    r = _read(d / name)
    rows = _get(r, "halves")
    if not rows:
        return Cell(None, source=name)
    heads = [h["chosen"]["head"] for h in rows]
    outs = [h["held_out"] for h in rows]
    picked = " and ".join(f"{h['chosen']['head']} on half {h['select_on']} "
                          f"({h['chosen']['ratio']:.2f} there)" for h in rows)
    if any(o is None for o in outs):
        same = "the same head" if len(set(heads)) == 1 else "different heads"
        return Cell(None, n=0, verdict=f"{same} chosen: {picked}; no held-out run of "
                    f"{', '.join(sorted({h for h, o in zip(heads, outs) if o is None}))}",
                    source=name, decision="not measurable")
    sides = [decide(o.get("ci"), 0.5) for o in outs]
    decision = ("supported" if len(set(heads)) == 1 and set(sides) == {"supported"} else
                "contradicted" if set(sides) == {"contradicted"} else "undecided")
    other = outs[1]
    v = (f"{picked}; held out: {outs[0]['value']:.2f} on half B, {other['value']:.2f} "
         f"[{other['ci'][0]:.2f}, {other['ci'][1]:.2f}] on half A")
    o = outs[0]
    return Cell(o["value"], o.get("ci"), o.get("n"), o.get("n_clusters"), _few(v, o.get(
        "n_clusters")), f"{name}: halves[0].held_out.value", decision=decision)


def _probe(task: str) -> Extract:
    """The probe's AUC minus the verbal judge's, paired, within datasets (with CI).

    ``task``: the probe of the judge's prompt (``eval``) or of the generation prompt (``gen``);
    the judge's score is its ``logit_diff`` on the same records either way. Pooled over
    datasets a probe also gains from knowing the dataset (their base rates differ), so the
    cell compares pairs within a dataset; the verdict gives the pooled difference and the AUC
    of the dataset alone beside it.

    The probe is the one whose (probe, layer, pool) cell each test fold's training records
    chose (``vs_judge.nested``, nested cross-validation), so selection and test never share a
    record. Summaries without it fall back to the best cell of the whole grid, chosen on the
    folds it is scored on: optimistic by the selection, so that difference can read
    contradicted or undecided but never supported. Older summaries without a paired
    comparison give the best cell's fold-mean AUC (no CI).
    """
    def f(d: Path, m: str) -> Cell:
        name = f"{m}__probes_results.json"
        r = _read(d / name)
        e = _get(r, "tasks", task)
        if e is None or _get(e, "best", "auc") is None:
            return Cell(None, source=name)
        perm = e.get("permutation") or {}
        pv = perm.get("p_value")
        within = "within datasets" if perm.get("within") else "pooled"
        perms = (f"permutation p={pv if pv is None else format(pv, '.2g')} "
                 f"({perm.get('n', 0)} perms, {within})")
        vs = e.get("vs_judge") or {}
        nested = vs.get("nested") or {}
        at = "vs_judge"
        if (nested.get("auc_paired_within_dataset") or {}).get("probe_minus_judge") is not None:
            vs, at = nested, "vs_judge.nested"
        key = next((k for k in ("auc_paired_within_dataset", "auc_paired")
                    if (vs.get(k) or {}).get("probe_minus_judge") is not None), None)
        if key:
            pa = vs[key]
            decision = decide(pa.get("ci"), 0.0)
            side = {"yes": "probe higher", "no": "judge higher"}.get(_side(pa.get("ci"), 0.0),
                                                                     "undecided")
            extra = ""
            if key == "auc_paired_within_dataset" and vs.get("auc_paired"):
                pool = vs["auc_paired"]
                extra = f"; pooled {pool['probe_minus_judge']:+.2f}"
                if (alone := (e.get("vs_judge") or {}).get("auc_dataset_only")) is not None:
                    extra += f", the dataset alone {alone:.2f}"
            if at == "vs_judge.nested":
                best = (e["vs_judge"].get(key) or {}).get("probe_minus_judge")
                how = (f"; each test fold's cell chosen on its training records "
                       f"({nested.get('n_distinct')} distinct of {len(nested.get('chosen', []))}"
                       f" folds)" + (f"; the grid's best cell, chosen on all folds, "
                                     f"{best:+.2f}" if best is not None else ""))
            else:
                how = "; the best cell of the grid, chosen on the folds it is scored on"
                if decision == "supported":
                    decision = "undecided"
                    side = "undecided (the selection is not held out)"
            return Cell(pa["probe_minus_judge"], pa.get("ci"), pa.get("n"), pa.get("n_passages"),
                        f"{side}: probe {pa['probe']:.2f}, judge {pa['judge']:.2f}{extra}{how};"
                        f" {perms} tests the best logistic-regression cell against shuffled "
                        f"labels, not this difference",
                        f"{name}: tasks.{task}.{at}.{key}.probe_minus_judge", "+.3f", decision)
        judge = _get(e, "vs_judge", "judge_same_folds", "auc")
        v = f"judge AUC {judge:.2f}; {perms}" if judge is not None else "no judge AUC"
        return Cell(e["best"]["auc"], None, r.get("n_records"), r.get("n_passages"), v,
                    f"{name}: tasks.{task}.best.auc")
    return f


def _probe_across(d: Path, m: str) -> Cell:
    """:func:`_probe` (``eval``) of the model judging the OTHER model's answers.

    Reads the cross-judged run's published ``{m}__judges__{other}__probes_results.json``: the
    judge's residual-stream probe against its own verbal score on another model's answers
    (paired, within datasets); the verdict adds the answers' own model's self-judge AUC on
    the same folds from ``cross_probe.json`` when it is there.
    """
    hits = sorted(d.glob(f"{cross_name(m, '*')}__probes_results.json"))
    if not hits:
        return Cell(None, source=f"{cross_name(m, '<other>')}__probes_results.json")
    prefix = hits[0].name[:-len("__probes_results.json")]
    other = prefix[len(cross_name(m, "")):]
    cell = _probe("eval")(d, prefix)
    if cell.value is None:
        return cell
    verdict = f"{cell.verdict}; on {other}'s answers"
    for e in _get(_read(d / "cross_probe.json"), "entries") or []:
        if model_slug(str(e.get("judge"))) == m and model_slug(str(e.get("answers_of"))) == other:
            own = _get(e, "source_self_judge_folds", "auc")
            if own is not None:
                verdict += f"; {other} judging them itself {own:.2f} (same folds)"
    return Cell(cell.value, cell.ci, cell.n, cell.n_passages, verdict, cell.source, cell.fmt,
                cell.decision)


def _audit(d: Path, m: str) -> Cell:
    """The AUC of low context mass at the verdict position for a wrong verdict (the audit).

    Reads ``overall.signals.context_mass`` (oriented: low mass scores high); the verdict says
    how many of the wrong verdicts are replies without one, which count as wrong there too.
    """
    name = f"{m}__audit_summary.json"
    s = _read(d / name)
    o = _get(s, "overall")
    a = _get(o, "signals", "context_mass")
    if not a or a.get("auc") is None:
        return Cell(None, source=name)
    v = {"yes": "predicts, pooled over datasets", "no": "anti-predicts, pooled over datasets"
         }.get(_side(a.get("ci"), 0.5), "undecided")
    if s.get("n_unparseable"):
        v += f"; {s['n_unparseable']} of the {s.get('n_wrong')} wrong verdicts are no verdict"
    return Cell(a["auc"], a.get("ci"), a.get("n"), o.get("n_passages"), v,
                f"{name}: overall.signals.context_mass.auc", decision=decide(a.get("ci"), 0.5))


def _reasoning(key: str, fmt: str = "+.2f") -> Extract:
    """Reasoning minus one-word judge, paired; EA says the no-verdict shares (counted wrong)."""
    def f(d: Path, m: str) -> Cell:
        name = f"{m}__reasoning_side_by_side.json"
        r = _read(d / name)
        o = _get(r, m, "overall") or _get(r, "overall")
        g = _get(o, key)
        if not isinstance(g, Mapping) or g.get("delta") is None:
            return Cell(None, source=name)
        v = {"yes": "reasoning higher", "no": "reasoning lower"}.get(
            _side(g.get("delta_ci"), 0.0), "undecided")
        decision = decide(g.get("delta_ci"), 0.0)
        forced = key.endswith("forced")
        cov = _get(o, "mean_verdict_coverage") if forced else {
            j: 1 - s for j, s in (_get(o, "no_verdict_share") or {}).items()
            if j in ("word", "reasoning") and isinstance(s, (int, float))}
        low = {j: c for j, c in (cov or {}).items() if j in ("word", "reasoning")
               and isinstance(c, (int, float)) and c < MIN_COVERAGE}
        nv = _get(o, "no_verdict_share")
        if isinstance(nv, Mapping) and nv.get("reasoning") is not None and key == "EA":
            v += (f" ({g['reasoning']:.2f} vs {g['word']:.2f}); no verdict: reasoning "
                  f"{nv['reasoning']:.0%}, one word {nv['word']:.0%}, counted wrong")
        if key in ("EA", "EA_forced", "discrimination", "discrimination_forced") and low:
            decision = "not measurable"
            what = "the verdict replies hold" if forced else "a verdict on"
            v += "; " + ", ".join(f"{'one-word' if j == 'word' else 'reasoning'} judge: {what} "
                                  f"{c:.0%}" for j, c in sorted(low.items())) + (
                f" (under {MIN_COVERAGE:.0%})")
        return Cell(g["delta"], g.get("delta_ci"), o.get("n"), o.get("n_passages"), v,
                    f"{name}: overall.{key}.delta", fmt, decision)
    return f


def _cross(key: str) -> Extract:
    """Cross-judging (``cross_judge.json``, :func:`interp.methods.cross_judge.judge_matrix`).

    ``self_minus_other``: the model's EA on its own answers minus its EA on the other model's
    answers (different answers, so the cell gives both answer sets' GA);
    ``self_judge_minus_other``: the model judging its own answers minus the other model
    judging the SAME answers. Both paired over the records the runs share, passage-cluster CI.
    The matrix is keyed by model spec; ``m`` is its slug (the file prefix).
    """
    name = "cross_judge.json"

    def f(d: Path, m: str) -> Cell:
        table = _get(_read(d / name), key) or {}
        spec = next((s for s in table if model_slug(s) == m), None)
        row = table.get(spec) if spec is not None else None
        if not isinstance(row, Mapping) or not row:
            return Cell(None, source=name)
        other, e = next(iter(row.items()))
        if not isinstance(e, Mapping) or e.get("EA_diff") is None:
            return Cell(None, source=name)
        side = _side(e.get("EA_diff_ci"), 0.0)
        v = {"yes": "self higher", "no": "self lower"}.get(side, "undecided")
        if key == "self_minus_other":
            v += f" (GA of its answers {e['GA_self']:.2f}, of {model_slug(other)}'s " \
                 f"{e['GA_other']:.2f})"
        else:
            v += f" (judged by {model_slug(other)})"
        return Cell(e["EA_diff"], e.get("EA_diff_ci"), e.get("n"), e.get("n_passages"), v,
                    f"{name}: {key}.{spec}.{other}.EA_diff", "+.2f",
                    decide(e.get("EA_diff_ci"), 0.0))
    return f


_T1 = "matched template; replies with a verdict"
CONSTANT_SHARE = 0.95
"""A final verdict with this share or more of one sign (either way) is constant: agreement
with it, layer by layer, is agreement with one class, not the verdict forming."""


def _lens_depth(lens: str) -> Extract:
    """When the judge's verdict keeps its final sign, against the generator's answer.

    The first layer (as a share of depth) from which the lens reading has the last layer's
    sign, through one lens. Reads ``views/{m}__lens_summary.json``:
    ``judge_first.{lens}.first_agreeing_depth`` (the verdict's first token, the token the
    verdict is decided on) and the same of ``gen`` (the gold answer's first token against the
    best other). The whole reply's depth is said beside it: its later tokens are read, teacher-
    forced, at positions where an early layer still predicts the token it sits on, so its
    early layers say more about copying than about the verdict. Supported (the verdict forms
    later) when the judge's 95% CI lies wholly above the generator's, contradicted when wholly
    below, undecided when they overlap (two intervals that do not overlap: a conservative
    reading). The decision must also hold for the depths that let one later layer disagree
    (``first_agreeing_depth_skip1``): a decision that one layer's reading makes alone (one
    tuned-lens translator that flips most records, say) reads undecided, with both depths
    said. Not measurable when the judge's or the generator's final reading has one sign on
    :data:`CONSTANT_SHARE` of records or more: agreement with it is then about one class.
    """
    def decide_depths(jd: Mapping[str, Any], gd: Mapping[str, Any]) -> str:
        return ("supported" if jd["ci"][0] > gd["ci"][1] else "contradicted"
                if jd["ci"][1] < gd["ci"][0] else "undecided")

    def f(d: Path, m: str) -> Cell:
        name = f"views/{m}__lens_summary.json"
        r = _read(d / name)
        j, g = _get(r, "judge_first", lens), _get(r, "gen", lens)
        if not j or not g:
            return Cell(None, source=name)
        jd, gd = j["first_agreeing_depth"], g["first_agreeing_depth"]
        whole = _get(r, "judge", lens, "first_agreeing_depth", "mean")
        src = f"{name}: judge_first.{lens}.first_agreeing_depth.mean"
        v = (f"judge {jd['mean']:.2f} [{jd['ci'][0]:.2f}, {jd['ci'][1]:.2f}] of depth"
             + (f" (whole reply {whole:.2f})" if whole is not None else "") +
             f", generator {gd['mean']:.2f} [{gd['ci'][0]:.2f}, {gd['ci'][1]:.2f}] "
             f"({g['n']} records with a gold answer)")
        for who, c, yes, no in (("judge", j, "Correct", "Incorrect"),
                                ("generator", g, "the gold token", "another token")):
            share = c.get("final_positive_share")
            if share is not None and max(share, 1 - share) >= CONSTANT_SHARE:
                return Cell(jd["mean"], jd["ci"], jd["n"], jd["n_passages"],
                            f"{v}; the {who}'s final reading favours {yes if share >= 0.5 else no}"
                            f" on {max(share, 1 - share):.0%} of records: agreement with it is "
                            f"about one class", src, decision="not measurable")
        decision = decide_depths(jd, gd)
        j1, g1 = j.get("first_agreeing_depth_skip1"), g.get("first_agreeing_depth_skip1")
        if j1 and g1 and decide_depths(j1, g1) != decision:
            v = (f"{v}; one layer decides it: letting one later layer disagree, judge "
                 f"{j1['mean']:.2f} [{j1['ci'][0]:.2f}, {j1['ci'][1]:.2f}], generator "
                 f"{g1['mean']:.2f} [{g1['ci'][0]:.2f}, {g1['ci'][1]:.2f}] "
                 f"({decide_depths(j1, g1)})")
            decision = "undecided"
        return Cell(jd["mean"], jd["ci"], jd["n"], jd["n_passages"],
                    _few(v, jd["n_passages"]), src, decision=decision)
    return f


def _pairwise(term: str) -> Extract:
    """One outcome of the pairwise judge over all pairs, both orders.

    Reads ``views/{m}__pairwise_summary.json`` (experiments/findings_views.toml).

    ``term``: ``content`` (> 0: prefers the right answer wherever it is), ``position`` (not 0:
    prefers a slot whatever it holds; the verdict says which) or ``consistent`` (the share of
    pairs whose winner survives the swap; the claim is that it exceeds half). A judge that
    picks the same letter in both orders of every pair (all its flips on one side) has a
    consistency and an accuracy of 0 by construction: those rows read not measurable.
    """
    def f(d: Path, m: str) -> Cell:
        name = f"views/{m}__pairwise_summary.json"
        o = _get(_read(d / name), "outcomes", "all")
        if not o or term not in o:
            return Cell(None, source=name)
        x = o[term]
        flips = (o["flip_first"]["mean"], o["flip_second"]["mean"])
        v = (f"consistency {o['consistent']['mean']:.2f}, accuracy {o['accurate']['mean']:.2f}, "
             f"flips to first {flips[0]:.2f} / second {flips[1]:.2f}; content "
             f"{o['content']['mean']:+.2f}, position {o['position']['mean']:+.2f} nats")
        src = f"{name}: outcomes.all.{term}.mean"
        fmt = ".2f" if term == "consistent" else "+.2f"
        if term == "consistent" and max(flips) == 1.0:
            return Cell(x["mean"], x["ci"], x["n"], x["n_passages"],
                        f"{v}: the judge answers {'A' if flips[0] == 1.0 else 'B'} in both "
                        f"orders of every pair", src, fmt, "not measurable")
        if term == "position":
            decision = "supported" if decide(x["ci"], 0.0, +1) == "supported" or decide(
                x["ci"], 0.0, -1) == "supported" else "undecided"
            side = "first" if x["mean"] > 0 else "second"
            v = f"towards the {side} slot; {v}"
        else:
            decision = decide(x["ci"], 0.5 if term == "consistent" else 0.0)
        return Cell(x["mean"], x["ci"], x["n"], x["n_passages"], _few(v, x["n_passages"]), src,
                    fmt, decision)
    return f


def _pairwise_held_out(what: str) -> Extract:
    """Units chosen on half the passages, measured on the other half (``held_out``).

    ``what``: ``order_heads`` (the top head by patching share of the swapped order, against
    0: it carries part of the swap on passages it was not chosen on) or ``position_units``
    (the fewest units whose position terms reach half the total on the selection passages;
    against 0.5: they carry half of it on the test passages too; a value outside [0, 1] is
    not a share, since the units' terms cancel, and reads not measurable). The patching share
    rests on the swap's change ``s2 - s1``: where it moves the score by less than
    :data:`MIN_SWAP_NATS` on average (a position-only judge), the shares rest on a small
    denominator and the row is not measurable.
    """
    def f(d: Path, m: str) -> Cell:
        name = f"views/{m}__pairwise_summary.json"
        r = _read(d / name)
        h = _get(r, "held_out", what)
        if not h:
            return Cell(None, source=name)
        if what == "order_heads":
            top = h[0]
            t, unit = top["test"], top["unit"]
            gap = _get(r, "patching", "gap") or {}
            v = (f"{unit} ({top['select_share']:.2f} on the selection passages); the swap moves"
                 f" the score by {gap.get('mean', float('nan')):+.2f} nats on average")
            src, thr = f"{name}: held_out.order_heads[0].test.share", 0.0
            if abs(gap.get("mean", 0.0)) < MIN_SWAP_NATS:
                t = top["test"] or {}
                return Cell(t.get("share"), t.get("ci"), t.get("n"), t.get("n_passages"),
                            f"{v}: under {MIN_SWAP_NATS:g} nat, a share of a small denominator",
                            src, decision="not measurable")
        else:
            t, units = h["test"], h["units"]
            v = (f"{', '.join(units)} ({h['select_share']:.2f} of the position term on the "
                 f"selection passages)")
            src, thr = f"{name}: held_out.position_units.test.share", 0.5
        if t is None or t.get("share") is None:
            return Cell(None, verdict=f"{v}; no test pairs", source=src,
                        decision="not measurable")
        if what == "position_units" and not 0.0 <= t["share"] <= 1.0:
            return Cell(t["share"], t["ci"], t["n"], t["n_passages"],
                        f"{v}: {t['share']:.2f} is not a share: the units' position terms "
                        f"cancel, and one of them exceeds their sum", src,
                        decision="not measurable")
        return Cell(t["share"], t["ci"], t["n"], t["n_passages"], _few(v, t["n_passages"]),
                    src, decision=decide(t["ci"], thr))
    return f


def _calib(file: str | tuple[str, ...], path: str, threshold: float, sign: int, *,
           pick: str = "") -> Extract:
    """One statistic of the calibration study (experiments/findings_calibration.toml).

    Reads ``calibration/{model}__{file}.json`` at the dotted ``path``: a statistic with
    ``mean``, ``auc`` or ``difference`` and its ``ci`` (:mod:`interp.stages.calibration`).
    ``file`` may name several summaries: the first that holds the path's first key is read
    (the config's run keeps the directions part in ``calibration_summary``; a run of the
    directions part alone writes ``calibration_directions_summary``).
    ``pick``: ``norm=X`` takes the entry of a per-norm list at that norm (the steering sweep
    of the directions part); ``max`` the entry of a per-layer list with the largest value,
    leaving out a layer whose interval has zero width (the two states one by construction;
    the layer is chosen on the records it is read on: the rule says ``selection = same``).
    ``sign``: as :func:`decide`.
    """
    files = (file,) if isinstance(file, str) else file

    def f(d: Path, m: str) -> Cell:
        keys = path.split(".")
        for x in files:   # the first summary that holds the path (else the last, for its name)
            name = f"calibration/{m}__{x}.json"
            if _get(s := _read(d / name), keys[0]) is not None:
                break
        src, label = f"{name}: {path}", ""
        if pick.startswith("norm="):   # .../own.delta_auc: the entry of own at that norm
            want = float(pick.split("=")[1])
            norms = _get(s, *keys[:-2], "norms") or []
            e = next((x.get(keys[-1]) for x, n in zip(_get(s, *keys[:-1]) or [], norms)
                      if float(n) == want), None)
            src += f" (norm {want:g})"
        else:
            e = _get(s, *keys)
        if pick == "max" and isinstance(e, list):
            layers = _get(s, *keys[:-1], "layers") or list(range(len(e)))
            e, lay = max(((x, lay) for x, lay in zip(e, layers)   # not a layer where the two
                          if x and x.get("difference") is not None    # states are one by
                          and not (x.get("ci") and x["ci"][0] == x["ci"][1])),  # construction
                         key=lambda t: t[0]["difference"], default=(None, None))
            label = f"layer {lay}"
            src += f" (the largest: {label})"
        if not isinstance(e, dict):
            return Cell(None, source=name)
        value = next((e[k] for k in ("mean", "difference", "auc") if e.get(k) is not None),
                     None)
        if value is None:
            return Cell(None, source=name)
        ci = e.get("ci") if "ci" in e else e.get("auc_ci")
        n = e.get("n") or _get(s, "all", "n") or _get(s, "directions", "n")
        n_p = e.get("n_passages") or _get(s, "all", "n_passages") or _get(
            s, "directions", "n_passages")
        side = _side(ci, threshold)
        v = {"yes": "above", "no": "below"}.get(side, side) + (f" {threshold:g}" if side in (
            "yes", "no") else "") + (f" ({label})" if label else "")
        return Cell(value, ci, n, n_p, v, src, "+.3f" if threshold == 0 else ".2f",
                    decide(ci, threshold, sign))
    return f


def _block(d: Path, m: str) -> Cell:
    """The self-check's verdict without the position after the answer, against an adjacent one.

    Blocking the verdict position's attention to the first position after the answer changes
    the self-check's logit difference by ``abs_cache_minus_none`` (nats, per record, in
    absolute value); blocking an adjacent position (the control) by ``abs_control_minus_none``.
    The claim, that the verdict reads that position in particular, is supported when the first
    interval lies wholly above the second and contradicted when wholly below it.
    """
    name = f"calibration/{m}__calibration_summary.json"
    b = _get(_read(d / name), "all", "block", "logit_diff")
    own, ctl = _get(b, "abs_cache_minus_none"), _get(b, "abs_control_minus_none")
    if not own or own.get("mean") is None or not ctl or ctl.get("mean") is None:
        return Cell(None, source=name)
    oc, cc = own.get("ci"), ctl.get("ci")
    if oc and cc and oc[0] > cc[1]:
        v, decision = "above the adjacent position's", "supported"
    elif oc and cc and oc[1] < cc[0]:
        v, decision = "below the adjacent position's", "contradicted"
    else:
        v, decision = "overlaps the adjacent position's", "undecided"
    v += f" ({ctl['mean']:.3f} [{cc[0]:.3f}, {cc[1]:.3f}] nats)" if cc else ""
    return Cell(own["mean"], oc, own.get("n"), own.get("n_passages"), v,
                f"{name}: all.block.logit_diff.abs_cache_minus_none", ".3f", decision)


_S1 = "the judge's AUC against y* (base-rate free)"
_ST = "the same factor on as many non-context keys"
_RANK = "the change of the judge's AUC (ranking, base-rate free)"

STEER_FACTORS: tuple[tuple[str, str], ...] = (("4", ""), ("8", "steer/"), ("16", "steer/"))
"""The judge's steering factors with claims rows, and the published folder of each (x4 in the
study's own run, experiments/findings.toml; x8 and x16 in experiments/findings_steer.toml)."""


def steer_claims(a: str) -> dict[str, str]:
    """The names of the claims rows of the judge steered at x``a`` (:func:`_steer_rows`).

    Keys: ``ea`` (the claim: it makes the judge right more often), ``auc`` (its deciding
    control: the change of the judge's AUC), ``gap`` (acceptance of right minus of wrong
    answers), ``wrong`` and ``right`` (acceptance of each), ``ld`` (the logit difference),
    ``ctrl`` and ``ctrl_ld`` (the non-context keys' EA_forced and logit difference: control
    rows), ``cmc`` (context minus control, logit difference), ``cmc_auc``, ``cmc_right``,
    ``cmc_wrong`` (context minus control: AUC, logit difference on right and on wrong
    answers).
    """
    return {"ea": f"steering the judge's context x{a} makes it right more often",
            "auc": f"... x{a}: it ranks right above wrong answers better (AUC, the deciding "
                   "control)",
            "gap": f"... x{a}: acceptance of right minus of wrong answers",
            "wrong": f"... x{a}: acceptance of wrong answers",
            "right": f"... x{a}: acceptance of right answers",
            "ld": f"... x{a}: its logit difference on the verdict",
            "ctrl": f"... x{a}: the same factor on the non-context keys (control)",
            "ctrl_ld": f"... x{a}: the non-context keys' logit difference (control)",
            "cmc": f"... x{a}, context minus control, per record",
            "cmc_auc": f"... x{a}, context minus control, its AUC",
            "cmc_right": f"... x{a}, context minus control, on right answers (helping would "
                         "raise it)",
            "cmc_wrong": f"... x{a}, context minus control, on wrong answers (helping would "
                         "lower it)"}


def _steer_rows(a: str, sub: str) -> list[tuple[str, str, str, Extract]]:
    """The same rows for every steering factor of the judge (:data:`STEER_FACTORS`).

    The claim (EA_forced up) is decided by the ranking: a judge pushed towards "Incorrect"
    on a sample that is mostly wrong gains EA_forced without telling right from wrong any
    better, so the change of its AUC (and of acceptance of right minus of wrong answers) is
    shown beside it and decides it (experiments/findings/rules.py), with both halves, right
    and wrong answers, at every factor.
    """
    n, al = steer_claims(a), f"{float(a):.1f}"
    c = "(this row is the control)"
    return [
        (n["ea"], f"dEA_forced, alpha {a}", _RANK, _steer("eval", "ea_forced", al, sub=sub)),
        (n["auc"], f"d AUC of logit_diff against y*, alpha {a} - 1", _ST,
         _steer("eval", "auc", al, sub=sub)),
        (n["gap"], f"d (acceptance given right - given wrong), alpha {a}", _ST,
         _steer("eval", "accept_gap", al, sub=sub)),
        (n["wrong"], f"d acceptance given wrong, alpha {a}", _ST,
         _steer("eval", "accept_incorrect", al, sign=-1, sub=sub)),
        (n["right"], f"d acceptance given right, alpha {a}", _ST,
         _steer("eval", "accept_correct", al, sign=0, sub=sub)),
        (n["ld"], f"d mean logit_diff (nats), alpha {a}", _ST,
         _steer("eval", "logit_diff", al, sign=-1, sub=sub)),
        (n["ctrl"], f"dEA_forced, alpha {a}", c,
         _steer("eval", "ea_forced", al, control=True, sub=sub)),
        (n["ctrl_ld"], f"d mean logit_diff (nats), alpha {a}", c,
         _steer("eval", "logit_diff", al, control=True, sub=sub)),
        (n["cmc"], f"d logit_diff context - control, alpha {a}", _ST,
         _steer_vs_control("eval", "logit_diff", al, sub=sub)),
        (n["cmc_auc"], f"d AUC context - control, alpha {a}", _ST,
         _steer_vs_control("eval", "auc", al, right=+1, sub=sub)),
        (n["cmc_right"], "the same, oracle-correct answers", _ST,
         _steer_vs_control("eval", "logit_diff_correct", al, right=+1, sub=sub)),
        (n["cmc_wrong"], "the same, oracle-incorrect answers", _ST,
         _steer_vs_control("eval", "logit_diff_incorrect", al, right=-1, sub=sub)),
    ]


CLAIMS: tuple[tuple[str, str, str, Extract], ...] = (
    ("GA > EA on SQuAD 2.0 (3.1)", "EA - GA", _T1, _delta("squad_v2")),
    ("... SQuAD 2.0 under the matched template (control)", "EA - GA", "the template itself",
     _delta("squad_v2", sub="matched/")),
    ("... SQuAD 2.0, replies with a verdict only (control)", "EA - GA, parsed verdicts",
     "no-verdict replies", _delta("squad_v2", "delta_valid")),
    ("... SQuAD 2.0, matched template, replies with a verdict only (control)",
     "EA - GA, parsed verdicts",
     "template and no-verdict replies", _delta("squad_v2", "delta_valid", sub="matched/")),
    ("GA > EA on DROP (3.1)", "EA - GA", _T1, _delta("drop")),
    ("... DROP under the matched template (control)", "EA - GA", "the template itself",
     _delta("drop", sub="matched/")),
    ("... DROP, replies with a verdict only (control)", "EA - GA, parsed verdicts",
     "no-verdict replies", _delta("drop", "delta_valid")),
    ("GA > EA on HotpotQA (3.1)", "EA - GA", _T1, _delta("hotpotqa")),
    ("MuSiQue the exception: EA >= GA (3.1)", "EA - GA", "a judge that accepts or rejects all",
     _delta("musique", exception=True)),
    ("GA > EA with the forced choice, SQuAD 2.0", "EA_forced - GA", "a forced choice that accepts "
     "all", _delta("squad_v2", "delta_forced")),
    ("... does the judge tell right from wrong? SQuAD 2.0 (control)",
     "AUC of logit_diff against y*", _S1, _judge_auc("squad_v2")),
    ("... DROP (control)", "AUC of logit_diff against y*", _S1, _judge_auc("drop")),
    ("the judge reads the context 3-5x less (3.2)", "gen / eval context mass",
     "shares renormalised to the spans both prompts have", _ratio("context_ratio")),
    ("... SQuAD 2.0", "gen / eval context mass", "as above", _ratio("context_ratio",
                                                                   dataset="squad_v2")),
    ("... DROP", "gen / eval context mass", "as above", _ratio("context_ratio", dataset="drop")),
    ("... HotpotQA", "gen / eval context mass", "as above", _ratio("context_ratio",
                                                                  dataset="hotpotqa")),
    ("... MuSiQue", "gen / eval context mass", "as above", _ratio("context_ratio",
                                                                 dataset="musique")),
    ("... under the matched template (control)", "gen / eval context mass",
     "one system prompt for both tasks", _ratio("context_ratio", "matched/", control=True)),
    ("... renormalised to context+question+candidate (control)", "gen / eval content share",
     "the spans' total mass", _ratio("content_context_share_ratio", control=True)),
    ("... renormalised to context+question, the spans both prompts have (control)",
     "gen / eval context share", "the template's tokens", _ratio(
         "context_question_share_ratio", control=True)),
    ("... matched template, renormalised to context+question (control)", "gen / eval context share",
     "template and its tokens", _ratio("context_question_share_ratio", "matched/", control=True)),
    ("the judge barely reads the candidate (3.2)", "eval candidate mass", "mass per token",
     _candidate),
    ("LoRA-Gen over-accepts (3.3)", "acceptance of the base's wrong answers, LoRA-Gen - base",
     "judge coverage of the adapter", _transfer("lora_gen", "accept_wrong_base_answers", +1)),
    ("LoRA-Eval degrades generation (3.3)", "GA, LoRA-Eval - base", "paired base model",
     _transfer("lora_eval", "GA", -1)),
    *(row for a, sub in STEER_FACTORS for row in _steer_rows(a, sub)),
    ("the generator knows when its answer is right (its answer probability, SQuAD 2.0)",
     "AUROC of the answer's length-normalised probability", "chance (0.5)",
     _calib("calibration_summary", "all.cards.answer_prob", 0.5, +1)),
    ("... its residual stream before answering (probe on the generation prompt)",
     "AUROC, out of fold", "chance (0.5)",
     _calib("calibration_summary", "all.cards.probe_gen", 0.5, +1)),
    ("... the fresh judge of the same records reads it", "AUROC of the verdict probability",
     "chance (0.5)", _calib("calibration_summary", "all.cards.judge", 0.5, +1)),
    ("the self-check in the generator's conversation reads it better than the fresh judge",
     "AUROC, P(True) - fresh judge, paired", "the fresh judge on the same records",
     _calib("calibration_summary", "all.self_vs_judge.auc_self_minus_judge", 0.0, +1)),
    ("the state after the answer carries it into the fresh judge (patched at the best layer)",
     "d AUC, own state - another record's", "another record's state at the same position",
     _calib("calibration_summary", "all.patch.auc_own_minus_control", 0.0, +1, pick="max")),
    ("the self-check's verdict reads the position after the answer (blocked)",
     "abs(d logit_diff), blocked - unblocked (nats)", "an adjacent position blocked", _block),
    ("adding the generator's correctness direction makes the judge rank better (held out)",
     "d AUC at one median residual norm", "random directions of equal norm",
     _calib(("calibration_summary", "calibration_directions_summary"),
            "directions.steer.own.delta_auc", 0.0, +1,
            pick="norm=1.0")),
    ("lowering the generator's context attention (x0.25) lowers GA", "dGA, alpha 0.25", _ST,
     _steer("gen", "ga", "0.25", sign=-1)),
    ("where the verdict is decided: candidate swap, residual stream", "restored share",
     "system-prompt control", _patch("candidate-swap/resid")),
    ("... attention heads", "restored share", "system-prompt control",
     _patch("candidate-swap/heads")),
    ("... candidate swap on every bundled SQuAD 2.0 and DROP record, residual stream (a "
     "larger sample that contains the study's pairs: not a replication)",
     "restored share", "system-prompt control", _patch("candidate-swap/resid", "pool/")),
    ("... candidate swap on every bundled SQuAD 2.0 and DROP record, attention heads (a "
     "larger sample that contains the study's pairs: not a replication)",
     "restored share", "system-prompt control", _patch("candidate-swap/heads", "pool/")),
    ("... candidate swap kept at 0.5 nat, residual stream (the gap filter's sensitivity; "
     "its pairs contain the 1-nat pairs: not a replication)",
     "restored share", "system-prompt control", _patch("candidate-swap/resid", "gap/")),
    ("... candidate swap kept at 0.5 nat, attention heads (the gap filter's sensitivity; "
     "its pairs contain the 1-nat pairs: not a replication)",
     "restored share", "system-prompt control", _patch("candidate-swap/heads", "gap/")),
    ("... candidate swap under the matched template, whose judge separates right from wrong "
     "(SmolLM2), residual stream", "restored share", "its system-prompt control",
     _patch("candidate-swap/resid", "matched_swap/")),
    ("... candidate swap under the matched template, whose judge separates right from wrong "
     "(SmolLM2), attention heads", "restored share", "its system-prompt control",
     _patch("candidate-swap/heads", "matched_swap/")),
    ("... the matched template's system-prompt control", "restored share",
     "(this row is the control)", _patch("system-prompt-control/resid", "matched_swap/")),
    ("... the top head, chosen on half the passages, restores it on the other half (held out)",
     "restored share, held-out passages", "selection on disjoint passages", _held_out_head),
    ("... generator's run into the judge's: residual stream", "restored share",
     "system-prompt control", _patch("gen-to-eval/resid")),
    ("... generator's run into the judge's: attention heads", "restored share",
     "system-prompt control", _patch("gen-to-eval/heads")),
    ("... system-prompt control", "restored share", "(this row is the control)",
     _patch("system-prompt-control/resid")),
    ("a probe on the judge's residual stream beats its verdict score",
     "AUC within datasets, probe - judge's logit_diff (paired)", "the judge on the same records "
     "and folds", _probe("eval")),
    ("... a probe on the generation prompt, before the answer",
     "AUC within datasets, probe - judge's logit_diff (paired)", "the same", _probe("gen")),
    ("... on the other model's answers (across models)",
     "AUC within datasets, probe - judge's logit_diff (paired)", "the same", _probe_across),
    ("low context reading flags a wrong verdict (audit)", "AUC, low context mass",
     "chance (0.5), pooled over datasets", _audit),
    ("a reasoning judge judges better", "EA, reasoning - one word", "the one-word judge, paired",
     _reasoning("EA")),
    ("... forced choice after its reasoning (control)", "EA_forced, reasoning - one word",
     "the one-word judge, paired", _reasoning("EA_forced")),
    ("... tells right from wrong better (forced choice)", "acceptance gap right - wrong, "
     "reasoning - one word", "the one-word judge, paired", _reasoning("discrimination_forced")),
    ("... and reads the context more at its verdict (3.2, reasoning judge)",
     "verdict-position context mass, reasoning - one word", "the one-word judge, paired",
     _reasoning("verdict_context_mass", "+.3f")),
    ("the judge's verdict forms later than the generator's answer (logit lens)",
     "first layer from which the sign is the final one, share of depth", "the generator's "
     "answer token on the same records", _lens_depth("logit")),
    ("... through the tuned lens", "the same, tuned lens", "the same", _lens_depth("tuned")),
    ("a pairwise judge prefers the right answer wherever it stands", "content term "
     "(s1 - s2) / 2, nats", "the swapped order of the same pair", _pairwise("content")),
    ("... and one slot whatever it holds (position bias)", "position term (s1 + s2) / 2, nats",
     "the swapped order of the same pair", _pairwise("position")),
    ("... its verdict survives the swap more often than not", "position consistency",
     "the swapped order of the same pair", _pairwise("consistent")),
    ("... the top head of the swap, chosen on half the passages, carries it on the other half "
     "(held out)", "restored share of s2 - s1, test passages", "selection on disjoint passages",
     _pairwise_held_out("order_heads")),
    ("... the fewest units carrying half the position term, chosen on half the passages, "
     "carry half on the other half (held out)", "share of the position term, test passages",
     "selection on disjoint passages", _pairwise_held_out("position_units")),
    ("a model judges its own answers better than another's (3.1, self vs other)",
     "EA on own - on other's answers", "the other model's answers' GA",
     _cross("self_minus_other")),
    ("... better than the other model judges them (same answers)",
     "EA, self-judge - other judge", "the same answers", _cross("self_judge_minus_other")),
)
"""``(claim, measured quantity, deciding control, extractor)``: the rows of the report."""
