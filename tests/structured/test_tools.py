"""Tool calling, fast tier: checking tools and tool_choice, the grammar's shape, splitting generated text into
content and calls, the chat-template rendering of tools and history, and the /v1 shapes (whole and streamed)
against the scripted engine through Quart's test client."""

from __future__ import annotations

import json
from typing import Any

import pytest

from millm.engine.templates import TOOLS_KWARG, generic_messages, native_tools, render_chat
from millm.errors import InvalidParameter
from millm.structured.tools import (
    OPEN,
    ToolCallParser,
    ToolConstraint,
    call_text,
    check_tool_history,
    split,
    tool_constraint,
)
from tests.support.app import frames, make, run
from tests.support.fakes import FakeEngine

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}
ARGS = '{"city": "Paris"}'
CALL = call_text("get_weather", ARGS)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "fake", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
            **extra}


def constraint(**kw: Any) -> ToolConstraint:
    made = tool_constraint(kw.pop("tools", [WEATHER, TIME]), kw.pop("tool_choice", None), **kw)
    assert made is not None
    return made


# checking
@pytest.mark.parametrize("tools,choice,param", [
    ("x", None, "tools"),
    ([{"type": "function"}], None, "tools[0].function"),
    ([{"type": "retrieval"}], None, "tools[0]"),
    ([{"type": "function", "function": {"name": "has space"}}], None, "tools[0].function.name"),
    ([WEATHER, WEATHER], None, "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], None,
     "tools[0].function.parameters"),
    ([WEATHER], "sometimes", "tool_choice"),
    ([WEATHER], {"type": "function", "function": {"name": "get_time"}}, "tool_choice.function.name"),
    ([WEATHER], {"type": "function"}, "tool_choice"),
])
def test_bad_tools_and_choices_name_the_field(tools, choice, param):
    with pytest.raises(InvalidParameter) as exc:
        tool_constraint(tools, choice)
    assert exc.value.param == param


def test_parameters_keep_to_the_enforced_subset_and_name_the_tool():
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True},
                                         "n": {"type": "integer", "multipleOf": 2}}}}}
    with pytest.raises(InvalidParameter) as exc:
        tool_constraint([tool], None)
    assert exc.value.param == "tools[0].function.parameters"
    assert "'uniqueItems' at '/properties/tags/uniqueItems'" in exc.value.message
    assert "'multipleOf' at '/properties/n/multipleOf'" in exc.value.message


