"""Request shapes built to crash a checker (each answered 500 once), shared by the hand-made bad-input tests
and the fuzz driver, so the class stays covered in both."""

from __future__ import annotations

from typing import Any

MAX_TOKENS = 4  # a generating request asks for at most this many tokens: the fuzz is of the request


def ref_chain(links: int) -> dict[str, Any]:
    """A schema whose property goes through ``links`` ``$ref``s in a row before it reaches a type."""
    defs: dict[str, Any] = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs}


# schemas built to crash a checker (each answered 500 once): sent as response_format and as a tool's parameters
HOSTILE_SCHEMAS: dict[str, dict[str, Any]] = {
    "type as a list of objects": {"type": "object", "properties": {"a": {"type": [{"x": 1}]}}},
    "type as an object": {"type": "object", "properties": {"a": {"type": {"x": 1}}}},
    "format as a list": {"type": "object", "properties": {"a": {"type": "string", "format": ["date"]}}},
    "format as an object": {"type": "object", "properties": {"a": {"type": "string", "format": {"x": 1}}}},
    "a $ref chain of 900 links": ref_chain(900),
    "a $ref chain of 100 links": ref_chain(100),
    "a $ref cycle spelled with ~1": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a~1b"}},
                                     "$defs": {"a/b": {"$ref": "#/$defs/a~1b"}}},
    "a $ref cycle spelled with %25": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a%25b"}},
                                      "$defs": {"a%b": {"$ref": "#/$defs/a%25b"}}},
}


def hostile_bodies(model: str) -> list[tuple[str, dict[str, Any], str]]:
    """(label, chat body, the param its 400 names) for each hostile schema, as response_format and as tools."""
    out = []
    for name, schema in HOSTILE_SCHEMAS.items():
        base = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS}
        out.append((f"response_format: {name}", {**base, "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}, "response_format"))
        out.append((f"tools: {name}", {**base, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": schema}}], "tool_choice": "required"}, "tools[0].function.parameters"))
    return out
