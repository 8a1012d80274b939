"""Tool calling and streamed structured output on the bundled model (SmolLM2-135M-Instruct, whose template has
no tool support: the generic tool prompt is used), through the live server."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

MODEL = "SmolLM2-135M-Instruct"
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                   "unit": {"enum": ["celsius", "fahrenheit"]}},
                  "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                            "parameters": WEATHER_PARAMS}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
                                         "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def post(server: str, **body):
    return httpx.post(server + "/v1/chat/completions", json={"model": MODEL, "max_tokens": 60, "temperature": 0}
                      | body, timeout=300)


def sse(server: str, **body) -> list[dict]:
    with httpx.stream("POST", server + "/v1/chat/completions", timeout=300,
                      json={"model": MODEL, "max_tokens": 60, "temperature": 0, "stream": True} | body) as r:
        assert r.status_code == 200, r.read()
        frames = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


def test_a_named_tool_choice_is_called_with_valid_arguments(server):
    r = post(server, messages=ASK, tools=[WEATHER, TIME],
             tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.status_code == 200, r.text
    assert r.headers["X-miLLM-Constrained"] == 'tools;choice="function";name="get_weather"'
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER_PARAMS)


def test_required_calls_validate_for_every_seed(server):
    for seed in range(3):
        r = post(server, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", temperature=1.0, seed=seed,
                 max_tokens=120)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        calls = choice["message"]["tool_calls"]
        assert calls and choice["finish_reason"] in ("tool_calls", "length")
        schemas = {"get_weather": WEATHER_PARAMS, "get_time": TIME["function"]["parameters"]}
        for call in calls if choice["finish_reason"] == "tool_calls" else calls[:-1]:
            jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])


def test_auto_may_answer_in_text_and_none_always_does(server):
    auto = post(server, messages=[{"role": "user", "content": "Say hello."}], tools=[WEATHER])
    assert auto.status_code == 200, auto.text
    choice = auto.json()["choices"][0]
    if choice["message"].get("tool_calls"):
        assert choice["finish_reason"] in ("tool_calls", "length")
    else:
        assert choice["message"]["content"] and "<tool_call>" not in choice["message"]["content"]
    none = post(server, messages=ASK, tools=[WEATHER], tool_choice="none")
    assert none.status_code == 200 and "tool_calls" not in none.json()["choices"][0]["message"]
    assert "X-miLLM-Constrained" not in none.headers


def test_a_tool_result_turn_continues_the_conversation(server):
    first = post(server, messages=ASK, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False).json()
    message = first["choices"][0]["message"]
    call = message["tool_calls"][0]
    result = {"role": "tool", "tool_call_id": call["id"], "content": "18 degrees and sunny"}
    r = post(server, messages=[*ASK, message, result], tools=[WEATHER], max_tokens=40)
    assert r.status_code == 200, r.text
    assert "X-miLLM-Ignored-Fields" not in r.headers  # tool_calls and tool_call_id are read, not dropped
    answer = r.json()["choices"][0]["message"]
    assert answer["content"] or answer["tool_calls"]
    without = post(server, messages=[*ASK, message], tools=[WEATHER], max_tokens=1).json()
    assert r.json()["usage"]["prompt_tokens"] > without["usage"]["prompt_tokens"]  # the result reached the prompt
    plain = post(server, messages=[*ASK, message, result], max_tokens=20)  # no tools offered: history still renders
    assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"]


def test_streamed_tool_call_deltas_add_up_to_the_call(server):
    chunks = sse(server, messages=ASK, tools=[WEATHER], tool_choice={"type": "function",
                                                                     "function": {"name": "get_weather"}})
    calls = [d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["id"].startswith("call_") and calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    arguments = "".join(d["function"]["arguments"] for d in calls)
    jsonschema.validate(json.loads(arguments), WEATHER_PARAMS)
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "born": {"type": "string", "format": "date"}},
          "required": ["name", "born"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}


def test_streamed_response_format_yields_a_valid_document_and_a_cut_stream_ends_with_length(server):
    chunks = sse(server, messages=[{"role": "user", "content": "Name a famous scientist and their birth date."}],
                 response_format=FORMAT, max_tokens=80)
    pieces = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
    text = "".join(pieces)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(text), SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    cut = sse(server, messages=[{"role": "user", "content": "Name a scientist."}], response_format=FORMAT,
              max_tokens=4)
    assert [c["choices"][0]["finish_reason"] for c in cut if c["choices"]][-1] == "length"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in cut if c["choices"]).startswith("{")


@pytest.fixture(scope="module")
def steered_base(engine, settings, tmp_path_factory):
    """A server of its own with a random SAE attached at layer 10 (detached afterwards)."""
    from millm.server.app import create_app
    from tests.support.live import live_server
    from tests.support.saes import random_sae, write_saelens

    folder = write_saelens(tmp_path_factory.mktemp("saes") / "tools-l10", random_sae(576, 256, seed=11), layer=10)
    with live_server(create_app(settings, engine)) as base:
        sid = httpx.post(base + "/api/saes", json={"path": str(folder)}, timeout=30).json()["id"]
        assert httpx.post(base + f"/api/saes/{sid}/attach", json={}, timeout=30).status_code == 200
        try:
            yield base, sid
        finally:
            httpx.delete(base + "/api/steering", timeout=30)
            httpx.post(base + f"/api/saes/{sid}/detach", timeout=30)


def test_steering_and_profiles_apply_to_tool_calls(steered_base):
    base, sid = steered_base
    ask = {"messages": ASK, "tools": [WEATHER], "max_tokens": 80,
           "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    plain = post(base, **ask)
    profile = httpx.post(base + "/api/profiles", timeout=10, json={
        "name": "tools-steer", "entries": [{"sae": sid, "feature": 3, "strength": 200.0}]})
    assert profile.status_code in (201, 409), profile.text
    steered = post(base, **ask, profile="tools-steer")
    dialled_off = post(base, **ask, profile="tools-steer", steering_intensity="off")
    for r in (plain, steered, dialled_off):
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        [call] = choice["message"]["tool_calls"]
        if choice["finish_reason"] == "tool_calls":  # steered text may run to max_tokens inside the call
            jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER_PARAMS)
    assert steered.headers["X-miLLM-Steering"] == '"tools-steer"'
    arguments = [r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
                 for r in (plain, steered, dialled_off)]
    assert arguments[1] != arguments[0] and arguments[2] == arguments[0]  # steered, and the dial turns it off


def without_ids(choice: dict) -> dict:
    """A choice without its calls' ids (fresh for every response)."""
    calls = [{**c, "id": None} for c in choice["message"].get("tool_calls") or []]
    return {**choice, "message": {**choice["message"], "tool_calls": calls}}


