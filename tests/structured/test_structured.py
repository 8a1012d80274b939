"""Structured output: the subset check, enforcement while generating on the bundled model, refusals."""

import json

import httpx
import pytest

from millm.errors import ResponseFormatUnsupported
from millm.structured.schema import check_response_format

MODEL = "SmolLM2-135M-Instruct"
JUDGE = {"type": "json_schema", "json_schema": {"name": "judge_v1", "strict": True, "schema": {
    "type": "object", "properties": {"label": {"enum": ["humor", "not_humor"]}},
    "required": ["label"], "additionalProperties": False}}}


def rf(schema, name="s"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


@pytest.mark.parametrize("schema,pointer", [
    ({"type": "integer", "multipleOf": 3}, "'multipleOf' at '/multipleOf'"),
    ({"not": {"type": "string"}}, "'not' at '/not'"),
    ({"type": "array", "uniqueItems": True}, "'uniqueItems' at '/uniqueItems'"),
    ({"allOf": [{"type": "string"}]}, "'allOf' at '/allOf'"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "'oneOf' is enforced only where its branches cannot"),
    ({"if": {}, "then": {}, "else": {}}, "'if' at '/if'"),
    ({"type": "object", "properties": {"d": {"type": "string", "format": "colour"}}},
     "'format' 'colour' at '/properties/d/format'"),
    ({"type": "object", "patternProperties": {"^a": {}}}, "'patternProperties'"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "'dependentRequired'"),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"}, "'$schema' "),
    ({"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}}, "'$ref'"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "'$ref'"),
])
def test_refused_keywords_name_pointer(schema, pointer):
    with pytest.raises(ResponseFormatUnsupported) as exc:
        check_response_format(rf(schema))
    assert pointer in exc.value.message and exc.value.param == "response_format"


@pytest.mark.parametrize("dialect", ["https://json-schema.org/draft/2020-12/schema",
                                     "http://json-schema.org/draft-07/schema#"])
def test_a_schema_naming_its_dialect_and_annotations_is_taken(dialect):
    """zod 4 (openai-node's zodResponseFormat) writes '$schema'; editors write '$id', '$comment', readOnly."""
    schema = {"$schema": dialect, "$id": "https://example.com/capital.json", "$comment": "by hand",
              "type": "object", "properties": {"city": {"type": "string", "readOnly": True, "deprecated": False}},
              "required": ["city"]}
    check_response_format(rf(schema))


def test_every_refused_keyword_is_listed():
    with pytest.raises(ResponseFormatUnsupported) as exc:
        check_response_format(rf({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 2},
                                                                    "b": {"type": "string", "format": "phone"}}}))
    assert "/properties/a/multipleOf" in exc.value.message and "/properties/b/format" in exc.value.message


def test_objects_that_declare_properties_are_generated_closed():
    from millm.structured.schema import closed

    item = {"type": "object", "properties": {"n": {"type": "integer"}}}
    schema = {"type": "object", "properties": {
        "items": {"type": "array", "items": item},
        "either": {"anyOf": [item, {"type": "string"}]},
        "map": {"type": "object", "additionalProperties": item},  # a free-form map of closed objects
        "open": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True},
        "ref": {"$ref": "#/$defs/thing"}},
        "$defs": {"thing": item}}
    before = json.dumps(schema)
    out = closed(schema)
    assert json.dumps(schema) == before  # the original is left as it is: validation reads it
    assert out["additionalProperties"] is False
    props = out["properties"]
    assert props["items"]["items"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False and props["either"]["anyOf"][1] == \
        {"type": "string"}
    assert "additionalProperties" in props["map"] and props["map"]["additionalProperties"]["additionalProperties"] \
        is False and "properties" not in props["map"]
    assert props["open"]["additionalProperties"] is True  # set by the client: kept
    assert out["$defs"]["thing"]["additionalProperties"] is False
    assert closed({"type": "object"}) == {"type": "object"}  # no properties: a free-form object stays open


def test_the_header_says_when_undeclared_properties_are_omitted():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    omitted = check_response_format(rf(schema))
    literal = check_response_format(rf(schema), undeclared="allow")
    already = check_response_format(rf({**schema, "additionalProperties": False}))
    assert omitted is not None and literal is not None and already is not None
    assert omitted.header() == 'json_schema;name="s";undeclared=omitted'
    assert literal.header() == already.header() == 'json_schema;name="s"'
    assert '"additionalProperties":false' in omitted.key and "additionalProperties" not in literal.key
    assert omitted.schema == literal.schema == schema  # what the document is validated against


def test_limits_and_annotations():
    deep = {"type": "object"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"x": deep}}
    with pytest.raises(ResponseFormatUnsupported, match="deeper than 32"):
        check_response_format(rf(deep))
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(257)}}
    with pytest.raises(ResponseFormatUnsupported, match="at most 256"):
        check_response_format(rf(wide))
    big = {"type": "object", "description": "x" * 70_000}
    with pytest.raises(ResponseFormatUnsupported, match="64 KB"):
        check_response_format(rf(big))
    ok = check_response_format(rf({"type": "string", "title": "t", "description": "d", "default": "a",
                                   "examples": ["b"]}, name="judge_v1-2"))
    assert ok.header() == 'json_schema;name="judge_v1-2"'
    for bad in ('quo"te', "", "x" * 65, "line\nbreak", "naïve"):  # OpenAI's [a-zA-Z0-9_-]{1,64}
        with pytest.raises(ResponseFormatUnsupported, match="name"):
            check_response_format(rf({"type": "string"}, name=bad))
    assert check_response_format({"type": "text"}) is None
    assert check_response_format({"type": "json_object"}).header() == "json_object"


