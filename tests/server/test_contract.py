"""The fast tier: the /v1 wire contract against a scripted engine, through Quart's test client.

No model, no torch work: field table, strict mode, headers, SSE framing, backpressure, cancellation
and model swaps in milliseconds. The same behaviours are tested on the real model elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from millm.config import Settings
from millm.engine.base import Engine
from millm.errors import ModelNotFound
from millm.registry import ModelEntry
from tests.support.app import chat, frames, make, run
from tests.support.fakes import SCRIPT, FakeEngine

Run = Callable[[Callable[[Any], Awaitable[Any]]], Any]


def test_strict_mode_refuses_fields_found_on_every_path(tmp_path):
    app, _ = make(tmp_path)

    async def scenario(client):
        strict = {"X-miLLM-Strict": "true"}
        generating = await client.post("/v1/completions", headers=strict, json={
            "model": "fake", "prompt": "hi", "max_tokens": 2, "return_tokens_as_token_ids": True})
        scoring = await client.post("/v1/completions", headers=strict, json={
            "model": "fake", "prompt": "hi", "max_tokens": 1, "logprobs": 2, "top_p": 0.5})
        lenient = await client.post("/v1/completions", json={
            "model": "fake", "prompt": "hi", "max_tokens": 1, "logprobs": 2, "top_p": 0.5})
        return generating, await generating.get_json(), scoring, await scoring.get_json(), lenient

    generating, g_body, scoring, s_body, lenient = run(app, scenario)
    assert generating.status_code == 400 and g_body["error"]["code"] == "unused_fields_refused"
    assert "return_tokens_as_token_ids" in g_body["error"]["message"]
    assert scoring.status_code == 400 and s_body["error"]["code"] == "unused_fields_refused"
    assert s_body["error"]["param"] == "top_p"
    assert lenient.status_code == 200 and lenient.headers["X-miLLM-Ignored-Fields"] == '"top_p"'


def test_streamed_request_past_the_queue_is_a_503_before_the_stream(tmp_path):
    app, engine = make(tmp_path, max_queue=1)
    engine.gate.clear()

    async def scenario(client):
        first = asyncio.create_task(client.post("/v1/chat/completions", json=chat(stream=True, max_tokens=3)))
        await asyncio.to_thread(engine.started.wait, 10)
        second = await client.post("/v1/chat/completions", json=chat(stream=True, max_tokens=3))
        refused = (second.status_code, second.mimetype, await second.get_json())
        engine.gate.set()
        done = await first
        return refused, done.status_code, await done.get_data()

    (status, mimetype, body), first_status, first_data = run(app, scenario)
    assert status == 503 and mimetype == "application/json"
    assert body["error"]["code"] == "queue_full"
    assert first_status == 200 and frames(first_data)[-1] == "data: [DONE]"


def test_sse_framing_role_deltas_finish_usage_done(tmp_path):
    app, _ = make(tmp_path)

    async def scenario(client):
        response = await client.post("/v1/chat/completions", json=chat(stream=True, max_tokens=5, foo=1))
        return response, await response.get_data()

    response, data = run(app, scenario)
    parts = frames(data)
    chunks = [json.loads(p.removeprefix("data: ")) for p in parts[:-1]]
    assert response.headers["X-miLLM-Ignored-Fields"] == '"foo"'
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:])
    assert text == SCRIPT[:5]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["completion_tokens"] == 5
    assert parts[-1] == "data: [DONE]"


def test_stop_sequence_ends_the_stream_within_one_step(tmp_path):
    app, engine = make(tmp_path)

    async def scenario(client):
        response = await client.post("/v1/chat/completions", json=chat(stream=True, stop=["fake"], max_tokens=80))
        return await response.get_data()

    data = run(app, scenario)
    chunks = [json.loads(p.removeprefix("data: ")) for p in frames(data)[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == SCRIPT[:SCRIPT.index("fake")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert engine.steps == SCRIPT.index("fake") + len("fake")  # the step that completed the stop was the last


def test_field_table_refusals_and_no_change_values(tmp_path):
    app, _ = make(tmp_path)

    async def scenario(client):
        refused = await client.post("/v1/chat/completions", json=chat(functions=[{"name": "f"}]))
        accepted = await client.post("/v1/chat/completions", json=chat(n=1, tools=[], logit_bias={}, max_tokens=2,
                                                                         response_format={"type": "text"}))
        streamed_n = await client.post("/v1/chat/completions", json=chat(n=2, stream=True))
        return [(r.status_code, await r.get_json()) for r in (refused, accepted, streamed_n)]

    (s1, b1), (s2, b2), (s3, b3) = run(app, scenario)
    assert s1 == 400 and b1["error"]["code"] == "field_not_honoured" and b1["error"]["param"] == "functions"
    assert s2 == 200 and b2["choices"][0]["message"]["content"] == SCRIPT[:2]
    assert s3 == 400 and b3["error"]["param"] == "n"


def test_gguf_engine_refuses_what_it_cannot_do(tmp_path):
    app, _ = make(tmp_path, FakeEngine(engine_name="llama.cpp"))

    async def scenario(client):
        seeded = await client.post("/v1/chat/completions", json=chat(n=2))
        scoring = await client.post("/v1/completions", json={"model": "fake", "prompt": "x", "max_tokens": 1,
                                                              "logprobs": 1})
        return [(r.status_code, await r.get_json()) for r in (seeded, scoring)]

    (s1, b1), (s2, b2) = run(app, scenario)
    assert s1 == 400 and b1["error"]["code"] == "field_not_honoured" and b1["error"]["param"] == "n"
    assert s2 == 400 and b2["error"]["param"] == "logprobs"


def test_engine_refuses_unsupported_asks_even_when_the_table_is_bypassed():
    from millm.errors import FieldNotHonoured
    from millm.requests.builder import build_chat

    engine = FakeEngine(engine_name="llama.cpp")
    built = build_chat(chat(seed=1, response_format={"type": "json_object"}), lambda _: "transformers")
    with pytest.raises(FieldNotHonoured) as info:
        engine.prepare(built.generations[0])
    assert info.value.param == "response_format"


def test_scoring_headers_and_seed_echo(tmp_path):
    app, _ = make(tmp_path)

    async def scenario(client):
        r = await client.post("/v1/completions", json={"model": "fake", "prompt": "abc", "max_tokens": 1,
                                                       "logprobs": 2, "seed": 9})
        return r, await r.get_json()

    response, body = run(app, scenario)
    assert response.headers["X-miLLM-Seed"] == '9;scope="request"'
    assert response.headers["X-miLLM-Steering"] == "none"
    assert body["usage"]["prompt_tokens"] == 3 and body["choices"][0]["logprobs"]["text_offset"] == [3]


def test_model_swap_answers_busy_while_loading_then_serves_the_new_model(tmp_path):
    from millm.server.app import create_app

    release = threading.Event()
    loading = threading.Event()
    entries = {"fake-b": ModelEntry(id="fake-b", engine="transformers", source="path", path=Path(__file__))}

    def registry(name: str) -> ModelEntry:
        if name not in entries:
            raise ModelNotFound(name)
        return entries[name]

    def loader(entry: ModelEntry, settings: Settings) -> Engine:
        loading.set()
        release.wait(10)
        return FakeEngine(entry.id)

    old = FakeEngine()
    app = create_app(Settings(home=tmp_path), old, loader=loader, registry=registry)
    app.extensions["millm"].manager.preflight = lambda target, current: None

    async def scenario(client):
        swap = asyncio.create_task(client.post("/v1/chat/completions", json={**chat(max_tokens=2), "model": "fake-b"}))
        await asyncio.to_thread(loading.wait, 10)
        busy = await client.post("/v1/chat/completions", json=chat(max_tokens=2))
        unknown = await client.get("/v1/models/nope")
        release.set()
        swapped = await swap
        return (busy.status_code, await busy.get_json(), unknown.status_code, swapped.status_code,
                await swapped.get_json())

    busy_status, busy_body, unknown_status, status, body = run(app, scenario)
    assert busy_status == 503 and busy_body["error"]["code"] == "model_busy"
    assert unknown_status == 404
    assert status == 200 and body["model"] == "fake-b" and old.closed


def test_disconnected_stream_cancels_at_the_next_step(tmp_path):
    app, engine = make(tmp_path)
    engine.pause_after = 1

    async def scenario(client):
        from millm.engine.base import StepControl
        from millm.server.state import Services

        services: Services = app.extensions["millm"]
        control_seen: list[StepControl] = []

        def make_events(control: StepControl):
            control_seen.append(control)
            from millm.requests.builder import build_chat

            built = build_chat(chat(max_tokens=60), lambda _: "transformers")
            return engine.generate(built.generations[0], control)

        events = services.worker.stream(make_events)
        first = await events.__anext__()
        await events.aclose()  # the consumer leaves, as a disconnected client's response does
        engine.gate.set()
        await services.worker.admitted.wait_idle(10)
        return first, control_seen[0].cancel.is_set()

    first, cancelled = run(app, scenario)
    assert cancelled and first.text == SCRIPT[0]
    assert engine.steps == 1  # the decode loop saw the cancel at its next step boundary


def test_context_errors_name_the_prompt_that_does_not_fit(tmp_path):
    app, _ = make(tmp_path, FakeEngine(context_window=32))

    async def scenario(client):
        one = await client.post("/v1/completions", json={"model": "fake", "prompt": "x" * 40, "max_tokens": 2})
        listed = await client.post("/v1/completions", json={"model": "fake", "prompt": ["ok", "y" * 40],
                                                            "max_tokens": 2})
        chat_ = await client.post("/v1/chat/completions", json=chat(max_tokens=40))
        return [(r.status_code, (await r.get_json())["error"]) for r in (one, listed, chat_)]

    (s1, e1), (s2, e2), (s3, e3) = run(app, scenario)
    assert s1 == s2 == s3 == 400 and {e1["code"], e2["code"], e3["code"]} == {"context_length_exceeded"}
    assert (e1["param"], e2["param"], e3["param"]) == ("prompt", "prompt[1]", "messages")


def test_template_kwargs_that_clash_and_unsafe_schema_names_are_refused(tmp_path):
    app, _ = make(tmp_path)
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
              "additionalProperties": False}

    async def scenario(client):
        clash = await client.post("/v1/chat/completions", json=chat(chat_template_kwargs={"tokenize": True}))
        template = await client.post("/v1/chat/completions", json=chat(chat_template_kwargs={
            "chat_template": "{% for x in range(10**9) %}{% endfor %}"}))
        name = await client.post("/v1/chat/completions", json=chat(response_format={
            "type": "json_schema", "json_schema": {"name": "bad\r\nname", "schema": schema}}))
        return [(r.status_code, (await r.get_json())["error"]["param"]) for r in (clash, template, name)]

    assert run(app, scenario) == [(400, "chat_template_kwargs.tokenize"), (400, "chat_template_kwargs.chat_template"),
                                  (400, "response_format")]
