"""Figures as a reader sees them, built from small synthetic tables: the matplotlib artists.

Proportions, where value labels sit against the whiskers, zero-height bars and zero-width
intervals, what the legend says about cells without a value, and no empty band above the
notes under a figure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from interp.analysis.stats import DEGENERATE_MARK, degenerate_note
from interp.plots.common import plt


@pytest.fixture
def captured(monkeypatch):
    """Keep the figure a ``plot_*`` function saves (open, drawn) instead of closing it."""
    figs: list = []

    from interp.plots.common import place_value_labels

    def keep(fig, out_dir, name):
        place_value_labels(fig)   # what save does before it writes the file
        fig.canvas.draw()
        figs.append(fig)
        return name

    import interp.plots.asymmetry
    import interp.plots.attention
    import interp.plots.compare
    import interp.plots.patching
    import interp.plots.steering

    for mod in (interp.plots.asymmetry, interp.plots.attention, interp.plots.compare,
                interp.plots.patching, interp.plots.steering):
        monkeypatch.setattr(mod, "save", keep)
    yield figs
    for f in figs:
        plt.close(f)


def _group(ga, ea, ci_ga, n=6, n_p=6):
    return {"n": n, "n_passages": n_p, "few_passages": n_p < 10,
            "note": f"only {n_p} passages", "GA": ga, "GA_ci": ci_ga, "EA": ea,
            "EA_ci": [max(ea - 0.2, 0), min(ea + 0.2, 1)], "EA_forced": ea,
            "EA_forced_ci": [max(ea - 0.1, 0), min(ea + 0.1, 1)], "delta": ea - ga,
            "delta_ci": [ea - ga - 0.3, ea - ga + 0.3], "delta_forced": 0.0,
            "delta_forced_ci": [0.0, 0.0],
            "verdicts_by_label": {"correct": {"accept": 1, "reject": 1, "none": 0},
                                  "incorrect": {"accept": 2, "reject": 1, "none": 1}},
            "acceptance_rate_correct_forced": 0.5, "acceptance_rate_incorrect_forced": 0.25}


METRICS = {"models": ["m"], "per_dataset": {
    "squad_v2": _group(0.5, 0.7, [0.2, 0.8]), "drop": _group(0.0, 0.4, [0.0, 0.0], n_p=2)},
    "overall": _group(0.25, 0.55, [0.1, 0.45], n=12, n_p=8)}


def _px(fig):
    return fig.canvas.get_renderer()


def _value_labels(fig):
    return [t for ax in fig.axes for t in ax.texts if t.get_gid() == "value_label"]


def _whiskers(ax):
    """Display-space boxes of every whisker segment of the axes' error bars."""
    boxes = []
    for c in ax.collections:
        for seg in getattr(c, "get_segments", lambda: [])():
            seg = np.asarray(seg)
            if len(seg) == 2 and np.isclose(seg[0, 0], seg[1, 0]) and seg[0, 1] != seg[1, 1]:
                boxes.append(ax.transData.transform(seg))
    return boxes


def _check_labels_beside_whiskers(fig):
    """Every value label sits clear of every whisker.

    Beside its bar's whisker at its value, or (moved clear of a neighbouring bar) above or
    under it.
    """
    labels = _value_labels(fig)
    assert labels
    r = _px(fig)
    for t in labels:
        ax = t.axes
        value = float(t.get_text().split("\n")[0])
        box = t.get_window_extent(r)
        x_bar = ax.transData.transform(t.xy)[0]
        if t.get_va() == "center":                       # beside the whisker:
            assert t.xy[1] == pytest.approx(value, abs=0.006)
            y_value = ax.transData.transform((t.xy[0], t.xy[1]))[1]
            assert box.y0 - 1 <= y_value <= box.y1 + 1   # at the value's height ...
            assert box.x0 > x_bar + 2 or box.x1 < x_bar - 2  # ... right or left of it
        else:                                            # above or under the whisker
            assert box.x0 < x_bar < box.x1
        for seg in _whiskers(ax):                        # and over no whisker at all
            x = seg[0, 0]
            lo, hi = sorted(seg[:, 1])
            assert not (box.x0 < x < box.x1 and box.y0 < hi and lo < box.y1), t.get_text()


