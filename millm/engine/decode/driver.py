"""The one driver of the decode loop: every front end (the server and the TUI through the engine worker, the
CLI, research, ``millm batch``) is its client.

It owns what is the same for all of them:

- reaching an engine's decode loop (``loop_of``: its scheduler, or None where the engine has none, llama.cpp)
  and deciding whether a request shares the batch or is served alone (``route``);
- stepping it: one step (``step``, the worker's ticks), a request driven to its end on the caller's thread
  (``drive``, what ``TransformersEngine.run_all`` is), or many requests together (``run_together``, a batch
  file's chunk); cancellation is the request's ``StepControl``, checked between steps, and a closed event
  iterator ends its request;
- the errors: a failure becomes the contract's error here (``typed``: running out of memory is
  insufficient_memory, the same code and message under every front end), whether it ends one request or,
  outside any one row, every request in the step;
- the graceful-unload wait (``wound_down``): the work admitted to the engine thread (``Admitted``: each
  request's ``StepControl``, whether any is queued, running or leased) runs to its end for the graceful
  timeout, then every request still admitted is stopped with the unload's error, new work refused with it until
  the engine is gone.

The engine's serial entry (``run``) is for clients that run a request on their own thread (the CLI's chat,
research's sampled answers): on a scheduler it is ``drive``, elsewhere the engine's own loop, its failures typed
alike. This module imports no scheduler: the engine hands its loop out (``batch_scheduler``) and the driver sees
it through ``Loop``.
"""

from __future__ import annotations

import asyncio
import copy
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from millm.engine.base import StepControl
from millm.engine.decode.admission import BatchSettings, fallback_reason
from millm.engine.decode.jobs import Job
from millm.errors import InsufficientMemory, MillmError

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.engine.events import Event
    from millm.engine.plan import Plan

__all__ = ["Admitted", "BatchSettings", "Job", "Loop", "Request", "drive", "loop_of", "route", "run", "run_together",
           "step", "typed", "wound_down"]


class Loop(Protocol):
    """What the driver needs of an engine's decode loop (``millm.engine.decode.scheduler.Scheduler``)."""

    settings: BatchSettings | None
    run_commands: Callable[[], None]

    def submit(self, job: Job) -> None: ...

    def step(self) -> None: ...

    def abandon(self, job: Job) -> None: ...

    def fail_all(self, error: BaseException) -> None: ...

    @property
    def busy(self) -> bool: ...

    @property
    def queued(self) -> int: ...

    @property
    def active_rows(self) -> int: ...

    def tokens_per_second(self) -> float: ...


def typed(exc: BaseException) -> BaseException:
    """An out-of-memory error from any backend becomes insufficient_memory (503), naming the device; the
    engine stays usable (its caches live per request). Every other error, and a domain error already, is returned
    as it is."""
    out_of_memory = type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()
    if isinstance(exc, MillmError) or not out_of_memory:
        return exc
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
    first = str(exc).splitlines()[0] if str(exc) else repr(exc)
    return InsufficientMemory(f"The request ran out of memory: {first} Shorten the prompt or lower max_tokens, or "
                              "retry when fewer requests run.")


def raised(exc: BaseException) -> BaseException:
    """``typed(exc)``, chained to ``exc`` when it changed (to be raised)."""
    mapped = typed(exc)
    if mapped is not exc:
        mapped.__cause__ = exc
    return mapped


def loop_of(engine: Engine, batching: BatchSettings | None) -> Loop | None:
    """The engine's decode loop, batching with ``batching`` (None: every request served alone), or None where
    the engine has none (llama.cpp). Made on the caller's thread: the engine thread's, for the worker."""
    make: Callable[[BatchSettings | None], Loop] | None = getattr(engine, "batch_scheduler", None)
    if make is None or not engine.capabilities.batchable:
        return None
    return make(batching)


def route(engine: Engine, plans: list[Plan], batching: BatchSettings | None) -> tuple[bool, str | None]:
    """Whether a request is served alone, and why when batching is on (its fallback reason,
    ``millm.engine.decode.admission.fallback_reason``); with batching off every request is alone, for no reason."""
    if batching is None:
        return True, None
    target = engine.steering_target()
    monitoring = target is not None and target.monitor.config.enabled
    reason = fallback_reason(plans, batching, monitoring)
    return reason is not None, reason


def step(loop: Loop) -> None:
    """One step of ``loop``. A failure outside any one row (the step itself broke) ends every request in it,
    admitted or waiting, with the typed error; the loop stays usable."""
    try:
        loop.step()
    except BaseException as exc:
        loop.fail_all(typed(exc))
        if not isinstance(exc, Exception):  # an interruption goes on once every slot is free
            raise


def drive(loop: Loop, job: Job, lock: AbstractContextManager[object] | None = None) -> Iterator[Event]:
    """Submit ``job`` and step ``loop`` until it ends, on this thread, yielding its events as they come (each
    step under ``lock``); the job's error, if it ended with one, is raised typed. Closing the iterator early
    ends the job."""
    lock = lock if lock is not None else nullcontext()
    events: deque[Event] = deque()
    ended: list[BaseException | None] = []
    send, end = job.send, job.end

    def sending(event: Event) -> None:
        events.append(event)
        send(event)

    def ending(error: BaseException | None) -> None:
        ended.append(error)
        end(error)

    job.send, job.end = sending, ending
    loop.submit(job)
    try:
        while not ended:
            job.control.run_commands()
            with lock:
                step(loop)
            while events:
                yield events.popleft()
        while events:
            yield events.popleft()
    finally:
        if not ended:
            with lock:
                loop.abandon(job)
    if ended[0] is not None:
        raise raised(ended[0])


