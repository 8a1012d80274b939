"""Who may call what, and what a request may cost: keys on /api, the loopback rule, 401/405 headers,
routes that do not shadow each other, SAE paths that tell nothing about the server's files, body caps
and timeouts, and no pickle anywhere. Fast tier: a scripted engine behind Quart's test client."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from millm.config import Settings
from millm.server.auth import BIND_HOST
from tests.support.fakes import FakeEngine
from tests.support.live import live_server
from tests.support.saes import random_sae, write_saelens

ROOT = Path(__file__).resolve().parents[2]


def make(tmp_path: Path, bind: str | None = None, **kw: Any) -> Any:
    from millm.server.app import create_app

    app = create_app(Settings(home=tmp_path, **kw), FakeEngine())  # type: ignore[arg-type]
    if bind is not None:
        app.config[BIND_HOST] = bind
    return app


def run(app: Any, scenario: Callable[[Any], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with app.test_app():
            return await scenario(app.test_client())
    return asyncio.run(main())


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def statuses(app: Any, calls: list[tuple[str, str, dict[str, str]]]) -> list[int]:
    async def scenario(client):
        out = []
        for method, path, headers in calls:
            r = await client.open(path, method=method, headers=headers, json={} if method != "GET" else None)
            out.append(r.status_code)
        return out
    return run(app, scenario)


def test_api_needs_the_api_key_when_only_it_is_set(tmp_path):
    app = make(tmp_path, api_key="k")
    assert statuses(app, [
        ("GET", "/api/steering", {}), ("GET", "/api/profiles", bearer("wrong")), ("GET", "/api/profiles", bearer("k")),
        ("DELETE", "/api/steering", {}), ("POST", "/api/profiles", {}),
        ("POST", "/api/profiles", bearer("k")),  # authorised: the body is then refused
        ("GET", "/api/health", {}),
    ]) == [401, 401, 200, 401, 401, 400, 200]


def test_admin_key_guards_mutations_and_api_key_reads(tmp_path):
    app = make(tmp_path, api_key="k", admin_key="boss")
    assert statuses(app, [
        ("GET", "/api/profiles", {}), ("GET", "/api/profiles", bearer("boss")), ("GET", "/api/profiles", bearer("k")),
        ("POST", "/api/profiles", bearer("k")), ("POST", "/api/profiles", bearer("boss")),
    ]) == [401, 200, 200, 401, 400]
    only_admin = make(tmp_path / "b", admin_key="boss")
    assert statuses(only_admin, [("GET", "/api/profiles", {}), ("POST", "/api/profiles", {}),
                                 ("POST", "/api/models", bearer("boss"))]) == [200, 401, 400]


def test_keyless_mutations_only_on_a_loopback_bind(tmp_path):
    calls = [("POST", "/api/profiles", {}), ("GET", "/api/profiles", {}), ("POST", "/api/clusters/import", {}),
             ("POST", "/api/models", {})]
    assert statuses(make(tmp_path / "a", bind="127.0.0.1"), calls) == [400, 200, 400, 400]
    assert statuses(make(tmp_path / "b", bind="::1"), calls)[0] == 400
    wide = make(tmp_path / "c", bind="0.0.0.0")
    assert statuses(wide, calls) == [403, 200, 403, 403]

    async def body(client):
        return await (await client.post("/api/profiles", json={})).get_json()
    error = run(wide, body)["error"]
    assert error["code"] == "management_forbidden" and "MILLM_ADMIN_KEY" in error["message"]
    assert "loopback" in error["message"]
    keyed = make(tmp_path / "d", bind="0.0.0.0", admin_key="boss")
    assert statuses(keyed, [("POST", "/api/profiles", bearer("boss"))]) == [400]


def test_401_carries_www_authenticate_and_bearer_is_case_insensitive(tmp_path):
    app = make(tmp_path, api_key="k")

    async def scenario(client):
        denied_v1 = await client.get("/v1/models")
        denied_api = await client.get("/api/steering")
        lower = await client.get("/v1/models", headers={"Authorization": "bearer k"})
        return denied_v1, denied_api, lower
    denied_v1, denied_api, lower = run(app, scenario)
    for r in (denied_v1, denied_api):
        assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
    assert lower.status_code == 200


def test_405_carries_allow_and_profile_routes_do_not_shadow_each_other(tmp_path):
    app = make(tmp_path)

    async def scenario(client):
        out = {}
        for method, path in (("DELETE", "/api/profiles/deactivate"), ("GET", "/api/profiles/import"),
                             ("PUT", "/api/profiles/import"), ("GET", "/api/profiles/deactivate"),
                             ("GET", "/api/circuits/import"), ("DELETE", "/api/clusters/import"),
                             ("PUT", "/v1/chat/completions")):
            r = await client.open(path, method=method)
            out[(method, path)] = (r.status_code, r.headers.get("Allow"), await r.get_json())
        return out
    for (method, path), (status, allow, body) in run(app, scenario).items():
        assert status == 405, (method, path, status, body)
        assert allow is not None and "POST" in allow.split(", "), (method, path, allow)
        assert body["error"]["type"] == "invalid_request_error"


def test_route_words_are_not_names(tmp_path):
    app = make(tmp_path)

    async def scenario(client):
        return [(await client.post("/api/profiles", json={"name": word, "entries": []})).status_code
                for word in ("import", "deactivate", "active")]
    assert run(app, scenario) == [400, 400, 400]


@pytest.mark.parametrize("name", ["bad\r\nX-Evil: 1", "nul\x00name", "tab\there", "é-accent", "x" * 65, " lead",
                                  "trail ", "a/b", ""])
def test_profile_names_are_checked_on_create_and_import(tmp_path, name):
    app = make(tmp_path)
    doc = {"name": name, "entries": []}

    async def scenario(client):
        created = await client.post("/api/profiles", json=doc)
        imported = await client.post("/api/profiles/import", json=doc)
        listed = await (await client.get("/api/profiles")).get_json()
        return created, await created.get_json(), imported, listed
    created, body, imported, listed = run(app, scenario)
    assert created.status_code == 400 and imported.status_code == 400
    assert body["error"]["param"] == "name" and "letters, digits" in body["error"]["message"]
    assert listed["data"] == []


def test_a_good_name_is_kept(tmp_path):
    app = make(tmp_path)

    async def scenario(client):
        r = await client.post("/api/profiles", json={"name": "Weather v2.1_a-b", "entries": []})
        return r.status_code, (await client.get("/api/profiles/Weather v2.1_a-b")).status_code
    assert run(app, scenario) == (201, 200)


def test_sae_path_tells_nothing_about_the_servers_files(tmp_path):
    app = make(tmp_path / "home")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "cfg.json").write_text("{}")
    (tmp_path / "plain.txt").write_text("hello")

    async def scenario(client):
        out = []
        for path in ("/definitely/not/here", str(tmp_path / "plain.txt"), str(locked), str(tmp_path), "/etc/passwd",
                     "/proc/self/environ"):
            r = await client.post("/api/saes", json={"path": path})
            out.append((r.status_code, (await r.get_json())["error"]))
        return out
    results = run(app, scenario)
    assert {status for status, _ in results} == {400}
    assert len({(e["message"], e["code"], e["param"]) for _, e in results}) == 1  # one answer for all
    assert all(str(tmp_path) not in e["message"] for _, e in results)


def test_sae_labels_only_from_its_own_folder(tmp_path):
    app = make(tmp_path / "home")
    folder = write_saelens(tmp_path / "sae", random_sae(16, 32, seed=1), layer=1)
    (folder / "labels.json").write_text(json.dumps({"3": "own label"}))
    (folder / "other.json").write_text(json.dumps({"4": "other own label"}))
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"0": "server secret"}))

    async def scenario(client):
        outside = await client.post("/api/saes", json={"path": str(folder), "labels": str(secret)})
        escape = await client.post("/api/saes", json={"path": str(folder), "labels": "../secret.json"})
        inside = await client.post("/api/saes", json={"path": str(folder), "labels": "other.json"})
        sae_id = (await inside.get_json())["id"]
        features = await (await client.get(f"/api/saes/{sae_id}/features")).get_json()
        default = await client.post("/api/saes", json={"path": str(folder)})
        own = await (await client.get(f"/api/saes/{sae_id}/features")).get_json()
        return outside, await outside.get_json(), escape, inside, features, default, own
    outside, body, escape, inside, features, default, own = run(app, scenario)
    assert outside.status_code == 400 and body["error"]["param"] == "labels" and escape.status_code == 400
    assert "server secret" not in json.dumps(body)
    assert inside.status_code == 201 and [f["label"] for f in features["features"]] == ["other own label"]
    assert default.status_code == 201 and [f["label"] for f in own["features"]] == ["own label"]


def test_bodies_past_the_cap_answer_413(tmp_path):
    app = make(tmp_path, max_body_bytes=1000)

    async def scenario(client):
        big = await client.post("/v1/completions", json={"model": "fake", "prompt": "x" * 2000})
        small = await client.post("/v1/completions", json={"model": "fake", "prompt": "x", "max_tokens": 1})
        api = await client.post("/api/profiles", json={"name": "a", "entries": [], "description": "d" * 2000})
        return big, await big.get_json(), small, api
    big, body, small, api = run(app, scenario)
    assert big.status_code == 413 and api.status_code == 413 and small.status_code == 200
    assert body["error"]["code"] == "request_too_large" and "MILLM_MAX_BODY_BYTES" in body["error"]["message"]
    assert set(body["error"]) == {"message", "type", "param", "code"}


def test_a_stalled_body_times_out(tmp_path):
    app = make(tmp_path, body_timeout=0.5)
    with live_server(app) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"model\": ")
            answer = b""
            while b"\r\n\r\n" not in answer:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_no_pickle_anywhere():
    """No module imports pickle (or a pickle-based loader), and every torch.load reads weights only."""
    offenders = []
    for file in [*ROOT.joinpath("millm").rglob("*.py"), *ROOT.joinpath("cli").rglob("*.py"),
                 *ROOT.joinpath("tui").rglob("*.py"), *ROOT.joinpath("bench").rglob("*.py")]:
        text = file.read_text()
        if re.search(r"^\s*(import|from)\s+(c?pickle|dill|joblib|shelve|cloudpickle)\b", text, re.M):
            offenders.append(f"{file}: imports a pickle module")
        if re.search(r"allow_pickle\s*=\s*True", text):
            offenders.append(f"{file}: allow_pickle=True")
        for call in re.finditer(r"torch\.load\(([^()]*(\([^()]*\))?[^()]*)\)", text):
            if "weights_only=True" not in call.group(1):
                offenders.append(f"{file}: {call.group(0)}")
    assert offenders == []


def test_saved_tensors_load_without_pickle(tmp_path):
    """What miLLM writes for SAEs loads with safetensors alone (no pickle path exists)."""
    from safetensors.torch import load_file

    folder = write_saelens(tmp_path / "sae", random_sae(8, 16, seed=2), layer=0)
    tensors = load_file(str(folder / "sae_weights.safetensors"))
    assert tensors and all(t.numel() for t in tensors.values())
