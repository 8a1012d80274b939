"""Bad input refused before anything generates: a $ref cycle that no value decides (its validation would
recurse without end, a 500 after generating), and chat_template_kwargs that are the renderer's own
arguments or the wrong shape (fast tier)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from millm.config import Settings
from millm.errors import InvalidParameter, ResponseFormatUnsupported
from millm.requests.builder import TEMPLATE_ARGUMENTS, build_chat
from millm.structured.schema import check_response_format
from tests.support.fakes import FakeEngine


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


CYCLES = [
    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "string"}]}}, "$ref": "#/$defs/a"},
    {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
     "$defs": {"a": {"oneOf": [{"$ref": "#/$defs/b"}]}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}}},
]
NEXT = {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}
RECURSIVE = [
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": NEXT},
                        "required": ["v", "next"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
    {"$defs": {"tree": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}, "$ref": "#/$defs/tree"},
]


@pytest.mark.parametrize("schema", CYCLES)
def test_a_ref_cycle_no_value_decides_is_refused(schema):
    with pytest.raises(ResponseFormatUnsupported, match="cycle") as info:
        check_response_format(schema_format(schema))
    assert info.value.param == "response_format" and "/$defs/a" in info.value.message


@pytest.mark.parametrize("schema", RECURSIVE)
def test_recursion_through_a_value_is_still_enforced(schema):
    assert check_response_format(schema_format(schema)) is not None


def test_the_server_refuses_a_cycle_before_generating(tmp_path):
    from millm.server.app import create_app

    engine = FakeEngine()
    app = create_app(Settings(home=tmp_path), engine)  # type: ignore[arg-type]

    async def main():
        async with app.test_app():
            r = await app.test_client().post("/v1/chat/completions", json={
                "model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "response_format": schema_format(CYCLES[1])})
            return r.status_code, await r.get_json()

    status, body = asyncio.run(main())
    assert status == 400 and body["error"]["code"] == "response_format_unsupported", body
    assert engine.steps == 0


def chat(**kwargs: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": kwargs}


@pytest.mark.parametrize("kwargs,param", [
    ({"documents": 5}, "chat_template_kwargs.documents"),
    ({"documents": ["text"]}, "chat_template_kwargs.documents"),
    ({"return_assistant_tokens_mask": True}, "chat_template_kwargs.return_assistant_tokens_mask"),
    ({"sanitize_control_tokens": False}, "chat_template_kwargs.sanitize_control_tokens"),
])
def test_template_kwargs_that_would_break_the_renderer_are_a_400(kwargs, param):
    with pytest.raises(InvalidParameter) as info:
        build_chat(chat(**kwargs), lambda _: "transformers")
    assert info.value.param == param


def test_documents_the_template_can_take_pass_through():
    built = build_chat(chat(documents=[{"title": "t", "text": "x"}], enable_thinking=False), lambda _: "transformers")
    assert built.generations[0].prompts[0].template_kwargs["documents"] == [{"title": "t", "text": "x"}]


def test_every_argument_of_the_renderer_is_one_a_client_cannot_set():
    """A new apply_chat_template argument in transformers is refused until miLLM decides otherwise."""
    from transformers import PreTrainedTokenizerBase

    own = set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters) - {"self", "kwargs"}
    # chat_template: a client's own template, refused; documents: checked; tools: tool calling's own field
    decided = set(TEMPLATE_ARGUMENTS) | {"chat_template", "documents", "tools"}
    assert own <= decided, own - decided