def _check_no_band_above_notes(fig):
    """The notes start within 0.15 inch of the lowest other thing drawn."""
    r = _px(fig)
    notes = [t for t in fig.texts if t.get_gid() == "footnote"]
    assert len(notes) == 1
    others = [a.get_tightbbox(r) for a in fig.axes] + [lg.get_window_extent(r)
                                                       for lg in fig.legends]
    lowest = min(b.y0 for b in others if b is not None)
    gap = lowest - notes[0].get_window_extent(r).y1
    assert 0 <= gap <= 0.15 * fig.dpi
    box = notes[0].get_window_extent(r)
    assert box.x1 <= fig.bbox.x1  # filled to the figure's width: it never widens the file
    return " ".join(notes[0].get_text().split())  # the text, as one line


def test_asymmetry_figure_has_paper_proportions_and_labels_beside_whiskers(captured):
    from interp.plots.asymmetry import plot_asymmetry

    plot_asymmetry(METRICS, "unused")
    fig = captured[0]
    w, h = fig.get_size_inches()
    assert 0.8 <= w / h <= 1.6                      # not a 4:1 strip
    _check_labels_beside_whiskers(fig)
    texts = [t.get_text() for t in _value_labels(fig)]
    # drop's GA is 0 on [0, 0]: its bar has no height and no whisker, yet a mark and a label
    assert f"0.00\n{DEGENERATE_MARK}" in texts
    ga_ax = fig.axes[0]
    marks = [s for c in ga_ax.collections for s in c.get_segments()
             if len(s) == 2 and np.isclose(s[0][1], s[1][1]) and np.isclose(s[0][1], 0.0)
             and (s[1][0] - s[0][0]) > 0.2]
    assert marks, "the zero-height bar has no line at its value"
    assert ga_ax.get_ylim()[0] < 0                  # ... and that line is off the spine
    note = _check_no_band_above_notes(fig)
    assert degenerate_note() in note
    assert "* drop, squad_v2, overall: only N passages (N = 2, 6, 8)" in note
    assert note.count("only") == 1          # one line per fact, not one per group


def test_models_asymmetry_figure_stacks_panels_and_labels_clear_of_whiskers(captured):
    from interp.plots.compare import plot_models_asymmetry

    other = {**METRICS, "per_dataset": {"squad_v2": _group(0.9, 1.0, [0.7, 1.0])},
             "overall": _group(0.9, 1.0, [0.7, 1.0])}
    plot_models_asymmetry({"a": METRICS, "b": other}, "unused")
    fig = captured[0]
    w, h = fig.get_size_inches()
    assert 0.6 <= w / h <= 1.6
    assert len(fig.axes) == 3
    _check_labels_beside_whiskers(fig)
    note = _check_no_band_above_notes(fig)
    assert note.count(degenerate_note()) == 1      # once, not once per panel


def _units(rows):
    cols = ["layer", "unit", "head", "ratio", "ratio_attr", "n_exact", "n_pairs"]
    return pd.DataFrame([dict(zip(cols, r)) for r in rows])


