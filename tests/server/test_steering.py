"""Steering on the bundled model through the live server: SAEs, values, profiles, read-outs, monitoring."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.support.live import live_server
from tests.support.saes import random_sae, write_saelens
from tests.support.waiting import wait_for, wait_idle, wait_running

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch

MODEL = "SmolLM2-135M-Instruct"
LAYER = 10
FEATURE = 7
STRENGTH = 150.0
PROMPT = [{"role": "user", "content": "Write one sentence about the weather."}]


@pytest.fixture(scope="module")
def base(engine, settings):
    from millm.server.app import create_app

    with live_server(create_app(settings, engine)) as url:
        yield url


@pytest.fixture(scope="module")
def sae_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("saes")
    main = write_saelens(root / "smollm-l10", random_sae(576, 1024, seed=3), layer=LAYER)
    (main / "labels.json").write_text(json.dumps({"7": "weather words", "8": "cats"}))
    return {"main": main, "second": write_saelens(root / "smollm-l20", random_sae(576, 256, seed=4), layer=20),
            "narrow": write_saelens(root / "narrow", random_sae(64, 128, seed=5), layer=2)}


@pytest.fixture(scope="module")
def sae_id(base, sae_dirs):
    r = httpx.post(base + "/api/saes", json={"path": str(sae_dirs["main"])}, timeout=30)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert httpx.post(base + f"/api/saes/{sid}/attach", json={}, timeout=30).json()["attached_layer"] == LAYER
    yield sid
    httpx.delete(base + "/api/steering", timeout=30)
    httpx.post(base + f"/api/saes/{sid}/detach", timeout=30)


@pytest.fixture(autouse=True)
def clean_values(request):
    yield
    if "sae_id" in request.fixturenames:
        base = request.getfixturevalue("base")
        httpx.delete(base + "/api/steering", timeout=30)
        httpx.post(base + "/api/steering/enable", timeout=30)


def chat(base, **body):
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": 16, "temperature": 0} | body
    return httpx.post(base + "/v1/chat/completions", json=body, timeout=120)


def text(r):
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def steer(base, sae_id, values, method="PUT"):
    return httpx.request(method, base + "/api/steering", json={"sae": sae_id, "values": values}, timeout=30)


def test_registry_shape(base, sae_id, sae_dirs):
    sae = httpx.get(base + f"/api/saes/{sae_id}", timeout=10).json()
    assert sae_id.startswith("sae_")
    assert {k: sae[k] for k in ("format", "architecture", "d_in", "d_sae", "layer_hint", "attached_layer")} == \
        {"format": "saelens", "architecture": "relu", "d_in": 576, "d_sae": 1024, "layer_hint": LAYER,
         "attached_layer": LAYER}
    assert sae["model_hint"] == MODEL and sae["name"] == "smollm-l10"
    found = httpx.get(base + f"/api/saes/{sae_id}/features", params={"q": "weather"}, timeout=10).json()
    assert found["features"] == [{"index": 7, "label": "weather words"}]
    assert sae_id in [s["id"] for s in httpx.get(base + "/api/saes", timeout=10).json()["data"]]


def test_attach_refusals(base, sae_id, sae_dirs):
    narrow = httpx.post(base + "/api/saes", json={"path": str(sae_dirs["narrow"])}, timeout=30).json()["id"]
    r = httpx.post(base + f"/api/saes/{narrow}/attach", json={}, timeout=30)
    assert r.status_code == 400 and "d_in" in r.json()["error"]["message"]
    r = httpx.post(base + f"/api/saes/{narrow}/attach", json={"layer": LAYER}, timeout=30)
    assert r.status_code == 400
    assert httpx.post(base + "/api/saes", json={"path": "/nope"}, timeout=30).status_code == 400
    assert httpx.get(base + "/api/saes/sae_missing", timeout=10).status_code == 404


def test_strong_feature_changes_output_and_clearing_restores_it(base, sae_id):
    plain = chat(base)
    assert plain.headers["X-miLLM-Steering"] == "none"
    r = steer(base, sae_id, {str(FEATURE): STRENGTH})
    assert r.status_code == 200 and r.json()["live"] is True
    assert r.json()["saes"][sae_id] == {"layer": LAYER, "values": {str(FEATURE): STRENGTH}}
    steered = chat(base)
    assert steered.headers["X-miLLM-Steering"] == "live"
    assert text(steered) != text(plain)
    httpx.post(base + "/api/steering/disable", timeout=10)
    assert text(chat(base)) == text(plain)
    httpx.post(base + "/api/steering/enable", timeout=10)
    assert text(chat(base)) == text(steered)
    httpx.delete(base + "/api/steering", timeout=10)
    assert text(chat(base)) == text(plain)  # byte for byte


def test_patch_merges_and_zero_removes(base, sae_id):
    steer(base, sae_id, {"1": 5.0})
    r = steer(base, sae_id, {"2": 6.0}, method="PATCH").json()
    assert r["saes"][sae_id]["values"] == {"1": 5.0, "2": 6.0}
    r = steer(base, sae_id, {"1": 0}, method="PATCH").json()
    assert r["saes"][sae_id]["values"] == {"2": 6.0}
    bad = steer(base, sae_id, {"5000": 1.0})
    assert bad.status_code == 400 and "5000" in bad.json()["error"]["message"]
    assert steer(base, sae_id, {"3": "lots"}).status_code == 400
    assert steer(base, "sae_unattached", {"3": 1}).status_code in (400, 404)
    assert httpx.get(base + "/api/steering", timeout=10).json()["saes"][sae_id]["values"] == {"2": 6.0}


def test_embeddings_never_steered(base, sae_id):
    def embed():
        return httpx.post(base + "/v1/embeddings", json={"model": MODEL, "input": ["a sunny day"]},
                          timeout=60).json()["data"][0]["embedding"]

    plain = embed()
    steer(base, sae_id, {str(FEATURE): STRENGTH})
    r = httpx.post(base + "/v1/embeddings", json={"model": MODEL, "input": "a sunny day"}, timeout=60)
    assert r.headers["X-miLLM-Steering"] == "none"
    assert embed() == plain


def create_profile(base, name, entries):
    r = httpx.post(base + "/api/profiles", json={"name": name, "description": "test", "entries": entries}, timeout=10)
    assert r.status_code in (201, 409), r.text
    return name


def test_per_request_profile_replaces_then_restores(base, sae_id, engine):
    name = create_profile(base, "weather-up", [{"sae": sae_id, "feature": FEATURE, "strength": STRENGTH}])
    plain = text(chat(base))
    steer(base, sae_id, {str(FEATURE): STRENGTH})
    live_steered = text(chat(base))
    httpx.delete(base + "/api/steering", timeout=10)
    steer(base, sae_id, {"3": 1.0})
    before = httpx.get(base + "/api/steering", timeout=10).json()
    r = chat(base, profile=name)
    assert r.headers["X-miLLM-Steering"] == f'"{name}"'
    assert text(r) == live_steered  # the profile replaced the global values for this request
    assert httpx.get(base + "/api/steering", timeout=10).json() == before
    httpx.delete(base + "/api/steering", timeout=10)
    assert text(chat(base)) == plain
    by_layer = create_profile(base, "by-layer", [{"sae": LAYER, "feature": FEATURE, "strength": STRENGTH}])
    assert text(chat(base, profile=by_layer)) == live_steered


def test_profile_refusals(base, sae_id):
    assert chat(base, profile="never-saved").status_code == 404
    create_profile(base, "too-wide", [{"sae": sae_id, "feature": 5000, "strength": 1.0}])
    r = chat(base, profile="too-wide")
    assert r.status_code == 400 and "5000" in r.json()["error"]["message"]
    create_profile(base, "other-sae", [{"sae": "sae_notattached", "feature": 1, "strength": 1.0}])
    assert chat(base, profile="other-sae").status_code == 400


def delta(engine, sae_id):
    return engine.steering.attachments[sae_id].delta.clone()


def test_profile_restored_after_error_and_disconnect(base, sae_id, engine, monkeypatch):
    """A request's profile steers its own row; after an error or a disconnect the row is released, the
    live values were never displaced, and steering reads live again."""
    import torch

    name = create_profile(base, "gentle", [{"sae": sae_id, "feature": FEATURE, "strength": 10.0}])
    steer(base, sae_id, {"3": 2.0})
    expected = delta(engine, sae_id)
    att = engine.steering.attachments[sae_id]
    profile_row = 10.0 * att.sae.W_dec[FEATURE]
    real, calls = engine.model.forward, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", failing)
    r = chat(base, profile=name, stream=True)
    assert "event: error" in r.text and len(calls) == 3
    monkeypatch.undo()
    assert torch.equal(delta(engine, sae_id), expected) and not any_row(att, profile_row)
    assert httpx.get(base + "/api/steering", timeout=10).json()["live"] is True
    with httpx.Client(timeout=60) as http, http.stream(
            "POST", base + "/v1/chat/completions",
            json={"model": MODEL, "max_tokens": 500, "temperature": 0, "stream": True, "profile": name,
                  "messages": [{"role": "user", "content": "Count from 1 to 300, separated by commas."}]}) as stream:
        lines = stream.iter_lines()
        while True:  # wait for generated text, past the role chunk
            line = next(lines)
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break
        assert any_row(att, profile_row)  # the profile steers this request's row mid-request
        assert torch.equal(delta(engine, sae_id), expected)  # and the live values stay as they were
        assert httpx.get(base + "/api/steering", timeout=10).json()["live"] is False
    wait_idle(base)
    assert torch.equal(delta(engine, sae_id), expected) and not any_row(att, profile_row)
    assert httpx.get(base + "/api/steering", timeout=10).json()["live"] is True


def any_row(att, row: torch.Tensor) -> bool:
    """Whether some steering row of the attachment holds ``row``."""
    import torch

    return att.rows is not None and any(torch.allclose(r, row) for r in att.rows)


def test_operator_wins(base, sae_id, engine):
    import torch

    name = create_profile(base, "weather-up", [{"sae": sae_id, "feature": FEATURE, "strength": STRENGTH}])
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(chat, base, profile=name, max_tokens=40)
        wait_running(base, job)
        r = steer(base, sae_id, {"9": 4.0})
        assert r.status_code == 200 and r.json()["live"] is False
        assert job.result().status_code == 200
    after = httpx.get(base + "/api/steering", timeout=10).json()
    assert after["live"] is True and after["saes"][sae_id]["values"] == {"9": 4.0}
    att = engine.steering.attachments[sae_id]
    assert torch.allclose(att.delta, 4.0 * att.sae.W_dec[9])


def test_profile_management(base, sae_id):
    doc = {"name": "imported", "description": "d", "model": MODEL,
           "entries": [{"sae": sae_id, "feature": FEATURE, "strength": STRENGTH}]}
    assert httpx.post(base + "/api/profiles/import", json=doc, timeout=10).status_code == 201
    assert httpx.post(base + "/api/profiles/import", json=doc, timeout=10).status_code == 409
    doc2 = {**doc, "description": "changed"}
    assert httpx.post(base + "/api/profiles/import", params={"overwrite": "true"}, json=doc2,
                      timeout=10).status_code == 201
    exported = httpx.get(base + "/api/profiles/imported/export", timeout=10).json()
    assert exported == {**doc2, "steering_scope": "all"}
    bad = httpx.post(base + "/api/profiles", json={"name": "x", "entries": [{"sae": sae_id, "feature": -1,
                                                                                "strength": 1}]}, timeout=10)
    assert bad.status_code == 400 and "feature" in bad.json()["error"]["message"]
    r = httpx.post(base + "/api/profiles/imported/activate", timeout=10).json()
    assert r["active"] == "imported" and r["saes"][sae_id]["values"] == {str(FEATURE): STRENGTH}
    assert chat(base).headers["X-miLLM-Steering"] == '"imported"'
    httpx.post(base + "/api/profiles/deactivate", timeout=10)
    assert chat(base).headers["X-miLLM-Steering"] == "none"
    steer(base, sae_id, {"4": 3.0})
    saved = httpx.post(base + "/api/profiles", json={"name": "snap", "from_current": True}, timeout=10).json()
    assert saved["entries"] == [{"sae": sae_id, "feature": 4, "strength": 3.0}]
    assert httpx.delete(base + "/api/profiles/snap", timeout=10).status_code == 200
    assert httpx.get(base + "/api/profiles/snap", timeout=10).status_code == 404


def readout(base, ask, **body):
    r = chat(base, return_sae_activations=ask, **body)
    assert r.status_code == 200, r.text
    return r.json()


def test_readout_positions(base, sae_id, engine):
    full = readout(base, {"positions": "all", "top_k": 4})
    acts = full["millm"]["sae_activations"]
    prompt_len, completion = full["usage"]["prompt_tokens"], full["usage"]["completion_tokens"]
    read = [p["position"] for p in acts["positions"]]
    assert read == list(range(prompt_len + completion - 1))  # the final sampled token is never fed back
    assert acts["sae_id"] == sae_id and acts["layer"] == LAYER and acts["read_point"] == "post_steering"
    assert "not an unsteered counterfactual" in acts["note"]
    assert all(len(p["features"]) <= 4 for p in acts["positions"])
    ids = engine.tokenize(__import__("millm.engine.params", fromlist=["ChatPrompt"]).ChatPrompt(PROMPT))
    assert [p["token_id"] for p in acts["positions"][:prompt_len]] == ids
    last = readout(base, {"positions": "last"})["millm"]["sae_activations"]["positions"]
    assert [p["position"] for p in last] == [read[-1]]
    prompt = readout(base, {"positions": "prompt"})["millm"]["sae_activations"]["positions"]
    assert [p["position"] for p in prompt] == list(range(prompt_len))
    comp = readout(base, {"positions": "completion"})["millm"]["sae_activations"]["positions"]
    assert [p["position"] for p in comp] == list(range(prompt_len, read[-1] + 1))
    window = readout(base, {"positions": {"start": 3, "end": 6}})["millm"]["sae_activations"]["positions"]
    assert [p["position"] for p in window] == [3, 4, 5]
    assert acts["positions"][3]["features"] == window[0]["features"][:4]  # top_k defaults to 8


def test_readout_features_and_read_points(base, sae_id):
    steer(base, sae_id, {str(FEATURE): 50.0})
    ask = {"features": [FEATURE, 8], "positions": {"start": 0, "end": 4}}
    post = readout(base, {**ask, "read_point": "post_steering"})["millm"]["sae_activations"]
    pre = readout(base, {**ask, "read_point": "pre_steering"})["millm"]["sae_activations"]
    assert pre["read_point"] == "pre_steering"
    value = lambda acts, p: {f["index"]: f["value"] for f in acts["positions"][p]["features"]}  # noqa: E731
    for p in range(4):
        assert set(value(post, p)) == {FEATURE, 8}
        assert value(post, p)[FEATURE] > value(pre, p)[FEATURE]  # this layer's own delta shows only post


def test_readout_streaming_and_absence(base, sae_id):
    r = chat(base, stream=True, return_sae_activations={"positions": "last"})
    frames = r.text.strip().split("\n\n")
    assert frames[-1] == "data: [DONE]"
    final = json.loads(frames[-2][6:])
    assert final["choices"] == [] and final["millm"]["sae_activations"]["sae_id"] == sae_id
    assert json.loads(frames[-3][6:])["choices"][0]["finish_reason"] is not None
    assert "millm" not in chat(base).json()
    assert "millm" not in r.text.split("\n\n")[1]
    c = httpx.post(base + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "The sky is", "max_tokens": 3, "return_sae_activations": {"positions": "all"}})
    assert len(c.json()["millm"]["sae_activations"]["positions"]) == c.json()["usage"]["prompt_tokens"] + 2


@pytest.mark.parametrize("ask,body,needle", [
    ({}, {"n": 2}, "n = 1"),
    ({}, {"extra_messages": [PROMPT]}, "extra_messages"),
    ({"features": [5000]}, {}, "5000"),
    ({"top_k": 65}, {}, "SAE_ACTIVATIONS_MAX_TOP_K"),
    ({"top_k": 64, "positions": "all"}, {"max_tokens": 2000}, "SAE_ACTIVATIONS_MAX_ENTRIES"),
    ({"positions": "middle"}, {}, "positions"),
    ({"read_point": "later"}, {}, "read_point"),
    ({"sae_id": "sae_nope"}, {}, "not attached"),
])
def test_readout_refusals(base, sae_id, ask, body, needle):
    r = chat(base, return_sae_activations=ask, **body)
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


def test_readout_refusals_for_prompt_lists_and_several_saes(base, sae_id, sae_dirs):
    r = httpx.post(base + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": ["a", "b"], "max_tokens": 2, "return_sae_activations": {}})
    assert r.status_code == 400 and "one prompt" in r.json()["error"]["message"]
    second = httpx.post(base + "/api/saes", json={"path": str(sae_dirs["second"])}, timeout=30).json()["id"]
    httpx.post(base + f"/api/saes/{second}/attach", json={}, timeout=30)
    try:
        r = chat(base, return_sae_activations={})
        message = r.json()["error"]["message"]
        assert r.status_code == 400 and sae_id in message and second in message
        ok = chat(base, return_sae_activations={"sae_id": second})
        assert ok.json()["millm"]["sae_activations"]["layer"] == 20
    finally:
        httpx.post(base + f"/api/saes/{second}/detach", timeout=30)


def test_no_sae_attached(base, engine, settings):
    httpx.post(base + "/api/profiles", json={"name": "orphan", "entries": [{"sae": "sae_x", "feature": 1,
                                                                              "strength": 1.0}]}, timeout=10)
    saved = dict(engine.steering.attachments)
    for sid in list(saved):
        httpx.post(base + f"/api/saes/{sid}/detach", timeout=30)
    try:
        r = chat(base, profile="orphan")
        assert r.status_code == 200 and r.headers["X-miLLM-Steering"] == "none"
        r = chat(base, return_sae_activations={})
        assert r.status_code == 400 and "no SAE is attached" in r.json()["error"]["message"]
    finally:
        for sid, att in saved.items():
            httpx.post(base + f"/api/saes/{sid}/attach", json={"layer": att.layer}, timeout=30)


def test_monitoring(base, sae_id):
    cfg = httpx.put(base + "/api/monitoring", json={"enabled": True, "sae": sae_id, "features": [1, 2, FEATURE],
                                                     "history": 5}, timeout=10)
    assert cfg.status_code == 200 and cfg.json()["features"] == [1, 2, FEATURE]
    httpx.delete(base + "/api/monitoring/history", timeout=10)
    try:
        r = chat(base, max_tokens=4)
        history = httpx.get(base + "/api/monitoring/history", timeout=10).json()["data"]
        assert len(history) == 1 and history[0]["positions"] == r.json()["usage"]["prompt_tokens"] + 3
        assert set(history[0]["features"]) == {"1", "2", str(FEATURE)}
        stats = httpx.get(base + "/api/monitoring/stats", timeout=10).json()
        assert stats["positions"] == history[0]["positions"]
        httpx.post(base + "/v1/embeddings", json={"model": MODEL, "input": "nothing recorded"}, timeout=60)
        assert len(httpx.get(base + "/api/monitoring/history", timeout=10).json()["data"]) == 1
        for _ in range(6):
            chat(base, max_tokens=1)
        assert len(httpx.get(base + "/api/monitoring/history", timeout=10).json()["data"]) == 5
        bad = httpx.put(base + "/api/monitoring", json={"enabled": True, "sae": sae_id, "features": [99999]},
                        timeout=10)
        assert bad.status_code == 400
    finally:
        httpx.put(base + "/api/monitoring", json={"enabled": False}, timeout=10)


def _events(lines) -> Iterator[dict]:
    """The payloads of a server-sent events stream's ``monitoring`` events, as they arrive."""
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: ") and name == "monitoring":
            yield json.loads(line.removeprefix("data: "))


