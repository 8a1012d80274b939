"""A circuit's evidence rung and the X-miLLM-Circuit-Rung header, rendered server-side from the ladder.

The phrase for each rung is fixed here (the spec's table), never composed per request, so a circuit
below rung 2 is never described as causal.
"""

from __future__ import annotations

from dataclasses import dataclass

from millm.sfv import sf_string

CIRCUIT_RUNG_HEADER = "X-miLLM-Circuit-Rung"


@dataclass(frozen=True)
class Rung:
    """One step of the evidence ladder."""

    level: int
    language: str
    meaning: str


LADDER: tuple[Rung, ...] = (
    Rung(0, "associated", "Mined co-occurrence only — unvalidated"),
    Rung(1, "suggested (attribution-supported)", "Attribution evidence, not causal"),
    Rung(2, "causally validated (edge)", "Each edge causally validated"),
    Rung(3, "faithfulness-tested (circuit)", "The whole circuit was faithfulness-tested"),
)
RUNGS = range(len(LADDER))
"""The valid rungs, 0-3."""


def step(rung: int) -> Rung:
    """The ladder step for ``rung``; ValueError outside 0-3 (documents are checked on import)."""
    if isinstance(rung, bool) or rung not in RUNGS:
        raise ValueError(f"rung must be one of 0-{len(LADDER) - 1}, got {rung!r}")
    return LADDER[rung]


def rung_language(rung: int) -> str:
    """The ladder phrase for ``rung`` (0-3)."""
    return step(rung).language


def rung_header(rung: int) -> str:
    """The RFC 8941 item ``2; language="causally validated (edge)"``: a bare integer with a quoted phrase.

    Send it only while a circuit is genuinely steering the response (serving natively, λ not off).
    """
    return f"{step(rung).level}; language={sf_string(step(rung).language)}"
