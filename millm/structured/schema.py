"""Checking response_format before anything loads: miLLM's own JSON Schema subset and its limits.

The subset is miLLM's list, not the constraint library's: some keywords compile there without being
enforced, and a keyword that is only checked afterwards is not a constraint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from millm.errors import MillmError, ResponseFormatUnsupported
from millm.sfv import sf_string

# exclusiveMinimum / exclusiveMaximum (Pydantic's gt / lt) and prefixItems (tuples): measured enforced by
# llguidance token by token; so are the string formats in FORMATS and oneOf where llguidance proves its branches
# disjoint (a discriminator: it then compiles it as anyOf, and refuses any other) (tests/structured/test_formats.py)
ENFORCED = {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum",
            "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
            "pattern", "anyOf", "oneOf", "prefixItems", "format", "$ref", "$defs"}
# every format llguidance 1.9 implements; the closed document is checked again with jsonschema's format checker
# (which is stricter on calendar dates: the grammar lets 2023-02-29 through, validation then refuses it)
FORMATS = {"date", "date-time", "time", "duration", "uuid", "email", "hostname", "ipv4", "ipv6", "uri"}
# "discriminator" (OpenAPI's, written by Pydantic beside oneOf) only names the property whose const already
# tells the branches apart; the oneOf itself is what is enforced
ANNOTATIONS = {"title", "description", "default", "examples", "discriminator"}
TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
MAX_SCHEMA_BYTES = 64 * 1024
MAX_DEPTH = 32
MAX_PROPERTIES = 256
PARAM = "response_format"
SCHEMA_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
WHITESPACE = "[ ]?"


@dataclass(frozen=True)
class JsonConstraint:
    """What to enforce: ``kind`` json_object or json_schema, the schema, and the name for the header."""

    kind: str
    schema: dict[str, Any]
    name: str | None = None
    param = PARAM  # the request field that asked for it (what refusals and errors name)

    @property
    def key(self) -> str:
        """Canonical text of the schema: the cache key for its compiled constraint."""
        return canonical(self.schema)

    def header(self) -> str:
        """X-miLLM-Constrained."""
        if self.kind == "json_object":  # with a schema of the client's own (llama.cpp server's shape): say so
            return "json_object" if self.schema == {"type": "object"} else "json_object;schema"
        return f"json_schema;name={sf_string(self.name or '')}"

    def grammar(self) -> str:
        """The constraint library's grammar for it."""
        return grammar_of(self.key)


Error = Callable[..., MillmError]  # an error class taking (message, param=...)


def _pointer(path: list[str]) -> str:
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in path) if path else ""


@dataclass
class _Walk:
    defs: dict[str, Any]
    param: str
    error: Error
    problems: list[str] = field(default_factory=list)


