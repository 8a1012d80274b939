"""The steering controls' arithmetic: the strength slider's (a feature's strength) and the intensity dial's (λ).
Pure functions.

Every bound comes from where the engine keeps it: strengths clamp at ``millm.steering.values``'
STRENGTH_LIMIT exactly as the hooks clamp them, and λ lives in ``millm.steering.intensity``'s ENVELOPE,
where an exact 0 is "off" (as ``parse_intensity`` reads a request). What "min" and "max" resolve to
depends on the base (cluster, circuit, plain), so the dial sends the symbol and shows the server's echo.
"""

from __future__ import annotations

import math

from millm.config import DEFAULT_DIAL, ENVELOPE
from millm.errors import InvalidParameter
from millm.steering.intensity import Dial, Symbol, parse_intensity
from millm.steering.values import STRENGTH_LIMIT, clamp

STRENGTH_STEP = 5.0
STRENGTH_LARGE_STEP = 25.0
LAMBDA_STEP = 0.1
LAMBDA_LARGE_STEP = 0.5


def edit_typed(typed: str, key: str, character: str | None,
               allowed: frozenset[str]) -> tuple[str, str | None] | None:
    """A value typed into a control, after one key: (what is typed now, the text Enter entered or None), or None
    when the key is not the typing's. A character from ``allowed`` extends it; while something is typed,
    Backspace edits it, Esc drops it and Enter enters it."""
    if character is not None and character in allowed:
        return typed + character, None
    if typed and key == "backspace":
        return typed[:-1], None
    if typed and key == "escape":
        return "", None
    if typed and key == "enter":
        return "", typed
    return None


def step_strength(strength: float, delta: float) -> float:
    """One arrow press on a strength: moved by ``delta`` and clamped as the engine clamps."""
    return clamp(round(strength + delta, 6))


def large_step(recommended: float | None) -> float:
    """The strength slider's ⇧ step for a feature: the size of its recommended strength (``millm steer sweep
    --save``), so one ⇧→ from 0 lands on it; STRENGTH_LARGE_STEP for a feature never measured."""
    if recommended is None or not math.isfinite(recommended) or recommended == 0:
        return STRENGTH_LARGE_STEP
    return min(abs(clamp(recommended)), STRENGTH_LIMIT)


def parse_strength(text: str) -> float:
    """A typed strength: a finite number, clamped as the engine clamps (0 removes the feature)."""
    try:
        value = float(text.strip())
    except ValueError:
        raise InvalidParameter(f"'strength' must be a number, got {text.strip()!r}.", param="strength") from None
    if not math.isfinite(value):
        raise InvalidParameter(f"'strength' must be a finite number, got {text.strip()!r}.", param="strength")
    return clamp(value)


def lambda_of(dial: Dial, echoed: float | None = None) -> float:
    """The number a dial stands for when stepping from it: a symbol steps from the λ the server last
    echoed for it (else the default dial), no dial from the default dial, "off" from 0."""
    if dial is Symbol.OFF:
        return ENVELOPE[0]
    if isinstance(dial, float):
        return dial
    return echoed if echoed is not None else DEFAULT_DIAL


def step_lambda(dial: Dial, delta: float, echoed: float | None = None) -> Dial:
    """One arrow press on λ: stays inside the envelope, and reaching 0 is "off" (as a request's 0 is)."""
    low, high = ENVELOPE
    value = min(high, max(low, round(lambda_of(dial, echoed) + delta, 6)))
    return parse_intensity(value)


def parse_lambda(text: str) -> Dial:
    """A typed λ: a number in the envelope or off/min/max, refused as a request's steering_intensity is."""
    word = text.strip().lower()
    try:
        return parse_intensity(float(word))
    except ValueError:
        return parse_intensity(word)


def wire_dial(dial: Dial) -> float | str | None:
    """The ``steering_intensity`` value a dial sends."""
    return dial.value if isinstance(dial, Symbol) else dial


def show_dial(dial: Dial) -> str:
    """How the dial reads: ``base`` (no dial sent), ``off``, ``min``, ``max`` or ``0.80``."""
    if dial is None:
        return "base"
    return dial.value if isinstance(dial, Symbol) else f"{dial:.2f}"


def dial_fraction(dial: Dial, echoed: float | None = None) -> float:
    """Where the dial's needle sits on the envelope, 0 to 1."""
    low, high = ENVELOPE
    return (lambda_of(dial, echoed) - low) / (high - low)
