"""The whole-reply verdict score on the bundled model equals one full teacher-forced forward."""

from __future__ import annotations

import pytest

from interp.judging.verdict import score_verdicts, verdict_replies
from tests.unit.judging.test_verdict import _teacher_forced

pytestmark = pytest.mark.integration


def test_replies_are_whole_words_as_the_template_renders_them(smol_tok):
    r = verdict_replies(smol_tok)
    assert smol_tok.decode(r.correct) == "Correct"
    assert smol_tok.decode(r.incorrect) == "Incorrect"
    # SmolLM2 splits "Incorrect" into In + correct: the first-token proxy compared Correct/In
    assert r.tokens["Incorrect"] == ["In", "correct"] and len(r.correct) == 1


def test_score_equals_teacher_forcing_bundled(bundled):
    """The cached two-step score equals one full forward of prompt + reply.

    On a float64 copy of the bundled model to 1e-7 (the algorithm is exact); in float32 to
    1e-4 relative (summation order only: CI's CPU moved a log-probability of -4.4284 by 4.8e-5,
    1.1e-5 relative, between the padded batch and the single forward; a wrong position or
    token moves it by whole nats).
    """
    import copy

    from interp.data import load_examples
    from interp.judging.prompts import get_template, render
    from interp.models.loading import ModelHandle

    tpl = get_template()
    exs = load_examples("squad_v2", limit=1)
    prompts = [render(bundled.tokenizer, tpl, "eval", context=e.context, question=e.question,
                      answer=a).input_ids for e in exs for a in (e.answers[0], "Paris")]
    r = verdict_replies(bundled.tokenizer)
    h64 = ModelHandle(copy.deepcopy(bundled.model).double(), bundled.tokenizer, bundled.spec,
                      dict(bundled.info))
    for handle, bs, tol in ((h64, 4, dict(abs=1e-7)), (bundled, 4, dict(rel=1e-4))):
        sc = score_verdicts(handle, prompts, batch_size=bs)
        for k, p in enumerate(prompts):
            assert float(sc.logprob_correct[k]) == pytest.approx(
                _teacher_forced(handle.model, p, r.correct), **tol)
            assert float(sc.logprob_incorrect[k]) == pytest.approx(
                _teacher_forced(handle.model, p, r.incorrect), **tol)
