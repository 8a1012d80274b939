"""Audit fixes (issue 16) on the bundled model through the live server: SAE activations on scoring
requests (read unsteered), and a stop sequence cancelling a stream promptly (decode steps counted)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.live import live_server
from tests.support.saes import random_sae, write_saelens

MODEL = "SmolLM2-135M-Instruct"
LAYER = 10
FEATURE = 7
PROMPT = "The weather today is"


@pytest.fixture(scope="module")
def base(engine, settings):
    from millm.server.app import create_app

    with live_server(create_app(settings, engine)) as url:
        yield url


@pytest.fixture(scope="module")
def sae_id(base, tmp_path_factory):
    folder = write_saelens(tmp_path_factory.mktemp("saes") / "audit-l10", random_sae(576, 512, seed=11), layer=LAYER)
    r = httpx.post(base + "/api/saes", json={"path": str(folder)}, timeout=30)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert httpx.post(base + f"/api/saes/{sid}/attach", json={}, timeout=30).status_code == 200
    yield sid
    httpx.delete(base + "/api/steering", timeout=30)
    httpx.post(base + f"/api/saes/{sid}/detach", timeout=30)


def post(base: str, route: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{base}/v1/{route}", json={"model": MODEL, **body}, timeout=120)


def score(base: str, ask: dict[str, Any], **body: Any) -> httpx.Response:
    return post(base, "completions", prompt=PROMPT, max_tokens=1, logprobs=2, return_sae_activations=ask, **body)


def by_position(acts: dict[str, Any]) -> dict[int, dict[int, float]]:
    return {p["position"]: {f["index"]: f["value"] for f in p["features"]} for p in acts["positions"]}


def test_scoring_serves_activations_read_unsteered(base, sae_id, engine):
    from millm.engine.params import TextPrompt

    r = score(base, {"positions": "all", "features": [FEATURE, 3, 9]})
    assert r.status_code == 200, r.text
    assert r.headers["X-miLLM-Steering"] == "none"
    acts = r.json()["millm"]["sae_activations"]
    assert acts["sae_id"] == sae_id and acts["layer"] == LAYER and acts["read_point"] == "unsteered"
    ids = engine.tokenize(TextPrompt(PROMPT))
    assert [p["token_id"] for p in acts["positions"]] == ids  # every prompt position; nothing is generated
    assert r.json()["choices"][0]["logprobs"]["top_logprobs"]  # the scoring answer is still there
    # live steering on this very SAE changes nothing: the pass is unsteered
    httpx.put(base + "/api/steering", json={"sae": sae_id, "values": {str(FEATURE): 150.0}}, timeout=30)
    try:
        steered = score(base, {"positions": "all", "features": [FEATURE, 3, 9]})
        assert steered.headers["X-miLLM-Steering"] == "none"
        assert by_position(steered.json()["millm"]["sae_activations"]) == by_position(acts)
        # ... and a generation reading before this layer's delta sees the same prompt activations
        gen = post(base, "completions", prompt=PROMPT, max_tokens=2, temperature=0, return_sae_activations={
            "positions": "prompt", "features": [FEATURE, 3, 9], "read_point": "pre_steering"}).json()
        read = by_position(gen["millm"]["sae_activations"])
        for position, values in by_position(acts).items():
            assert values == pytest.approx(read[position], abs=1e-3)
    finally:
        httpx.delete(base + "/api/steering", timeout=30)


def test_chat_scoring_activations_and_positions(base, sae_id):
    messages = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
    r = post(base, "chat/completions", messages=messages, max_tokens=1, logprobs=True,
             return_sae_activations={"positions": "last", "top_k": 3})
    assert r.status_code == 200, r.text
    acts = r.json()["millm"]["sae_activations"]
    assert [p["position"] for p in acts["positions"]] == [r.json()["usage"]["prompt_tokens"] - 1]
    assert len(acts["positions"][0]["features"]) <= 3 and acts["read_point"] == "unsteered"
    empty = score(base, {"positions": "completion"}).json()["millm"]["sae_activations"]
    assert empty["positions"] == []
    assert "millm" not in post(base, "completions", prompt=PROMPT, max_tokens=1, logprobs=2).json()


def test_scoring_activation_refusals(base, sae_id):
    bad = score(base, {"top_k": 65})
    assert bad.status_code == 400 and "SAE_ACTIVATIONS_MAX_TOP_K" in bad.json()["error"]["message"]
    listed = post(base, "completions", prompt=["a", "b"], max_tokens=1, logprobs=2, return_sae_activations={})
    assert listed.status_code == 400 and listed.json()["error"]["param"] == "return_sae_activations"
    reported = score(base, {"positions": "last", "shade": "blue"})
    assert reported.status_code == 200 and reported.headers["X-miLLM-Ignored-Fields"] == \
        '"return_sae_activations.shade"'


def test_a_stop_match_cancels_the_stream_at_once(base, engine):
    """Every forward pass of the model is counted: the stream that stops on a string runs exactly as many as
    the tokens it sampled, far fewer than max_tokens."""
    messages = [{"role": "user", "content": "Write two sentences about the sea."}]
    reference = post(base, "chat/completions", messages=messages, max_tokens=40, temperature=0).json()
    text = reference["choices"][0]["message"]["content"]
    words = text.split()
    assert len(words) > 6, text
    stop = words[4]
    forwards = []
    handle = engine.model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        r = post(base, "chat/completions", messages=messages, max_tokens=400, temperature=0, stream=True, stop=[stop])
    finally:
        handle.remove()
    chunks = [json.loads(f[6:]) for f in r.text.strip().split("\n\n")[:-1]]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert streamed == text[:text.index(stop)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    sampled = chunks[-1]["usage"]["completion_tokens"]
    assert len(forwards) == sampled  # the prefill samples the first token; no forward after the stop matched
    assert sampled <= reference["usage"]["completion_tokens"] < 400


def test_json_object_with_a_schema_is_enforced(base):
    """llama.cpp server's shape: the schema is the constraint, not just "some JSON object"."""
    schema = {"type": "object", "properties": {"mood": {"enum": ["calm", "stormy"]}}, "required": ["mood"],
              "additionalProperties": False}
    r = post(base, "chat/completions", messages=[{"role": "user", "content": "Describe the sea as JSON."}],
             max_tokens=40, temperature=0, response_format={"type": "json_object", "schema": schema})
    assert r.status_code == 200, r.text
    assert r.headers["X-miLLM-Constrained"] == "json_object;schema"
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert json.loads(choice["message"]["content"])["mood"] in ("calm", "stormy")
