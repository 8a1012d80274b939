"""The fast tier: ``steering_intensity`` decided by the field table and parsed by the request builder."""

from __future__ import annotations

import asyncio

import pytest

from millm.config import Settings
from millm.errors import FieldNotHonoured, InvalidParameter
from millm.requests.builder import build_chat, build_completion
from millm.requests.fields import USE, policy
from millm.steering.intensity import Symbol
from tests.support.fakes import FakeEngine

MESSAGES = [{"role": "user", "content": "hi"}]


def chat(engine: str = "transformers", **extra):
    return build_chat({"model": "m", "messages": MESSAGES, **extra}, lambda _: engine)


@pytest.mark.parametrize("value,dial", [(None, None), (0.5, 0.5), (2, 2.0), (0, Symbol.OFF), (0.0, Symbol.OFF),
                                        ("off", Symbol.OFF), ("min", Symbol.MIN), ("max", Symbol.MAX)])
def test_chat_on_transformers_carries_the_parsed_dial(value, dial):
    assert policy("steering_intensity", "chat", "transformers") == USE
    built = chat(steering_intensity=value)
    assert built.intensity == dial and "steering_intensity" not in built.ignored


@pytest.mark.parametrize("value", [2.01, -0.5, "0.5", "MAX", "loud", True, [1], {"lambda": 1}, float("nan")])
def test_bad_values_are_400_naming_the_field(value):
    with pytest.raises(InvalidParameter) as exc:
        chat(steering_intensity=value)
    assert exc.value.param == "steering_intensity" and exc.value.status == 400


@pytest.mark.parametrize("build", [
    lambda: chat("llama.cpp", steering_intensity=1.0),
    lambda: chat(steering_intensity=1.0, logprobs=True, max_tokens=1),
    lambda: build_completion({"model": "m", "prompt": "hi", "steering_intensity": 1.0}, lambda _: "transformers"),
], ids=["gguf", "chat-scoring", "completions"])
def test_refused_where_the_table_refuses_it(build):
    with pytest.raises(FieldNotHonoured) as exc:
        build()
    assert exc.value.param == "steering_intensity"


def test_an_engine_without_hooks_refuses_the_dial(tmp_path):
    from millm.server.app import create_app

    app = create_app(Settings(home=tmp_path), FakeEngine())

    async def scenario():
        async with app.test_app():
            r = await app.test_client().post("/v1/chat/completions", json={
                "model": "fake", "messages": MESSAGES, "max_tokens": 2, "steering_intensity": 0.5})
            return r.status_code, await r.get_json()

    status, body = asyncio.run(scenario())
    assert status == 400 and body["error"]["code"] == "field_not_honoured"
    assert body["error"]["param"] == "steering_intensity"


@pytest.mark.parametrize("served", [True, False])
def test_gguf_steering_is_the_serving_settings_not_the_process_ones(served, monkeypatch):
    """MILLM_GGUF_STEERING is read from the settings the request is served with (the server's Limits), whatever
    the process-wide settings say: CI's server fixture set it on its own settings while the process-wide ones,
    rebuilt by another test, said the opposite, and every profile on GGUF chat was refused."""
    from millm import config
    from millm.requests.limits import Limits

    monkeypatch.setattr(config, "get_settings", lambda: Settings(gguf_steering=not served))
    limits = Limits.of(Settings(gguf_steering=served))
    body = {"model": "m", "messages": MESSAGES, "profile": "p", "steering_intensity": 0.5}
    if served:
        built = build_chat(body, lambda _: "llama.cpp", limits=limits)
        assert built.profile == "p" and built.intensity == 0.5 and built.ignored == []
    else:
        with pytest.raises(FieldNotHonoured) as exc:
            build_chat(body, lambda _: "llama.cpp", limits=limits)
        assert exc.value.param in ("profile", "steering_intensity")
    with pytest.raises(FieldNotHonoured):  # completions keep the spec's refusal either way
        build_completion({"model": "m", "prompt": "hi", "profile": "p"}, lambda _: "llama.cpp", limits=limits)
