"""Recommended strengths stored where an SAE's feature cards are read from (its ``features.jsonl``)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from millm.errors import InvalidParameter


def saveable(folder: str | Path) -> Path:
    """The ``features.jsonl`` a recommended strength can be written into; refused for an SAE without the file,
    a folder or file not writable, or an SAE shipped inside the package (measure a copy of it instead)."""
    from millm.sae.bundled import BUNDLED_DIR
    from millm.sae.cards import FEATURES_FILE, folder_of

    base = folder_of(folder)
    path = base / FEATURES_FILE
    if base.resolve().is_relative_to(BUNDLED_DIR.resolve()):
        raise InvalidParameter(f"{base.name} ships inside the package and is not changed by --save: copy its folder "
                               f"({base}) somewhere of yours and sweep it with --sae FOLDER --save.", param="save")
    if not path.is_file():
        raise InvalidParameter(f"{base} has no {FEATURES_FILE} to record the recommended strength in.", param="save")
    if not (os.access(base, os.W_OK) and os.access(path, os.W_OK)):
        raise InvalidParameter(f"{path} is not writable here: the recommended strength was not saved "
                               "(copy the SAE to a folder of yours and register that).", param="save")
    return path


@dataclass(frozen=True)
class Recommendation:
    """What a sweep found for one feature: its recommended strength and the concept rate there."""

    strength: float
    rate: float
    label: str = ""


def save_recommendations(folder: str | Path, found: Mapping[int, Recommendation | None]) -> Path:
    """Write each feature's ``recommended_strength`` and ``concept_rate`` into its row of the SAE's
    ``features.jsonl`` (a row is added for a feature that has none); a feature mapped to None was measured
    again and steers no more, so its row loses both. One atomic replace; refused where :func:`saveable`
    refuses."""
    from millm.sae.cards import MEASURED_KEY, RATE_KEY

    path = saveable(folder)
    lines = path.read_text(encoding="utf-8").splitlines()
    left = dict(found)
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        row = json.loads(line)
        index = int(row.get("index", -1))
        if index not in left:
            continue
        rec = left.pop(index)
        if rec is None:
            row.pop(MEASURED_KEY, None)
            row.pop(RATE_KEY, None)
        else:
            row[MEASURED_KEY], row[RATE_KEY] = rec.strength, rec.rate
        lines[n] = json.dumps(row, ensure_ascii=False)
    for index, rec in sorted(left.items()):
        if rec is not None:
            lines.append(json.dumps({"index": index, "label": rec.label, MEASURED_KEY: rec.strength,
                                     RATE_KEY: rec.rate}, ensure_ascii=False))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".features-", suffix=".jsonl")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
