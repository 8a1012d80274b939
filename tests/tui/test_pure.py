"""The TUI's pure parts: the dials' arithmetic, request bodies, and reading responses (no model)."""

from __future__ import annotations

import random

import pytest

from millm.config import DEFAULT_DIAL, ENVELOPE
from millm.errors import InvalidParameter
from millm.requests.builder import build_chat
from millm.steering.intensity import Symbol
from millm.steering.rung import LADDER, rung_header
from millm.steering.values import STRENGTH_LIMIT
from tui.client import SteeringState, readout_ask, readout_tokens, rung_phrase
from tui.controls import (
    LAMBDA_STEP,
    STRENGTH_STEP,
    dial_fraction,
    edit_typed,
    parse_lambda,
    parse_strength,
    show_dial,
    step_lambda,
    step_strength,
    wire_dial,
)
from tui.session import Conversation, SteeringFields, chat_body, compare_bodies, parse_field, sampling_fields


def test_typing_into_a_dial():
    digits = frozenset("0123456789.")
    assert edit_typed("", "4", "4", digits) == ("4", None)
    assert edit_typed("4", "full_stop", ".", digits) == ("4.", None)
    assert edit_typed("4.5", "backspace", None, digits) == ("4.", None)
    assert edit_typed("4.5", "escape", None, digits) == ("", None)
    assert edit_typed("4.5", "enter", None, digits) == ("", "4.5")
    assert edit_typed("", "enter", None, digits) is None  # nothing typed: Enter is the screen's
    assert edit_typed("", "backspace", None, digits) is None
    assert edit_typed("4", "x", "x", digits) is None  # not a character the dial takes
    assert edit_typed("4", "right", None, digits) is None


def test_strength_steps_clamp_at_the_engine_limit():
    assert step_strength(0.0, STRENGTH_STEP) == STRENGTH_STEP
    assert step_strength(STRENGTH_LIMIT - 1, STRENGTH_STEP) == STRENGTH_LIMIT
    assert step_strength(-STRENGTH_LIMIT, -STRENGTH_STEP) == -STRENGTH_LIMIT
    assert step_strength(0.1, 0.2) == pytest.approx(0.3) and step_strength(0.1, 0.2) == 0.3


def test_typed_strengths():
    assert parse_strength(" 40 ") == 40.0
    assert parse_strength("-1e9") == -STRENGTH_LIMIT
    assert parse_strength("0") == 0.0
    for bad in ("abc", "", "nan", "inf"):
        with pytest.raises(InvalidParameter) as exc:
            parse_strength(bad)
        assert exc.value.param == "strength"


def test_lambda_steps_stay_in_the_envelope_and_zero_is_off():
    assert step_lambda(None, LAMBDA_STEP) == pytest.approx(DEFAULT_DIAL + LAMBDA_STEP)
    assert step_lambda(ENVELOPE[1], LAMBDA_STEP) == ENVELOPE[1]
    assert step_lambda(LAMBDA_STEP, -LAMBDA_STEP) is Symbol.OFF
    assert step_lambda(Symbol.OFF, -LAMBDA_STEP) is Symbol.OFF
    assert step_lambda(Symbol.OFF, LAMBDA_STEP) == pytest.approx(LAMBDA_STEP)
    assert step_lambda(Symbol.MIN, LAMBDA_STEP, echoed=0.5) == pytest.approx(0.6)  # from what min resolved to
    assert step_lambda(Symbol.MAX, -LAMBDA_STEP) == pytest.approx(DEFAULT_DIAL - LAMBDA_STEP)


def test_typed_lambdas_are_checked_as_requests_are():
    assert parse_lambda("0.5") == 0.5 and parse_lambda("MAX") is Symbol.MAX and parse_lambda("0") is Symbol.OFF
    for bad in ("3", "-1", "loud", ""):
        with pytest.raises(InvalidParameter) as exc:
            parse_lambda(bad)
        assert exc.value.param == "steering_intensity"


def test_dial_display_and_wire_values():
    assert [show_dial(d) for d in (None, Symbol.OFF, Symbol.MIN, 0.8)] == ["base", "off", "min", "0.80"]
    assert [wire_dial(d) for d in (None, Symbol.MAX, 1.5)] == [None, "max", 1.5]
    assert dial_fraction(Symbol.OFF) == 0.0 and dial_fraction(ENVELOPE[1]) == 1.0


def test_sampling_form_fields():
    assert parse_field(" ") is None and parse_field("7") == 7 and parse_field("0.5") == 0.5
    assert parse_field("warm") == "warm"
    assert sampling_fields({"temperature": "0", "max_tokens": "", "seed": "42"}) == {"temperature": 0, "seed": 42}


def engine_of(_: str) -> str:
    return "transformers"


