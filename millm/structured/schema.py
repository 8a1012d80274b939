"""Checking response_format before anything loads: miLLM's own JSON Schema subset and its limits.

The subset is miLLM's list, not the constraint library's: some keywords compile there without being
enforced, and a keyword that is only checked afterwards is not a constraint.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from millm.errors import ResponseFormatUnsupported
from millm.sfv import sf_string

# exclusiveMinimum / exclusiveMaximum (Pydantic's gt / lt) and prefixItems (tuples): measured enforced by
# llguidance token by token (tests/structured/test_keywords.py)
ENFORCED = {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum",
            "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
            "pattern", "anyOf", "prefixItems", "$ref", "$defs"}
ANNOTATIONS = {"title", "description", "default", "examples"}
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

    @property
    def key(self) -> str:
        """Canonical text of the schema: the cache key for its compiled constraint."""
        return json.dumps(self.schema, sort_keys=True, separators=(",", ":"))

    def header(self) -> str:
        """X-miLLM-Constrained."""
        if self.kind == "json_object":  # with a schema of the client's own (llama.cpp server's shape): say so
            return "json_object" if self.schema == {"type": "object"} else "json_object;schema"
        return f"json_schema;name={sf_string(self.name or '')}"


def _pointer(path: list[str]) -> str:
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in path) if path else ""


def _walk(node: Any, path: list[str], defs: dict[str, Any], problems: list[str], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ResponseFormatUnsupported(f"The schema nests deeper than {MAX_DEPTH} levels at '{_pointer(path)}'.",
                                        param=PARAM)
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        problems.append(f"'{_pointer(path)}' is not a schema object")
        return
    for key, value in node.items():
        here = [*path, key]
        if key in ANNOTATIONS:
            continue
        if key not in ENFORCED:
            problems.append(f"'{key}' at '{_pointer(here)}'")
        elif key == "type":
            kinds = value if isinstance(value, list) else [value]
            if not kinds or any(k not in TYPES for k in kinds):
                problems.append(f"'type' {value!r} at '{_pointer(here)}'")
        elif key == "properties":
            if not isinstance(value, dict):
                problems.append(f"'properties' at '{_pointer(here)}' is not an object")
                continue
            if len(value) > MAX_PROPERTIES:
                raise ResponseFormatUnsupported(f"'{_pointer(here)}' has {len(value)} properties; at most "
                                                f"{MAX_PROPERTIES} per object.", param=PARAM)
            for name, sub in value.items():
                _walk(sub, [*here, name], defs, problems, depth + 1)
        elif key in ("items", "additionalProperties"):
            _walk(value, here, defs, problems, depth + 1)
        elif key in ("anyOf", "prefixItems"):
            if not isinstance(value, list) or not value:
                problems.append(f"'{key}' at '{_pointer(here)}' is not a non-empty list")
                continue
            for i, sub in enumerate(value):
                _walk(sub, [*here, str(i)], defs, problems, depth + 1)
        elif key == "$defs":
            if not isinstance(value, dict):
                problems.append(f"'$defs' at '{_pointer(here)}' is not an object")
                continue
            for name, sub in value.items():
                _walk(sub, [*here, name], defs, problems, depth + 1)
        elif key == "$ref":
            target = value[len("#/$defs/"):] if isinstance(value, str) and value.startswith("#/$defs/") else None
            if target is None or target not in defs:
                problems.append(f"'$ref' {value!r} at '{_pointer(here)}' (only local refs into $defs)")


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
    schema = spec["schema"]
    try:
        text = json.dumps(schema, allow_nan=False)
    except ValueError:
        raise ResponseFormatUnsupported("The schema holds NaN or Infinity, which JSON does not allow.",
                                        param=PARAM) from None
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise ResponseFormatUnsupported(f"The schema is over {MAX_SCHEMA_BYTES // 1024} KB.", param=PARAM)
    problems: list[str] = []
    defs = schema.get("$defs") if isinstance(schema.get("$defs"), dict) else {}
    _walk(schema, [], defs, problems, 0)
    problems += _ref_cycles(defs)
    if problems:
        raise ResponseFormatUnsupported("The schema uses what miLLM cannot enforce while generating: "
                                        + "; ".join(problems) + ".", param=PARAM)
    constraint = JsonConstraint("json_schema", schema, spec["name"])
    check_compiles(constraint)
    return constraint


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
    return f"The schema cannot be compiled: {error}" if error else None


def grammar_of(key: str) -> str:
    """The constraint library's grammar for a schema's canonical text (at most one space between JSON tokens,
    so a model cannot run on emitting blanks)."""
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(key, overrides={"whitespace_pattern": WHITESPACE})
