"""The probes part of the management API (/api/probes): probes listed, shown, removed, imported, exported,
attached (served on every generation request of their model) and detached, and learned as background jobs.

``POST /api/probes/learn`` checks the whole body and the loaded model first (400 before any model work), then
answers 202 with a job ``GET /api/probes/jobs/{id}`` follows and ``DELETE /api/probes/jobs/{id}`` cancels; its
model work runs in slices on the engine thread (``millm.server.slices``), as vector learning's does, so requests
are served between two, and the probe is stored only if the job was not stopped meanwhile. The job table is a
``millm.server.jobs`` table kept in the SQLite store (a restart lists it), with vector learning's rules."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from quart import Blueprint, request

from millm.engine.base import Engine
from millm.errors import InvalidParameter, MillmError
from millm.names import check_name
from millm.probes import catalog
from millm.probes.asks import Ask
from millm.probes.learn import check_options, learn
from millm.probes.probe import DEFAULT_FPR, Probe, identity
from millm.probes.serving import watches
from millm.requests.validation import SEED_MAX, check_int
from millm.server import jobs as job_tables
from millm.server.api import body, use_names
from millm.server.jobs import Job, Kind, Table
from millm.server.slices import Slices, start_on_engine, store
from millm.server.state import services
from millm.server.vector_jobs import (
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


class ProbeJobRunning(MillmError):
    """Only one probe learning job runs at a time."""

    status, type, code = 409, "invalid_request_error", "probe_job_running"


KIND = Kind("probes.learn", "probe learning job", "/api/probes/jobs", "probejob_", ProbeJobRunning, param="name",
            again="Learn again.", about=lambda job: f" ('{job.fields['name']}')",
            undo=lambda job: f" (remove the probe it stored with DELETE /api/probes/{job.fields['name']})")


def jobs() -> Table:
    """The current app's probe learning jobs (read from the store the first time it is asked for)."""
    return job_tables.table(KIND, store)


def view(job: Job) -> dict[str, Any]:
    """A probe learning job as the API shows it (the probe's summary once it succeeded)."""
    return {"id": job.id, "object": "probes.learn_job", "name": job.fields["name"], "status": job.status,
            "progress": job.progress, "created": int(job.created), "probe": job.fields.get("probe"),
            "error": job.error}


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


@bp.post("/learn")
async def learn_probe() -> Any:
    """Learn a probe: ``{"name", "concepts" | "positive"+"negative" (texts or *_file uploads), "layer"?,
    "method"?, "aggregation"?, "span"?, "target_fpr"?, "window"? (a rolling_mean's), "examples"?, "tokens"?,
    "seed"?}``; 202 with the job."""
    data = await body()
    options = {"method": data.get("method", "diffmean"), "aggregation": data.get("aggregation", "max"),
               "span": data.get("span", "response"), "target_fpr": data.get("target_fpr", DEFAULT_FPR),
               "window": data.get("window")}
    options["window"] = check_options(**options)
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
    job = await start_on_engine(jobs(), {"name": name, "probe": None}, engine,
                                *_work(engine, name, layers[0], options, texts, extra, seed))
    return view(job), 202, {"Location": f"/api/probes/jobs/{job.id}"}


@bp.get("/jobs")
async def list_jobs() -> Any:
    """The probe learning jobs kept (the newest 64, across restarts), newest first."""
    return {"object": "list", "data": [view(j) for j in jobs().newest()]}


@bp.get("/jobs/<job_id>")
async def get_job(job_id: str) -> Any:
    """A probe learning job: status queued|running|succeeded|failed|cancelled, progress, the probe's summary once
    it succeeded, the error body once it failed or was cancelled (a job running when its server stopped reads
    failed, error code ``interrupted``)."""
    return view(jobs().get(job_id))


@bp.delete("/jobs/<job_id>")
async def cancel_job(job_id: str) -> Any:
    """Cancel a queued or running probe learning job: 200 the job, status ``cancelled``, no probe stored (its slice
    running ends at its next decode step). Cancelling a cancelled job again answers the same; a job that
    succeeded or failed is a 409 ``job_finished``; an unknown id a 404 ``job_not_found``."""
    return view(await jobs().cancel(job_id))


def _work(engine: Engine, name: str, layer: int, options: dict[str, Any], texts: Examples | None,
          extra: dict[str, Any], seed: int) -> tuple[Callable[[Job, Slices], Probe], Callable[[Job, Probe], str]]:
    """A probe learning job's model work (write the examples for concepts, read them, learn the probe) and how it
    keeps what it made (the probe stored, its summary on the job)."""
    home = services().settings.home

    def program(job: Job, run: Slices) -> Probe:
        examples = texts
        if examples is None:
            writing = f"the model writes {2 * extra['count']} answers"
            job.say(writing)
            examples = generated(engine, extra["concepts"], extra["count"], extra["seed"], extra["tokens"],
                                 extra["negatives"], lambda done: job.say(f"{writing} ({done} written)"),
                                 run=run, control=run.control)
            source: dict[str, object] = {"concepts": list(extra["concepts"]), "negatives": extra["negatives"]}
        else:
            source = {"given": "POST /api/probes/learn"}
        job.say("reading the examples")
        return learn(engine, name, examples, layer, seed=seed, source=source, run=run, control=run.control,
                     **options)

    def keep(job: Job, probe: Probe) -> str:
        job.say(f"storing probe {name}")
        catalog.save(home, probe)  # one file written whole, or none
        job.fields["probe"] = probe.summary()
        return f"stored probe {name}"

    return program, keep
