"""The front door on the bundled model: run_with_cache + span_mass is the stored number."""

from __future__ import annotations

import numpy as np
import pytest

from interp import HookedModel, case
from interp.core.layers import parse_layers
from interp.stages.stored import load_masses

pytestmark = pytest.mark.integration


def test_span_mass_of_run_with_cache_equals_the_stored_attention(bundled, quick_run):
    """run_with_cache + span_mass reproduces the stored span masses of a real run.

    For recorded records, both prompts: ``case`` re-renders exactly the stored prompts, and the
    cache's band mean of context, question and candidate mass equals the ``mass.{task}`` the
    stage stored (its one-pass recordings, batched and left-padded).
    """
    records, mass, spans, _ = load_masses(quick_run)
    model = HookedModel(bundled)
    band = parse_layers("last8", bundled.n_layers)
    worst = 0.0
    for i, rec in enumerate(records[:3]):
        c = case(bundled.tokenizer, rec)
        assert c.judge is not None and c.answer == rec["answer"]
        for task, prompt in (("gen", c.gen), ("eval", c.judge)):
            _, cache = model.run_with_cache(prompt, names=[], logits="last")
            for span in ("context", "question", "candidate"):
                if span not in prompt.labels:
                    continue
                stored = float(np.float64(mass[task][i][band][:, :, spans.index(span)]).mean())
                live = cache.span_mass(span, "last8")
                worst = max(worst, abs(live - stored))
                assert live == pytest.approx(stored, abs=1e-6), (rec["id"], task, span)
    assert worst < 1e-6
