"""Cluster sensing on the session's real server: a cluster on the bundled L10 SAE switched on to sense fires one
event per answer at the first response position where enough members exceed their thresholds (the position the
same request's read-out of those features shows), scoring records none, a huge threshold none, and every refusal
is a 4xx naming the field with nothing switched on; detaching the SAE or deleting the cluster stops it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from millm.registry import BUNDLED_ID

SAE = "smollm2-135m-res-L10"
D_SAE = 4096
MEMBERS = (2327, 3617, 1679, 20)  # the features its card says fire most often
TINY = 0.001  # a topk SAE's activation is 0 or one of the position's 32 largest: any firing member exceeds it
MESSAGES = [{"role": "user", "content": "Write two sentences about the sea."}]


def cluster(name: str, threshold: Any = TINY, features: tuple[int, ...] = MEMBERS, **sae: Any) -> dict[str, Any]:
    members = [{"feature": f, "strength": 0.0, **({} if threshold is None else {"threshold": threshold})}
               for f in features]
    return {"kind": "cluster", "name": name, "model": BUNDLED_ID, "sae": {"id": SAE, "layer": 10, "d_sae": D_SAE,
                                                                         **sae}, "members": members}


def post(base: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.post(base + path, json={} if body is None else body, timeout=300)


def events(base: str, since: int) -> list[dict[str, Any]]:
    return httpx.get(base + f"/api/sensing/events?since={since}&source=cluster", timeout=30).json()["data"]


def last_id(base: str) -> int:
    return httpx.get(base + "/api/sensing/events", timeout=30).json()["last_id"]


def sensing(base: str, name: str) -> Any:
    return httpx.get(base + f"/api/clusters/{name}", timeout=30).json()["sensing"]


@pytest.fixture
def attached(server: str) -> Iterator[str]:
    assert post(server, f"/api/saes/{SAE}/attach").status_code == 200
    try:
        yield server
    finally:
        for row in httpx.get(server + "/api/clusters", timeout=30).json()["data"]:
            if row["name"].startswith("sense-"):
                httpx.delete(server + f"/api/clusters/{row['name']}", timeout=30)
        post(server, f"/api/saes/{SAE}/detach")


def imported(base: str, doc: dict[str, Any]) -> None:
    r = post(base, "/api/clusters/import?overwrite=true", doc)
    assert r.status_code == 201, r.text


def test_a_sensing_cluster_fires_where_its_members_first_exceed_their_thresholds(attached):
    base = attached
    imported(base, cluster("sense-sea"))
    r = post(base, "/api/clusters/sense-sea/sensing", {"min_members": 2})
    assert r.status_code == 200, r.text
    assert r.json()["sensing"] == {"sae": SAE, "min_members": 2, "members": [
        {"feature": f, "threshold": TINY, "from_card": False} for f in MEMBERS]}
    since = last_id(base)
    answer = post(base, "/v1/chat/completions", {
        "model": BUNDLED_ID, "messages": MESSAGES, "max_tokens": 16, "temperature": 0,
        "return_sae_activations": {"sae_id": SAE, "features": list(MEMBERS), "positions": "completion",
                                   "read_point": "pre_steering"}})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    prompt = body["usage"]["prompt_tokens"]
    over = [(p["position"] - prompt, sum(f["value"] > TINY for f in p["features"]))
            for p in body["millm"]["sae_activations"]["positions"]]
    expected = next((at, count) for at, count in over if count >= 2)  # the read-out of the same forwards
    [event] = events(base, since)
    assert (event["source"], event["name"], event["request_id"], event["index"]) == (
        "cluster", "sense-sea", body["id"], 0)
    assert (event["position"], event["score"], event["threshold"]) == (*expected, 2)
    assert event["action"] is None and not event["acted"] and "probes" not in body["millm"]
    metrics = httpx.get(base + "/metrics", timeout=30).text
    assert 'millm_sensing_events_total{source="cluster"}' in metrics

    scored = post(base, "/v1/chat/completions", {"model": BUNDLED_ID, "messages": MESSAGES, "max_tokens": 1,
                                                 "logprobs": True})
    assert scored.status_code == 200 and "choices" in scored.json()
    assert events(base, event["id"]) == []  # scoring is never sensed

    assert httpx.delete(base + "/api/clusters/sense-sea/sensing", timeout=30).json()["sensing"] is None
    post(base, "/v1/chat/completions", {"model": BUNDLED_ID, "messages": MESSAGES, "max_tokens": 4})
    assert events(base, event["id"]) == []


def test_a_huge_threshold_records_nothing_and_a_card_derives_a_missing_one(attached):
    base = attached
    imported(base, cluster("sense-never", threshold=1e9))
    assert post(base, "/api/clusters/sense-never/sensing").status_code == 200
    since = last_id(base)
    post(base, "/v1/chat/completions", {"model": BUNDLED_ID, "messages": MESSAGES, "max_tokens": 8})
    assert events(base, since) == []

    imported(base, cluster("sense-card", threshold=None, features=(2327,)))
    r = post(base, "/api/clusters/sense-card/sensing")
    assert r.status_code == 200, r.text
    assert r.json()["sensing"]["members"] == [{"feature": 2327, "threshold": 26.602, "from_card": True}]  # 53.204 / 2


def test_detaching_the_sae_or_deleting_the_cluster_stops_its_sensing(attached):
    base = attached
    imported(base, cluster("sense-gone"))
    assert post(base, "/api/clusters/sense-gone/sensing").status_code == 200
    assert sensing(base, "sense-gone") is not None
    assert post(base, f"/api/saes/{SAE}/detach").status_code == 200
    assert sensing(base, "sense-gone") is None
    assert post(base, f"/api/saes/{SAE}/attach").status_code == 200
    assert sensing(base, "sense-gone") is None  # re-attaching does not switch it on again
    assert post(base, "/api/clusters/sense-gone/sensing").status_code == 200
    assert httpx.delete(base + "/api/clusters/sense-gone", timeout=30).status_code == 200
    since = last_id(base)
    post(base, "/v1/chat/completions", {"model": BUNDLED_ID, "messages": MESSAGES, "max_tokens": 6})
    assert events(base, since) == []  # nothing left reading for it


@pytest.mark.parametrize(("body", "param"), [({"min_members": 0}, "min_members"),
                                             ({"min_members": 5}, "min_members"),
                                             ({"min_members": "2"}, "min_members")])
def test_a_bad_min_members_is_a_400_naming_it_with_nothing_switched_on(attached, body, param):
    imported(attached, cluster("sense-bad"))
    r = post(attached, "/api/clusters/sense-bad/sensing", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert sensing(attached, "sense-bad") is None


@pytest.mark.parametrize("threshold", [0, -1.0, "1"])
def test_a_bad_threshold_is_refused_at_import_naming_the_member(server, threshold):
    r = post(server, "/api/clusters/import", cluster("sense-threshold", threshold=threshold))
    assert r.status_code == 400 and r.json()["error"]["param"] == "/members/0/threshold", r.text
    assert httpx.get(server + "/api/clusters/sense-threshold", timeout=30).status_code == 404


def test_sensing_needs_the_clusters_sae_attached(server):
    imported(server, cluster("sense-off"))
    try:
        r = post(server, "/api/clusters/sense-off/sensing")
        assert r.status_code == 400 and r.json()["error"]["param"] == "sae", r.text
        assert SAE in r.json()["error"]["message"] and sensing(server, "sense-off") is None
    finally:
        httpx.delete(server + "/api/clusters/sense-off", timeout=30)


def test_a_member_with_no_threshold_and_no_card_value_is_refused_naming_it(engine, server):
    from tests.support.saes import attached_random

    with attached_random(engine, "sae_sense_nocard", seed=3, layer=12, d_sae=32):
        doc = {"kind": "cluster", "name": "sense-nocard", "model": BUNDLED_ID, "sae": {"layer": 12, "d_sae": 32},
               "members": [{"feature": 1, "strength": 0.0, "threshold": 0.5}, {"feature": 2, "strength": 0.0}]}
        imported(server, doc)
        try:
            r = post(server, "/api/clusters/sense-nocard/sensing")
            assert r.status_code == 400 and r.json()["error"]["param"] == "/members/1/threshold", r.text
            assert sensing(server, "sense-nocard") is None
        finally:
            httpx.delete(server + "/api/clusters/sense-nocard", timeout=30)
