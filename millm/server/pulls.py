"""Pulling a model from the Hugging Face Hub through the management API (the console's Models page).

``POST /api/pulls {"model": "REPO[:QUANT]", "id", "revision"}`` runs ``millm models pull``'s work (millm.hub,
the only code that touches the network, and only when asked) as a background job: one at a time (409 while
one runs), its bytes counted as they arrive, its refusal kept as the error body the CLI would print. The newest
``KEPT`` jobs are listed by ``GET /api/pulls``; they live as long as the server.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from quart import Blueprint, current_app
from rich.progress import Progress

from millm.config import Settings
from millm.errors import MillmError
from millm.hub import PullResult, PullSpec, parse_spec, pull
from millm.server.api import body
from millm.server.auth import guard_management
from millm.server.state import services

bp = Blueprint("pulls", __name__, url_prefix="/api/pulls")
bp.before_request(guard_management)
EXTENSION = "millm_pulls"
KEPT = 16


class PullRunning(MillmError):
    """Only one pull runs at a time."""

    status, type, code = 409, "invalid_request_error", "pull_running"


class PullNotFound(MillmError):
    status, type, code = 404, "invalid_request_error", "pull_not_found"


class PullFailed(MillmError):
    """A pull that ended on something other than the Hub's or miLLM's own refusals."""

    status, type, code = 500, "server_error", "pull_failed"


@dataclass
class Pull:
    """One pull: what was asked, how far it is, and how it ended."""

    model: str
    model_id: str | None
    revision: str | None
    id: str = field(default_factory=lambda: "pull-" + uuid.uuid4().hex[:12])
    created: float = field(default_factory=time.time)
    status: str = "running"
    finished: float | None = None
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    progress: Progress = field(default_factory=lambda: Progress(disable=True))

    def view(self) -> dict[str, Any]:
        """The job as the API shows it; bytes summed over the files started so far (a total is known per file)."""
        tasks = self.progress.tasks
        return {"id": self.id, "model": self.model, "as": self.model_id, "revision": self.revision,
                "status": self.status, "created": self.created, "finished": self.finished,
                "files_started": len(tasks), "bytes_done": int(sum(t.completed for t in tasks)),
                "bytes_total": int(sum(t.total or 0 for t in tasks)), "result": self.result, "error": self.error}

    def succeed(self, result: PullResult) -> None:
        self.result = {"model": result.entry.id, "engine": result.entry.engine, "commit": result.commit,
                       "downloaded": result.downloaded, "unchanged": result.unchanged}
        self.status, self.finished = "succeeded", time.time()

    def fail(self, error: MillmError) -> None:
        self.error = error.body()["error"]
        self.status, self.finished = "failed", time.time()


def pulls() -> OrderedDict[str, Pull]:
    """The current app's pulls, oldest first."""
    table: OrderedDict[str, Pull] = current_app.extensions.setdefault(EXTENSION, OrderedDict())
    return table


def run(job: Pull, spec: PullSpec, settings: Settings) -> None:
    """The pull itself, on a worker thread; every ending is recorded on ``job``."""
    try:
        job.succeed(pull(spec, settings, model_id=job.model_id, revision=job.revision, progress=job.progress))
    except MillmError as exc:
        job.fail(exc)
    except Exception as exc:  # a job's thread has no one to raise to: its record says what happened
        job.fail(PullFailed(f"Pulling {job.model} failed: {type(exc).__name__}: {exc}"))


@bp.post("")
async def start_pull() -> Any:
    """Start pulling a model from the Hub: 202 with the job; 409 while another pull runs."""
    data = await body()
    spec = parse_spec(data["model"])  # a malformed spec is a 400 now, not a failed job
    table = pulls()
    running = next((j for j in table.values() if j.status == "running"), None)
    if running is not None:
        raise PullRunning(f"Pull {running.id} ({running.model}) is running; one pull runs at a time.")
    job = Pull(data["model"], data.get("id"), data.get("revision"))
    table[job.id] = job
    while len(table) > KEPT:
        table.popitem(last=False)
    current_app.add_background_task(run, job, spec, services().settings)  # a plain function: Quart runs it on a thread
    return job.view(), 202


@bp.get("")
async def list_pulls() -> Any:
    """The newest pulls, newest first."""
    return {"data": [j.view() for j in reversed(pulls().values())]}


@bp.get("/<pull_id>")
async def get_pull(pull_id: str) -> Any:
    """One pull's progress and ending."""
    job = pulls().get(pull_id)
    if job is None:
        raise PullNotFound(f"No pull has id '{pull_id}' (the newest {KEPT} are kept); see GET /api/pulls.")
    return job.view()
