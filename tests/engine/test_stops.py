from millm.engine.decode.detok import IncrementalDetokenizer
from millm.engine.decode.output import ChoiceOutput
from millm.engine.decode.stops import find_stop, holdback


class ByteTokenizer:
    """Each id is one byte; decoding is UTF-8 with replacement, like byte-level BPE."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def ids_of(text: str) -> list[int]:
    return list(text.encode())


def test_find_stop_earliest():
    assert find_stop("abc STOP xyz END", ["END", "STOP"]) == 4
    assert find_stop("nothing here", ["END"]) is None
    assert find_stop("END then END", ["END"], start=1) == 9


def test_holdback_is_longest_partial_suffix():
    assert holdback("hello wor", ["world"]) == 3
    assert holdback("hello", ["xyz"]) == 0
    assert holdback("ab", ["abc", "b!"]) == 2
    assert holdback("a complete stop", ["stop"]) == 0  # a full match is find_stop's job


def test_detok_never_splits_utf8_and_concatenates_exactly():
    text = "héllo 😀 世界!"
    det = IncrementalDetokenizer(ByteTokenizer())
    pieces = [det.push(i) for i in ids_of(text)] + [det.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text
    assert pieces[ids_of(text).index(0xF0)] == ""  # first byte of the emoji is held


def test_choice_output_cuts_stop_across_tokens_and_never_emits_it():
    out = ChoiceOutput(ByteTokenizer(), ["###"], frozenset({999}))
    emitted = [out.feed(i) for i in ids_of("answer #")]
    assert "".join(emitted) == "answer "  # '#' is held back
    emitted.append(out.feed(ord("#")))
    emitted.append(out.feed(ord("#")))
    assert out.finish_reason == "stop"
    assert "".join(emitted) == "answer "


def test_choice_output_releases_false_alarm():
    out = ChoiceOutput(ByteTokenizer(), ["###"], frozenset())
    text = "".join(out.feed(i) for i in ids_of("a ## b"))
    assert text == "a ## b" and out.finish_reason is None


def test_choice_output_eos_flushes_and_stops():
    out = ChoiceOutput(ByteTokenizer(), ["xyz"], frozenset({999}))
    text = "".join(out.feed(i) for i in ids_of("abx"))
    assert text == "ab"
    text += out.feed(999)
    assert text == "abx" and out.finish_reason == "stop" and out.tokens == 4


def test_choice_output_close_for_length_still_honours_stop():
    out = ChoiceOutput(ByteTokenizer(), ["ab"], frozenset())
    text = out.feed(ord("a"))
    text += out.close("length")
    assert text == "a" and out.finish_reason == "length"


def naive_holdback(text: str, stops: list[str]) -> int:
    """The definition, checked prefix by prefix."""
    return max((k for s in stops for k in range(1, min(len(s) - 1, len(text)) + 1) if text.endswith(s[:k])),
               default=0)


def test_the_incremental_matcher_agrees_with_the_definition_piece_by_piece():
    import random

    from millm.engine.decode.stops import StopMatcher

    rng = random.Random(0)
    for _ in range(3000):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 3))]
        pieces = ["".join(rng.choice("abc") for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(1, 5))]
        matcher, text = StopMatcher(stops), ""
        for piece in pieces:
            text += piece
            assert matcher.feed(piece) == naive_holdback(text, stops), (text, stops)


def test_stop_sequences_are_bounded():
    import pytest

    from millm.errors import InvalidParameter
    from millm.requests.validation import MAX_STOP_CHARS, MAX_STOPS, check_stop

    assert check_stop(["x"] * 2 + ["y"]) == ("x", "y")
    for bad in (["s" + str(i) for i in range(MAX_STOPS + 1)], ["z" * (MAX_STOP_CHARS + 1)]):
        with pytest.raises(InvalidParameter) as info:
            check_stop(bad)
        assert info.value.param == "stop"


def fed(out: ChoiceOutput, text: str) -> str:
    """What ``out`` emits for ``text``, fed byte by byte until it finishes (the engine then ends the row)."""
    emitted = ""
    for i in ids_of(text):
        emitted += out.feed(i)
        if out.finish_reason is not None:
            break
    return emitted


def test_stops_apply_to_free_text_before_a_call_only():
    from millm.structured.tools import OPEN, call_text

    call = call_text("search", '{"query": "Observation: rain"}')
    out = ChoiceOutput(ByteTokenizer(), ["Observation:"], frozenset({999}), until=OPEN)
    text = fed(out, "Let me look. " + call) + out.feed(999)
    assert text == "Let me look. " + call  # the stop inside the call's arguments cuts nothing

    out = ChoiceOutput(ByteTokenizer(), ["Observation:"], frozenset({999}), until=OPEN)
    text = fed(out, "Thought. Observation: " + call)
    assert text == "Thought. " and out.finish_reason == "stop"  # before any call it is a stop like any other

    out = ChoiceOutput(ByteTokenizer(), ["<tool"], frozenset({999}), until=OPEN)
    text = fed(out, "A. " + call)
    assert text == "A. " and out.finish_reason == "stop"  # the call had not begun: it is absent, not cut


def test_stop_scope_under_each_constraint():
    from millm.structured.constraint import stop_scope
    from millm.structured.schema import JsonConstraint
    from millm.structured.tools import OPEN, tool_constraint

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert stop_scope(tool_constraint(tools, "auto"), ["x"]) == (("x",), OPEN)
    assert stop_scope(tool_constraint(tools, "required"), ["x"]) == ((), OPEN)  # calls alone: nothing free
    assert stop_scope(JsonConstraint("json_object", {"type": "object"}), ["x"]) == (("x",), None)
    assert stop_scope(None, ["x"]) == (("x",), None)
