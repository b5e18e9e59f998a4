"""The whole-reply verdict score equals an independent teacher-forced computation."""

from __future__ import annotations

import pytest
import torch

from interp.core.errors import PromptError
from interp.judging.verdict import score_verdicts, verdict_replies


def _teacher_forced(model, prompt, reply) -> float:
    """Return log P(reply | prompt) from ONE full forward of prompt + reply (no cache)."""
    ids = torch.tensor([list(prompt) + list(reply)])
    lp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
    return float(sum(lp[len(prompt) - 1 + k, t] for k, t in enumerate(reply)))


def _prompts(tokenizer, n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    msgs = [[{"role": "user", "content": " ".join(
        str(int(x)) for x in torch.randint(0, 999, (int(k),), generator=g))}]
        for k in torch.randint(3, 40, (n,), generator=g)]
    return [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                          return_dict=True)["input_ids"] for m in msgs]


@pytest.mark.parametrize("batch_size", [1, 3])
def test_score_equals_teacher_forcing_tiny(tiny, batch_size):
    prompts = _prompts(tiny.tokenizer)
    r = verdict_replies(tiny.tokenizer)
    sc = score_verdicts(tiny, prompts, batch_size=batch_size)
    for k, p in enumerate(prompts):
        assert float(sc.logprob_correct[k]) == pytest.approx(
            _teacher_forced(tiny.model, p, r.correct), abs=1e-5)
        assert float(sc.logprob_incorrect[k]) == pytest.approx(
            _teacher_forced(tiny.model, p, r.incorrect), abs=1e-5)
    cov = sc.coverage
    assert bool(((cov > 0) & (cov <= 1)).all())
    assert torch.allclose(sc.p_correct, torch.sigmoid(sc.logit_diff))
    rows = sc.rows()
    assert set(rows[0]) == {"logprob_correct", "logprob_incorrect", "logit_diff", "p_correct",
                            "verdict_coverage"}


def test_reply_split_differently_still_whole_word():
    """A tokenizer whose 'Incorrect' begins with a common word start ('In').

    The score is the whole-word one, not logit(Correct) - logit(In).
    """
    from interp.testing import tiny_llama, tiny_tokenizer

    tokenizer = tiny_tokenizer(vocab_size=280)  # Incorrect = I + nc + orrect, Correct = C + orrect
    assert tokenizer.tokenize("Incorrect")[0] == "I"
    h = tiny_llama(tokenizer, n_layers=2, seed=3)
    prompts = _prompts(tokenizer, n=3, seed=1)
    sc = score_verdicts(h, prompts, batch_size=2)
    r = verdict_replies(tokenizer)
    for k, p in enumerate(prompts):
        logits = h.model(input_ids=torch.tensor([p])).logits[0, -1].double()
        first_token_proxy = float(logits[r.correct[0]] - logits[r.incorrect[0]])
        whole = (_teacher_forced(h.model, p, r.correct)
                 - _teacher_forced(h.model, p, r.incorrect))
        assert float(sc.logit_diff[k]) == pytest.approx(whole, abs=1e-5)
        assert abs(first_token_proxy - whole) > 1e-3


def test_template_that_rewrites_the_reply_is_refused(tokenizer):
    class Odd:
        chat_template = "x"

        def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False):
            text = "".join(f"<{m['role']}>{m['content'].upper()}" for m in msgs)
            return text + ("<assistant>" if add_generation_prompt else "")

    with pytest.raises(PromptError):
        verdict_replies(Odd())