def test_monitoring_pushes_each_request_and_top_k_reads_every_feature(base, sae_id):
    from openai import OpenAI

    client = OpenAI(base_url=base + "/v1", api_key="none")
    httpx.put(base + "/api/monitoring", json={"enabled": True, "sae": sae_id, "top_k": 5}, timeout=10)
    httpx.delete(base + "/api/monitoring/history", timeout=10)
    try:
        with httpx.stream("GET", base + "/api/monitoring/events", timeout=60) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            events = _events(stream.iter_lines())
            first = next(events)
            assert first["config"]["top_k"] == 5 and first["stats"]["positions"] == 0
            with ThreadPoolExecutor(1) as pool:
                pool.submit(client.chat.completions.create, model=MODEL, messages=PROMPT, max_tokens=3,
                            temperature=0)
                pushed = next(e for e in events if e["stats"]["positions"])  # sent by the server, not asked for
        stats = httpx.get(base + "/api/monitoring/stats", timeout=10).json()
        assert pushed["stats"] == stats and len(stats["features"]) == 5
        history = httpx.get(base + "/api/monitoring/history", timeout=10).json()["data"]
        assert pushed["recent"] == history and len(history) == 1  # one request: its top 5 are the running top 5
        assert set(history[0]["features"]) == set(stats["features"])
        for f in stats["features"].values():
            assert f["min"] <= f["mean"] <= f["max"] and f["std"] >= 0 and 0 <= f["count"] <= stats["positions"]
    finally:
        httpx.put(base + "/api/monitoring", json={"enabled": False}, timeout=10)