def test_patching_legend_names_only_the_kinds_of_empty_cells_shown(captured):
    """Grey is 'not measured' only where no pair has the unit; other empty cells say why."""
    from matplotlib.colors import to_hex

    from interp.plots.patching import LEFT_OUT, NOT_EXACT, _pair_heat

    s = {"top_k": 8, "min_gap": 1.0}
    units = _units([(0, "head", 0, 0.5, 0.4, 1, 1),         # value
                    (0, "head", 1, np.nan, 0.2, 0, 0),      # attribution only (not top k)
                    (1, "head", 0, np.nan, np.nan, 1, 0),   # only in pairs |gap| < 1
                    (1, "head", 1, -0.3, -0.2, 1, 1)])
    _pair_heat(units, "head", [0, 1], ["0", "1"], "x", "t", None, "head", s)
    fig = captured[-1]
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert len(legend) == 2 and not any("not measured" in t for t in legend)
    assert any("outside the top 8" in t for t in legend)
    assert any("left out, measured only in pairs with |gap| < 1.0 nats" in t for t in legend)
    exact, attr = (next(a for a in fig.axes if a.get_title().startswith(t))
                   for t in ("exact", "attribution"))
    overlay = exact.images[1].get_array()
    assert to_hex(overlay[0, 1]) == to_hex(NOT_EXACT) and to_hex(overlay[1, 0]) == to_hex(
        LEFT_OUT)
    assert overlay[0, 0][3] == 0 and overlay[1, 1][3] == 0   # values show through
    assert to_hex(attr.images[1].get_array()[1, 0]) == to_hex(LEFT_OUT)

    missing = units[~((units.layer == 1) & (units["head"] == 0))].copy()
    missing.loc[missing["head"] == 1, ["ratio", "n_exact"]] = [0.1, 1]
    _pair_heat(missing, "head", [0, 1], ["0", "1"], "x", "t", None, "head", s)
    legend = [t.get_text() for lg in captured[-1].legends for t in lg.get_texts()]
    assert legend == ["grey: not measured (no such unit in any pair)"]

    full = _units([(0, "head", 0, 0.5, 0.4, 1, 1)])
    _pair_heat(full, "head", [0], ["0"], "x", "t", None, "head", s)
    assert not captured[-1].legends                 # nothing empty: nothing to explain


def test_steering_points_without_whiskers_are_named(captured):
    from interp.plots.steering import plot_steering

    def st(mean, ci):
        return {"mean": mean, "ci": ci, "n": 3}

    def alpha(m):
        return {"overall": {"ea_forced": st(m, [m - 0.2, m + 0.2]),
                            "accept_correct": st(1.0, [1.0, 1.0]),
                            "accept_incorrect": st(0.5, [0.2, 0.8]),
                            "context_mass": st(0.1, [0.05, 0.15])}}

    summary = {"n_records": 3, "n_passages": 3, "note": "only 3 passages", "heads": "all",
               "band": [2, 5], "eval": {"0.5": alpha(0.4), "1.0": alpha(0.5)},
               "gen": {"0.5": {"overall": {"ga": st(0.0, [0.0, 0.0]),
                                           "context_mass": st(0.2, [0.1, 0.3])}},
                       "1.0": {"overall": {"ga": st(1 / 3, [0.0, 1.0]),
                                           "context_mass": st(0.2, [0.1, 0.3])}}}}
    plot_steering(summary, "unused")
    fig = captured[0]
    judge = fig.axes[0].get_legend_handles_labels()[1]
    assert "acceptance | oracle Correct — CI (zero width) at every alpha" in judge
    assert "EA (forced choice)" in judge            # a line with whiskers is not marked
    gen = fig.axes[1].get_legend_handles_labels()[1]
    assert gen == ["GA (steered answers) — CI (zero width) at alpha 0.5"]
    assert fig.axes[1].get_ylim()[0] < 0            # a GA of 0 is not drawn on the spine
    note = _check_no_band_above_notes(fig)
    assert degenerate_note(3) in note and "a point without a whisker" in note


def _overlaps_when_saved(fig) -> list[tuple[str, str]]:
    """Pairs of (legend, footnote) whose boxes overlap in the figure as ``save`` writes it.

    Measured inside the draw that ``savefig(bbox_inches="tight")`` makes, where the figure's
    box has grown to hold the footnote (a legend placed by ``loc`` alone follows that box).
    """
    import io

    hits: list[tuple[str, str]] = []

    def measure(event):
        r = event.renderer
        notes = [t.get_window_extent(r) for t in fig.texts if t.get_gid() == "footnote"]
        for lg in fig.legends:
            b = lg.get_window_extent(r)
            hits.extend((lg.get_texts()[0].get_text(), "footnote") for n in notes
                        if b.overlaps(n))

    cid = fig.canvas.mpl_connect("draw_event", measure)
    fig.savefig(io.BytesIO(), format="png", dpi=72, bbox_inches="tight")
    fig.canvas.mpl_disconnect(cid)
    return hits


