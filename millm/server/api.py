"""The management API (/api): SAEs, steering, profiles, monitoring. JSON in, JSON out."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, request

from millm.engine import TransformersEngine
from millm.errors import InvalidParameter, ModelNotLoaded, Unauthorized
from millm.steering.monitor import MAX_FEATURES, MonitorConfig
from millm.server.state import services

bp = Blueprint("api", __name__, url_prefix="/api")


@bp.before_request
async def require_admin_key() -> None:
    key = services().settings.admin_key
    if key and request.method not in ("GET", "HEAD") and request.headers.get("Authorization", "") != f"Bearer {key}":
        raise Unauthorized("Management changes need 'Authorization: Bearer <MILLM_ADMIN_KEY>'.")


async def body() -> dict[str, Any]:
    data = await request.get_json(force=True, silent=True)
    if data is None and (await request.get_data()):
        raise InvalidParameter("The request body is not valid JSON.")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidParameter("The request body must be a JSON object.")
    return data


def engine() -> TransformersEngine:
    """The loaded engine, which must be one that can be steered."""
    manager = services().manager
    manager.check_not_busy()
    if manager.engine is None:
        raise ModelNotLoaded("No model is loaded.")
    if manager.engine.steering is None:
        raise InvalidParameter(f"'{manager.engine.model_id}' runs on llama.cpp, which has no SAE hooks; load a "
                               "transformers model to steer.", param="model")
    return manager.engine


def steering_state() -> dict[str, Any]:
    eng = engine()
    return {**eng.steering.snapshot(), "live": eng.steering.live}


# SAEs
def steerable() -> TransformersEngine | None:
    """The loaded engine if it can carry SAEs, else None (for read-only views)."""
    eng = services().manager.engine
    return eng if eng is not None and eng.steering is not None else None


@bp.get("/saes")
async def list_saes() -> Any:
    """Registered SAEs and where each is attached."""
    svc, eng = services(), steerable()
    return {"data": [svc.steering.view(r, eng) for r in svc.steering.store.saes()]}


@bp.post("/saes")
async def add_sae() -> Any:
    """Register an SAE by path: {"path", "name"?, "labels"?}."""
    data = await body()
    if not isinstance(data.get("path"), str):
        raise InvalidParameter("'path' (a folder or file) is required.", param="path")
    svc = services()
    record = svc.steering.register_sae(data["path"], data.get("name"), data.get("labels"))
    return svc.steering.view(record, steerable()), 201


@bp.get("/saes/<sae_id>")
async def get_sae(sae_id: str) -> Any:
    """One SAE."""
    svc = services()
    return svc.steering.view(svc.steering.sae(sae_id), steerable())


@bp.post("/saes/<sae_id>/attach")
async def attach_sae(sae_id: str) -> Any:
    """Attach to a layer of the loaded model: {"layer"?} (default: the SAE's layer hint)."""
    data = await body()
    return services().steering.attach(engine(), sae_id, data.get("layer"))


@bp.post("/saes/<sae_id>/detach")
async def detach_sae(sae_id: str) -> Any:
    """Detach from the loaded model."""
    return services().steering.detach(engine(), sae_id)


@bp.get("/saes/<sae_id>/features")
async def sae_features(sae_id: str) -> Any:
    """Feature labels, filtered by ?q=."""
    svc = services()
    svc.steering.sae(sae_id)
    return {"sae": sae_id, "features": svc.steering.store.labels(sae_id, request.args.get("q"))}


@bp.delete("/saes/<sae_id>")
async def delete_sae(sae_id: str) -> Any:
    """Forget an SAE (detaching it first)."""
    svc = services()
    svc.steering.sae(sae_id)
    eng = steerable()
    if eng is not None and sae_id in eng.steering.attachments:
        svc.steering.detach(eng, sae_id)
    svc.steering.store.delete_sae(sae_id)
    return {"deleted": sae_id}


# steering
@bp.get("/steering")
async def get_steering() -> Any:
    """Live steering values per attached SAE."""
    return steering_state()


async def _set_values(merge: bool) -> Any:
    data = await body()
    if "values" not in data:
        raise InvalidParameter("'values' ({feature: strength}) is required.", param="values")
    services().steering.set_values(engine(), data.get("sae"), data["values"], merge=merge)
    return steering_state()


@bp.put("/steering")
async def put_steering() -> Any:
    """Replace one SAE's values: {"sae", "values": {"123": 40.0}}."""
    return await _set_values(merge=False)


@bp.patch("/steering")
async def patch_steering() -> Any:
    """Merge into one SAE's values; a strength of 0 removes the feature."""
    return await _set_values(merge=True)


@bp.delete("/steering")
async def clear_steering() -> Any:
    """Clear every value."""
    services().steering.clear(engine())
    return steering_state()


@bp.post("/steering/enable")
async def enable_steering() -> Any:
    """Turn steering on."""
    services().steering.set_enabled(engine(), True)
    return steering_state()


@bp.post("/steering/disable")
async def disable_steering() -> Any:
    """Turn steering off (values are kept)."""
    services().steering.set_enabled(engine(), False)
    return steering_state()


# profiles
@bp.get("/profiles")
async def list_profiles() -> Any:
    """Saved profiles."""
    eng = steerable()
    active = eng.steering.active_profile if eng is not None else None
    return {"data": services().steering.store.profiles(), "active": active}


@bp.post("/profiles")
async def create_profile() -> Any:
    """Save a profile: {"name", "description"?, "entries"} or {"name", "from_current": true}."""
    data = await body()
    svc = services().steering
    if data.get("from_current"):
        if not isinstance(data.get("name"), str):
            raise InvalidParameter("'name' is required.", param="name")
        return svc.profile_from_current(engine(), data["name"], data.get("description", "")), 201
    return svc.save_profile(data, overwrite=False), 201


@bp.get("/profiles/<name>")
async def get_profile(name: str) -> Any:
    """One profile."""
    return services().steering.profile(name)


@bp.put("/profiles/<name>")
async def update_profile(name: str) -> Any:
    """Replace a profile's description and entries."""
    svc = services().steering
    svc.profile(name)
    return svc.save_profile({**await body(), "name": name}, overwrite=True)


@bp.delete("/profiles/<name>")
async def delete_profile(name: str) -> Any:
    """Delete a profile."""
    svc = services().steering
    svc.profile(name)
    svc.store.delete_profile(name)
    return {"deleted": name}


@bp.post("/profiles/<name>/activate")
async def activate_profile(name: str) -> Any:
    """Make a profile's values the live values."""
    services().steering.activate(engine(), name)
    return {"active": name, **steering_state()}


@bp.post("/profiles/deactivate")
async def deactivate_profile() -> Any:
    """Clear the live values the active profile set."""
    services().steering.deactivate(engine())
    return {"active": None, **steering_state()}


@bp.get("/profiles/<name>/export")
async def export_profile(name: str) -> Any:
    """The profile document, as import takes it."""
    return services().steering.export(name)


@bp.post("/profiles/import")
async def import_profile() -> Any:
    """Import a profile document (a name clash is 409 unless ?overwrite=true)."""
    overwrite = request.args.get("overwrite", "false").lower() in ("true", "1")
    return services().steering.save_profile(await body(), overwrite=overwrite), 201


# monitoring
@bp.get("/monitoring")
async def get_monitoring() -> Any:
    """The monitoring configuration."""
    return engine().monitor.describe()


@bp.put("/monitoring")
async def put_monitoring() -> Any:
    """Configure monitoring: {"enabled", "sae", "features", "history"}."""
    data = await body()
    eng = engine()
    enabled = data.get("enabled", True)
    if not isinstance(enabled, bool):
        raise InvalidParameter("'enabled' must be true or false.", param="enabled")
    sae_id = data.get("sae")
    features = data.get("features", [])
    history = data.get("history", eng.monitor.config.history)
    if enabled:
        if sae_id is None and len(eng.steering.attachments) == 1:
            sae_id = next(iter(eng.steering.attachments))
        att = eng.steering.resolve_sae(sae_id) if sae_id is not None else None
        if att is None:
            raise InvalidParameter("'sae' (an attached SAE) is required to monitor.", param="sae")
        sae_id = att.sae_id
        if not isinstance(features, list) or not features or len(features) > MAX_FEATURES or not all(
                isinstance(f, int) and not isinstance(f, bool) and 0 <= f < att.sae.d_sae for f in features):
            raise InvalidParameter(f"'features' must be 1-{MAX_FEATURES} feature indices below {att.sae.d_sae}.",
                                   param="features")
    if isinstance(history, bool) or not isinstance(history, int) or not 1 <= history <= 100_000:
        raise InvalidParameter("'history' must be an integer from 1 to 100000.", param="history")
    eng.monitor.configure(MonitorConfig(enabled, sae_id, list(dict.fromkeys(features)), history))
    return eng.monitor.describe()


@bp.get("/monitoring/history")
async def monitoring_history() -> Any:
    """Per-request summaries, oldest first."""
    return {"data": list(engine().monitor.history)}


@bp.get("/monitoring/stats")
async def monitoring_stats() -> Any:
    """Running statistics over every position monitored."""
    return engine().monitor.stats()


@bp.delete("/monitoring/history")
async def clear_monitoring_history() -> Any:
    """Forget the history (statistics stay)."""
    engine().monitor.clear_history()
    return {"data": []}
