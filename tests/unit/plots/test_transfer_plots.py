"""Transfer figures: degenerate judges are named, the figures draw from a table."""

from __future__ import annotations

from interp.plots.transfer import judge_notes, plot_transfer_acceptance, plot_transfer_matrix


def _group(ga: float, accept: int, reject: int, none: int) -> dict:
    n = accept + reject + none
    return {"n": n, "n_passages": n, "GA": ga, "EA": 0.5, "verdicts": {
        "accept": accept, "reject": reject, "none": none},
        "acceptance_rate_correct": accept / n, "acceptance_rate_incorrect": accept / n}


TABLE = {
    "self": {"base": {"squad_v2": _group(0.3, 12, 15, 23)},
             "lora_gen": {"squad_v2": _group(0.2, 5, 4, 41)},
             "lora_eval": {"squad_v2": _group(0.14, 0, 50, 0)},
             "lora_both": {"squad_v2": _group(0.26, 50, 0, 0)}},
    "judge_base_answers": {"lora_eval": {"squad_v2": _group(0.3, 0, 50, 0)}},
}


def test_judge_notes_name_constant_and_mostly_unparseable_judges():
    notes = judge_notes(TABLE)
    assert notes == [
        "base, squad_v2 (own answers): 23 of 50 verdicts unparseable (EA counts them as "
        "wrong)",
        "lora_gen, squad_v2 (own answers): 41 of 50 verdicts unparseable (EA counts them as "
        "wrong)",
        "lora_eval, squad_v2 (own answers): rejects all 50: EA = 1 - GA by construction",
        "lora_both, squad_v2 (own answers): accepts all 50: EA = GA by construction",
        "lora_eval, squad_v2 (base answers): rejects all 50: EA = 1 - GA by construction",
    ]
    assert judge_notes({"self": {"m": {"d": _group(0.5, 10, 10, 9)}}}) == []  # 9 < 29/3


def test_transfer_figures_are_written_with_the_model_in_the_title(tmp_path):
    for plot in (plot_transfer_matrix, plot_transfer_acceptance):
        path = plot(TABLE, tmp_path, model="smollm2-135m-instruct")
        assert path.exists() and path.stat().st_size > 10_000


def test_transfer_figures_with_one_adapter(tmp_path):
    """A run of one adapter (``adapters = ["lora_eval"]``): two rows, one patching curve."""
    from interp.plots.transfer import plot_transfer_patching

    one = {"self": {m: TABLE["self"][m] for m in ("base", "lora_eval")},
           "judge_base_answers": TABLE["judge_base_answers"]}
    assert judge_notes(one) == [
        "base, squad_v2 (own answers): 23 of 50 verdicts unparseable (EA counts them as "
        "wrong)",
        "lora_eval, squad_v2 (own answers): rejects all 50: EA = 1 - GA by construction",
        "lora_eval, squad_v2 (base answers): rejects all 50: EA = 1 - GA by construction"]
    for plot in (plot_transfer_matrix, plot_transfer_acceptance):
        path = plot(one, tmp_path, model="smollm2-135m-instruct")
        assert path.exists() and path.stat().st_size > 10_000
    patching = {"positions": "all", "n_prompts": 2, "adapters": {"lora_eval": {
        "layers": [0, 1], "fraction_a_to_b": [0.4, 1.0], "fraction_b_to_a": [0.7, 1.0],
        "mean_abs_change": 0.8}}}
    path = plot_transfer_patching(patching, tmp_path)
    assert path.exists() and path.stat().st_size > 10_000
