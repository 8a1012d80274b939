"""Probes over HTTP on the real model: learned as a job, served per request and while attached (verdicts in the
body, the header and the stream's probe-verdict chunk), sensing events, and the refusals."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from millm.registry import BUNDLED_ID
from tests.probes.texts import NEGATIVE, POSITIVE

NAME = "rain-http"
MESSAGES = [{"role": "user", "content": "Write two sentences about rain and storms."}]


def post(base: str, path: str, **body: Any) -> httpx.Response:
    return httpx.post(base + path, json=body, timeout=300)


def chat(base: str, **fields: Any) -> httpx.Response:
    return post(base, "/v1/chat/completions", **{"model": BUNDLED_ID, "messages": MESSAGES, "temperature": 0,
                                                 "max_tokens": 12, **fields})


@pytest.fixture(scope="module")
def learned(server: str) -> dict[str, Any]:
    r = post(server, "/api/probes/learn", name=NAME, positive=POSITIVE, negative=NEGATIVE, layer=14,
             method="logreg")
    assert r.status_code == 202, r.text
    job = r.json()
    for _ in range(600):
        job = httpx.get(server + f"/api/probes/jobs/{job['id']}", timeout=30).json()
        if job["status"] not in ("queued", "running"):
            break
        time.sleep(0.5)
    assert job["status"] == "succeeded", job
    return job["probe"]


def document(server: str, **changes: Any) -> dict[str, Any]:
    doc = httpx.get(server + f"/api/probes/{NAME}/export", timeout=30).json()
    return {**doc, **changes}


def frames(r: httpx.Response) -> list[Any]:
    return [json.loads(f[6:]) if f != "data: [DONE]" else "[DONE]" for f in r.text.strip().split("\n\n")]


def test_learned_as_a_job_and_listed_with_its_figures(server, learned):
    assert learned["method"] == "logreg" and learned["layer"] == 14 and learned["figures"]["auroc"] >= 0.9
    listed = {p["name"]: p for p in httpx.get(server + "/api/probes", timeout=30).json()["data"]}
    assert listed[NAME]["threshold"] == learned["threshold"] and "weight" not in listed[NAME]


def test_a_flag_verdict_is_the_same_streamed_and_not(server, learned):
    whole = chat(server, probes=[NAME])
    assert whole.status_code == 200, whole.text
    [verdict] = whole.json()["millm"]["probes"]
    assert verdict["probe"] == NAME and verdict["fired"] and verdict["action"] == "flag"
    assert whole.headers["X-miLLM-Probes"].startswith(f'"{NAME}";fired=?1;score=')
    streamed = frames(chat(server, probes=[NAME], stream=True))
    assert streamed[-1] == "[DONE]"
    chunk = streamed[-2]
    assert chunk["choices"] == [] and chunk["millm"] == {"probes": [verdict]}
    text = "".join(f["choices"][0]["delta"].get("content") or "" for f in streamed[:-2])
    assert text == whole.json()["choices"][0]["message"]["content"]


def test_attached_probes_watch_every_generation_and_scoring_records_nothing(server, learned):
    attached = post(server, f"/api/probes/{NAME}/attach")
    assert attached.status_code == 200 and attached.json()["attached"] == {"action": "flag", "profile": None}
    try:
        last = httpx.get(server + "/api/sensing/events", timeout=30).json()["last_id"]
        r = chat(server)
        assert r.json()["millm"]["probes"][0]["fired"]
        events = httpx.get(server + f"/api/sensing/events?since={last}", timeout=30).json()["data"]
        assert [(e["source"], e["name"], e["request_id"]) for e in events] == [("probe", NAME, r.json()["id"])]
        scored = chat(server, max_tokens=1, logprobs=True, probes=[NAME])
        embedded = post(server, "/v1/embeddings", model=BUNDLED_ID, input="rain", probes=[NAME])
        for response in (scored, embedded):
            assert response.status_code == 200 and "millm" not in response.json()
            assert '"probes"' in response.headers["X-miLLM-Ignored-Fields"]
        after = httpx.get(server + f"/api/sensing/events?since={events[-1]['id']}", timeout=30).json()["data"]
        assert after == []
        metrics = httpx.get(server + "/metrics", timeout=30).text
        assert 'millm_sensing_events_total{source="probe"}' in metrics
    finally:
        post(server, f"/api/probes/{NAME}/detach")
    assert "millm" not in chat(server, max_tokens=2).json()


def test_abort_ends_the_stream_with_content_filter(server, learned):
    imported = httpx.post(server + "/api/probes/import?name=rain-eager",
                          json=document(server, threshold=-1e9), timeout=30)
    assert imported.status_code == 201, imported.text
    streamed = frames(chat(server, stream=True, probes=[{"name": "rain-eager", "action": "abort"}]))
    finishes = [f["choices"][0]["finish_reason"] for f in streamed[:-2] if f["choices"]]
    assert [f for f in finishes if f] == ["content_filter"]
    [verdict] = streamed[-2]["millm"]["probes"]
    assert verdict["acted"] and verdict["position"] == 0
    assert streamed[-3]["usage"]["completion_tokens"] == 1


def test_an_abort_rolling_mean_ends_the_stream_where_its_first_window_fires(server, learned):
    doc = document(server, aggregation="rolling_mean", window=3, threshold=-1e9)
    imported = httpx.post(server + "/api/probes/import?name=rain-rolling", json=doc, timeout=30)
    assert imported.status_code == 201 and imported.json()["window"] == 3
    assert httpx.get(server + "/api/probes/rain-rolling/export", timeout=30).json()["window"] == 3
    streamed = frames(chat(server, stream=True, probes=[{"name": "rain-rolling", "action": "abort"}]))
    ended = next(i for i, f in enumerate(streamed) if f["choices"] and f["choices"][0]["finish_reason"])
    assert streamed[ended]["choices"][0]["finish_reason"] == "content_filter"
    assert not any(f["choices"] for f in streamed[ended + 1:-1])  # nothing after: usage, the verdict, [DONE]
    [verdict] = streamed[-2]["millm"]["probes"]
    # the first full window ends at response position 2: the answer is the three tokens fed by then
    assert (verdict["acted"], verdict["position"], verdict["window"]) == (True, 2, 3)
    assert streamed[-3]["usage"]["completion_tokens"] == verdict["position"] + 1


@pytest.mark.parametrize("changes", [{"aggregation": "rolling_mean", "window": 0},
                                     {"aggregation": "rolling_mean", "window": "8"}, {"window": 4}])
def test_a_probe_document_with_a_bad_window_is_a_400_naming_it(server, learned, changes):
    r = httpx.post(server + "/api/probes/import?name=rain-window", json=document(server, **changes), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "window"
    assert httpx.get(server + "/api/probes/rain-window", timeout=30).status_code == 404


def test_a_probe_for_another_model_is_refused_at_attach_naming_both(server, learned):
    doc = document(server, weight=[0.0] * 1024, model={**document(server)["model"], "hidden_size": 1024})
    assert httpx.post(server + "/api/probes/import?name=rain-wide", json=doc, timeout=30).status_code == 201
    r = post(server, "/api/probes/rain-wide/attach")
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "hidden size 1024" in message and "hidden size 576" in message and BUNDLED_ID in message


@pytest.mark.parametrize(("body", "param"), [({"aggregation": "median"}, "aggregation"),
                                             ({"target_fpr": 1.5}, "target_fpr"), ({"target_fpr": 0}, "target_fpr"),
                                             ({"aggregation": "rolling_mean", "window": 0}, "window"),
                                             ({"window": 4}, "window")])
def test_bad_learning_bodies_are_400s_naming_the_field(server, body, param):
    r = post(server, "/api/probes/learn", name="rain-bad", positive=POSITIVE, negative=NEGATIVE, **body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_an_action_on_an_aggregation_decided_only_at_the_end_is_a_400(server, learned):
    doc = document(server, aggregation="mean")
    assert httpx.post(server + "/api/probes/import?name=rain-mean", json=doc, timeout=30).status_code == 201
    r = post(server, "/api/probes/rain-mean/attach", action="abort")
    assert r.status_code == 400 and r.json()["error"]["param"] == "action"
    asked = chat(server, probes=[{"name": "rain-mean", "action": "abort"}])
    assert asked.status_code == 400 and asked.json()["error"]["param"] == "probes[0].action"
