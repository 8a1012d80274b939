"""Steering a GGUF model over HTTP with MILLM_GGUF_STEERING on (issue 27): SAEs attach, live values, profiles
and steering_intensity steer llama.cpp; X-miLLM-Steering and operator wins as on transformers; embeddings,
scoring, read-outs and monitoring stay unsteered or refused."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.live import live_server
from tests.support.saes import random_sae, write_saelens
from tests.support.waiting import wait_idle, wait_running

GGUF = "SmolLM2-135M-Instruct:Q4_1"
LAYER, FEATURE, STRENGTH = 10, 3, 60.0
PROMPT = [{"role": "user", "content": "Tell me about your day."}]


@pytest.fixture(scope="module")
def base(gguf_steerable, settings):
    """A server whose GGUF model is steered through llama.cpp's control vectors (``gguf_steerable``)."""
    from millm.server.app import create_app

    with live_server(create_app(settings, gguf_steerable)) as url:
        yield url


@pytest.fixture(scope="module")
def sae_id(base, tmp_path_factory):
    folder = write_saelens(tmp_path_factory.mktemp("gguf-saes") / "l10", random_sae(576, 64, seed=1), layer=LAYER)
    r = httpx.post(base + "/api/saes", json={"path": str(folder)}, timeout=30)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    r = httpx.post(base + f"/api/saes/{sid}/attach", json={}, timeout=30)
    assert r.status_code == 200 and r.json()["attached_layer"] == LAYER, r.text
    yield sid
    httpx.delete(base + "/api/steering", timeout=30)
    httpx.post(base + f"/api/saes/{sid}/detach", timeout=30)  # nothing persisted for later loads of the file


@pytest.fixture(autouse=True)
def clean_values(request):
    yield
    if "sae_id" in request.fixturenames:
        base = request.getfixturevalue("base")
        httpx.delete(base + "/api/steering", timeout=30)


def chat(base, **body):
    body = {"model": GGUF, "messages": PROMPT, "max_tokens": 24, "temperature": 0} | body
    return httpx.post(base + "/v1/chat/completions", json=body, timeout=120)


