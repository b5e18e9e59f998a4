"""The reasoning judge on the bundled SmolLM2 and two real SQuAD 2.0 records.

The forced choice after the judge's own reasoning equals one plain teacher-forced forward of
prompt + reasoning + each ending; every position of the verdict sequence has one label; the
verdict position's span masses and the reasoning-token means sum to 1 per row; a reply whose
own verdict word sits at the verdict position emits it there greedily.
"""

from __future__ import annotations

import pytest
import torch

from interp.data import load_examples
from interp.judging.prompts import get_template, render
from interp.judging.reasoning import REASONING_SPANS, judge_reasoning, verdict_endings


def test_reasoning_judge_bundled(bundled):
    tok = bundled.tokenizer
    exs = load_examples("squad_v2", split="validation", limit=2)
    tpl = get_template("reasoning")
    prompts = [render(tok, tpl, "eval", context=ex.context, question=ex.question,
                      answer=ex.answers[0]) for ex in exs]
    got = judge_reasoning(bundled, prompts, max_reasoning_tokens=24, batch_size=2,
                          reasoning_attention=True)
    ends = verdict_endings(tok)
    for p, j in zip(prompts, got):
        base = j.sequence[:-len(ends.shared)]
        for key, w in (("logprob_correct", ends.words[0]), ("logprob_incorrect", ends.words[1])):
            full = torch.tensor([[*base, *ends.shared, *w]])
            with torch.no_grad():
                lp = torch.log_softmax(bundled.model(input_ids=full).logits[0].double(), -1)
            want = sum(float(lp[len(base) - 1 + i, t]) for i, t in
                       enumerate([*ends.shared, *w]))
            assert j.scores[key] == pytest.approx(want, abs=1e-3)
        assert len(j.labels) == len(j.sequence) and set(j.labels) <= set(REASONING_SPANS)
        assert j.labels.count("reasoning") == j.n_reasoning
        assert {"context", "question", "candidate"} <= set(j.labels)
        ones = torch.ones(bundled.n_layers, bundled.n_heads)
        assert torch.allclose(j.verdict_mass.sum(-1), ones, atol=1e-4)
        assert j.reasoning_mass is not None
        assert torch.allclose(j.reasoning_mass.sum(-1), ones, atol=1e-4)
        if j.verdict_position_own:
            with torch.no_grad():
                nxt = bundled.model(input_ids=torch.tensor([j.sequence])).logits[0, -1].argmax()
            assert int(nxt) in (ends.words[0][0], ends.words[1][0])


@pytest.mark.parametrize("reply", [
    # replies of the findings run (Qwen2.5-Coder, SmolLM2), as generated
    "The proposed answer \"communication complexity\" matches this definition. Therefore, the "
    "final line is: Verdict: Correct.",
    "The context is 1979 to 1981. The proposed answer is 12 years. The final line is "
    "\"Verdict: Incorrect\"",
    "It matches the context.\nVerdict: Correct",
])
def test_reasoning_split_on_the_bundled_tokenizer(bundled, reply):
    """The reasoning tokens decode to the reply before its verdict (line or inline).

    Exactly, for a verdict line (it starts after a newline); for an inline verdict, up to the
    space that BPE joins to the token of ``Verdict`` or of its opening quote.
    """
    from interp.judging.reasoning import parse_final_verdict, split_reasoning

    tok = bundled.tokenizer
    ids = tok(reply, add_special_tokens=False)["input_ids"]
    fv = parse_final_verdict(reply)
    assert fv.verdict is not None
    k = split_reasoning(tok, ids, fv.start)
    head = tok.decode(ids[:k])
    assert reply[:fv.start].startswith(head) and reply[len(head):fv.start] in ("", " ")
    assert tok.decode(ids[k:]).strip() == reply[len(head):].strip()
    assert head == reply[:fv.start] or fv.inline
