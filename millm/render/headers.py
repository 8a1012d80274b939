"""miLLM's response headers, rendered as RFC 8941 structured fields."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from millm.engine.events import Event, Verdicts
from millm.names import steering_header
from millm.sfv import sf_decimal, sf_string
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


PROBES_HEADER = "X-miLLM-Probes"


def probes_headers(events: Iterable[Event]) -> dict[str, str]:
    """X-miLLM-Probes on a non-streamed response watched by probes: an sf-list of each probe's name with whether it
    fired on any choice and its highest score (``"rain";fired=?1;score=3.25``); no header when none watched."""
    verdicts = next((e.body for e in events if isinstance(e, Verdicts)), None)
    if not verdicts:
        return {}
    summary: dict[str, tuple[bool, float | None]] = {}
    for v in verdicts:
        fired, score = summary.get(v["probe"], (False, None))
        if v["score"] is not None:
            score = v["score"] if score is None else max(score, v["score"])
        summary[v["probe"]] = (fired or v["fired"], score)
    items = [f"{sf_string(name)};fired=?{int(fired)}" + ("" if score is None else f";score={sf_decimal(score)}")
             for name, (fired, score) in summary.items()]
    return {PROBES_HEADER: ", ".join(items)}
