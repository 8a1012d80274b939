"""The rules every background-job table shares (``millm.server.jobs``), on a tiny scripted kind of job: one at a
time with the kind's 409, the kind's 404, the newest 64 kept, cancelling (and what it cannot cancel), how a job's
work ends it, and records that outlive their process. No model and no torch: the work is a coroutine."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from millm.engine.base import StepControl
from millm.errors import MillmError
from millm.server.jobs import JOBS_KEPT, Job, Kind, Table
from millm.store import Store


class ToyRunning(MillmError):
    status, type, code = 409, "invalid_request_error", "toy_running"


class ToyNotFound(MillmError):
    status, type, code = 404, "invalid_request_error", "toy_not_found"


class ToyFinished(MillmError):
    status, type, code = 409, "invalid_request_error", "toy_finished"


TOY = Kind("test.toy", "toy job", "/api/toys", "toy_", ToyRunning, param="size", not_found=ToyNotFound,
           finished=ToyFinished, again="Play again.", about=lambda job: f" (size {job.fields['size']})",
           undo=lambda job: " (put it away with DELETE /api/toys/box)")


def ended(table: Table, status: str = "succeeded") -> Job:
    job = table.start({"size": 1}, StepControl())
    job.end(status, status)
    return job


def test_one_job_of_a_kind_at_a_time_refused_with_the_kinds_409_naming_the_running_one():
    table = Table(TOY)
    first = table.start({"size": 3}, StepControl())
    with pytest.raises(ToyRunning) as refused:
        table.start({"size": 4})
    error = refused.value.body()["error"]
    assert refused.value.status == 409 and error["code"] == "toy_running" and error["param"] == "size"
    assert f"Toy job {first.id} (size 3) is queued" in error["message"]
    assert f"GET /api/toys/{first.id}" in error["message"]
    first.begin()
    with pytest.raises(ToyRunning, match="is running"):
        table.start({"size": 4})
    first.end("failed", "failed")
    second = table.start({"size": 4})  # an ended job holds nothing up
    assert second.id.startswith("toy_") and len(second.id) == len("toy_") + 24 and second.status == "queued"
    assert [j.id for j in table.newest()] == [second.id, first.id]


def test_an_unknown_id_is_the_kinds_404_naming_the_list_route():
    with pytest.raises(ToyNotFound) as missing:
        Table(TOY).get("toy_nosuch")
    error = missing.value.body()["error"]
    assert missing.value.status == 404 and error["code"] == "toy_not_found" and error["param"] == "id"
    assert "'toy_nosuch'" in error["message"] and f"newest {JOBS_KEPT}" in error["message"]
    assert "GET /api/toys." in error["message"]


def test_the_table_keeps_the_newest_jobs_and_never_drops_an_active_one():
    table = Table(TOY)
    theirs = Job("toy_theirs", {"size": 1}, status="running")  # the oldest: another process's record, running
    table.jobs[theirs.id] = theirs
    ids = [ended(table).id for _ in range(JOBS_KEPT + 5)]
    assert list(table.jobs) == [theirs.id, *ids[-(JOBS_KEPT - 1):]]


def test_cancel_stops_the_control_and_answers_cancelled_again_and_a_finished_job_is_the_kinds_409():
    async def scenario() -> tuple[Any, ...]:
        table = Table(TOY)
        job = table.start({"size": 1}, StepControl())
        control = job.control
        cancelled = await table.cancel(job.id)
        again = await table.cancel(job.id)
        done = ended(table)
        failed = ended(table, "failed")
        refusals = []
        for finished in (done, failed):
            with pytest.raises(ToyFinished) as refused:
                await table.cancel(finished.id)
            refusals.append(refused.value)
        with pytest.raises(ToyNotFound):
            await table.cancel("toy_nosuch")
        return job, control, cancelled, again, refusals

    job, control, cancelled, again, (succeeded, failed) = asyncio.run(scenario())
    assert cancelled is job and again is job and job.status == "cancelled" and job.finished is not None
    assert control is not None and control.cancel.is_set() and control.reason is not None
    assert job.error is not None and job.error["error"]["code"] == "job_cancelled"
    assert job.progress == "cancelled: nothing was stored"
    assert f"DELETE /api/toys/{job.id}" in job.error["error"]["message"]
    assert succeeded.status == 409 and "has succeeded" in succeeded.message and "put it away" in succeeded.message
    assert "has failed" in failed.message and "put it away" not in failed.message


def test_a_job_storing_what_it_made_is_not_cancelled_the_cancel_waits_for_its_end():
    async def scenario() -> tuple[Job, int, str]:
        table = Table(TOY)
        job = table.start({"size": 1}, StepControl())
        job.begin()
        job.storing = True

        async def store_it() -> None:
            await asyncio.sleep(0.2)
            job.end("succeeded", "stored")

        finishing = asyncio.create_task(store_it())
        with pytest.raises(ToyFinished) as refused:
            await table.cancel(job.id)
        await finishing
        return job, refused.value.status, refused.value.message

    job, status, message = asyncio.run(scenario())
    assert job.status == "succeeded" and status == 409 and "has succeeded" in message


def test_how_a_jobs_work_ends_it():
    async def scenario() -> list[Job]:
        table = Table(TOY)
        released: list[str] = []
        jobs = []

        async def works() -> str:
            return "made 3 toys"

        async def refused() -> str:
            raise MillmError("The box is full.")

        async def broken() -> str:
            raise ValueError("a wheel came off")

        for work in (works, refused, broken):
            job = table.start({"size": 1}, StepControl())
            await table.execute(job, work, lambda job=job: released.append(job.id))
            jobs.append(job)

        stopped = table.start({"size": 1}, StepControl())
        assert stopped.control is not None
        control = stopped.control

        async def cancelled_midway() -> str:
            await table.cancel(stopped.id)
            control.cancel.wait()
            raise MillmError("stopped at a slice boundary")

        await table.execute(stopped, cancelled_midway)
        jobs.append(stopped)
        assert released == [j.id for j in jobs[:3]]
        return jobs

    works, refused, broken, stopped = asyncio.run(scenario())
    assert (works.status, works.progress, works.error) == ("succeeded", "made 3 toys", None)
    assert refused.status == "failed" and refused.progress == "failed: The box is full."
    assert refused.error == MillmError("The box is full.").body()
    assert broken.status == "failed" and broken.error is not None
    assert "Internal error: a wheel came off" in broken.error["error"]["message"]
    assert stopped.status == "cancelled" and stopped.error is not None
    assert stopped.error["error"]["code"] == "job_cancelled"  # the DELETE's reason, not the slice's error
    assert all(j.control is None and j.finished is not None for j in (works, refused, broken, stopped))


def test_a_job_whose_server_stops_under_it_reads_interrupted_and_its_control_is_stopped():
    async def scenario() -> tuple[Job, StepControl]:
        table = Table(TOY)
        job = table.start({"size": 1}, StepControl())
        assert job.control is not None
        control = job.control
        job.begin()

        async def forever() -> str:
            await asyncio.sleep(3600)
            return "never"

        task = asyncio.create_task(table.execute(job, forever))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return job, control

    job, control = asyncio.run(scenario())
    assert job.status == "failed" and job.error is not None and job.error["error"]["code"] == "interrupted"
    assert job.progress.startswith("failed: interrupted (the server stopped before the toy job ended)")
    assert "Play again." in job.error["error"]["message"] and control.cancel.is_set()


def test_records_outlive_their_table_and_one_left_running_reads_interrupted(tmp_path: Path):
    store = Store(tmp_path / "millm.db")

    async def scenario() -> tuple[Job, Job, Job]:
        first = Table(TOY, store)
        done = await first.open({"size": 1, "colour": "red"}, StepControl())

        async def works() -> str:
            return "made"

        await first.execute(done, works)
        running = await first.open({"size": 2}, StepControl(), status="running")
        dead = Job("toy_dead", {"size": 3}, status="running")
        store.save_job(dead.id, TOY.name, 0.5, True, "999999999:gone", dead.record())
        return done, running, dead

    done, running, _ = asyncio.run(scenario())
    second = Table(TOY, store)  # as a server started on the same home reads it
    listed = second.newest()
    assert [j.id for j in listed] == [running.id, done.id, "toy_dead"]
    again = second.get(done.id)
    assert (again.status, again.progress, again.fields) == ("succeeded", "made", {"size": 1, "colour": "red"})
    assert again.created == done.created and again.finished == done.finished
    for gone in (second.get(running.id), second.get("toy_dead")):
        assert gone.status == "failed" and gone.error is not None and gone.error["error"]["code"] == "interrupted"
        assert not gone.ours
    third = Table(TOY, store)  # the interruption was stored
    assert third.get("toy_dead").status == "failed" and third.get(running.id).finished is not None
    fresh = third.start({"size": 9})  # a restored record holds nothing up
    assert fresh.status == "queued"


def test_a_record_another_live_process_runs_stays_active_and_holds_nothing_up(tmp_path: Path):
    store = Store(tmp_path / "millm.db")
    theirs = Job("toy_theirs", {"size": 1}, status="running")
    store.save_job(theirs.id, TOY.name, 1.0, True, f"{os.getppid()}:other", theirs.record())
    table = Table(TOY, store)
    assert table.get("toy_theirs").status == "running"
    assert table.start({"size": 2}).status == "queued"


def test_the_store_keeps_the_newest_records_of_each_kind(tmp_path: Path):
    store = Store(tmp_path / "millm.db")
    table = Table(TOY, store)
    ids = []
    for _ in range(JOBS_KEPT + 3):
        job = ended(table)
        table.save(job)
        ids.append(job.id)
    assert [r["id"] for r in store.jobs(TOY.name)] == ids[-JOBS_KEPT:]
    assert store.jobs("test.other") == []
