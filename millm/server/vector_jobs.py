"""Learning steering vectors for the management API: a POST /api/vectors/learn body checked whole before any
model work (``plan_of``), the job table GET /api/vectors/jobs reads (kept in the SQLite store, so a restart lists
it), and the job itself (``run_job``).

A job's model work runs in slices (``millm.vectors.learn``: a few answers written, or a few texts read, per
slice), each an engine job on the engine thread (``EngineWorker.call``), so a request or an unload waiting for
the engine gets its turn between two; within a slice the decode loop runs the queued commands and checks the
job's ``StepControl`` at every step. Stopping that control ends the job where it is, storing nothing: ``DELETE
/api/vectors/jobs/{id}`` (``cancel``), or an unload past its graceful timeout (the decode driver's
``Admitted.cancel_all``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from quart import current_app

from millm.engine.base import Engine, StepControl
from millm.errors import FieldNotHonoured, InvalidParameter, MillmError, ModelNotLoaded
from millm.requests.validation import SEED_MAX, check_int
from millm.sae.vector_sets import VectorSet, set_name
from millm.server.slices import Slices
from millm.server.state import services
from millm.store import Store
from millm.vectors import EXAMPLES as DEFAULT_EXAMPLES
from millm.vectors import catalog
from millm.vectors.learn import (
    EXAMPLE_TOKENS,
    Examples,
    check_choices,
    check_concepts,
    check_negatives,
    default_layer,
    generated,
    learn,
    parse_examples,
    parse_layers,
    stopped,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

JOBS_KEPT = 64  # the job table keeps the newest jobs; a queued or running one is never dropped
MAX_CONCEPTS, MAX_TEXTS, MAX_TEXT_CHARS, MAX_CONCEPT_CHARS = 64, 1024, 8192, 256
EXAMPLES = (2, 1024, DEFAULT_EXAMPLES)  # generated examples of each side: low, high, default
TOKENS = (4, 256, EXAMPLE_TOKENS)  # tokens per generated example
EXTENSION = "millm.vector_jobs"  # where an app keeps its job table
KIND = "vectors.learn"  # the job records' kind in the store
NOTHING_STORED = "nothing was stored"


class LearnJobRunning(MillmError):
    """Only one learning job runs at a time."""

    status, type, code = 409, "invalid_request_error", "learn_job_running"


class JobNotFound(MillmError):
    status, type, code = 404, "invalid_request_error", "job_not_found"


class JobFinished(MillmError):
    """A job that ended (succeeded or failed) cannot be cancelled."""

    status, type, code = 409, "invalid_request_error", "job_finished"


class JobCancelled(MillmError):
    """Why a job cancelled by DELETE /api/vectors/jobs/{id} ended (its record's error)."""

    status, type, code = 409, "invalid_request_error", "job_cancelled"


class Interrupted(MillmError):
    """Why a job that was running when its server stopped ended (its record's error, after a restart)."""

    status, type, code = 500, "server_error", "interrupted"


@dataclass(frozen=True)
class Plan:
    """A learning request, checked whole: generated examples (``concepts``) or given ones (``texts``)."""

    name: str
    layers: tuple[int, ...]
    method: str
    position: str
    negatives: str = "topics"
    concepts: tuple[str, ...] = ()
    count: int = EXAMPLES[2]
    tokens: int = TOKENS[2]
    seed: int = 0
    texts: Examples | None = None
    files: tuple[str, ...] = ()  # the uploaded files the texts came from

    def source(self) -> dict[str, object]:
        if self.texts is not None:
            return {"given": "POST /api/vectors/learn", **({"files": list(self.files)} if self.files else {})}
        return {"concepts": list(self.concepts), "seed": self.seed, "tokens": self.tokens,
                "negatives": self.negatives}

    @property
    def names(self) -> list[str]:
        return [set_name(self.name, layer, self.layers) for layer in self.layers]


@dataclass(eq=False)
class Job:
    """A job's record (what the API shows and the store keeps) and, while this process runs it, its ``plan`` and
    the ``control`` that stops it."""

    id: str
    name: str
    layers: tuple[int, ...]
    method: str
    position: str
    sets: tuple[str, ...]  # the vector sets it stores
    created: float = field(default_factory=time.time)
    status: str = "queued"  # queued | running | succeeded | failed | cancelled
    progress: str = "waiting for the engine"
    finished: float | None = None
    error: dict[str, Any] | None = None
    plan: Plan | None = None
    control: StepControl | None = None
    storing: bool = False  # past the point where it can be cancelled

    @classmethod
    def of(cls, plan: Plan, control: StepControl | None = None) -> Job:
        return cls(f"job_{uuid.uuid4().hex[:24]}", plan.name, plan.layers, plan.method, plan.position,
                   tuple(plan.names), plan=plan, control=control or StepControl())

    @classmethod
    def restored(cls, record: dict[str, Any], created: float) -> Job:
        """A job from its stored record (``view``)."""
        return cls(record["id"], record["name"], tuple(record["layers"]), record["method"], record["position"],
                   tuple(record.get("planned") or ()), created, record["status"], record["progress"],
                   record["finished"], record["error"])

    @property
    def active(self) -> bool:
        return self.status in ("queued", "running")

    def end(self, status: str, progress: str, error: MillmError | None = None) -> None:
        """Record how it ended; a job cancelled already stays so (the DELETE that cancelled it said so)."""
        if self.status == "cancelled":
            return
        self.status, self.progress, self.finished = status, progress, time.time()
        self.error = error.body() if error is not None else None

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "object": "vectors.learn_job", "status": self.status, "progress": self.progress,
                "name": self.name, "layers": list(self.layers), "method": self.method, "position": self.position,
                "created": int(self.created), "finished": int(self.finished) if self.finished else None,
                "vector_sets": list(self.sets) if self.status == "succeeded" else None, "error": self.error}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by someone else
        return True
    return True


