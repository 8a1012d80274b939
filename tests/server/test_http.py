"""The /v1 server over raw HTTP: headers, SSE framing, backpressure, cancellation, model swaps."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.live import live_server
from tests.support.waiting import wait_idle, wait_running

MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def chat(base, headers=None, **body):
    body = {"model": MODEL, "messages": FRANCE, "max_tokens": 4, "temperature": 0} | body
    return httpx.post(base + "/v1/chat/completions", json=body, headers=headers or {}, timeout=120)


def sse_frames(text):
    assert text.endswith("\n\n")
    return text[:-2].split("\n\n")


def test_ignored_fields_header(server):
    r = chat(server, user="alice", foo=1, messages=[{"role": "user", "content": "hi", "name": "al"}],
             extra_messages=[[{"role": "user", "content": "yo", "weight": 2}, {"role": "user", "content": "x"}]])
    assert r.status_code == 200
    assert r.headers["X-miLLM-Ignored-Fields"] == '"user", "foo", "messages[0].name", "extra_messages[0][0].weight"'
    assert "alice" not in r.text


def test_ignored_fields_header_on_streams_and_cap(server):
    many = {f"field_{i:04d}_with_a_long_name": i for i in range(200)}
    with httpx.stream("POST", server + "/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": FRANCE, "max_tokens": 2, "stream": True, **many}) as r:
        header = r.headers["X-miLLM-Ignored-Fields"]
        body = r.read().decode()
    assert len(header.encode()) <= 1024
    items = [item.strip() for item in header.split(",")]
    assert items[-1] == f'"+{200 - (len(items) - 1)} more"'
    assert items[0] == '"field_0000_with_a_long_name"'
    assert body.endswith("data: [DONE]\n\n")


def test_ignored_field_names_are_percent_encoded(server):
    r = chat(server, **{"caf\u00e9": 1, "tab\there": 2, 'quo"te': 3})
    assert r.headers["X-miLLM-Ignored-Fields"] == '"caf%C3%A9", "tab%09here", "quo\\"te"'


@pytest.mark.parametrize("value,status", [("true", 400), ("1", 400), ("false", 200), ("0", 200), ("yes", 400),
                                          ("TRUE", 400), ("False", 400)])
def test_strict_header(server, value, status):
    r = chat(server, headers={"X-miLLM-Strict": value}, user="bob")
    assert r.status_code == status
    if status == 400:
        error = r.json()["error"]
        if value not in ("true", "1"):
            assert error["code"] == "invalid_parameter" and "X-miLLM-Strict" in error["message"]
        else:
            assert error["code"] == "unused_fields_refused" and "user" in error["message"]


def test_strict_passes_clean_request(server):
    assert chat(server, headers={"X-miLLM-Strict": "true"}).status_code == 200


def test_seed_header_and_reproducibility(server):
    a = chat(server, seed=42, temperature=1.0, max_tokens=12)
    b = chat(server, seed=42, temperature=1.0, max_tokens=12)
    assert a.headers["X-miLLM-Seed"] == '42;scope="request"'
    assert a.json()["choices"] == b.json()["choices"]
    assert "X-miLLM-Seed" not in chat(server).headers
    greedy = chat(server, seed=7)
    assert greedy.headers["X-miLLM-Seed"] == '7;scope="request"'
    assert chat(server, seed=True).json()["error"]["param"] == "seed"
    assert chat(server, seed=2**32).status_code == 400


def test_fingerprint_and_shape(server):
    body = chat(server).json()
    assert body["system_fingerprint"] == "millm:SmolLM2-135M-Instruct@unrecorded:float32/Q4_1:transformers"
    assert set(body) == {"id", "object", "created", "model", "choices", "usage", "system_fingerprint"}
    assert body["choices"][0]["logprobs"] is None


def test_sse_framing(server):
    with httpx.stream("POST", server + "/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": FRANCE, "max_tokens": 24, "temperature": 0,
                            "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        frames = sse_frames(r.read().decode())
    assert frames[-1] == "data: [DONE]"
    payloads = [json.loads(f.removeprefix("data: ")) for f in frames[:-1]]
    assert all(f.startswith("data: {") for f in frames[:-1])
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert payloads[-1]["choices"][0]["finish_reason"] == "stop" and "usage" in payloads[-1]
    assert all("usage" not in p and p["choices"][0]["finish_reason"] is None for p in payloads[:-1])
    assert "system_fingerprint" not in payloads[1]


def test_stream_context_error_before_stream(server):
    r = httpx.post(server + "/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": FRANCE, "max_tokens": 100000, "stream": True})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and "8192" in error["message"] and "100" in error["message"]


def test_error_mid_stream_is_an_sse_error_event(server, engine, monkeypatch):
    real_forward, calls = engine.model.forward, []

    def failing_forward(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("simulated device failure")
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", failing_forward)
    with httpx.stream("POST", server + "/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": FRANCE, "max_tokens": 20, "temperature": 0,
                            "stream": True}) as r:
        assert r.status_code == 200
        frames = sse_frames(r.read().decode())
    assert frames[-1] == "data: [DONE]"
    assert frames[-2].startswith("event: error\ndata: ")
    error = json.loads(frames[-2].split("data: ", 1)[1])["error"]
    assert "simulated device failure" in error["message"] and error["type"] == "server_error"


def test_invalid_json_and_unknown_route(server):
    r = httpx.post(server + "/v1/chat/completions", content=b"{not json", timeout=10,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"]
    r = httpx.post(server + "/v1/chat/completions", content=b"{not json", timeout=10)  # untyped: not said to be JSON
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    r = httpx.post(server + "/v1/chat/completions", json={"model": MODEL, "messages": "hi"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.get(server + "/v1/nothing", timeout=10)
    assert r.status_code == 404 and "error" in r.json()


def test_health_answers_during_generation(server):
    def long_generation():
        return httpx.post(server + "/v1/completions", timeout=120,
                          json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 60, "temperature": 0})

    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(long_generation)
        wait_running(server, job)
        for route in ("/api/health", "/api/health/ready", "/api/health/inference") * 3:
            assert httpx.get(server + route, timeout=30).status_code == 200
        busy = httpx.get(server + "/api/health/inference", timeout=5).json()
        assert not job.done()  # every health answer came while the generation was still running
        assert job.result().status_code == 200
    assert busy["backend"] == "serial" and busy["in_flight"] == 1 and busy["model"] == MODEL


def test_disconnect_cancels_generation(server, engine):
    steps = []
    handle = engine.model.register_forward_hook(lambda *_: steps.append(1))
    try:
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", server + "/v1/completions",
                             json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2000,
                                   "temperature": 0, "stream": True}) as r:
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")
        wait_idle(server)
    finally:
        handle.remove()
    assert len(steps) < 100, "generation kept running after the client left"  # uncancelled: 2000 steps


def test_openapi_document(server):
    doc = httpx.get(server + "/openapi.json", timeout=10).json()
    assert doc["openapi"].startswith("3.")
    assert "post" in doc["paths"]["/v1/chat/completions"] and "get" in doc["paths"]["/v1/models/{model_id}"]
    assert "ChatCompletionRequest" in doc["components"]["schemas"]


def test_queue_full_under_burst(engine, settings):
    from millm.server.app import create_app

    app = create_app(settings.model_copy(update={"max_queue": 2}), engine)
    with live_server(app) as base:
        def one(_):
            return httpx.post(base + "/v1/completions", timeout=120,
                              json={"model": MODEL, "prompt": "Count: one, two,", "max_tokens": 16, "temperature": 0})

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(8)))
    codes = sorted(r.status_code for r in results)
    assert codes.count(200) >= 2 and 503 in codes
    full = [r.json()["error"] for r in results if r.status_code == 503]
    assert all(e["code"] == "queue_full" and e["type"] == "server_error" for e in full)
    texts = {r.json()["choices"][0]["text"] for r in results if r.status_code == 200}
    assert len(texts) == 1  # every admitted request got the same, correct answer


def test_api_key(engine, settings):
    from millm.server.app import create_app

    app = create_app(settings.model_copy(update={"api_key": "sekrit"}), engine)
    with live_server(app) as base:
        denied = httpx.get(base + "/v1/models", timeout=10)
        allowed = httpx.get(base + "/v1/models", headers={"Authorization": "Bearer sekrit"}, timeout=10)
        health = httpx.get(base + "/api/health", timeout=10)
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
    assert allowed.status_code == 200 and health.status_code == 200


def test_model_not_loaded(settings):
    from millm.server.app import create_app

    with live_server(create_app(settings)) as base:
        r = chat(base)
        ready = httpx.get(base + "/api/health/ready", timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded"
    assert ready.status_code == 503 and ready.json()["ready"] is False


def test_unused_fields_logged_once_without_values(server, caplog):
    import logging

    caplog.set_level(logging.WARNING, logger="millm.server.v1")
    chat(server, user="secret-user-id", mystery="secret-value")
    records = [r for r in caplog.records if "request_fields_unused" in r.getMessage()]
    assert len(records) == 1
    assert "user" in records[0].getMessage() and "mystery" in records[0].getMessage()
    assert "secret" not in records[0].getMessage()


def test_admin_key_guards_management_changes(engine, settings):
    from millm.server.app import create_app

    app = create_app(settings.model_copy(update={"admin_key": "boss"}), engine)
    with live_server(app) as base:
        read = httpx.get(base + "/api/steering", timeout=10)
        denied = httpx.delete(base + "/api/steering", timeout=10)
        allowed = httpx.delete(base + "/api/steering", headers={"Authorization": "Bearer boss"}, timeout=10)
        v1 = chat(base)
    assert read.status_code == 200 and denied.status_code == 401 and allowed.status_code == 200
    assert v1.status_code == 200  # the admin key guards /api only
