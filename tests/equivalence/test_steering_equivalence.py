"""Attention steering agrees across backends.

The ``hf`` attention function and TransformerLens's ``hook_attn_scores`` give the same
whole-reply verdict scores (replies of several tokens), to 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest

from interp.methods.steering import steer_judge


@pytest.mark.parametrize("units", [{0: None, 1: None}, {1: [0, 3]}])
def test_hf_and_transformer_lens_steer_alike(multi_on_disk, multi_prompts, units):
    _, prompt = multi_prompts
    ctx = prompt.token_spans["context"]
    alphas = [0.25, 1.0, 8.0]
    hf = steer_judge(multi_on_disk, prompt.input_ids, ctx, units, alphas, band=[0, 1])
    tl = steer_judge(multi_on_disk, prompt.input_ids, ctx, units, alphas, band=[0, 1],
                     backend="transformer_lens")
    for k in ("logprob_correct", "logprob_incorrect", "logit_diff"):
        np.testing.assert_allclose(tl[k], hf[k], atol=1e-4)
    # steering moves the verdict: the test is not satisfied by two unsteered runs
    assert np.abs(hf["logit_diff"] - hf["logit_diff"][1]).max() > 1e-2
