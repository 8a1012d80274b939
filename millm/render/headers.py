"""miLLM's response headers, rendered as RFC 8941 structured fields."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from millm.names import steering_header
from millm.sfv import sf_string
from millm.steering.rung import CIRCUIT_RUNG_HEADER, rung_header

if TYPE_CHECKING:
    from millm.requests.builder import Built
    from millm.requests.generation import Prepared
    from millm.steering.core import RequestSteering

INTENSITY_HEADER = "X-miLLM-Steering-Intensity"
IGNORED_FIELDS_HEADER_MAX_BYTES = 1024


def ignored_fields(locations: list[str], limit: int = IGNORED_FIELDS_HEADER_MAX_BYTES) -> str | None:
    """The X-miLLM-Ignored-Fields value: an sf-list of locations, ending in "+N more" past ``limit`` bytes."""
    if not locations:
        return None
    items = [sf_string(loc) for loc in locations]
    full = ", ".join(items)
    if len(full) <= limit:
        return full
    kept: list[str] = []
    for i, item in enumerate(items):
        left_after = len(items) - i - 1
        if len(", ".join([*kept, item, sf_string(f"+{left_after} more")])) > limit:
            break
        kept.append(item)
    return ", ".join([*kept, sf_string(f"+{len(items) - len(kept)} more")])


def seed_header(seed: int | None, scope: str) -> str | None:
    """X-miLLM-Seed: the seed and the scope of the reproducibility promise; absent without a seed."""
    return None if seed is None else f'{seed};scope="{scope}"'


def miLLM_headers(built: Built, label: str = "none", steering: RequestSteering | None = None,
                  scope: str = "all") -> dict[str, str]:
    """Every miLLM header a response carries: ignored fields, seed, steering (its ``label`` and scope), intensity,
    rung, constraint."""
    headers = {"X-miLLM-Ignored-Fields": ignored_fields(built.ignored),
               "X-miLLM-Seed": seed_header(built.seed, built.seed_scope),
               "X-miLLM-Steering": steering_header(label, scope)}
    if steering is not None:
        headers[INTENSITY_HEADER] = steering.echo
        headers[CIRCUIT_RUNG_HEADER] = rung_header(steering.rung) if steering.rung is not None else None
    if built.constraint is not None:
        headers["X-miLLM-Constrained"] = built.constraint.header()
    return {k: v for k, v in headers.items() if v is not None}


def prepared_headers(prepared: Prepared, built: Built, bound: str | None = None) -> dict[str, str]:
    """A prepared generation's miLLM headers. ``bound`` is the steering label read when the request's rows were
    bound (the engine's ``Steered`` event), the truth where an operator changed steering after prepare; a
    circuit's rung is not claimed for a response that nothing steered."""
    label = prepared.label if bound is None else bound
    steering = prepared.steering
    if label == "none" and steering.rung is not None:
        steering = replace(steering, rung=None)
    return miLLM_headers(built, label, steering, prepared.scope)