class Jobs:
    """The newest ``JOBS_KEPT`` jobs by id, kept in ``store`` when given (a restart lists them); at most one of
    this process's jobs queued or running. A job a stopped process was running reads ``failed`` with the error
    ``interrupted`` once another process reads the table."""

    def __init__(self, store: Store | None = None) -> None:
        self.table: OrderedDict[str, Job] = OrderedDict()
        self.store = store
        self.owner = f"{os.getpid()}:{uuid.uuid4().hex[:8]}"
        for row in store.jobs(KIND) if store is not None else []:
            job = Job.restored(row["record"], row["created"])
            pid = int(str(row["owner"]).partition(":")[0] or 0)
            if job.active and (pid == os.getpid() or not _alive(pid)):
                job.end("failed", "failed: interrupted (the server stopped before the job ended); "
                        f"{NOTHING_STORED}", Interrupted(f"The server stopped while job {job.id} ran (interrupted); "
                                                         f"{NOTHING_STORED}. Learn again."))
                self.save(job)
            self.table[job.id] = job

    def start(self, plan: Plan, control: StepControl | None = None) -> Job:
        running = next((j for j in self.table.values() if j.active and j.plan is not None), None)
        if running is not None:
            raise LearnJobRunning(f"Learning job {running.id} ('{running.name}') is {running.status}; one job "
                                  f"learns at a time: retry once GET /api/vectors/jobs/{running.id} says it "
                                  "ended.", param="name")
        job = Job.of(plan, control)
        self.table[job.id] = job
        while len(self.table) > JOBS_KEPT:
            oldest = next(j for j in self.table.values() if not j.active)
            del self.table[oldest.id]
        return job

    def get(self, job_id: str) -> Job:
        job = self.table.get(job_id)
        if job is None:
            raise JobNotFound(f"No learning job has id '{job_id}' (the newest {JOBS_KEPT} are kept); see GET "
                              "/api/vectors/jobs.", param="id")
        return job

    def save(self, job: Job) -> None:
        """Write ``job``'s record to the store (blocking: call it off the event loop), the oldest past
        ``JOBS_KEPT`` dropped."""
        if self.store is None:
            return
        record = {**job.view(), "planned": list(job.sets)}
        self.store.save_job(job.id, KIND, job.created, job.active, self.owner, record)
        self.store.prune_jobs(KIND, JOBS_KEPT)

    def cancel(self, job: Job) -> bool:
        """Stop ``job`` (queued or running, not yet storing): its control is stopped, so the slice running ends
        at its next decode step and no other starts, and its record reads ``cancelled`` now. False when it can
        no longer be cancelled (it ended, or it is storing its sets)."""
        if not job.active or job.storing or job.control is None:
            return False
        reason = JobCancelled(f"Job {job.id} was cancelled by DELETE /api/vectors/jobs/{job.id}; {NOTHING_STORED}.")
        job.control.stop(reason)
        job.end("cancelled", f"cancelled: {NOTHING_STORED}", reason)
        return True


