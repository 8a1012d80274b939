"""A background job's model work in slices: each slice an engine job on the engine thread (``EngineWorker.call``),
awaited from the job's own thread, so requests waiting for the engine get their turn between two.

Learning a vector (``millm.server.vector_jobs``) and sweeping a feature (``millm.server.sweep_jobs``) run their
model work through :class:`Slices`; the rule for when a slice starts is written here once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from millm.engine.base import StepControl
from millm.engine.worker import EngineWorker
from millm.errors import QueueFull
from millm.vectors.learn import stopped

T = TypeVar("T")

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
