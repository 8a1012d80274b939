"""Checking response_format before anything loads: miLLM's own JSON Schema subset and its limits.

The subset is miLLM's list, not the constraint library's: some keywords compile there without being
enforced, and a keyword that is only checked afterwards is not a constraint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from millm.errors import MillmError, ResponseFormatUnsupported
from millm.sfv import sf_string
from millm.structured.bounded import bounded

# exclusiveMinimum / exclusiveMaximum (Pydantic's gt / lt) and prefixItems (tuples): measured enforced by
# llguidance token by token; so are the string formats in FORMATS and oneOf where llguidance proves its branches
# disjoint (a discriminator: it then compiles it as anyOf, and refuses any other) (tests/structured/test_formats.py)
ENFORCED = {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum",
            "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
            "pattern", "anyOf", "oneOf", "prefixItems", "format", "$ref", "$defs", "$schema"}
# every format llguidance 1.9 implements; the closed document is checked again with jsonschema's format checker
# (which is stricter on calendar dates: the grammar lets 2023-02-29 through, validation then refuses it)
FORMATS = {"date", "date-time", "time", "duration", "uuid", "email", "hostname", "ipv4", "ipv6", "uri"}
# "discriminator" (OpenAPI's, written by Pydantic beside oneOf) only names the property whose const already
# tells the branches apart; the oneOf itself is what is enforced
ANNOTATIONS = {"title", "description", "default", "examples", "discriminator", "$id", "$comment", "readOnly",
               "writeOnly", "deprecated"}
# "$schema" names the dialect: those in which every enforced keyword means what it means in 2020-12 (zod 4 writes
# draft-07's, Pydantic none); another (draft-04's boolean exclusiveMinimum, say) is refused
DIALECTS = {f"{scheme}://json-schema.org/{draft}/schema{end}" for scheme in ("http", "https")
            for draft in ("draft/2020-12", "draft/2019-09", "draft-07") for end in ("", "#")}
TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
MAX_SCHEMA_BYTES = 64 * 1024
MAX_DEPTH = 32
MAX_PROPERTIES = 256
MAX_DEFS = 256  # definitions in $defs
MAX_REF_CHAIN = MAX_DEPTH  # $refs followed one after another, each into another definition: nesting in disguise
DEFS_REF = "#/$defs/"
PARAM = "response_format"
SCHEMA_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
WHITESPACE = "[ ]?"


# objects nested in a schema: the keywords whose value is one schema, a list of them, or named ones
ONE_SCHEMA, SCHEMA_LIST, NAMED_SCHEMAS = ("items", "additionalProperties"), \
    ("anyOf", "oneOf", "allOf", "prefixItems"), ("properties", "$defs")
OMITTED = ";undeclared=omitted"  # X-miLLM-Constrained's parameter when ``closed`` changed what is generated


def _closed_subschemas(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` whose nested schemas (``ONE_SCHEMA``, ``SCHEMA_LIST``, ``NAMED_SCHEMAS``) are
    ``closed``; the object itself is left as it is."""
    out = dict(schema)
    for key in ONE_SCHEMA:
        if key in out:
            out[key] = closed(out[key])
    for key in SCHEMA_LIST:
        if isinstance(out.get(key), list):
            out[key] = [closed(sub) for sub in out[key]]
    for key in NAMED_SCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(sub) for name, sub in out[key].items()}
    return out


def closed(schema: Any) -> Any:
    """The schema as generated: every object that declares ``properties`` and leaves ``additionalProperties``
    unset gets ``additionalProperties: false``, as xgrammar's strict mode and OpenAI's structured outputs
    read it (Pydantic and most hand-written schemas leave it unset, and a small model then adds keys the
    schema never named and runs to max_tokens). What is generated stays valid under the original schema,
    which is what the document is validated against; an object without ``properties`` (a free-form map)
    stays open. (The management API's bodies are closed by the same rule: ``millm.server.api_bodies``.)"""
    if not isinstance(schema, dict):
        return schema
    out = _closed_subschemas(schema)
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


@dataclass(frozen=True)
class JsonConstraint:
    """What to enforce: ``kind`` json_object or json_schema, the schema, and the name for the header;
    ``undeclared`` "omit" generates the schema ``closed`` (the default), "allow" as written (the literal
    reading: MILLM_UNDECLARED_PROPERTIES=allow)."""

    kind: str
    schema: dict[str, Any]
    name: str | None = None
    undeclared: str = "omit"
    param = PARAM  # the request field that asked for it (what refusals and errors name)

    @property
    def generated(self) -> dict[str, Any]:
        """The schema the grammar is made of (validation reads ``schema``)."""
        return closed(self.schema) if self.undeclared == "omit" else self.schema

    @property
    def key(self) -> str:
        """Canonical text of the generated schema: the cache key for its compiled constraint."""
        return canonical(self.generated)

    def header(self) -> str:
        """X-miLLM-Constrained, with ``;undeclared=omitted`` when objects the schema left open are generated
        closed."""
        omitted = OMITTED if self.generated != self.schema else ""
        if self.kind == "json_object":  # with a schema of the client's own (llama.cpp server's shape): say so
            return ("json_object" if self.schema == {"type": "object"} else "json_object;schema") + omitted
        return f"json_schema;name={sf_string(self.name or '')}{omitted}"

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
    """Collect in ``w`` every problem of ``node`` (at ``path``) and of the schemas inside it."""
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
        elif (check := KEYWORDS.get(key)) is not None:
            check(value, here, w, depth)