def test_constrained_requests_are_batched_and_their_text_is_the_same_in_a_crowd(engine, settings):
    from concurrent.futures import ThreadPoolExecutor

    from millm.server.app import create_app
    from tests.support.live import live_server

    person = {"messages": [{"role": "user", "content": "Name a famous scientist and their birth date."}],
              "response_format": FORMAT, "max_tokens": 60}
    called = {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": "required", "max_tokens": 60}
    on = settings.model_copy(update={"batching": True, "batch_max_rows": 4, "batch_max_tokens": 4 * 512})
    with live_server(create_app(settings, engine)) as serial:
        alone = [post(serial, **body).json()["choices"][0] for body in (person, called)]
    with live_server(create_app(on, engine)) as base, ThreadPoolExecutor(4) as pool:
        crowd = [pool.submit(post, base, messages=[{"role": "user", "content": f"Tell me about {topic}."}],
                             max_tokens=40) for topic in ("rivers", "bread")]
        together = [pool.submit(post, base, **body) for body in (person, called)]
        batched = [f.result() for f in together]
        assert all(f.result().status_code == 200 for f in crowd)
        batch = httpx.get(base + "/api/health/inference", timeout=10).json()["batch"]
    for r in batched:
        assert r.status_code == 200, r.text
    assert [without_ids(r.json()["choices"][0]) for r in batched] == [without_ids(c) for c in alone]  # greedy
    assert alone[0]["finish_reason"] == "stop" and alone[1]["finish_reason"] == "tool_calls"
    assert batch["serial_fallbacks"] == {} and batch["batched_requests"] == 4  # the constrained ones too

    refusing = on.model_copy(update={"batching_constraints": "refuse"})  # the spec's rule, restored
    with live_server(create_app(refusing, engine)) as base:
        tools = post(base, **called)
        refused = post(base, **person)
    assert tools.status_code == 200 and tools.json()["choices"][0]["message"]["tool_calls"]
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "response_format"
    assert "MILLM_BATCHING_CONSTRAINTS" in refused.json()["error"]["message"]


def test_a_newline_after_a_complete_call_may_end_the_calls(engine):
    from millm.structured.tools import call_text, tool_constraint

    for parallel in (True, False):
        matcher = engine.constraints.matcher(tool_constraint([WEATHER, TIME], "required", parallel))
        call = call_text("get_weather", '{"city": "Paris", "unit": "celsius"}')
        assert matcher.consume_tokens(engine.tokenizer.encode(call + "\n")), matcher.get_error()
        assert matcher.is_accepting()  # the end is allowed after the newline the model writes there
    assert matcher.consume_tokens(engine.tokenizer.encode("\n")) and matcher.is_accepting()
    second = engine.constraints.matcher(tool_constraint([WEATHER, TIME], "required"))
    assert second.consume_tokens(engine.tokenizer.encode(call + "\n" + call_text("get_time", '{"zone": "CET"}')))


def test_required_with_a_clients_defaults_ends_in_valid_calls(server):
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="not-needed", max_retries=0)
    schemas = {"get_weather": WEATHER_PARAMS, "get_time": TIME["function"]["parameters"]}
    for seed in range(3):  # parallel_tool_calls and temperature left to their defaults (true, 1.0)
        reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME],
                                               tool_choice="required", seed=seed, max_tokens=120)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        for call in choice.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_stop_applies_to_the_text_around_calls_never_inside_them(server):
    agent_stops = ["Observation:", "Calling tools:"]  # what smolagents sends with every step
    called = post(server, messages=ASK, tools=[WEATHER], tool_choice="required", stop=agent_stops + ['"'])
    assert called.status_code == 200, called.text
    choice = called.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"  # '"' is in every call, which is never cut
    jsonschema.validate(json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]), WEATHER_PARAMS)

    hello = {"messages": [{"role": "user", "content": "Say hello to me."}], "tools": [WEATHER], "max_tokens": 30}
    free = post(server, **hello).json()["choices"][0]["message"]
    assert free["content"] and not free.get("tool_calls")  # this prompt is answered in text
    word = free["content"].split()[2]
    cut = post(server, **hello, stop=[word]).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["message"]["content"] == free["content"][:free["content"].index(word)]

    both = post(server, **hello, stop=[word], response_format={"type": "json_object"})
    assert both.status_code == 400 and both.json()["error"]["param"] == "response_format"


def test_undeclared_properties_are_not_generated(server):
    open_schema = {"type": "object", "properties": {"when": {"type": "string", "maxLength": 20},
                                                    "where": {"type": "string", "maxLength": 20}},
                   "required": ["when"]}  # additionalProperties unset: Pydantic's default
    r = post(server, messages=[{"role": "user", "content": "When and where was the moon landing?"}], max_tokens=80,
             response_format={"type": "json_schema", "json_schema": {"name": "event", "schema": open_schema}})
    assert r.status_code == 200, r.text
    assert r.headers["X-miLLM-Constrained"] == 'json_schema;name="event";undeclared=omitted'
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert set(json.loads(choice["message"]["content"])) <= {"when", "where"}


def test_a_prompt_too_long_says_what_its_tool_listings_take(server):
    tools = [WEATHER, TIME]
    sizes = [post(server, messages=ASK, max_tokens=1, **extra).json()["usage"]["prompt_tokens"]
             for extra in ({}, {"tools": tools})]
    r = post(server, messages=ASK, tools=tools, max_tokens=8192)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert f"The listings of the 2 tools take {sizes[1] - sizes[0]} of the prompt's {sizes[1]} tokens." \
        in r.json()["error"]["message"]
