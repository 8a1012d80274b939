"""return_sae_activations' ``token_text`` and ``labels`` on the bundled model and its bundled, labelled SAE."""

import json

import httpx
import pytest

from millm.engine.params import ChatPrompt
from tests.support.live import live_server

MODEL = "SmolLM2-135M-Instruct"
SAE = "smollm2-135m-res-L10"
TEXT = "The capital of France is Paris, and the capital of Italy is"
MESSAGES = [{"role": "user", "content": "Name one city in France."}]
ASK = {"positions": "all", "top_k": 4, "token_text": True, "labels": True}


@pytest.fixture(scope="module")
def base(engine, settings):
    from millm.server.app import create_app

    with live_server(create_app(settings, engine)) as url:
        attached = httpx.post(url + f"/api/saes/{SAE}/attach", json={}, timeout=60)
        assert attached.status_code == 200, attached.text
        try:
            yield url
        finally:
            httpx.post(url + f"/api/saes/{SAE}/detach", timeout=60)


@pytest.fixture(scope="module")
def labels():
    from millm.sae.bundled import BUNDLED_DIR

    lines = (BUNDLED_DIR / SAE / "features.jsonl").read_text().splitlines()
    return {item["index"]: item["label"] for item in map(json.loads, lines)}


def post(base, route, **body):
    r = httpx.post(base + f"/v1/{route}", json={"model": MODEL, "temperature": 0, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r


def check_labels(acts, labels):
    feats = [f for p in acts["positions"] for f in p["features"]]
    assert feats and all(f["label"] == labels.get(f["index"]) for f in feats)
    assert any(f["label"] is not None for f in feats)


def test_completion_tokens_join_to_the_text_and_labels_match(base, engine, labels):
    r = post(base, "completions", prompt=TEXT, max_tokens=3, return_sae_activations=ASK).json()
    acts = r["millm"]["sae_activations"]
    prompt_tokens = r["usage"]["prompt_tokens"]
    texts = [p["token"] for p in acts["positions"]]
    assert "".join(texts[:prompt_tokens]) == TEXT
    assert r["choices"][0]["text"].startswith("".join(texts[prompt_tokens:]))  # the last token was never fed back
    assert all(engine.tokenizer.decode([p["token_id"]]) == p["token"] for p in acts["positions"])
    check_labels(acts, labels)
    plain = post(base, "completions", prompt=TEXT, max_tokens=3,
                 return_sae_activations={"positions": "all", "top_k": 4}).json()["millm"]["sae_activations"]
    assert all(set(p) == {"position", "token_id", "features"} for p in plain["positions"])
    assert all(set(f) == {"index", "value"} for p in plain["positions"] for f in p["features"])
    assert [p["features"] for p in plain["positions"]] == [
        [{"index": f["index"], "value": f["value"]} for f in p["features"]] for p in acts["positions"]]


def test_chat_streaming_and_scoring_carry_tokens_and_labels(base, engine, labels):
    rendered = engine.tokenizer.decode(engine.tokenize(ChatPrompt(MESSAGES)))
    r = post(base, "chat/completions", messages=MESSAGES, max_tokens=2, stream=True,
             return_sae_activations={**ASK, "positions": "prompt"})
    frames = r.text.strip().split("\n\n")
    acts = json.loads(frames[-2][6:])["millm"]["sae_activations"]
    assert "".join(p["token"] for p in acts["positions"]) == rendered and "France" in rendered
    check_labels(acts, labels)
    scored = post(base, "chat/completions", messages=MESSAGES, max_tokens=1, logprobs=True,
                  return_sae_activations={**ASK, "labels": False}).json()["millm"]["sae_activations"]
    assert scored["read_point"] == "unsteered"
    assert "".join(p["token"] for p in scored["positions"]) == rendered
    assert all("label" not in f for p in scored["positions"] for f in p["features"])
    text = post(base, "completions", prompt=TEXT, max_tokens=1, logprobs=0,
                return_sae_activations={"positions": "prompt", "labels": True}).json()["millm"]["sae_activations"]
    assert all("token" not in p for p in text["positions"])
    check_labels(text, labels)


@pytest.mark.parametrize("key", ["token_text", "labels"])
def test_non_boolean_is_refused_naming_the_key(base, key):
    for route, body in (("completions", {"prompt": TEXT, "max_tokens": 1}),
                        ("completions", {"prompt": TEXT, "max_tokens": 1, "logprobs": 0})):
        r = httpx.post(base + f"/v1/{route}", timeout=60,
                       json={"model": MODEL, **body, "return_sae_activations": {key: "yes"}})
        assert r.status_code == 400 and r.json()["error"]["param"] == f"return_sae_activations.{key}", r.text