def jobs() -> Jobs:
    """The current app's job table (read from the store the first time it is asked for)."""
    extensions = current_app.extensions
    if EXTENSION not in extensions:
        extensions[EXTENSION] = Jobs(services().steering.store)
    table: Jobs = extensions[EXTENSION]
    return table


def _strings(data: dict[str, Any], key: str, most: int, chars: int) -> list[str]:
    """``data[key]``: 1 to ``most`` strings of at most ``chars`` characters, not all blank."""
    value = data[key]
    if not value or len(value) > most:
        raise InvalidParameter(f"'{key}' must hold 1 to {most} strings, got {len(value)}.", param=key)
    for i, text in enumerate(value):
        if len(text) > chars:
            raise InvalidParameter(f"'{key}.{i}' is {len(text)} characters; at most {chars}.", param=f"{key}.{i}")
    if not any(t.strip() for t in value):
        raise InvalidParameter(f"Every string of '{key}' is blank.", param=key)
    return value


def learning_engine() -> Engine:
    """The loaded model, which must read its residual stream (transformers): the refusals every /api route
    and the engine itself give."""
    manager = services().manager
    manager.check_not_busy()
    if manager.engine is None:
        raise ModelNotLoaded("No model is loaded; load a transformers model to learn a steering vector.")
    if not manager.engine.capabilities.reads:
        raise FieldNotHonoured(f"Learning a steering vector reads the residual stream: it needs a transformers "
                               f"model ('{manager.engine.model_id}' runs on {manager.engine.engine_name}).",
                               param="model")
    return manager.engine


async def plan_of(data: dict[str, Any]) -> tuple[Plan, Engine]:
    """The body checked whole, and the engine it runs on: every refusal comes before any model work."""
    method, position = data.get("method", "diffmean"), data.get("position", "mean")
    check_choices(method, position)
    data, files = uploaded(data)
    concepts = check_sources(*(data.get(k) for k in ("concepts", "positive", "negative")))
    extra = generated_examples(data) if concepts is not None else {}
    texts = given_examples(data, method) if concepts is None else None
    name = await asyncio.to_thread(catalog.check_new_name, services().steering, data["name"])
    engine = learning_engine()
    target = engine.steering_target()
    n_layers = target.steering.n_layers if target is not None else 0
    layers = layers_of(data.get("layer"), n_layers)
    for at in layers:
        await asyncio.to_thread(catalog.check_new_name, services().steering, set_name(name, at, layers))
    return Plan(name, tuple(layers), method, position, texts=texts, files=files, **extra), engine


