"""Profile documents: their shape, and resolving their entries against the attached SAEs."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from millm.errors import InvalidFeatureIndex, InvalidParameter, SAENotAttached
from millm.names import Name
from millm.steering.core import SteeringCore
from millm.steering.scope import Scope


class ProfileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    sae: str | int = Field(description="An SAE id, or the layer an SAE is attached to")
    feature: int = Field(ge=0)
    strength: float

    @field_validator("strength")
    @classmethod
    def finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be finite")
        return value


class ProfileDoc(BaseModel):
    """``{"name", "description", "model", "entries": [{"sae", "feature", "strength"}], "steering_scope"}``
    (where its steering applies when a request names no scope: ``millm.steering.scope``)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    name: Name
    description: str = ""
    model: str | None = None
    entries: list[ProfileEntry]
    steering_scope: Scope = "all"


def parse_profile(doc: Any, where: str = "profile") -> ProfileDoc:
    """A checked profile document; the first problem is a 400 naming the field."""
    if not isinstance(doc, dict):
        raise InvalidParameter(f"'{where}' must be a JSON object.", param=where)
    try:
        return ProfileDoc.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise InvalidParameter(f"'{loc}': {first['msg']}.", param=loc) from None


def resolve_entries(doc: ProfileDoc, steering: SteeringCore, model_id: str) -> dict[str, dict[int, float]]:
    """The profile's strengths per attached SAE id; 400 when an entry does not fit what is attached."""
    if doc.model and doc.model != model_id:
        raise InvalidParameter(f"Profile '{doc.name}' was made for model '{doc.model}', not '{model_id}'.",
                               param="profile")
    values: dict[str, dict[int, float]] = {}
    for i, entry in enumerate(doc.entries):
        try:
            att = steering.resolve_sae(entry.sae)
        except SAENotAttached as exc:
            raise InvalidParameter(f"Profile '{doc.name}' entries[{i}]: {exc.message}", param="profile") from None
        if entry.feature >= att.sae.d_sae:
            raise InvalidFeatureIndex(f"Profile '{doc.name}' entries[{i}]: feature {entry.feature} is outside SAE "
                                      f"{att.sae_id}'s 0-{att.sae.d_sae - 1}.", param="profile")
        values.setdefault(att.sae_id, {})[entry.feature] = entry.strength
    return values
