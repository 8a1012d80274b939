"""GET /metrics: Prometheus text with the requests, tokens, latencies, queue and model the server saw."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from millm.config import Settings
from tests.support.fakes import FakeEngine
from tests.support.live import live_server
from tests.support.saes import random_sae, write_saelens


def make(tmp_path: Path, **kw: Any) -> Any:
    from millm.server.app import create_app

    return create_app(Settings(home=tmp_path, **kw), FakeEngine())  # type: ignore[arg-type]


def run(app: Any, scenario: Callable[[Any], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with app.test_app():
            return await scenario(app.test_client())
    return asyncio.run(main())


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def chat(stream: bool = False) -> dict[str, Any]:
    return {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": stream}


def test_requests_tokens_and_latencies_are_counted(tmp_path):
    app = make(tmp_path)

    async def scenario(client):
        plain = await client.post("/v1/chat/completions", json=chat())
        streamed = await client.post("/v1/chat/completions", json=chat(stream=True))
        await streamed.get_data()
        embedded = await client.post("/v1/embeddings", json={"model": "fake", "input": ["abc", "de"]})
        await client.post("/v1/chat/completions", json={"model": "fake"})  # 400
        await client.get("/nowhere")
        scrape = await client.get("/metrics")
        return await plain.get_json(), await embedded.get_json(), scrape
    plain, embedded, scrape = run(app, scenario)
    assert scrape.status_code == 200 and scrape.content_type.startswith("text/plain")
    found = samples((asyncio.run(scrape.get_data())).decode())
    chat_route = "/v1/chat/completions"
    assert value(found, "millm_requests_total", route=chat_route, method="POST", status="200") == 2
    assert value(found, "millm_requests_total", route=chat_route, method="POST", status="400") == 1
    assert value(found, "millm_requests_total", route="unmatched", method="GET", status="404") == 1
    prompt = 2 * plain["usage"]["prompt_tokens"] + embedded["usage"]["prompt_tokens"]
    assert value(found, "millm_prompt_tokens_total") == prompt
    assert value(found, "millm_completion_tokens_total") == 2 * plain["usage"]["completion_tokens"] == 10
    assert value(found, "millm_time_to_first_token_seconds_count") == 2
    assert value(found, "millm_request_latency_seconds_count", route=chat_route) == 3  # the stream counted at its end
    assert value(found, "millm_model_loaded", model="fake", engine="transformers") == 1
    assert value(found, "millm_queue_depth") == 0 and value(found, "millm_requests_running") == 0
    assert value(found, "millm_steering_enabled") == 0 and value(found, "millm_steered_requests_total") == 0
    rss = value(found, "process_resident_memory_bytes")
    assert 10 * 2**20 < rss <= value(found, "millm_peak_resident_memory_bytes")  # this process, in bytes


def test_each_app_has_its_own_registry(tmp_path):
    first, second = make(tmp_path / "a"), make(tmp_path / "b")

    async def hit(client):
        await client.post("/v1/chat/completions", json=chat())
        return (await (await client.get("/metrics")).get_data()).decode()
    run(first, hit)
    found = samples(run(second, hit))
    assert value(found, "millm_requests_total", route="/v1/chat/completions", method="POST", status="200") == 1


def test_metrics_need_the_api_key_when_set(tmp_path):
    app = make(tmp_path, api_key="k")

    async def scenario(client):
        return ((await client.get("/metrics")).status_code,
                (await client.get("/metrics", headers={"Authorization": "Bearer k"})).status_code)
    assert run(app, scenario) == (401, 200)


def test_queue_depth_reads_the_worker(tmp_path):
    app = make(tmp_path)
    services = app.extensions["millm"]
    services.worker._pending = 3  # three admitted, one running: two wait
    services.worker._running = 1
    found = samples(app.extensions["millm_metrics"].render().decode())
    assert value(found, "millm_queue_depth") == 2 and value(found, "millm_requests_running") == 1


def test_usage_is_found_at_the_end_of_a_body():
    from millm.server.metrics import usage_of

    assert usage_of(b'{"data": [{"embedding": [1, 2]}], "usage": {"prompt_tokens": 7, "total_tokens": 7}}') == (7, 0)
    assert usage_of(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}, "x": 1}') == (3, 4)
    assert usage_of(b'{"data": []}') is None and usage_of(b'{"usage": [}') is None


def test_steered_requests_and_steering_state_on_the_model(engine, settings, tmp_path):
    from millm.server.app import create_app

    folder = write_saelens(tmp_path / "sae", random_sae(576, 64, seed=5), layer=10)
    app = create_app(settings.model_copy(update={"home": tmp_path / "home"}), engine)
    with live_server(app) as base:
        sid = httpx.post(base + "/api/saes", json={"path": str(folder)}, timeout=30).json()["id"]
        httpx.post(base + f"/api/saes/{sid}/attach", json={}, timeout=30)
        try:
            body = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 2}
            httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
            httpx.put(base + "/api/steering", json={"sae": sid, "values": {"1": 10.0}}, timeout=30)
            steered = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
            found = samples(httpx.get(base + "/metrics", timeout=30).text)
        finally:
            httpx.delete(base + "/api/steering", timeout=30)
            httpx.post(base + f"/api/saes/{sid}/detach", timeout=30)
    assert steered.headers["X-miLLM-Steering"] == "live"
    assert value(found, "millm_steered_requests_total") == 1
    assert value(found, "millm_steering_enabled") == 1 and value(found, "millm_steering_active") == 1


def test_engine_busy_seconds_grow_with_work(tmp_path):
    app = make(tmp_path)

    async def scenario(client):
        before = samples((await (await client.get("/metrics")).get_data()).decode())
        await client.post("/v1/chat/completions", json=chat())
        after = samples((await (await client.get("/metrics")).get_data()).decode())
        return before, after
    before, after = run(app, scenario)
    assert value(after, "millm_engine_busy_seconds_total") > value(before, "millm_engine_busy_seconds_total")
