"""The reasoning judge on a tiny random Llama: final-line parser, forced choice, spans, masses.

* :func:`interp.judging.reasoning.parse_final_verdict` reads the LAST verdict line (several lines,
  none, negated, markdown, an echo of the instruction), or an inline verdict ending the last
  line (replies of the bundled models, quoted), never an echo naming both verdicts.
* The forced choice after the judge's reasoning equals an independent teacher-forced
  computation (one plain forward of prompt + reasoning + each whole ending).
* Every position of the verdict sequence has one span label; span masses sum to 1 per row and
  equal the masses of rows recorded independently; the reasoning-token mean equals a mean
  over eager attention rows.
* A judge-only rerun (:func:`interp.methods.asymmetry.judge_records`) of the harness's own records
  with the one-word template gives the harness's verdicts and scores exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import interp.judging.reasoning as reasoning
from interp.analysis.span_mass import span_mass
from interp.core.errors import PromptError
from interp.data import QAExample
from interp.hooks.recorder import record_rows
from interp.judging.grading import RuleOracle
from interp.judging.prefill import PromptPass
from interp.judging.prompts import get_template, render
from interp.judging.reasoning import (
    REASONING_SPANS,
    judge_reasoning,
    parse_final_verdict,
    split_reasoning,
    verdict_endings,
)
from interp.methods.asymmetry import evaluate_examples, group_metrics, judge_records

CTX = "The Eiffel Tower is in Paris. It was built in 1889 by Gustave Eiffel's company."


@pytest.mark.parametrize("text, verdict", [
    ("The context says Paris.\nVerdict: Correct", True),
    ("The context says Lyon.\nVerdict: Incorrect\n", False),
    # several verdict lines: the last one decides
    ("Verdict: Correct\nWait, the context says 1889.\nVerdict: Incorrect", False),
    ("Verdict: Incorrect\nOn second thought it matches.\nFinal verdict: Correct", True),
    # none: verdict words inside the reasoning are no verdict line
    ("The proposed answer is correct.", None),
    ("The answer is incorrect because the context says 1889.", None),
    ("", None),
    # negated
    ("It does not match.\nVerdict: Not correct", False),
    ("Verdict: not incorrect", True),
    # markdown
    ("Step 1: ...\n**Verdict:** Incorrect", False),
    ("**Verdict: Correct**", True),
    ("### Verdict: **Incorrect**", False),
    ("- verdict: correct", True),
    ("> Verdict : Correct.", True),
    # an echo of the instruction decides nothing; an earlier real verdict line still does
    ('I must end with "Verdict: Correct" or "Verdict: Incorrect".', None),
    ("Verdict: Correct or Incorrect", None),
    ("Verdict: Incorrect\nVerdict: Correct or Incorrect", False),
])
def test_parse_final_verdict(text, verdict):
    got = parse_final_verdict(text)
    assert got.verdict is verdict and not got.inline
    if verdict is None:
        assert got.start is None and got.line is None
    else:
        assert text[got.start:].strip().startswith(got.line)


@pytest.mark.parametrize("text, verdict, phrase", [
    # Qwen2.5-Coder's and SmolLM2's replies in the findings run (tails, as generated)
    ("The proposed answer matches this information. Therefore, the final line is: Verdict: "
     "Correct.", True, "Verdict: Correct."),
    ('... so it cannot be correct. The final line is "Verdict: Incorrect".', False,
     '"Verdict: Incorrect".'),
    ('The proposed answer is correct. The final line is: "Verdict: Correct"', True,
     '"Verdict: Correct"'),
    ("Therefore, the proposed answer is correct. Verdict: Correct", True, "Verdict: Correct"),
    ("The final line is \"Verdict: Correct", True, "\"Verdict: Correct"),  # cut by the budget
    ("Sydney, Australia\n\nJudge: Verdict: Incorrect\n\nFinal line: Verdict: Correct", True,
     "Verdict: Correct"),
    # a verdict line earlier, an inline verdict on a later line: the later one decides
    ("Verdict: Incorrect\nOn reflection it matches, so the final line is: Verdict: Correct.",
     True, "Verdict: Correct."),
])
def test_inline_verdict_ending_the_reply(text, verdict, phrase):
    got = parse_final_verdict(text)
    assert got.verdict is verdict and got.inline and got.line == phrase
    assert text[got.start:] == phrase  # the reasoning is everything before the phrase


@pytest.mark.parametrize("text", [
    # an echo of the instruction names both verdicts: nothing decides
    'I must end with "Verdict: Correct" or "Verdict: Incorrect".',
    'The context is not exactly "Verdict: Incorrect" but "Verdict: Incorrect"',
    # the phrase does not end the reply
    'The final line is "Verdict: Incorrect" and the answer is incorrect.',
    "So my verdict: correct, since the context names Paris and the candidate says Paris too",
    # not the last line
    "It matches. The final line is: Verdict: Correct.\nLet me check the context again.",
    # no verdict word after the colon
    "Therefore, the final line is: Verdict:",
])
def test_no_inline_verdict(text):
    got = parse_final_verdict(text)
    assert got.verdict is None and got.start is None and not got.inline


def test_final_line_offset_is_the_last_line():
    text = "Verdict: Correct\nHmm.\nVerdict: Incorrect"
    got = parse_final_verdict(text)
    assert got.start == text.rindex("Verdict") and got.line == "Verdict: Incorrect"


def test_endings_and_split(tiny_tokenizer):
    ends = verdict_endings(tiny_tokenizer)
    assert ends.shared and ends.words[0] != ends.words[1]
    for w, word in zip(ends.words, ("Correct", "Incorrect")):
        assert tiny_tokenizer.decode([*ends.shared, *w]) == f"Verdict: {word}"
    text = "It says Paris, so it matches.\nVerdict: Correct"
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    k = split_reasoning(tiny_tokenizer, ids, parse_final_verdict(text).start)
    assert tiny_tokenizer.decode(ids[:k]) == "It says Paris, so it matches.\n"
    assert split_reasoning(tiny_tokenizer, ids, None) == len(ids)
    assert split_reasoning(tiny_tokenizer, ids, 0) == 0


def test_endings_refused_when_unscorable():
    class Same:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [1, 2, 3]}
    with pytest.raises(PromptError, match="no word past it"):
        verdict_endings(Same())


def _prompts(tok, answers=("Paris", "Lyon", "1889")):
    tpl = get_template("reasoning")
    return [render(tok, tpl, "eval", context=CTX, question="Where is the Eiffel Tower?",
                   answer=a) for a in answers]


def _teacher_forced(handle, ids, ending):
    """Log P(ending | ids) from one plain forward of ids + ending (no cache, no padding)."""
    full = torch.tensor([[*ids, *ending]])
    with torch.no_grad():
        lp = torch.log_softmax(handle.model(input_ids=full).logits[0].double(), -1)
    n = len(ids)
    return float(sum(lp[n - 1 + i, t] for i, t in enumerate(ending)))


def test_forced_choice_after_reasoning_is_teacher_forced(tiny):
    prompts = _prompts(tiny.tokenizer)
    got = judge_reasoning(tiny, prompts, max_reasoning_tokens=9, batch_size=2,
                          reasoning_attention=True)
    ends = verdict_endings(tiny.tokenizer)
    for p, j in zip(prompts, got):
        assert j.sequence[:len(p)] == p.input_ids
        assert j.sequence[len(p):len(p) + j.n_reasoning] == j.token_ids[:j.n_reasoning]
        assert j.sequence[-len(ends.shared):] == list(ends.shared)
        base = j.sequence[:-len(ends.shared)]  # prompt + reasoning (+ inserted newline)
        for key, w in (("logprob_correct", ends.words[0]), ("logprob_incorrect", ends.words[1])):
            want = _teacher_forced(tiny, base, [*ends.shared, *w])
            assert j.scores[key] == pytest.approx(want, abs=2e-4)
        lc, li = j.scores["logprob_correct"], j.scores["logprob_incorrect"]
        assert j.scores["logit_diff"] == pytest.approx(lc - li)
        assert j.scores["verdict_coverage"] == pytest.approx(np.exp(lc) + np.exp(li))
        assert 0 < j.scores["verdict_coverage"] <= 1
        # labels: one per position, the reasoning tokens labelled reasoning
        assert len(j.labels) == len(j.sequence) and set(j.labels) <= set(REASONING_SPANS)
        assert j.labels[:len(p)] == p.labels
        assert j.labels.count("reasoning") == j.n_reasoning
        # masses: every row sums to 1; the verdict position's equals an independent recording
        assert torch.allclose(j.verdict_mass.sum(-1), torch.ones(tiny.n_layers, tiny.n_heads),
                              atol=1e-5)
        rows = record_rows(tiny, j.sequence, attn="eager").rows
        assert torch.allclose(j.verdict_mass, span_mass(rows, j.labels, REASONING_SPANS),
                              atol=1e-4)
        if j.n_reasoning:
            assert torch.allclose(j.reasoning_mass.sum(-1),
                                  torch.ones(tiny.n_layers, tiny.n_heads), atol=1e-5)
            full = record_rows(tiny, j.sequence, act_layers=list(range(tiny.n_layers)),
                               patterns=True).acts["pattern"]  # [layer, head, q, k]
            q = slice(len(p) - 1, len(p) + j.n_reasoning - 1)
            want = span_mass(full[:, :, q].float(), j.labels, REASONING_SPANS).mean(2)
            assert torch.allclose(j.reasoning_mass, want, atol=1e-4)


def _judge_reply(tiny, monkeypatch, reply: str, answer: str):
    """The reasoning judge on one prompt whose decode (step 1) returns ``reply``."""
    tok = tiny.tokenizer
    ids = tok(reply, add_special_tokens=False)["input_ids"]
    real = reasoning.run_prompts

    def fake(handle, prompts, **kw):
        if kw.get("max_new_tokens"):  # step 1: the decode
            return [PromptPass(text=tok.decode(ids), token_ids=list(ids), stop="eos")
                    for _ in prompts]
        return real(handle, prompts, **kw)

    monkeypatch.setattr(reasoning, "run_prompts", fake)
    p = _prompts(tok, (answer,))[0]
    (j,) = judge_reasoning(tiny, [p], max_reasoning_tokens=40)
    return p, ids, j


def test_verdict_position_of_a_reply_with_a_verdict_line(tiny, monkeypatch):
    """A reply that reasons and ends 'Verdict: Incorrect': its reasoning, verdict and position."""
    tok = tiny.tokenizer
    reply = "The context says Paris, not Lyon.\nVerdict: Incorrect"
    p, ids, j = _judge_reply(tiny, monkeypatch, reply, "Lyon")
    ends = verdict_endings(tok)
    assert j.verdict.verdict is False and j.verdict.line == "Verdict: Incorrect"
    assert tok.decode(j.token_ids[:j.n_reasoning]) == "The context says Paris, not Lyon.\n"
    assert j.verdict_position_own
    # the verdict position is the one after "Verdict:": the next token of the reply is its word
    pos = j.verdict_position
    assert pos == len(p) + j.n_reasoning + len(ends.shared) - 1
    assert ids[pos - len(p) + 1] == ends.words[1][0]
    f = j.to_fields()
    assert f["reasoning"] == "The context says Paris, not Lyon.\n"
    assert f["verdict_source"] == "verdict_line" and f["verdict_text"] == reply
    assert f["hit_budget"] is False


def test_verdict_position_of_a_reply_with_an_inline_verdict(tiny, monkeypatch):
    """An inline verdict: the reasoning stops before the phrase and a newline is forced."""
    tok = tiny.tokenizer
    reply = "The context says Paris. Therefore, the final line is: Verdict: Correct."
    p, _, j = _judge_reply(tiny, monkeypatch, reply, "Paris")
    ends = verdict_endings(tok)
    head = "The context says Paris. Therefore, the final line is: "
    assert j.verdict.verdict is True and j.verdict.inline
    assert tok.decode(j.token_ids[:j.n_reasoning]) == head
    # not its own position: the reply had no newline before its verdict phrase
    assert not j.verdict_position_own
    assert j.sequence[len(p) + j.n_reasoning:] == [*ends.newline, *ends.shared]
    f = j.to_fields()
    assert f["verdict_source"] == "inline_verdict" and f["reasoning"] == head
    assert f["verdict_line"] == "Verdict: Correct."


def test_judge_records_rerun_equals_harness(tiny):
    exs = [QAExample(id=f"q{i}", dataset="toy", context=CTX, question=q, answers=(a,),
                     answerable=True, split="validation")
           for i, (q, a) in enumerate((("Where is the Eiffel Tower?", "Paris"),
                                       ("When was it built?", "1889"),
                                       ("Who built it?", "Gustave Eiffel's company")))]
    tpl = get_template("default")
    recs = evaluate_examples(tiny, exs, template=tpl, oracle=RuleOracle(), max_new_tokens=4,
                             verdict_max_new_tokens=3, batch_size=2)
    again, passes = judge_records(tiny, recs, template=tpl, verdict_max_new_tokens=3,
                                  batch_size=3)
    for a, b, v in zip(recs, again, passes):
        for k in ("verdict", "verdict_text", "verdict_source", "oracle_label", "answer",
                  "generation", "prompts"):
            assert a[k] == b[k], k
        for k in ("logprob_correct", "logprob_incorrect", "p_correct", "verdict_coverage"):
            assert a[k] == pytest.approx(b[k], abs=1e-5), k
        assert b["answers_from"] == a["model"] and v is not None
    # the reasoning judge on the same records: same answers and labels, its own verdict fields
    rr, js = judge_records(tiny, recs, template=get_template("reasoning"),
                           max_reasoning_tokens=6, rows=True)
    assert [r["answer"] for r in rr] == [r["answer"] for r in recs]
    assert all(r["template"] == "reasoning" and r["reasoning_tokens"] <= 6 for r in rr)
    assert all(r["reasoning_stop"] in ("eos", "max_new_tokens") for r in rr)
    assert all(j.verdict_mass is not None for j in js)
    m = group_metrics(rr, n_boot=10)
    assert m["n"] == 3 and m["GA"] == pytest.approx(np.mean([r["oracle_label"] for r in recs]))
    assert m["verdicts"]["none"] == sum(r["verdict"] is None for r in rr)


def test_harness_refuses_one_pass_with_reasoning_judge(tiny):
    from interp.core.errors import ConfigError
    from interp.judging.prefill import Capture

    ex = QAExample(id="q", dataset="toy", context=CTX, question="Where?", answers=("Paris",),
                   answerable=True, split="validation")
    with pytest.raises(ConfigError, match="one_pass = false"):
        evaluate_examples(tiny, [ex], template=get_template("reasoning"), oracle=RuleOracle(),
                          capture=Capture())


def test_stage_side_by_side_resumes(tiny, tmp_path):
    """The stage on a tiny run: paired table, figure, stored masses, resume, bad template."""
    import json

    from interp.core.errors import ConfigError
    from interp.stages.asymmetry import AsymmetryConfig
    from interp.stages.asymmetry import run as run_asymmetry
    from interp.stages.reasoning import ReasoningConfig
    from interp.stages.reasoning import run as run_reasoning
    from interp.store import RunDir

    cfg = AsymmetryConfig(model="tiny-llama", datasets=["squad_v2"], limit=4, batch_size=2,
                          max_new_tokens=4, verdict_max_new_tokens=3, n_boot=20)
    run_asymmetry(tmp_path, tiny, cfg, log=lambda s: None)
    rd = RunDir(tmp_path)
    lines: list[str] = []
    rc = ReasoningConfig(max_reasoning_tokens=5, batch_size=3, n_boot=20, band="all")
    res = run_reasoning(rd, tiny, rc, log=lines.append)
    n_ok = len(rd.read_records())
    g = res["overall"]
    assert g["n"] == n_ok and res["unpaired"] == 0
    assert g["reasoning_judge"]["n_hit_budget"] + sum(
        r["reasoning_stop"] == "eos" for r in RunDir(tmp_path / "reasoning").read_records()
    ) == n_ok
    for k in ("EA", "EA_forced", "acceptance_rate_incorrect", "verdict_context_mass"):
        s = g[k]
        assert s["delta"] == pytest.approx(s["reasoning"] - s["word"])
    stored = json.loads((tmp_path / "reasoning" / "side_by_side.json").read_text())
    assert stored["overall"]["n"] == n_ok
    assert (tmp_path / "figures" / "reasoning_side_by_side.png").exists()
    assert "| EA |" in (tmp_path / "reasoning" / "side_by_side.md").read_text()
    lines.clear()
    run_reasoning(rd, tiny, rc, log=lines.append)
    assert f"{n_ok} already judged" in lines[0]
    # a record judged under another verdict rule (its stored reply reads otherwise now) is
    # judged again; the others are kept
    out = RunDir(tmp_path / "reasoning")
    recs = out.read_records(status=None)
    old = dict(recs[0], verdict_text="It matches. The final line is: Verdict: Correct.",
               reasoning="It matches. The final line is: Verdict: Correct.", verdict=None)
    out.drop_records([(old["dataset"], old["id"])])
    out.append_records([old])
    lines.clear()
    run_reasoning(rd, tiny, rc, log=lines.append)
    assert f"{n_ok - 1} already judged" in lines[0]
    again = {(r["dataset"], r["id"]): r for r in out.read_records(status=None)}
    assert len(again) == n_ok and again[(old["dataset"], old["id"])]["verdict_text"] == \
        recs[0]["verdict_text"]  # greedy: the same reply, judged again
    with pytest.raises(ConfigError, match="not a reasoning judge"):
        run_reasoning(rd, tiny, ReasoningConfig(template="default"))


def test_reasoning_run_is_refused_by_attention_and_the_stage_is_a_command(tiny, tmp_path):
    """A reasoning-judged run is refused by attention and the reasoning stage, in one line.

    The stage's command and its ``[reasoning]`` table come from the contract.
    """
    from typer.testing import CliRunner

    from interp import cli, stages
    from interp.core.errors import ConfigError
    from interp.stages import attention
    from interp.stages.asymmetry import AsymmetryConfig
    from interp.stages.asymmetry import run as run_asymmetry
    from interp.stages.reasoning import ReasoningConfig
    from interp.stages.reasoning import run as run_reasoning
    from interp.store import RunDir

    cfg = AsymmetryConfig(model="tiny-llama", datasets=["squad_v2"], limit=2, batch_size=2,
                          max_new_tokens=3, max_reasoning_tokens=3, n_boot=10,
                          template="reasoning")
    run_asymmetry(tmp_path, tiny, cfg, log=lambda s: None)
    rd = RunDir(tmp_path)
    assert rd.read_records(status=None)
    with pytest.raises(ConfigError, match=r"^\[attention\] .* judged by a reasoning template"):
        attention.run(rd, tiny, attention.AttentionConfig(band="all"), log=lambda s: None)
    assert not (tmp_path / "attention" / "records").exists()
    with pytest.raises(ConfigError, match=r"^\[reasoning\] .* judged by a reasoning template"):
        run_reasoning(rd, tiny, ReasoningConfig(band="all"))
    # every stage that reads the one-word verdict position refuses it the same way
    from interp.stages import patching, probe, record, steering

    for mod, c in ((steering, steering.SteeringConfig(band="all", limit=1)),
                   (patching, patching.PatchingConfig(limit=1, band="all")),
                   (probe, probe.ProbeConfig(layers="all", folds=2)),
                   (record, record.RecordConfig(band="all"))):
        with pytest.raises(ConfigError, match=rf"^\[{mod.SPEC.name}\] .* judged by a reasoning"):
            mod.run(rd, tiny, c, log=lambda s: None)
        assert not (tmp_path / mod.SPEC.folder).exists(), mod.SPEC.name
    res = CliRunner().invoke(cli.app, ["reasoning", "--help"])
    assert res.exit_code == 0 and "--max-reasoning-tokens" in res.output
    assert "reasoning" in stages.STAGES
    got = ReasoningConfig.from_mapping({"limit": "all", "batch_size": 2})
    assert got.limit is None and got.batch_size == 2


def test_discrimination_is_the_acceptance_gap_not_ea():
    """Synthetic pairs, 3 right answers of 12: rejecting more gains EA; the gap says more.

    The acceptance gap (Youden's J) is 0 for a judge that accepts all, whatever its EA.
    """
    import numpy as np

    from interp.methods.reasoning_compare import side_by_side

    y = [i < 3 for i in range(12)]

    def recs(accept, p):
        return [{"dataset": "squad_v2", "id": f"r{i}", "context": f"passage {i}",
                 "status": "ok", "oracle_label": y[i], "verdict": accept(i),
                 "p_correct": p(i), "verdict_coverage": 0.5} for i in range(12)]
    word = recs(lambda i: True, lambda i: 0.9)               # accepts all: J = 0, EA = 0.25
    reason = recs(lambda i: i in (0, 3), lambda i: 0.9 if i in (0, 1, 3) else 0.1)
    keys = {("squad_v2", f"r{i}"): np.zeros(3) for i in range(12)}
    masses = {"word": keys, "verdict": {k: np.zeros(6) for k in keys}, "reasoning": {}}
    g = side_by_side(word, reason, masses, ["context", "question", "candidate"],
                     n_boot=50)["overall"]
    # reasoning accepts 1 of 3 right and 1 of 9 wrong: EA 0.75 (1 + 8 of 12), J 1/3 - 1/9
    assert (g["EA"]["word"], g["EA"]["reasoning"]) == pytest.approx((0.25, 0.75))
    assert g["discrimination"]["word"] == pytest.approx(0.0)
    assert g["discrimination"]["reasoning"] == pytest.approx(1 / 3 - 1 / 9)
    # forced: 2 of 3 right, 1 of 9 wrong accepted
    assert g["discrimination_forced"]["delta"] == pytest.approx(2 / 3 - 1 / 9)
    lo, hi = g["discrimination"]["delta_ci"]
    assert lo <= g["discrimination"]["delta"] <= hi


@pytest.mark.parametrize("reply, verdict", [
    # cut inside its <think> (the budget ran out): the draft verdict in it decides nothing
    ("<think>The candidate says Paris.\nVerdict: Correct\nWait, the context says Lyon", None),
    ("<thinking>Verdict: Incorrect", None),
    # after the LAST </think> only: drafts inside the reasoning are skipped
    ("<think>draft\nVerdict: Correct</think>\nVerdict: Incorrect", False),
    ("<think>a</think><think>Verdict: Incorrect</think>\nVerdict: Correct", True),
    # only the closing tag generated (the opening one sent by the chat template)
    ("Verdict: Incorrect, says my draft.\n</think>\nVerdict: Correct", True),
    ("no markup at all\nVerdict: Incorrect", False),
])
def test_every_verdict_reader_reads_after_the_last_think(reply, verdict):
    """One rule for every reader of a judge's reply.

    The one-word judge's parser, the record verdict of Study 1 (and of the served oracle), and
    the reasoning judge's final line.
    """
    from interp.judging.judge import parse_record_verdict
    from interp.judging.parsing import parse_verdict, reasoning_end

    fv = parse_final_verdict(reply)
    assert fv.verdict is verdict
    if verdict is None:
        assert fv.start is None and reasoning_end(reply) is None
    else:  # the deciding line lies after the reasoning, at its offset in the whole reply
        assert fv.start >= reasoning_end(reply) > 0 or reasoning_end(reply) == 0
        assert reply[fv.start:].strip() == fv.line
    # the final line's verdict equals what the one-word parser reads after the reasoning
    assert parse_verdict(reply) is verdict
    assert parse_record_verdict(reply, "Paris")[0] is verdict
