"""The request bodies of the management API (/api): JSON Schema published in /openapi.json and enforced.

Steering documents come from their own pydantic models (the ones import checks them with); the small
bodies are written here, by endpoint, and ``check`` holds every body to its schema before the route reads
it, so a wrong type is a 400 naming the field rather than reaching SQLite or a path (a list as ``sae``
answered 500). They hold types only: ranges are the routes' own (written once, where they are checked
against the loaded model and the store).

Every body is closed: a field its schema does not name, at any depth, is refused with 400
``unused_fields_refused`` naming each one (the code /v1 gives a field it does not use), never ignored, so
``{"path", "name"}`` to POST /api/models says ``name`` is not a field rather than registering the model
under another id than the client meant. An object schema is open only where it says so
(``additionalProperties``: a circuit's ``evidence``, a steering ``values`` map).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from millm.errors import InvalidParameter, UnusedFieldsRefused
from millm.steering.documents import CircuitDoc, ClusterDoc
from millm.steering.profiles import ProfileDoc
from millm.structured.schema import closed

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

STRING = {"type": "string"}
OPTIONAL_STRING = {"type": ["string", "null"]}
NAME = {"type": "string", "description": "A profile, cluster or circuit name"}
VALUES = {"type": "object", "description": 'Feature index -> strength, e.g. {"123": 40.0}',
          "additionalProperties": {"type": "number"}}
STEERING = {"type": "object", "required": ["values"], "properties": {
    "sae": {"type": ["string", "null"], "description": "An attached SAE id (optional while one is attached)"},
    "values": VALUES}}

# endpoint -> a JSON Schema, or a pydantic model whose schema is published
BODIES: dict[str, dict[str, Any] | type[BaseModel]] = {
    "api.add_sae": {"type": "object", "required": ["path"], "properties": {
        "path": {"type": "string", "description": "An SAE folder or file on the server"},
        "name": OPTIONAL_STRING,
        "labels": {"type": ["string", "null"], "description": "A labels file inside the SAE's folder"}}},
    "api.attach_sae": {"type": "object", "properties": {
        "layer": {"type": ["integer", "null"], "description": "Default: the SAE's layer hint"}}},
    "api.put_steering": STEERING,
    "api.patch_steering": STEERING,
    "api.create_profile": {"type": "object", "required": ["name"], "properties": {
        "name": NAME, "description": STRING, "model": {"type": ["string", "null"]},
        "entries": {"type": "array", "items": {"type": "object", "required": ["sae", "feature", "strength"],
                                               "properties": {"sae": {"type": ["string", "integer"]},
                                                              "feature": {"type": "integer"},
                                                              "strength": {"type": "number"}}}},
        "from_current": {"type": "boolean", "description": "Save the live values under this name"}}},
    "api.update_profile": ProfileDoc,
    "api.import_profile": ProfileDoc,
    "api.put_monitoring": {"type": "object", "properties": {
        "enabled": {"type": "boolean"},
        "sae": {"type": ["string", "integer", "null"], "description": "An attached SAE id, or its layer"},
        "features": {"type": "array", "items": {"type": "integer"},
                     "description": "The features to monitor (or give top_k)"},
        "top_k": {"type": ["integer", "null"],
                  "description": "Monitor every feature and report the K with the highest mean"},
        "history": {"type": "integer"}}},
    "pulls.start_pull": {"type": "object", "required": ["model"], "properties": {
        "model": {"type": "string", "description": "owner/name (a checkpoint) or owner/name:QUANT (one GGUF file)"},
        "id": {**OPTIONAL_STRING, "description": "The id to pull it under"},
        "revision": {**OPTIONAL_STRING, "description": "A branch, tag or commit (default: main)"}}},
    "models_api.add_model": {"type": "object", "required": ["path"], "properties": {
        "path": {"type": "string", "description": "A checkpoint directory or <repo>.<QUANT>.gguf file"},
        "id": OPTIONAL_STRING}},
    "vectors_api.attach_vectors": {"type": "object", "properties": {
        "layer": {"type": ["integer", "null"], "description": "Default: the layer the set was learned at"}}},
    "vectors_api.import_vectors": {"type": "object", "required": ["path", "name"], "properties": {
        "path": {"type": "string", "description": "A vector-set folder or a llama.cpp control-vector GGUF"},
        "name": {"type": "string", "description": "The name the set is stored and steered under"},
        "layer": {"type": ["integer", "null"], "description": "Which layer of a GGUF control vector"}}},
    "vectors_api.learn_vectors": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "description": "The vector's name (what steering values and profiles use)"},
        "layer": {"type": ["integer", "string", "array"], "items": {"type": ["integer", "string"]},
                  "description": "A layer, a range \"8-12\" or a list: one set per layer, NAME-L{layer} when "
                                 "several. Default: 47% of the model's depth (14 of 30)"},
        "negatives": {"type": "string", "description": "topics (default) or neutral (concepts only)"},
        "method": {"type": "string", "description": "diffmean (default) or pca"},
        "position": {"type": "string", "description": "mean (over the answer's tokens, default) or last"},
        "concepts": {"type": "array", "items": STRING, "description": "Words the model writes examples about"},
        "positive": {"type": "array", "items": STRING, "description": "Texts that show the concept"},
        "negative": {"type": "array", "items": STRING, "description": "Texts that do not"},
        "positive_file": {"type": "object", "required": ["name", "text"], "description": "A file's positive "
                          "texts, read as `millm vectors learn --positive FILE` reads one (lines or JSONL chats)",
                          "properties": {"name": STRING, "text": STRING}},
        "negative_file": {"type": "object", "required": ["name", "text"], "description": "The same for the "
                          "negative texts", "properties": {"name": STRING, "text": STRING}},
        "examples": {"type": "integer", "description": "Generated examples of each side (concepts only)"},
        "tokens": {"type": "integer", "description": "Tokens per generated example (concepts only)"},
        "seed": {"type": "integer", "description": "Sampling seed of the generated examples (concepts only)"}}},
    "probes_api.learn_probe": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "description": "The probe's name"},
        "layer": {"type": ["integer", "string"], "description": "The layer whose output it reads. Default: 47% of "
                                                                "the model's depth (14 of 30)"},
        "method": {"type": "string", "description": "diffmean (default) or logreg"},
        "aggregation": {"type": "string", "description": "max (default), mean, last or rolling_mean over the "
                                                         "positions read"},
        "span": {"type": "string", "description": "response (default), prompt or both"},
        "window": {"type": "integer", "description": "A rolling_mean's window in response tokens (1-1024, default 8)"},
        "target_fpr": {"type": "number", "description": "The false-positive rate the threshold is cut at on the "
                                                        "held-out negatives, in (0, 1); default 0.01"},
        "negatives": {"type": "string", "description": "topics (default) or neutral (concepts only)"},
        "concepts": {"type": "array", "items": STRING, "description": "Words the model writes examples about"},
        "positive": {"type": "array", "items": STRING, "description": "Texts that show the concept"},
        "negative": {"type": "array", "items": STRING, "description": "Texts that do not"},
        "positive_file": {"type": "object", "required": ["name", "text"], "description": "A file's positive texts",
                          "properties": {"name": STRING, "text": STRING}},
        "negative_file": {"type": "object", "required": ["name", "text"], "description": "A file's negative texts",
                          "properties": {"name": STRING, "text": STRING}},
        "examples": {"type": "integer", "description": "Generated examples of each side (concepts only)"},
        "tokens": {"type": "integer", "description": "Tokens per generated example (concepts only)"},
        "seed": {"type": "integer", "description": "Sampling seed of the examples and of the held-out split"}}},
    "probes_api.attach_probe": {"type": "object", "properties": {
        "action": {"type": "string", "description": "flag (default), abort or steer (max or rolling_mean over the "
                                                    "response only)"},
        "profile": {"type": ["string", "null"], "description": "The profile a steer action applies"}}},
    "sweeps_api.start_sweep": {"type": "object", "required": ["sae", "feature"], "properties": {
        "sae": {"type": "string", "description": "An SAE or vector set attached to the loaded model"},
        "feature": {"type": "integer", "description": "The feature (or vector) index"},
        "strengths": {"type": "array", "items": {"type": "number"},
                      "description": "Default 0, 20, 40, 60, 80 (1 to 32 distinct, within -200..200)"},
        "prompts": {"type": "integer", "description": "Calibration prompts, one seeded answer each (1-20, default 16)"},
        "held_out": {"type": "integer", "description": "Held-out prompts the chosen strength is verified on (1-16, "
                                                       "default 16)"},
        "tokens": {"type": "integer", "description": "Tokens per answer (1-512, default 48)"},
        "seed": {"type": "integer", "description": "Prompt i is seeded seed + i (default 0)"},
        "concepts": {"type": "array", "items": STRING,
                     "description": "Words that count as mentioning the concept (default: the label's)"},
        "scope": {"type": ["string", "null"], "description": "Where steering applies: all, generated or prompt"}}},
    "features_api.resolve_names": {"type": "object", "properties": {
        "names": {"type": "array", "items": STRING, "description": "Features by index or label (1 to 256)"},
        "steer": {"type": "array", "items": STRING, "description": "FEATURE=STRENGTH or FEATURE alone (its "
                                                                  "recommended strength), as --steer takes them"}}},
    "measure_api.measure_answers": {"type": "object", "required": ["answers"], "properties": {
        "answers": {"type": "array", "items": STRING, "description": "Texts to measure (1 to 64)"}}},
    "steering_docs.import_cluster": ClusterDoc,
    "steering_docs.import_circuit": CircuitDoc,
    "steering_docs.set_cluster_intensity": {"type": "object", "required": ["lambda"], "properties": {
        "lambda": {"type": "number"}}},
    "steering_docs.sense_cluster": {"type": "object", "properties": {
        "min_members": {"type": "integer", "description": "How many members must exceed their thresholds at one "
                                                          "position (1 to the cluster's size; default 1)"}}},
}
BODIES = {endpoint: closed(body) if isinstance(body, dict) else body for endpoint, body in BODIES.items()}


@functools.cache
def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def unknown_fields(schema: dict[str, Any], value: Any, defs: dict[str, Any] | None = None,
                   path: tuple[str, ...] = ()) -> list[str]:
    """Where ``value`` holds a field ``schema`` does not name, in document order (``entries.0.weight``).

    An object schema that names its properties takes no others unless its ``additionalProperties`` says so
    (a schema there is applied to each other field). A value of another kind than the schema's (a list where
    an object belongs, a ``kind`` whose ``const`` differs) is the type check's to refuse, not this one's."""
    defs = schema.get("$defs", {}) if defs is None else defs
    schema = _branch(_resolved(schema, defs), value, defs)
    if isinstance(value, dict) and "properties" in schema:
        return _unknown_properties(schema, value, defs, path)
    each, children = _members(schema, value)
    return [f for key, child in children for f in unknown_fields(each, child, defs, (*path, key))]


def _members(schema: dict[str, Any], value: Any) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """The schema each member of ``value`` follows (an object's ``additionalProperties``, an array's ``items``)
    and the members, by key or index; none where the schema gives no such schema."""
    if isinstance(value, dict) and isinstance(each := schema.get("additionalProperties"), dict):
        return each, list(value.items())
    if isinstance(value, list) and isinstance(each := schema.get("items"), dict):
        return each, [(str(i), c) for i, c in enumerate(value)]
    return {}, []


def _resolved(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``schema``, or the definition its local ``$ref`` names."""
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return defs.get(ref.removeprefix("#/$defs/"), {})
    return schema


