"""A web page cannot drive the server (issue 49, item 1): the Host, Origin and Content-Type rules of
``millm.server.origins``, on hand-built tables, through Quart's test client (the attack matrix), and over real
HTTP as a browser sends the attack's requests. Fast tier: a scripted engine."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from millm.server.auth import BIND_HOST
from millm.server.origins import allowed_hosts, authority, has_body, host_allowed, is_json, same_origin
from tests.support.app import chat, make, run
from tests.support.fakes import SCRIPT, FakeEngine
from tests.support.live import live_server

SAE = "smollm2-135m-res-L10"
EVIL = "http://evil.example"
PLAIN = "text/plain;charset=UTF-8"  # what fetch() sends for a string body: no preflight


def test_authority_reads_a_bare_name_and_port():
    assert authority("localhost:8000") == ("localhost", 8000)
    assert authority("LocalHost") == ("localhost", None)
    assert authority("[::1]:8000") == ("::1", 8000)
    assert authority("127.0.0.1") == ("127.0.0.1", None)
    for bad in ("", "evil@localhost", "localhost/x", "localhost:port", "a b", "localhost:99999", ":8000"):
        assert authority(bad) is None, bad


@pytest.mark.parametrize(("host", "allowed", "answer"), [
    ("localhost:8000", "", True), ("localhost", "", True), ("127.0.0.1:9", "", True), ("127.8.9.1:80", "", True),
    ("[::1]:8000", "", True), ("evil.example:8000", "", False), ("evil.example", "", False), ("", "", False),
    ("localhost.evil.example", "", False), ("evil@localhost", "", False), ("10.0.0.5:8000", "", False),
    ("box.lan:8000", "box.lan", True), ("BOX.lan", "box.lan", True), ("other.lan", "box.lan", False),
    ("a.b.example", ".b.example", True), ("b.example", ".b.example", True), ("xb.example", ".b.example", False),
    ("anything:1", "*", True), ("box.lan", " x.lan , box.lan ", True),
])
def test_host_allowed(host, allowed, answer):
    assert host_allowed(host, allowed_hosts(allowed)) is answer


@pytest.mark.parametrize(("origin", "host", "answer"), [
    ("http://localhost:8000", "localhost:8000", True), ("http://LOCALHOST:8000", "localhost:8000", True),
    ("http://127.0.0.1:8000", "127.0.0.1:8000", True), ("http://[::1]:8000", "[::1]:8000", True),
    ("http://localhost:8001", "localhost:8000", False), ("http://127.0.0.1:8000", "localhost:8000", False),
    ("http://evil.example", "localhost:8000", False), ("null", "localhost:8000", False),
    ("http://evil.example:8000", "localhost:8000", False), ("file://", "localhost:8000", False),
    ("https://box.lan", "box.lan", True), ("http://box.lan", "box.lan", True), ("http://box.lan:81", "box.lan", False),
    ("http://localhost:8000/path", "localhost:8000", False), ("", "localhost:8000", False),
])
def test_same_origin(origin, host, answer):
    assert same_origin(origin, host) is answer


def test_body_and_json_rules():
    assert has_body({"Content-Length": "2"}) and has_body({"Transfer-Encoding": "chunked"})
    assert not has_body({}) and not has_body({"Content-Length": "0"})
    assert is_json("application/json") and is_json("application/merge-patch+json") and is_json("Application/JSON")
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "", "text/json"):
        assert not is_json(kind), kind


# the attack matrix: route x Origin x Content-Type x key setting

KEYS = {"keyless": {}, "api key": {"api_key": "k"}, "admin key": {"api_key": "k", "admin_key": "boss"}}
ROUTES = [("POST", "/api/steering/disable"), ("POST", "/api/profiles"), ("POST", "/v1/chat/completions"),
          ("GET", "/api/steering"), ("GET", "/v1/models")]
ORIGINS = {"none": None, "own": "http://localhost", "other": EVIL, "null": "null"}
TYPES = {"json": "application/json", "text/plain": PLAIN, "form": "application/x-www-form-urlencoded",
         "untyped": None}
BODIES = {"/api/profiles": {"name": "p", "entries": []}, "/v1/chat/completions": chat(max_tokens=2)}


def matrix(keys: dict[str, Any], tmp_path: Any) -> dict[tuple[str, str, str, str], int]:
    app, _ = make(tmp_path, FakeEngine(steerable=True), **keys)
    admin = keys.get("admin_key") or keys.get("api_key")
    cleanup = {"Authorization": f"Bearer {admin}"} if admin else {}

    async def scenario(client: Any) -> dict[tuple[str, str, str, str], int]:
        out = {}
        for method, path in ROUTES:
            for origin_name, origin in ORIGINS.items():
                for type_name, kind in TYPES.items():
                    headers = {"Host": "localhost"}
                    if origin:
                        headers["Origin"] = origin
                    if kind:
                        headers["Content-Type"] = kind
                    key = admin if method == "POST" and path.startswith("/api") else keys.get("api_key")
                    if key:
                        headers["Authorization"] = f"Bearer {key}"
                    data = json.dumps(BODIES.get(path, {})).encode() if method == "POST" else b""
                    if data:
                        headers["Content-Length"] = str(len(data))  # as an HTTP/1.1 client sends it
                    r = await client.open(path, method=method, headers=headers, data=data)
                    out[(method + " " + path, origin_name, type_name)] = r.status_code
                    await client.delete("/api/profiles/p", headers=cleanup)
        return out
    return run(app, scenario)


@pytest.mark.parametrize("setting", list(KEYS))
def test_the_attack_matrix(setting, tmp_path):
    """Every state-changing request from another origin is 403 and every non-JSON body 415, whatever key is set;
    a request with the key, no Origin (or the server's own) and a JSON body does what it asks."""
    found = matrix(KEYS[setting], tmp_path)
    for (route, origin, kind), status in found.items():
        method = route.split()[0]
        if method == "POST" and origin in ("other", "null"):
            expected = 403
        elif method == "POST" and kind != "json":
            expected = 415
        else:
            expected = 201 if route.endswith("/api/profiles") else 200
        assert status == expected, (setting, route, origin, kind, status)


def test_a_foreign_host_is_misdirected_on_a_loopback_bind(tmp_path):
    app, _ = make(tmp_path, FakeEngine(steerable=True))
    app.config[BIND_HOST] = "127.0.0.1"

    async def scenario(client: Any) -> list[tuple[int, Any]]:
        out = []
        for path in ("/v1/models", "/api/steering", "/api/health", "/metrics", "/openapi.json", "/nowhere"):
            r = await client.get(path, headers={"Host": "evil.example:8000"})
            out.append((r.status_code, await r.get_json()))
        r = await client.post("/api/steering/disable", headers={"Host": "evil.example:8000"})
        out.append((r.status_code, await r.get_json()))
        steering = await (await client.get("/api/steering", headers={"Host": "127.0.0.1:8000"})).get_json()
        return [*out, (200, steering)]
    *refused, (_, steering) = run(app, scenario)
    for status, body in refused:
        assert status == 421 and body["error"]["code"] == "host_not_allowed", (status, body)
        assert "evil.example" in body["error"]["message"] and "MILLM_ALLOWED_HOSTS" in body["error"]["message"]
    assert steering["enabled"] is True  # the refused disable changed nothing


def test_allowed_hosts_and_a_wide_bind_answer_other_names(tmp_path):
    listed, _ = make(tmp_path / "a", allowed_hosts="box.lan")
    wide, _ = make(tmp_path / "b")
    wide.config[BIND_HOST] = "0.0.0.0"

    async def scenario(client: Any) -> list[int]:
        return [(await client.get("/v1/models", headers={"Host": name})).status_code
                for name in ("box.lan:8000", "other.lan:8000")]
    assert run(listed, scenario) == [200, 421]
    assert run(wide, scenario) == [200, 200]


def test_the_refusals_are_openai_errors_naming_what_was_wrong(tmp_path):
    app, _ = make(tmp_path, FakeEngine(steerable=True))

    async def scenario(client: Any) -> list[Any]:
        foreign = await client.post("/api/steering/disable", headers={"Origin": EVIL})
        plain = await client.post("/api/profiles", data=b'{"name": "p", "entries": []}',
                                  headers={"Content-Type": PLAIN})
        return [await foreign.get_json(), await plain.get_json()]
    foreign, plain = run(app, scenario)
    assert foreign["error"]["code"] == "cross_origin_forbidden" and EVIL in foreign["error"]["message"]
    assert plain["error"]["code"] == "unsupported_media_type" and "application/json" in plain["error"]["message"]
    assert "text/plain" in plain["error"]["message"]
    for body in (foreign, plain):
        assert set(body["error"]) == {"message", "type", "param", "code"}


def test_a_page_on_another_origin_cannot_steer_a_keyless_server(tmp_path):
    """The attack as a browser sends it, over real HTTP: simple POSTs (text/plain, an Origin) that attach the
    bundled SAE, store a profile that steers and activate it; a rebound name reading the steering. Each is
    refused, and an ordinary client's next answer is unsteered. The same steps from a client that is not a
    browser (JSON, no Origin) steer, so the refusals are the rules', not the steps'."""
    app, _ = make(tmp_path, FakeEngine(steerable=True))
    profile = {"name": "evil", "entries": [{"sae": SAE, "feature": 1, "strength": 80}]}
    steps = [(f"/api/saes/{SAE}/attach", {}), ("/api/profiles", profile), ("/api/profiles/evil/activate", {})]
    with live_server(app) as base:
        port = base.rsplit(":", 1)[1]
        as_page = [httpx.post(base + path, content=json.dumps(body), timeout=30,
                              headers={"Origin": EVIL, "Content-Type": PLAIN}) for path, body in steps]
        no_origin = [httpx.post(base + path, content=json.dumps(body), timeout=30,
                                headers={"Content-Type": PLAIN}) for path, body in steps]
        rebound = httpx.get(base + "/api/steering", headers={"Host": f"evil.example:{port}"}, timeout=30)
        answer = httpx.post(base + "/v1/chat/completions", json=chat(max_tokens=200), timeout=30)
        saes = httpx.get(base + "/api/saes", timeout=30).json()["data"]
        profiles = httpx.get(base + "/api/profiles", timeout=30).json()["data"]
        as_client = [httpx.post(base + path, json=body, timeout=30) for path, body in steps]
        steered = httpx.post(base + "/v1/chat/completions", json=chat(max_tokens=200), timeout=30)
    assert [r.status_code for r in as_page] == [403, 403, 403]
    assert [r.status_code for r in no_origin] == [415, 415, 415]
    assert rebound.status_code == 421
    assert answer.json()["choices"][0]["message"]["content"] == SCRIPT
    assert answer.headers.get("X-miLLM-Steering") != "live"
    assert all(s["attached_layer"] is None for s in saes if s["id"] == SAE) and profiles == []
    assert [r.status_code for r in as_client] == [200, 201, 200]
    assert steered.json()["choices"][0]["message"]["content"] != SCRIPT


def test_every_operation_refuses_a_web_pages_requests(tmp_path):
    """bench/fuzz.py's cross-site cases, over every operation of /openapi.json: each gets exactly its refusal."""
    from tests.support.fuzzing import Report, cross_site, send_cross_site

    app, _ = make(tmp_path, FakeEngine(steerable=True))
    report = Report()
    with live_server(app) as base:
        cases = cross_site(base)
        send_cross_site(base, report)
    assert report.problems == []
    assert {expected for *_, expected in cases} == {403, 415, 421}
    assert len({path for _, path, *_ in cases}) > 40 and report.statuses[421] == len({(m, p) for m, p, *_ in cases})


ROUNDS = 40  # unread, about one body in fifty closed its connection: 160 requests met it nearly always


def test_a_refused_request_leaves_its_keep_alive_connection_usable(tmp_path):
    """A request refused before its route read the body (401, 403, 415, 421) has its body read and dropped, so
    the client's next request on the same connection is answered (left unread, the server closed the
    connection after some answers and the next request failed with 'Server disconnected')."""
    app, _ = make(tmp_path, FakeEngine(steerable=True), api_key="k")
    refused = [({}, 401), ({"Origin": EVIL}, 403), ({"Content-Type": PLAIN}, 415), ({"Host": "evil.example"}, 421)]
    with live_server(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        statuses = [client.post("/api/profiles", content=b"{}",
                                headers={"Content-Type": "application/json", **headers}).status_code
                    for _ in range(ROUNDS) for headers, _ in refused]
        good = client.get("/v1/models", headers={"Authorization": "Bearer k"})
    assert statuses == [status for _ in range(ROUNDS) for _, status in refused]
    assert good.status_code == 200
