"""Where vector sets live (``MILLM_HOME/vectors/NAME``) and how they join the SAE registry: under their name as
id, so ``--sae NAME``, ``--steer NAME=8``, profiles and the API name them as they name an SAE. A name is
refused before anything is written when it breaks the naming rule, is taken by a registered SAE or set, or is
a feature label of a registered SAE (``--steer rain=8`` must mean one thing)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from millm.errors import InvalidParameter, SAENotFound
from millm.names import check_name
from millm.sae.vector_sets import VectorSet, load, read_meta, save
from millm.steering.service import SteeringService

STAGING = ".staging-"  # the prefix of the folder ``store_all`` writes sets to before moving them into place


def folder_of(home: Path, name: str) -> Path:
    return home / "vectors" / name


def check_new_name(service: SteeringService, name: str) -> str:
    """``name`` for a new set, or a 400 naming what it collides with."""
    check_name(name, "name")
    if service.store.sae(name) is not None:
        raise InvalidParameter(f"'{name}' is already the id of a registered SAE or vector set; remove it first "
                               "(`millm vectors rm`) or choose another name.", param="name")
    wanted = name.casefold()
    for record in service.store.saes():
        for feature, label in service.store.label_map(record["id"]).items():
            if label.casefold() == wanted:
                raise InvalidParameter(f"'{name}' is the label of feature {feature} of SAE {record['id']}: a "
                                       "steering value named so would mean either; choose another name.",
                                       param="name")
    return name


def store(service: SteeringService, home: Path, vs: VectorSet) -> dict[str, Any]:
    """Write the set and register it under its name, all or nothing (``store_all`` of one set)."""
    return store_all(service, home, [vs])[0]


def _check_new_names(service: SteeringService, names: list[str]) -> None:
    """Each name new: none repeated among the sets to store, none taken by a registered SAE or set."""
    if len(set(names)) != len(names):
        raise InvalidParameter(f"The sets to store repeat a name: {', '.join(names)}.", param="name")
    for name in names:
        check_new_name(service, name)


def _move_into_place(staging: Path, home: Path, names: list[str], placed: list[Path]) -> None:
    """Move each staged set to its folder under ``home``, replacing a folder no registered set holds; every folder
    moved is appended to ``placed`` as it is, so a caller can remove them when a later step fails."""
    for name in names:
        folder = folder_of(home, name)
        if folder.exists():
            shutil.rmtree(folder)  # left by a set whose registration was removed, or never committed
        os.replace(staging / name, folder)
        placed.append(folder)


def store_all(service: SteeringService, home: Path, sets: list[VectorSet]) -> list[dict[str, Any]]:
    """Store and register every set, or none, whatever stops it (an error, or the process killed).

    Every name is checked first; the sets are written whole to one staging folder, moved to their folders,
    then registered in one registry transaction. Before it commits none is registered: on an error the folders
    moved are removed; after a kill they are left unregistered (folders no set names, replaced when a set of
    their name is stored). Moving before registering means a registered set always has its folder."""
    names = [vs.names[0] for vs in sets]
    _check_new_names(service, names)
    parent = home / "vectors"
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=parent))
    placed: list[Path] = []
    try:
        for vs in sets:
            save(staging / vs.names[0], vs)
        _move_into_place(staging, home, names, placed)
        with service.store.atomic():
            for name in names:
                check_new_name(service, name)  # inside the transaction: no other writer has taken it since
            return [service.register_sae(folder, name=name, sae_id=name)
                    for name, folder in zip(names, placed, strict=True)]
    except BaseException:
        for folder in placed:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def vector_sets(service: SteeringService) -> list[dict[str, Any]]:
    """The registered vector sets, from the registry, each with its ``vectors.json`` description when that reads
    (``readable``); a damaged or removed set is listed from its record, ``readable`` false and its ``problem``
    said, so one set's files never hide the others. No vectors are loaded."""
    return [listed(service, record) for record in service.store.saes() if record["format"] == "vectors"]


def listed(service: SteeringService, record: dict[str, Any]) -> dict[str, Any]:
    """One set as listings show it: its record, the names, layer and model the registry keeps, and what its
    ``vectors.json`` says when it reads (``millm.sae.vector_sets.read_meta``: the file checked, the tensor's
    header too)."""
    labels = service.store.label_map(record["id"])
    row: dict[str, Any] = {**record, "names": [labels[i] for i in sorted(labels)],
                           "layer": record["layer_hint"], "model": record["model_hint"] or "",
                           "d_model": record["d_in"], "method": "", "position": "", "examples": {}, "sha256": "",
                           "source": {}, "readable": True, "problem": None}
    try:
        meta = read_meta(Path(record["path"]))
    except InvalidParameter as exc:
        return {**row, "readable": False, "problem": exc.message}
    return {**row, **{k: list(v) if k == "names" else v for k, v in meta.items()}}


def vector_set(service: SteeringService, name: str) -> tuple[dict[str, Any], VectorSet]:
    """The set ``name``'s record and its files, loaded (a 404 when no set has the name, a 400 naming the file
    when they do not read)."""
    record = record_of(service, name)
    return record, load(Path(record["path"]))


def record_of(service: SteeringService, name: str) -> dict[str, Any]:
    """The registry record of the vector set ``name``; a 404 when there is none (an SAE's name included)."""
    record = service.store.sae(name)
    if record is None or record["format"] != "vectors":
        raise SAENotFound(f"No vector set is named '{name}'; see `millm vectors list`.", param="name")
    return record


def remove(service: SteeringService, home: Path, name: str) -> None:
    """Unregister the set and delete its folder (when it is miLLM's own, under MILLM_HOME), from its record
    alone: a set whose files are damaged or gone is removed as any other."""
    record = record_of(service, name)
    service.store.delete_sae(name)
    folder = Path(record["path"])
    if folder.parent == (home / "vectors").resolve() or folder.parent == home / "vectors":
        shutil.rmtree(folder, ignore_errors=True)
