"""SAEs shipped inside the package for the bundled model, registered like the bundled model: never downloaded.

Each folder under ``millm/sae/bundled/`` is one SAE in SAELens format with its labels; the folder name
is its stable id (``smollm2-135m-res-L10``). How each was made is in its ``train.json`` and in docs/saes/index.md
(one ``millm sae train`` command per SAE).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from millm.errors import MillmError
from millm.registry import BUNDLED_ID
from millm.sae.formats import load_sae
from millm.sae.labels import LabelIndex
from millm.store import Store

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BundledSAE:
    id: str
    path: Path
    layer: int
    model: str


def bundled_saes() -> list[BundledSAE]:
    """The SAEs shipped with this install, by layer."""
    found = []
    if BUNDLED_DIR.is_dir():
        for folder in sorted(BUNDLED_DIR.iterdir()):
            cfg_path = folder / "cfg.json"
            if not cfg_path.is_file():
                continue
            meta = json.loads(cfg_path.read_text()).get("metadata", {})
            model = str(meta.get("model_name", BUNDLED_ID))
            found.append(BundledSAE(folder.name, folder, int(meta["hook_layer"]), model))
    return sorted(found, key=lambda b: b.layer)


def record(bundled: BundledSAE) -> dict[str, Any]:
    """The registry record of a bundled SAE (read through miLLM's loader, as any registered SAE is)."""
    loaded = load_sae(bundled.path)
    return {"id": bundled.id, "name": bundled.id, "path": str(bundled.path), "format": loaded.format,
            "architecture": loaded.sae.architecture, "d_in": loaded.sae.d_in, "d_sae": loaded.sae.d_sae,
            "layer_hint": bundled.layer, "model_hint": bundled.model}


def register_bundled(store: Store) -> list[str]:
    """Make sure every bundled SAE is registered under its stable id (a moved install is re-pointed);
    returns the ids registered now. A damaged bundled SAE is logged and skipped, never fatal."""
    added = []
    for bundled in bundled_saes():
        existing = store.sae(bundled.id)
        if existing is not None and existing["path"] == str(bundled.path):
            continue
        try:
            store.add_sae(record(bundled), LabelIndex.load(bundled.path).labels)
        except MillmError as exc:
            log.warning("bundled SAE %s is not usable: %s", bundled.id, exc.message)
            continue
        added.append(bundled.id)
    return added
