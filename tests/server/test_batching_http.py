"""Continuous batching through the live server (MILLM_BATCHING on), on the bundled model."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from millm.engine.events import Delta
from millm.engine.params import ChatPrompt, GenerationRequest, SamplingParams
from tests.support.live import live_server
from tests.support.saes import random_sae

MODEL = "SmolLM2-135M-Instruct"
SAE_ID = "sae_batch_http"


def body(content: str, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0, **extra}


def alone(engine, content: str, max_tokens: int, stop: tuple[str, ...] = ()) -> str:
    request = GenerationRequest([ChatPrompt([{"role": "user", "content": content}])],
                                SamplingParams(temperature=0.0, max_tokens=max_tokens, stop=stop))
    return "".join(e.text for e in engine.generate(request) if isinstance(e, Delta))


def streamed(base: str, payload: dict, pieces: list[str] | None = None) -> str:
    """The streamed text; each content piece is appended to ``pieces`` as it arrives, when given."""
    text = [] if pieces is None else pieces
    with httpx.stream("POST", base + "/v1/chat/completions", json={**payload, "stream": True}, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                if chunk["choices"] and (content := chunk["choices"][0]["delta"].get("content")):
                    text.append(content)
    return "".join(text)


def inference(base: str) -> dict:
    return httpx.get(base + "/api/health/inference", timeout=10).json()


@pytest.fixture(scope="module")
def batching(engine, settings) -> Iterator[str]:
    from millm.server.app import create_app

    on = settings.model_copy(update={"batching": True, "batch_max_rows": 4, "batch_max_tokens": 4 * 512})
    with live_server(create_app(on, engine)) as base:
        yield base


def test_concurrent_streams_each_equal_alone(engine, batching):
    asks = [("Name three fruits.", 12, ()), ("What is the capital of Italy?", 6, ()),
            ("Count from one to ten.", 24, (" five",)), ("Say hello in French.", 9, ())]
    expected = [alone(engine, c, n, stop) for c, n, stop in asks]
    payloads = [body(c, max_tokens=n, stop=list(stop) or None) for c, n, stop in asks]
    with ThreadPoolExecutor(len(asks)) as pool:
        got = list(pool.map(lambda p: streamed(batching, p), payloads))
    assert got == expected
    health = inference(batching)
    assert health["backend"] == "cbm" and health["batch"]["batched_requests"] >= len(asks)
    assert health["batch"]["active_rows"] == 0


def test_fallbacks_run_serially_and_are_counted(batching):
    before = inference(batching)["batch"]["serial_fallbacks"]
    seeded = httpx.post(batching + "/v1/chat/completions", json=body("Hi", max_tokens=3, seed=7), timeout=120)
    several = httpx.post(batching + "/v1/chat/completions", json=body("Hi", max_tokens=3, n=2), timeout=120)
    extra = httpx.post(batching + "/v1/chat/completions", timeout=120,
                       json=body("Hi", max_tokens=3, extra_messages=[[{"role": "user", "content": "Bye"}]]))
    assert seeded.status_code == several.status_code == extra.status_code == 200
    assert seeded.headers["X-miLLM-Seed"] == '7;scope="request"'
    after = inference(batching)["batch"]["serial_fallbacks"]
    for reason in ("seed", "n", "extra_messages"):
        assert after.get(reason, 0) == before.get(reason, 0) + 1, reason


def test_a_serial_request_does_not_wait_for_the_batch_to_drain(batching):
    started, finished = threading.Event(), threading.Event()

    def long_stream() -> None:
        with httpx.stream("POST", batching + "/v1/chat/completions", timeout=600,
                          json={**body("Tell me a very long story.", max_tokens=160), "stream": True}) as r:
            for line in r.iter_lines():
                if '"content"' in line:
                    started.set()
        finished.set()

    with ThreadPoolExecutor(1) as pool:
        batched = pool.submit(long_stream)
        assert started.wait(300)
        seeded = httpx.post(batching + "/v1/chat/completions", json=body("Hi", max_tokens=3, seed=1), timeout=300)
        assert seeded.status_code == 200
        assert not finished.is_set()  # answered while the batched stream was still decoding
        batched.result()


def test_seeded_text_does_not_depend_on_batch_traffic(batching):
    seeded = body("Invent a word.", max_tokens=8, temperature=1.0, seed=11)
    quiet = httpx.post(batching + "/v1/chat/completions", json=seeded, timeout=120).json()
    with ThreadPoolExecutor(3) as pool:
        traffic = [pool.submit(streamed, batching, body("Tell me a story.", max_tokens=16, temperature=1.0))
                   for _ in range(2)]
        busy = pool.submit(httpx.post, batching + "/v1/chat/completions", json=seeded, timeout=120).result().json()
        [t.result() for t in traffic]
    assert busy["choices"][0]["message"]["content"] == quiet["choices"][0]["message"]["content"]


def test_response_format_is_batched_and_refused_only_under_the_setting(engine, settings, batching):
    from millm.server.app import create_app

    honoured = httpx.post(batching + "/v1/chat/completions", timeout=120,
                          json=body("JSON please", response_format={"type": "json_object"}, max_tokens=8))
    assert honoured.status_code == 200 and honoured.headers["X-miLLM-Constrained"] == "json_object"
    from tests.support.live import live_server

    refusing = settings.model_copy(update={"batching": True, "batching_constraints": "refuse"})
    with live_server(create_app(refusing, engine)) as base:
        r = httpx.post(base + "/v1/chat/completions", timeout=30,
                       json=body("JSON please", response_format={"type": "json_object"}))
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "response_format" and "batching" in error["message"]


def test_disconnect_retires_only_its_row(engine, batching):
    keep = body("Write a short poem about snow.", max_tokens=20)
    expected = alone(engine, "Write a short poem about snow.", 20)
    started = threading.Event()

    def leave_early() -> None:
        with httpx.stream("POST", batching + "/v1/chat/completions", timeout=300,
                          json={**body("Tell me a very long story.", max_tokens=200), "stream": True}) as r:
            for line in r.iter_lines():
                if '"content"' in line:
                    started.set()
                    return

    with ThreadPoolExecutor(2) as pool:
        gone = pool.submit(leave_early)
        assert started.wait(120)
        kept = pool.submit(streamed, batching, keep)
        gone.result()
        assert kept.result() == expected
    assert inference(batching)["batch"]["active_rows"] == 0


def test_scoring_and_embeddings_between_steps_leave_batched_rows_steered(engine, batching):
    prompt, tokens = "Describe your favourite hobby.", 64
    engine.steering.attach(SAE_ID, random_sae(engine.steering.d_model, 32, seed=3), 10)
    try:
        engine.steering.set_values(SAE_ID, {5: -60.0}, merge=False)
        expected = alone(engine, prompt, tokens)
        engine.steering.set_enabled(False)
        unsteered = alone(engine, prompt, tokens)
        engine.steering.set_enabled(True)
        assert expected != unsteered
        pieces: list[str] = []
        with ThreadPoolExecutor(1) as pool:
            gen = pool.submit(streamed, batching, body(prompt, max_tokens=tokens), pieces)
            while not pieces:  # the steered row is decoding in the batch
                assert not gen.done(), gen.result()
                threading.Event().wait(0.01)
            for _ in range(2):
                emb = httpx.post(batching + "/v1/embeddings", json={"model": MODEL, "input": "snow"}, timeout=120)
                score = httpx.post(batching + "/v1/completions", timeout=120,
                                   json={"model": MODEL, "prompt": "The sky is", "max_tokens": 1, "logprobs": 1})
                assert emb.status_code == score.status_code == 200
            between = len(pieces)
            assert gen.result() == expected
        assert len(pieces) > between  # the row went on decoding after both ran between its steps
    finally:
        engine.steering.detach(SAE_ID)


def test_queue_full_before_the_stream_starts(engine, settings):
    from millm.server.app import create_app

    tight = settings.model_copy(update={"batching": True, "batch_max_rows": 1, "max_queue": 2})
    with live_server(create_app(tight, engine)) as base:
        def one(_: int) -> tuple[int, str]:
            with httpx.stream("POST", base + "/v1/chat/completions", timeout=300,
                              json={**body("Count to five.", max_tokens=12), "stream": True}) as r:
                return r.status_code, r.read().decode()

        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(one, range(6)))
    refused = [text for status, text in results if status == 503]
    assert refused and len(refused) < 6
    assert all(json.loads(text)["error"]["code"] == "queue_full" for text in refused)  # a JSON error, no stream
    assert all("[DONE]" in text for status, text in results if status == 200)


def test_two_stored_profiles_in_one_batch_each_as_served_serially(server, batching, tmp_path):
    from tests.support.saes import write_saelens

    folder = write_saelens(tmp_path / "sae", random_sae(576, 64, seed=3), layer=10)
    sid = httpx.post(batching + "/api/saes", json={"path": str(folder)}, timeout=30).json()["id"]
    assert httpx.post(batching + f"/api/saes/{sid}/attach", json={}, timeout=30).status_code == 200
    try:
        for name, feature, strength in (("batch-a", 1, 40.0), ("batch-b", 5, -60.0)):
            entries = [{"sae": sid, "feature": feature, "strength": strength}]
            r = httpx.post(batching + "/api/profiles", json={"name": name, "entries": entries}, timeout=10)
            assert r.status_code == 201, r.text
        payloads = [body("Describe your favourite hobby.", max_tokens=16, profile=p) for p in ("batch-a", "batch-b")]
        payloads.append(body("Describe your favourite hobby.", max_tokens=16))
        expected = [streamed(server, p) for p in payloads]  # the serial server, one request at a time
        assert len(set(expected)) == 3
        with ThreadPoolExecutor(3) as pool:
            assert list(pool.map(lambda p: streamed(batching, p), payloads)) == expected
        assert "profile" not in inference(batching)["batch"]["serial_fallbacks"]
    finally:
        for name in ("batch-a", "batch-b"):
            httpx.delete(batching + f"/api/profiles/{name}", timeout=10)
        httpx.post(batching + f"/api/saes/{sid}/detach", timeout=30)
