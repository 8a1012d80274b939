"""Pulling a model from the Hugging Face Hub through the management API (the console's Models page).

``POST /api/pulls {"model": "REPO[:QUANT]", "id", "revision"}`` runs ``millm models pull``'s work (millm.hub,
the only code that touches the network, and only when asked) as a background job of a ``millm.server.jobs``
table: one at a time (409 ``pull_running`` while one runs), its bytes counted as they arrive, its refusal kept as
the error body the CLI would print. ``GET /api/pulls`` lists the newest 64, kept in the SQLite store across
restarts (a pull running when its server stopped reads failed, error ``interrupted``; pulling again continues
from what it downloaded).
"""

from __future__ import annotations

import asyncio
from typing import Any

from quart import Blueprint, current_app
from rich.progress import Progress

from millm.errors import MillmError
from millm.hub import PullSpec, parse_spec, pull
from millm.server import jobs as job_tables
from millm.server.api import body
from millm.server.auth import guard_management
from millm.server.jobs import Job, Kind, Table
from millm.server.slices import store
from millm.server.state import services

bp = Blueprint("pulls", __name__, url_prefix="/api/pulls")
bp.before_request(guard_management)


class PullRunning(MillmError):
    """Only one pull runs at a time."""

    status, type, code = 409, "invalid_request_error", "pull_running"


class PullNotFound(MillmError):
    status, type, code = 404, "invalid_request_error", "pull_not_found"


class PullFailed(MillmError):
    """A pull that ended on something other than the Hub's or miLLM's own refusals."""

    status, type, code = 500, "server_error", "pull_failed"


KIND = Kind("hub.pull", "pull", "/api/pulls", "pull-", PullRunning, not_found=PullNotFound, waiting="downloading",
            left="what it downloaded stays, and pulling again continues from it", again="Pull again.",
            about=lambda job: f" ({job.fields['model']})")


def pulls() -> Table:
    """The current app's pulls (read from the store the first time it is asked for)."""
    return job_tables.table(KIND, store)


def counts(progress: Progress) -> dict[str, int]:
    """Bytes summed over the files started so far (a total is known per file)."""
    tasks = progress.tasks
    return {"files_started": len(tasks), "bytes_done": int(sum(t.completed for t in tasks)),
            "bytes_total": int(sum(t.total or 0 for t in tasks))}


def view(job: Job) -> dict[str, Any]:
    """A pull as the API shows it: its counts read live while this process pulls, else as it ended."""
    f = job.fields
    counted = counts(job.live) if isinstance(job.live, Progress) else {
        k: f.get(k, 0) for k in ("files_started", "bytes_done", "bytes_total")}
    return {"id": job.id, "model": f["model"], "as": f["as"], "revision": f["revision"], "status": job.status,
            "created": job.created, "finished": job.finished, **counted, "result": f.get("result"),
            "error": job.error["error"] if job.error else None}


async def run(job: Job, spec: PullSpec, progress: Progress) -> str:
    """The pull itself, on a worker thread, its bytes counted in ``progress``: its result and final counts on the
    job."""
    f, settings = job.fields, services().settings
    try:
        result = await asyncio.to_thread(pull, spec, settings, model_id=f["as"], revision=f["revision"],
                                         progress=progress)
    except MillmError:
        raise
    except Exception as exc:  # the job's record says what happened, as the CLI would
        raise PullFailed(f"Pulling {f['model']} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        f.update(counts(progress))
        job.live = None
    f["result"] = {"model": result.entry.id, "engine": result.entry.engine, "commit": result.commit,
                   "downloaded": result.downloaded, "unchanged": result.unchanged}
    return f"pulled {f['model']} as {result.entry.id}"


@bp.post("")
async def start_pull() -> Any:
    """Start pulling a model from the Hub: 202 with the job; 409 ``pull_running`` while another pull runs."""
    data = await body()
    spec = parse_spec(data["model"])  # a malformed spec is a 400 now, not a failed job
    table = pulls()
    fields = {"model": data["model"], "as": data.get("id"), "revision": data.get("revision"), "result": None}
    job = await table.open(fields, status="running")
    job.live = progress = Progress(disable=True)  # the view reads the bytes from it while the pull runs
    current_app.add_background_task(table.execute, job, lambda: run(job, spec, progress))
    return view(job), 202


@bp.get("")
async def list_pulls() -> Any:
    """The newest pulls (64, across restarts), newest first."""
    return {"data": [view(j) for j in pulls().newest()]}


@bp.get("/<pull_id>")
async def get_pull(pull_id: str) -> Any:
    """One pull's progress and ending."""
    return view(pulls().get(pull_id))