def _branch(schema: dict[str, Any], value: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """Of an ``anyOf``/``oneOf`` schema, the first branch of ``value``'s kind (object, array or other);
    ``schema`` itself when it has no branches or none fits."""
    for branch in schema.get("anyOf", schema.get("oneOf", ())):
        resolved = _resolved(branch, defs)
        if (resolved.get("type") == "object") == isinstance(value, dict) and \
                (resolved.get("type") == "array") == isinstance(value, list):
            return _branch(resolved, value, defs)
    return schema


def _unknown_properties(schema: dict[str, Any], value: dict[str, Any], defs: dict[str, Any],
                        path: tuple[str, ...]) -> list[str]:
    """The unknown fields of an object whose schema names its properties."""
    properties: dict[str, Any] = schema["properties"]
    if any("const" in properties[k] and properties[k]["const"] != v for k, v in value.items() if k in properties):
        return []  # a document of another kind: its kind is what is wrong
    others = schema.get("additionalProperties", False)
    found: list[str] = []
    for key, child in value.items():
        sub = properties.get(key, others)
        if sub is False:
            found.append(".".join((*path, key)))
        elif isinstance(sub, dict):
            found += unknown_fields(sub, child, defs, (*path, key))
    return found


def refuse_unknown(schema: dict[str, Any], body: Any) -> None:
    """A 400 ``unused_fields_refused`` naming every field of ``body`` that ``schema`` does not name."""
    unknown = unknown_fields(schema, body)
    if not unknown:
        return
    names = ", ".join(f"'{where}'" for where in unknown)
    top = sorted(schema.get("properties", {}))
    takes = f" This body's fields are: {', '.join(top)}." if top and all("." not in u for u in unknown) else ""
    plural = "s" if len(unknown) > 1 else ""
    raise UnusedFieldsRefused(f"Unknown field{plural} {names}: the management API refuses fields it does not "
                              f"use rather than ignoring them.{takes}", param=unknown[0])


def _type_refusal(error: ValidationError) -> InvalidParameter:
    """The 400 for the best schema error in a body: a missing field named as required, any other error naming
    the field (or the body) and saying what is wrong."""
    path = [str(p) for p in error.absolute_path]
    if error.validator == "required" and isinstance(error.instance, dict):
        path.append(next(str(k) for k in error.validator_value if k not in error.instance))
        return InvalidParameter(f"'{'.'.join(path)}' is required.", param=".".join(path))
    where = ".".join(path)
    return InvalidParameter(f"'{where or 'body'}': {error.message}.", param=where or None)


def check(endpoint: str | None, body: Any) -> None:
    """Hold ``body`` to the schema written here for ``endpoint``: a field it does not name is a 400 naming
    every such field, then a wrong type a 400 naming the field; a body with a model of its own has its types
    checked by the route with it."""
    schema = BODIES.get(endpoint or "")
    if schema is None:
        return
    refuse_unknown(schema if isinstance(schema, dict) else _model_schema(schema), body)
    if not isinstance(schema, dict):
        return
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(body))
    if error is not None:
        raise _type_refusal(error)
