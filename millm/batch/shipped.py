"""The steering state a Ray job carries to its workers, so every worker steers as the driver's MILLM_HOME says.

The driver copies its store (SQLite: registered SAEs, profiles, clusters, circuits, each model's persisted
attachments, values and active profile) and the files of every SAE attached to a model the job names.
A worker writes them into a directory of its own, points the SAE records at its copies, and restores
the persisted steering through ``SteeringService.restore`` as ``millm serve`` does. No worker reads the
driver's MILLM_HOME, so a cluster needs no shared filesystem for it.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from millm.steering.intensity import IntensitySettings
from millm.steering.service import SteeringService
from millm.store import Store


@dataclass(frozen=True)
class ShippedSAE:
    """An SAE's files: its path's last part, whether that is a folder, and each file's bytes."""

    name: str
    folder: bool
    files: dict[str, bytes]


@dataclass(frozen=True)
class ShippedState:
    db: bytes  # a consistent image of MILLM_HOME/millm.db
    intensity: IntensitySettings  # the driver's dial settings (MILLM_INTENSITY_MAX and the floors)
    saes: dict[str, ShippedSAE] = field(default_factory=dict)


def _sae_files(path: Path) -> ShippedSAE:
    if path.is_dir():
        files = {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}
        return ShippedSAE(path.name, True, files)
    return ShippedSAE(path.name, False, {path.name: path.read_bytes()})


def capture(service: SteeringService, model_ids: list[str]) -> ShippedState:
    """The driver's store and the SAEs persisted as attached to ``model_ids``."""
    source = sqlite3.connect(service.store.path)
    image = sqlite3.connect(":memory:")
    try:
        source.backup(image)
        db = image.serialize()
    finally:
        source.close()
        image.close()
    saes = {}
    for model_id in model_ids:
        for sae_id in service.attached_layers(model_id):
            record = service.store.sae(sae_id)
            if record is not None and Path(record["path"]).exists():
                saes[sae_id] = _sae_files(Path(record["path"]))
    return ShippedState(db, service.intensity, saes)


def install(state: ShippedState, home: Path) -> SteeringService:
    """The shipped store and SAEs under ``home`` (a worker's own directory), as a steering service."""
    home.mkdir(parents=True, exist_ok=True)
    db = home / "millm.db"
    db.write_bytes(state.db)
    conn = sqlite3.connect(db)
    try:
        for sae_id, sae in state.saes.items():
            root = home / "saes" / sae_id
            for rel, data in sae.files.items():
                target = root / rel if sae.folder else root / sae.name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            path = root if sae.folder else root / sae.name
            with conn:
                conn.execute("UPDATE saes SET path = ? WHERE id = ?", (str(path), sae_id))
    finally:
        conn.close()
    return SteeringService(Store(db), state.intensity)
