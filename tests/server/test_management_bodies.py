"""Management bodies are closed: a field an /api body does not name is a 400 naming it, never ignored, on
every endpoint that takes a JSON body, and nothing changes (issue 36). Fast tier: a scripted engine behind
Quart's test client."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from millm.config import Settings
from tests.support.fakes import FakeEngine
from tests.support.saes import random_sae, write_saelens

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, scenario: Callable[[Any], Awaitable[Any]]) -> Any:
    from millm.server.app import create_app

    app = create_app(Settings(home=tmp_path), FakeEngine())  # type: ignore[arg-type]

    async def main() -> Any:
        async with app.test_app():
            return await scenario(app.test_client())
    return asyncio.run(main())


async def answer(response: Any) -> tuple[int, Any]:
    return response.status_code, await response.get_json()


def refused_naming(result: tuple[int, Any], *fields: str) -> None:
    status, body = result
    assert status == 400, (status, body)
    error = body["error"]
    assert error["code"] == "unused_fields_refused" and error["type"] == "invalid_request_error", error
    assert error["param"] == fields[0], error
    for name in fields:
        assert f"'{name}'" in error["message"], error


def test_post_api_models_refuses_an_unknown_field_and_registers_nothing(tmp_path):
    checkpoint = tmp_path / "my-model"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")

    async def scenario(client):
        before = await (await client.get("/api/models")).get_json()
        refused = await answer(await client.post("/api/models", json={"path": str(checkpoint), "name": "mine"}))
        after = await (await client.get("/api/models")).get_json()
        return before, refused, after

    before, refused, after = run(tmp_path, scenario)
    refused_naming(refused, "name")
    assert "id" in refused[1]["error"]["message"]  # the fields it does take are named
    assert after == before and all(m["id"] not in ("my-model", "mine") for m in after["data"])


def test_post_api_saes_refuses_an_unknown_field_and_registers_no_sae(tmp_path):
    folder = write_saelens(tmp_path / "sae", random_sae(8, 16, seed=3), layer=0)

    async def scenario(client):
        before = await (await client.get("/api/saes")).get_json()
        refused = await answer(await client.post("/api/saes", json={"path": str(folder), "layer": 0}))
        return before, refused, await (await client.get("/api/saes")).get_json()

    before, refused, after = run(tmp_path, scenario)
    refused_naming(refused, "layer")
    assert after == before and all(s["path"] != str(folder) for s in after["data"])


def test_post_api_profiles_refuses_unknown_fields_at_any_depth_and_writes_no_profile(tmp_path):
    entry = {"sae": "sae_x", "feature": 1, "strength": 2.0}

    async def scenario(client):
        top = await answer(await client.post("/api/profiles", json={"name": "p", "entries": [entry], "tags": ["a"],
                                                                    "color": "red"}))
        nested = await answer(await client.post("/api/profiles", json={"name": "p",
                                                                       "entries": [{**entry, "weight": 1}]}))
        imported = await answer(await client.post("/api/profiles/import",
                                                  json={"name": "p", "entries": [entry], "version": 2}))
        return top, nested, imported, await (await client.get("/api/profiles")).get_json()

    top, nested, imported, listed = run(tmp_path, scenario)
    refused_naming(top, "tags", "color")
    refused_naming(nested, "entries.0.weight")
    refused_naming(imported, "version")
    assert listed["data"] == []


def test_documents_refuse_unknown_fields_but_keep_what_their_schema_leaves_open(tmp_path):
    cluster = json.loads((ROOT / "profiles" / "weather-cluster.json").read_text())
    circuit = json.loads((ROOT / "profiles" / "weather-circuit.json").read_text())

    async def scenario(client):
        bad_cluster = await answer(await client.post("/api/clusters/import",
                                                     json={**cluster, "sae": {**cluster["sae"], "path": "/x"}}))
        wrong_kind = await answer(await client.post("/api/clusters/import", json=circuit))
        open_evidence = await answer(await client.post("/api/circuits/import", json={
            **circuit, "evidence": {**circuit["evidence"], "paper": "x"}, "fallback_cluster": None}))
        return bad_cluster, wrong_kind, open_evidence

    bad_cluster, wrong_kind, open_evidence = run(tmp_path, scenario)
    refused_naming(bad_cluster, "sae.path")
    # a circuit sent as a cluster is refused for its kind, not for the circuit's own fields
    assert wrong_kind[0] == 400 and wrong_kind[1]["error"]["code"] == "invalid_parameter"
    assert wrong_kind[1]["error"]["param"] == "/kind", wrong_kind
    # evidence takes any further field (its schema says so), and keeps it
    assert open_evidence[0] == 201, open_evidence
    assert open_evidence[1]["document"]["evidence"]["paper"] == "x"


def test_every_endpoint_with_a_body_refuses_an_unknown_field(tmp_path):
    """One rule over every /api route whose body has a schema: each answers 400 naming the stray field."""
    from millm.server.api_bodies import BODIES
    from millm.server.app import create_app

    app = create_app(Settings(home=tmp_path), FakeEngine())  # type: ignore[arg-type]
    routes = [(method, re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", "p", rule.rule), rule.endpoint)
              for rule in app.url_map.iter_rules() if rule.endpoint in BODIES
              for method in sorted((rule.methods or set()) & {"POST", "PUT", "PATCH"})]
    assert {endpoint for _, _, endpoint in routes} == set(BODIES)

    async def scenario(client):
        made = await client.post("/api/profiles", json={"name": "p", "entries": []})  # PUT /api/profiles/p needs it
        assert made.status_code == 201, await made.get_data()
        out = []
        for method, path, _ in routes:
            out.append(await answer(await client.open(path, method=method, json={"bogus_field": 1})))
        return out, await (await client.get("/api/profiles")).get_json()

    results, profiles = run(tmp_path, scenario)
    for (method, path, _), result in zip(routes, results, strict=True):
        try:
            refused_naming(result, "bogus_field")
        except AssertionError as exc:
            raise AssertionError(f"{method} {path}: {result}") from exc
    assert [p["name"] for p in profiles["data"]] == ["p"] and profiles["data"][0]["entries"] == []


def test_openapi_publishes_the_bodies_closed(tmp_path):
    async def scenario(client):
        return await (await client.get("/openapi.json")).get_json()

    schemas = run(tmp_path, scenario)["components"]["schemas"]
    assert schemas["ModelsApiAddModelBody"]["additionalProperties"] is False
    assert schemas["ApiCreateProfileBody"]["properties"]["entries"]["items"]["additionalProperties"] is False
    assert schemas["ProfileDoc"]["additionalProperties"] is False and schemas["ClusterSAE"]["additionalProperties"] \
        is False
    assert schemas["Evidence"]["additionalProperties"] is True  # kept as given
    assert "additionalProperties" not in schemas["ChatCompletionRequest"] or \
        schemas["ChatCompletionRequest"]["additionalProperties"] is not False  # /v1 reports, it does not refuse
