"""Learning jobs share the engine and can be stopped (issue 49, items 4 and 6), on the scripted engine.

A job's model work runs in slices: a chat sent while it learns is answered between two, an unload past its
graceful timeout cancels it (instead of waiting for the whole job), ``DELETE /api/vectors/jobs/{id}`` cancels it
with nothing stored; job records are kept in the store, so a restart lists them and a job its server was
running reads ``failed: interrupted``.

The scripted engine answers each prompt with the prompt itself, one character per ``PACE`` seconds, so an
answer about rain names rain and a slice's time is known: ``TOKENS`` characters per answer,
``answers_per_slice(TOKENS)`` answers per slice (8: about 2 s), the whole job 8 slices (16 s).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from millm.engine.params import Forced
from millm.engine.plan import Plan
from tests.support.app import make, run
from tests.support.fakes import VOCAB, WIDTH, FakeEngine

PACE, TOKENS, COUNT = 0.002, 128, 32  # the whole generation: 2 * COUNT * TOKENS * PACE = 16 s in one job
POSITIVE = ["The rain fell all day.", "Dark clouds and heavy rain.", "It is raining again.", "Rain on the roof."]
NEGATIVE = ["The desk is made of oak.", "She counted the coins.", "A train left at noon.", "He read the letter."]
LONG = {"name": "rainy", "concepts": ["rain"], "examples": COUNT, "tokens": TOKENS, "layer": 10}
WHOLE_JOB = 2 * COUNT * TOKENS  # decode steps of the job's answers: what one engine job would make a request wait for


class EchoEngine(FakeEngine):
    """A steerable scripted engine that answers each prompt with its own text, repeated, and reads a text's
    residual as how often it says "rain" (the first dimension) beside its length (another)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(model_id="fake", steerable=True, pace=PACE, **kw)

    def _script_for(self, plan: Plan) -> list[int]:
        text = "".join(VOCAB[i] for i in plan.prompt_ids[0])
        return [VOCAB.index(ch) for ch in (text + " ") * 20] + [0]

    def residuals(self, reads: list[Forced], layer: int, position: str = "mean") -> Any:
        import torch

        rows = torch.zeros(len(reads), WIDTH)
        for i, r in enumerate(reads):
            text = "".join(VOCAB[t] for t in r.ids[r.start:]).lower()
            rows[i, 0] = float(text.count("rain"))
            rows[i, 1 + len(text) % 7] = 1.0
        return rows


def app_on(home: Path, **settings: Any) -> tuple[Any, EchoEngine]:
    app, engine = make(home, EchoEngine(), **settings)
    return app, engine  # type: ignore[return-value]


async def job_of(client: Any, job_id: str, jobs: str = "/api/vectors/jobs") -> dict[str, Any]:
    r = await client.get(f"{jobs}/{job_id}")
    assert r.status_code == 200, await r.get_data()
    body: dict[str, Any] = await r.get_json()
    return body


async def until(client: Any, job_id: str, *statuses: str, within: float = 60.0,
                jobs: str = "/api/vectors/jobs") -> dict[str, Any]:
    """The job once its status is one of ``statuses`` (polled, bounded)."""
    deadline = time.monotonic() + within
    while (job := await job_of(client, job_id, jobs))["status"] not in statuses:
        assert time.monotonic() < deadline, f"job {job_id} never became {statuses}: {job}"
        await asyncio.sleep(0.02)
    return job


async def started(client: Any, body: dict[str, Any]) -> str:
    r = await client.post("/api/vectors/learn", json=body)
    assert r.status_code == 202, await r.get_data()
    job_id: str = (await r.get_json())["id"]
    await until(client, job_id, "running")
    return job_id


async def set_names(client: Any) -> list[str]:
    return [s["id"] for s in (await (await client.get("/api/vectors")).get_json())["data"]]


def test_an_unload_past_its_graceful_timeout_cancels_a_learning_job_at_once(tmp_path):
    app, engine = app_on(tmp_path, graceful_unload_timeout=0.5)

    async def scenario(client):
        job_id = await started(client, LONG)
        r = await client.post("/api/models/fake/unload")
        steps = engine.steps  # decode steps run when the unload answered
        assert r.status_code == 200, await r.get_data()
        job = await until(client, job_id, "cancelled", "failed", "succeeded", within=5)
        return steps, job, await set_names(client)

    steps, job, names = run(app, scenario)
    assert steps < WHOLE_JOB, f"the unload waited for {steps} of the job's {WHOLE_JOB} steps"
    assert job["status"] == "cancelled" and job["vector_sets"] is None, job
    assert job["error"]["error"]["code"] == "model_busy" and "nothing was stored" in job["progress"].lower(), job
    assert names == [] and engine.closed


