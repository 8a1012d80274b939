"""Health routes: liveness, readiness and the inference backend's load. Never touch the engine thread."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quart import Blueprint

from millm.server.state import services

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.engine.decode.driver import BatchSettings
    from millm.engine.worker import EngineWorker

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


def _model_fields(engine: Engine | None) -> dict[str, Any]:
    """The loaded model's id, engine, fingerprint and context window; each None when no model is loaded."""
    if engine is None:
        return {"model": None, "engine": None, "fingerprint": None, "context_window": None}
    return {"model": engine.model_id, "engine": engine.engine_name, "fingerprint": engine.fingerprint,
            "context_window": engine.context_window}


def _batch_fields(worker: EngineWorker, batching: BatchSettings) -> dict[str, Any]:
    """How busy the batch is (rows decoding, requests waiting, tokens/s; nothing yet before its scheduler starts),
    its size, and the generations it and the serial path served."""
    scheduler = worker.scheduler
    return {
        "active_rows": scheduler.active_rows if scheduler is not None else 0,
        "queued": scheduler.queued if scheduler is not None else 0,
        "tokens_per_second": round(scheduler.tokens_per_second(), 2) if scheduler is not None else 0.0,
        "max_rows": batching.max_rows,
        "slot_tokens": batching.slot_len,
        "batched_requests": worker.batched,
        "serial_fallbacks": dict(worker.fallbacks),
    }


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
        **_model_fields(engine),
        "state": manager.state,
        "in_flight": worker.running,
        "queue_depth": worker.pending - worker.running,
        "max_queue": worker.max_queue,
    }
    if batching and worker.batching is not None:
        body["batch"] = _batch_fields(worker, worker.batching)
    return body
