"""An unload waits for every request that passed its model check, not only for the jobs the worker holds:
a request between two of its engine jobs (prepared, not yet admitted to generate) is neither queued nor
running, and before the lease it ran on a closed engine (a segfault on llama.cpp) (fast tier)."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.fakes import SCRIPT
from tests.support.lab import Lab, answer, chat


def holding_generation(lab: Lab) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold every request after its preparation, before its generation is admitted; (reached, go)."""
    worker = lab.app.extensions["millm"].worker
    original = worker.generate
    reached, go = asyncio.Event(), asyncio.Event()

    async def held(engine: Any, plans: Any, check: Any = None) -> Any:
        reached.set()
        await go.wait()
        return await original(engine, plans, check)

    worker.generate = held
    return reached, go


async def state(client: Any, model: str) -> str:
    return (await (await client.get(f"/api/models/{model}")).get_json())["state"]


async def swap_behind_a_held_request(lab: Lab, client: Any) -> tuple[asyncio.Event, Any, Any]:
    """A request held after its preparation, then a swap to "good" asked for; returns once the unload has
    begun (or the old engine is already closed): (go, the request's task, the swap's task)."""
    reached, go = holding_generation(lab)
    request = asyncio.create_task(client.post("/v1/chat/completions", json=chat()))
    await reached.wait()
    swap = asyncio.create_task(client.post("/v1/chat/completions", json=chat("good")))
    while not lab.old.closed and await state(client, "fake") != "UNLOADING":
        await asyncio.sleep(0.01)
    return go, request, swap


def test_a_swap_waits_for_a_request_between_its_preparation_and_its_generation(tmp_path):
    lab = Lab(tmp_path)

    async def scenario(client):
        go, request, swap = await swap_behind_a_held_request(lab, client)
        await asyncio.sleep(0.3)  # room for an unload that does not wait to close the engine
        closed_early = lab.old.closed
        go.set()
        return closed_early, await answer(await request), await answer(await swap)

    closed_early, (status, body), (swap_status, swap_body) = lab.run(scenario)
    assert not closed_early  # the request that passed its check holds the model
    assert status == 200 and body["choices"][0]["message"]["content"] == SCRIPT[:3]
    assert swap_status == 200 and swap_body["model"] == "good" and lab.old.closed


def test_an_operator_unload_waits_for_it_too_and_later_requests_are_refused(tmp_path):
    lab = Lab(tmp_path)

    async def scenario(client):
        reached, go = holding_generation(lab)
        request = asyncio.create_task(client.post("/v1/chat/completions", json=chat(stream=True)))
        await reached.wait()
        unload = asyncio.create_task(client.post("/api/models/fake/unload"))
        while not lab.old.closed and await state(client, "fake") != "UNLOADING":
            await asyncio.sleep(0.01)
        late = await answer(await client.post("/v1/chat/completions", json=chat()))
        await asyncio.sleep(0.3)
        closed_early = lab.old.closed
        go.set()
        streamed = await (await request).get_data()
        await unload
        return closed_early, late, streamed

    closed_early, (late_status, late_body), streamed = lab.run(scenario)
    assert not closed_early and lab.old.closed
    assert late_status == 503 and late_body["error"]["code"] == "model_busy"
    assert b"event: error" not in streamed and streamed.endswith(b"data: [DONE]\n\n")


def test_past_the_grace_period_a_request_still_to_be_admitted_is_refused(tmp_path):
    lab = Lab(tmp_path, graceful_unload_timeout=0)

    async def scenario(client):
        go, request, swap = await swap_behind_a_held_request(lab, client)
        await asyncio.sleep(0.2)
        go.set()
        first, swapped = await answer(await request), await answer(await swap)
        return first, swapped, await answer(await client.post("/v1/chat/completions", json=chat("good")))

    (status, body), (swap_status, swap_body), (after, _) = lab.run(scenario)
    assert status == 503 and body["error"]["code"] == "model_busy"  # not run on the model being unloaded
    assert lab.old.steps == 0
    assert swap_status == 200 and swap_body["model"] == "good" and lab.old.closed
    assert after == 200  # admission resumed once the unload was over