def test_a_chat_sent_while_a_job_learns_is_answered_between_two_slices(tmp_path):
    app, engine = app_on(tmp_path)

    async def scenario(client):
        job_id = await started(client, LONG)
        r = await client.post("/v1/chat/completions", json={
            "model": "fake", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
        steps = engine.steps  # decode steps run when the chat was answered (its own 8 among them)
        status = (await job_of(client, job_id))["status"]
        await client.delete(f"/api/vectors/jobs/{job_id}")
        return r.status_code, steps, status

    code, steps, status = run(app, scenario)
    assert code == 200 and status == "running", (code, status)
    assert steps < WHOLE_JOB // 2, f"the chat waited for {steps} of the learning job's {WHOLE_JOB} steps"


def test_delete_cancels_a_job_that_stores_nothing_and_says_so(tmp_path):
    app, engine = app_on(tmp_path)

    async def scenario(client):
        job_id = await started(client, LONG)
        r = await client.delete(f"/api/vectors/jobs/{job_id}")
        cancelled = r.status_code, await r.get_json()
        steps = engine.steps
        await asyncio.sleep(0.5)  # the slice running ends at its next decode step
        stopped = engine.steps - steps
        later = await job_of(client, job_id)
        again = await client.delete(f"/api/vectors/jobs/{job_id}")
        unknown = await client.delete("/api/vectors/jobs/job_nosuch")
        done = await client.post("/api/vectors/learn", json={"name": "wet", "layer": 10, "positive": POSITIVE,
                                                              "negative": NEGATIVE})
        assert done.status_code == 202, await done.get_data()  # the cancelled job holds nothing up
        done_id = (await done.get_json())["id"]
        await until(client, done_id, "succeeded", "failed")
        finished = await client.delete(f"/api/vectors/jobs/{done_id}")
        return (cancelled, stopped, later, (again.status_code, await again.get_json()),
                (unknown.status_code, await unknown.get_json()), (finished.status_code, await finished.get_json()),
                await set_names(client))

    cancelled, stopped, later, again, unknown, finished, names = run(app, scenario)
    code, job = cancelled
    assert code == 200 and job["status"] == "cancelled" and job["vector_sets"] is None, job
    assert "nothing was stored" in job["progress"] and job["error"]["error"]["code"] == "job_cancelled", job
    assert stopped <= 2, f"the engine ran {stopped} more steps after the cancel"
    assert later["status"] == "cancelled" and later["progress"] == job["progress"], later
    assert again == (200, later)
    assert unknown[0] == 404 and unknown[1]["error"]["code"] == "job_not_found"
    assert finished[0] == 409 and finished[1]["error"]["code"] == "job_finished", finished
    assert names == ["wet"]


def test_a_probe_learning_job_is_cancelled_mid_way_and_stores_no_probe(tmp_path):
    """Probe learning is a job like vector learning's (issue 55): one at a time (409 ``probe_job_running``), and
    ``DELETE /api/probes/jobs/{id}`` stops it where it is, with no probe stored."""
    from millm.probes import catalog

    app, engine = app_on(tmp_path)
    probes = "/api/probes/jobs"

    async def scenario(client):
        r = await client.post("/api/probes/learn", json=LONG)
        assert r.status_code == 202, await r.get_data()
        job_id = (await r.get_json())["id"]
        await until(client, job_id, "running", jobs=probes)
        second = await client.post("/api/probes/learn", json={**LONG, "name": "drizzle"})
        r = await client.delete(f"{probes}/{job_id}")
        cancelled = r.status_code, await r.get_json()
        steps = engine.steps
        await asyncio.sleep(0.5)  # the slice running ends at its next decode step
        stopped = engine.steps - steps
        later = await job_of(client, job_id, probes)
        again = await client.delete(f"{probes}/{job_id}")
        unknown = await client.delete(f"{probes}/probejob_nosuch")
        listed = (await (await client.get("/api/probes")).get_json())["data"]
        return ((second.status_code, await second.get_json()), cancelled, stopped, later,
                (again.status_code, await again.get_json()), (unknown.status_code, await unknown.get_json()), listed)

    second, (code, job), stopped, later, again, unknown, listed = run(app, scenario)
    assert second[0] == 409 and second[1]["error"]["code"] == "probe_job_running", second
    assert job["id"] in second[1]["error"]["message"]
    assert code == 200 and job["status"] == "cancelled" and job["probe"] is None, job
    assert "nothing was stored" in job["progress"] and job["error"]["error"]["code"] == "job_cancelled", job
    assert stopped <= 2, f"the engine ran {stopped} more steps after the cancel"
    assert later == job and again == (200, job)
    assert unknown[0] == 404 and unknown[1]["error"]["code"] == "job_not_found"
    assert listed == [] and not catalog.path_of(tmp_path, "rainy").exists()
    assert not list(catalog.path_of(tmp_path, "rainy").parent.glob(".tmp-*"))  # nothing half-written either


def test_job_records_outlive_a_restart_and_a_job_it_was_running_reads_interrupted(tmp_path):
    first, _ = app_on(tmp_path)

    async def before(client):
        r = await client.post("/api/vectors/learn", json={"name": "wet", "layer": 10, "positive": POSITIVE,
                                                           "negative": NEGATIVE})
        done = (await r.get_json())["id"]
        await until(client, done, "succeeded")
        running = await started(client, LONG)

        second, _ = app_on(tmp_path)  # a server started on the same home once this one died

        async def after(client2):
            listed = (await (await client2.get("/api/vectors/jobs")).get_json())["data"]
            return listed, await job_of(client2, running)

        async with second.test_app():
            listed, interrupted = await after(second.test_client())
        await client.delete(f"/api/vectors/jobs/{running}")
        return done, running, listed, interrupted

    done, running, listed, interrupted = run(first, before)
    assert [j["id"] for j in listed] == [running, done]  # newest first
    assert listed[1]["status"] == "succeeded" and listed[1]["vector_sets"] == ["wet"]
    assert interrupted["status"] == "failed" and interrupted["error"]["error"]["code"] == "interrupted", interrupted
    assert interrupted["progress"].startswith("failed: interrupted") and interrupted["finished"] is not None


def test_a_record_left_running_by_a_dead_process_reads_interrupted(tmp_path):
    """A job record written by a process that no longer exists (as a crash leaves it, in the shape a store written
    before the shared job table holds) reads failed: interrupted."""
    from millm.server.jobs import Table
    from millm.server.vector_jobs import KIND, view
    from millm.store import Store

    store = Store(tmp_path / "millm.db")
    record = {"id": "job_0123", "object": "vectors.learn_job", "status": "running", "progress": "reading",
              "name": "v", "layers": [4, 5], "method": "diffmean", "position": "mean", "created": 1,
              "finished": None, "vector_sets": None, "error": None, "planned": ["v-L4", "v-L5"]}
    store.save_job("job_0123", KIND.name, 1.0, True, "999999999:dead", record)
    [seen] = Table(KIND, store).jobs.values()
    assert (seen.status, seen.error and seen.error["error"]["code"]) == ("failed", "interrupted")
    [again] = Table(KIND, store).jobs.values()  # and so it is stored
    assert view(again) == view(seen) and view(again)["layers"] == [4, 5] and view(again)["name"] == "v"


@pytest.mark.parametrize("tokens,device,answers", [(4, "cpu", 32), (48, "cpu", 21), (128, "cpu", 8), (256, "cpu", 4),
                                                    (48, "cuda:0", 64), (256, "cuda", 16)])
def test_a_writing_slice_is_bounded_by_its_answers_tokens(tokens, device, answers):
    from millm.vectors.learn import answers_per_slice

    assert answers_per_slice(tokens, device) == answers


def test_cancelling_is_an_admin_mutation(tmp_path):
    app, _ = app_on(tmp_path, admin_key="boss")

    async def scenario(client):
        refused = await client.delete("/api/vectors/jobs/job_nosuch")
        allowed = await client.delete("/api/vectors/jobs/job_nosuch", headers={"Authorization": "Bearer boss"})
        doc = await (await client.get("/openapi.json")).get_json()
        return refused.status_code, allowed.status_code, doc["paths"]["/api/vectors/jobs/{job_id}"]

    refused, allowed, path = run(app, scenario)
    assert (refused, allowed) == (401, 404) and {"get", "delete"} <= set(path)


def test_a_blank_concept_is_refused_by_the_rule_the_cli_uses(tmp_path):
    app, _ = app_on(tmp_path)

    async def scenario(client):
        r = await client.post("/api/vectors/learn", json={**LONG, "concepts": ["rain", "  "]})
        return r.status_code, await r.get_json(), (await (await client.get("/api/vectors/jobs")).get_json())
    status, body, listed = run(app, scenario)
    assert status == 400 and body["error"]["param"] == "concepts" and "blank word" in body["error"]["message"]
    assert listed["data"] == []
