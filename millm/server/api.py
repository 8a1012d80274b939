"""The management API (/api): SAEs, steering, profiles, monitoring. JSON in, JSON out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

from quart import Blueprint, Response, request
from quart.blueprints import BlueprintSetupState
from werkzeug.routing import BaseConverter, ValidationError

from millm.errors import InvalidParameter, InvalidSAE, ModelNotLoaded
from millm.names import ROUTE_WORDS
from millm.paths import user_path
from millm.render import sse
from millm.research.figures import sweep_figure
from millm.sae.cards import parse_index, read_card
from millm.server import api_bodies
from millm.server.auth import guard_management
from millm.server.bodies import read_json
from millm.server.state import services
from millm.steering.target import SteeringTarget

log = logging.getLogger(__name__)
bp = Blueprint("api", __name__, url_prefix="/api")
T = TypeVar("T")
PUSH_GAP_S = 0.25  # the monitoring stream's shortest gap between two events: a burst of requests is one event
PUSH_HEARTBEAT_S = 15.0  # a comment line this often on a quiet stream, so a gone client is noticed
PUSH_RECENT = 20  # requests each monitoring event carries (the page's trend lines)


class NameConverter(BaseConverter):
    """``<name:...>``: a path segment that is not one of the routes' own words, so /api/profiles/<name> never
    shadows /api/profiles/import or /deactivate (a wrong method on those answers 405, not a profile lookup)."""

    def to_python(self, value: str) -> str:
        if value in ROUTE_WORDS:
            raise ValidationError()
        return value


def use_names(blueprint: Blueprint) -> None:
    """Register the ``name`` converter before ``blueprint``'s routes are added, and guard its routes."""
    def register(state: BlueprintSetupState) -> None:
        state.app.url_map.converters.setdefault("name", NameConverter)

    blueprint.record_once(register)
    blueprint.before_request(guard_management)


use_names(bp)


async def body() -> dict[str, Any]:
    data = await read_json(required=False)
    if not isinstance(data, dict):
        raise InvalidParameter("The request body must be a JSON object.")
    api_bodies.check(request.endpoint, data)
    return data


def engine() -> SteeringTarget:
    """The loaded model's steering, which must exist."""
    manager = services().manager
    manager.check_not_busy()
    if manager.engine is None:
        raise ModelNotLoaded("No model is loaded.")
    target = manager.engine.steering_target()
    if target is None:
        raise InvalidParameter(f"'{manager.engine.model_id}' runs on {manager.engine.engine_name}, which has no SAE "
                               "hooks; load a transformers model to steer.", param="model")
    return target


def steering_state() -> dict[str, Any]:
    eng = engine()
    return {**eng.steering.snapshot(), "live": eng.steering.live}


async def command(fn: Callable[..., T], *args: Any) -> T:
    """Run a steering or monitoring change on the engine thread, between decode steps."""
    return await services().worker.command(fn, *args)


# SAEs
def steerable() -> SteeringTarget | None:
    """The loaded model's steering if it has any, else None (for read-only views)."""
    eng = services().manager.engine
    return eng.steering_target() if eng is not None else None


@bp.get("/saes")
async def list_saes() -> Any:
    """Registered SAEs and where each is attached."""
    svc, eng = services(), steerable()
    return {"data": [svc.steering.view(r, eng) for r in svc.steering.store.saes()]}


@bp.post("/saes")
async def add_sae() -> Any:
    """Register an SAE by path: {"path", "name"?, "labels"?}. ``labels`` names a file inside the SAE's own
    folder (default: its labels.json); a path that is missing and one that cannot be read as an SAE answer
    the same error, so the route tells nothing about the server's files."""
    data = await body()
    path, name, labels = data.get("path"), data.get("name"), data.get("labels")
    if not isinstance(path, str) or not path or "\0" in path:
        raise InvalidParameter("'path' (an SAE folder, or a Gemma Scope params.npz) is required.", param="path")
    if name is not None and not isinstance(name, str):
        raise InvalidParameter("'name' must be a string.", param="name")
    svc = services()
    try:
        folder = sae_folder(Path(path))
        label_file = labels_within(folder, labels)
        record = await asyncio.to_thread(svc.steering.register_sae, path, name, label_file)
    except (InvalidSAE, OSError) as exc:
        log.info("POST /api/saes refused %r: %s", path, exc)
        raise InvalidParameter("'path' is not a readable SAE on this server (an SAE folder, or a Gemma Scope "
                               "params.npz).", param="path") from None
    return svc.steering.view(record, steerable()), 201


