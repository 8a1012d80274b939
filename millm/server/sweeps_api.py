"""Strength sweeps in the management API (/api/sweeps): ``millm steer sweep``'s measure as a background job.

``POST /api/sweeps`` checks the whole body against the loaded model and the attached SAEs first (a 4xx before any
model work, nothing left running), then answers 202 with a job that ``GET /api/sweeps/{id}`` follows; its result
is the sweep as ``millm steer sweep --json`` prints it, the same numbers for the same seed, with every answer
decoded beside it. One sweep runs at a time.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from millm.server.api import body, use_names
from millm.server.sweep_jobs import plan_of, start, sweep_jobs, view

bp = Blueprint("sweeps_api", __name__, url_prefix="/api/sweeps")
use_names(bp)


@bp.post("")
async def start_sweep() -> Any:
    """Sweep a feature over strengths in the background: {"sae", "feature", "strengths"?, "prompts"?,
    "held_out"?, "tokens"?, "seed"?, "concepts"?, "scope"?}.

    ``sae`` is an SAE or vector set attached to the loaded (transformers) model, ``feature`` one of its indices.
    Each strength's answers to the first ``prompts`` calibration prompts (``tokens`` each, prompt ``i`` seeded
    ``seed + i``, steered where ``scope`` says) are measured as ``millm steer sweep`` measures them: concept rate
    (answers mentioning ``concepts``, default the label's words), fluency and relevance against the unsteered
    answers, strengths added where fluency gives way; the strength chosen is verified on ``held_out`` held-out
    prompts, and recommended when its 90% interval reaches the target. Refused before any model work:
    strengths that are not 1 to 32 distinct numbers within ±200, a feature past the SAE's width, an SAE not
    attached, a model that cannot steer and score (llama.cpp) with 400; no model with 503; another sweep queued
    or running with 409 ``sweep_job_running``. Then 202 with the job."""
    data = await body()
    job = await start(*plan_of(data))
    return view(job), 202, {"Location": f"/api/sweeps/{job.id}"}


@bp.get("")
async def list_sweeps() -> Any:
    """The sweeps kept (the newest 64, across restarts), newest first."""
    return {"data": [view(j) for j in sweep_jobs().newest()]}


@bp.get("/<job_id>")
async def get_sweep(job_id: str) -> Any:
    """A sweep: status queued|running|succeeded|failed|cancelled, progress, its request, and once it succeeded
    its ``result`` (``millm steer sweep --json``'s body) and every ``answers`` set by strength; the error body once
    it failed or was cancelled (a sweep running when its server stopped reads failed, error code
    ``interrupted``)."""
    return view(sweep_jobs().get(job_id))


@bp.delete("/<job_id>")
async def cancel_sweep(job_id: str) -> Any:
    """Cancel a queued or running sweep (its slice running ends at its next decode step): 200 the job, status
    ``cancelled``; a sweep that ended is a 409 ``sweep_finished``, an unknown id a 404."""
    return view(await sweep_jobs().cancel(job_id))
