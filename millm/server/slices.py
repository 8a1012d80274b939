"""A background job's model work in slices: each slice an engine job on the engine thread (``EngineWorker.call``),
awaited from the job's own thread, so requests waiting for the engine get their turn between two.

Learning a vector (``millm.server.vector_jobs``), learning a probe (``millm.server.probes_api``) and sweeping a
feature (``millm.server.sweep_jobs``) start their jobs with :func:`start_on_engine`: the job recorded (in the
store too) with a lease on the engine, so an unload waits for it (up to its graceful timeout) as for a request;
its ``program`` runs from a thread of its own, every engine call through :class:`Slices`; what it made is kept
(``keep``) only if it was not stopped meanwhile. The rules for when a slice starts and what it checks first are
written here once; how a job ends is ``millm.server.jobs``'.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from quart import current_app

from millm.engine.base import Engine, StepControl
from millm.engine.worker import EngineWorker
from millm.errors import ModelNotLoaded, QueueFull
from millm.server.jobs import Job, Table
from millm.server.state import services
from millm.store import Store
from millm.vectors.learn import stopped

T = TypeVar("T")
R = TypeVar("R")

QUEUE_RETRY = 0.2  # seconds a slice refused for a full queue waits before it asks again
YIELD_POLL = 0.02  # seconds between two looks at whether requests still hold the engine, before a slice


class Slices:
    """Runs one slice of a job's model work as an engine job (``slices(work)``, from a thread that is not the event
    loop's): once the requests holding the engine are served, waiting at most as long as the last slice took (so
    under constant traffic the job still gets about half the engine); a full queue is waited out. ``control``
    stopped ends the job before its next slice; ``step`` wraps each slice's work (the job's checks on the engine
    thread)."""

    def __init__(self, worker: EngineWorker, loop: asyncio.AbstractEventLoop, control: StepControl,
                 step: Callable[[Callable[[], Any]], Callable[[], Any]] = lambda work: work) -> None:
        self.worker, self.loop, self.control, self.step = worker, loop, control, step
        self.last = 0.0  # seconds the last slice took

    def __call__(self, work: Callable[[], T]) -> T:
        yielding = time.monotonic() + self.last
        while self.worker.serving_others(own_leases=1) and time.monotonic() < yielding:
            stopped(self.control)
            time.sleep(YIELD_POLL)
        while True:
            stopped(self.control)
            began = time.monotonic()
            try:
                done = asyncio.run_coroutine_threadsafe(self.worker.call(self.step(work)), self.loop).result()
            except QueueFull:
                time.sleep(QUEUE_RETRY)
                continue
            self.last = time.monotonic() - began
            return done


def store() -> Store:
    """The server's store, where the job tables keep their records."""
    return services().steering.store


async def start_on_engine(table: Table, fields: dict[str, Any], engine: Engine,
                          program: Callable[[Job, Slices], R], keep: Callable[[Job, R], str]) -> Job:
    """Start a job of ``table``'s kind on ``engine`` in the background: recorded (in the store too) and holding a
    lease on the engine; ``program(job, slices)`` is its model work (from a thread of its own), ``keep(job,
    made)`` stores what it made (off the event loop, past the point where it can be cancelled) and returns the
    success line. The kind's 409 while another of its jobs is queued or running."""
    svc = services()
    job = await table.open(fields, StepControl(run_commands=svc.worker.run_commands))  # commands run between steps
    release = svc.worker.lease()
    current_app.add_background_task(_run, table, job, engine, program, keep, release)
    return job


async def _run(table: Table, job: Job, engine: Engine, program: Callable[[Job, Slices], R],
               keep: Callable[[Job, R], str], release: Callable[[], None]) -> None:
    """The job's model work in slices, each first checking that the job was not stopped and ``engine`` is still
    the one loaded; then, unless it was stopped meanwhile, what it made is kept."""
    svc, loop, control = services(), asyncio.get_running_loop(), job.control
    assert control is not None

    def on_engine(work: Callable[[], T]) -> Callable[[], T]:
        def step() -> T:
            stopped(control)
            if svc.manager.engine is not engine:
                raise ModelNotLoaded(f"'{engine.model_id}' was unloaded before {table.kind.noun} {job.id} ended; "
                                     f"{table.kind.again[0].lower()}{table.kind.again[1:]}")
            job.begin()
            return work()
        return step

    slices = Slices(svc.worker, loop, control, on_engine)

    async def work() -> str:
        with svc.worker.stoppable(control):
            made = await asyncio.to_thread(program, job, slices)
        stopped(control)  # a DELETE between the last slice and now: nothing is kept
        job.storing = True
        return await asyncio.to_thread(keep, job, made)

    await table.execute(job, work, release)