def sae_folder(path: Path) -> Path:
    """The folder an SAE at ``path`` lives in (``path`` itself, or a params.npz file's folder)."""
    resolved = user_path(path).resolve()
    return resolved if resolved.is_dir() else resolved.parent


def labels_within(folder: Path, labels: Any) -> Path | None:
    """The labels file a registration names, which must lie inside the SAE's ``folder`` (a relative name is
    taken from there); None for the folder's own labels.json. Anything else is a 400 naming ``labels``."""
    if labels is None:
        return None
    if not isinstance(labels, str) or not labels or "\0" in labels:
        raise InvalidParameter("'labels' must name a JSON file inside the SAE's folder.", param="labels")
    file = (folder / user_path(labels)).resolve()
    if not file.is_relative_to(folder) or file == folder:
        raise InvalidParameter("'labels' must name a JSON file inside the SAE's own folder; labels are read "
                               "from nowhere else.", param="labels")
    return file


@bp.get("/saes/<sae_id>")
async def get_sae(sae_id: str) -> Any:
    """One SAE."""
    svc = services()
    return svc.steering.view(svc.steering.sae(sae_id), steerable())


@bp.post("/saes/<sae_id>/attach")
async def attach_sae(sae_id: str) -> Any:
    """Attach to a layer of the loaded model: {"layer"?} (default: the SAE's layer hint)."""
    data = await body()
    return await command(services().steering.attach, engine(), sae_id, data.get("layer"))


@bp.post("/saes/<sae_id>/detach")
async def detach_sae(sae_id: str) -> Any:
    """Detach from the loaded model."""
    return await command(services().steering.detach, engine(), sae_id)


@bp.get("/saes/<sae_id>/features")
async def sae_features(sae_id: str) -> Any:
    """Feature labels, filtered by ?q= (whole-word matches first, then features measured to steer)."""
    index = await asyncio.to_thread(services().steering.label_index, sae_id)
    return {"sae": sae_id, "features": index.rows(request.args.get("q"))}


@bp.get("/saes/<sae_id>/features/<index>")
async def sae_feature_card(sae_id: str, index: str) -> Any:
    """One feature's card: label, firing rate, max activation, top tokens, examples, promoted tokens; where its
    held-out measure kept the calibration sweep that chose its strength, that sweep as a ``figure``
    (``millm.research.figures``, as a sweep job draws)."""
    record = services().steering.sae(sae_id)
    d_sae = int(record["d_sae"])
    feature = parse_index(index, d_sae, sae_id)
    label = services().steering.store.label(sae_id, feature)
    card = await asyncio.to_thread(read_card, record["path"], feature, d_sae, name=sae_id,
                                   labels={feature: label} if label is not None else {})
    body = card.to_json()
    held = card.held_out
    if held is not None and held.sweep:
        body["figure"] = sweep_figure({"points": held.to_json()["sweep"], "target": held.target, "bound": held.bound,
                                       "chosen_strength": held.strength})
    return body


@bp.delete("/saes/<sae_id>")
async def delete_sae(sae_id: str) -> Any:
    """Forget an SAE (detaching it first)."""
    svc = services()
    svc.steering.sae(sae_id)
    eng = steerable()
    if eng is not None and sae_id in eng.steering.attachments:
        await command(svc.steering.detach, eng, sae_id)
    await asyncio.to_thread(svc.steering.store.delete_sae, sae_id)
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
    svc, eng = services().steering, engine()
    await command(lambda: svc.set_values(eng, data.get("sae"), data["values"], merge=merge))
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
    await command(services().steering.clear, engine())
    return steering_state()


@bp.post("/steering/enable")
async def enable_steering() -> Any:
    """Turn steering on."""
    await command(services().steering.set_enabled, engine(), True)
    return steering_state()


@bp.post("/steering/disable")
async def disable_steering() -> Any:
    """Turn steering off (values are kept)."""
    await command(services().steering.set_enabled, engine(), False)
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
        return await asyncio.to_thread(svc.profile_from_current, engine(), data["name"],
                                       data.get("description", "")), 201
    return await asyncio.to_thread(svc.save_profile, data, overwrite=False), 201


@bp.get("/profiles/<name:name>")
async def get_profile(name: str) -> Any:
    """One profile."""
    return services().steering.profile(name)


