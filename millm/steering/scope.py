"""Where a request's steering applies: every position (``all``, the spec's behaviour), only the positions being
generated (``generated``), or only the prompt's (``prompt``).

A forward is one phase: a prefill chunk reads prompt positions, a decode step feeds a generated token. Each
steering row carries one gate per phase (1 steers, 0 does not), written when the row is bound, so the hook
multiplies its delta by the forward's gate and nothing is rebuilt per step. The last prompt position yields
the first generated token's logits, so under ``generated`` the first token is drawn unsteered, on both
engines alike (llama.cpp sets its control vector for prefill or decode only).
"""

from __future__ import annotations

from typing import Literal

from millm.errors import InvalidParameter

Scope = Literal["all", "generated", "prompt"]
SCOPES: tuple[Scope, ...] = ("all", "generated", "prompt")
ALL: Scope = "all"
PARAM = "steering_scope"
PROMPT_PHASE, GENERATED_PHASE = 0, 1  # a forward's phase: the index of its gate


def parse_scope(value: object, param: str = PARAM) -> Scope | None:
    """A checked scope, or None when the field was not sent (null)."""
    if value is None:
        return None
    for scope in SCOPES:
        if value == scope:
            return scope
    raise InvalidParameter(f"'{param}' must be one of {', '.join(repr(s) for s in SCOPES)}, got {value!r}.",
                           param=param)


def gates(scope: Scope) -> tuple[float, float]:
    """The (prompt, generated) gates of a row steered with ``scope``."""
    return float(scope != "generated"), float(scope != "prompt")


def applies(scope: Scope, phase: int) -> bool:
    """Whether a row of ``scope`` is steered in a forward of ``phase``."""
    return gates(scope)[phase] > 0
