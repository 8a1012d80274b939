"""The steering intensity dial (λ): resolving a request's ``steering_intensity`` against its steering base.

Pure: no torch, no HTTP, no store. The rules are the spec's "Intensity coupling" section, written once here:

- cluster (and a plain profile or the live values, which scale like a cluster without a declared range):
  without a dial the stored dial applies; "min"/"max" are the declared range intersected with the [0, 2]
  envelope, or [MILLM_CLUSTER_INTENSITY_MIN, MILLM_INTENSITY_MAX] without one; a numeric λ is capped at the
  range's maximum and never raised to its floor;
- circuit serving natively: a numeric λ is clamped at both ends into the range, whose default floor is
  MILLM_CIRCUIT_INTENSITY_MIN (so without a declared range "min" is "off"); only an exact 0 / "off" goes
  below the floor;
- circuit in slice_fallback: its backing cluster's rule, floor included;
- 0 / "off" turns steering off for the request without looking at the base.

Member strengths are re-derived from the authored strengths on every resolution (absolute, never
compounding) and each is clamped to miLLM's steering range.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from millm.config import DEFAULT_DIAL, ENVELOPE
from millm.errors import InvalidParameter
from millm.sfv import sf_decimal
from millm.steering.values import clamp

if TYPE_CHECKING:
    from millm.config import Settings


PARAM = "steering_intensity"

Strengths = Mapping[str, Mapping[int, float]]
"""Feature strengths per SAE id: ``{"sae_...": {feature: strength}}``."""


class BaseKind(StrEnum):
    """What the request's λ scales."""

    PLAIN = "plain"  # live values or a plain profile: scaled like a cluster without a declared range
    CLUSTER = "cluster"
    CIRCUIT = "circuit"  # a circuit serving natively
    SLICE_FALLBACK = "slice_fallback"  # a circuit steered by its backing cluster


class Symbol(StrEnum):
    """The symbolic values of ``steering_intensity``."""

    OFF = "off"
    MIN = "min"
    MAX = "max"


Dial = float | Symbol | None
"""A checked ``steering_intensity``: a λ, a symbol, or None when the request has none."""


@dataclass(frozen=True)
class IntensitySettings:
    """The operator's dial settings (MILLM_INTENSITY_MAX, MILLM_CLUSTER_INTENSITY_MIN, MILLM_CIRCUIT_INTENSITY_MIN)."""

    intensity_max: float
    cluster_min: float
    circuit_min: float

    @classmethod
    def from_settings(cls, settings: Settings) -> IntensitySettings:
        return cls(settings.intensity_max, settings.cluster_intensity_min, settings.circuit_intensity_min)


@dataclass(frozen=True)
class Base:
    """The steering base a λ scales: its kind, authored strengths, declared range and stored dial.

    For a slice_fallback circuit every field is its backing cluster's. ``stored`` is a cluster's persistent
    dial; plain bases and circuits keep the authored strengths (1.0).
    """

    kind: BaseKind
    strengths: Strengths
    declared: tuple[float, float] | None = None
    stored: float = DEFAULT_DIAL


@dataclass(frozen=True)
class Context:
    """What the server knows at request time, deciding whether the dial changes steering at all."""

    dial_only: bool  # the request names no profile: its base is the active profile or the live values
    steering_enabled: bool
    sae_attached: bool
    base_empty: bool  # the base has no entries (judged without resolving them against the SAEs)


@dataclass(frozen=True)
class Resolution:
    """The outcome for one request.

    ``applies``: install ``strengths`` as the request's override (False: leave the operator's steering
    as it is, and ``lam`` is None). ``lam`` is 0.0 when the request turns steering off; ``echo`` is the
    X-miLLM-Steering-Intensity value, or None when the header is omitted.
    """

    applies: bool
    lam: float | None
    strengths: dict[str, dict[int, float]] = field(default_factory=dict)
    echo: str | None = None

    @property
    def off(self) -> bool:
        return self.lam == 0.0