def uploaded(data: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``data`` with each ``positive_file``/``negative_file`` (``{"name", "text"}``: a file the console's user
    picked) read into its side's texts by the rule ``millm vectors learn --positive FILE`` reads a file with; and
    the files' names."""
    out, names = dict(data), []
    for side in ("positive", "negative"):
        upload = out.pop(f"{side}_file", None)
        if upload is None:
            continue
        if side in out:
            raise InvalidParameter(f"Give '{side}' or '{side}_file', not both.", param=f"{side}_file")
        out[side] = parse_examples(upload["text"].encode(), upload["name"], f"{side}_file")
        names.append(upload["name"])
    return out, tuple(names)


def check_sources(concepts: Any, positive: Any, negative: Any) -> Any:
    """The examples come from ``concepts`` or from both ``positive`` and ``negative`` texts, one way only;
    returns ``concepts``."""
    if concepts is not None and (positive is not None or negative is not None):
        raise InvalidParameter("Give 'concepts', or 'positive' and 'negative', not both.", param="concepts")
    if concepts is None and (positive is None or negative is None):
        missing = "negative" if positive is not None else "positive" if negative is not None else "concepts"
        raise InvalidParameter("Give 'concepts' (words the model writes about), or both 'positive' and 'negative' "
                               "(example texts).", param=missing)
    return concepts


def generated_examples(data: dict[str, Any]) -> dict[str, Any]:
    """A body's asks for examples the model writes (``concepts``), checked: the plan's fields for them."""
    words = tuple(check_concepts(_strings(data, "concepts", MAX_CONCEPTS, MAX_CONCEPT_CHARS)))
    negatives = data.get("negatives", "topics")
    check_negatives(negatives)
    return {"concepts": words, "negatives": negatives,
            "count": check_int("examples", data.get("examples", EXAMPLES[2]), low=EXAMPLES[0], high=EXAMPLES[1]),
            "tokens": check_int("tokens", data.get("tokens", TOKENS[2]), low=TOKENS[0], high=TOKENS[1]),
            "seed": check_int("seed", data.get("seed", 0), low=0, high=SEED_MAX)}


def given_examples(data: dict[str, Any], method: str) -> Examples:
    """A body's ``positive`` and ``negative`` texts, checked (no generation fields beside them; PCA needs two
    non-blank texts a side)."""
    for key in ("examples", "tokens", "seed", "negatives"):
        if key in data:
            raise InvalidParameter(f"'{key}' is for generated examples ('concepts'); the 'positive' and "
                                   "'negative' texts given are the examples.", param=key)
    texts = Examples(_strings(data, "positive", MAX_TEXTS, MAX_TEXT_CHARS),
                     _strings(data, "negative", MAX_TEXTS, MAX_TEXT_CHARS))
    if method == "pca":
        for key, side in (("positive", texts.positive), ("negative", texts.negative)):
            if sum(1 for t in side if t.strip()) < 2:
                raise InvalidParameter(f"PCA needs at least 2 non-blank '{key}' texts.", param=key)
    return texts


def layers_of(value: Any, n_layers: int) -> list[int]:
    """``layer``: absent (the default layer), a layer, a range string ("8-12") or a list of either (the body's
    schema has checked the types)."""
    if value is None:
        return [default_layer(n_layers)]
    return parse_layers(value if isinstance(value, list) else [value], n_layers)


async def start(plan: Plan, engine: Engine) -> Job:
    """Start learning ``plan`` on ``engine`` in the background: the job recorded (in the store too) and holding a
    lease on the engine, so an unload waits for it (up to its graceful timeout) as for a request."""
    svc, table = services(), jobs()
    job = table.start(plan, StepControl(run_commands=svc.worker.run_commands))  # commands run between its steps
    release = svc.worker.lease()
    try:
        await asyncio.to_thread(table.save, job)
    except BaseException:
        del table.table[job.id]
        release()
        raise
    current_app.add_background_task(run_job, job, engine, release)
    return job


async def cancel(job_id: str) -> Job:
    """Cancel the job ``job_id`` (``Jobs.cancel``); a job cancelled already is answered as it is, one that
    succeeded or failed is a 409, an unknown id a 404."""
    table = jobs()
    job = table.get(job_id)
    if table.cancel(job):
        await asyncio.to_thread(table.save, job)
        return job
    while job.active and job.storing:  # too late to cancel: its sets are being stored (all or none)
        await asyncio.sleep(0.05)
    if job.status == "cancelled":
        return job
    sets = f" (remove the sets it stored with DELETE /api/vectors/{{name}}: {', '.join(job.sets)})"
    raise JobFinished(f"Job {job.id} has {job.status}; only a queued or running job can be cancelled"
                      f"{sets if job.status == 'succeeded' else ''}.", param="id")


async def run_job(job: Job, engine: Engine, release: Callable[[], None]) -> None:
    """Generate the examples (for concepts), read them and store the sets: the model work in slices, each an
    engine job beside the requests being served, run from a thread of its own (``program``) that waits for
    each; the sets are stored only if the job was not stopped meanwhile, all or none (``catalog.store_all``)."""
    svc, plan, table, loop = services(), job.plan, jobs(), asyncio.get_running_loop()
    control = job.control
    assert plan is not None and control is not None

    def progress(what: str) -> None:
        if job.active:
            job.progress = what

    def on_engine(work: Callable[[], T]) -> Callable[[], T]:
        def step() -> T:
            stopped(control)
            if svc.manager.engine is not engine:
                raise ModelNotLoaded(f"'{engine.model_id}' was unloaded before job {job.id} ended; learn again.")
            if job.status == "queued":
                job.status = "running"
            return work()
        return step

    run = Slices(svc.worker, loop, control, on_engine)

    def program() -> list[VectorSet]:
        examples = plan.texts
        if examples is None:
            writing = (f"the model writes {plan.count} answers about {', '.join(plan.concepts)} and {plan.count} "
                       f"{'about other topics' if plan.negatives == 'topics' else 'to neutral prompts'}")
            progress(writing)
            examples = generated(engine, plan.concepts, plan.count, plan.seed, plan.tokens, plan.negatives,
                                 lambda done: progress(f"{writing} ({done} of {2 * plan.count} written)"),
                                 run=run, control=control)
        return learn(engine, plan.name, plan.layers, examples, method=plan.method, position=plan.position,
                     source=plan.source(), progress=progress, run=run, control=control)

    try:
        with svc.worker.stoppable(control):
            sets = await asyncio.to_thread(program)
        stopped(control)  # a DELETE between the last slice and now: nothing is stored
        job.storing = True
        progress("storing the vector sets")
        await asyncio.to_thread(catalog.store_all, svc.steering, svc.settings.home, sets)
        job.end("succeeded", f"stored vector sets {', '.join(plan.names)}")
    except MillmError as exc:
        if control.cancel.is_set():  # stopped: by DELETE (already recorded), or an unload past its grace
            job.end("cancelled", f"cancelled: {exc.message} {NOTHING_STORED[0].upper()}{NOTHING_STORED[1:]}.", exc)
        else:
            job.end("failed", f"failed: {exc.message}", exc)
    except asyncio.CancelledError:  # the server is stopping: the slice running ends at its next step
        control.stop(Interrupted("The server stopped before the job ended."))
        job.end("failed", f"failed: interrupted (the server stopped before the job ended); {NOTHING_STORED}",
                Interrupted(f"The server stopped while job {job.id} ran (interrupted); {NOTHING_STORED}. Learn "
                            "again."))
        raise
    except Exception as exc:
        log.exception("learning job %s failed", job.id)
        job.end("failed", "failed", MillmError(f"Internal error: {exc}"))
    finally:
        job.control = None
        release()
        with contextlib.suppress(Exception):  # the record in memory is the answer; the store's is for a restart
            await asyncio.shield(asyncio.to_thread(table.save, job))
