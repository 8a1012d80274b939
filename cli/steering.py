"""``millm sae``, ``millm steer`` and ``millm profiles``: SAEs, live values and saved profiles.

What these commands change is persisted under MILLM_HOME, per model: the next ``millm chat`` or
``millm serve`` of that model starts with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Column, Table

from cli import sae_read as sae_read_cli
from cli import sae_train as sae_train_cli
from cli import sweep as sweep_cli
from cli.common import engine_for, out, reports_errors, sae_ref, steerable, steering_service
from cli.sae_train import steer_assignments
from millm.config import get_settings
from millm.errors import InvalidParameter

sae_app = typer.Typer(help="Sparse autoencoders: register, list, attach, detach, train, read.", no_args_is_help=True)
steer_app = typer.Typer(help="Live steering values of the attached SAEs.", no_args_is_help=True)
profiles_app = typer.Typer(help="Saved steering profiles.", no_args_is_help=True)

ModelOption = Annotated[str | None, typer.Option(help="Model id (default: the configured default).")]


def register(app: typer.Typer) -> None:
    sae_train_cli.register(sae_app)
    sae_read_cli.register(sae_app)
    sweep_cli.register(steer_app)
    app.add_typer(sae_app, name="sae")
    app.add_typer(steer_app, name="steer")
    app.add_typer(profiles_app, name="profiles")


def _print_json(data: object) -> None:
    out.print(json.dumps(data, indent=2), markup=False)


@sae_app.command("add")
@reports_errors
def sae_add(path: Annotated[Path, typer.Argument(help="SAE folder, or a Gemma Scope params.npz.")],
            name: Annotated[str | None, typer.Option(help="A name to show; the CLI takes it wherever it takes "
                                                            "an SAE id.")] = None,
            labels: Annotated[Path | None, typer.Option(help="JSON of feature index to label.")] = None) -> None:
    """Register an SAE (read now, so a malformed one is refused now); prints its id."""
    record = steering_service().register_sae(path, name, labels)
    out.print(f"{record['id']}  {record['format']} {record['architecture']} d_in={record['d_in']} "
              f"d_sae={record['d_sae']} layer_hint={record['layer_hint']}", markup=False)


@sae_app.command("list")
@reports_errors
def sae_list(model: ModelOption = None) -> None:
    """Registered SAEs, and the layer each is attached to on the model."""
    service = steering_service()
    attached = service.attached_layers(model or get_settings().default_model)
    table = Table(Column("id", no_wrap=True), "name", "format", "arch", "d_in", "d_sae", "layer hint", "attached")
    for r in service.store.saes():
        table.add_row(r["id"], r["name"], r["format"], r["architecture"], str(r["d_in"]), str(r["d_sae"]),
                      str(r["layer_hint"]), str(attached.get(r["id"], "-")))
    out.print(table)


@sae_app.command("attach")
@reports_errors
def sae_attach(sae_id: str, layer: Annotated[int | None, typer.Option(help="Layer (default: the hint).")] = None,
               model: ModelOption = None) -> None:
    """Attach an SAE (its id or registered name) to a layer of the model (persisted)."""
    sae_id = sae_ref(sae_id)
    view = steering_service().attach(steerable(engine_for(model)), sae_id, layer)
    out.print(f"{sae_id} attached at layer {view['attached_layer']}", markup=False)


@sae_app.command("detach")
@reports_errors
def sae_detach(sae_id: str, model: ModelOption = None) -> None:
    """Detach an SAE (its id or registered name) from the model (persisted)."""
    sae_id = sae_ref(sae_id)
    steering_service().detach(steerable(engine_for(model)), sae_id)
    out.print(f"{sae_id} detached", markup=False)


@steer_app.command("set")
@reports_errors
def steer_set(assignments: Annotated[list[str], typer.Argument(help="FEATURE=STRENGTH, e.g. 123=40 music=40, or "
                                                                   "FEATURE alone for its recommended strength "
                                                                   "(FEATURE: an index or a label, as chat --steer)")],
              sae: Annotated[str | None, typer.Option(help="SAE id (needed when several are attached).")] = None,
              replace: Annotated[bool, typer.Option(help="Replace the SAE's values instead of merging.")] = False,
              model: ModelOption = None) -> None:
    """Set live strengths (merged into the current ones; 0 removes a feature)."""
    sae = sae_ref(sae) if sae is not None else None
    target = steerable(engine_for(model))
    attached = list(target.steering.attachments)
    lookup = sae or (attached[0] if len(attached) == 1 else None)
    if lookup is not None:
        values = steer_assignments(assignments, lookup, target.model_id)  # labels looked up as chat --steer does
    else:  # no one SAE to look a label up in: indices only (set_values then says which SAE is missing)
        from millm.sae.cards import index_of
        from millm.sae.labels import LabelIndex

        named = [item for item in assignments if "=" not in item or index_of(item.rpartition("=")[0]) is None]
        if named:
            raise InvalidParameter(f"'{named[0]}' is not INDEX=STRENGTH: a label (FEATURE=STRENGTH) or a feature "
                                   "alone (its recommended strength) is looked up in an SAE: give --sae to look it "
                                   f"up in ({len(attached)} SAEs are attached).", param="sae")
        values = LabelIndex({}, "the SAE").resolve_assignments(assignments)
    steering_service().set_values(target, sae, values, merge=not replace)
    _print_json(target.steering.snapshot())


@steer_app.command("clear")
@reports_errors
def steer_clear(model: ModelOption = None) -> None:
    """Clear every live value."""
    target = steerable(engine_for(model))
    steering_service().clear(target)
    _print_json(target.steering.snapshot())


@steer_app.command("show")
@reports_errors
def steer_show(model: ModelOption = None) -> None:
    """Show attached SAEs and live values."""
    _print_json(steerable(engine_for(model)).steering.snapshot())


@profiles_app.command("list")
@reports_errors
def profiles_list() -> None:
    """Saved profiles."""
    table = Table("name", "model", "entries", "description")
    for p in steering_service().store.profiles():
        table.add_row(p["name"], p["model"] or "-", str(len(p["entries"])), p["description"])
    out.print(table)


@profiles_app.command("show")
@reports_errors
def profiles_show(name: str) -> None:
    """One profile's document."""
    _print_json(steering_service().export(name))


