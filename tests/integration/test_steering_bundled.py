"""Attention steering on the bundled SmolLM2 ("Incorrect" is two tokens: In + correct)."""

from __future__ import annotations

import numpy as np
import pytest

from interp.data import load_examples
from interp.judging.prompts import get_template, render
from interp.judging.verdict import score_verdicts
from interp.methods.steering import steer_judge

pytestmark = pytest.mark.integration


def test_steered_judge_on_the_bundled_model(bundled):
    ex = load_examples("squad_v2", limit=1)[0]
    p = render(bundled.tokenizer, get_template(), "eval", context=ex.context,
               question=ex.question, answer="Paris")
    ctx = p.token_spans["context"]
    band = list(range(22, 30))
    units = {layer: None for layer in band}
    out = steer_judge(bundled, p.input_ids, ctx, units, [0.25, 1.0, 4.0], band=band)
    # alpha = 1 is the unsteered whole-reply score of the harness
    ref = float(score_verdicts(bundled, [p.input_ids]).logit_diff[0])
    assert out["logit_diff"][1] == pytest.approx(ref, abs=1e-4)
    assert out["context_mass"][0] < out["context_mass"][1] < out["context_mass"][2]
    tl = steer_judge(bundled, p.input_ids, ctx, {26: [0, 4], 29: None}, [0.25, 4.0],
                     band=band, backend="transformer_lens")
    hf = steer_judge(bundled, p.input_ids, ctx, {26: [0, 4], 29: None}, [0.25, 4.0],
                     band=band)
    np.testing.assert_allclose(tl["logit_diff"], hf["logit_diff"], atol=1e-4)