def test_figure_legends_stay_clear_of_the_footnote_in_the_saved_file(captured):
    from interp.plots.patching import _pair_heat

    s = {"top_k": 8, "min_gap": 1.0}
    units = _units([(0, "head", 0, 0.5, 0.4, 1, 1), (0, "head", 1, np.nan, 0.2, 0, 0),
                    (1, "head", 0, np.nan, np.nan, 1, 0)])
    _pair_heat(units, "head", [0, 1], ["0", "1"], "x", "t", None, "head", s,
               notes=["a note long enough to run under the legend " * 3] * 3)
    fig = captured[-1]
    assert fig.legends and [t for t in fig.texts if t.get_gid() == "footnote"]
    assert _overlaps_when_saved(fig) == []


def test_pairwise_labels_stand_upright_above_narrow_bars_and_a_small_swap_is_named(
        monkeypatch):
    """Narrow bars get upright labels over them; a swap under 1 nat is named.

    Four bars a group: each value label stands over its own bar, above the bar and its
    whisker, overlapping no other label; the heads figure says when the swap moves the
    letter score by under 1 nat.
    """
    import interp.plots.pairwise as pw

    figs: list = []

    def keep(fig, out_dir, name):
        fig.canvas.draw()
        figs.append(fig)
        return name
    monkeypatch.setattr(pw, "save", keep)

    def st(m, lo, hi):
        return {"mean": m, "ci": [lo, hi], "n": 40, "n_passages": 30}
    group = {"accurate": st(0.0, 0.0, 0.0), "consistent": st(0.1, 0.02, 0.2),
             "flip_first": st(0.85, 0.7, 0.95), "flip_second": st(0.05, 0.0, 0.1),
             "n": 40, "n_passages": 30}
    lens = [st(0.1 * i, 0.1 * i - 0.1, 0.1 * i + 0.1) for i in range(5)]
    summary = {"model": "m", "band": [2, 3], "n_pairs": 80, "n_passages": 60, "outcomes": {
        "squad_v2": group, "drop": group, "all": group},
        "lens": {"content": lens, "position": lens},
        "patching": {"heads": [[0.1, 0.2], [0.3, -0.1]], "gap": st(-0.2, -0.3, -0.1)},
        "position": {"heads_mean": [[0, 0], [0, 0], [0.5, 0.1], [0.2, -0.3]]},
        "held_out": {"order_heads": [{"unit": "L3.H0"}], "position_units": {"units": ["L2.H0"]}}}
    pw.plot_pairwise(summary, "unused")
    orders, heads = figs
    labels = _value_labels(orders)
    assert len(labels) == 12 and all(t.get_rotation() == 90 for t in labels)
    r = _px(orders)
    boxes = [t.get_window_extent(r) for t in labels]
    for i, (t, b) in enumerate(zip(labels, boxes)):
        ax = t.axes
        x_px, top_px = ax.transData.transform(t.xy)
        assert b.x0 < x_px < b.x1 and b.y0 >= top_px            # over its bar, above its top
        value = float(t.get_text().split()[0])
        assert t.xy[1] >= value                                   # the whisker's top or higher
        assert not any(b.overlaps(o) for o in boxes[i + 1:]), t.get_text()
    notes = " ".join(t.get_text() for t in heads.texts if t.get_gid() == "footnote")
    assert "-0.20 nats on average" in " ".join(notes.split())
    for f in figs:
        plt.close(f)


TINY_RUN = __import__("pathlib").Path(__file__).parents[2] / "data" / "tiny_run"
"""The stored tables of a small real run (tests/data/SOURCES.md): records made in the order
squad_v2, drop, hotpotqa."""


def _boxes_overlap(a, b, slack=0.5):
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > slack
            and min(a.y1, b.y1) - max(a.y0, b.y0) > slack)


