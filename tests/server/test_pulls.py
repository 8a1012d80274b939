"""Pulling a model through the management API (``/api/pulls``, the console's Models page) from a stand-in Hub on
loopback: a background job with its bytes counted, one at a time, its refusal kept verbatim, the model listed
when it lands."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.app import make
from tests.support.hub import GGUF_REPO, FakeHub, hub_at
from tests.support.live import live_server


@pytest.fixture
def hub_(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with hub_at(monkeypatch) as stand_in:
        yield stand_in


@pytest.fixture
def base(tmp_path, hub_) -> Iterator[str]:
    app, _ = make(tmp_path)
    with live_server(app) as url:
        yield url


def ended(base: str, pull_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while (job := httpx.get(f"{base}/api/pulls/{pull_id}").json())["status"] == "running":
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    return job


def test_a_pulled_gguf_file_is_counted_as_it_arrives_and_listed_when_it_lands(base, hub_):
    hub_.gate = threading.Event()
    started = httpx.post(base + "/api/pulls", json={"model": "acme/tiny-GGUF:Q8_0"})
    assert started.status_code == 202 and started.json()["status"] == "running"
    job_id = started.json()["id"]
    size = len(GGUF_REPO["tiny.Q8_0.gguf"])
    deadline = time.monotonic() + 60
    while (half := httpx.get(f"{base}/api/pulls/{job_id}").json())["bytes_done"] < size // 2:
        assert time.monotonic() < deadline, half
        time.sleep(0.05)
    assert half["status"] == "running" and half["bytes_total"] == size and half["bytes_done"] < size
    second = httpx.post(base + "/api/pulls", json={"model": "acme/tiny"})
    assert second.status_code == 409 and second.json()["error"]["code"] == "pull_running"
    assert job_id in second.json()["error"]["message"]
    hub_.gate.set()
    job = ended(base, job_id)
    assert job["status"] == "succeeded" and job["bytes_done"] == size and job["error"] is None
    assert job["result"]["model"] == "tiny:Q8_0" and job["result"]["downloaded"] == ["tiny.Q8_0.gguf"]
    listed = {m["id"]: m for m in httpx.get(base + "/api/models").json()["data"]}
    assert listed["tiny:Q8_0"]["engine"] == "llama.cpp"
    assert [j["id"] for j in httpx.get(base + "/api/pulls").json()["data"]] == [job_id]


def test_a_refused_pull_keeps_the_refusal_the_cli_prints(base):
    job = ended(base, httpx.post(base + "/api/pulls", json={"model": "acme/tiny-GGUF:Q2_K"}).json()["id"])
    assert job["status"] == "failed" and job["error"]["code"] == "invalid_parameter"
    assert "Q2_K" in job["error"]["message"] and "Q8_0" in job["error"]["message"]  # names the ones there are
    missing = ended(base, httpx.post(base + "/api/pulls", json={"model": "acme/absent"}).json()["id"])
    assert missing["error"]["message"] == "acme/absent is not on the Hub (a private repo needs HF_TOKEN)."


@pytest.mark.parametrize(("body", "param"), [({}, "model"), ({"model": "not a repo"}, None),
                                             ({"model": "acme/tiny", "quant": "Q8_0"}, "quant")])
def test_a_bad_pull_request_is_a_400_and_starts_nothing(base, body, param):
    r = httpx.post(base + "/api/pulls", json=body)
    assert r.status_code == 400
    if param is not None:
        assert r.json()["error"]["param"] == param
    assert httpx.get(base + "/api/pulls").json()["data"] == []
    assert httpx.get(base + "/api/pulls/pull-000000000000").status_code == 404


def test_a_pulls_record_outlives_its_server(tmp_path, hub_):
    """Pulls are kept in the store, as learning jobs are: a server started on the same home lists them."""
    first, _ = make(tmp_path)
    with live_server(first) as url:
        done = ended(url, httpx.post(url + "/api/pulls", json={"model": "acme/tiny-GGUF:Q8_0"}).json()["id"])
        refused = ended(url, httpx.post(url + "/api/pulls", json={"model": "acme/absent"}).json()["id"])
    second, _ = make(tmp_path)
    with live_server(second) as url:
        assert httpx.get(url + "/api/pulls").json()["data"] == [refused, done]
        assert httpx.get(f"{url}/api/pulls/{done['id']}").json() == done
    assert done["status"] == "succeeded" and done["bytes_done"] == len(GGUF_REPO["tiny.Q8_0.gguf"]) > 0
    assert refused["status"] == "failed" and refused["error"]["message"].startswith("acme/absent")
