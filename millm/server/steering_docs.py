"""The management API's imported steering documents: /api/clusters and /api/circuits.

Importing a cluster or circuit also creates a profile of its name backed by it, so /api/profiles and a
request's ``profile`` take it too. Changes that touch the hooks (an import or dial that re-applies an
active document, an activation) run as engine commands, between decode steps.
"""

from __future__ import annotations

import asyncio
from typing import Any

from quart import Blueprint, request

from millm.server.api import (
    body,
    command,
    deactivate_if_active,
    engine,
    steerable,
    steering_state,
    stop_sensing,
    use_names,
)
from millm.server.state import services
from millm.steering.target import SteeringTarget

bp = Blueprint("steering_docs", __name__, url_prefix="/api")
use_names(bp)


def _target() -> tuple[SteeringTarget | None, str]:
    """The loaded model's steering (None when none can be steered) and the model documents are checked for."""
    target = steerable()
    return target, target.model_id if target is not None else services().settings.default_model


def _overwrite() -> bool:
    return request.args.get("overwrite", "false").lower() in ("true", "1")


def _active(target: SteeringTarget | None) -> str | None:
    return target.steering.active_profile if target is not None else None


def cluster_view(row: dict[str, Any], target: SteeringTarget | None) -> dict[str, Any]:
    """An imported cluster: its document, persistent dial λ (``intensity``), whether it is the active profile,
    and what it senses on the loaded model (``sensing``: null when it does not)."""
    sensing = services().steering.cluster_sensing(target, row["name"])
    return {**row, "active": row["name"] == _active(target), "sensing": sensing}


def circuit_view(row: dict[str, Any], target: SteeringTarget | None, model_id: str) -> dict[str, Any]:
    """An imported circuit: its document, whether it is active, and how it would serve now (``steering``)."""
    serving = services().steering.serving(target, row["name"], model_id)
    return {**row, "active": row["name"] == _active(target), "steering": serving.steering_field()}


# clusters
@bp.get("/clusters")
async def list_clusters() -> Any:
    """Imported clusters, each with its persistent dial."""
    target, _ = _target()
    return {"data": [cluster_view(r, target) for r in services().steering.store.documents("cluster")]}


@bp.post("/clusters/import")
async def import_cluster() -> Any:
    """Import a cluster document (a bad field is 400 naming its JSON pointer; a name clash 409 unless
    ?overwrite=true); creates the profile of its name."""
    data, overwrite = await body(), _overwrite()
    target, model_id = _target()
    svc = services().steering
    row = await command(lambda: svc.import_document("cluster", data, target, model_id, overwrite=overwrite))
    await stop_sensing(row["name"])  # a cluster imported over a sensing one senses again only when asked
    return cluster_view(row, target), 201


@bp.get("/clusters/<name:name>")
async def get_cluster(name: str) -> Any:
    """One cluster."""
    target, _ = _target()
    return cluster_view(services().steering.document("cluster", name), target)


@bp.put("/clusters/<name:name>/intensity")
async def set_cluster_intensity(name: str) -> Any:
    """Set the cluster's persistent dial: {"lambda": x}, bounded to [0, max] (its declared range's maximum,
    else MILLM_INTENSITY_MAX). An active cluster is re-applied at once; ``live`` says whether the live
    values are what runs now (false while a request's own steering is in place)."""
    data = await body()
    target, _ = _target()
    svc = services().steering
    row = await command(svc.set_cluster_dial, target, name, data.get("lambda"))
    return {**cluster_view(row, target), "live": target.steering.live if target is not None else None}


@bp.delete("/clusters/<name:name>")
async def delete_cluster(name: str) -> Any:
    """Delete a cluster and the profile it backs (deactivated first when active)."""
    svc = services().steering
    svc.document("cluster", name)
    await deactivate_if_active(name)
    await stop_sensing(name)
    await asyncio.to_thread(svc.delete_document, "cluster", name)
    return {"deleted": name}


@bp.post("/clusters/<name:name>/sensing")
async def sense_cluster(name: str) -> Any:
    """Switch sensing on for the cluster, ``{"min_members"?}`` (default 1): every generation request then reads
    its members' features through its SAE, and the first response position where at least ``min_members``
    exceed their thresholds is a sensing event. Its SAE must be attached (400 ``sae``), each member must have a
    threshold (given, or half its card's max activation; 400 ``/members/i/threshold``)."""
    data = await body()
    svc = services().steering
    svc.document("cluster", name)
    target = engine()
    await command(svc.sense_cluster, target, name, data.get("min_members", 1))
    return cluster_view(svc.document("cluster", name), target)


@bp.delete("/clusters/<name:name>/sensing")
async def stop_cluster_sensing(name: str) -> Any:
    """Switch the cluster's sensing off (nothing changes when it was off)."""
    svc = services().steering
    svc.document("cluster", name)
    await stop_sensing(name)
    return cluster_view(svc.document("cluster", name), steerable())


# circuits
@bp.get("/circuits")
async def list_circuits() -> Any:
    """Imported circuits, each with how it would serve now, and the active one."""
    target, model_id = _target()
    svc = services().steering
    return {"data": [circuit_view(r, target, model_id) for r in svc.store.documents("circuit")],
            "active": svc.active_circuit(target, model_id)}


@bp.post("/circuits/import")
async def import_circuit() -> Any:
    """Import a circuit document (a bad field is 400 naming its JSON pointer; a name clash 409 unless
    ?overwrite=true); creates the profile of its name."""
    data, overwrite = await body(), _overwrite()
    target, model_id = _target()
    svc = services().steering
    row = await command(lambda: svc.import_document("circuit", data, target, model_id, overwrite=overwrite))
    return circuit_view(row, target, model_id), 201


@bp.get("/circuits/active")
async def active_circuit() -> Any:
    """The active circuit and its ``steering`` field: mode (native, slice_fallback, none), rung, language, reason."""
    target, model_id = _target()
    return services().steering.circuit_state(target, model_id)


@bp.get("/circuits/<name:name>")
async def get_circuit(name: str) -> Any:
    """One circuit, with how it would serve now."""
    target, model_id = _target()
    return circuit_view(services().steering.document("circuit", name), target, model_id)


@bp.post("/circuits/<name:name>/activate")
async def activate_circuit(name: str) -> Any:
    """Make the circuit the active profile: the live values become its members (natively), its fallback
    cluster's (slice_fallback) or none, as it serves now."""
    svc = services().steering
    svc.document("circuit", name)
    target = engine()
    await command(svc.activate, target, name)
    return {**svc.circuit_state(target, target.model_id), **steering_state()}


@bp.delete("/circuits/<name:name>")
async def delete_circuit(name: str) -> Any:
    """Delete a circuit and the profile it backs (deactivated first when active)."""
    svc = services().steering
    svc.document("circuit", name)
    await deactivate_if_active(name)
    await asyncio.to_thread(svc.delete_document, "circuit", name)
    return {"deleted": name}