def _walk(node: Any, path: list[str], w: _Walk, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise w.error(f"The schema nests deeper than {MAX_DEPTH} levels at '{_pointer(path)}'.", param=w.param)
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        w.problems.append(f"'{_pointer(path)}' is not a schema object")
        return
    for key, value in node.items():
        here = [*path, key]
        if key in ANNOTATIONS:
            continue
        if key not in ENFORCED:
            w.problems.append(f"'{key}' at '{_pointer(here)}'")
        elif key == "type":
            kinds = value if isinstance(value, list) else [value]
            if not kinds or any(k not in TYPES for k in kinds):
                w.problems.append(f"'type' {value!r} at '{_pointer(here)}'")
        elif key == "format":
            if value not in FORMATS:
                w.problems.append(f"'format' {value!r} at '{_pointer(here)}' (enforced: "
                                  f"{', '.join(sorted(FORMATS))})")
        elif key == "properties":
            if not isinstance(value, dict):
                w.problems.append(f"'properties' at '{_pointer(here)}' is not an object")
                continue
            if len(value) > MAX_PROPERTIES:
                raise w.error(f"'{_pointer(here)}' has {len(value)} properties; at most {MAX_PROPERTIES} per object.",
                              param=w.param)
            for name, sub in value.items():
                _walk(sub, [*here, name], w, depth + 1)
        elif key in ("items", "additionalProperties"):
            _walk(value, here, w, depth + 1)
        elif key in ("anyOf", "oneOf", "prefixItems"):
            if not isinstance(value, list) or not value:
                w.problems.append(f"'{key}' at '{_pointer(here)}' is not a non-empty list")
                continue
            for i, sub in enumerate(value):
                _walk(sub, [*here, str(i)], w, depth + 1)
        elif key == "$defs":
            if not isinstance(value, dict):
                w.problems.append(f"'$defs' at '{_pointer(here)}' is not an object")
                continue
            for name, sub in value.items():
                _walk(sub, [*here, name], w, depth + 1)
        elif key == "$ref":
            target = value[len("#/$defs/"):] if isinstance(value, str) and value.startswith("#/$defs/") else None
            if target is None or target not in w.defs:
                w.problems.append(f"'$ref' {value!r} at '{_pointer(here)}' (only local refs into $defs)")


def _direct_refs(node: Any) -> list[str]:
    """The $defs a schema stands for without matching any value itself: its own $ref and those of its
    anyOf / oneOf branches (a ref inside properties or items is reached only through a value)."""
    if not isinstance(node, dict):
        return []
    ref = node.get("$ref")
    found = [ref[len("#/$defs/"):]] if isinstance(ref, str) and ref.startswith("#/$defs/") else []
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            for branch in node[key]:
                found += _direct_refs(branch)
    return found


def _ref_cycles(defs: dict[str, Any]) -> list[str]:
    """$defs that stand for themselves through $ref and anyOf / oneOf alone (``a`` -> ``b`` -> ``a``): no
    value ever decides them, and validating the closed document against them recurses without end (a
    500 after generating). Recursion through properties or items (a tree, a linked list) is fine."""
    edges = {name: [t for t in _direct_refs(node) if t in defs] for name, node in defs.items()}
    problems: list[str] = []
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            cycle = trail[trail.index(name):] + [name]
            problems.append(f"'$ref' cycle {' -> '.join(cycle)} at '{_pointer(['$defs', cycle[0]])}' (a definition "
                            "that refers to itself without a value between)")
            return
        if name in done:
            return
        for target in edges[name]:
            visit(target, [*trail, name])
        done.add(name)

    for name in edges:
        visit(name, [])
    return problems


def check_schema(schema: dict[str, Any], param: str = PARAM, error: Error = ResponseFormatUnsupported) -> None:
    """A schema miLLM enforces while generating: JSON without NaN, within the size limits, every keyword in
    miLLM's subset, and compiled by the constraint library; otherwise ``error`` naming ``param`` and every
    problem. Shared by response_format and each tool's parameters."""
    try:
        text = json.dumps(schema, allow_nan=False)
    except ValueError:
        raise error("The schema holds NaN or Infinity, which JSON does not allow.", param=param) from None
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise error(f"The schema is over {MAX_SCHEMA_BYTES // 1024} KB.", param=param)
    defs = schema.get("$defs")
    walk = _Walk(defs if isinstance(defs, dict) else {}, param, error)
    _walk(schema, [], walk, 0)
    walk.problems += _ref_cycles(walk.defs)
    if walk.problems:
        raise error("The schema uses what miLLM cannot enforce while generating: " + "; ".join(walk.problems) + ".",
                    param=param)
    if problem := _compile_problem(canonical(schema)):
        raise error(problem, param=param)


def canonical(schema: dict[str, Any]) -> str:
    """A schema's canonical text (no spaces): cache keys and grammars are made of it. Keys keep their order:
    the grammar writes properties in the order the schema lists them (as OpenAI does), so sorting them would
    change what the model is made to write first."""
    return json.dumps(schema, separators=(",", ":"))


def check_response_format(value: Any) -> JsonConstraint | None:
    """The constraint a response_format asks for (None for text), or a 400 naming every problem."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise ResponseFormatUnsupported("'response_format.type' must be text, json_object or json_schema.", param=PARAM)
    if value["type"] == "text":
        return None
    if value["type"] == "json_object":
        return JsonConstraint("json_object", {"type": "object"})
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not isinstance(spec.get("schema"), dict):
        raise ResponseFormatUnsupported("'response_format.json_schema' needs a 'name' and a 'schema' object.",
                                        param=PARAM)
    if not SCHEMA_NAME.fullmatch(spec["name"]):
        raise ResponseFormatUnsupported("'response_format.json_schema.name' must be 1-64 letters, digits, '_' or "
                                        "'-' (as OpenAI's API requires).", param=PARAM)
    check_schema(spec["schema"])
    return JsonConstraint("json_schema", spec["schema"], spec["name"])


def check_compiles(constraint: JsonConstraint) -> None:
    """The whole schema checked before anything generates: valid JSON Schema whose every ``pattern`` Python's
    ``re`` compiles (the closed document is validated with it), and a grammar the constraint library builds
    (its regex dialect differs: look-around, for one, is refused). Otherwise either would fail after
    generating, as a 500."""
    if problem := _compile_problem(constraint.key):
        raise ResponseFormatUnsupported(problem, param=PARAM)


@lru_cache(maxsize=256)
def _compile_problem(key: str) -> str | None:
    """Why the schema of canonical text ``key`` cannot be enforced, or None (cached: a judge repeats its schema)."""
    import jsonschema
    import llguidance

    try:
        jsonschema.Draft202012Validator.check_schema(json.loads(key))
    except jsonschema.SchemaError as exc:
        where = _pointer([str(p) for p in exc.absolute_path])
        return f"The schema is not valid JSON Schema at '{where}': {exc.message}."
    try:
        error = llguidance.LLMatcher.validate_grammar(grammar_of(key))
    except ValueError as exc:
        error = str(exc)
    if error and "oneOf" in key:
        return ("The schema cannot be compiled: " + error + " ('oneOf' is enforced only where its branches cannot "
                "overlap, as with a discriminator: a property each branch gives its own 'const' or 'enum'.)")
    return f"The schema cannot be compiled: {error}" if error else None


def grammar_of(key: str) -> str:
    """The constraint library's grammar for a schema's canonical text (at most one space between JSON tokens,
    so a model cannot run on emitting blanks)."""
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(key, overrides={"whitespace_pattern": WHITESPACE})
