"""The management API's background jobs, one table per kind (vector learning, probe learning, sweeps, pulls): the
rules they share, written once.

- A job has an id (the kind's prefix and 24 hex digits), a status (``queued``, ``running``, ``succeeded``,
  ``failed``, ``cancelled``), a ``progress`` line, its start and end times, the error body it ended with, and
  its kind's own ``fields`` (what was asked and what it made; JSON, so the store keeps them).
- One job of a kind is queued or running at a time in a process: a second is refused with the kind's own 409.
- An unknown id is the kind's 404; the newest ``JOBS_KEPT`` jobs are kept (a queued or running one never
  dropped).
- A queued or running job is cancelled by stopping its ``control`` (its slice running ends at its next decode
  step and no other starts): it reads ``cancelled`` at once, its error the kind's ``cancelled`` body; once it
  stores what it made it can no longer be cancelled (the cancel waits and answers how it ended); a job that
  ended is the kind's ``finished`` 409; a cancelled one answers as it is.
- Records are kept in the SQLite store when the table has one (a restart lists them); a job whose process
  stopped before it ended reads ``failed``, error ``interrupted``, once a process reads the table (or at once,
  when its own server stops under it).
- How a job ends is decided by :meth:`Table.execute`: its work's return is the success line; a MillmError is
  ``failed`` (``cancelled`` when its control was stopped) with that error's body; anything else an internal
  error.

This module imports no model code (no torch): a kind's routes and its model work live in its own module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from quart import current_app

from millm.engine.base import StepControl
from millm.errors import MillmError
from millm.store import Store

log = logging.getLogger(__name__)

JOBS_KEPT = 64  # each table keeps its newest jobs; a queued or running one is never dropped
ACTIVE = ("queued", "running")
NOTHING_STORED = "nothing was stored"
STORING_POLL = 0.05  # seconds between two looks at a job storing what it made, when a cancel waits for it
STATE = ("id", "status", "progress", "finished", "error")  # a record's keys the table owns; the rest are fields


class JobNotFound(MillmError):
    status, type, code = 404, "invalid_request_error", "job_not_found"


class JobFinished(MillmError):
    """A job that ended (succeeded or failed) cannot be cancelled."""

    status, type, code = 409, "invalid_request_error", "job_finished"


class JobCancelled(MillmError):
    """Why a job cancelled by its DELETE route ended (its record's error)."""

    status, type, code = 409, "invalid_request_error", "job_cancelled"


class Interrupted(MillmError):
    """Why a job that was running when its server stopped ended (its record's error, after a restart)."""

    status, type, code = 500, "server_error", "interrupted"


def _nothing(job: Job) -> str:
    return ""


@dataclass(frozen=True)
class Kind:
    """What one kind of job says and answers: its messages' words and its error classes."""

    name: str  # its records' kind in the store: "vectors.learn"
    noun: str  # how messages name one job: "learning job", "sweep"
    path: str  # its list route; GET (and DELETE, where it can be cancelled) {path}/{id} is one job
    prefix: str  # its ids' prefix: "job_"
    running: type[MillmError]  # the 409 for a second job while one is queued or running
    param: str | None = None  # the body field that 409 names
    not_found: type[MillmError] = JobNotFound
    finished: type[MillmError] = JobFinished
    cancelled: type[MillmError] = JobCancelled
    waiting: str = "waiting for the engine"  # a new job's progress line
    left: str = NOTHING_STORED  # what a stopped job leaves behind
    again: str = "Start it again."  # what to do after an interruption
    about: Callable[[Job], str] = _nothing  # how a 409 names the running job beyond its id: " ('rainy')"
    undo: Callable[[Job], str] = _nothing  # how to undo a succeeded job, said when cancelling it is refused

    @property
    def title(self) -> str:
        return self.noun[0].upper() + self.noun[1:]


@dataclass(eq=False)
class Job:
    """A job's record (what its kind's view shows and the store keeps) and, while this process runs it, the
    ``control`` that stops it and what it holds in memory only (``live``)."""

    id: str
    fields: dict[str, Any]  # the kind's own record: JSON, no key of ``STATE``
    created: float = field(default_factory=time.time)
    status: str = "queued"
    progress: str = "waiting for the engine"
    finished: float | None = None
    error: dict[str, Any] | None = None  # the error body it ended with
    control: StepControl | None = None
    storing: bool = False  # storing what it made: past the point where it can be cancelled
    ours: bool = False  # run by this process (a restored record another live process runs is not)
    live: Any = None  # what the running job shows but never stores (a pull's byte counters)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    def say(self, what: str) -> None:
        """Set its progress line while it has not ended."""
        if self.active:
            self.progress = what

    def begin(self) -> None:
        """Its model work has started: queued becomes running."""
        if self.status == "queued":
            self.status = "running"

    def end(self, status: str, progress: str, error: MillmError | None = None) -> None:
        """Record how it ended; a job cancelled already stays so (the DELETE that cancelled it said so)."""
        if self.status == "cancelled":
            return
        self.status, self.progress, self.finished = status, progress, time.time()
        self.error = error.body() if error is not None else None

    def record(self) -> dict[str, Any]:
        """What the store keeps: the table's keys and the kind's fields."""
        return {**self.fields, "id": self.id, "status": self.status, "progress": self.progress,
                "finished": self.finished, "error": self.error}

    @classmethod
    def restored(cls, record: dict[str, Any], created: float) -> Job:
        fields = {k: v for k, v in record.items() if k not in STATE}
        return cls(record["id"], fields, created, record["status"], record["progress"], record["finished"],
                   record["error"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by someone else
        return True
    return True


class Table:
    """The newest ``JOBS_KEPT`` jobs of ``kind`` by id, oldest first, kept in ``store`` when given (a restart lists
    them); at most one of this process's jobs queued or running."""

    def __init__(self, kind: Kind, store: Store | None = None) -> None:
        self.kind, self.store = kind, store
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self.owner = f"{os.getpid()}:{uuid.uuid4().hex[:8]}"
        for row in store.jobs(kind.name) if store is not None else []:
            job = Job.restored(row["record"], row["created"])
            pid = int(str(row["owner"]).partition(":")[0] or 0)
            if job.active and (pid == os.getpid() or not _alive(pid)):
                self.interrupt(job)
                self.save(job)
            self.jobs[job.id] = job

    def start(self, fields: dict[str, Any], control: StepControl | None = None, status: str = "queued") -> Job:
        """A new job of ``fields``, recorded in memory (``save`` stores it); the kind's 409 while another of this
        process's jobs is queued or running."""
        running = next((j for j in self.jobs.values() if j.active and j.ours), None)
        if running is not None:
            kind = self.kind
            raise kind.running(f"{kind.title} {running.id}{kind.about(running)} is {running.status}; one "
                               f"{kind.noun} runs at a time: retry once GET {kind.path}/{running.id} says it "
                               "ended.", param=kind.param)
        job = Job(f"{self.kind.prefix}{uuid.uuid4().hex[:24]}", fields, status=status, progress=self.kind.waiting,
                  control=control, ours=True)
        self.jobs[job.id] = job
        while len(self.jobs) > JOBS_KEPT:
            oldest = next(j for j in self.jobs.values() if not j.active)
            del self.jobs[oldest.id]
        return job

    async def open(self, fields: dict[str, Any], control: StepControl | None = None, status: str = "queued") -> Job:
        """``start`` a job and store its record (a job whose record cannot be stored is not started)."""
        job = self.start(fields, control, status)
        try:
            await asyncio.to_thread(self.save, job)
        except BaseException:
            del self.jobs[job.id]
            raise
        return job

    def get(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise self.kind.not_found(f"No {self.kind.noun} has id '{job_id}' (the newest {JOBS_KEPT} are kept); "
                                      f"see GET {self.kind.path}.", param="id")
        return job

    def newest(self) -> list[Job]:
        """The jobs kept, newest first."""
        return list(reversed(self.jobs.values()))

    def save(self, job: Job) -> None:
        """Write ``job``'s record to the store (blocking: call it off the event loop), the oldest past
        ``JOBS_KEPT`` dropped."""
        if self.store is None:
            return
        self.store.save_job(job.id, self.kind.name, job.created, job.active, self.owner, job.record())
        self.store.prune_jobs(self.kind.name, JOBS_KEPT)

    def interrupt(self, job: Job) -> None:
        """Record that ``job``'s server stopped before it ended."""
        kind = self.kind
        job.end("failed", f"failed: interrupted (the server stopped before the {kind.noun} ended); {kind.left}",
                Interrupted(f"The server stopped while {kind.noun} {job.id} ran (interrupted); {kind.left}. "
                            f"{kind.again}"))

    def stop(self, job: Job) -> bool:
        """Cancel ``job`` if it is queued or running and not yet storing: its control is stopped, so the slice
        running ends at its next decode step and no other starts, and it reads ``cancelled`` now. False when it
        can no longer be cancelled."""
        if not job.active or job.storing or job.control is None:
            return False
        kind = self.kind
        reason = kind.cancelled(f"{kind.title} {job.id} was cancelled by DELETE {kind.path}/{job.id}; {kind.left}.")
        job.control.stop(reason)
        job.end("cancelled", f"cancelled: {kind.left}", reason)
        return True

    async def cancel(self, job_id: str) -> Job:
        """Cancel the job ``job_id`` (``stop``); a job cancelled already is answered as it is, one storing what it
        made is waited for, one that succeeded or failed is the kind's ``finished`` 409, an unknown id its 404."""
        job = self.get(job_id)
        if self.stop(job):
            await asyncio.to_thread(self.save, job)
            return job
        while job.active and job.storing:  # too late to cancel: what it made is being stored (all or none)
            await asyncio.sleep(STORING_POLL)
        if job.status == "cancelled":
            return job
        undo = self.kind.undo(job) if job.status == "succeeded" else ""
        raise self.kind.finished(f"{self.kind.title} {job.id} has {job.status}; only a queued or running "
                                 f"{self.kind.noun} can be cancelled{undo}.", param="id")

    async def execute(self, job: Job, work: Callable[[], Awaitable[str]],
                      release: Callable[[], None] = lambda: None) -> None:
        """Run ``work`` (the job's whole life; it returns the success line) and record how it ended; ``release``
        what it held, then store the record."""
        left = self.kind.left[0].upper() + self.kind.left[1:]
        try:
            job.end("succeeded", await work())
        except MillmError as exc:
            if job.control is not None and job.control.cancel.is_set():  # a DELETE (recorded already), an unload
                job.end("cancelled", f"cancelled: {exc.message} {left}.", exc)
            else:
                job.end("failed", f"failed: {exc.message}", exc)
        except asyncio.CancelledError:  # the server is stopping: the slice running ends at its next step
            if job.control is not None:
                job.control.stop(Interrupted(f"The server stopped before the {self.kind.noun} ended."))
            self.interrupt(job)
            raise
        except Exception as exc:
            log.exception("%s %s failed", self.kind.noun, job.id)
            job.end("failed", "failed", MillmError(f"Internal error: {exc}"))
        finally:
            job.control = None
            with contextlib.suppress(Exception):
                release()
            with contextlib.suppress(Exception):  # the record in memory is the answer; the store's is for a restart
                await asyncio.shield(asyncio.to_thread(self.save, job))


def table(kind: Kind, store: Callable[[], Store | None]) -> Table:
    """The current app's table of ``kind``, read from ``store()`` the first time it is asked for."""
    extensions = current_app.extensions
    key = f"millm.jobs.{kind.name}"
    if key not in extensions:
        extensions[key] = Table(kind, store())
    found: Table = extensions[key]
    return found