def _check_no_label_collides(fig):
    """No value label overlaps another, nor a bar (or its whisker) other than its own."""
    r = _px(fig)
    for ax in fig.axes:
        labels = [t for t in ax.texts if t.get_gid() == "value_label"]
        boxes = [t.get_window_extent(r) for t in labels]
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                assert not _boxes_overlap(boxes[i], boxes[j]), (labels[i].get_text(),
                                                                labels[j].get_text())
        bars = [p for p in ax.patches if isinstance(p, __import__("matplotlib").patches.Rectangle)
                and p.get_gid() is None and 0 < p.get_width() < 1]   # the bars, not a band
        for t, box in zip(labels, boxes):
            for p in bars:
                if abs(p.get_x() + p.get_width() / 2 - t.xy[0]) < 1e-9:
                    continue                                      # its own bar
                assert not _boxes_overlap(box, p.get_window_extent(r)), t.get_text()
            for seg in _whiskers(ax):
                x = seg[0, 0]
                if abs(x - ax.transData.transform(t.xy)[0]) < 0.5:
                    continue                                      # its own whisker
                lo, hi = sorted(seg[:, 1])
                assert not (box.x0 < x < box.x1 and box.y0 < hi and lo < box.y1), t.get_text()


def test_figures_of_a_real_run_have_one_note_per_fact_and_no_colliding_labels(captured):
    import json

    from interp.methods.asymmetry import format_metrics
    from interp.plots.asymmetry import plot_asymmetry
    from interp.plots.attention import plot_context_ratio

    metrics = json.loads((TINY_RUN / "metrics.json").read_text())
    summary = json.loads((TINY_RUN / "attention_summary.json").read_text())
    plot_asymmetry(metrics, "unused")
    plot_context_ratio(summary, "unused")
    asym, ratio = captured
    for fig in (asym, ratio):
        _check_no_label_collides(fig)
        note = _check_no_band_above_notes(fig)
        assert note.count("few independent units") == 1      # one footnote per fact
    note = _check_no_band_above_notes(asym)
    assert "* drop, hotpotqa, squad_v2: only N passages (< 10)" in note
    assert "(N = 4, 3, 4)" in note and note.count("EA_forced = GA by construction") <= 1
    # the legend of the ratio panel covers neither a bar, the paper's band nor the frame
    ax = ratio.axes[1]
    r = _px(ratio)
    legend = ax.get_legend().get_window_extent(r)
    assert not _boxes_overlap(legend, ax.get_window_extent(r))
    # one dataset order: the tables, their printout and every figure's ticks
    order = ["drop", "hotpotqa", "squad_v2"]
    assert list(metrics["per_dataset"]) == order == list(summary["per_dataset"])
    printed = [line.split()[0] for line in format_metrics(metrics).splitlines()[2:6]]
    assert printed == [*order, "overall"]
    for fig in (asym, ratio):
        ticks = [t.get_text().split("\n")[0] for t in fig.axes[0].get_xticklabels()]
        assert ticks == [*order, "overall"]


def test_every_table_orders_datasets_one_way_whatever_the_record_order():
    from interp.core.names import dataset_order, in_dataset_order
    from interp.plots.common import dataset_groups

    assert dataset_order(["squad_v2", "drop", "squad_v2", "hotpotqa"]) == [
        "drop", "hotpotqa", "squad_v2"]
    made_earlier = {"per_dataset": {"squad_v2": {"n": 2}, "drop": {"n": 1}},
                    "overall": {"n": 3}}                  # a table stored in record order
    assert [d for d, _ in in_dataset_order(made_earlier["per_dataset"])] == ["drop", "squad_v2"]
    assert [d for d, _ in dataset_groups(made_earlier)[0]] == ["drop", "squad_v2", "overall"]


def test_notes_that_differ_only_in_counts_share_one_line():
    from interp.analysis.stats import merge_notes

    assert merge_notes([("drop", "accepts all 4 answers: EA_forced = GA"),
                        ("overall", "accepts all 12 answers: EA_forced = GA"),
                        ("squad_v2", "rejects all 4 answers: EA_forced = 1 - GA")]) == [
        "drop, overall: accepts all N answers: EA_forced = GA (N = 4, 12)",
        "squad_v2: rejects all 4 answers: EA_forced = 1 - GA"]
    assert merge_notes([("a", "n = 3 of 5"), ("b", "n = 4 of 6")]) == [
        "a, b: n = N1 of N2 (N1 = 3, 4; N2 = 5, 6)"]
    assert merge_notes([("a", "same"), ("b", "same")]) == ["a, b: same"]