def parse_intensity(value: object) -> Dial:
    """A request's ``steering_intensity``: a number in [0, 2], "off", "min", "max", or absent (None).

    0 is "off". Anything else (negative, above 2, NaN, a bool, a string number, another word) is a 400
    naming the field.
    """
    if value is None:
        return None
    if isinstance(value, str) and value in {s.value for s in Symbol}:
        return Symbol(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not ENVELOPE[0] <= value <= ENVELOPE[1]:
        raise InvalidParameter(f"'{PARAM}' must be a number from {ENVELOPE[0]:g} to {ENVELOPE[1]:g} or one of "
                               f"\"off\", \"min\", \"max\"; got {value!r}.", param=PARAM)
    return Symbol.OFF if value == 0 else float(value)


def dial_range(kind: BaseKind, declared: tuple[float, float] | None,
               settings: IntensitySettings) -> tuple[float, float]:
    """The (floor, ceiling) "min" and "max" resolve to: the declared range within the envelope, else the defaults."""
    if declared is not None:
        return max(declared[0], ENVELOPE[0]), min(declared[1], ENVELOPE[1])
    floor = settings.circuit_min if kind is BaseKind.CIRCUIT else settings.cluster_min
    return floor, settings.intensity_max


def resolve_lambda(dial: Dial, kind: BaseKind, declared: tuple[float, float] | None, stored: float,
                   settings: IntensitySettings) -> float:
    """The λ a dial resolves to for this base; 0.0 means steering off."""
    if dial is Symbol.OFF:
        return 0.0
    floor, ceiling = dial_range(kind, declared, settings)
    if dial is Symbol.MIN:
        return floor
    if dial is Symbol.MAX:
        return ceiling
    if dial is None:
        if kind is BaseKind.PLAIN:
            return DEFAULT_DIAL  # no dial: a plain base steers with its strengths as they are
        dial = stored
    if kind is BaseKind.CIRCUIT:
        return min(max(dial, floor), ceiling)
    return min(dial, ceiling)


def scale(strengths: Strengths, lam: float) -> dict[str, dict[int, float]]:
    """Authored strengths times λ, each clamped to the steering range; nothing at all when λ is 0."""
    if lam == 0.0:
        return {}
    return {sae: {feature: clamp(s * lam) for feature, s in values.items()} for sae, values in strengths.items()}


def format_lambda(lam: float) -> str:
    """λ for the X-miLLM-Steering-Intensity echo: an RFC 8941 sf-decimal (``0.5``, ``1.0``, ``0.333``)."""
    return sf_decimal(lam)


def resolve(dial: Dial, context: Context, base: Callable[[], Base], settings: IntensitySettings) -> Resolution:
    """Resolve a request's dial. ``base`` is called only when the dial needs it, so "off" never validates it.

    A request without a dial gets the base's own λ (a cluster's stored dial) and no echo. A dial that will
    not change steering (no SAE attached, an empty base, or a dial-only request while steering is
    disabled) does not apply and is not echoed.
    """
    if dial is not None and (not context.sae_attached or context.base_empty
                             or (context.dial_only and not context.steering_enabled)):
        return Resolution(applies=False, lam=None)
    if dial is Symbol.OFF:
        return Resolution(applies=True, lam=0.0, echo=format_lambda(0.0))
    b = base()
    if not any(b.strengths.values()):
        return Resolution(applies=False, lam=None)
    lam = resolve_lambda(dial, b.kind, b.declared, b.stored, settings)
    echo = format_lambda(lam) if dial is not None else None
    return Resolution(applies=True, lam=lam, strengths=scale(b.strengths, lam), echo=echo)


def check_stored_dial(value: object, declared: tuple[float, float] | None, settings: IntensitySettings,
                      param: str = "lambda") -> float:
    """A cluster's persistent dial (PUT /api/clusters/{name}/intensity): a number in [0, max], else 400."""
    ceiling = dial_range(BaseKind.CLUSTER, declared, settings)[1]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0.0 <= value <= ceiling:
        raise InvalidParameter(f"'{param}' must be a number from 0 to {ceiling:g}; got {value!r}.", param=param)
    return float(value)
