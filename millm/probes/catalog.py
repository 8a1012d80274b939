"""Where probes live: one JSON document each, ``MILLM_HOME/probes/NAME.json``, and which are attached (served on
every generation request): ``MILLM_HOME/probes/attached.json``, ``{name: {"action", "profile"}}``. Writes go to
a temporary file moved into place, so a reader never sees half a document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from millm.atomic import replace_text
from millm.errors import InvalidParameter, MillmError
from millm.names import check_name
from millm.probes.probe import Probe, from_document

ATTACHED = "attached.json"
MAX_BYTES = 8 * 2**20  # a probe document (a direction of a few thousand numbers, its held-out texts)


class ProbeNotFound(MillmError):
    status, type, code = 404, "invalid_request_error", "probe_not_found"


class ProbeExists(MillmError):
    status, type, code = 409, "invalid_request_error", "probe_exists"


def folder(home: Path) -> Path:
    return home / "probes"


def path_of(home: Path, name: str) -> Path:
    return folder(home) / f"{check_name(name)}.json"


def _write(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_text(path, json.dumps(value))


def save(home: Path, probe: Probe, overwrite: bool = False) -> None:
    """Store ``probe`` under its name (a 409 when the name is taken, unless ``overwrite``)."""
    path = path_of(home, probe.name)
    if path.exists() and not overwrite:
        raise ProbeExists(f"A probe named '{probe.name}' exists; remove it first (`millm probes rm`) or choose "
                          "another name.", param="name")
    _write(path, probe.document())


def check_new(home: Path, name: str) -> str:
    """``name`` for a new probe: it follows the naming rule and no probe has it (before any model work)."""
    if path_of(home, name).exists():
        raise ProbeExists(f"A probe named '{name}' exists; remove it first or choose another name.", param="name")
    return name


def load(home: Path, name: str) -> Probe:
    path = path_of(home, name)
    if not path.is_file():
        raise ProbeNotFound(f"No probe is named '{name}'; see `millm probes list` or GET /api/probes.", param="name")
    return read(path.read_bytes(), str(path))


def read(data: bytes, shown: str, name: str | None = None) -> Probe:
    """A probe from a document's bytes (``shown`` names it in errors)."""
    if len(data) > MAX_BYTES:
        raise InvalidParameter(f"{shown}: a probe document holds at most {MAX_BYTES} bytes.", param="document")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidParameter(f"{shown}: not a JSON document ({exc}).", param="document") from None
    return from_document(doc, name)


def names(home: Path) -> list[str]:
    return sorted(p.stem for p in folder(home).glob("*.json") if p.name != ATTACHED and not p.name.startswith("."))


def remove(home: Path, name: str) -> None:
    """Delete the probe (and its attachment)."""
    load(home, name)
    detach(home, name)
    path_of(home, name).unlink()


def attached(home: Path) -> dict[str, dict[str, Any]]:
    """The attached probes: ``{name: {"action", "profile"}}``."""
    path = folder(home) / ATTACHED
    return json.loads(path.read_text()) if path.is_file() else {}


def attach(home: Path, name: str, action: str, profile: str | None) -> None:
    _write(folder(home) / ATTACHED, {**attached(home), name: {"action": action, "profile": profile}})


def detach(home: Path, name: str) -> bool:
    """Detach ``name``; False when it was not attached."""
    current = attached(home)
    if current.pop(name, None) is None:
        return False
    _write(folder(home) / ATTACHED, current)
    return True