def _type(value: Any, here: list[str], w: _Walk, depth: int) -> None:
    kinds = value if isinstance(value, list) else [value]
    if not kinds or any(not isinstance(k, str) or k not in TYPES for k in kinds):
        w.problems.append(f"'type' {_shown(value)} at '{_pointer(here)}' (a type name or a list of them: "
                          f"{', '.join(sorted(TYPES))})")


def _dialect(value: Any, here: list[str], w: _Walk, depth: int) -> None:
    if value not in DIALECTS:
        w.problems.append(f"'$schema' {_shown(value)} at '{_pointer(here)}' (the dialects taken: JSON Schema "
                          "2020-12, 2019-09 and draft-07)")


def _format(value: Any, here: list[str], w: _Walk, depth: int) -> None:
    if not isinstance(value, str) or value not in FORMATS:
        w.problems.append(f"'format' {value!r} at '{_pointer(here)}' (enforced: {', '.join(sorted(FORMATS))})")


def _pattern(value: Any, here: list[str], w: _Walk, depth: int) -> None:
    if problem := _pattern_problem(value):
        w.problems.append(f"'pattern' at '{_pointer(here)}' {problem}")


def _ref(value: Any, here: list[str], w: _Walk, depth: int) -> None:
    if _ref_target(value) not in w.defs:
        w.problems.append(f"'$ref' {_shown(value)} at '{_pointer(here)}' (only local refs into $defs, "
                          f"'{DEFS_REF}<name>', with a name that needs no escaping: no '/', '~' or '%')")


def _schema(value: Any, here: list[str], w: _Walk, depth: int) -> None:
    _walk(value, here, w, depth + 1)


def _named_schemas(limit: int, what: str, per: str = "") -> Callable[[Any, list[str], _Walk, int], None]:
    """The check of an object of named schemas (``properties``, ``$defs``), at most ``limit`` of them."""
    def check(value: Any, here: list[str], w: _Walk, depth: int) -> None:
        if not isinstance(value, dict):
            w.problems.append(f"'{here[-1]}' at '{_pointer(here)}' is not an object")
            return
        if len(value) > limit:
            raise w.error(f"'{_pointer(here)}' has {len(value)} {what}; at most {limit}{per}.", param=w.param)
        for name, sub in value.items():
            _walk(sub, [*here, name], w, depth + 1)
    return check


def _schema_list(value: Any, here: list[str], w: _Walk, depth: int) -> None:
    if not isinstance(value, list) or not value:
        w.problems.append(f"'{here[-1]}' at '{_pointer(here)}' is not a non-empty list")
        return
    for i, sub in enumerate(value):
        _walk(sub, [*here, str(i)], w, depth + 1)


# the keywords whose values _walk checks itself (the others' shapes are jsonschema's check)
KEYWORDS: dict[str, Callable[[Any, list[str], _Walk, int], None]] = {
    "type": _type, "format": _format, "pattern": _pattern, "$ref": _ref, "$schema": _dialect,
    "items": _schema, "additionalProperties": _schema,
    "anyOf": _schema_list, "oneOf": _schema_list, "prefixItems": _schema_list,
    "properties": _named_schemas(MAX_PROPERTIES, "properties", " per object"),
    "$defs": _named_schemas(MAX_DEFS, "definitions"),
}


@bounded(max_entries=256, max_bytes=4 * 2**20)
def linear_regex(pattern: str) -> Any:
    """``pattern`` compiled by RE2, which matches in time linear in the text (never backtracking) within a
    bounded memory (RE2's ``max_mem``); raises ``re2.error`` for a pattern it does not take."""
    import re2

    options = re2.Options()
    options.log_errors = False
    return re2.compile(pattern, options)


def _pattern_problem(pattern: Any) -> str | None:
    """Why a ``pattern`` cannot be checked after generating (None when it can): the closed document is matched
    by RE2, in linear time, so a pattern RE2 does not take is refused before anything generates."""
    import re2

    if not isinstance(pattern, str):
        return "is not a string"
    try:
        linear_regex(pattern)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        return f"is not a regular expression miLLM can check in linear time (RE2: {reason})"
    return None


