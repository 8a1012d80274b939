"""Stop-sequence matching on decoded text, across token boundaries."""

from __future__ import annotations

from collections.abc import Sequence


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Index in ``text`` where the earliest stop sequence begins (searching from ``start``), or None."""
    hits = [i for s in stops if (i := text.find(s, start)) != -1]
    return min(hits) if hits else None


def holdback(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of ``text`` could still grow into a stop sequence.

    Those characters must not be emitted yet: if the next token completes a stop, they are cut.
    """
    longest = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:k]):
                longest = k
                break
    return longest