def run(engine: Engine, plans: list[Plan], control: StepControl | None = None) -> Iterator[Event]:
    """A request's events, decoded on this thread alone (the serial path): the CLI's chat and research's
    answers. ``control`` is checked between steps (its commands run there; cancelling it ends the request).
    Every failure is typed, on every engine."""
    try:
        yield from engine.run_all(plans, control)
    except Exception as exc:
        mapped = typed(exc)
        if mapped is exc:
            raise
        raise mapped from exc


@dataclass(eq=False)
class Request:
    """One request of ``run_together``: its plans, and what running them gave: its events, or the (typed) error
    that ended it. ``check`` runs between steps: it raises when the request's steering no longer applies."""

    plans: list[Plan]
    events: list[Event] = field(default_factory=list)
    error: Exception | None = None
    check: Callable[[], None] | None = None

    def run_alone(self, engine: Engine) -> None:
        """Run it on its own on this thread (``run``); events or error filled in, never raised."""
        self.events, self.error = [], None
        control = StepControl() if self.check is None else StepControl().checking(self.check)
        try:
            self.events = list(run(engine, self.plans, control))
        except Exception as exc:  # answered as the server's error handlers answer it, never a crash
            self.error = exc


def run_together(engine: Engine, requests: Sequence[Request], batching: BatchSettings | None) -> bool:
    """Run every request through the engine's decode loop on this thread, the batch (``batching``) taking the
    requests it can and the others served alone; a batched request that ended with an error is run again on
    its own, so one bad row cannot take its neighbours' answers with it. False (nothing run) where the engine
    has no decode loop."""
    loop = loop_of(engine, batching)
    if loop is None:
        return False
    ended: dict[int, BaseException | None] = {}
    alone = [route(engine, r.plans, loop.settings)[0] for r in requests]

    def ender(request: Request) -> Callable[[BaseException | None], None]:
        def end(error: BaseException | None) -> None:
            ended[id(request)] = error
        return end

    for request, own in zip(requests, alone):
        loop.submit(Job(request.plans, StepControl(), request.events.append, ender(request), request.check,
                        alone=own))
    while len(ended) < len(requests) and loop.busy:
        step(loop)
    for request, own in zip(requests, alone):
        _settle(engine, request, own, ended)
    return True


def _settle(engine: Engine, request: Request, alone: bool, ended: dict[int, BaseException | None]) -> None:
    """A request of ``run_together`` once the loop is done: a batched one that did not end well runs again alone;
    one served alone keeps its (typed) error."""
    error = ended.get(id(request))
    if not alone and (id(request) not in ended or error is not None):
        request.run_alone(engine)
    elif error is not None:
        error = typed(error)
        request.error = error if isinstance(error, Exception) else Exception(str(error))


class Admitted:
    """The work admitted to the engine thread, as the graceful-unload wait sees it: every admitted request's
    ``StepControl`` (``controls``: a stream, a batched job, or a job of several engine calls, ``stoppable``),
    ``idle`` while nothing is queued, running or leased (the worker counts those, under ``lock``), and while an
    unload stops them, the ``refusal`` new work gets."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # the worker's: it counts queued, running and leased work under it
        self.idle = threading.Event()
        self.idle.set()
        self.controls: set[StepControl] = set()
        self.refusal: Exception | None = None  # while set (``cancel_all``), new work is refused with it

    def refuse_if_stopping(self) -> None:
        """Raise a copy of the refusal while an unload stops everything (the caller holds ``lock``)."""
        if self.refusal is not None:
            raise copy.copy(self.refusal)

    async def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no job is queued or running and no request holds a lease; False if ``timeout`` passed
        first."""
        return await asyncio.to_thread(self.idle.wait, timeout)

    def cancel_all(self, reason: Exception) -> None:
        """Cancel every admitted request, queued or running (each consumer gets ``reason`` as its error), and
        refuse new work with a copy of ``reason`` until ``resume``: a request holding a lease is refused
        when it comes to be admitted, so an unload past its grace period waits for nothing new."""
        with self.lock:
            self.refusal = reason
            controls = list(self.controls)
        for control in controls:
            control.stop(reason)

    def resume(self) -> None:
        """Admit work again (the unload that cancelled everything is over)."""
        with self.lock:
            self.refusal = None

    @contextmanager
    def stoppable(self, control: StepControl) -> Iterator[StepControl]:
        """Count ``control`` among the admitted work that ``cancel_all`` stops while the block runs: a job made of
        several engine calls (learning a vector, in slices) is stopped by an unload past its graceful timeout as a
        stream is, within the call running then (its decode steps check ``control``) or between two."""
        with self.lock:
            self.controls.add(control)
            if self.refusal is not None:
                control.stop(copy.copy(self.refusal))
        try:
            yield control
        finally:
            with self.lock:
                self.controls.discard(control)


@asynccontextmanager
async def wound_down(admitted: Admitted, timeout: float, busy: Exception,
                     stopping: Callable[[], None] | None = None) -> AsyncIterator[None]:
    """The graceful-unload wait: the admitted work runs to its end for up to ``timeout`` seconds; past it
    (``stopping`` is told) every admitted request is cancelled with ``busy`` as its error, what comes to be
    admitted is refused with it, and the wait goes on until the engine thread has let go of the model. The block
    (closing the engine) runs then; afterwards work is admitted again."""
    if not await admitted.wait_idle(timeout):
        if stopping is not None:
            stopping()
        admitted.cancel_all(busy)  # and refuses what comes to be admitted until the engine is gone
        await admitted.wait_idle(None)  # the engine thread has let go of the model
    try:
        yield
    finally:
        admitted.resume()
