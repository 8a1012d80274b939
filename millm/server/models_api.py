"""The models part of the management API (/api/models): what is on disk, its state, load, lock."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from quart import Blueprint

from millm.errors import InvalidParameter, ModelNotFound
from millm.registry import ModelEntry, register_path, unregister
from millm.server.api import body
from millm.server.auth import guard_management
from millm.server.state import services

bp = Blueprint("models_api", __name__, url_prefix="/api/models")
bp.before_request(guard_management)


def describe(entry: ModelEntry) -> dict[str, Any]:
    """One model as the management API shows it: where it lives, which engine, its state."""
    manager = services().manager
    state = manager.state_of(entry.id)
    out: dict[str, Any] = {"id": entry.id, "engine": entry.engine, "source": entry.source, "path": str(entry.path),
                           "quantization": entry.quantization, "revision": entry.revision, "state": state,
                           "locked": manager.locked == entry.id}
    if state == "ERROR":
        out["error"] = manager.errors[entry.id]
    return out


def find(model_id: str) -> ModelEntry:
    """The model an /api route names, by the rule /v1 uses (``ModelManager.named``; 404 otherwise)."""
    return services().manager.named(model_id)


@bp.get("")
async def list_models() -> Any:
    """Every model on disk, with its state (READY, LOADING, LOADED, UNLOADING, ERROR)."""
    return {"data": [describe(e) for e in services().manager.entries()]}


@bp.post("")
async def add_model() -> Any:
    """Register a model by path: {"path", "id"?} (a checkpoint directory or a <repo>.<QUANT>.gguf file)."""
    data = await body()
    path, model_id = data.get("path"), data.get("id")
    if not isinstance(path, str) or not path:
        raise InvalidParameter("'path' (a checkpoint directory or GGUF file) is required.", param="path")
    if model_id is not None and (not isinstance(model_id, str) or not model_id):
        raise InvalidParameter("'id' must be a non-empty string.", param="id")
    try:
        entry = await asyncio.to_thread(register_path, Path(path), services().settings, model_id)
    except ModelNotFound:  # a missing path and an unreadable one answer alike
        raise InvalidParameter("'path' is not a readable checkpoint directory or <repo>.<QUANT>.gguf file.",
                               param="path") from None
    return describe(entry), 201


@bp.get("/<path:model_id>")
async def get_model(model_id: str) -> Any:
    """One model."""
    return describe(find(model_id))


@bp.post("/<path:model_id>/load")
async def load_model(model_id: str) -> Any:
    """Load the model in place of the loaded one (checked first; running requests finish first)."""
    entry = find(model_id)
    manager = services().manager
    if manager.engine is None or manager.engine.model_id != entry.id:
        await manager.load(entry)
    return describe(entry)


@bp.post("/<path:model_id>/unload")
async def unload_model(model_id: str) -> Any:
    """Unload the model if it is the loaded one."""
    entry = find(model_id)
    manager = services().manager
    if manager.engine is not None and manager.engine.model_id == entry.id:
        await manager.unload()
    return describe(entry)


@bp.post("/<path:model_id>/lock")
async def lock_model(model_id: str) -> Any:
    """Lock the server to this model for steering: /v1 lists and serves only it until unlocked."""
    entry = find(model_id)
    services().manager.locked = entry.id
    return describe(entry)


@bp.post("/<path:model_id>/unlock")
async def unlock_model(model_id: str) -> Any:
    """Lift the lock."""
    entry = find(model_id)
    manager = services().manager
    if manager.locked == entry.id:
        manager.locked = None
    return describe(entry)


@bp.delete("/<path:model_id>")
async def delete_model(model_id: str) -> Any:
    """Forget a model registered by path; its files are never touched."""
    entry = find(model_id)
    manager = services().manager
    if manager.engine is not None and manager.engine.model_id == entry.id:
        raise InvalidParameter(f"'{entry.id}' is loaded; unload it first.", param="model")
    if not await asyncio.to_thread(unregister, entry.id, services().settings):
        raise InvalidParameter(f"'{entry.id}' is {entry.source}, not registered by path; only registered models "
                               "can be removed.", param="model")
    if manager.locked == entry.id:
        manager.locked = None
    return {"deleted": entry.id}

