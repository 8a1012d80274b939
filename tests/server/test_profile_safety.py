"""Profiles on the bundled model through the live server: deactivating clears only what the profile set,
deleting the active profile deactivates it, and no stored name (even one inserted behind the API's back)
can break a response."""

from __future__ import annotations

from urllib.parse import quote

import httpx
import pytest

from millm.store import Store
from tests.support.live import live_server
from tests.support.saes import random_sae, write_saelens

MODEL = "SmolLM2-135M-Instruct"
LAYER = 10


@pytest.fixture
def home(tmp_path):
    return tmp_path / "home"


@pytest.fixture
def base(engine, settings, home, tmp_path):
    from millm.server.app import create_app

    folder = write_saelens(tmp_path / "sae", random_sae(576, 64, seed=11), layer=LAYER)
    with live_server(create_app(settings.model_copy(update={"home": home}), engine)) as url:
        sid = httpx.post(url + "/api/saes", json={"path": str(folder)}, timeout=30).json()["id"]
        assert httpx.post(url + f"/api/saes/{sid}/attach", json={}, timeout=30).status_code == 200
        try:
            yield url, sid
        finally:
            httpx.delete(url + "/api/steering", timeout=30)
            httpx.post(url + f"/api/saes/{sid}/detach", timeout=30)


def chat(url: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0})


def test_deactivate_without_an_active_profile_keeps_the_operators_values(base):
    url, sid = base
    assert httpx.put(url + "/api/steering", json={"sae": sid, "values": {"3": 20.0}}, timeout=30).status_code == 200
    r = httpx.post(url + "/api/profiles/deactivate", timeout=30)
    assert r.status_code == 200 and r.json()["saes"][sid]["values"] == {"3": 20.0}
    assert chat(url).headers["X-miLLM-Steering"] == "live"


def test_deactivate_clears_what_the_profile_set(base):
    url, sid = base
    profile = {"name": "p1", "entries": [{"sae": sid, "feature": 5, "strength": 30.0}]}
    assert httpx.post(url + "/api/profiles", json=profile, timeout=30).status_code == 201
    assert httpx.post(url + "/api/profiles/p1/activate", timeout=30).json()["saes"][sid]["values"] == {"5": 30.0}
    r = httpx.post(url + "/api/profiles/deactivate", timeout=30).json()
    assert r["active"] is None and r["saes"][sid]["values"] == {}


def test_deleting_the_active_profile_deactivates_it(base):
    url, sid = base
    profile = {"name": "gone", "entries": [{"sae": sid, "feature": 5, "strength": 30.0}]}
    assert httpx.post(url + "/api/profiles", json=profile, timeout=30).status_code == 201
    httpx.post(url + "/api/profiles/gone/activate", timeout=30)
    assert chat(url).headers["X-miLLM-Steering"] == '"gone"'
    assert httpx.delete(url + "/api/profiles/gone", timeout=30).status_code == 200
    state = httpx.get(url + "/api/steering", timeout=30).json()
    assert state["active_profile"] is None and state["saes"][sid]["values"] == {}
    assert chat(url).headers["X-miLLM-Steering"] == "none"
    assert httpx.get(url + "/api/profiles", timeout=30).json()["active"] is None


def test_a_bad_name_already_in_the_store_cannot_break_completions(base, home):
    url, sid = base
    bad = "evil\r\nX-Injected: 1\x00é"
    Store(home / "millm.db").save_profile(
        {"name": bad, "description": "", "model": None, "entries": [{"sae": sid, "feature": 5, "strength": 30.0}]},
        overwrite=False)
    activated = httpx.post(url + f"/api/profiles/{quote(bad, safe='')}/activate", timeout=30)
    assert activated.status_code == 200
    r = chat(url)
    assert r.status_code == 200 and "X-Injected" not in r.headers
    header = r.headers["X-miLLM-Steering"]
    assert header.startswith('"') and "\r" not in header and "\n" not in header and header.isascii()
    from millm.names import steering_label

    assert steering_label(header) == bad
    streamed = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True})
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