def test_chat_bodies_are_what_the_builder_takes():
    conv = Conversation(system="Be brief.")
    messages = conv.messages("Hi")
    body = chat_body("m", messages, {"temperature": 0, "max_tokens": 8}, SteeringFields(Symbol.MIN, "calm", "sae_x"))
    assert body["steering_intensity"] == "min" and body["profile"] == "calm" and body["stream"] is True
    assert body["return_sae_activations"] == readout_ask("sae_x")
    built = build_chat(body, engine_of)
    assert built.intensity is Symbol.MIN and built.profile == "calm" and built.stream
    assert built.generations[0].prompts[0].messages == messages
    plain = chat_body("m", messages, {}, SteeringFields())
    assert set(plain) == {"model", "messages", "stream"}
    with pytest.raises(InvalidParameter) as exc:
        build_chat(chat_body("m", messages, sampling_fields({"temperature": "warm"}), SteeringFields()), engine_of)
    assert exc.value.param == "temperature"


def test_compare_bodies_share_one_seed():
    body = chat_body("m", [{"role": "user", "content": "Hi"}], {"temperature": 0.7}, SteeringFields(0.5))
    off, on = compare_bodies(body, random.Random(3))
    assert off["seed"] == on["seed"] and off["steering_intensity"] == "off" and on["steering_intensity"] == 0.5
    off, on = compare_bodies({**body, "seed": 9})
    assert off["seed"] == on["seed"] == 9
    for b in (off, on):
        build_chat(b, engine_of)


def test_conversation_keeps_turns_until_reset():
    conv = Conversation()
    conv.add("Hi", "Hello!")
    assert conv.messages("Again") == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                                      {"role": "user", "content": "Again"}]
    conv.reset()
    assert conv.messages() == []


def test_rung_phrase_reads_the_header():
    for rung in LADDER:
        assert rung_phrase(rung_header(rung.level)) == rung.language
    assert rung_phrase("1") == LADDER[1].language
    assert rung_phrase(None) is None and rung_phrase("x") is None


def test_readout_tokens_and_steering_state():
    body = {"sae_id": "s", "positions": [{"position": 10, "token_id": 5, "features": [{"index": 3, "value": 1.5}]},
                                         {"position": 11, "token_id": 6, "features": []}]}
    tokens = readout_tokens(body, 10, lambda k, tid: f"{k}:{tid}")
    assert [(t.text, t.features) for t in tokens] == [("0:5", [(3, 1.5)]), ("1:6", [])]
    state = SteeringState.from_snapshot({"enabled": False, "active_profile": "p",
                                         "saes": {"s": {"layer": 4, "values": {"3": 40.0}}}}, live=False)
    assert state == SteeringState(False, "p", {"s": {3: 40.0}}, {"s": 4}, False)


def test_the_strip_window_grows_right_then_left_while_tokens_fit():
    from tui.widgets.activation_strip import window

    assert window([3, 3, 3, 3, 3], 2, 5) == (2, 3)  # the cursor's token alone: "[abc]"
    assert window([3, 3, 3, 3, 3], 2, 9) == (2, 4)  # one more on the right
    assert window([3, 3, 3, 3, 3], 2, 13) == (1, 4)  # then one on the left
    assert window([3, 3, 3, 3, 3], 4, 100) == (0, 5)  # at the end: all to the left
    assert window([1], 0, 1) == (0, 1)  # the cursor's token is shown even where it does not fit


def test_steered_rows_run_by_layer_then_feature():
    from tui.widgets.steered_list import steered_rows

    state = SteeringState(values={"b": {7: 1.0, 2: -3.0}, "a": {5: 2.0}, "c": {1: 4.0}}, layers={"a": 9, "b": 3})
    assert steered_rows(state) == [("c", 1, 4.0), ("b", 2, -3.0), ("b", 7, 1.0), ("a", 5, 2.0)]


def test_the_status_line_says_only_what_applies():
    from tui.widgets.status_line import Status, notes, status_text

    assert notes(Status(SteeringState())) == []
    assert status_text(Status(SteeringState(values={"a": {1: 2.0}}))).plain == "steering on · 1 feature live"
    busy = Status(SteeringState(enabled=False, active_profile="calm", live=False), "mine", "ladder", True, "generating")
    assert status_text(busy).plain == ("steering OFF · 0 features live · active profile calm · circuit ladder · chats "
                                       "use profile mine · a request's own steering runs now · COMPARE · generating")


async def _collect(chunks):
    return [chunk async for chunk in chunks]


def test_a_streamed_answer_reads_chunk_by_chunk_up_to_done():
    import asyncio
    import json

    from tui.client import ChatResult
    from tui.remote import RemoteError, chunk_texts, sse_chunks

    async def lines(*items):
        for item in items:
            yield item

    first = {"choices": [{"delta": {"content": "Hi"}}]}
    usage = {"prompt_tokens": 3, "completion_tokens": 1}
    last = {"choices": [{"delta": {}, "finish_reason": "length"}], "usage": usage}
    read = asyncio.run(_collect(sse_chunks(lines(": ping", f"data: {json.dumps(first)}", "",
                                                 f"data: {json.dumps(last)}", "data: [DONE]", "data: {}"))))
    assert read == [first, last]
    result = ChatResult()
    assert [chunk_texts(chunk, result) for chunk in read] == [["Hi"], []]
    assert (result.finish, result.prompt_tokens, result.completion_tokens) == ("length", 3, 1)
    error = {"error": {"message": "no", "code": "c", "param": "p"}}
    with pytest.raises(RemoteError, match="no"):
        asyncio.run(_collect(sse_chunks(lines("event: error", f"data: {json.dumps(error)}"))))