@profiles_app.command("create")
@reports_errors
def profiles_create(name: str,
                    entries: Annotated[list[str] | None, typer.Argument(help="FEATURE=STRENGTH on --sae (FEATURE: an "
                                                                        "index or a label, as chat --steer)")] = None,
                    sae: Annotated[str | None, typer.Option(help="SAE id the entries are on.")] = None,
                    description: Annotated[str, typer.Option(help="What the profile does.")] = "",
                    from_current: Annotated[bool, typer.Option(help="Save the live values instead.")] = False,
                    model: ModelOption = None) -> None:
    """Save a profile from FEATURE=STRENGTH entries, or from the live values (--from-current)."""
    service = steering_service()
    if from_current:
        saved = service.profile_from_current(steerable(engine_for(model)), name, description)
    else:
        if sae is None or not entries:
            raise InvalidParameter("Give --sae and FEATURE=STRENGTH entries, or --from-current.", param="entries")
        sae = sae_ref(sae)
        values = steer_assignments(entries, sae, model or get_settings().default_model)
        items = [{"sae": sae, "feature": f, "strength": s} for f, s in values.items()]
        saved = service.save_profile({"name": name, "description": description, "model": model,
                                      "entries": items}, overwrite=False)
    out.print(f"saved profile {saved['name']} ({len(saved['entries'])} entries)", markup=False)


@profiles_app.command("activate")
@reports_errors
def profiles_activate(name: str, model: ModelOption = None) -> None:
    """Make a profile's values the live values (persisted)."""
    steering_service().activate(steerable(engine_for(model)), name)
    out.print(f"active profile: {name}", markup=False)


@profiles_app.command("import")
@reports_errors
def profiles_import(path: Path, overwrite: Annotated[bool, typer.Option(help="Replace a profile of that name.")] = False
                    ) -> None:
    """Import a profile document (JSON file)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidParameter(f"{path}: cannot read a JSON document ({exc}).", param="path") from None
    saved = steering_service().save_profile(doc, overwrite=overwrite)
    out.print(f"imported profile {saved['name']}", markup=False)


@profiles_app.command("export")
@reports_errors
def profiles_export(name: str, output: Annotated[Path | None, typer.Option("-o", help="File to write.")] = None
                    ) -> None:
    """Write a profile document to stdout or a file."""
    doc = steering_service().export(name)
    if output is None:
        _print_json(doc)
    else:
        output.write_text(json.dumps(doc, indent=2))
