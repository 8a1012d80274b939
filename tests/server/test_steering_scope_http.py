"""steering_scope over HTTP on the bundled model: honoured on chat and completions (the OpenAI SDK passes it in
``extra_body``), reported in X-miLLM-Steering, refused where it cannot apply (scoring, embeddings, a GGUF model
that is not steered), and a bad value is a 400 naming it."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from millm.names import steering_label, steering_scope_of
from tests.support.live import live_server
from tests.support.saes import random_sae, write_saelens

MODEL, GGUF = "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct:Q4_1"
PROMPT = [{"role": "user", "content": "Tell me about your day."}]


@pytest.fixture(scope="module")
def base(engine, settings):
    from millm.server.app import create_app

    with live_server(create_app(settings, engine)) as url:
        yield url


@pytest.fixture(scope="module")
def live(base, tmp_path_factory):
    """A random SAE at layer 10 with a strong live value."""
    folder = write_saelens(tmp_path_factory.mktemp("scope-saes") / "l10", random_sae(576, 32, seed=4), layer=10)
    r = httpx.post(base + "/api/saes", json={"path": str(folder)}, timeout=30)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert httpx.post(base + f"/api/saes/{sid}/attach", json={}, timeout=30).status_code == 200
    assert httpx.put(base + "/api/steering", json={"sae": sid, "values": {"3": 60.0}}, timeout=30).status_code == 200
    yield sid
    httpx.delete(base + "/api/steering", timeout=30)
    httpx.post(base + f"/api/saes/{sid}/detach", timeout=30)


def test_the_sdk_sends_a_scope_and_the_header_reports_it(base, live):
    client = OpenAI(base_url=base + "/v1", api_key="none")
    answers, headers = {}, {}
    for scope in ("all", "generated", "prompt"):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=PROMPT, max_tokens=12, temperature=0, extra_body={"steering_scope": scope})
        answers[scope], headers[scope] = raw.parse().choices[0].message.content, raw.headers["X-miLLM-Steering"]
    assert [steering_scope_of(headers[s]) for s in answers] == ["all", "generated", "prompt"]
    assert {steering_label(h) for h in headers.values()} == {"live"} and headers["all"] == "live"
    assert len(set(answers.values())) == 3  # each scope steers other positions


def test_completions_take_a_scope_too(base, live):
    r = httpx.post(base + "/v1/completions", json={"model": MODEL, "prompt": "My day was", "max_tokens": 4,
                                                   "steering_scope": "generated"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["X-miLLM-Steering"] == "live;scope=generated"


@pytest.mark.parametrize("value", ["decode", "ALL", 1, True, ["all"]])
def test_a_bad_scope_is_a_400_naming_the_field(base, value):
    r = httpx.post(base + "/v1/chat/completions", json={"model": MODEL, "messages": PROMPT, "max_tokens": 1,
                                                        "steering_scope": value}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "steering_scope" and r.json()["error"]["code"] == "invalid_parameter"


@pytest.mark.parametrize("route, body", [
    ("/v1/chat/completions", {"messages": PROMPT, "max_tokens": 1, "logprobs": True, "top_logprobs": 2}),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 0, "echo": True, "logprobs": 1}),
    ("/v1/embeddings", {"input": "Hello"}),
])
def test_a_scope_where_nothing_is_steered_is_refused(base, route, body):
    r = httpx.post(base + route, json={"model": MODEL, "steering_scope": "generated", **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "steering_scope" and r.json()["error"]["code"] == "field_not_honoured"


def test_a_gguf_model_that_is_not_steered_refuses_a_scope(gguf_server):
    r = httpx.post(gguf_server + "/v1/chat/completions", json={"model": GGUF, "messages": PROMPT, "max_tokens": 1,
                                                               "steering_scope": "prompt"}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "steering_scope"


def test_a_profile_carries_a_scope_that_a_request_may_override(base, live):
    doc = {"name": "scoped-generated", "entries": [{"sae": live, "feature": 3, "strength": 60.0}],
           "steering_scope": "generated"}
    r = httpx.post(base + "/api/profiles/import", json=doc, params={"overwrite": "true"}, timeout=30)
    assert r.status_code in (200, 201), r.text
    try:
        assert httpx.get(base + "/api/profiles/scoped-generated/export", timeout=30).json()["steering_scope"] == \
            "generated"
        chat = {"model": MODEL, "messages": PROMPT, "max_tokens": 2, "profile": "scoped-generated"}
        r = httpx.post(base + "/v1/chat/completions", json=chat, timeout=60)
        assert r.headers["X-miLLM-Steering"] == '"scoped-generated";scope=generated'
        r = httpx.post(base + "/v1/chat/completions", json={**chat, "steering_scope": "all"}, timeout=60)
        assert r.headers["X-miLLM-Steering"] == '"scoped-generated"'  # the request's own scope wins
        assert httpx.post(base + "/api/profiles/scoped-generated/activate", timeout=30).status_code == 200
        r = httpx.post(base + "/v1/chat/completions", json={**chat, "profile": None}, timeout=60)
        assert r.headers["X-miLLM-Steering"] == '"scoped-generated";scope=generated'  # the active profile's
    finally:
        httpx.post(base + "/api/profiles/deactivate", timeout=30)
        httpx.delete(base + "/api/profiles/scoped-generated", timeout=30)
        httpx.put(base + "/api/steering", json={"sae": live, "values": {"3": 60.0}}, timeout=30)


def test_a_profile_with_a_bad_scope_is_refused_and_not_stored(base, live):
    doc = {"name": "scoped-bad", "entries": [], "steering_scope": "decode"}
    r = httpx.post(base + "/api/profiles/import", json=doc, timeout=30)
    assert r.status_code == 400 and "steering_scope" in r.text
    assert httpx.get(base + "/api/profiles/scoped-bad", timeout=30).status_code == 404
