"""The JSON Schema keywords that joined the enforced subset, measured on the bundled model's tokenizer: every
string ``format`` miLLM accepts rejects a malformed value token by token; ``oneOf`` compiles where its branches
are disjoint (a discriminator) and is refused otherwise; ``uniqueItems`` stays refused by name."""

from __future__ import annotations

import json

import pytest

from millm.errors import ResponseFormatUnsupported
from millm.structured.schema import FORMATS, check_response_format

GOOD_BAD = {"date": ("2024-05-17", "2024-13-45"), "date-time": ("2024-05-17T10:00:00Z", "2024-05-17 10:00"),
            "time": ("10:00:00Z", "25:61"), "duration": ("P3D", "3 days"),
            "uuid": ("123e4567-e89b-12d3-a456-426614174000", "123e4567"), "email": ("a@b.com", "not an email"),
            "hostname": ("example.com", "-bad-"), "ipv4": ("1.2.3.4", "1.2.3"), "ipv6": ("::1", "1.2.3.4"),
            "uri": ("https://x.org/a", "not a uri")}


def rf(schema):
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


def accepts(engine, schema, document) -> bool:
    """Whether the constraint lets the tokens of ``document`` through and can close there."""
    constraint = check_response_format(rf(schema))
    matcher = engine.constraints.matcher(constraint)
    for token in engine.tokenizer(json.dumps(document), add_special_tokens=False)["input_ids"]:
        if not matcher.consume_token(token):
            return False
    return bool(matcher.is_accepting())


def test_every_accepted_format_is_enforced(engine):
    assert set(GOOD_BAD) == FORMATS
    for name, (good, bad) in GOOD_BAD.items():
        schema = {"type": "object", "properties": {"v": {"type": "string", "format": name}}, "required": ["v"]}
        assert accepts(engine, schema, {"v": good}), name
        assert not accepts(engine, schema, {"v": bad}), name


def test_one_of_with_a_discriminator_is_enforced_and_pydantic_s_union_compiles(engine):
    cat = {"type": "object", "properties": {"pet_type": {"const": "cat"}, "meows": {"type": "integer"}},
           "required": ["pet_type", "meows"]}
    dog = {"type": "object", "properties": {"pet_type": {"const": "dog"}, "barks": {"type": "number"}},
           "required": ["pet_type", "barks"]}
    schema = {"$defs": {"Cat": cat, "Dog": dog}, "type": "object", "required": ["pet"], "properties": {"pet": {
        "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
        "discriminator": {"propertyName": "pet_type", "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}}}}}
    assert accepts(engine, schema, {"pet": {"pet_type": "cat", "meows": 2}})
    assert not accepts(engine, schema, {"pet": {"pet_type": "cat", "barks": 2}})
    with pytest.raises(ResponseFormatUnsupported, match="'oneOf' is enforced only where"):
        check_response_format(rf({"oneOf": [{"type": "integer"}, {"type": "number"}]}))


def test_unique_items_stays_refused_by_name():
    with pytest.raises(ResponseFormatUnsupported, match="'uniqueItems' at '/uniqueItems'"):
        check_response_format(rf({"type": "array", "uniqueItems": True}))
