"""The console's files as the server serves them (Quart's test client, no browser): ``/`` and
``/console/static/...`` with a strict Content-Security-Policy, everything the page loads present and typed, and
with the console off ``/`` a 404 as before; the API's routes and its OpenAPI document are not touched."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from millm.console import ROOT, STATIC
from millm.server.console import CSP
from tests.support.app import make, run
from tests.support.fakes import FakeEngine


def fetch(tmp_path: Path, *paths: str, **settings: object) -> list[tuple[int, Any, bytes]]:
    app, _ = make(tmp_path, FakeEngine(steerable=True), **settings)

    async def scenario(client):
        out = []
        for path in paths:
            r = await client.get(path)
            out.append((r.status_code, r.headers, await r.get_data()))
        return out

    return run(app, scenario)


def shipped() -> list[str]:
    """Every file of the console's static folder, as a path under /console/static/."""
    return sorted(str(p.relative_to(STATIC)) for p in STATIC.rglob("*") if p.is_file())


def test_the_page_is_served_at_the_root_with_a_strict_policy(tmp_path):
    [(status, headers, body)] = fetch(tmp_path, "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    policy = dict(part.strip().split(" ", 1) for part in headers["Content-Security-Policy"].split(";"))
    assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
    assert policy["connect-src"] == "'self'" and policy["default-src"] == "'none'"
    assert "unsafe" not in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY"
    html = body.decode()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html)  # no inline script: every script has a src
    assert not re.search(r"\son[a-z]+=", html)  # no inline handlers
    assert not re.search(r"\sstyle=", html)  # no inline styles


def test_every_file_the_page_loads_is_served_typed_and_under_the_policy(tmp_path):
    html = (ROOT / "index.html").read_text()
    referenced = re.findall(r'(?:src|href)="(/console/static/[^"]+)"', html)
    imports = []
    for js in STATIC.rglob("*.js"):
        for target in re.findall(r'from "(\.{1,2}/[^"]+)"', js.read_text()):
            imports.append("/console/static/" + str((js.parent / target).resolve().relative_to(STATIC.resolve())))
    paths = sorted(set(referenced + imports))
    assert "/console/static/app.js" in paths and "/console/static/pages/steering.js" in paths
    answers = fetch(tmp_path, *paths)
    for path, (status, headers, body) in zip(paths, answers):
        assert status == 200, path
        kind = {"js": "text/javascript", "css": "text/css", "svg": "image/svg+xml"}[path.rsplit(".", 1)[1]]
        assert headers["Content-Type"].startswith(kind), path
        assert headers["Content-Security-Policy"] == CSP, path
        assert body == (STATIC / path.removeprefix("/console/static/")).read_bytes(), path
    assert {p.removeprefix("/console/static/") for p in paths} == set(shipped())  # nothing shipped unused


def test_nothing_outside_the_static_folder_is_served(tmp_path):
    paths = ["/console/static/../__init__.py", "/console/static/%2e%2e/__init__.py", "/console/static/nope.js",
             "/console/static/../../server/console.py", "/console/static/pages", "/console/static/app.py",
             "/console/static//etc/passwd"]
    for path, (status, headers, body) in zip(paths, fetch(tmp_path, *paths)):
        if status == 308:  # a doubled slash is merged: the redirect stays inside the static folder
            assert headers["Location"].endswith("/console/static/etc/passwd"), path
            continue
        assert status == 404, path
        assert b"import" not in body, path


def test_the_script_never_evaluates_strings_or_writes_markup():
    """The rules the policy backs: no eval, no markup from strings (data reaches the page as text only)."""
    for js in STATIC.rglob("*.js"):
        text = js.read_text()
        for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                       "localStorage"):
            assert banned not in text, (js.name, banned)
        assert len(text.splitlines()) <= 500, js.name


@pytest.mark.parametrize("setting", [{"console": False}])
def test_with_the_console_off_the_root_is_a_404_as_before(tmp_path, setting):
    answers = fetch(tmp_path, "/", "/console/static/app.js", "/v1/models", **setting)
    (root, _, body), (asset, _, _), (models, _, _) = answers
    assert root == 404 and b"does not serve GET /" in body and asset == 404 and models == 200


def test_the_api_and_its_document_are_unchanged_by_the_console(tmp_path):
    on = fetch(tmp_path / "on", "/openapi.json", "/api/health", "/v1/models", "/metrics")
    off = fetch(tmp_path / "off", "/openapi.json", "/api/health", "/v1/models", "/metrics", console=False)
    assert on[0][2] == off[0][2]  # the OpenAPI document lists the API, not the console's files
    for (status_on, headers_on, _), (status_off, _, _) in zip(on, off):
        assert status_on == status_off == 200
        assert "Content-Security-Policy" not in headers_on


def test_the_console_answers_only_to_loopback_names(tmp_path):
    app, _ = make(tmp_path, FakeEngine(steerable=True))

    async def scenario(client):
        rebound = await client.get("/", headers={"Host": "evil.example"})
        own = await client.get("/", headers={"Host": "localhost:8000"})
        return rebound.status_code, own.status_code

    assert run(app, scenario) == (421, 200)


def test_the_docs_state_the_payload_the_package_ships():
    """docs/console.md's figure is what the console's files weigh now (bench/console.py prints the same)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_console", ROOT.parents[1] / "bench" / "console.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    files, raw, packed = bench.payload()
    page = (ROOT.parents[1] / "docs" / "console.md").read_text()
    stated = re.search(r"Static payload: (\d+) files, ([\d,]+) bytes \(([\d.]+) KiB; ([\d,]+) bytes gzipped\)", page)
    assert stated is not None
    assert (int(stated[1]), int(stated[2].replace(",", "")), int(stated[4].replace(",", ""))) == (files, raw, packed)
    assert stated[3] == f"{raw / 1024:.1f}"


def test_the_package_data_ships_every_file_the_console_has():
    """pyproject.toml's globs for millm.console match every console file, so an installed wheel serves them all."""
    import fnmatch
    import tomllib

    config = tomllib.loads((ROOT.parents[1] / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["millm.console"]
    files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
             if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert "static/pages/steering.js" in files
    for name in files:
        assert any(fnmatch.fnmatch(name, g) and name.count("/") == g.count("/") for g in globs), name
