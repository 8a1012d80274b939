"""The probes part of the management API (/api/probes): probes listed, shown, removed, imported, exported,
attached (served on every generation request of their model) and detached, and learned as background jobs.

``POST /api/probes/learn`` checks the whole body and the loaded model first (400 before any model work), then
answers 202 with a job ``GET /api/probes/jobs/{id}`` follows; its model work runs in slices on the engine
thread (``EngineWorker.call``), as vector learning's does, so requests are served between two. The job table
lives in the server's memory (the newest ``JOBS_KEPT``)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from quart import Blueprint, current_app, request

from millm.engine.base import Engine, StepControl
from millm.errors import InvalidParameter, MillmError
from millm.names import check_name
from millm.probes import catalog
from millm.probes.asks import Ask
from millm.probes.learn import check_options, learn
from millm.probes.probe import DEFAULT_FPR, Probe, identity
from millm.probes.serving import watches
from millm.requests.validation import SEED_MAX, check_int
from millm.server.api import body, use_names
from millm.server.state import services
from millm.server.vector_jobs import (
    JobNotFound,
    check_sources,
    generated_examples,
    given_examples,
    layers_of,
    learning_engine,
    uploaded,
)
from millm.vectors.learn import Examples, generated

bp = Blueprint("probes_api", __name__, url_prefix="/api/probes")
use_names(bp)
JOBS = "millm.probe_jobs"
JOBS_KEPT = 64
T = TypeVar("T")


def describe(probe: Probe) -> dict[str, Any]:
    """A probe as the API lists it: its document less direction, scores and texts, and how it is attached."""
    how = catalog.attached(services().settings.home).get(probe.name)
    return {**probe.summary(), "attached": how}


@bp.get("")
async def list_probes() -> Any:
    home = services().settings.home
    probes = await asyncio.to_thread(lambda: [catalog.load(home, n) for n in catalog.names(home)])
    return {"object": "list", "data": [describe(p) for p in probes]}


@bp.get("/<name:name>")
async def get_probe(name: str) -> Any:
    probe = await asyncio.to_thread(catalog.load, services().settings.home, name)
    return {**describe(probe), "scores": probe.scores}


@bp.delete("/<name:name>")
async def delete_probe(name: str) -> Any:
    await asyncio.to_thread(catalog.remove, services().settings.home, name)
    return {"name": name, "deleted": True}


@bp.get("/<name:name>/export")
async def export_probe(name: str) -> Any:
    """The probe's document, direction inline (what import takes)."""
    return (await asyncio.to_thread(catalog.load, services().settings.home, name)).document()


@bp.post("/import")
async def import_probe() -> Any:
    """A probe document stored under its name (``?name=`` renames it; a name taken is a 409 unless
    ``?overwrite=true``)."""
    data = await request.body
    probe = catalog.read(data, "the body", request.args.get("name"))
    await asyncio.to_thread(catalog.save, services().settings.home, probe, request.args.get("overwrite") == "true")
    return describe(probe), 201


@bp.post("/<name:name>/attach")
async def attach_probe(name: str) -> Any:
    """Serve the probe on every generation request of its model, acting as ``{"action", "profile"}`` says
    (default flag): refused for a probe of another model than the loaded one (naming both), an action its
    aggregation cannot take, or a profile that does not fit."""
    data = await body()
    svc = services()
    probe = await asyncio.to_thread(catalog.load, svc.settings.home, name)
    ask = Ask(name, data.get("action", "flag"), data.get("profile"))
    engine = learning_engine()
    await svc.worker.call(watches, engine, svc.steering, [(probe, ask, True)])  # every refusal, on the engine
    await asyncio.to_thread(catalog.attach, svc.settings.home, name, ask.action, ask.profile)
    return describe(probe)


@bp.post("/<name:name>/detach")
async def detach_probe(name: str) -> Any:
    home = services().settings.home
    probe = await asyncio.to_thread(catalog.load, home, name)
    await asyncio.to_thread(catalog.detach, home, name)
    return describe(probe)


@dataclass(eq=False)
class Job:
    """A learning job: what the API shows, and the control that stops it."""

    id: str
    name: str
    status: str = "queued"  # queued | running | succeeded | failed
    progress: str = "waiting for the engine"
    created: float = field(default_factory=time.time)
    error: dict[str, Any] | None = None
    probe: dict[str, Any] | None = None
    control: StepControl = field(default_factory=StepControl)

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "object": "probes.learn_job", "name": self.name, "status": self.status,
                "progress": self.progress, "created": int(self.created), "probe": self.probe, "error": self.error}


