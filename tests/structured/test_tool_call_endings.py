"""Where a tool-call answer ends and what its end is called (issue 49, item 7), fast tier: the pure rules of
``millm.structured.endings`` on hand-built texts, and the decode loop's length rule (``emit``)."""

from __future__ import annotations

from typing import Any

import pytest

from millm.engine.decode.output import ChoiceOutput
from millm.engine.decode.rows import Row, emit
from millm.engine.events import Finish
from millm.engine.params import SamplingParams
from millm.structured.endings import calls_complete, calls_ended, endings
from millm.structured.schema import JsonConstraint
from millm.structured.tools import BETWEEN, OPEN, call_text, tool_constraint

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}
CALL = call_text("get_weather", '{"city": "Paris"}')
SECOND = call_text("get_time", '{"zone": "CET"}')
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def constraint(choice: Any = "required", parallel: bool | None = None) -> Any:
    made = tool_constraint([WEATHER, TIME], choice, parallel)
    assert made is not None
    return made


@pytest.mark.parametrize("choice", ["required", "auto", NAMED])
@pytest.mark.parametrize("text", [CALL, CALL + "\n", CALL + "\n\n\n\n", CALL + " \t", CALL + BETWEEN[:1],
                                  CALL + BETWEEN + SECOND[len(OPEN):] + "\n"])
def test_whole_calls_with_only_blanks_after_are_complete(choice, text):
    if choice == NAMED and SECOND in text:
        text = CALL  # a named choice calls once
    assert calls_complete(constraint(choice), text)


@pytest.mark.parametrize("cut", [len(CALL) - 1, len(CALL) - len("</tool_call>"), len(CALL) - len("}\n</tool_call>")])
def test_a_call_whose_arguments_closed_is_complete_though_its_fixed_markup_was_cut(cut):
    """What follows the arguments object is fixed bytes: the call is whole once the object closes."""
    assert calls_complete(constraint(NAMED), CALL[:cut])


@pytest.mark.parametrize("text", [
    "",  # nothing yet
    CALL[:len(OPEN) + 3],  # inside the call's head
    CALL[:CALL.index("Paris")],  # inside the arguments
    CALL[:CALL.index('"}') + 1],  # the arguments' string closed, the object not
    CALL + BETWEEN[:2],  # the next call's marker begun
    CALL + BETWEEN,  # the next call opened, no name yet
    CALL + BETWEEN + SECOND[len(OPEN):SECOND.index("CET")],  # the next call cut in its arguments
])
def test_a_budget_that_runs_out_in_a_call_or_the_next_marker_leaves_it_incomplete(text):
    assert not calls_complete(constraint("required"), text)


def test_text_without_a_call_is_never_complete_by_this_rule():
    auto = constraint("auto")
    assert not calls_complete(auto, "Hello, how can I help?")
    assert not calls_complete(auto, "   ")
    assert calls_complete(auto, "Let me look.\n" + CALL + "\n")  # text, then a whole call


def test_only_tool_constraints_have_ending_rules():
    rules = endings(constraint("required"))
    assert rules is not None and rules.complete(CALL + "\n") and not rules.complete(CALL[:20])
    assert rules.ended(CALL + "\n\n") and not rules.ended(CALL + "\n")
    assert endings(JsonConstraint("json_object", {"type": "object"})) is None
    assert endings(None) is None


@pytest.mark.parametrize("choice, parallel", [(NAMED, None), ("required", False), ("auto", False)])
def test_where_no_further_call_is_allowed_the_answer_is_over_when_the_call_closes(choice, parallel):
    one = constraint(choice, parallel)
    assert one.several is False
    for text in (CALL, CALL + "\n", CALL + " \n"):
        assert calls_ended(one, text), text
    for text in ("", CALL[:-1], CALL[:CALL.index("Paris")]):
        assert not calls_ended(one, text), text


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_with_parallel_calls_it_is_over_once_what_follows_cannot_open_another(choice):
    several = constraint(choice)
    assert several.several is True
    for text in (CALL, CALL + "\n"):  # a newline may begin "\n<tool_call>"
        assert not calls_ended(several, text), repr(text)
    for text in (CALL + "\n\n", CALL + " ", CALL + "\n ", CALL + "\t"):
        assert calls_ended(several, text), repr(text)
    assert not calls_ended(several, CALL + "\n<")
    two = CALL + BETWEEN + SECOND[len(OPEN):]
    assert not calls_ended(several, two) and calls_ended(several, two + "\n\n")


def test_the_end_of_a_call_is_read_by_parsing_not_by_the_texts_last_characters():
    inside = call_text("get_weather", '{"city": "}\\n</tool_call>"}')  # the marker inside a string argument
    cut = inside[:inside.index("</tool_call>") + len("</tool_call>")]
    assert cut.endswith("</tool_call>") and not calls_ended(constraint(NAMED), cut)
    assert calls_ended(constraint(NAMED), inside)
    assert not calls_ended(constraint("auto", False), "Text that mentions </tool_call>")  # no call in it
    assert not calls_ended(constraint("required"), CALL + "\n" * 5)  # more blanks than the grammar allows


class ByteTokenizer:
    """Each id is one byte."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def run(text: str, max_tokens: int, complete: Any) -> tuple[str, str]:
    """Feed ``text`` byte by byte to a row with ``max_tokens``: its text and how it finished."""
    row = Row(0, ChoiceOutput(ByteTokenizer(), (), frozenset({999}), until=OPEN), SamplingParams(), max_tokens)
    events = [e for b in text.encode()[:max_tokens] for e in emit(row, b, complete=complete)]
    [finish] = [e for e in events if isinstance(e, Finish)]
    return row.output.text, finish.reason


def test_a_budget_cut_after_whole_calls_ends_stop_and_inside_one_ends_length():
    rules = endings(constraint("required"))
    assert rules is not None
    rule = rules.complete
    answer = CALL + "\n\n"
    for budget in (len(CALL) - 3, len(CALL), len(CALL) + 1, len(CALL) + 2):
        assert run(answer, budget, rule)[1] == "stop", budget  # rendered "tool_calls"
    assert run(answer, CALL.index("Paris"), rule)[1] == "length"
    assert run(CALL + BETWEEN, len(CALL) + 2, rule)[1] == "length"  # the next call's marker begun
    assert run(answer, len(CALL) + 1, None)[1] == "length"  # no rule: the budget decides, as for free text