def test_choices_and_what_they_constrain():
    assert tool_constraint([WEATHER], "none") is None  # plain text
    assert tool_constraint(None, "auto") is None and tool_constraint([], None) is None
    assert tool_constraint(None, "required") is None  # nothing to call: reported by the field table
    auto = constraint()
    assert (auto.choice, auto.forced, auto.parallel) == ("auto", None, True)
    assert auto.header() == 'tools;choice="auto";undeclared=omitted'  # their objects leave it unset
    literal = constraint(undeclared="allow")
    assert literal.header() == 'tools;choice="auto"' and '"additionalProperties": false' not in literal.grammar()
    assert '"additionalProperties": false' in auto.grammar() and literal.key != auto.key
    named = constraint(tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert (named.choice, named.forced) == ("function", "get_time")
    assert named.header() == 'tools;choice="function";name="get_time";undeclared=omitted'
    assert [t["function"]["name"] for t in named.prompt_tools()] == ["get_time"]
    assert constraint(parallel=False).parallel is False
    assert constraint().tools[1].parameters == {"type": "object", "properties": {"zone": {"type": "string"}}}
    bare = constraint(tools=[{"type": "function", "function": {"name": "ping"}}])
    assert bare.tools[0].parameters == {"type": "object"}  # no parameters: any object
    with pytest.raises(InvalidParameter):
        tool_constraint([WEATHER], None, parallel="yes")


def test_grammar_fixes_the_wrapper_and_lists_only_callable_tools():
    auto = constraint().grammar()
    assert "start: TEXT | lead calls" in auto and '"get_weather\\", \\"arguments\\": "' in auto
    assert "args1: %json" in auto and '"x-guidance": {"whitespace_pattern": "[ ]?"}' in auto
    required = constraint(tool_choice="required", parallel=False).grammar()
    assert required.splitlines()[1] == f"start: {json.dumps(OPEN)} calls" and "calls: call END?\n" in required
    # after a complete call the model may end, a few blanks first (a newline is what it writes most)
    assert "calls: call (" in auto and " call)* END?\n" in auto and 'END: /[ \\t\\r\\n]{1,4}/' in auto
    named = constraint(tool_choice={"type": "function", "function": {"name": "get_time"}}).grammar()
    assert "get_weather" not in named and "get_time" in named
    assert len({constraint().key, constraint(parallel=False).key, constraint(tool_choice="required").key}) == 3


# splitting generated text
TWO = CALL + "\n" + call_text("get_time", '{"zone": "CET"}')


@pytest.mark.parametrize("text,content,calls", [
    ("It is sunny.", "It is sunny.", []),
    (CALL, "", [("get_weather", ARGS)]),
    ("Let me look." + CALL, "Let me look.", [("get_weather", ARGS)]),
    (TWO, "", [("get_weather", ARGS), ("get_time", '{"zone": "CET"}')]),
    (CALL + "\n", "", [("get_weather", ARGS)]),  # the blanks the grammar lets end the calls are nobody's
    ("a <tool_ call", "a <tool_ call", []),
    ("ends with <tool_c", "ends with <tool_c", []),  # held back while it could open a call, then content
    (call_text("get_weather", '{"city": "Pa}ris\\" {"}'), "", [("get_weather", '{"city": "Pa}ris\\" {"}')]),
])
def test_split_and_streamed_pieces_agree(text, content, calls):
    whole_content, whole_calls = split(constraint(), text)
    assert whole_content == content and [(c.name, c.arguments) for c in whole_calls] == calls
    parser = ToolCallParser()
    pieces = [p for ch in text for p in parser.feed(ch)] + parser.close()
    assert "".join(p.text for p in pieces if p.kind == "content") == content
    assert [p.text for p in pieces if p.kind == "call"] == [name for name, _ in calls]
    for i, (_, arguments) in enumerate(calls):
        assert "".join(p.text for p in pieces if p.kind == "arguments" and p.call == i) == arguments
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in parser.calls)


def test_a_cut_call_keeps_its_partial_arguments_and_answers_only_open_a_call():
    content, calls = split(constraint(), CALL[:-20])
    assert content == "" and calls[0].name == "get_weather" and calls[0].arguments == ARGS[:-6]
    parser = ToolCallParser(lead=False)  # a response_format answer beside the tools: the marker inside it is text
    assert "".join(p.text for p in parser.feed('{"a": "' + CALL + '"}') + parser.close()) == '{"a": "' + CALL + '"}'
    assert parser.calls == []


# history and templates
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                                                         "function": {"name": "get_weather", "arguments": ARGS}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
]


def test_generic_rendering_of_tools_calls_and_results():
    out = generic_messages(HISTORY, [WEATHER])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n# Tools") and json.dumps(WEATHER) in out[0]["content"]
    assert out[2]["content"] == CALL
    assert out[3]["content"] == ("<tool_response>\n18C, sunny\n</tool_response>\n"
                                 "<tool_response>\n12:00\n</tool_response>")
    assert generic_messages(HISTORY[1:2], [WEATHER])[0]["role"] == "system"


class Template:
    """A tokenizer stand-in: records what the template was given."""

    def __init__(self, template: str) -> None:
        self.chat_template = template
        self.seen: dict[str, Any] = {}

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        self.seen = {"messages": messages, **kwargs}
        return "rendered"


