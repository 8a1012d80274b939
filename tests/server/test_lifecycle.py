"""Model lifecycle against scripted engines: checked loads, failed loads, swaps racing streams, the
graceful-unload timeout, out-of-memory errors, the lock and /api/models (fast tier)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest

from millm.config import Settings
from millm.engine import preflight
from millm.errors import InsufficientMemory, UnsupportedQuantization
from millm.registry import ModelEntry
from tests.support.fakes import SCRIPT, FakeEngine
from tests.support.lab import Lab, answer, chat


class OutOfMemoryError(RuntimeError):
    """Named like torch's: the worker types any backend's out-of-memory error by name."""


def test_a_load_refused_before_unload_keeps_the_old_model_serving(tmp_path):
    lab = Lab(tmp_path)

    async def scenario(client):
        refused = await answer(await client.post("/v1/chat/completions", json=chat("refused")))
        still = await answer(await client.post("/v1/chat/completions", json=chat()))
        return refused, still

    (status, body), (s2, b2) = lab.run(scenario)
    assert status == 400 and body["error"]["code"] == "unsupported_quantization"
    assert s2 == 200 and b2["model"] == "fake" and not lab.old.closed and lab.loaded == []


def test_a_load_failing_after_unload_is_500_and_the_next_request_loads(tmp_path):
    lab = Lab(tmp_path)

    async def scenario(client):
        failed = await answer(await client.post("/v1/chat/completions", json=chat("broken")))
        state = (await (await client.get("/api/models/broken")).get_json())
        recovered = await answer(await client.post("/v1/chat/completions", json=chat("good")))
        return failed, state, recovered

    (status, body), state, (s2, b2) = lab.run(scenario)
    assert status == 500 and body["error"]["code"] == "model_load_failed"
    assert state["state"] == "ERROR" and "corrupt" in state["error"]
    assert s2 == 200 and b2["model"] == "good" and lab.loaded == ["good"]


def test_after_an_operator_unload_requests_say_no_model_is_loaded(tmp_path):
    lab = Lab(tmp_path)

    async def scenario(client):
        await client.post("/api/models/fake/unload")
        refused = await answer(await client.post("/v1/chat/completions", json=chat("good")))
        loaded = await answer(await client.post("/api/models/good/load"))
        served = await answer(await client.post("/v1/chat/completions", json=chat("good")))
        return refused, loaded, served

    (status, body), (ls, lb), (ss, sb) = lab.run(scenario)
    assert status == 503 and body["error"]["code"] == "model_not_loaded" and lab.old.closed
    assert ls == 200 and lb["state"] == "LOADED" and ss == 200 and sb["model"] == "good"


def test_a_path_is_not_a_model_name_over_http(tmp_path):
    from millm.server.app import create_app

    settings = Settings(home=tmp_path)
    engine = FakeEngine()
    app = create_app(settings, engine)
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")

    async def scenario(client):
        r = await client.post("/v1/chat/completions", json=chat(str(checkpoint)))
        return await answer(r)

    async def main():
        async with app.test_app():
            return await scenario(app.test_client())

    status, body = asyncio.run(main())
    assert status == 404 and body["error"]["code"] == "model_not_found" and not engine.closed


def test_a_swap_waits_for_an_admitted_stream(tmp_path):
    lab = Lab(tmp_path)
    lab.old.gate.clear()

    async def scenario(client):
        stream = asyncio.create_task(client.post("/v1/chat/completions", json=chat(stream=True, max_tokens=5)))
        await asyncio.to_thread(lab.old.started.wait, 10)
        swap = asyncio.create_task(client.post("/v1/chat/completions", json=chat("good")))
        while (await (await client.get("/api/models/fake")).get_json())["state"] != "UNLOADING":
            await asyncio.sleep(0.01)
        states = {m: (await (await client.get(f"/api/models/{m}")).get_json())["state"] for m in ("fake", "good")}
        assert not lab.old.closed  # the admitted stream holds the old model
        lab.old.gate.set()
        done = await stream
        swapped = await answer(await swap)
        after = {m: (await (await client.get(f"/api/models/{m}")).get_json())["state"] for m in ("fake", "good")}
        return await done.get_data(), swapped, states, after

    data, (status, body), states, after = lab.run(scenario)
    assert states == {"fake": "UNLOADING", "good": "LOADING"} and after == {"fake": "READY", "good": "LOADED"}
    frames = [f for f in data.decode().split("\n\n") if f]
    text = "".join(json.loads(f[6:])["choices"][0]["delta"].get("content", "") for f in frames[1:-1])
    assert text == SCRIPT[:5] and frames[-1] == "data: [DONE]"
    assert status == 200 and body["model"] == "good" and lab.old.closed


def test_the_graceful_timeout_cancels_what_still_runs_with_a_clean_error(tmp_path):
    lab = Lab(tmp_path, graceful_unload_timeout=0)
    lab.old.pause_after = 1

    async def scenario(client):
        stream = asyncio.create_task(client.post("/v1/chat/completions", json=chat(stream=True, max_tokens=50)))
        await asyncio.to_thread(lab.old.started.wait, 10)
        swap = await answer(await client.post("/v1/chat/completions", json=chat("good")))
        lab.old.gate.set()
        return await (await stream).get_data(), swap

    data, (status, body) = lab.run(scenario)
    frames = [f for f in data.decode().split("\n\n") if f]
    assert frames[-2].startswith("event: error") and '"model_busy"' in frames[-2] and frames[-1] == "data: [DONE]"
    assert status == 200 and body["model"] == "good" and lab.old.closed


def test_out_of_memory_while_scoring_is_a_typed_503(tmp_path):
    lab = Lab(tmp_path)

    def exhausted(request: Any) -> Any:
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0)")

    lab.old.score = exhausted  # type: ignore[method-assign]

    async def scenario(client):
        return await answer(await client.post("/v1/completions", json={"model": "fake", "prompt": "x",
                                                                        "max_tokens": 1, "logprobs": 1}))

    status, body = lab.run(scenario)
    assert status == 503 and body["error"]["code"] == "insufficient_memory"


@pytest.mark.parametrize("stream", [False, True])
def test_out_of_memory_during_generation_is_a_typed_503_and_the_engine_stays_usable(tmp_path, stream):
    lab = Lab(tmp_path)
    lab.old.fail_at = (2, OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0)"))

    async def scenario(client):
        first = await client.post("/v1/chat/completions", json=chat(stream=stream))
        body = await first.get_data()
        lab.old.fail_at = None
        again = await answer(await client.post("/v1/chat/completions", json=chat()))
        return first.status_code, body, again

    status, body, (s2, b2) = lab.run(scenario)
    if stream:
        frames = [f for f in body.decode().split("\n\n") if f]
        assert frames[-2].startswith("event: error") and "insufficient_memory" in frames[-2]
        assert frames[-1] == "data: [DONE]"
    else:
        error = json.loads(body)["error"]
        assert status == 503 and error["code"] == "insufficient_memory" and error["type"] == "invalid_request_error"
        assert "GPU 0" in error["message"]
    assert s2 == 200 and b2["model"] == "fake"


def test_the_lock_serves_one_model(tmp_path):
    lab = Lab(tmp_path)

    async def scenario(client):
        locked = await answer(await client.post("/api/models/fake/lock"))
        listed = await (await client.get("/v1/models")).get_json()
        other = await answer(await client.post("/v1/chat/completions", json=chat("good")))
        await client.post("/api/models/fake/unlock")
        after = await answer(await client.post("/v1/chat/completions", json=chat("good")))
        return locked, listed, other, after

    (ls, lb), listed, (os_, ob), (as_, ab) = lab.run(scenario)
    assert ls == 200 and lb["locked"] is True
    assert [m["id"] for m in listed["data"]] == ["fake"]
    assert os_ == 409 and ob["error"]["code"] == "model_locked" and "fake" in ob["error"]["message"]
    assert as_ == 200 and ab["model"] == "good"


def test_api_models_register_states_and_delete(tmp_path):
    from millm.server.app import create_app

    settings = Settings(home=tmp_path)
    app = create_app(settings, FakeEngine())
    checkpoint = tmp_path / "my-model"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")

    async def scenario(client):
        missing = await answer(await client.post("/api/models", json={"path": str(tmp_path / "nope")}))
        added = await answer(await client.post("/api/models", json={"path": str(checkpoint)}))
        listed = await (await client.get("/api/models")).get_json()
        deleted = await answer(await client.delete("/api/models/my-model"))
        loaded = await answer(await client.delete("/api/models/fake"))
        return missing, added, listed, deleted, loaded

    async def main():
        async with app.test_app():
            return await scenario(app.test_client())

    missing, added, listed, deleted, loaded = asyncio.run(main())
    assert missing[0] == 400 and missing[1]["error"]["param"] == "path"
    assert added[0] == 201 and added[1]["state"] == "READY" and added[1]["source"] == "path"
    states = {m["id"]: m["state"] for m in listed["data"]}
    assert states["fake"] == "LOADED" and states["my-model"] == "READY"
    assert deleted == (200, {"deleted": "my-model"}) and checkpoint.exists()
    assert loaded[0] == 400


def test_quantization_and_memory_checks(tmp_path):
    ckpt = tmp_path / "q2"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "hqq", "nbits": 2}}))
    q2 = ModelEntry(id="q2", engine="transformers", source="path", path=ckpt)
    with pytest.raises(UnsupportedQuantization, match="2 bits"):
        preflight.footprint(q2, 4)
    need = preflight.Footprint(weights=3 * preflight.GIB, kv=preflight.GIB)
    with pytest.raises(InsufficientMemory) as info:
        preflight.check_memory(q2, need, {"cuda:0": 2 * preflight.GIB, "cuda:1": preflight.GIB})
    assert "cuda:0: 2.00 GiB free" in info.value.message and "4.00 GiB" in info.value.message
    preflight.check_memory(q2, need, {"cpu": 3 * preflight.GIB}, freed={"cpu": preflight.GIB})  # unloading frees enough
    preflight.check_memory(q2, need, {"cuda:0": 2 * preflight.GIB, "cuda:1": 2 * preflight.GIB})  # split fits


def test_a_model_no_card_holds_is_placed_across_cards_by_layers():
    """The placement plan from per-card memory figures (accelerate's device map), on a tiny Llama."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from millm.engine.loader import placement

    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                         num_attention_heads=4, vocab_size=256))
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    assert placement(model, {0: 4 * size}) is None  # one card holds it
    plan = placement(model, {0: size * 6 // 10, 1: size * 6 // 10})
    assert plan is not None and set(plan.values()) == {0, 1}
    layers = [plan[f"model.layers.{i}"] for i in range(4)]
    assert layers == sorted(layers) and plan["model.embed_tokens"] == 0 and plan["model.norm"] == 1
    with pytest.raises(InsufficientMemory):
        placement(model, {0: size // 4, 1: size // 4})


def test_registering_paths_refuses_taken_ids_and_forgets_missing_files(tmp_path):
    from millm.errors import InvalidParameter
    from millm.registry import list_models, register_path, registered, unregister

    settings = Settings(home=tmp_path)
    (settings.models_dir / "local").mkdir(parents=True)
    (settings.models_dir / "local" / "config.json").write_text("{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("{}")
    with pytest.raises(InvalidParameter, match="taken"):
        register_path(elsewhere, settings, "local")  # a folder in MILLM_HOME/models has that id
    first = register_path(elsewhere, settings, "mine")
    assert register_path(elsewhere, settings, "mine") == first  # the same path again changes nothing
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    with pytest.raises(InvalidParameter, match="taken"):
        register_path(other, settings, "mine")
    assert [e.id for e in list_models(settings)].count("mine") == 1
    (elsewhere / "config.json").unlink()
    elsewhere.rmdir()
    assert registered(settings) == [] and unregister("mine", settings)


@pytest.mark.parametrize("engine_name,backend", [("llama.cpp", "serial"), ("transformers", "cbm")])
def test_the_health_route_names_the_backend_that_serves_the_loaded_model(tmp_path, engine_name, backend):
    """With batching on, a llama.cpp model is still served one request at a time: the route says serial."""
    from millm.server.app import create_app

    engine = FakeEngine(engine_name=engine_name)
    if engine_name == "transformers":
        engine.capabilities = dataclasses.replace(engine.capabilities, batchable=True)
    app = create_app(Settings(home=tmp_path, batching=True), engine)

    async def scenario() -> dict[str, Any]:
        async with app.test_app():
            return await (await app.test_client().get("/api/health/inference")).get_json()

    body = asyncio.run(scenario())
    assert body["backend"] == backend and body["engine"] == engine_name
    assert ("batch" in body) == (backend == "cbm")
    assert body["fingerprint"] == engine.fingerprint and body["context_window"] == engine.context_window
