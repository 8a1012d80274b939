"""Health routes: liveness, readiness and the inference backend's load. Never touch the engine thread."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from millm.server.state import services

bp = Blueprint("health", __name__, url_prefix="/api/health")


@bp.get("")
async def health() -> Any:
    """Liveness: the process answers."""
    return {"status": "ok"}


@bp.get("/ready")
async def ready() -> Any:
    """Readiness: a model is loaded and no load or unload is under way."""
    manager = services().manager
    model = manager.engine.model_id if manager.engine is not None else None
    is_ready = model is not None and manager.state is None
    return {"ready": is_ready, "model": model, "state": manager.state}, 200 if is_ready else 503


@bp.get("/inference")
async def inference() -> Any:
    """Which backend serves generation (``serial``, or ``cbm`` with continuous batching on an engine that batches:
    a llama.cpp model is served serially either way), the loaded model's identity (the ``X-miLLM-Model``
    fingerprint: model, revision, dtype, quantization, engine) and context window, and how busy it is.

    With batching: rows decoding in the batch, requests waiting for it, the batch's tokens/s over the
    last few seconds, how many generations it served, and the ones served serially by reason."""
    svc = services()
    worker, manager = svc.worker, svc.manager
    engine = manager.engine
    batching = worker.batching is not None and (engine is None or engine.capabilities.batchable)  # not llama.cpp
    body: dict[str, Any] = {
        "backend": "cbm" if batching else "serial",
        "model": manager.engine.model_id if manager.engine is not None else None,
        "engine": manager.engine.engine_name if manager.engine is not None else None,
        "fingerprint": engine.fingerprint if engine is not None else None,
        "context_window": engine.context_window if engine is not None else None,
        "state": manager.state,
        "in_flight": worker.running,
        "queue_depth": worker.pending - worker.running,
        "max_queue": worker.max_queue,
    }
    if batching and worker.batching is not None:
        scheduler = worker.scheduler
        body["batch"] = {
            "active_rows": scheduler.active_rows if scheduler is not None else 0,
            "queued": scheduler.queued if scheduler is not None else 0,
            "tokens_per_second": round(scheduler.tokens_per_second(), 2) if scheduler is not None else 0.0,
            "max_rows": worker.batching.max_rows,
            "slot_tokens": worker.batching.slot_len,
            "batched_requests": worker.batched,
            "serial_fallbacks": dict(worker.fallbacks),
        }
    return body
