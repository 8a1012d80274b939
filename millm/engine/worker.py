"""One thread that runs all engine work beside the event loop, behind a bounded queue.

The event loop never blocks on torch: it submits work here and awaits the result, or consumes
a stream of events. A request is admitted (or refused with queue_full) when it is submitted, before
any response starts, and counted from that moment. Steering and monitoring changes are commands:
they run on this thread between two decode steps of whatever is generating, or at once when idle.

A transformers generation joins the engine's scheduler (its one decode loop): the scheduler's steps
run here as jobs of their own, so calls and commands interleave with them. With continuous batching
enabled (``batching``) a request the batch can serve shares it; every other one is served alone (the
serial path), one at a time, beside the batch. An engine without a scheduler (llama.cpp) runs each
generation as a serial stream, which runs one batch step between each of its own steps. What an unload waits
for, and stops past its graceful timeout, is the driver's (``Admitted``): the worker adds each request it admits.
"""

from __future__ import annotations

import asyncio
import queue
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from millm.engine.base import StepControl
from millm.engine.busy import TimedExecutor
from millm.engine.decode.driver import Admitted, BatchSettings, Job, Loop, loop_of, route, step, typed
from millm.errors import QueueFull

__all__ = ["EngineWorker", "typed"]  # typed: millm.engine.decode.driver's, the one mapping of failures

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.engine.events import Event
    from millm.engine.plan import Plan

T = TypeVar("T")
_END = object()


@dataclass(frozen=True)
class _Failure:
    exc: BaseException