def test_unload_detaches_every_hook(engine, settings, sae_id):
    import asyncio

    from millm.engine.manager import ModelManager
    from millm.engine.worker import EngineWorker

    saved = {sid: att.layer for sid, att in engine.steering.attachments.items()}
    assert saved
    manager = ModelManager(settings, EngineWorker(4), engine)
    asyncio.run(manager.unload())
    assert not engine.steering.attachments
    assert not any(layer._forward_hooks for layer in engine.model.model.layers)
    from millm.sae.formats import load_sae
    from millm.store import Store

    store = Store(settings.home / "millm.db")
    for sid, layer in saved.items():
        engine.steering.attach(sid, load_sae(store.sae(sid)["path"]).sae, layer)


def test_attach_during_a_generation_lands_between_steps(base, sae_dirs, engine, monkeypatch):
    """Steering changes are engine commands: an attach sent while a stream decodes is applied on the engine
    thread between two steps (without waiting for the stream to end), and both come out whole."""
    import threading

    sid = httpx.post(base + "/api/saes", json={"path": str(sae_dirs["second"])}, timeout=30).json()["id"]
    order: list[str] = []
    frames: list[str] = []
    threads: list[str] = []
    attach = engine.steering.attach

    def recording_attach(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return attach(*args, **kwargs)

    monkeypatch.setattr(engine.steering, "attach", recording_attach)

    def stream() -> None:
        body = {"model": MODEL, "messages": PROMPT, "max_tokens": 60, "temperature": 0, "stream": True,
                "stop": ["never-matches"]}
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    frames.append(line)
                    if len(frames) == 3:
                        order.append("streaming")
        order.append("stream done")

    try:
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(stream)
            wait_for(lambda: "streaming" in order, "the stream to start", done)
            attached = httpx.post(base + f"/api/saes/{sid}/attach", json={}, timeout=120)
            order.append("attached")
            done.result()
        assert attached.status_code == 200 and attached.json()["attached_layer"] == 20
        assert threads and all(name.startswith("millm-engine") for name in threads)
        assert order.index("attached") < order.index("stream done")  # it did not wait for the stream
        assert frames[-1] == "data: [DONE]" and not any('"error"' in f for f in frames)
        assert httpx.get(base + "/api/steering", timeout=30).json()["saes"][sid]["layer"] == 20
    finally:
        httpx.post(base + f"/api/saes/{sid}/detach", timeout=30)
