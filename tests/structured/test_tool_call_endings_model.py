"""Where a tool-call answer ends and what its end is called (issue 49, item 7), on the bundled model through the
live server and the OpenAI SDK, greedy: a call that closed within ``max_tokens`` ends ``tool_calls`` with whole
arguments, whole and streamed, serial and batched, and a call no other may follow ends where it closes.

Measured before the fix: the named call below is 40 tokens; the grammar then allowed up to 4 blanks and the model
wrote 4 newlines, so the answer took 44 tokens and ``max_tokens`` 40 to 43 ended ``"length"`` with whole
arguments (instructor's default mode raised ``IncompleteOutputException`` on them)."""

from __future__ import annotations

import json

import jsonschema
import pytest

MODEL = "SmolLM2-135M-Instruct"
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "unit"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                            "parameters": PARAMS}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
                                         "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CALL_TOKENS = 40  # the greedy named call's own tokens, from <tool_call> to </tool_call>
REQUIRED_TOKENS = 39  # the greedy call under "required", whether or not another may follow it


def ask(client, max_tokens: int, **extra):
    return client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], temperature=0,
                                          max_tokens=max_tokens, **extra)


def whole_call(choice) -> None:
    """The choice ends tool_calls with one call of get_weather whose arguments are whole and valid."""
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), PARAMS)


def streamed(client, max_tokens: int, **extra) -> tuple[str | None, str]:
    """A streamed request's finish reason and its call's arguments, put together from the deltas."""
    finish, arguments = None, ""
    for chunk in ask(client, max_tokens, stream=True, **extra):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            arguments += "".join(d.function.arguments or "" for d in choice.delta.tool_calls or [] if d.function)
    return finish, arguments


@pytest.mark.parametrize("max_tokens", [CALL_TOKENS, CALL_TOKENS + 1, CALL_TOKENS + 3, 120])
def test_a_named_call_that_closes_within_max_tokens_ends_tool_calls_where_it_closes(client, max_tokens):
    reply = ask(client, max_tokens, tool_choice=NAMED)
    whole_call(reply.choices[0])
    assert reply.usage.completion_tokens == CALL_TOKENS  # no budget spent on blanks after the call


def test_a_streamed_named_call_ends_tool_calls_with_whole_arguments(client):
    finish, arguments = streamed(client, CALL_TOKENS + 2, tool_choice=NAMED)
    assert finish == "tool_calls"
    jsonschema.validate(json.loads(arguments), PARAMS)


def test_a_budget_that_runs_out_inside_the_arguments_still_ends_length(client):
    reply = ask(client, CALL_TOKENS - 12, tool_choice=NAMED)
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == CALL_TOKENS - 12
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice.message.tool_calls[0].function.arguments)
    assert streamed(client, CALL_TOKENS - 12, tool_choice=NAMED)[0] == "length"


def test_parallel_calls_cut_after_a_whole_call_end_tool_calls(client):
    """With parallel calls allowed the answer goes on after the call (a newline may open another); a budget
    that runs out there leaves the call whole all the same. Before: "length" at the call's own length."""
    one = ask(client, 120, tool_choice="required", parallel_tool_calls=False)
    whole_call(one.choices[0])
    assert one.usage.completion_tokens == REQUIRED_TOKENS  # nothing may follow the call: it ends there
    arguments = one.choices[0].message.tool_calls[0].function.arguments
    for max_tokens in (REQUIRED_TOKENS, REQUIRED_TOKENS + 1):
        reply = ask(client, max_tokens, tool_choice="required")
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", (max_tokens, choice)
        assert choice.message.tool_calls[0].function.arguments == arguments
        for call in choice.message.tool_calls:
            json.loads(call.function.arguments)
        assert streamed(client, max_tokens, tool_choice="required")[0] == "tool_calls"


def test_the_batched_decode_ends_a_named_call_the_same_way(engine, settings):
    from openai import OpenAI

    from millm.server.app import create_app
    from tests.support.live import live_server

    on = settings.model_copy(update={"batching": True, "batch_max_rows": 4, "batch_max_tokens": 4 * 512})
    with live_server(create_app(on, engine)) as base:
        client = OpenAI(base_url=base + "/v1", api_key="not-needed", max_retries=0, timeout=120)
        for extra in ({}, {"seed": 7}):  # the shared lane, and a seeded request's lane of its own
            reply = ask(client, CALL_TOKENS + 2, tool_choice=NAMED, **extra)
            whole_call(reply.choices[0])
            assert reply.usage.completion_tokens == CALL_TOKENS
            finish, arguments = streamed(client, CALL_TOKENS + 2, tool_choice=NAMED, **extra)
            assert finish == "tool_calls"
            jsonschema.validate(json.loads(arguments), PARAMS)


def test_the_text_rule_agrees_with_the_grammar(engine):
    """Where ``calls_ended`` says the answer is over, the grammar accepts the end and no other call; where it
    says not yet, another call can still follow. The matcher alone cannot tell: after </tool_call> it accepts
    the end without being stopped (blanks may follow)."""
    from millm.structured.endings import calls_ended
    from millm.structured.tools import BETWEEN, OPEN, call_text, tool_constraint

    call = call_text("get_weather", '{"city": "Paris", "unit": "celsius"}')
    for choice, parallel, text, over in [(NAMED, None, call, True), ("required", False, call + "\n", True),
                                         ("required", None, call, False), ("required", None, call + "\n", False),
                                         ("required", None, call + "\n\n", True)]:
        constraint = tool_constraint([WEATHER, TIME], choice, parallel)
        assert constraint is not None
        matcher = engine.constraints.matcher(constraint)
        assert matcher.consume_tokens(engine.tokenizer.encode(text)), matcher.get_error()
        assert matcher.is_accepting() and not matcher.is_stopped()
        assert calls_ended(constraint, text) is over, (choice, parallel, text)
        another = engine.tokenizer.encode(OPEN if text.endswith("\n") else BETWEEN)  # what would open one
        opens_another = matcher.validate_tokens(another) == len(another)
        assert opens_another is not over, (choice, parallel, text)