def _shown(value: Any, limit: int = 80) -> str:
    """A schema value in a message: its JSON, cut at ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "…"


def _ref_target(ref: Any) -> str | None:
    """The definition a ``$ref`` names: ``#/$defs/<name>`` with a name JSON Pointer and URI escaping leave as it
    is. A name spelled with escapes (``~1``, ``%25``) would be resolved one way here and another by the
    validator, so such refs are refused rather than guessed at."""
    if not isinstance(ref, str) or not ref.startswith(DEFS_REF):
        return None
    name = ref[len(DEFS_REF):]
    return name if name and not any(c in name for c in "/~%") else None


def _direct_refs(node: Any) -> list[str]:
    """The $defs a schema stands for without matching any value itself: its own $ref and those of its
    anyOf / oneOf branches (a ref inside properties or items is reached only through a value)."""
    if not isinstance(node, dict):
        return []
    target = _ref_target(node.get("$ref"))
    found = [target] if target is not None else []
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            for branch in node[key]:
                found += _direct_refs(branch)
    return found


def _walk_refs(root: str, edges: dict[str, list[str]], chain: dict[str, int], problems: list[str]) -> None:
    """Walk the direct refs from ``root`` depth first, without recursing: each definition finished gets its longest
    run of direct refs in ``chain``, and each cycle met is said in ``problems``. Definitions already in ``chain``
    are not walked again."""
    trail, on_trail = [root], {root}
    pending = [iter(edges[root])]
    while pending:
        target = next(pending[-1], None)
        if target is None:
            done = trail.pop()
            on_trail.discard(done)
            pending.pop()
            chain[done] = 1 + max((chain.get(t, 0) for t in edges[done]), default=0)
        elif target in on_trail:
            cycle = trail[trail.index(target):] + [target]
            problems.append(f"'$ref' cycle {' -> '.join(cycle)} at '{_pointer(['$defs', cycle[0]])}' (a "
                            "definition that refers to itself without a value between)")
        elif target not in chain:
            trail.append(target)
            on_trail.add(target)
            pending.append(iter(edges[target]))


def _ref_cycles(defs: dict[str, Any]) -> list[str]:
    """$defs that stand for themselves through $ref and anyOf / oneOf alone (``a`` -> ``b`` -> ``a``): no
    value ever decides them, and validating the closed document against them recurses without end (a
    500 after generating); and chains of such refs longer than MAX_REF_CHAIN. Recursion through properties
    or items (a tree, a linked list) is fine. Iterative: a chain of any length is walked without recursing."""
    edges = {name: [t for t in _direct_refs(node) if t in defs] for name, node in defs.items()}
    problems: list[str] = []
    chain: dict[str, int] = {}  # definition -> the longest run of direct refs from it (once finished)
    for root in edges:
        if root not in chain:
            _walk_refs(root, edges, chain, problems)
    if not problems and (longest := max(chain.values(), default=0)) > MAX_REF_CHAIN:
        start = max(chain, key=lambda name: chain[name])
        problems.append(f"a chain of {longest} '$ref's from '{_pointer(['$defs', start])}' (at most {MAX_REF_CHAIN} "
                        "in a row; a chain of refs nests like a schema does)")
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


def check_response_format(value: Any, undeclared: str = "omit") -> JsonConstraint | None:
    """The constraint a response_format asks for (None for text), or a 400 naming every problem; ``undeclared``
    is MILLM_UNDECLARED_PROPERTIES (``JsonConstraint``)."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise ResponseFormatUnsupported("'response_format.type' must be text, json_object or json_schema.", param=PARAM)
    if value["type"] == "text":
        return None
    if value["type"] == "json_object":
        return JsonConstraint("json_object", {"type": "object"}, undeclared=undeclared)
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not isinstance(spec.get("schema"), dict):
        raise ResponseFormatUnsupported("'response_format.json_schema' needs a 'name' and a 'schema' object.",
                                        param=PARAM)
    if not SCHEMA_NAME.fullmatch(spec["name"]):
        raise ResponseFormatUnsupported("'response_format.json_schema.name' must be 1-64 letters, digits, '_' or "
                                        "'-' (as OpenAI's API requires).", param=PARAM)
    check_schema(spec["schema"])
    return JsonConstraint("json_schema", spec["schema"], spec["name"], undeclared)


def check_compiles(constraint: JsonConstraint) -> None:
    """The whole schema checked before anything generates: valid JSON Schema whose every ``pattern`` Python's
    ``re`` compiles (the closed document is validated with it), and a grammar the constraint library builds
    (its regex dialect differs: look-around, for one, is refused). Otherwise either would fail after
    generating, as a 500."""
    if problem := _compile_problem(constraint.key):
        raise ResponseFormatUnsupported(problem, param=PARAM)


@bounded(max_entries=256, max_bytes=16 * 2**20)
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
