"""Endpoint oracle and served Study 1 against a fake OpenAI server (pytest-httpserver).

Faults: 429 with Retry-After, 500, a timeout, a malformed JSON body, no choices, 401; each
retried or refused as docs/endpoints.md says, with nothing lost. No model is loaded.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from werkzeug import Response

from interp.core.errors import ConfigError, EndpointError, ModelSpecError
from interp.endpoints import CACHE_FILE, Endpoint, EndpointConfig, RequestCache, RequestFailed
from interp.endpoints.client import DeadlineTransport
from interp.judging.grading import make_oracle
from interp.judging.prompts import chat_messages, get_template
from interp.methods.asymmetry import format_metrics
from interp.models.loading import load_model
from interp.stages.asymmetry import AsymmetryConfig, oracle_agreement, run
from interp.stages.common import load_run_model
from interp.store import RunDir

KEY = "sk-test-Zq8FAKEKEY0123456789"

EXAMPLES = [
    {"id": f"q{i}", "question": q, "context": c, "answers": [a]}
    for i, (q, c, a) in enumerate([
        ("What is the capital of France?", "Paris is the capital of France.", "Paris"),
        ("Who wrote Hamlet?", "Hamlet was written by Shakespeare.", "Shakespeare"),
        ("What colour is the sky?", "The sky is blue on a clear day.", "blue"),
    ])]


def completion(content: str | None = "OK", choices: bool = True) -> dict:
    return {"id": "c1", "object": "chat.completion", "created": 0, "model": "fake",
            "system_fingerprint": "fp_test",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}]
            if choices else []}


def reply_for(body: dict) -> str:
    """The fake model: answers with the gold of its example, accepts every answer."""
    system = body["messages"][0]["content"]
    user = body["messages"][-1]["content"]
    if "response_format" in body:
        return json.dumps({"verdict": "Incorrect"})
    if system.startswith("You answer questions"):
        return next((e["answers"][0] for e in EXAMPLES if e["question"] in user), "?")
    if "grader" in system:
        return "Hmm" if "Shakespeare" in user and "strict" in system else "Correct"
    return "OK"


MODELS = {"object": "list", "data": [{"id": "fake", "object": "model", "created": 1,
                                      "owned_by": "test"}]}


def fake_server(httpserver, key: str | None = None):
    seen = {"auth": set(), "chat": 0}

    def chat(request):
        seen["auth"].add(request.headers.get("Authorization"))
        seen["chat"] += 1
        return Response(json.dumps(completion(reply_for(request.get_json()))),
                        content_type="application/json")

    httpserver.expect_request("/v1/models").respond_with_json(MODELS)
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(chat)
    return seen


def endpoint(httpserver, tmp_path=None, **kw) -> Endpoint:
    cfg = EndpointConfig.from_spec("openai:fake", {"base_url": httpserver.url_for("/v1"),
                                                   "max_retries": 2, "timeout_s": 5, **kw})
    return Endpoint(cfg, RequestCache(tmp_path / CACHE_FILE if tmp_path else None))


MSGS = [{"role": "user", "content": "Say OK."}]


def chat_posts(httpserver) -> int:
    return sum(r.path == "/v1/chat/completions" for r, _ in httpserver.log)


def chat_lines(run_dir) -> list[dict]:
    """The cached chat requests of a run (not the preflight's facts)."""
    rows = [json.loads(line) for line in (run_dir / CACHE_FILE).read_text().splitlines()]
    return [r for r in rows if "messages" in r["request"]]


@pytest.fixture
def data_file(tmp_path):
    p = tmp_path / "tiny.jsonl"
    p.write_text("".join(json.dumps(e) + "\n" for e in EXAMPLES))
    return str(p)


def test_429_waits_for_retry_after_then_succeeds(httpserver):
    fake_server(httpserver)
    ep = endpoint(httpserver)
    ep.preflight()
    httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_response(
        Response("slow down", status=429, headers={"Retry-After": "1"}))
    before, t0 = chat_posts(httpserver), time.monotonic()
    out = ep.chat([{"role": "user", "content": "again"}], prompt_version="t", max_tokens=4)
    assert out["content"] == "OK" and out["system_fingerprint"] == "fp_test"
    assert time.monotonic() - t0 >= 0.95  # the server's Retry-After was honoured
    assert chat_posts(httpserver) - before == 2
    assert (ep.requests, ep.failed) == (1, 0)


def test_500_is_retried_and_the_answer_cached(httpserver, tmp_path):
    fake_server(httpserver)
    ep = endpoint(httpserver, tmp_path)
    ep.preflight()
    httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_data(
        "boom", status=500)
    before = chat_posts(httpserver)
    assert ep.chat(MSGS, prompt_version="t", max_tokens=4)["content"] == "OK"
    assert chat_posts(httpserver) - before == 2
    # the same request again, from a new object on the same run dir: no request
    again = endpoint(httpserver, tmp_path)
    assert again.chat(MSGS, prompt_version="t", max_tokens=4)["content"] == "OK"
    assert chat_posts(httpserver) - before == 2 and again.cache.hits == 1
    assert len(chat_lines(tmp_path)) == 1


def test_malformed_body_and_no_choices_are_retried(httpserver):
    fake_server(httpserver)
    ep = endpoint(httpserver)
    ep.preflight()
    httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_data(
        '{"choices": [', content_type="application/json")
    httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_json(
        completion(choices=False))
    before = chat_posts(httpserver)
    assert ep.chat(MSGS, prompt_version="t", max_tokens=4)["content"] == "OK"
    assert chat_posts(httpserver) - before == 3
    assert ep.failed == 0


def test_a_trickled_reply_is_cut_at_the_total_deadline_of_each_try(httpserver, tmp_path):
    """A 200 reply sent a few bytes at a time cannot stretch a try past ``timeout_s``.

    The body (valid JSON) arrives in 16 pieces 0.25 s apart, 4 s in all: no single read waits
    over 1 s, so httpx's per-read timeout alone let the first try take the whole 4 s and
    succeed with ``timeout_s = 1``. Each try now ends at 1 s (:class:`DeadlineTransport`).
    """
    fake_server(httpserver)
    ep = endpoint(httpserver, tmp_path, timeout_s=1, max_retries=1, max_error_rate=1.0)
    ep.preflight()
    body = json.dumps(completion()).encode()
    step = -(-len(body) // 16)

    def trickle(request):
        def pieces():
            for i in range(0, len(body), step):
                time.sleep(0.25)
                yield body[i:i + step]
        return Response(pieces(), content_type="application/json")

    for _ in range(2):
        httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_handler(trickle)
    t0 = time.monotonic()
    with pytest.raises(RequestFailed, match="Timeout"):
        ep.chat([{"role": "user", "content": "trickle"}], prompt_version="t", max_tokens=4)
    assert time.monotonic() - t0 < 3.5      # two tries of 1 s and the backoff between them
    assert chat_posts(httpserver) >= 2 and (ep.requests, ep.failed) == (1, 1)
    assert chat_lines(tmp_path) == []


def test_deadline_transport_passes_a_prompt_reply_whole(httpserver):
    """Within the deadline the transport changes nothing: the reply is read whole."""
    httpserver.expect_request("/x").respond_with_data(b"a" * 100_000)
    with httpx.Client(transport=DeadlineTransport(5.0)) as client:
        assert client.get(httpserver.url_for("/x")).content == b"a" * 100_000


def test_timeout_fails_the_request_after_retries_and_caches_nothing(httpserver, tmp_path):
    fake_server(httpserver)
    ep = endpoint(httpserver, tmp_path, timeout_s=0.3, max_retries=1, max_error_rate=1.0)
    ep.preflight()

    def slow(request):
        time.sleep(0.8)
        return Response(json.dumps(completion()), content_type="application/json")

    for _ in range(2):
        httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_handler(slow)
    t0 = time.monotonic()
    with pytest.raises(RequestFailed, match="Timeout"):
        ep.chat([{"role": "user", "content": "slow"}], prompt_version="t", max_tokens=4)
    assert time.monotonic() - t0 < 5
    assert (ep.requests, ep.failed) == (1, 1)
    assert chat_lines(tmp_path) == []  # the preflight's facts only


def test_the_error_rate_line_names_the_last_failure_a_client_timeout(httpserver):
    """Failures that are client timeouts: the line says so, and how to give a try more time."""
    fake_server(httpserver)
    ep = endpoint(httpserver, timeout_s=0.3, max_retries=0, max_error_rate=0.05)
    ep.preflight()

    def slow(request):
        time.sleep(0.6)
        return Response(json.dumps(completion()), content_type="application/json")

    for _ in range(2):
        httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_handler(slow)
    with pytest.raises(RequestFailed, match="Timeout"):
        ep.chat([{"role": "user", "content": "a"}], prompt_version="t", max_tokens=4)
    with pytest.raises(EndpointError) as err:
        ep.chat([{"role": "user", "content": "b"}], prompt_version="t", max_tokens=4)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"2 of 2 requests to {ep.base_url} failed (the last: APITimeoutError")
    assert msg.endswith("A client timeout: each try may take timeout_s = 0.3 s; a slow or "
                        "loaded server needs more (--timeout-s, or timeout_s in the endpoint "
                        "table).")


def test_timeout_s_from_the_command_line_replaces_both_tables():
    cfg = AsymmetryConfig.from_mapping({"model": "openai:m", "oracle": "openai:o",
                                        "timeout_s": 240,
                                        "model_endpoint": {"timeout_s": 5, "concurrency": 2}})
    assert cfg.endpoint_table("model") == {"timeout_s": 240, "concurrency": 2}
    assert cfg.endpoint_table("oracle") == {"timeout_s": 240}
    plain = AsymmetryConfig.from_mapping({"model": "openai:m", "model_endpoint": {"timeout_s": 5}})
    assert plain.endpoint_table("model") == {"timeout_s": 5}
    assert plain.endpoint_table("oracle") is None


def test_error_rate_stops_with_one_line(httpserver):
    fake_server(httpserver)
    ep = endpoint(httpserver, max_retries=0, max_error_rate=0.05)
    ep.preflight()
    for _ in range(2):
        httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_data(
            "x", status=503)
    # 0.05 * max(n, 20) = 1: the first failure is tolerated, the second stops the run
    with pytest.raises(RequestFailed):
        ep.chat([{"role": "user", "content": "a"}], prompt_version="t", max_tokens=4)
    with pytest.raises(EndpointError, match=r"2 of 2 requests .* failed \(the last: "
                                            r"InternalServerError: status 503: .*\), more than "
                                            r"max_error_rate"):
        ep.chat([{"role": "user", "content": "b"}], prompt_version="t", max_tokens=4)


def test_401_refused_in_preflight_without_the_key(httpserver, monkeypatch):
    monkeypatch.setenv("MY_KEY", KEY)
    httpserver.expect_request("/v1/models").respond_with_json(
        {"error": {"message": f"Incorrect API key provided: {KEY}"}}, status=401)
    ep = endpoint(httpserver, api_key_env="MY_KEY")
    t0 = time.monotonic()
    with pytest.raises(EndpointError) as err:
        ep.preflight()
    msg = str(err.value)
    assert "refused the API key (401)" in msg and "$MY_KEY" in msg
    assert KEY not in msg and KEY[-6:] not in msg and "\n" not in msg
    assert time.monotonic() - t0 < 5
    assert KEY not in repr(ep)


def test_unset_key_variable_wrong_model_and_unreachable_server(httpserver, monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(EndpointError, match="NO_SUCH_KEY_VAR, which is not set"):
        endpoint(httpserver, api_key_env="NO_SUCH_KEY_VAR")
    fake_server(httpserver)
    cfg = EndpointConfig.from_spec("openai:other", {"base_url": httpserver.url_for("/v1")})
    with pytest.raises(EndpointError, match=r"does not serve model 'other'; it serves \['fake'\]"):
        Endpoint(cfg).preflight()
    from interp.endpoints.local import free_port

    dead = EndpointConfig.from_spec("openai:fake", {
        "base_url": f"http://127.0.0.1:{free_port()}/v1", "timeout_s": 2})
    t0 = time.monotonic()
    with pytest.raises(EndpointError, match="cannot reach http://127.0.0.1"):
        Endpoint(dead).preflight()
    assert time.monotonic() - t0 < 10


def test_config_rules(monkeypatch):
    with pytest.raises(ConfigError, match=r"unknown keys \['base'\]"):
        EndpointConfig.from_spec("openai:m", {"base": "x"})
    with pytest.raises(ConfigError, match="concurrency = 0 is out of range"):
        EndpointConfig.from_spec("openai:m", {"concurrency": 0})
    with pytest.raises(ConfigError, match="is not openai:MODEL"):
        EndpointConfig.from_spec("openai:", None)
    for var in ("OPENAI_API_KEY", "INTERP_OPENAI_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    # OpenAI's own endpoint (the default) needs a key; a local server does not
    with pytest.raises(EndpointError, match="OPENAI_API_KEY is not set, and "
                                            "https://api.openai.com/v1 needs a key"):
        EndpointConfig.from_spec("openai:m")
    assert EndpointConfig.from_spec("openai:m", {"base_url": "http://127.0.0.1:8080/v1"})
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    cfg = EndpointConfig.from_spec("openai:m")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://b/v1/")
    assert cfg.resolved_base_url() == "http://b/v1"
    monkeypatch.setenv("INTERP_OPENAI_BASE_URL", "http://a/v1")
    assert cfg.resolved_base_url() == "http://a/v1"
    assert EndpointConfig.from_spec("openai:m", {"base_url": "http://c/v1"}
                                    ).resolved_base_url() == "http://c/v1"
    with pytest.raises(ModelSpecError, match="served behind an endpoint"):
        load_model("openai:m")


def test_oracle_fallback_order_without_log_probs(httpserver):
    fake_server(httpserver)
    oracle = make_oracle("openai:fake", endpoint={"base_url": httpserver.url_for("/v1")})
    kw = {"dataset": "squad", "extras": {"context": "c", "question": "q"}}
    assert oracle.grade("Paris", ["Paris"], **kw).rule == "openai:reply:Correct"
    # "Hmm" holds no verdict; the server has no /apply-template (no forced choice), so the
    # JSON-schema constrained choice decides
    g = oracle.grade("Shakespeare", ["Shakespeare"], **kw)
    assert (g.label, g.rule) == (False, "openai:constrained:Incorrect")
    assert oracle.grade("x", [], dataset="squad", answerable=False).rule.startswith(
        "unanswerable")
    assert oracle.counts == {"reply": 1, "forced_choice": 0, "constrained": 1, "none": 0,
                             "rule": 1}
    assert oracle.endpoint.facts["forced_choice"] is None


def test_a_served_answer_after_a_blank_line_is_read_as_in_process(httpserver, tmp_path,
                                                                   data_file):
    """A reply of a blank line, the gold answer, then more lines is read as that answer.

    As the in-process harness reads it. The fake server honours ``stop`` as llama.cpp does
    (cut at the first occurrence): with the old newline stop every answer was "" and graded
    wrong (GA 0.0).
    """
    def chat(request):
        body = request.get_json()
        text = reply_for(body)
        if body["messages"][0]["content"].startswith("You answer questions"):
            text = f"\n{text}\nMore text."
        for stop in body.get("stop") or []:
            text = text.split(stop, 1)[0]
        return Response(json.dumps(completion(text)), content_type="application/json")

    httpserver.expect_request("/v1/models").respond_with_json(MODELS)
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(chat)
    cfg = AsymmetryConfig(model="openai:fake", datasets=[data_file], limit=3, n_boot=50,
                          model_endpoint={"base_url": httpserver.url_for("/v1")})
    m = run(tmp_path / "run", None, cfg, log=lambda s: None)
    recs = RunDir(tmp_path / "run").read_records()
    assert [r["answer"] for r in recs] == ["Paris", "Shakespeare", "blue"]
    assert [r["generation"] for r in recs] == ["\nParis\n", "\nShakespeare\n", "\nblue\n"]
    assert m["overall"]["GA"] == 1.0
    from interp.endpoints.study import first_line

    assert first_line("Paris\nx") == "Paris\n" and first_line(" \n\n Rome") == " \n\n Rome"
    assert first_line("") == "" and first_line("\n\nA\nB") == "\n\nA\n"


def test_served_study_without_scores_caches_and_never_writes_the_key(
        httpserver, tmp_path, data_file, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    seen = fake_server(httpserver)
    out = tmp_path / "run"
    cfg = AsymmetryConfig(model="openai:fake", datasets=[data_file], limit=3, n_boot=50,
                          model_endpoint={"base_url": httpserver.url_for("/v1"),
                                          "concurrency": 2})
    m = run(out, None, cfg)
    assert seen["auth"] == {f"Bearer {KEY}"}  # the key is sent ...
    recs = RunDir(out).read_records()
    assert [r["answer"] for r in recs] == ["Paris", "Shakespeare", "blue"]
    assert all(r["verdict"] is True and r["verdict_score"] == "unavailable" for r in recs)
    assert all("logit_diff" not in r for r in recs)
    o = m["overall"]
    assert (o["GA"], o["EA"]) == (1.0, 1.0)
    assert o["EA_forced"] is None and o["delta_forced"] is None and o["auc_logit_diff"] is None
    assert o["EA_forced_unavailable"].startswith("unavailable")
    table = format_metrics(m)
    assert "EA_forced unavailable" in table
    manifest = RunDir(out).manifest()
    assert manifest["model"]["server"]["system_fingerprint"] == "fp_test"
    assert manifest["result_facts"]["endpoint_models"][0]["id"] == "fake"
    assert manifest["result_facts"]["forced_choice"] is None
    assert len(chat_lines(out)) == 6  # gen + eval per example; no forced-choice requests
    # ... and never written: not in any file of the run dir, nor in what was printed
    for p in out.rglob("*"):
        if p.is_file():
            assert KEY not in p.read_bytes().decode("utf-8", "replace"), p
    cap = capsys.readouterr()
    assert KEY not in cap.out + cap.err
    # a rerun with the server gone makes no request and gives the same numbers
    httpserver.clear()
    posts = seen["chat"]
    again = run(out, None, AsymmetryConfig(**{**cfg.__dict__, "limit": 3}))
    assert seen["chat"] == posts and again["overall"]["EA"] == 1.0
    # the stages that read internals refuse the run in one line
    with pytest.raises(ConfigError, match="attention needs the model's attention; openai:"):
        load_run_model(RunDir(out), stage="attention")


def test_run_stops_past_max_error_rate_keeping_finished_records(httpserver, tmp_path,
                                                                data_file):
    seen = fake_server(httpserver)
    base = httpserver.url_for("/v1")
    out = tmp_path / "run"
    cfg = AsymmetryConfig(model="openai:fake", datasets=[data_file], limit=3, n_boot=50,
                          model_endpoint={"base_url": base, "concurrency": 1,
                                          "max_retries": 0, "max_error_rate": 0.0})
    # preflight (1 chat) + the first example (gen, eval) answer; then every chat fails
    calls = {"n": 0}

    def flaky(request):
        calls["n"] += 1
        if calls["n"] > 3:
            return Response("down", status=500)
        return Response(json.dumps(completion(reply_for(request.get_json()))),
                        content_type="application/json")

    httpserver.clear()
    httpserver.expect_request("/v1/models").respond_with_json(MODELS)
    httpserver.expect_request("/v1/chat/completions").respond_with_handler(flaky)
    with pytest.raises(EndpointError, match="max_error_rate 0.0"):
        run(out, None, cfg)
    kept = RunDir(out).read_records()
    assert [r["id"] for r in kept] == ["q0"]
    # the server is back: the rerun does the other two, nothing twice
    httpserver.clear()
    seen = fake_server(httpserver)
    m = run(out, None, cfg)
    ids = [r["id"] for r in RunDir(out).read_records()]
    assert sorted(ids) == ["q0", "q1", "q2"] and len(ids) == 3
    keys = [row["key"] for row in chat_lines(out)]
    assert len(keys) == len(set(keys)) == 6
    assert seen["chat"] == 1 + 4  # preflight + gen/eval of q1, q2
    assert m["overall"]["n"] == 3
    # another server behind the same URL (its /v1/models answer changed) is refused
    httpserver.clear()
    httpserver.expect_request("/v1/models").respond_with_json(
        {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "else"}]})
    httpserver.expect_request("/v1/chat/completions").respond_with_json(completion())
    extra = {"id": "q3", "question": "Q?", "context": "C.", "answers": ["C"]}
    with open(data_file, "a") as f:
        f.write(json.dumps(extra) + "\n")
    # (the check uses the cached facts; the first request sent finds the server changed)
    with pytest.raises(EndpointError, match="now reports other facts than the run's cached"):
        run(out, None, AsymmetryConfig(**{**cfg.__dict__, "limit": 4}))
    assert len(RunDir(out).read_records()) == 3  # nothing of the other server's kept


def test_oracle_agreement_served_from_the_cache(httpserver, tmp_path, data_file):
    fake_server(httpserver)
    out = tmp_path / "run"
    run(out, None, AsymmetryConfig(model="openai:fake", datasets=[data_file], limit=3, n_boot=50,
                        model_endpoint={"base_url": httpserver.url_for("/v1")}))
    first = oracle_agreement(RunDir(out), "openai:fake",
                             endpoint={"base_url": httpserver.url_for("/v1")})
    assert first["oracle_b"] == "openai:fake" and first["n"] == 3
    assert first["confusion"]["a_correct_b_incorrect"] == 1  # Shakespeare: constrained
    httpserver.clear()  # gone: every grade comes from DIR/requests.jsonl
    again = oracle_agreement(RunDir(out), "openai:fake",
                             endpoint={"base_url": httpserver.url_for("/v1")})
    assert again["confusion"] == first["confusion"] and again["kappa"] == first["kappa"]
    assert again["oracle_b_counts"] == first["oracle_b_counts"]


def test_a_served_oracle_reads_its_verdict_after_the_reasoning_markup(httpserver):
    """A reasoning model's verdict is read after ``</think>``; a cut reasoning decides nothing.

    The next fallback (the constrained choice) decides a reply cut inside its reasoning.
    """
    replies = {"Lyon": "<think>Paris? That looks Correct.</think>\nIncorrect",
               "Marseille": "<think>The candidate is Correct because"}

    def chat(request):
        body = request.get_json()
        user = body["messages"][-1]["content"]
        text = json.dumps({"verdict": "Incorrect"}) if "response_format" in body else next(
            (r for k, r in replies.items() if k in user), "OK")
        return Response(json.dumps(completion(text)), content_type="application/json")

    httpserver.expect_request("/v1/models").respond_with_json(MODELS)
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(chat)
    oracle = make_oracle("openai:fake", endpoint={"base_url": httpserver.url_for("/v1")})
    kw = {"dataset": "squad", "extras": {"context": "c", "question": "q"}}
    g = oracle.grade("Lyon", ["Paris"], **kw)
    assert (g.label, g.rule) == (False, "openai:reply:Incorrect")
    g = oracle.grade("Marseille", ["Paris"], **kw)
    assert (g.label, g.rule) == (False, "openai:constrained:Incorrect")


def forced_choice_server(httpserver, logprob, reply=reply_for):
    """A fake llama.cpp: its template, tokenizer and token-grammar replies with ``logprob``.

    ``logprob(word)`` (or ``logprob(word, body)``, with ``reply`` given) is the value the
    server reports for the reply's one token; the replies to the gen and eval prompts are
    ``reply(body)`` (default the fake model's, :func:`reply_for`).
    """
    two = reply is not reply_for
    head, ids = "<u>X</u><a>", {"Correct": 100, "Incorrect": 101}

    def template(request):
        msgs = request.get_json()["messages"]
        tail = msgs[-1]["content"] + "</a>" if msgs[-1]["role"] == "assistant" else ""
        return Response(json.dumps({"prompt": head + tail}), content_type="application/json")

    def tokenize(request):
        text = request.get_json()["content"]
        toks = [{"id": 1, "piece": head}] + [{"id": ids[w], "piece": w} for w in ids
                                              if text == head + w]
        return Response(json.dumps({"tokens": toks}), content_type="application/json")

    def chat(request):
        body = request.get_json()
        if "grammar" in body:
            tid = int(body["grammar"].split("[")[1].split("]")[0])
            word = next(w for w, i in ids.items() if i == tid)
            out = completion(word)
            out["choices"][0]["logprobs"] = {"content": [
                {"id": tid, "token": word,
                 "logprob": logprob(word, body) if two else logprob(word)}]}
            return Response(json.dumps(out), content_type="application/json")
        return Response(json.dumps(completion(reply(body))), content_type="application/json")

    httpserver.expect_request("/v1/models").respond_with_json(MODELS)
    httpserver.expect_request("/apply-template", method="POST").respond_with_handler(template)
    httpserver.expect_request("/tokenize", method="POST").respond_with_handler(tokenize)
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(chat)


@pytest.mark.parametrize("logprob, valid", [
    (lambda w: -0.2 if w == "Correct" else -2.0, True),   # log-probabilities: kept
    (lambda w: 0.8 if w == "Correct" else 0.1, False),    # probabilities in the field
    (lambda w: 0.0, False),                               # 0 under a one-token grammar: mass 2
])
def test_returned_logprobs_are_checked_before_they_become_a_forced_choice(
        httpserver, tmp_path, data_file, logprob, valid):
    forced_choice_server(httpserver, logprob)
    cfg = AsymmetryConfig(model="openai:fake", datasets=[data_file], limit=3, n_boot=50,
                          model_endpoint={"base_url": httpserver.url_for("/v1")})
    m = run(tmp_path / "run", None, cfg, log=lambda s: None)
    recs = RunDir(tmp_path / "run").read_records()
    if valid:
        assert all(r["logit_diff"] == pytest.approx(1.8) for r in recs)
        assert m["overall"]["EA_forced"] == 1.0
        return
    assert all(r["verdict_score"] == "unavailable" for r in recs)
    reason = recs[0]["verdict_score_reason"]
    assert ("<= 0" in reason) if logprob("Correct") > 0 else ("sum to 2 > 1" in reason)
    assert m["overall"]["EA_forced"] is None
    assert m["overall"]["EA_forced_unavailable"] == f"unavailable: {reason}"


def test_a_finished_served_run_reruns_from_its_cache_with_the_server_gone(httpserver, tmp_path,
                                                                       data_file):
    """Every request is in RUN/requests.jsonl: the rerun needs no preflight and no server."""
    fake_server(httpserver)
    base = httpserver.url_for("/v1")
    cfg = AsymmetryConfig(model="openai:fake", datasets=[data_file], limit=3, n_boot=50,
                          oracle="openai:fake", oracle_endpoint={"base_url": base},
                          model_endpoint={"base_url": base})
    first = run(tmp_path / "run", None, cfg, log=lambda s: None)
    before = RunDir(tmp_path / "run").read_records()
    httpserver.clear()  # the server stops: every request would fail
    httpserver.expect_request("/v1/models").respond_with_data("down", status=503)
    httpserver.expect_request("/v1/chat/completions").respond_with_data("down", status=503)
    again = run(tmp_path / "run", None, cfg, log=lambda s: None)
    assert again["overall"] == first["overall"]
    assert RunDir(tmp_path / "run").read_records() == before
    assert not httpserver.log  # not one request


@pytest.mark.parametrize("status", [400, 500])
def test_a_server_that_rejects_the_system_role_says_so_and_system_role_false_runs(
        httpserver, tmp_path, data_file, status):
    """llama.cpp's chat templates without a system role answer 400 (or 500, repeatedly)."""
    def chat(request):
        body = request.get_json()
        if any(m["role"] == "system" for m in body["messages"]):
            return Response(json.dumps({"error": {"code": status, "type": "server_error",
                                                  "message": "System role not supported"}}),
                            status=status, content_type="application/json")
        return Response(json.dumps(completion(reply_for_user(body))),
                        content_type="application/json")

    httpserver.expect_request("/v1/models").respond_with_json(MODELS)
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(chat)
    base = httpserver.url_for("/v1")
    cfg = AsymmetryConfig(model="openai:fake", datasets=[data_file], limit=3, n_boot=50,
                          model_endpoint={"base_url": base, "max_retries": 0,
                                          "concurrency": 1})
    with pytest.raises(EndpointError) as err:
        run(tmp_path / "run", None, cfg, log=lambda s: None)
    line = str(err.value)
    assert "\n" not in line and f"{status}: System role not supported)" in line
    assert "Set system_role = false" in line
    cfg = AsymmetryConfig(**{**cfg.__dict__, "model_endpoint": {
        "base_url": base, "system_role": False}})
    m = run(tmp_path / "run2", None, cfg, log=lambda s: None)
    assert m["overall"]["GA"] == 1.0
    sent = [json.loads(r.get_data())["messages"] for r, _ in httpserver.log
            if r.path.endswith("/chat/completions")]
    ok = [s for s in sent if not any(m["role"] == "system" for m in s)]
    assert ok and ok[-1][0]["content"].startswith("You ")  # the system text, then the user's


def reply_for_user(body: dict) -> str:
    """:func:`reply_for` for a server without a system role: the system text leads the user's."""
    user = body["messages"][-1]["content"]
    system, _, rest = user.partition("\n\n")
    return reply_for({"messages": [{"role": "system", "content": system},
                                   {"role": "user", "content": rest}], **{
        k: v for k, v in body.items() if k != "messages"}})


def test_served_and_local_study_1_give_the_same_records_on_the_same_replies(tiny, httpserver,
                                                                             tmp_path):
    """One harness: a fake server replaying a local model's replies gives its records.

    The tiny random model runs Study 1 in process; a fake llama.cpp then answers each chat
    request with the reply the local model gave to the same prompt (its ``generation`` and
    ``verdict_text``) and the forced choice with its whole-reply log-probs. The served run's
    records equal the local run's field for field and in order, less what only a local model
    has (``prompts``, ``verdict_reply_ids``) and the ``model``; so do the metrics.
    """
    kw = dict(datasets=["squad_v2"], limit=4, max_new_tokens=6, verdict_max_new_tokens=3,
              batch_size=2, n_boot=20)
    local_m = run(tmp_path / "local", tiny, AsymmetryConfig(model="tiny-llama", **kw),
                  log=lambda s: None)
    local = RunDir(tmp_path / "local").read_records(status=None)
    tpl = get_template()

    def key(task, r, **answer):
        return json.dumps(chat_messages(tpl, task, context=r["context"], question=r["question"],
                                        reference=r["answers"][0] if r["answers"] else "",
                                        **answer))

    replies, scores = {}, {}
    for r in local:
        replies[key("gen", r)] = r["generation"]
        if r["status"] == "ok":
            replies[key("eval", r, answer=r["answer"])] = r["verdict_text"]
            scores[key("eval", r, answer=r["answer"])] = {
                "Correct": r["logprob_correct"], "Incorrect": r["logprob_incorrect"]}
    forced_choice_server(
        httpserver, lambda w, body: scores.get(json.dumps(body["messages"]), {}).get(w, -1.0),
        reply=lambda body: replies.get(json.dumps(body["messages"]), "OK"))
    served_m = run(tmp_path / "served", None, AsymmetryConfig(
        model="openai:fake", model_endpoint={"base_url": httpserver.url_for("/v1")}, **kw),
        log=lambda s: None)
    served = RunDir(tmp_path / "served").read_records(status=None)
    assert [r["status"] for r in local] == ["ok"] * 4 and len(served) == 4
    # every served field came from the replayed replies: answers, verdict texts, and the
    # whole-reply scores of the server's forced choice (not "unavailable")
    assert all(r["generation"] and r["verdict_text"] for r in served)
    assert all(isinstance(r["logit_diff"], float) for r in served)
    local_only = ("prompts", "verdict_reply_ids", "model")
    for a, b in zip(local, served):
        assert b["model"] == "openai:fake" and a["model"] == "tiny-llama"
        mine = {k: v for k, v in a.items() if k not in local_only}
        assert json.dumps({k: v for k, v in b.items() if k != "model"}) == json.dumps(mine)
    assert served_m["overall"] == local_m["overall"]
    # the one-pass capture needs what a served model cannot show: refused before a request
    from interp.data import load_examples
    from interp.endpoints.study import ServedReplies
    from interp.judging.grading import RuleOracle
    from interp.judging.prefill import Capture
    from interp.methods.asymmetry import evaluate_examples

    posts = chat_posts(httpserver)
    with pytest.raises(ConfigError, match="openai:fake cannot show its attention"):
        evaluate_examples(ServedReplies(endpoint(httpserver)), load_examples("squad_v2", limit=1),
                          template=tpl, oracle=RuleOracle(), capture=Capture())
    assert chat_posts(httpserver) == posts


@pytest.fixture
def threaded_httpserver():
    """A pytest-httpserver on 127.0.0.1 that answers requests at once, each in its own thread."""
    from pytest_httpserver import HTTPServer

    srv = HTTPServer(host="127.0.0.1", threaded=True)
    srv.start()
    yield srv
    srv.clear()
    srv.stop()


def test_concurrent_served_study_1_equals_the_sequential_run_and_keeps_the_bound(
        threaded_httpserver, tmp_path):
    """``--concurrency 3`` against a server that answers at once: the one-at-a-time records.

    The fake server counts the chat requests in flight and answers the first examples'
    slowest, so they finish after later ones; the records come out field for field and in
    order as the sequential run's, the requests in flight reach the bound and never pass it.
    """
    examples = [{"id": f"r{i}", "question": f"What is item {i}?",
                 "context": f"Item {i} is a thing number {i}.", "answers": [f"thing {i}"]}
                for i in range(7)]
    data = tmp_path / "seven.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in examples))
    lock, state = threading.Lock(), {"now": 0, "peak": 0}

    def chat(request):
        body = request.get_json()
        user = body["messages"][-1]["content"]
        i = next(int(e["id"][1:]) for e in examples if e["question"] in user) \
            if "item" in user else 6
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.02 * (7 - i))   # r0 slowest: finished out of order when concurrent
        with lock:
            state["now"] -= 1
        grader = "grader" in body["messages"][0]["content"]
        text = ("Correct" if i % 2 else "Incorrect") if grader else f"thing {i}\nmore"
        return Response(json.dumps(completion(text)), content_type="application/json")

    srv = threaded_httpserver
    srv.expect_request("/v1/models").respond_with_json(MODELS)
    srv.expect_request("/v1/chat/completions", method="POST").respond_with_handler(chat)
    base = srv.url_for("/v1")
    kw = dict(model="openai:fake", datasets=[str(data)], n_boot=50,
              model_endpoint={"base_url": base, "concurrency": 1})
    one = run(tmp_path / "one", None, AsymmetryConfig(**kw), log=lambda s: None)
    assert state["peak"] == 1
    state["peak"] = 0
    three = run(tmp_path / "three", None, AsymmetryConfig(**kw, concurrency=3),
                log=lambda s: None)
    assert state["peak"] == 3    # reached, never passed
    seq = RunDir(tmp_path / "one").read_records(status=None)
    conc = RunDir(tmp_path / "three").read_records(status=None)
    assert [r["id"] for r in seq] == [f"r{i}" for i in range(7)]
    assert json.dumps(conc) == json.dumps(seq)
    assert [r["verdict"] for r in seq] == [bool(i % 2) for i in range(7)]
    assert three["overall"] == one["overall"] and one["overall"]["GA"] == 1.0
    assert RunDir(tmp_path / "three").manifest()["config"]["concurrency"] == 3


def test_map_moves_the_bar_per_item_and_starts_nothing_after_a_refused_request(httpserver):
    """A refused request (an EndpointError) stops the items not started; in-flight ones end.

    Ten items, two in flight: item 1 is refused at once while item 0 is still running, so
    the worker that ran item 1 starts nothing more and item 0 finishes. Every item reports
    done (the bar reaches the end), each not started gets the same error.
    """
    ep = endpoint(httpserver, concurrency=2)
    started, ticks = [], []

    def fn(i):
        started.append(i)
        if i == 1:
            raise EndpointError("refused")
        time.sleep(0.3)
        return {"i": i}

    got = ep.map(fn, range(10), done=lambda: ticks.append(1))
    assert sorted(started) == [0, 1]
    assert got[0] == {"i": 0} and all(isinstance(g, EndpointError) for g in got[1:])
    assert len({id(g) for g in got[1:]}) == 1 and len(ticks) == 10
    # a failed request is that item's result only: the others run
    failed = ep.map(lambda i: (_ for _ in ()).throw(RequestFailed("x")) if i == 2 else i,
                    range(5))
    assert failed[:2] == [0, 1] and isinstance(failed[2], RequestFailed) and failed[3:] == [3, 4]


def test_concurrency_from_the_command_line_replaces_the_model_table_only():
    cfg = AsymmetryConfig.from_mapping({"model": "openai:m", "oracle": "openai:o",
                                        "concurrency": 6,
                                        "model_endpoint": {"concurrency": 2, "seed": 1}})
    assert cfg.endpoint_table("model") == {"concurrency": 6, "seed": 1}
    assert cfg.endpoint_table("oracle") is None
    with pytest.raises(ConfigError, match=r"--concurrency \(\[asymmetry\] concurrency\) must be "
                                          r"a whole number >= 1, not 0"):
        AsymmetryConfig(model="openai:m", concurrency=0).check_inputs()


def test_cache_prompt_false_is_sent_with_every_chat_request_and_keys_the_cache(httpserver,
                                                                              tmp_path):
    """``cache_prompt = false``: each request asks llama.cpp to evaluate its prompt whole.

    Not given, nothing is sent (the server's default); either way a request's own value (the
    forced choice's False) stays. The value is part of the request's cache identity.
    """
    fake_server(httpserver)
    sent = lambda: [json.loads(r.get_data()) for r, _ in httpserver.log  # noqa: E731
                    if r.path == "/v1/chat/completions"][-1]
    plain = endpoint(httpserver, tmp_path)
    plain.chat(MSGS, prompt_version="t", max_tokens=4)
    assert "cache_prompt" not in sent()
    whole = endpoint(httpserver, tmp_path, cache_prompt=False)   # the same run's cache
    whole.preflight()
    posts = chat_posts(httpserver)
    whole.chat(MSGS, prompt_version="t", max_tokens=4)
    assert sent()["cache_prompt"] is False
    assert whole.cache.hits == 0 and chat_posts(httpserver) == posts + 1  # another identity
    whole.chat(MSGS, prompt_version="t", max_tokens=4)
    assert whole.cache.hits == 1 and chat_posts(httpserver) == posts + 1
    on = endpoint(httpserver, cache_prompt=True)
    on.chat(MSGS, prompt_version="t", max_tokens=4, cache_prompt=False)
    assert sent()["cache_prompt"] is False
    with pytest.raises(ConfigError, match="cache_prompt = 'no' is out of range"):
        EndpointConfig.from_spec("openai:m", {"cache_prompt": "no"})


def test_a_prompt_longer_than_a_slot_stops_the_run_saying_how_to_serve_it(httpserver, tmp_path,
                                                                         data_file):
    """llama.cpp's 400 for a prompt over one slot's context (its message as measured)."""
    def chat(request):
        if "Say OK." in json.dumps(request.get_json()):
            return Response(json.dumps(completion()), content_type="application/json")
        return Response(json.dumps({"error": {
            "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 631,
            "n_ctx": 512, "message": "request (631 tokens) exceeds the available context size "
                                     "(512 tokens), try increasing it"}}),
            status=400, content_type="application/json")

    httpserver.expect_request("/v1/models").respond_with_json(MODELS)
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(chat)
    cfg = AsymmetryConfig(model="openai:fake", datasets=[data_file], limit=3, n_boot=50,
                          concurrency=2, model_endpoint={"base_url": httpserver.url_for("/v1")})
    with pytest.raises(EndpointError) as err:
        run(tmp_path / "run", None, cfg, log=lambda s: None)
    line = str(err.value)
    assert "\n" not in line and "exceeds the available context size (512 tokens)" in line
    assert line.endswith("start it with a larger --n-ctx or fewer --parallel slots (interp "
                         "serve), or ask for shorter prompts or replies.")
    # the first refusal stopped the run: no example started after it (3 examples, 2 in flight)
    gens = [r for r, _ in httpserver.log if r.path == "/v1/chat/completions"
            and "Say OK." not in r.get_data(as_text=True)]
    assert len(gens) <= 2