@bp.put("/profiles/<name:name>")
async def update_profile(name: str) -> Any:
    """Replace a profile's description and entries."""
    svc = services().steering
    svc.profile(name)
    return await asyncio.to_thread(svc.save_profile, {**await body(), "name": name}, overwrite=True)


@bp.delete("/profiles/<name:name>")
async def delete_profile(name: str) -> Any:
    """Delete a profile (one backed by a cluster or circuit goes with it); deleting the active profile
    deactivates it first, so no response ever names a profile that is gone."""
    svc = services().steering
    svc.profile(name)
    await deactivate_if_active(name)
    await stop_sensing(name)
    await asyncio.to_thread(svc.delete_profile, name)
    return {"deleted": name}


async def deactivate_if_active(name: str) -> None:
    """Deactivate ``name`` on the loaded model when it is the active profile (its values go with it)."""
    target = steerable()
    if target is not None and target.steering.active_profile == name:
        await command(services().steering.deactivate, target)


async def stop_sensing(name: str) -> None:
    """Stop cluster ``name``'s sensing on the loaded model (a cluster deleted or replaced senses nothing)."""
    target = steerable()
    if target is not None and services().steering.cluster_sensing(target, name) is not None:
        await command(services().steering.stop_sensing, target, name)


@bp.post("/profiles/<name:name>/activate")
async def activate_profile(name: str) -> Any:
    """Make a profile's values the live values."""
    await command(services().steering.activate, engine(), name)
    return {"active": name, **steering_state()}


@bp.post("/profiles/deactivate")
async def deactivate_profile() -> Any:
    """Clear the live values the active profile set (values it did not set stay; without an active profile
    nothing changes)."""
    await command(services().steering.deactivate, engine())
    return {"active": None, **steering_state()}


@bp.get("/profiles/<name:name>/export")
async def export_profile(name: str) -> Any:
    """The profile document, as import takes it."""
    return services().steering.export(name)


@bp.post("/profiles/import")
async def import_profile() -> Any:
    """Import a profile document (a name clash is 409 unless ?overwrite=true)."""
    overwrite = request.args.get("overwrite", "false").lower() in ("true", "1")
    svc = services().steering
    return await asyncio.to_thread(svc.save_profile, await body(), overwrite=overwrite), 201


# monitoring
@bp.get("/monitoring")
async def get_monitoring() -> Any:
    """The monitoring configuration."""
    return engine().monitor.describe()


@bp.put("/monitoring")
async def put_monitoring() -> Any:
    """Configure monitoring: {"enabled", "sae", "features" or "top_k", "history"}."""
    data = await body()
    return await command(services().steering.configure_monitor, engine(), data)


@bp.get("/monitoring/history")
async def monitoring_history() -> Any:
    """Per-request summaries, oldest first."""
    return {"data": list(engine().monitor.history)}


@bp.get("/monitoring/stats")
async def monitoring_stats() -> Any:
    """Running statistics over every position monitored."""
    return engine().monitor.stats()


@bp.get("/monitoring/events")
async def monitoring_events() -> Any:
    """Server-sent events, one ``monitoring`` event now and one after every change (a request recorded, a new
    configuration, a cleared history), at most one per ``PUSH_GAP_S``: the configuration, the running
    statistics and the newest ``PUSH_RECENT`` requests. The stream ends when the model is unloaded."""
    monitor, manager = engine().monitor, services().manager
    loop = asyncio.get_running_loop()

    def current() -> bool:  # the monitor is still the loaded model's
        target = manager.engine.steering_target() if manager.engine is not None else None
        return target is not None and target.monitor is monitor
    changed = asyncio.Event()

    def wake() -> None:  # called on the thread that changed the monitor
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is listening
            loop.call_soon_threadsafe(changed.set)

    async def events() -> AsyncIterator[str]:
        stop = monitor.listen(wake)
        try:
            while current():
                changed.clear()
                yield sse.event("monitoring", {"config": monitor.describe(), "stats": monitor.stats(),
                                               "recent": list(monitor.history)[-PUSH_RECENT:]})
                while not changed.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), PUSH_HEARTBEAT_S)
                    if not changed.is_set():
                        yield sse.COMMENT
                await asyncio.sleep(PUSH_GAP_S)
        finally:
            stop()

    response = Response(events(), mimetype="text/event-stream", headers={"Cache-Control": "no-store"})
    response.timeout = None
    return response


@bp.delete("/monitoring/history")
async def clear_monitoring_history() -> Any:
    """Forget the history (statistics stay)."""
    await command(engine().monitor.clear_history)
    return {"data": []}
