"""Faults on the bundled model: an exception inside a steering hook, the detokeniser or a constraint
mid-stream; clients leaving at random points under load; `kill -9` of `millm serve` during profile and
steering writes. Afterwards the steering state is what the operator last set, the store opens clean,
and the next request succeeds."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from millm.engine.decode.detok import IncrementalDetokenizer
from millm.store import Store
from tests.support.live import free_port, live_server
from tests.support.saes import random_sae, write_saelens

MODEL = "SmolLM2-135M-Instruct"
LAYER = 10
VALUES = {"3": 12.0, "9": -4.0}


def chat(stream: bool = True, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": 12,
            "temperature": 0, "stream": stream, **extra}


@pytest.fixture(scope="module")
def served(engine, settings, tmp_path_factory):
    """A live server with its own store, an SAE attached and operator values set; yields (url, sae id, home)."""
    from millm.server.app import create_app

    root = tmp_path_factory.mktemp("faults")
    folder = write_saelens(root / "sae", random_sae(576, 64, seed=21), layer=LAYER)
    home = root / "home"
    with live_server(create_app(settings.model_copy(update={"home": home}), engine)) as url:
        sid = httpx.post(url + "/api/saes", json={"path": str(folder)}, timeout=30).json()["id"]
        httpx.post(url + f"/api/saes/{sid}/attach", json={}, timeout=30)
        assert httpx.put(url + "/api/steering", json={"sae": sid, "values": VALUES}, timeout=30).status_code == 200
        try:
            yield url, sid, home
        finally:
            httpx.delete(url + "/api/steering", timeout=30)
            httpx.post(url + f"/api/saes/{sid}/detach", timeout=30)


def frames(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def assert_recovered(url: str, sid: str, home: Path) -> None:
    """The steering state is what the operator set, the store is sound, and a next request succeeds."""
    state = httpx.get(url + "/api/steering", timeout=30).json()
    assert state["enabled"] and state["saes"][sid]["values"] == VALUES and state["live"]
    with sqlite3.connect(home / "millm.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    r = httpx.post(url + "/v1/chat/completions", json=chat(stream=False), timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    assert r.headers["X-miLLM-Steering"] == "live"


def fails_on_call(n: int, original):
    """``original`` wrapped to raise RuntimeError on its ``n``-th call."""
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise RuntimeError("injected fault")
        return original(*args, **kwargs)
    return wrapped


def stream_fails_cleanly(url: str, body: dict) -> None:
    """A streamed request reports the fault in-stream and still ends; a plain one answers an OpenAI error."""
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    if not body["stream"]:
        error = r.json()["error"]
        assert r.status_code == 500 and "injected fault" in error["message"] and error["type"] == "server_error"
        return
    data = frames(r.text)
    assert r.status_code == 200 and data[-1] == "[DONE]"
    errors = [json.loads(d)["error"] for d in data[:-1] if '"error"' in d]
    assert len(errors) == 1 and "injected fault" in errors[0]["message"]


def test_exception_inside_a_steering_hook(served, engine):
    url, sid, home = served
    steering = engine.steering_target().steering
    assert sid in steering.attachments
    steering._row_hook = fails_on_call(4, steering._row_hook)  # the hook every scheduler forward runs
    try:
        stream_fails_cleanly(url, chat())
    finally:
        del steering._row_hook
    assert_recovered(url, sid, home)


def test_exception_inside_the_detokeniser(served, monkeypatch):
    url, sid, home = served
    monkeypatch.setattr(IncrementalDetokenizer, "push", fails_on_call(3, IncrementalDetokenizer.push))
    stream_fails_cleanly(url, chat())
    monkeypatch.undo()
    assert_recovered(url, sid, home)


def test_exception_inside_a_constraint(served, monkeypatch):
    from millm.structured.constraint import RowGuides

    url, sid, home = served
    monkeypatch.setattr(RowGuides, "advance", fails_on_call(3, RowGuides.advance))
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    stream_fails_cleanly(url, chat(stream=False, response_format={  # the whole-body path (streams: test_tools_model)
        "type": "json_schema", "json_schema": {"name": "thing", "schema": schema}}))
    monkeypatch.undo()
    assert_recovered(url, sid, home)


def test_clients_leaving_at_random_points_under_load(served, engine):
    url, sid, home = served
    rng = random.Random(7)
    leave_after = [rng.randint(0, 8) for _ in range(24)]

    def one(k: int) -> int:
        with httpx.stream("POST", url + "/v1/chat/completions", json=chat(max_tokens=24), timeout=120) as r:
            if r.status_code != 200:
                return r.status_code
            for i, _ in enumerate(r.iter_lines()):
                if i >= k:
                    break  # the client leaves: the connection closes mid-stream
        return 200

    with ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(one, leave_after))
    assert set(codes) <= {200, 503}
    worker = httpx.get(url + "/api/health/inference", timeout=30).json()
    deadline = time.monotonic() + 120  # abandoned work is dropped between steps; wait for it to drain
    while worker["in_flight"] or worker["queue_depth"]:
        assert time.monotonic() < deadline, worker
        time.sleep(0.2)
        worker = httpx.get(url + "/api/health/inference", timeout=30).json()
    assert_recovered(url, sid, home)


def start_server(home: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "MILLM_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/health/ready", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "millm serve did not start"
        time.sleep(0.3)


@pytest.mark.model
def test_kill_9_during_profile_and_steering_writes(tmp_path):
    home, port = tmp_path / "home", free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(home, port)
    try:
        sae = next(s for s in httpx.get(base + "/api/saes", timeout=30).json()["data"]
                   if s["name"] == "smollm2-135m-res-L10")
        assert httpx.post(base + f"/api/saes/{sae['id']}/attach", json={}, timeout=60).status_code == 200
        acked: list[int] = []  # the writes the server confirmed, in order
        sent: list[int] = []
        stop = threading.Event()

        def writer() -> None:
            i = 0
            with httpx.Client(base_url=base, timeout=30) as client:
                while not stop.is_set():
                    i += 1
                    sent.append(i)
                    try:
                        entries = [{"sae": sae["id"], "feature": f, "strength": float(i)} for f in range(50)]
                        client.put(f"/api/profiles/p{i % 3}", json={"entries": entries}) if i > 3 else \
                            client.post("/api/profiles", json={"name": f"p{i % 3}", "entries": entries})
                        r = client.put("/api/steering", json={"sae": sae["id"], "values": {"5": float(i)}})
                    except httpx.TransportError:
                        return
                    if r.status_code == 200:
                        acked.append(i)

        thread = threading.Thread(target=writer)
        thread.start()
        time.sleep(3.0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        stop.set()
        thread.join(timeout=30)
        assert acked, "nothing was written before the kill"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    store = Store(home / "millm.db")  # opens clean
    with sqlite3.connect(home / "millm.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    for p in store.profiles():
        assert len(p["entries"]) == 50 and len({e["strength"] for e in p["entries"]}) == 1  # never half-written
    store.close()

    proc = start_server(home, port)
    try:
        values = httpx.get(base + "/api/steering", timeout=30).json()["saes"][sae["id"]]["values"]
        assert values["5"] in {float(acked[-1]), float(acked[-1] + 1)}  # the last confirmed, or the one in flight
        r = httpx.post(base + "/v1/chat/completions", json=chat(stream=False), timeout=120)
        assert r.status_code == 200 and r.headers["X-miLLM-Steering"] == "live"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
