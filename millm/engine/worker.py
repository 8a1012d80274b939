"""One thread that runs all engine work beside the event loop, behind a bounded queue.

The event loop never blocks on torch: it submits work here and awaits the result, or consumes
a stream of events. A consumer that goes away sets a cancel flag the decode loop checks each step.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from millm.errors import QueueFull

T = TypeVar("T")
_END = object()


@dataclass(frozen=True)
class _Failure:
    exc: BaseException


class EngineWorker:
    """Serialises engine calls on one thread; refuses work past ``max_queue`` queued-or-running jobs."""

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="millm-engine")
        self._lock = threading.Lock()
        self._pending = 0
        self._running = 0
        self._idle = threading.Event()
        self._idle.set()

    @property
    def pending(self) -> int:
        """Jobs queued or running."""
        return self._pending

    @property
    def running(self) -> int:
        return self._running

    def _admit(self) -> None:
        with self._lock:
            if self._pending >= self.max_queue:
                raise QueueFull(f"The request queue is full ({self.max_queue} requests queued or running); "
                                "retry shortly.")
            self._pending += 1
            self._idle.clear()

    def _release(self, _: Future[Any]) -> None:
        with self._lock:
            self._pending -= 1
            if self._pending == 0:
                self._idle.set()

    def _submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        self._admit()

        def counted() -> T:
            self._running += 1
            try:
                return fn(*args)
            finally:
                self._running -= 1

        future = self._executor.submit(counted)
        future.add_done_callback(self._release)
        return future

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the engine thread and await its result."""
        return await asyncio.wrap_future(self._submit(fn, *args))

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no job is queued or running; False if ``timeout`` passed first."""
        return await asyncio.to_thread(self._idle.wait, timeout)

    async def stream(self, make_events: Callable[[threading.Event], Iterator[T]]) -> AsyncIterator[T]:
        """Run ``make_events(cancel)`` on the engine thread and yield its items as they come.

        Leaving the loop early (a client disconnect, a consumer that stops) sets ``cancel``; the
        producer is expected to check it once per decode step.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()

        def put(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is gone: nobody is listening any more
                cancel.set()

        def work() -> None:
            try:
                events = make_events(cancel)
                try:
                    for event in events:
                        put(event)
                        if cancel.is_set():
                            break
                finally:
                    close = getattr(events, "close", None)
                    if close is not None:
                        close()
            except BaseException as exc:  # handed to the consumer, raised there
                put(_Failure(exc))
            finally:
                put(_END)

        self._submit(work)
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, _Failure):
                    raise item.exc
                yield item
        finally:
            cancel.set()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