def chat(server, response_format, prompt="Is this a joke: why did the chicken cross the road?", **body):
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 60,
            "response_format": response_format} | body
    return httpx.post(server + "/v1/chat/completions", json=body, timeout=120)


def test_judge_enum_always_valid(server):
    for seed in range(4):
        r = chat(server, JUDGE, temperature=1.2, seed=seed)
        assert r.status_code == 200, r.text
        assert r.headers["X-miLLM-Constrained"] == 'json_schema;name="judge_v1"'
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert json.loads(choice["message"]["content"])["label"] in ("humor", "not_humor")


@pytest.mark.parametrize("schema,check", [
    ({"type": "object", "properties": {"person": {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 12}, "age": {"type": "integer", "minimum": 5,
                                                                             "maximum": 10}},
        "required": ["name", "age"], "additionalProperties": False}}, "required": ["person"],
      "additionalProperties": False},
     lambda d: 2 <= len(d["person"]["name"]) <= 12 and 5 <= d["person"]["age"] <= 10),
    ({"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 3}, "minItems": 2, "maxItems": 3},
     lambda d: 2 <= len(d) <= 3 and all(1 <= x <= 3 for x in d)),
    ({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-C]{3}$"}}, "required": ["code"],
      "additionalProperties": False},
     lambda d: len(d["code"]) == 3 and set(d["code"]) <= set("ABC")),
    ({"type": "object", "properties": {"v": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}}, "required": ["v"],
      "additionalProperties": False},
     lambda d: d["v"] in (True, False, None)),
    ({"$defs": {"colour": {"enum": ["red", "green"]}}, "type": "object",
      "properties": {"c": {"$ref": "#/$defs/colour"}, "k": {"const": 7}, "x": {"type": "number", "minimum": 0.5,
                                                                              "maximum": 2}},
      "required": ["c", "k", "x"], "additionalProperties": False},
     lambda d: d["c"] in ("red", "green") and d["k"] == 7 and 0.5 <= d["x"] <= 2),
])
def test_schemas_enforced(server, schema, check):
    finishes = []
    for seed in (1, 2):
        r = chat(server, rf(schema), prompt="Give me some data as JSON.", temperature=1.0, seed=seed, max_tokens=80)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        finishes.append(choice["finish_reason"])
        if choice["finish_reason"] == "stop":
            assert check(json.loads(choice["message"]["content"]))
    assert "stop" in finishes  # at least one closed document was checked


def test_json_object_and_length(server):
    r = chat(server, {"type": "json_object"}, prompt="Describe a cat as JSON.", temperature=0, max_tokens=120)
    assert r.headers["X-miLLM-Constrained"] == "json_object"
    choice = r.json()["choices"][0]
    assert choice["message"]["content"].startswith("{")
    if choice["finish_reason"] == "stop":  # an open object may also run to max_tokens
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    cut = chat(server, {"type": "json_object"}, prompt="Describe a cat as JSON.", temperature=0, max_tokens=3)
    assert cut.json()["choices"][0]["finish_reason"] == "length"
    assert cut.json()["choices"][0]["message"]["content"].startswith("{")


def test_n_and_extra_messages_each_constrained(server):
    r = chat(server, JUDGE, n=2, temperature=1.0, seed=3,
             extra_messages=[[{"role": "user", "content": "Is tax law funny?"}]])
    choices = r.json()["choices"]
    assert len(choices) == 4
    for c in choices:
        assert json.loads(c["message"]["content"])["label"] in ("humor", "not_humor")


def test_strict_false_still_enforced(server):
    loose = {"type": "json_schema", "json_schema": {**JUDGE["json_schema"], "strict": False}}
    r = chat(server, loose, temperature=1.0, seed=8)
    assert json.loads(r.json()["choices"][0]["message"]["content"])["label"] in ("humor", "not_humor")


@pytest.mark.parametrize("route,body,code", [
    ("chat/completions", {"stop": ["}"]}, "response_format_unsupported"),
    ("chat/completions", {"logprobs": True, "max_tokens": 1}, "field_not_honoured"),
    ("completions", {"prompt": "x"}, "field_not_honoured"),
    ("chat/completions", {"model": "SmolLM2-135M-Instruct:Q4_1"}, "field_not_honoured"),
    ("chat/completions", {"response_format": rf({"type": "integer", "multipleOf": 2})}, "response_format_unsupported"),
])
def test_refused_combinations(server, route, body, code):
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
               "response_format": JUDGE} | body
    if route == "completions":
        payload.pop("messages")
    r = httpx.post(f"{server}/v1/{route}", json=payload, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
    assert r.json()["error"]["param"] == "response_format"
    emb = httpx.post(f"{server}/v1/embeddings", json={"model": MODEL, "input": "x", "response_format": JUDGE},
                     timeout=60)
    assert emb.status_code == 400 and emb.json()["error"]["param"] == "response_format"


def test_compiled_once_per_schema(server, engine):
    before = engine.constraints.compiles
    for _ in range(3):
        chat(server, rf({"type": "object", "properties": {"once": {"type": "boolean"}}, "required": ["once"]}),
             max_tokens=12)
    assert engine.constraints.compiles == before + 1


def test_validation_failure_is_500(server, engine, monkeypatch):
    """A test seam: the backend enforces a looser schema than the one validated afterwards."""
    from millm.structured.schema import JsonConstraint

    real = engine.constraints.matcher

    def looser(c):
        return real(JsonConstraint("json_schema", {"type": "object", "properties": {"other": {"type": "boolean"}},
                                                   "required": ["other"], "additionalProperties": False}))

    monkeypatch.setattr(engine.constraints, "matcher", looser)
    r = chat(server, JUDGE, temperature=0)
    assert r.status_code == 500 and r.json()["error"]["code"] == "constrained_output_invalid"
