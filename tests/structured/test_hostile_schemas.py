"""Schemas and documents built to hurt: each is a 400 naming what is wrong before anything generates, or a
check of the closed document that takes time linear in it (fast tier: no model)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from millm.errors import ConstrainedOutputInvalid, InvalidParameter, ResponseFormatUnsupported
from millm.structured.bounded import BoundedCache, bounded
from millm.structured.schema import MAX_DEFS, MAX_REF_CHAIN, JsonConstraint, check_response_format
from millm.structured.tools import Tool, ToolConstraint, split, tool_constraint


def as_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def as_tools(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", **schema}}}]


def chain(links: int) -> dict[str, Any]:
    """``d0`` -> ``d1`` -> ... -> a string, one ``$ref`` a link."""
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs}


HOSTILE = [
    ({"type": "object", "properties": {"a": {"type": [{"x": 1}]}}}, "'type'", "/properties/a/type"),
    ({"type": "object", "properties": {"a": {"type": {"x": 1}}}}, "'type'", "/properties/a/type"),
    ({"type": "object", "properties": {"a": {"type": "string", "format": ["date"]}}}, "'format'", "/format"),
    ({"type": "object", "properties": {"a": {"type": "string", "format": {"x": 1}}}}, "'format'", "/format"),
    (chain(900), "definitions", f"at most {MAX_DEFS}"),
    (chain(MAX_REF_CHAIN + 8), "chain of", f"at most {MAX_REF_CHAIN}"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/a~1b"}},
      "$defs": {"a/b": {"$ref": "#/$defs/a~1b"}}}, "'$ref'", "no '/', '~' or '%'"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/a%25b"}},
      "$defs": {"a%b": {"$ref": "#/$defs/a%25b"}, "a%25b": {"type": "string"}}}, "'$ref'", "escaping"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/x~0"}}, "$defs": {"x~0": {"type": "string"}}},
     "'$ref'", "escaping"),
    ({"type": "string", "pattern": ["a"]}, "'pattern'", "not a string"),
]


@pytest.mark.parametrize("schema,names,says", HOSTILE)
def test_a_hostile_response_format_is_a_400_naming_it(schema, names, says):
    with pytest.raises(ResponseFormatUnsupported) as info:
        check_response_format(as_format(schema))
    assert names in info.value.message and says in info.value.message and info.value.param == "response_format"


@pytest.mark.parametrize("schema,names,says", [h for h in HOSTILE if h[0].get("type") == "object"])
def test_the_same_schemas_as_tool_parameters_are_a_400_naming_the_tool(schema, names, says):
    with pytest.raises(InvalidParameter) as info:
        tool_constraint(as_tools(schema), "auto")
    assert names in info.value.message and info.value.param == "tools[0].function.parameters"


def test_a_chain_within_the_bound_is_enforced():
    assert check_response_format(as_format(chain(MAX_REF_CHAIN - 1))) is not None


# the closed document: linear-time checks
EXPONENTIAL = "^((a+)+c|a+)$"  # Python's re backtracks through 2^n splits of a run of a's that never meets a c


def test_a_pattern_that_backtracks_for_python_is_checked_in_linear_time():
    from millm.structured.constraint import validate

    constraint = JsonConstraint("json_schema", {"type": "string", "pattern": EXPONENTIAL}, "x")
    validate(constraint, json.dumps("a" * 5000))  # re: 2^5000 steps; RE2: one pass
    with pytest.raises(ConstrainedOutputInvalid, match="does not match"):
        validate(constraint, json.dumps("a" * 5000 + "b"))


def test_the_same_pattern_in_a_forced_tool_call_is_checked_in_linear_time():
    from millm.structured.constraint import validate

    parameters = {"type": "object", "properties": {"s": {"type": "string", "pattern": EXPONENTIAL}}}
    constraint = ToolConstraint((Tool("f", None, parameters),), "function", "f")
    call = '<tool_call>\n{"name": "f", "arguments": {"s": "' + "a" * 5000 + '"}}\n</tool_call>'
    validate(constraint, call)
    with pytest.raises(ConstrainedOutputInvalid, match="does not match"):
        validate(constraint, call.replace('a"}', 'ab"}'))


def test_patterns_search_as_json_schema_says():
    from millm.structured.constraint import validate

    constraint = JsonConstraint("json_schema", {"type": "string", "pattern": "[0-9]{3}"}, "x")
    validate(constraint, json.dumps("call 555 now"))  # unanchored: a match anywhere
    with pytest.raises(ConstrainedOutputInvalid):
        validate(constraint, json.dumps("call 55 now"))


@pytest.mark.parametrize("text,depth", [("{}", 1), ('[[{"a": [1]}]]', 4), ('["[[[", "}}}"]', 1), ('"\\\\"', 0),
                                        ('["\\"[["]', 1), ("3", 0)])
def test_nesting_counts_brackets_outside_strings(text, depth):
    from millm.structured.constraint import nesting

    assert nesting(text) == depth


def test_a_document_nested_past_the_validator_is_refused_as_such_not_a_crash():
    from millm.structured.constraint import MAX_VALIDATED_DEPTH, validate

    constraint = JsonConstraint("json_schema", {"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
                                                "$ref": "#/$defs/t"}, "x")
    deep = MAX_VALIDATED_DEPTH + 1
    with pytest.raises(ConstrainedOutputInvalid, match=f"nested {deep} levels"):
        validate(constraint, "[" * deep + "]" * deep)
    validate(constraint, "[" * MAX_VALIDATED_DEPTH + "]" * MAX_VALIDATED_DEPTH)


# forced calls cut by max_tokens
@pytest.mark.parametrize("choice,forced", [("required", None), ("function", "f")])
def test_a_forced_call_cut_inside_its_marker_leaves_no_marker_text(choice, forced):
    constraint = ToolConstraint((Tool("f", None, {"type": "object"}),), choice, forced)
    for cut in ("<", "<tool_c", "<tool_call>\n{\"na"):
        content, calls = split(constraint, cut)
        assert content == "" and not calls
    parser = constraint.parser()
    pieces = parser.feed("<tool") + parser.close()
    assert [p for p in pieces if p.kind == "content"] == []


def test_under_auto_held_back_marker_text_is_still_content():
    constraint = ToolConstraint((Tool("f", None, {"type": "object"}),), "auto")
    assert split(constraint, "I will call <tool") == ("I will call <tool", [])


# bounded caches
def test_a_bounded_cache_keeps_the_most_recent_within_both_bounds():
    cache: BoundedCache[str, str] = BoundedCache(3, 10, lambda key, value: len(value))
    for key in "abc":
        cache.put(key, "xx")
    assert cache.get("a") == "xx"  # a is now the most recent
    cache.put("d", "xx")
    assert cache.get("b") is None and len(cache) == 3  # b was the least recent
    cache.put("e", "x" * 7)
    assert cache.nbytes <= 10 and cache.get("e") == "x" * 7 and cache.get("c") is None
    cache.put("huge", "x" * 11)
    assert cache.get("huge") is None and cache.nbytes <= 10


def test_memoised_schema_checks_stay_within_their_bounds():
    calls = []

    @bounded(max_entries=4, max_bytes=100)
    def checked(key: str) -> int:
        calls.append(key)
        return len(key)

    for i in range(50):
        checked(f"schema-{i}")
    assert len(checked.cache) == 4 and checked.cache.nbytes <= 100  # type: ignore[attr-defined]
    checked("schema-49")
    assert calls.count("schema-49") == 1  # a repeated schema is not checked again
