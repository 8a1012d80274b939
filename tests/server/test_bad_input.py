"""Bad input is the client's error: 400 with an OpenAI error body, decided before any model work (issue 16, item 11)."""

import json

import httpx
import pytest

from millm.errors import InvalidParameter, ResponseFormatUnsupported
from millm.requests.builder import build_chat
from millm.requests.jsonbody import MAX_DEPTH, check_value, decode
from millm.requests.validation import check_scoring_temperature, sampling_params
from millm.structured.schema import check_response_format
from tests.support.hostile import hostile_bodies

MODEL = "SmolLM2-135M-Instruct"
HI = [{"role": "user", "content": "hi"}]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def json_schema(schema):
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


# the body decoder, pure
def test_decode_takes_utf8_json_and_a_utf8_bom():
    assert decode(b'{"a": "caf\xc3\xa9"}') == {"a": "caf\u00e9"}
    assert decode(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}


@pytest.mark.parametrize("raw", [json.dumps({"a": "hi"}).encode("utf-16"), '{"a": "caf\u00e9"}'.encode("latin-1"),
                                 json.dumps({"a": 1}).encode("utf-32")])
def test_decode_refuses_what_is_not_utf8(raw):
    with pytest.raises(InvalidParameter, match="not UTF-8"):
        decode(raw)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 100_000])
def test_decode_refuses_deep_nesting(depth):
    with pytest.raises(InvalidParameter, match=f"deeper than {MAX_DEPTH}"):
        decode(('{"a": ' + nested(depth) + '}').encode())


def test_decode_takes_nesting_up_to_the_limit():
    decode(nested(MAX_DEPTH).encode())


@pytest.mark.parametrize("raw,param", [
    (b'{"messages": [{"content": "a\\ud800b"}]}', "messages[0].content"),
    (b'{"prompt": ["ok", "\\udfff"]}', "prompt[1]"),
    (b'{"messages": [{"role": "user", "\\ud800": 1}]}', "messages[0]"),
])
def test_decode_refuses_lone_surrogates_naming_where(raw, param):
    with pytest.raises(InvalidParameter) as exc:
        decode(raw)
    assert exc.value.param == param and "surrogate" in exc.value.message


def test_a_paired_surrogate_escape_is_text():
    assert decode(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}


@pytest.mark.parametrize("raw,param", [(b'{"temperature": NaN}', "temperature"),
                                       (b'{"a": {"b": [1, Infinity]}}', "a.b[1]"), (b'{"t": 1e400}', "t")])
def test_decode_refuses_non_finite_numbers(raw, param):
    with pytest.raises(InvalidParameter) as exc:
        decode(raw)
    assert exc.value.param == param


def test_check_value_survives_a_value_deeper_than_the_recursion_limit():
    value: list = []
    for _ in range(5000):
        value = [value]
    with pytest.raises(InvalidParameter):
        check_value(value)


# the temperature floor is scoring's alone: generation honours the whole 0-2 range
@pytest.mark.parametrize("t", [1e-40, 5e-324, 0.0005, 0.001])
def test_generation_takes_any_temperature_in_range(t):
    assert sampling_params({"temperature": t}).temperature == t


@pytest.mark.parametrize("t", [1e-40, 5e-324, 0.0005])
def test_scoring_refuses_a_temperature_between_0_and_the_floor(t):
    with pytest.raises(InvalidParameter, match="overflow") as exc:
        check_scoring_temperature(t)
    assert exc.value.param == "temperature"


# schemas are checked whole before anything generates
@pytest.mark.parametrize("schema,says", [
    ({"type": "string", "pattern": "\\p{L}+"}, "regex"),  # Rust's regex takes it, Python's re (validation) does not
    ({"type": "string", "pattern": "(?<=a)b"}, "linear time"),  # Python takes it; RE2 and llguidance do not
    ({"type": "string", "pattern": 5}, "/pattern"),
    ({"type": "number", "minimum": "a"}, "/minimum"),
    ({"type": "string", "minLength": -1}, "/minLength"),
    ({"type": "object", "required": [1]}, "/required/0"),
    ({"type": "number", "minimum": float("nan")}, "NaN"),
])
def test_schema_problems_are_refused_before_generating(schema, says):
    with pytest.raises(ResponseFormatUnsupported, match=says) as exc:
        check_response_format(json_schema(schema))
    assert exc.value.param == "response_format"


def test_a_good_schema_passes():
    assert check_response_format(json_schema({"type": "string", "pattern": "^[a-z]+$"})) is not None


def test_builder_refuses_a_bad_pattern_before_naming_an_engine():
    asked = []
    body = {"model": MODEL, "messages": HI, "response_format": json_schema({"type": "string", "pattern": "\\p{L}"})}
    with pytest.raises(ResponseFormatUnsupported):
        build_chat(body, lambda name: asked.append(name) or "transformers")
    assert asked == [MODEL]  # the model was named, never loaded: the builder does no model work


# over HTTP, on the live server
def post(base, path, content, method="POST"):
    return httpx.request(method, base + path, content=content, headers={"content-type": "application/json"},
                         timeout=120)


def assert_openai_400(r, param=None):
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param


def chat_body(**fields):
    return {"model": MODEL, "messages": HI, "max_tokens": 2, "temperature": 0, **fields}