def test_native_templates_get_tools_and_calls_with_arguments_as_objects():
    native = Template("{% if tools %}<tools>{% endif %}<tool_call>{{ tool_call.arguments | tojson }}</tool_call>")
    assert native_tools(native) and not native_tools(Template("{{ messages }}"))
    render_chat(native, HISTORY, {TOOLS_KWARG: [WEATHER], "enable_thinking": False})
    assert native.seen["tools"] == [WEATHER] and native.seen["enable_thinking"] is False
    assert native.seen["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert native.seen["messages"][3] == HISTORY[3]
    plain = Template("{{ messages }}")
    render_chat(plain, HISTORY, {TOOLS_KWARG: [WEATHER]})
    assert "tools" not in plain.seen and plain.seen["messages"] == generic_messages(HISTORY, [WEATHER])


def test_history_calls_are_checked():
    bad = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}]
    with pytest.raises(InvalidParameter) as exc:
        check_tool_history(bad)
    assert exc.value.param == "messages[1].tool_calls[0]"
    with pytest.raises(InvalidParameter) as exc:
        check_tool_history([{"role": "assistant", "tool_calls": "x"}], "extra_messages[0]")
    assert exc.value.param == "extra_messages[0][0].tool_calls"


# the /v1 shapes against the scripted engine
def post(app: Any, *bodies: dict[str, Any]) -> list[tuple[int, Any, Any]]:
    async def scenario(client: Any) -> list[tuple[int, Any, Any]]:
        out = []
        for body in bodies:
            r = await client.post("/v1/chat/completions", json=body)
            data = await r.get_data()
            out.append((r.status_code, r.headers, data if body.get("stream") else json.loads(data)))
        return out
    return run(app, scenario)


def test_a_call_comes_back_as_tool_calls(tmp_path):
    app, _ = make(tmp_path, FakeEngine(script=CALL))
    [(status, headers, body)] = post(app, chat(tool_choice="required", max_tokens=200))
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": ARGS}
    assert headers["X-miLLM-Constrained"] == 'tools;choice="required";undeclared=omitted'


def test_text_and_none_answer_as_content(tmp_path):
    app, _ = make(tmp_path, FakeEngine(script="Sunny." + CALL))
    with_text, none = post(app, chat(max_tokens=200), chat(tool_choice="none", max_tokens=200))
    message = with_text[2]["choices"][0]["message"]
    assert message["content"] == "Sunny." and message["tool_calls"][0]["function"]["arguments"] == ARGS
    assert none[0] == 200 and none[2]["choices"][0]["message"] == {"role": "assistant", "content": "Sunny." + CALL}
    assert none[2]["choices"][0]["finish_reason"] == "stop" and "X-miLLM-Constrained" not in none[1]
    app, _ = make(tmp_path, FakeEngine(script="Sunny."))
    [(_, _, plain)] = post(app, chat(tool_choice="auto"))
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": "Sunny."}
    assert plain["choices"][0]["finish_reason"] == "stop"


def deltas(data: bytes) -> list[dict[str, Any]]:
    chunks = [json.loads(f.removeprefix("data: ")) for f in frames(data) if f != "data: [DONE]"]
    return [c for c in chunks if c["choices"]]


def test_streamed_calls_open_with_their_name_then_stream_arguments(tmp_path):
    app, _ = make(tmp_path, FakeEngine(script="Ok." + TWO))
    [(status, _, data)] = post(app, chat(stream=True, tools=[WEATHER, TIME], max_tokens=500))
    assert status == 200
    chunks = deltas(data)
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    openers = [c for c in calls if "id" in c]
    assert [(c["index"], c["type"], c["function"]) for c in openers] == [
        (0, "function", {"name": "get_weather", "arguments": ""}),
        (1, "function", {"name": "get_time", "arguments": ""})]
    assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in calls if "id" not in c)
    for i, want in enumerate([ARGS, '{"zone": "CET"}']):
        assert "".join(c["function"]["arguments"] for c in calls if c["index"] == i) == want
    assert len([c for c in calls if c["index"] == 0]) > 2  # the arguments arrive as they are generated
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "Ok." and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert "<tool_call>" not in data.decode()


