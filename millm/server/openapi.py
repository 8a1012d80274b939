"""The OpenAPI document, built from the app's own routes so it cannot drift from them."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel
from quart import Quart

from millm import __version__
from millm.requests.wire import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from millm.server.api_bodies import BODIES
from millm.structured.schema import closed

REQUEST_BODIES: dict[str, dict[str, Any] | type[BaseModel]] = {
    "v1.chat_completions": ChatCompletionRequest,
    "v1.completions": CompletionRequest,
    "v1.embeddings": EmbeddingRequest,
    **BODIES,
}
ERROR = {"type": "object", "properties": {"error": {"type": "object", "properties": {
    "message": {"type": "string"}, "type": {"type": "string"},
    "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}


def _operation(endpoint: str, doc: str | None, method: str, params: list[dict[str, Any]],
               schemas: dict[str, Any]) -> dict[str, Any]:
    """One route's operation for ``method``: its summary (the view's docstring ``doc``), id, responses, path
    parameters and, for a method that sends one, its request body (its schema added to ``schemas``)."""
    op: dict[str, Any] = {
        "summary": summary(doc) or endpoint,
        "operationId": f"{endpoint}_{method.lower()}",
        "responses": {"200": {"description": "OK"}, "default": {"description": "Error", "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}},
    }
    if params:
        op["parameters"] = params
    body = REQUEST_BODIES.get(endpoint)
    if body is not None and method in ("POST", "PUT", "PATCH"):
        op["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{_component(body, endpoint, schemas)}"}}}}
    return op


def build(app: Quart) -> dict[str, Any]:
    """An OpenAPI 3.1 document for every route the app serves."""
    paths: dict[str, dict[str, Any]] = {}
    schemas: dict[str, Any] = {"Error": ERROR}
    for rule in app.url_map.iter_rules():
        if rule.endpoint in ("static", "openapi") or rule.endpoint.startswith("console."):  # files, not API
            continue
        view = app.view_functions[rule.endpoint]
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in re.findall(r"{([^}]+)}", path)]
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            paths.setdefault(path, {})[method.lower()] = _operation(rule.endpoint, view.__doc__, method, params,
                                                                    schemas)
    return {"openapi": "3.1.0", "info": {"title": "miLLM", "version": __version__},
            "paths": paths, "components": {"schemas": schemas}}


def summary(doc: str | None) -> str:
    """A view's docstring's first paragraph on one line (its first line alone stops mid-sentence)."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def _component(body: dict[str, Any] | type[BaseModel], endpoint: str, schemas: dict[str, Any]) -> str:
    """Add a request body's schema (and a model's nested ones) to ``schemas``; its component name."""
    if isinstance(body, dict):
        name = "".join(part.title() for part in re.split(r"[._]", endpoint)) + "Body"
        schemas[name] = body
        return name
    schema = body.model_json_schema(ref_template="#/components/schemas/{model}")
    if endpoint in BODIES:  # a management body refuses the fields it does not name (api_bodies.unknown_fields)
        schema = closed(schema)
    schemas.update(schema.pop("$defs", {}))
    schemas[body.__name__] = schema
    return body.__name__
