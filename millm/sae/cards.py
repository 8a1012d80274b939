"""Feature cards: everything an SAE's ``features.jsonl`` records about one feature, read in one place.

``millm sae features SAE INDEX``, ``GET /api/saes/{id}/features/{index}`` and the TUI's card all come
from :func:`read_card`. A card always has the index, the SAE's width and the label (empty when there is
none); the rest (firing rate, max activation, top tokens, max-activating examples with the firing token
between « and » and, where recorded, each of their tokens with the feature's value (``millm.sae.example_tokens``),
promoted tokens) is there when ``features.jsonl`` has the feature's row, and ``note``
says why it is not otherwise (no ``features.jsonl`` beside the SAE, or a feature that never fired on the
labelling set).

What a steering measure stored (``millm.sae.measured`` documents the row's keys): ``held_out`` on a card (and
in its JSON body) is the whole held-out measure, or None for a feature never measured so; ``measured`` is
true when there is one; ``recommended_strength`` is set only when the held-out measure recommends it (its 90%
interval reaches the target); ``concept_rate`` is the held-out rate at the measured strength (never the
calibration rate, which ``held_out.calibration_rate`` keeps). An older row's ``recommended_strength`` without a
``held_out`` object is not read as recommended.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from millm.errors import InvalidFeatureIndex, InvalidParameter
from millm.sae.measured import HELD_OUT_KEY, MEASURED_KEY, HeldOut, held_out_of, is_held_out

FEATURES_FILE = "features.jsonl"
LABELS_FILE = "labels.json"
RATE_KEY = "concept_rate"  # an older single-set measure's rate: dropped when a feature is measured again
_INDEX = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: str.isdigit() and int() also take "²" and "٣"


@dataclass(frozen=True)
class Example:
    """One max-activating context: ``before``, the firing token, ``after`` (the token was in «»)."""

    text: str
    activation: float
    tokens: tuple[tuple[str, float], ...] = ()  # each token of the excerpt, its value (millm.sae.example_tokens)

    @property
    def parts(self) -> tuple[str, str, str]:
        return example_parts(self.text)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"text": self.text, "activation": self.activation}
        if self.tokens:
            body["tokens"] = [[t, v] for t, v in self.tokens]
        return body

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Example:
        return cls(str(body.get("text", "")), float(body.get("activation", 0.0)),
                   tuple((str(t), float(v)) for t, v in body.get("tokens") or ()))


@dataclass(frozen=True)
class FeatureCard:
    sae: str
    index: int
    d_sae: int
    label: str = ""
    recorded: bool = False  # features.jsonl has this feature's row
    frequency: float | None = None  # fraction of labelling tokens it fires on
    max_activation: float | None = None
    top_tokens: list[tuple[str, float]] = field(default_factory=list)
    examples: list[Example] = field(default_factory=list)
    promotes: list[str] = field(default_factory=list)
    held_out: HeldOut | None = None  # the held-out measure (millm.sae.measured), when the row has one
    note: str = ""

    @property
    def measured(self) -> bool:
        """Whether a held-out measure is recorded (recommending a strength or not)."""
        return self.held_out is not None

    @property
    def recommended_strength(self) -> float | None:
        """The strength the held-out measure recommends, else None."""
        return self.held_out.recommended_strength if self.held_out is not None else None

    @property
    def concept_rate(self) -> float | None:
        """The held-out concept rate at the measured strength (None when nothing was verified)."""
        held = self.held_out
        return held.rate if held is not None and held.strength is not None else None

    def to_json(self) -> dict[str, Any]:
        """The body of ``GET /api/saes/{id}/features/{index}``."""
        return {"sae": self.sae, "index": self.index, "d_sae": self.d_sae, "label": self.label,
                "recorded": self.recorded, "frequency": self.frequency, "max_activation": self.max_activation,
                "top_tokens": [{"token": t, "weight": w} for t, w in self.top_tokens],
                "examples": [e.to_json() for e in self.examples],
                "promotes": list(self.promotes), "measured": self.measured,
                "recommended_strength": self.recommended_strength, "concept_rate": self.concept_rate,
                "held_out": self.held_out.to_json() if self.held_out is not None else None,
                "note": self.note or None}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> FeatureCard:
        """A card from :meth:`to_json`'s body (what the TUI's remote client reads)."""
        return cls(str(body["sae"]), int(body["index"]), int(body["d_sae"]), str(body.get("label") or ""),
                   bool(body.get("recorded")), _float(body.get("frequency")), _float(body.get("max_activation")),
                   [(str(t["token"]), float(t["weight"])) for t in body.get("top_tokens") or []],
                   [Example.from_json(e) for e in body.get("examples") or []],
                   [str(t) for t in body.get("promotes") or []], held_out_of(body), str(body.get("note") or ""))


def _float(value: Any) -> float | None:
    return None if value is None or isinstance(value, bool) else float(value)


def example_parts(text: str) -> tuple[str, str, str]:
    """``"a« b» c"`` as ``("a", " b", " c")``; a text without the marks is all ``before``."""
    start = text.find("«")
    end = text.find("»", start + 1) if start >= 0 else -1
    if start < 0 or end < 0:
        return text, "", ""
    return text[:start], text[start + 1:end], text[end + 1:]


def folder_of(path: str | Path) -> Path:
    """The folder an SAE's files lie in (the path itself, or a Gemma Scope params.npz's folder)."""
    path = Path(path)
    return path.parent if path.is_file() else path


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _pair(item: Any) -> bool:
    return isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and _is_number(item[1])


def _example(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("text", ""), str) and _is_number(item.get("activation", 0)) \
        and isinstance(tokens := item.get("tokens", []), list) and all(_pair(t) for t in tokens)


# what each key of a features.jsonl row must hold, and how a message says it
ROW_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "label": (lambda v: isinstance(v, str), "a string"),
    "frequency": (lambda v: v is None or _is_number(v), "a number"),
    "max_activation": (lambda v: v is None or _is_number(v), "a number"),
    MEASURED_KEY: (lambda v: v is None or _is_number(v), "a number"),
    HELD_OUT_KEY: (is_held_out, "a held-out measure object (millm.sae.measured)"),
    RATE_KEY: (lambda v: v is None or _is_number(v), "a number"),
    "top_tokens": (lambda v: isinstance(v, list) and all(_pair(t) for t in v), "a list of [token, weight] pairs"),
    "examples": (lambda v: isinstance(v, list) and all(_example(e) for e in v),
                 'a list of {"text": string, "activation": number, "tokens"?: [[token, value], ...]} objects'),
    "promotes": (lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v), "a list of token strings"),
}


def check_row(row: Any, where: str) -> dict[str, Any]:
    """A ``features.jsonl`` row whose every known key holds what a card reads from it; else a 400 naming
    ``where`` (the file and line) and the key. A file may hold anything: it is checked once, when read."""
    if not isinstance(row, dict) or isinstance(row.get("index"), bool) or not isinstance(row.get("index"), int):
        raise InvalidParameter(f"{where}: not a feature row with an integer 'index'.", param="features")
    for key, (fits, what) in ROW_RULES.items():
        if key in row and not fits(row[key]):
            raise InvalidParameter(f"{where}: '{key}' must be {what}.", param="features")
    return row


@lru_cache(maxsize=8)
def _rows_cached(path: str, _mtime_ns: int, _size: int) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                row = json.loads(line)
            except ValueError as exc:  # UnicodeDecodeError too
                raise InvalidParameter(f"{path} line {n}: not a JSON line of UTF-8 text ({exc}).",
                                       param="features") from None
            rows[check_row(row, f"{path} line {n}")["index"]] = row
    return rows


def feature_rows(folder: str | Path) -> dict[int, dict[str, Any]]:
    """``features.jsonl`` of the SAE in ``folder`` by feature index (empty when it has none); read once per
    version of the file."""
    path = folder_of(folder) / FEATURES_FILE
    try:
        stat = path.stat()
    except OSError:
        return {}
    return _rows_cached(str(path), stat.st_mtime_ns, stat.st_size)


def held_out_measures(folder: str | Path) -> dict[int, HeldOut]:
    """Every feature whose ``features.jsonl`` row holds a held-out measure, with it."""
    rows = feature_rows(folder).items()
    return {i: held for i, row in rows if (held := held_out_of(row)) is not None}


def measured_features(folder: str | Path) -> dict[int, float]:
    """The features a held-out measure recommends a strength for, with their held-out concept rates (what
    search ranks by)."""
    return {i: held.rate for i, held in held_out_measures(folder).items() if held.recommended}


def index_of(text: str) -> int | None:
    """The feature index ``text`` spells (``123``, ``#123``, ``-4``: ASCII digits, any sign, spaces around), or
    None when it names a feature some other way (a label). The one rule every front end reads indices by."""
    stripped = text.strip().removeprefix("#")
    return int(stripped) if _INDEX.fullmatch(stripped) and len(stripped) <= 20 else None


def parse_index(text: str, d_sae: int, name: str) -> int:
    """A feature index of the SAE from a path segment (nothing around the digits): a non-integer, or one outside
    ``0..d_sae-1``, is refused naming the SAE's range."""
    shown = json.dumps(text[:40] + ("…" if len(text) > 40 else ""), ensure_ascii=False)
    if not _INDEX.fullmatch(text):
        raise InvalidFeatureIndex(f"{shown} is not a feature index; {name} has features 0-{d_sae - 1}.",
                                  param="index")
    if len(text) > 20:  # past any width, and past what int() reads from a string
        raise InvalidFeatureIndex(f"Feature {shown} is outside {name}'s 0-{d_sae - 1} (it has {d_sae} features).",
                                  param="index")
    return check_index(int(text), d_sae, name)


def check_index(index: int, d_sae: int, name: str) -> int:
    """``index`` when the SAE has it; else refused naming the index and the SAE's width."""
    if not 0 <= index < d_sae:
        raise InvalidFeatureIndex(f"Feature {index} is outside {name}'s 0-{d_sae - 1} (it has {d_sae} features).",
                                  param="index")
    return index


def read_labels_json(folder: str | Path) -> dict[int, str]:
    """The SAE's ``labels.json`` by feature index (empty when it has none); one that is not a map of feature
    index to label is refused naming ``labels``."""
    path = folder_of(folder) / LABELS_FILE
    if not path.is_file():
        return {}
    try:
        return {int(k): str(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError) as exc:
        raise InvalidParameter(f"{path}: labels must map feature index to label ({exc}).", param="labels") from None


def _unrecorded_note(name: str, index: int, has_rows: bool) -> str:
    """Why a card holds only its label: the SAE has no ``features.jsonl`` (``has_rows`` false), or the feature never
    fired on its labelling set."""
    if not has_rows:
        return (f"{name} has no {FEATURES_FILE}: only its label is known; firing rate, examples and promoted "
                "tokens are not recorded.")
    return f"Feature {index} never fired on {name}'s labelling set: nothing else is recorded about it."


def _recorded_card(name: str, index: int, d_sae: int, label: str, row: Mapping[str, Any]) -> FeatureCard:
    """The card of a feature with a ``features.jsonl`` row (``label`` from the registered labels, else the row's)."""
    return FeatureCard(
        name, index, d_sae, label or str(row.get("label") or ""), recorded=True,
        frequency=_float(row.get("frequency")), max_activation=_float(row.get("max_activation")),
        top_tokens=[(str(t), float(w)) for t, w in row.get("top_tokens") or []],
        examples=[Example.from_json(e) for e in row.get("examples") or []],
        promotes=[str(t) for t in row.get("promotes") or []],
        held_out=held_out_of(row))


def read_card(folder: str | Path, index: int, d_sae: int, *, name: str,
              labels: Mapping[int, str] | None = None) -> FeatureCard:
    """The card of feature ``index`` of the SAE in ``folder`` (``d_sae`` wide, called ``name`` in messages).

    ``labels`` are the SAE's registered labels (default: its ``labels.json``); they name the feature before
    ``features.jsonl``'s row does. An index outside ``0..d_sae-1`` is refused naming the index and the width.
    """
    check_index(index, d_sae, name)
    base = folder_of(folder)
    rows = feature_rows(base)
    row = rows.get(index)
    label = (labels if labels is not None else read_labels_json(base)).get(index) or ""
    if row is None:
        return FeatureCard(name, index, d_sae, label, note=_unrecorded_note(name, index, bool(rows)))
    return _recorded_card(name, index, d_sae, label, row)