BAD_BODIES = {
    "utf16": ("/v1/chat/completions", json.dumps(chat_body()).encode("utf-16"), None),
    "latin1": ("/v1/chat/completions", json.dumps(chat_body(), ensure_ascii=False).replace(
        '"hi"', '"caf\u00e9"').encode("latin-1"), None),
    "deep content": ("/v1/chat/completions", json.dumps(chat_body()).replace('"hi"', nested(1000)).encode(), None),
    "deep unknown field": ("/v1/chat/completions",
                           json.dumps(chat_body()).replace('"max_tokens"', f'"foo": {nested(1000)}, "max_tokens"')
                           .encode(), None),
    "deep chat_template_kwargs": ("/v1/chat/completions", json.dumps(chat_body(chat_template_kwargs={"a": "X"}))
                                  .replace('"X"', nested(1000)).encode(), None),
    "surrogate content": ("/v1/chat/completions", json.dumps(chat_body()).replace('"hi"', '"a\\ud800"').encode(),
                          "messages[0].content"),
    "surrogate message key": ("/v1/chat/completions",
                              json.dumps(chat_body()).replace('"role"', '"\\udc00": 1, "role"').encode(),
                              "messages[0]"),
    "surrogate prompt": ("/v1/completions", b'{"model": "%s", "prompt": "x\\ud800", "max_tokens": 1}' % MODEL.encode(),
                         "prompt"),
    "surrogate input": ("/v1/embeddings", b'{"model": "%s", "input": ["ok", "\\udbff"]}' % MODEL.encode(), "input[1]"),
    "nan in a schema": ("/v1/chat/completions", json.dumps(chat_body(
        response_format=json_schema({"type": "number", "minimum": float("nan")}))).encode(),
                        "response_format.json_schema.schema.minimum"),
    "tiny scoring temperature, chat": ("/v1/chat/completions", json.dumps(chat_body(
        temperature=1e-40, logprobs=True, max_tokens=1)).encode(), "temperature"),
    "tiny scoring temperature, completions": ("/v1/completions", json.dumps(
        {"model": MODEL, "prompt": "hi", "max_tokens": 1, "logprobs": 2, "temperature": 1e-30}).encode(),
        "temperature"),
    "python-only pattern": ("/v1/chat/completions", json.dumps(chat_body(
        response_format=json_schema({"type": "string", "pattern": "\\p{Greek}+"}))).encode(), "response_format"),
}


@pytest.mark.parametrize("label,body,param", hostile_bodies(MODEL), ids=[h[0] for h in hostile_bodies(MODEL)])
def test_hostile_schemas_answer_400_naming_the_field(server, label, body, param):
    assert_openai_400(httpx.post(server + "/v1/chat/completions", json=body, timeout=120), param)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_a_tiny_generation_temperature_is_honoured_as_near_greedy(server, route):
    body = chat_body(max_tokens=6) if route.endswith("chat/completions") else {
        "model": MODEL, "prompt": "The capital of France is", "max_tokens": 6}
    greedy = httpx.post(server + route, json={**body, "temperature": 0}, timeout=120)
    tiny = httpx.post(server + route, json={**body, "temperature": 1e-40}, timeout=120)
    assert greedy.status_code == tiny.status_code == 200
    assert tiny.json()["choices"] == greedy.json()["choices"]


@pytest.mark.parametrize("case", BAD_BODIES)
def test_bad_bodies_answer_400(server, case):
    path, content, param = BAD_BODIES[case]
    assert_openai_400(post(server, path, content), param)


def test_deep_steering_body_answers_400(server):
    assert_openai_400(post(server, "/api/steering", b'{"sae": "x", "values": %s}' % nested(1000).encode(), "PUT"))


@pytest.mark.parametrize("name", ["~foo", "~root/x", "~/x", "a" * 300, "org/" + "b" * 300, "\x00x"])
def test_odd_model_names_are_not_found(server, name):
    r = httpx.post(server + "/v1/chat/completions", json=chat_body(model=name), timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert httpx.get(server + "/api/models/" + name.replace("\x00", "%00"), timeout=60).status_code == 404


def test_server_answers_after_bad_input(server):
    for path, content, _ in BAD_BODIES.values():
        post(server, path, content)
    assert httpx.get(server + "/api/health", timeout=10).json() == {"status": "ok"}
    r = httpx.post(server + "/v1/chat/completions", json=chat_body(), timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


# /api bodies are held to the schemas /openapi.json publishes, before anything reaches SQLite or a path
API_WRONG_TYPES = [
    ("PUT", "/api/steering", {"sae": [{"a": 1}], "values": {}}, "sae"),  # answered 500 (SQLite binding)
    ("PATCH", "/api/steering", {"sae": {"x": 1}, "values": {"1": 2.0}}, "sae"),
    ("PUT", "/api/steering", {"sae": "x", "values": {"1": "strong"}}, "values.1"),
    ("PUT", "/api/steering", {"sae": "x"}, "values"),
    ("POST", "/api/saes", {"path": ["/tmp"]}, "path"),
    ("POST", "/api/saes", {"path": "/tmp", "name": {"n": 1}}, "name"),
    ("POST", "/api/saes/sae_x/attach", {"layer": "ten"}, "layer"),
    ("PUT", "/api/monitoring", {"enabled": True, "history": [5]}, "history"),
    ("POST", "/api/models", {"path": 5}, "path"),
    ("POST", "/api/profiles", {"name": "p", "entries": [{"sae": [1], "feature": 1, "strength": 1.0}]},
     "entries.0.sae"),
]


@pytest.mark.parametrize("method,path,body,param", API_WRONG_TYPES)
def test_api_wrong_value_types_answer_400_naming_the_field(server, method, path, body, param):
    assert_openai_400(httpx.request(method, server + path, json=body, timeout=60), param)
