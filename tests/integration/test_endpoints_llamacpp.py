"""A real llama.cpp server (xllamacpp) on 127.0.0.1 serving the bundled SmolLM2 GGUF, 1 thread.

The forced choice from the server's log-probs against the server's own free log-probs and the
in-process model; Study 1 of the served model with its forced-choice fields; resume after the
server is stopped mid-run; a rerun with the server stopped makes no request.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("xllamacpp")

from interp.core.errors import EndpointError  # noqa: E402
from interp.endpoints import CACHE_FILE  # noqa: E402
from interp.endpoints.local import LocalServer  # noqa: E402
from interp.endpoints.oracle import endpoint_for  # noqa: E402
from interp.endpoints.scoring import score_replies  # noqa: E402
from interp.judging.verdict import score_verdicts  # noqa: E402
from interp.models.loading import bundled_gguf  # noqa: E402
from interp.stages.asymmetry import AsymmetryConfig, run  # noqa: E402
from interp.store.rundir import RunDir  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.served]

EXAMPLES = [
    {"id": "q0", "question": "What is the capital of France?",
     "context": "Paris is the capital of France.", "answers": ["Paris"]},
    {"id": "q1", "question": "Who wrote Hamlet?",
     "context": "Hamlet was written by Shakespeare.", "answers": ["Shakespeare"]},
]
EVAL = [{"role": "system", "content": "You are a grader. You reply with exactly one word: "
                                      "Correct or Incorrect."},
        {"role": "user", "content": "Question: What is the capital of France?\n\nProposed "
                                    "answer: Paris\n\nReply with exactly \"Correct\" or "
                                    "\"Incorrect\"."}]


@pytest.fixture(scope="module")
def server():
    srv = LocalServer(bundled_gguf("smollm2-135m-instruct"), "smollm2", threads=1,
                      n_ctx=1024).start(timeout_s=120)
    yield srv
    srv.stop()


def test_forced_choice_is_the_models_own_whole_reply_logprob(server, bundled):
    ep = endpoint_for("openai:smollm2", {"base_url": server.base_url}, None, "t")
    fc = ep.preflight()["forced_choice"]
    assert fc["method"].startswith("llama.cpp token grammar")
    # the server's template gives the same reply tokens as the local one ("In" + "correct")
    from interp.judging.verdict import verdict_replies

    local = verdict_replies(bundled.tokenizer)
    assert (fc["reply_ids"]["Correct"], fc["reply_ids"]["Incorrect"]) == (
        list(local.correct), list(local.incorrect))
    sc = score_replies(ep, EVAL, prompt_version="t")
    # another way on the same server: an unconstrained reply's top log-probs at position 1
    raw = ep._client.chat.completions.create(
        model="smollm2", messages=EVAL, max_tokens=1, temperature=0, logprobs=True,
        top_logprobs=20, extra_body={"cache_prompt": False})
    top = {getattr(t, "id", None) or (t.model_extra or {}).get("id"): t.logprob
           for t in raw.choices[0].logprobs.content[0].top_logprobs}
    assert local.correct[0] in top  # "Correct" is one token: its whole-reply log-prob
    assert sc["logprob_correct"] == pytest.approx(top[local.correct[0]], abs=1e-3)
    # another way off the server: the dequantised model in process (float32; the server
    # runs Q4_1 kernels, measured |diff| of logit_diff up to 0.8 nats on 30 records)
    ids = bundled.tokenizer.apply_chat_template(EVAL, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    mine = score_verdicts(bundled, [list(ids)])
    d_served = sc["logprob_correct"] - sc["logprob_incorrect"]
    assert abs(d_served - float(mine.logit_diff[0])) < 1.0
    assert (d_served > 0) == bool(mine.logit_diff[0] > 0)


@pytest.mark.parametrize("answer", ["Paris", "Berlin", "the Eiffel tower"])
def test_forced_choice_read_from_the_verdict_reply_equals_the_whole_forced_requests(
        server, answer, monkeypatch):
    """The verdict reply's top log-probs and a continuation on its slot: the forced values.

    They equal two forced requests that each evaluate the prompt whole (docs/endpoints.md),
    with no second evaluation of the prompt: the continuation's server evaluated one token.
    """
    from interp.endpoints.client import Endpoint
    from interp.endpoints.scoring import TOP_LOGPROBS

    msgs = [EVAL[0], {**EVAL[1], "content": EVAL[1]["content"].replace("Paris", answer)}]
    ep = endpoint_for("openai:smollm2", {"base_url": server.base_url}, None, "t")
    ep.preflight()
    seen, orig = [], Endpoint.continue_forced

    def spy(self, *a, **kw):
        seen.append(orig(self, *a, **kw))
        return seen[-1]

    monkeypatch.setattr(Endpoint, "continue_forced", spy)
    before = ep.requests
    with ep.slot() as sid:
        assert sid == 0  # one slot on this server
        r = ep.chat(msgs, prompt_version="t", max_tokens=4, logprobs=True,
                    top_logprobs=TOP_LOGPROBS, cache_prompt=False, id_slot=sid)
        new = score_replies(ep, msgs, prompt_version="t", reply=r, slot=sid)
    # the verdict request, then at most one continuation (none where the reply began "In")
    assert ep.requests - before == 1 + len(seen) <= 2
    assert all(v is not None for v in seen)  # the slot held the prompt: one token evaluated
    old = score_replies(ep, msgs, prompt_version="t")  # two whole forced requests
    assert ep.requests - before == 3 + len(seen)
    assert new["logprob_correct"] == pytest.approx(old["logprob_correct"], abs=1e-6)
    assert new["logprob_incorrect"] == pytest.approx(old["logprob_incorrect"], abs=1e-6)
    # a continuation on a slot that holds another prompt is discarded, not cached
    ep.chat(EVAL[:1], prompt_version="t", max_tokens=1, cache_prompt=False, id_slot=0)
    assert orig(ep, msgs, [788], [18382], prompt_version="u", slot=0) is None


def test_two_slots_and_two_examples_in_flight_give_the_one_slot_records(tmp_path):
    """``interp serve --parallel 2`` splits the context; with whole prompts the records match.

    Two llama.cpp servers of the same GGUF: one slot of 1,024 tokens, and two slots sharing
    2,048 (1,024 each, llama.cpp's split). With ``cache_prompt = false`` (each prompt evaluated
    whole, docs/endpoints.md) Study 1 with two examples in flight on the two-slot server gives
    the one-slot sequential run's records, in order: the same answers and verdicts, and the
    same log-probs up to what llama.cpp's batching of two slots' tokens into one forward moves
    them (it does not promise bit-identical logits across batch compositions; measured up to
    0.13 nats on 400-token prompts, docs/endpoints.md).
    """
    import httpx

    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in EXAMPLES))
    recs = {}
    for slots in (1, 2):
        with LocalServer(bundled_gguf("smollm2-135m-instruct"), "smollm2", threads=1,
                         n_ctx=1024 * slots, parallel=slots) as srv:
            listed = httpx.get(srv.base_url[:-3] + "/slots").json()
            assert [s["n_ctx"] for s in listed] == [1024] * slots
            cfg = AsymmetryConfig(model="openai:smollm2", datasets=[str(data)], n_boot=50,
                                  max_new_tokens=16, verdict_max_new_tokens=4,
                                  concurrency=slots,
                                  model_endpoint={"base_url": srv.base_url,
                                                  "cache_prompt": False})
            run(tmp_path / f"s{slots}", None, cfg, log=lambda s: None)
        recs[slots] = RunDir(tmp_path / f"s{slots}").read_records(status=None)
    assert [r["id"] for r in recs[1]] == ["q0", "q1"]
    assert all(isinstance(r["logit_diff"], float) for r in recs[1])
    lp = ("logprob_correct", "logprob_incorrect", "logit_diff", "p_correct", "verdict_coverage")
    assert [{k: v for k, v in r.items() if k not in lp} for r in recs[2]] == \
        [{k: v for k, v in r.items() if k not in lp} for r in recs[1]]
    for one, two in zip(recs[1], recs[2]):
        for k in lp:
            assert two[k] == pytest.approx(one[k], abs=0.25), k


def test_served_study_resumes_after_the_server_stops_and_reruns_from_the_cache(
        server, tmp_path):
    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in EXAMPLES))
    out = tmp_path / "run"
    cfg = AsymmetryConfig(model="openai:smollm2", datasets=[str(data)], limit=2, n_boot=50,
                          max_new_tokens=16, verdict_max_new_tokens=4,
                          model_endpoint={"base_url": server.base_url, "concurrency": 1,
                                          "max_retries": 0, "max_error_rate": 0.0})
    errors = []

    def go():
        try:
            run(out, None, cfg, chunk=1)
        except EndpointError as err:
            errors.append(err)

    t = threading.Thread(target=go)
    t.start()
    recs = out / "records.jsonl"
    while t.is_alive() and not (recs.exists() and recs.read_text().strip()):
        time.sleep(0.2)
    server.stop()  # mid-run: the second example's requests fail
    t.join()
    assert errors and "failed" in str(errors[0])
    kept = RunDir(out).read_records()
    assert [r["id"] for r in kept] == ["q0"]
    server.start(timeout_s=120)  # the same port: the cache's keys still match
    m = run(out, None, cfg)
    recs_now = RunDir(out).read_records()
    assert sorted(r["id"] for r in recs_now) == ["q0", "q1"]
    for r in recs_now:  # the forced choice, exactly as in-process
        assert r["logit_diff"] == pytest.approx(r["logprob_correct"] - r["logprob_incorrect"])
        assert 0 < r["verdict_coverage"] <= 1
    assert m["overall"]["EA_forced"] is not None and "EA_forced_unavailable" not in m["overall"]
    rows = [json.loads(line) for line in (out / CACHE_FILE).read_text().splitlines()]
    keys = [r["key"] for r in rows if "messages" in r["request"]]
    cont = [r for r in rows if "continue" in r["request"]]
    forced = [r for r in rows if "grammar" in r["request"].get("params", {})]
    # per example: gen, eval (its reply holds the first tokens' log-probs) and at most one
    # continuation of a reply after its first token; no whole forced request
    assert len(keys) == len(set(keys)) == 4 + len(cont) and len(cont) <= 2 and not forced
    server.stop()
    again = run(out, None, cfg)  # nothing to do and nothing asked: the server is gone
    assert again["overall"] == m["overall"]  # the module's last test: no restart