def jobs() -> OrderedDict[str, Job]:
    table: OrderedDict[str, Job] = current_app.extensions.setdefault(JOBS, OrderedDict())
    return table


@bp.post("/learn")
async def learn_probe() -> Any:
    """Learn a probe: ``{"name", "concepts" | "positive"+"negative" (texts or *_file uploads), "layer"?,
    "method"?, "aggregation"?, "span"?, "target_fpr"?, "examples"?, "tokens"?, "seed"?}``; 202 with the job."""
    data = await body()
    options = {"method": data.get("method", "diffmean"), "aggregation": data.get("aggregation", "max"),
               "span": data.get("span", "response"), "target_fpr": data.get("target_fpr", DEFAULT_FPR)}
    check_options(**options)
    name = await asyncio.to_thread(catalog.check_new, services().settings.home, check_name(data["name"]))
    data, _ = uploaded(data)
    concepts = check_sources(*(data.get(k) for k in ("concepts", "positive", "negative")))
    extra = generated_examples(data) if concepts is not None else {}
    given = {k: v for k, v in data.items() if k != "seed"}  # a probe's seed also draws its held-out split
    texts = given_examples(given, "diffmean") if concepts is None else None
    seed = check_int("seed", data.get("seed", 0), low=0, high=SEED_MAX)
    engine = learning_engine()
    layers = layers_of(data.get("layer"), identity(engine).layers)
    if len(layers) != 1:
        raise InvalidParameter("A probe reads one layer; 'layer' names several.", param="layer")
    table = jobs()
    if any(j.status in ("queued", "running") for j in table.values()):
        raise InvalidParameter("A probe is being learned; one job learns at a time (see GET /api/probes/jobs).",
                               param="name")
    job = Job(f"probejob_{uuid.uuid4().hex[:24]}", name)
    table[job.id] = job
    while len(table) > JOBS_KEPT:
        table.popitem(last=False)
    current_app.add_background_task(_run, job, engine, name, layers[0], options, texts, extra, seed)
    return job.view(), 202


@bp.get("/jobs")
async def list_jobs() -> Any:
    return {"object": "list", "data": [j.view() for j in reversed(jobs().values())]}


@bp.get("/jobs/<job_id>")
async def get_job(job_id: str) -> Any:
    job = jobs().get(job_id)
    if job is None:
        raise JobNotFound(f"No probe learning job has id '{job_id}'; see GET /api/probes/jobs.", param="id")
    return job.view()


async def _run(job: Job, engine: Engine, name: str, layer: int, options: dict[str, Any], texts: Examples | None,
               extra: dict[str, Any], seed: int) -> None:
    """Write the examples (for concepts), learn the probe in slices on the engine thread, store it."""
    svc, loop = services(), asyncio.get_running_loop()

    def run(work: Callable[[], T]) -> T:
        job.status = "running"
        return asyncio.run_coroutine_threadsafe(svc.worker.call(work), loop).result()

    def program() -> Probe:
        examples = texts
        if examples is None:
            job.progress = f"the model writes {2 * extra['count']} answers"
            examples = generated(engine, extra["concepts"], extra["count"], extra["seed"], extra["tokens"],
                                 extra["negatives"], run=run, control=job.control)
            source: dict[str, object] = {"concepts": list(extra["concepts"]), "negatives": extra["negatives"]}
        else:
            source = {"given": "POST /api/probes/learn"}
        job.progress = "reading the examples"
        return learn(engine, name, examples, layer, seed=seed, source=source, run=run, control=job.control,
                     **options)

    try:
        probe = await asyncio.to_thread(program)
        await asyncio.to_thread(catalog.save, svc.settings.home, probe)
        job.status, job.progress, job.probe = "succeeded", f"stored probe {name}", probe.summary()
    except MillmError as exc:
        job.status, job.progress, job.error = "failed", f"failed: {exc.message}", exc.body()
    except Exception as exc:  # reported on the job, never lost
        job.status, job.progress = "failed", "failed"
        job.error = MillmError(f"Internal error: {exc}").body()

