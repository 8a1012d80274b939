"""A request queued behind another while an operator changes steering (the bundled model over HTTP, greedy).

Its steering is decided when it arrives and its rows are bound when its turn comes: ``steering_intensity:
"off"`` answers unsteered whatever the operator did in between, and a request that follows the live values
says in X-miLLM-Steering what it ran with.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.live import live_server
from tests.support.saes import random_sae, write_saelens
from tests.support.waiting import wait_for, wait_running

MODEL = "SmolLM2-135M-Instruct"
PROMPT = [{"role": "user", "content": "Tell me about your day."}]
LONG = [{"role": "user", "content": "Count from 1 to 300, separated by commas."}]


@pytest.fixture(scope="module")
def base(engine, settings):
    from millm.server.app import create_app

    with live_server(create_app(settings, engine)) as url:
        yield url


@pytest.fixture(scope="module")
def sae_id(base, tmp_path_factory):
    folder = write_saelens(tmp_path_factory.mktemp("queued") / "l10", random_sae(576, 64, seed=1), layer=10)
    sid = httpx.post(base + "/api/saes", json={"path": str(folder)}, timeout=30).json()["id"]
    assert httpx.post(base + f"/api/saes/{sid}/attach", json={}, timeout=30).status_code == 200
    yield sid
    httpx.delete(base + "/api/steering", timeout=30)
    httpx.post(base + f"/api/saes/{sid}/detach", timeout=30)


def chat(base, **body):
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": 16, "temperature": 0} | body
    return httpx.post(base + "/v1/chat/completions", json=body, timeout=300)


def content(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def queued_then_steered(base, engine, sae_id, **body) -> httpx.Response:
    """``body`` sent while a long request runs; once it waits in the scheduler (prepared), the operator sets a
    live value; its response."""
    with ThreadPoolExecutor(2) as pool:
        blocker = pool.submit(chat, base, messages=LONG, max_tokens=48)
        wait_running(base, blocker)
        job = pool.submit(chat, base, **body)
        wait_for(lambda: engine.scheduler().queued >= 1, "the request waiting behind the first", job)
        r = httpx.put(base + "/api/steering", json={"sae": sae_id, "values": {"3": 60.0}}, timeout=30)
        assert r.status_code == 200 and not blocker.done()
        return job.result()


@pytest.mark.parametrize("dial", ["off", 0])
def test_off_queued_before_an_operator_change_answers_unsteered(base, engine, sae_id, dial):
    unsteered = chat(base)
    try:
        r = queued_then_steered(base, engine, sae_id, steering_intensity=dial)
        assert content(r) == content(unsteered) and r.headers["X-miLLM-Steering"] == "none"
        assert content(chat(base)) != content(unsteered)  # the operator's value does steer the next request
    finally:
        httpx.delete(base + "/api/steering", timeout=30)


def test_a_queued_request_says_it_ran_with_the_live_values(base, engine, sae_id):
    unsteered = chat(base)
    try:
        r = queued_then_steered(base, engine, sae_id)
        steered = chat(base)
        assert content(r) == content(steered) != content(unsteered)
        assert r.headers["X-miLLM-Steering"] == "live"  # prepare saw "none"; the rows were bound under "live"
    finally:
        httpx.delete(base + "/api/steering", timeout=30)