def test_a_call_cut_by_max_tokens_finishes_with_length(tmp_path):
    app, _ = make(tmp_path, FakeEngine(script=CALL))
    whole, streamed = post(app, chat(max_tokens=40), chat(max_tokens=40, stream=True))
    choice = whole[2]["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert deltas(streamed[2])[-1]["choices"][0]["finish_reason"] == "length"


def test_refused_under_the_setting_and_on_gguf(tmp_path):
    app, _ = make(tmp_path, tools="refuse")
    refused, choice_only, none = post(app, chat(), {**chat(), "tools": None, "tool_choice": "required"},
                                      chat(tools=[], tool_choice="none", max_tokens=2))
    assert refused[0] == 400 and refused[2]["error"]["code"] == "field_not_honoured"
    assert refused[2]["error"]["param"] == "tools" and "MILLM_TOOLS=refuse" in refused[2]["error"]["message"]
    assert choice_only[0] == 400 and choice_only[2]["error"]["param"] == "tool_choice"
    assert none[0] == 200  # the no-change values stay accepted
    app, _ = make(tmp_path, FakeEngine(engine_name="llama.cpp"))
    [gguf] = post(app, chat())
    assert gguf[0] == 400 and gguf[2]["error"]["code"] == "field_not_honoured" and gguf[2]["error"]["param"] == "tools"
    assert "transformers" in gguf[2]["error"]["message"]


def test_bad_tool_requests_are_400s_naming_the_field(tmp_path):
    app, _ = make(tmp_path)
    results = post(app, chat(tools="x"), chat(tools=[{"type": "function"}]), chat(tool_choice="sometimes"),
                   chat(stop=["\n"], response_format={"type": "json_object"}),
                   chat(tool_choice={"type": "function", "function": {"name": "nope"}}),
                   chat(stop=["Observation:"]))  # with tools alone, stop cuts free text only
    params = [body["error"]["param"] for _, _, body in results[:5]]
    assert [s for s, _, _ in results] == [400] * 5 + [200]
    assert params == ["tools", "tools[0].function", "tool_choice", "response_format", "tool_choice.function.name"]


def test_streaming_with_response_format_is_allowed(tmp_path):
    app, _ = make(tmp_path, FakeEngine(script='{"a": 1}'))
    [(status, headers, data)] = post(app, {"model": "fake", "messages": [{"role": "user", "content": "x"}],
                                           "stream": True, "response_format": {"type": "json_object"}})
    assert status == 200 and headers["X-miLLM-Constrained"] == "json_object"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in deltas(data)) == '{"a": 1}'


def test_history_keys_are_used_on_transformers_and_reported_on_gguf(tmp_path):
    body = {"model": "fake", "max_tokens": 2, "messages": HISTORY}
    app, _ = make(tmp_path)
    [(status, headers, _)] = post(app, body)
    assert status == 200 and "X-miLLM-Ignored-Fields" not in headers
    app, _ = make(tmp_path, FakeEngine(engine_name="llama.cpp"))
    [(status, headers, _)] = post(app, body)
    assert status == 200 and "messages[2].tool_calls" in headers["X-miLLM-Ignored-Fields"]
    assert "messages[3].tool_call_id" in headers["X-miLLM-Ignored-Fields"]


def test_tool_choice_without_tools_is_reported_not_refused(tmp_path):
    """LlamaIndex's OpenAILike sends tool_choice "required" with no tools by default: nothing to call, so the
    field is unused (reported; refused only in strict mode), never a 400 on every call."""
    app, _ = make(tmp_path)
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
            "tool_choice": "required", "parallel_tool_calls": False}

    async def scenario(client):
        lenient = await client.post("/v1/chat/completions", json=body)
        strict = await client.post("/v1/chat/completions", json=body, headers={"X-miLLM-Strict": "true"})
        return lenient.status_code, lenient.headers, strict.status_code, await strict.get_json()

    status, headers, strict_status, strict_body = run(app, scenario)
    assert status == 200 and headers["X-miLLM-Ignored-Fields"] == '"tool_choice", "parallel_tool_calls"'
    assert "X-miLLM-Constrained" not in headers
    assert strict_status == 400 and strict_body["error"]["code"] == "unused_fields_refused"
