"""``millm clusters`` and ``millm circuits``: imported steering documents, a cluster's dial, a circuit's serving.

A document is checked against the SAEs registered and attached for the model (those of this process's
loaded model, else the attachments persisted for it), so importing never loads a model. Importing
creates a profile of the same name, so ``millm chat --profile NAME`` and ``millm profiles activate``
take clusters and circuits too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.table import Table

from cli.common import engine_for, loaded_ids, out, reports_errors, steerable, steering_service
from millm.config import get_settings
from millm.errors import InvalidParameter

if TYPE_CHECKING:
    from millm.steering.target import SteeringTarget

clusters_app = typer.Typer(help="Imported clusters: features of one SAE that move together, with a dial.",
                           no_args_is_help=True)
circuits_app = typer.Typer(help="Imported circuits: one intervention across several layers' SAEs.",
                           no_args_is_help=True)

ModelOption = Annotated[str | None, typer.Option(help="Model id (default: the configured default).")]
Overwrite = Annotated[bool, typer.Option(help="Replace whatever holds the name.")]


def register(app: typer.Typer) -> None:
    app.add_typer(clusters_app, name="clusters")
    app.add_typer(circuits_app, name="circuits")


def _print_json(data: object) -> None:
    out.print(json.dumps(data, indent=2), markup=False)


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidParameter(f"{path}: cannot read a JSON document ({exc}).", param="path") from None


def _target(model: str | None) -> tuple[SteeringTarget | None, str]:
    """The model's steering when this process has it loaded (else None: its persisted attachments stand in),
    and its id. Never loads a model."""
    from millm.registry import resolve

    entry = resolve(model or get_settings().default_model, get_settings())
    return (steerable(engine_for(model)) if entry.id in loaded_ids() else None), entry.id


def _range(doc: dict[str, Any]) -> str:
    lo_hi = doc.get("intensity_range")
    return f"[{lo_hi[0]:g}, {lo_hi[1]:g}]" if lo_hi else "-"


def _import(kind: Literal["cluster", "circuit"], path: Path, overwrite: bool, model: str | None) -> dict[str, Any]:
    target, model_id = _target(model)
    row = steering_service().import_document(kind, _read(path), target, model_id, overwrite=overwrite)
    out.print(f"imported {kind} {row['name']} ({len(row['document']['members'])} members)", markup=False)
    return row


def _follow(model: str | None) -> None:
    """Re-apply the model's active profile when a cluster or circuit backs it (loads the model to do so)."""
    service = steering_service()
    target, model_id = _target(model)
    active = service.active_profile(target, model_id)
    if active is None or service.store.backing(active) is None:
        return
    target = target or steerable(engine_for(model))
    service.follow_active(target)
    service.persist(target)
    out.print(f"re-applied the active profile {active} to the live values of {model_id}", markup=False)


# clusters
@clusters_app.command("import")
@reports_errors
def clusters_import(path: Path, overwrite: Overwrite = False, model: ModelOption = None) -> None:
    """Import a cluster document (JSON file); a bad field is refused naming its JSON pointer."""
    _import("cluster", path, overwrite, model)


@clusters_app.command("list")
@reports_errors
def clusters_list() -> None:
    """Imported clusters: SAE layer and width, members, declared range and persistent dial."""
    table = Table("name", "model", "layer", "d_sae", "members", "range", "dial")
    for row in steering_service().store.documents("cluster"):
        doc = row["document"]
        table.add_row(row["name"], doc["model"], str(doc["sae"]["layer"]), str(doc["sae"]["d_sae"]),
                      str(len(doc["members"])), _range(doc), f"{row['intensity']:g}")
    out.print(table)


@clusters_app.command("show")
@reports_errors
def clusters_show(name: str) -> None:
    """One cluster: its document and persistent dial (``intensity``)."""
    _print_json(steering_service().document("cluster", name))


@clusters_app.command("dial")
@reports_errors
def clusters_dial(name: str, value: Annotated[float, typer.Argument(help="λ from 0 to the cluster's maximum.")],
                  model: ModelOption = None) -> None:
    """Set a cluster's persistent dial λ (what applies when a request sends no steering_intensity)."""
    row = steering_service().set_cluster_dial(None, name, value)
    out.print(f"cluster {name}: dial {row['intensity']:g}", markup=False)
    _follow(model)


@clusters_app.command("rm")
@reports_errors
def clusters_rm(name: str) -> None:
    """Delete a cluster and the profile it backs."""
    steering_service().delete_document("cluster", name)
    out.print(f"deleted cluster {name}", markup=False)


# circuits
@circuits_app.command("import")
@reports_errors
def circuits_import(path: Path, overwrite: Overwrite = False, model: ModelOption = None) -> None:
    """Import a circuit document (JSON file); a bad field is refused naming its JSON pointer."""
    _import("circuit", path, overwrite, model)


@circuits_app.command("list")
@reports_errors
def circuits_list(model: ModelOption = None) -> None:
    """Imported circuits: layers, members, evidence rung, fallback cluster and how each would serve now."""
    service = steering_service()
    target, model_id = _target(model)
    table = Table("name", "model", "layers", "members", "rung", "fallback", "serving")
    for row in service.store.documents("circuit"):
        doc, members = row["document"], row["document"].get("members", [])
        layers = ",".join(str(layer) for layer in sorted({m.get("layer") for m in members}))
        mode = service.serving(target, row["name"], model_id).mode.value
        table.add_row(row["name"], str(doc.get("model")), layers, str(len(members)),
                      str(doc.get("evidence", {}).get("rung", "-")), doc.get("fallback_cluster") or "-", mode)
    out.print(table)


@circuits_app.command("show")
@reports_errors
def circuits_show(name: str, model: ModelOption = None) -> None:
    """One circuit: its document, and its ``steering`` field (serving mode, rung, language, reason)."""
    service = steering_service()
    target, model_id = _target(model)
    row = service.document("circuit", name)
    _print_json({**row, "steering": service.serving(target, name, model_id).steering_field()})


@circuits_app.command("activate")
@reports_errors
def circuits_activate(name: str, model: ModelOption = None) -> None:
    """Make the circuit the active profile of the model (persisted): its members, its fallback cluster's
    or nothing, as it serves now."""
    service = steering_service()
    service.document("circuit", name)
    target = steerable(engine_for(model))
    service.activate(target, name)
    steering = service.circuit_state(target, target.model_id)["steering"]
    rung = f", rung {steering['rung']} ({steering['language']})" if steering["rung"] is not None else ""
    out.print(f"active circuit: {name} - {steering['mode']}{rung}: {steering['reason']}", markup=False)


@circuits_app.command("active")
@reports_errors
def circuits_active(model: ModelOption = None) -> None:
    """The model's active circuit and its ``steering`` field, as GET /api/circuits/active gives them."""
    target, model_id = _target(model)
    _print_json(steering_service().circuit_state(target, model_id))


@circuits_app.command("rm")
@reports_errors
def circuits_rm(name: str) -> None:
    """Delete a circuit and the profile it backs."""
    steering_service().delete_document("circuit", name)
    out.print(f"deleted circuit {name}", markup=False)
