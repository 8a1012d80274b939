"""Checking steering values and profile entries against the SAEs they name. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from millm.errors import InvalidFeatureIndex, InvalidParameter

STRENGTH_LIMIT = 200.0


def clamp(strength: float) -> float:
    """Strengths are clamped to +-STRENGTH_LIMIT when applied (the stored value is kept as given)."""
    return max(-STRENGTH_LIMIT, min(STRENGTH_LIMIT, strength))


def check_values(values: Any, d_sae: int, where: str = "values") -> dict[int, float]:
    """``{feature: strength}`` with integer-like keys below ``d_sae`` and finite numeric strengths."""
    if not isinstance(values, Mapping):
        raise InvalidParameter(f"'{where}' must be an object of feature index to strength.", param=where)
    out: dict[int, float] = {}
    for key, strength in values.items():
        try:
            index = int(key)
        except (TypeError, ValueError):
            raise InvalidFeatureIndex(f"'{where}' has feature {key!r}, which is not an integer index.",
                                      param=where) from None
        if not 0 <= index < d_sae:
            raise InvalidFeatureIndex(f"'{where}' has feature {index}, outside this SAE's 0-{d_sae - 1}.", param=where)
        if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not math.isfinite(strength):
            raise InvalidParameter(f"'{where}.{key}' must be a finite number, got {strength!r}.", param=where)
        out[index] = float(strength)
    return out


def parse_assignments(items: list[str]) -> dict[int, float]:
    """CLI ``123=40 456=-20`` into ``{123: 40.0, 456: -20.0}``."""
    out: dict[int, float] = {}
    for item in items:
        feature, sep, strength = item.partition("=")
        try:
            out[int(feature)] = float(strength)
        except ValueError:
            raise InvalidParameter(f"'{item}' is not FEATURE=STRENGTH (e.g. 123=40).", param="steer") from None
        if not sep:
            raise InvalidParameter(f"'{item}' is not FEATURE=STRENGTH (e.g. 123=40).", param="steer")
    return out
