"""Held-out measures stored where an SAE's feature cards are read from (its ``features.jsonl``; the row's keys
are ``millm.sae.measured``'s)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from millm.atomic import replace_text
from millm.errors import InvalidParameter
from millm.sae.measured import HELD_OUT_KEY, MEASURED_KEY, HeldOut


def saveable(folder: str | Path, shipped: bool = False) -> Path:
    """The ``features.jsonl`` a recommended strength can be written into; refused for an SAE without the file,
    a folder or file not writable, or an SAE shipped inside the package (measure a copy of it instead) unless
    ``shipped`` (the re-measure of the bundled SAEs, ``bench/remeasure.py``)."""
    from millm.sae.bundled import BUNDLED_DIR
    from millm.sae.cards import FEATURES_FILE, folder_of

    base = folder_of(folder)
    path = base / FEATURES_FILE
    if not shipped and base.resolve().is_relative_to(BUNDLED_DIR.resolve()):
        raise InvalidParameter(f"{base.name} ships inside the package and is not changed by --save: copy its folder "
                               f"({base}) somewhere of yours and sweep it with --sae FOLDER --save.", param="save")
    if not path.is_file():
        raise InvalidParameter(f"{base} has no {FEATURES_FILE} to record the recommended strength in.", param="save")
    if not (os.access(base, os.W_OK) and os.access(path, os.W_OK)):
        raise InvalidParameter(f"{path} is not writable here: the recommended strength was not saved "
                               "(copy the SAE to a folder of yours and register that).", param="save")
    return path


@dataclass(frozen=True)
class Measured:
    """What a measure found for one feature: its held-out measure (recommending a strength or not), and its
    label (for a row the file does not have yet)."""

    held_out: HeldOut
    label: str = ""


def measured_row(row: dict[str, object], found: Measured) -> dict[str, object]:
    """``row`` with ``found``'s held-out measure, and its recommended strength only when that recommends one; an
    older single-set measure's keys are dropped, never kept beside the new ones."""
    from millm.sae.cards import RATE_KEY

    out = {k: v for k, v in row.items() if k not in (MEASURED_KEY, RATE_KEY, HELD_OUT_KEY)}
    out[HELD_OUT_KEY] = found.held_out.to_json()
    if found.held_out.recommended:
        out[MEASURED_KEY] = found.held_out.strength
    return out


def save_measured(folder: str | Path, found: Mapping[int, Measured], shipped: bool = False) -> Path:
    """Write each feature's held-out measure (:func:`measured_row`) into its row of the SAE's ``features.jsonl``
    (a row is added for a feature that has none). One atomic replace; refused where :func:`saveable` refuses."""
    path = saveable(folder, shipped)
    lines = path.read_text(encoding="utf-8").splitlines()
    left = dict(found)
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        row = json.loads(line)
        index = int(row.get("index", -1))
        if index in left:
            lines[n] = json.dumps(measured_row(row, left.pop(index)), ensure_ascii=False)
    for index, rec in sorted(left.items()):
        lines.append(json.dumps(measured_row({"index": index, "label": rec.label}, rec), ensure_ascii=False))
    write_atomic(path, lines)
    return path


def drop_older(folder: str | Path, shipped: bool = False) -> int:
    """Drop the older single-set keys (``recommended_strength`` without ``held_out``, and ``concept_rate``) from
    every row of the SAE's ``features.jsonl``, so it keeps held-out measures alone; returns how many rows
    changed. Refused where :func:`saveable` refuses."""
    from millm.sae.cards import RATE_KEY

    path = saveable(folder, shipped)
    lines, changed = path.read_text(encoding="utf-8").splitlines(), 0
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        row = json.loads(line)
        older = [k for k in (RATE_KEY,) + (() if HELD_OUT_KEY in row else (MEASURED_KEY,)) if k in row]
        if older:
            lines[n] = json.dumps({k: v for k, v in row.items() if k not in older}, ensure_ascii=False)
            changed += 1
    write_atomic(path, lines)
    return changed


def write_atomic(path: Path, lines: list[str]) -> None:
    """``lines`` as the file at ``path``, replaced in one step (a reader sees the old file or the new one)."""
    replace_text(path, "\n".join(lines) + "\n")