class EngineWorker:
    """Serialises engine calls on one thread; refuses work past ``max_queue`` queued-or-running jobs."""

    def __init__(self, max_queue: int, batching: BatchSettings | None = None) -> None:
        self.max_queue = max_queue
        self.batching = batching
        self.batched = 0  # generations served by the batch
        self.batch_live = 0  # scheduler generations admitted and not yet ended (waiting or decoding)
        self.fallbacks: Counter[str] = Counter()  # generations served serially while batching, by reason
        self._scheduler: Loop | None = None  # the batch with work in it, while it has some
        self._ticking = False
        self._in_step = False
        self._executor = TimedExecutor(max_workers=1, thread_name_prefix="millm-engine")
        self.admitted = Admitted()  # what an unload waits for and stops (the driver's ``wound_down``)
        self._lock = self.admitted.lock
        self._pending = 0
        self._leases = 0  # requests between their model check and their admission here (``lease``)
        self._running = 0
        self._idle = self.admitted.idle  # set while nothing is queued, running or leased
        self._commands: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]] = queue.SimpleQueue()
        self._controls = self.admitted.controls  # every admitted stream, queued or running

    @property
    def pending(self) -> int:
        """Jobs queued or running."""
        return self._pending

    @property
    def busy_seconds(self) -> float:
        """Seconds the engine thread has spent running jobs, batch steps and commands (for /metrics)."""
        return self._executor.busy_seconds

    @property
    def running(self) -> int:
        """Jobs running now: a serial job, or the generations decoding in the batch."""
        scheduler = self._scheduler
        return self._running + self.batch_live - (scheduler.queued if scheduler is not None else 0)

    def _admit(self) -> None:
        with self._lock:
            self.admitted.refuse_if_stopping()
            if self._pending >= self.max_queue:
                raise QueueFull(f"The request queue is full ({self.max_queue} requests queued or running); "
                                "retry shortly.")
            self._pending += 1
            self._idle.clear()

    def _release(self, _: Future[Any] | None) -> None:
        with self._lock:
            self._pending -= 1
            if self._pending == 0 and self._leases == 0:
                self._idle.set()

    def lease(self) -> Callable[[], None]:
        """Count a request as using the engine from its model check until its work is admitted here (the
        returned release): between its jobs it is neither queued nor running, yet an unload must wait for
        it, or it runs on a closed engine. Idempotent release."""
        with self._lock:
            self._leases += 1
            self._idle.clear()
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self._leases -= 1
                if self._pending == 0 and self._leases == 0:
                    self._idle.set()

        return release

    def _submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        self._admit()

        def counted() -> T:
            self._running += 1
            try:
                self.run_commands()
                return fn(*args)
            except BaseException as exc:
                mapped = typed(exc)
                if mapped is exc:
                    raise
                raise mapped from exc
            finally:
                self._running -= 1

        future = self._executor.submit(counted)
        future.add_done_callback(self._release)
        return future

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the engine thread and await its result."""
        return await asyncio.wrap_future(self._submit(fn, *args))

    def run_commands(self) -> None:
        """Run every queued command (on the engine thread, between decode steps)."""
        while True:
            try:
                fn, args, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller, raised there (out of memory: typed)
                future.set_exception(typed(exc))

    async def command(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the engine thread at the next step boundary (at once when idle).

        Commands are not requests: they are never refused for a full queue and never wait for a
        generation to finish.
        """
        future: Future[T] = Future()
        self._commands.put((fn, args, future))
        self._executor.submit(self.run_commands)
        return await asyncio.wrap_future(future)

    def serving_others(self, own_leases: int = 0) -> bool:
        """Whether other work than the caller's holds the engine: a job queued or running, or a request between its
        model check and its admission (a lease; ``own_leases`` of them are the caller's). A background job that
        yields to requests (learning) waits while this holds."""
        with self._lock:
            return self._pending > 0 or self._leases > own_leases

    def stoppable(self, control: StepControl) -> AbstractContextManager[StepControl]:
        """Count ``control`` among the admitted work an unload past its graceful timeout stops while the block runs
        (``Admitted.stoppable``: a job of several engine calls, learning a vector)."""
        return self.admitted.stoppable(control)

    def stream(self, make_events: Callable[[StepControl], Iterator[T]]) -> AsyncIterator[T]:
        """Admit now (raising QueueFull before any response starts), then run ``make_events(control)`` on
        the engine thread; the returned iterator yields its items as they come.

        Leaving the loop early (a client disconnect, a consumer that stops) cancels ``control``; the
        producer checks it between decode steps, and a job whose consumer left before it started
        does not start at all.
        """
        control = StepControl(run_commands=self._between_steps)
        items, put = self._channel(control)

        def work() -> None:
            try:
                if not control.cancel.is_set():
                    events = make_events(control)
                    try:
                        for event in events:
                            put(event)
                            if control.cancel.is_set():
                                break
                    finally:
                        close = getattr(events, "close", None)
                        if close is not None:
                            close()
                if control.reason is not None:
                    put(_Failure(control.reason))
            except BaseException as exc:  # handed to the consumer, raised there
                put(_Failure(typed(exc)))
            finally:
                with self._lock:
                    self._controls.discard(control)
                put(_END)

        with self._lock:
            self._controls.add(control)
        try:
            self._submit(work)
        except BaseException:
            with self._lock:
                self._controls.discard(control)
            raise
        return self._consume(items, control)

    # continuous batching
    @property
    def scheduler(self) -> Loop | None:
        """The batch currently holding rows or waiting requests (None when it is empty)."""
        return self._scheduler

    def _between_steps(self) -> None:
        """A serial stream's step boundary: commands, then one batch step when the batch has work."""
        self.run_commands()
        scheduler = self._scheduler
        if scheduler is not None and scheduler.busy and not self._in_step:
            self._step(scheduler)

    def _step(self, scheduler: Loop) -> None:
        self._in_step = True
        try:
            step(scheduler)  # a failure outside any one row: every request in the batch gets the error, typed
        finally:
            self._in_step = False

    def _tick(self) -> None:
        """One batch step as a job of its own; queued again while the batch has work."""
        scheduler = self._scheduler
        try:
            if scheduler is not None and scheduler.busy:
                self._step(scheduler)
        finally:
            with self._lock:
                if scheduler is not None and scheduler.busy:
                    self._executor.submit(self._tick)
                else:
                    self._ticking = False
                    if self._scheduler is scheduler:
                        self._scheduler = None

    async def generate(self, engine: Engine, plans: list[Plan],
                       check: Callable[[], None] | None = None) -> AsyncIterator[Event]:
        """A generation's events. On an engine with a scheduler (transformers) the request joins it: in the
        batch when batching is enabled and the request can share it, else served alone (the serial path);
        elsewhere (llama.cpp) its plans run one after another as a serial stream. Admitted now either way
        (QueueFull before any response starts). ``check`` runs between steps: an operator change that
        invalidates the request's steering ends it there, with the check's error.

        The engine's scheduler is made on the engine thread, as a command (it allocates the shared KV slots
        and reserves the steering rows): out of memory there is insufficient_memory before any response."""
        alone, reason = route(engine, plans, self.batching)
        scheduler = await self.command(loop_of, engine, self.batching) if engine.capabilities.batchable else None
        if scheduler is None:
            return self.stream(lambda control: engine.run_all(plans, control if check is None
                                                              else control.checking(check)))
        events = self._batched(scheduler, plans, check, alone)
        if reason is not None:  # counted once admitted (a queue_full refusal is no fallback)
            self.fallbacks[reason] += 1
        return events

    def _batched(self, scheduler: Loop, plans: list[Plan], check: Callable[[], None] | None,
                 alone: bool) -> AsyncIterator[Event]:
        self._admit()
        control = StepControl(run_commands=self.run_commands)
        items, put = self._channel(control)

        def end(error: BaseException | None) -> None:
            if error is not None:
                put(_Failure(typed(error)))
            with self._lock:
                self._controls.discard(control)
                self.batch_live -= 1
            put(_END)
            self._release(None)

        with self._lock:
            self._controls.add(control)
            self.batched += 0 if alone else 1
            self.batch_live += 1
        scheduler.run_commands = self.run_commands
        scheduler.submit(Job(plans, control, put, end, check, alone=alone))
        with self._lock:
            self._scheduler = scheduler
            if not self._ticking:
                self._ticking = True
                self._executor.submit(self._tick)
        return self._consume(items, control)

    @staticmethod
    def _channel(control: StepControl) -> tuple[asyncio.Queue[Any], Callable[[Any], None]]:
        """The queue the event loop reads a job's items from, and the ``put`` the engine thread feeds it
        with; a put once the loop is gone cancels ``control`` (nobody is listening any more)."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()

        def put(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(items.put_nowait, item)
            except RuntimeError:
                control.cancel.set()

        return items, put

    @staticmethod
    async def _consume(items: asyncio.Queue[Any], control: StepControl) -> AsyncIterator[Any]:
        try:
            while (item := await items.get()) is not _END:
                if isinstance(item, _Failure):
                    raise item.exc
                yield item
        finally:
            control.cancel.set()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
