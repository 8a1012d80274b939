"""The request bodies of the management API (/api): JSON Schema published in /openapi.json and enforced.

Steering documents come from their own pydantic models (the ones import checks them with); the small
bodies are written here, by endpoint, and ``check`` holds every body to its schema before the route reads
it, so a wrong type is a 400 naming the field rather than reaching SQLite or a path (a list as ``sae``
answered 500). They hold types only: ranges are the routes' own (written once, where they are checked
against the loaded model and the store).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from millm.errors import InvalidParameter
from millm.steering.documents import CircuitDoc, ClusterDoc
from millm.steering.profiles import ProfileDoc

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
        "features": {"type": "array", "items": {"type": "integer"}},
        "history": {"type": "integer"}}},
    "models_api.add_model": {"type": "object", "required": ["path"], "properties": {
        "path": {"type": "string", "description": "A checkpoint directory or <repo>.<QUANT>.gguf file"},
        "id": OPTIONAL_STRING}},
    "steering_docs.import_cluster": ClusterDoc,
    "steering_docs.import_circuit": CircuitDoc,
    "steering_docs.set_cluster_intensity": {"type": "object", "required": ["lambda"], "properties": {
        "lambda": {"type": "number"}}},
}


def check(endpoint: str | None, body: Any) -> None:
    """Hold ``body`` to the schema written here for ``endpoint`` (a 400 naming the field); bodies with a model
    of their own are checked by the route with it."""
    schema = BODIES.get(endpoint or "")
    if not isinstance(schema, dict):
        return
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(body))
    if error is None:
        return
    path = [str(p) for p in error.absolute_path]
    if error.validator == "required" and isinstance(error.instance, dict):
        path.append(next(str(k) for k in error.validator_value if k not in error.instance))
        raise InvalidParameter(f"'{'.'.join(path)}' is required.", param=".".join(path))
    where = ".".join(path)
    raise InvalidParameter(f"'{where or 'body'}': {error.message}.", param=where or None)
