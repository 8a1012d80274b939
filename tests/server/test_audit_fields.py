"""Fields the audit (issue 16) found dropped silently: each is now honoured, reported or refused.

Fast tier: the request builder and the scripted engine behind Quart's test client.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from millm.errors import InvalidParameter, MillmError, ResponseFormatUnsupported, UnusedFieldsRefused
from millm.requests.builder import build_chat, build_completion
from millm.steering.readout import ReadoutAsk
from tests.support.app import chat, frames, make, run
from tests.support.fakes import FakeEngine

TF = lambda _: "transformers"  # noqa: E731
GGUF = lambda _: "llama.cpp"  # noqa: E731


def chunks(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(f.removeprefix("data: ")) for f in frames(data)[:-1]]


def post_all(app: Any, bodies: list[tuple[str, dict[str, Any]]], headers: dict[str, str] | None = None) -> list[Any]:
    """(status, headers, body bytes) for each request, in order."""
    async def scenario(client: Any) -> list[Any]:
        out = []
        for route, body in bodies:
            r = await client.post(route, json=body, headers=headers or {})
            out.append((r.status_code, r.headers, await r.get_data()))
        return out
    return run(app, scenario)


# stream_options
def test_include_usage_false_leaves_usage_off_and_true_or_absent_keeps_it(tmp_path):
    app, _ = make(tmp_path)
    prompt = {"model": "fake", "prompt": "hi", "max_tokens": 3, "stream": True}
    results = post_all(app, [
        ("/v1/chat/completions", chat(stream=True, max_tokens=3, stream_options={"include_usage": False})),
        ("/v1/chat/completions", chat(stream=True, max_tokens=3, stream_options={"include_usage": True})),
        ("/v1/chat/completions", chat(stream=True, max_tokens=3)),
        ("/v1/completions", {**prompt, "stream_options": {"include_usage": False}}),
        ("/v1/completions", {**prompt, "stream_options": {"include_usage": True}}),
    ])
    finals = [chunks(data)[-1] for _, _, data in results]
    assert all(f["choices"][0]["finish_reason"] == "length" for f in finals)
    assert ["usage" in f for f in finals] == [False, True, True, False, True]
    assert finals[1]["usage"]["completion_tokens"] == 3
    assert all("X-miLLM-Ignored-Fields" not in h for _, h, _ in results)  # include_usage is used, not reported


def test_stream_options_on_a_request_that_does_not_stream_is_reported(tmp_path):
    app, _ = make(tmp_path)
    results = post_all(app, [
        ("/v1/chat/completions", chat(max_tokens=2, stream_options={"include_usage": False})),
        ("/v1/completions", {"model": "fake", "prompt": "hi", "max_tokens": 2, "stream": False,
                             "stream_options": {"include_usage": True}}),
    ])
    for status, headers, data in results:
        assert status == 200 and headers["X-miLLM-Ignored-Fields"] == '"stream_options"'
        assert "usage" in json.loads(data)  # a whole response always carries usage
    strict = post_all(app, [("/v1/chat/completions", chat(max_tokens=2, stream_options={"include_usage": True}))],
                      {"X-miLLM-Strict": "true"})
    assert strict[0][0] == 400 and json.loads(strict[0][2])["error"]["param"] == "stream_options"


def test_include_usage_must_be_a_boolean():
    with pytest.raises(InvalidParameter) as err:
        build_chat(chat(stream=True, stream_options={"include_usage": "yes"}), TF)
    assert err.value.param == "stream_options.include_usage"


# keys nested in used objects
@pytest.mark.parametrize("extra,location", [
    ({"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
     "stream_options.continuous_usage_stats"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "judge", "description": "a verdict", "strict": True, "schema": {"type": "object"}}}},
     "response_format.json_schema.description"),
    ({"response_format": {"type": "json_object", "json_schema": {"name": "x", "schema": {}}}},
     "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "schema": {"type": "object"},
                          "json_schema": {"name": "x", "schema": {"type": "object"}}}}, "response_format.schema"),
    ({"return_sae_activations": {"top_k": 2, "colour": "red"}}, "return_sae_activations.colour"),
])
def test_unread_nested_keys_are_reported_and_refused_in_strict_mode(extra, location):
    built = build_chat(chat(**extra), TF)
    assert built.ignored == [location]
    with pytest.raises(UnusedFieldsRefused) as err:
        build_chat(chat(**extra), TF, strict=True)
    assert err.value.param == location


def test_read_nested_keys_are_not_reported_and_reported_keys_are_not_passed_on():
    built = build_chat(chat(stream=True, stream_options={"include_usage": False},
                            return_sae_activations={"top_k": 2, "positions": "last", "colour": None, "x": 1}), TF)
    assert built.ignored == ["return_sae_activations.x"]
    assert built.generations[0].readout == ReadoutAsk(top_k=2, positions="last")  # the readout never sees x


def test_nested_keys_are_reported_over_http_too(tmp_path):
    app, _ = make(tmp_path)
    [(status, headers, _)] = post_all(app, [("/v1/chat/completions", chat(
        stream=True, max_tokens=2, stream_options={"include_usage": True, "x": 1}))])
    assert status == 200 and headers["X-miLLM-Ignored-Fields"] == '"stream_options.x"'


# response_format {"type": "json_object", "schema": ...}
def test_json_object_with_a_schema_enforces_that_schema_and_says_so():
    schema = {"type": "object", "properties": {"label": {"enum": ["a", "b"]}}, "required": ["label"]}
    built = build_chat(chat(response_format={"type": "json_object", "schema": schema}), TF)
    assert built.constraint is not None and built.constraint.schema == schema
    assert built.constraint.header() == "json_object;schema;undeclared=omitted"
    assert built.ignored == []
    plain = build_chat(chat(response_format={"type": "json_object"}), TF)
    assert plain.constraint is not None and plain.constraint.header() == "json_object"


@pytest.mark.parametrize("schema", [{"type": "object", "not": {"type": "null"}}, "an object", [1]])
def test_json_object_schema_is_checked_like_a_json_schema(schema):
    with pytest.raises(ResponseFormatUnsupported) as err:
        build_chat(chat(response_format={"type": "json_object", "schema": schema}), TF)
    assert err.value.param == "response_format"


def test_json_object_schema_header_over_http(tmp_path):
    app, _ = make(tmp_path)
    [(status, headers, _)] = post_all(app, [("/v1/chat/completions", chat(
        max_tokens=2, response_format={"type": "json_object", "schema": {"type": "object"},
                                       "strict": True}))])
    assert status == 200 and headers["X-miLLM-Constrained"] == "json_object"
    assert headers["X-miLLM-Ignored-Fields"] == '"response_format.strict"'


# message keys
def test_the_template_receives_exactly_the_keys_not_reported():
    messages = [{"role": "system", "content": "Be brief.", "name": "ops"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann", "weight": 2},
                {"role": "assistant", "content": "ok", "tool_calls": [], "reasoning_content": None}]
    built = build_chat({"model": "m", "messages": messages, "extra_messages": [[{"role": "user", "content": "x",
                                                                                 "name": "bo"}]]}, TF)
    sent = [p.messages for p in built.generations[0].prompts]
    assert sent == [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                     {"role": "assistant", "content": "ok"}], [{"role": "user", "content": "x"}]]
    assert built.ignored == ["messages[0].name", "messages[1].name", "messages[1].weight",
                             "extra_messages[0][0].name"]  # tool_calls is read (tool calling); [] holds no call
    scoring = build_chat({"model": "m", "messages": messages, "logprobs": True, "max_tokens": 1}, TF)
    assert scoring.score is not None
    assert scoring.score.rows[0].prompt.messages == sent[0]  # type: ignore[union-attr]


# already honoured (engine-interface commit 7fef01a); pinned here
def test_chat_template_kwargs_reach_chat_scoring():
    built = build_chat(chat(logprobs=True, max_tokens=1, chat_template_kwargs={"enable_thinking": False}), TF)
    assert built.score is not None and built.ignored == []
    assert built.score.rows[0].prompt.template_kwargs == {"enable_thinking": False}  # type: ignore[union-attr]


def test_return_tokens_as_token_ids_on_a_generating_chat_is_reported(tmp_path):
    app, _ = make(tmp_path)
    body = chat(max_tokens=2, return_tokens_as_token_ids=True)
    [(status, headers, _)] = post_all(app, [("/v1/chat/completions", body)])
    assert status == 200 and headers["X-miLLM-Ignored-Fields"] == '"return_tokens_as_token_ids"'
    [(status, _, data)] = post_all(app, [("/v1/chat/completions", body)], {"X-miLLM-Strict": "1"})
    assert status == 400 and json.loads(data)["error"]["param"] == "return_tokens_as_token_ids"


@pytest.mark.parametrize("engine_of", [TF, GGUF])
@pytest.mark.parametrize("value", [0, 5, 1.0, "true"])
def test_non_boolean_logprobs_on_chat_is_refused_naming_it(engine_of, value):
    with pytest.raises(MillmError) as err:
        build_chat(chat(logprobs=value, max_tokens=1), engine_of)
    assert err.value.status == 400 and err.value.param == "logprobs"


# return_sae_activations on scoring
def test_readout_on_a_scoring_request_is_served_not_refused():
    built = build_chat(chat(logprobs=True, max_tokens=1, return_sae_activations={"positions": "prompt"}), TF)
    assert built.score is not None and built.score.readout == ReadoutAsk(positions="prompt") and built.ignored == []
    done = build_completion({"model": "m", "prompt": "x", "max_tokens": 1, "logprobs": 2,
                             "return_sae_activations": {}}, TF)
    assert done.score is not None and done.score.readout == ReadoutAsk()
    with pytest.raises(InvalidParameter) as err:  # one position axis, as on generation
        build_completion({"model": "m", "prompt": ["a", "b"], "max_tokens": 1, "logprobs": 2,
                          "return_sae_activations": {}}, TF)
    assert err.value.param == "return_sae_activations"


def test_readout_on_scoring_without_a_steerable_engine_names_the_field(tmp_path):
    app, _ = make(tmp_path, FakeEngine())
    [(status, headers, data)] = post_all(app, [("/v1/chat/completions", chat(
        logprobs=True, max_tokens=1, return_sae_activations={}))])
    assert status == 400 and json.loads(data)["error"]["param"] == "return_sae_activations"