def content(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def steer(base, sae_id, values):
    return httpx.put(base + "/api/steering", json={"sae": sae_id, "values": values}, timeout=30)


def create_profile(base, name, entries):
    r = httpx.post(base + "/api/profiles", json={"name": name, "description": "gguf", "entries": entries,
                                                 "model": GGUF}, timeout=10)
    if r.status_code == 409:
        httpx.delete(base + f"/api/profiles/{name}", timeout=10)
        r = httpx.post(base + "/api/profiles", json={"name": name, "description": "gguf", "entries": entries,
                                                     "model": GGUF}, timeout=10)
    assert r.status_code == 201, r.text
    return name


def test_live_values_steer_and_clearing_restores(base, sae_id):
    unsteered = chat(base)
    assert unsteered.headers["X-miLLM-Steering"] == "none"
    r = steer(base, sae_id, {str(FEATURE): STRENGTH})
    assert r.status_code == 200 and r.json()["live"] is True
    steered = chat(base)
    assert steered.headers["X-miLLM-Steering"] == "live" and content(steered) != content(unsteered)
    assert httpx.delete(base + "/api/steering", timeout=30).json()["live"] is True
    again = chat(base)
    assert again.headers["X-miLLM-Steering"] == "none" and content(again) == content(unsteered)


def test_profile_and_dial_are_honoured_on_gguf_chat(base, sae_id):
    unsteered = content(chat(base))
    steer(base, sae_id, {str(FEATURE): STRENGTH})
    live = content(chat(base))
    httpx.delete(base + "/api/steering", timeout=30)
    name = create_profile(base, "gguf-up", [{"sae": sae_id, "feature": FEATURE, "strength": STRENGTH}])
    r = chat(base, profile=name)
    assert r.headers["X-miLLM-Steering"] == '"gguf-up"' and "X-miLLM-Ignored-Fields" not in r.headers
    assert content(r) == live  # the profile's values, as the live values steer
    off = chat(base, profile=name, steering_intensity="off")
    assert off.headers["X-miLLM-Steering"] == "none" and content(off) == unsteered
    half = chat(base, profile=name, steering_intensity=0.5)
    assert half.status_code == 200 and half.headers["X-miLLM-Steering-Intensity"] == "0.5"
    state = httpx.get(base + "/api/steering", timeout=10).json()
    assert state["live"] is True and state["saes"][sae_id]["values"] == {}  # nothing left behind
    assert content(chat(base)) == unsteered
    assert chat(base, profile="no-such-profile").json()["error"]["code"] == "profile_not_found"
    r = httpx.post(base + "/v1/completions", json={"model": GGUF, "prompt": "x", "max_tokens": 1, "profile": name},
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "profile"  # completions: refused, as the spec


def test_profile_released_after_a_disconnect_and_operator_wins(base, sae_id):
    unsteered = content(chat(base))
    name = create_profile(base, "gguf-down", [{"sae": sae_id, "feature": FEATURE, "strength": STRENGTH}])
    with httpx.Client(timeout=60) as http, http.stream(
            "POST", base + "/v1/chat/completions",
            json={"model": GGUF, "max_tokens": 400, "temperature": 0, "stream": True, "profile": name,
                  "messages": [{"role": "user", "content": "Count from 1 to 300, separated by commas."}]}) as stream:
        lines = stream.iter_lines()
        while True:
            line = next(lines)
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break
        assert httpx.get(base + "/api/steering", timeout=10).json()["live"] is False
        r = steer(base, sae_id, {"9": 4.0})  # an operator change while the profile request runs
        assert r.status_code == 200 and r.json()["live"] is False
    wait_idle(base)
    after = httpx.get(base + "/api/steering", timeout=10).json()
    assert after["live"] is True and after["saes"][sae_id]["values"] == {"9": 4.0}  # not undone
    httpx.delete(base + "/api/steering", timeout=30)
    assert content(chat(base)) == unsteered


def test_operator_wins_on_a_running_request(base, sae_id):
    name = create_profile(base, "gguf-op", [{"sae": sae_id, "feature": FEATURE, "strength": STRENGTH}])
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(chat, base, profile=name, max_tokens=60)
        wait_running(base, job)
        r = steer(base, sae_id, {"9": 4.0})
        assert r.status_code == 200
        assert job.result().status_code == 200
    after = httpx.get(base + "/api/steering", timeout=10).json()
    assert after["live"] is True and after["saes"][sae_id]["values"] == {"9": 4.0}


def test_embeddings_stay_unsteered(base, sae_id):
    body = {"model": GGUF, "input": ["hello world", "the weather"]}
    before = httpx.post(base + "/v1/embeddings", json=body, timeout=60)
    steer(base, sae_id, {str(FEATURE): 200.0})
    during = httpx.post(base + "/v1/embeddings", json=body, timeout=60)
    assert during.headers["X-miLLM-Steering"] == "none"
    assert [d["embedding"] for d in during.json()["data"]] == [d["embedding"] for d in before.json()["data"]]


def test_what_stays_refused(base, sae_id):
    r = chat(base, return_sae_activations={"sae_id": sae_id})
    assert r.status_code == 400 and r.json()["error"]["param"] == "return_sae_activations"
    r = chat(base, logprobs=True, max_tokens=1)
    assert r.status_code == 400 and r.json()["error"]["code"] == "field_not_honoured"
    r = httpx.put(base + "/api/monitoring", json={"enabled": True, "sae": sae_id, "features": [1]}, timeout=10)
    assert r.status_code == 400 and "control vectors" in r.json()["error"]["message"]
    r = httpx.post(base + f"/api/saes/{sae_id}/attach", json={"layer": 0}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "layer"
    assert httpx.get(base + "/api/steering", timeout=10).json()["saes"][sae_id]["layer"] == LAYER
