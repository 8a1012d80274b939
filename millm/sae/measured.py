"""What a steering measure stored about one feature (or vector): the strength chosen on the calibration prompts,
verified on held-out prompts, in a ``features.jsonl`` row.

The row's keys (the fields every front end reads; :class:`HeldOut` reads and writes them):

- ``held_out``: the held-out measure, an object:

  - ``prompt_set``: the version of the shipped neutral prompt sets (``millm/research/prompts/``) it used;
  - ``weights``: the numbers the answers came from, the dtype part of the engine's fingerprint (``float32``,
    ``float32+int8``, ``bfloat16``): a strength measured on one is a strength for that one (int8 moves a concept
    rate as far as float32 does, but not concept by concept; docs/benchmarks.md). Absent in a measure stored
    before it was recorded;
  - ``strength``: the strength chosen on the calibration set (null when no strength there mentioned the
    concept more than the unsteered answers: nothing was verified, and the other figures are absent);
  - ``calibration_rate``: the concept rate there on the calibration set (the figure it was chosen by);
  - ``rate``: the concept rate at that strength on the held-out set, ``answers`` answers of ``tokens``
    tokens (seeded from ``seed``);
  - ``interval``: ``[low, high]``, the held-out rate's 90% Wilson interval;
  - ``fluency``, ``relevance``, ``degeneration``: the held-out answers' (``millm.research.measure``);
  - ``target``: the concept rate a recommendation promises; ``bound``: the fluency bound (nats/token);
  - ``recommended``: whether the interval reaches the target (``high >= target``) with the held-out fluency
    inside the bound (:func:`reaches`, the one rule);
  - ``sweep`` (where the measure kept it): the calibration sweep that chose the strength, one
    ``{strength, rate, fluency, relevance}`` per strength tried, as ``millm steer sweep`` measured them.

- ``recommended_strength``: present only when ``held_out.recommended`` is true, and then equal to
  ``held_out.strength``. A ``recommended_strength`` without a ``held_out`` object is an older single-set
  measure and is not read as recommended.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

HELD_OUT_KEY = "held_out"
MEASURED_KEY = "recommended_strength"


def reaches(high: float, target: float, fluency: float, bound: float) -> bool:
    """Whether a held-out measure earns a recommendation: its interval's upper end reaches ``target`` (the
    target is inside or below what the held-out answers allow) and its fluency is inside ``-bound``."""
    return high >= target and fluency >= -bound


@dataclass(frozen=True)
class HeldOut:
    """One feature's held-out measure (the ``held_out`` object of its row)."""

    prompt_set: str
    strength: float | None  # None: the calibration set found no strength to verify
    calibration_rate: float = 0.0
    rate: float = 0.0
    low: float = 0.0
    high: float = 0.0
    answers: int = 0
    tokens: int = 0
    seed: int = 0
    fluency: float = 0.0
    relevance: float = 0.0
    degeneration: float = 0.0
    target: float = 0.6
    bound: float = 1.5
    sweep: tuple[tuple[float, float, float, float], ...] = ()  # (strength, rate, fluency, relevance) calibrated
    weights: str = ""  # the engine's numbers (``float32``, ``float32+int8``); empty: not recorded

    @property
    def recommended(self) -> bool:
        return self.strength is not None and reaches(self.high, self.target, self.fluency, self.bound)

    @property
    def recommended_strength(self) -> float | None:
        return self.strength if self.recommended else None

    def to_json(self) -> dict[str, Any]:
        """The ``held_out`` object as stored and as the API shows it."""
        made = {"prompt_set": self.prompt_set, **({"weights": self.weights} if self.weights else {})}
        if self.strength is None:
            return {**made, "strength": None, "recommended": False}
        return {**made, "strength": self.strength,
                "calibration_rate": round(self.calibration_rate, 4), "rate": round(self.rate, 4),
                "interval": [round(self.low, 4), round(self.high, 4)], "answers": self.answers,
                "tokens": self.tokens, "seed": self.seed, "fluency": round(self.fluency, 4),
                "relevance": round(self.relevance, 4), "degeneration": round(self.degeneration, 4),
                "target": self.target, "bound": self.bound, "recommended": self.recommended,
                **({"sweep": [dict(zip(SWEEP_KEYS, (round(v, 4) for v in point))) for point in self.sweep]}
                   if self.sweep else {})}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> HeldOut:
        """A stored ``held_out`` object (checked by :func:`is_held_out` first)."""
        strength, weights = body.get("strength"), body.get("weights")
        weights = weights if isinstance(weights, str) else ""
        if strength is None:
            return cls(str(body["prompt_set"]), None, weights=weights)
        low, high = body["interval"]
        return cls(str(body["prompt_set"]), float(strength), float(body["calibration_rate"]), float(body["rate"]),
                   float(low), float(high), int(body["answers"]), int(body["tokens"]), int(body["seed"]),
                   float(body["fluency"]), float(body["relevance"]), float(body["degeneration"]),
                   float(body["target"]), float(body["bound"]), _sweep(body.get("sweep")), weights)

    def describe(self) -> str:
        """One line: the held-out rate, its interval and what it rests on (the line every front end shows)."""
        how = self.prompt_set + (f", {self.weights} weights" if self.weights else "")
        if self.strength is None:
            return f"no strength mentions the concept (prompt set {how})"
        return (f"held-out {self.rate:.0%} [{self.low:.0%}-{self.high:.0%}] of {self.answers} answers at "
                f"{self.strength:g} ({how})")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


SWEEP_KEYS = ("strength", "rate", "fluency", "relevance")


def _sweep(value: Any) -> tuple[tuple[float, float, float, float], ...]:
    """A stored ``sweep`` list as points; anything else (absent, or not a list of points) as none."""
    if not isinstance(value, list) or not all(isinstance(p, dict) and all(_number(p.get(k)) for k in SWEEP_KEYS)
                                              for p in value):
        return ()
    return tuple((float(p["strength"]), float(p["rate"]), float(p["fluency"]), float(p["relevance"])) for p in value)


NUMBERS = ("calibration_rate", "rate", "fluency", "relevance", "degeneration", "target", "bound")
COUNTS = ("answers", "tokens", "seed")


def is_held_out(value: Any) -> bool:
    """Whether ``value`` is a ``held_out`` object a card can read (a file may hold anything)."""
    if not isinstance(value, dict) or not isinstance(value.get("prompt_set"), str):
        return False
    if value.get("strength") is None:
        return True
    interval = value.get("interval")
    return (_number(value["strength"]) and all(_number(value.get(k)) for k in NUMBERS)
            and all(isinstance(value.get(k), int) and not isinstance(value.get(k), bool) for k in COUNTS)
            and isinstance(interval, list) and len(interval) == 2 and all(_number(v) for v in interval))


def held_out_of(row: Mapping[str, Any]) -> HeldOut | None:
    """The row's held-out measure, when it has one."""
    value = row.get(HELD_OUT_KEY)
    return HeldOut.from_json(value) if isinstance(value, dict) and is_held_out(value) else None


def recommended_of(row: Mapping[str, Any]) -> float | None:
    """The row's recommended strength: only one its held-out measure recommends (an older single-set
    ``recommended_strength`` is not)."""
    held = held_out_of(row)
    return held.recommended_strength if held is not None else None
