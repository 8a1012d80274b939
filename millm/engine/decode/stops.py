"""Stop-sequence matching on decoded text, across token boundaries."""

from __future__ import annotations

from collections.abc import Sequence


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Index in ``text`` where the earliest stop sequence begins (searching from ``start``), or None."""
    hits = [i for s in stops if (i := text.find(s, start)) != -1]
    return min(hits) if hits else None


def _borders(s: str) -> list[int]:
    """KMP's failure table: ``b[i]`` is the length of the longest proper prefix of ``s[:i + 1]`` that is also
    its suffix."""
    b = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = b[k - 1]
        if s[i] == s[k]:
            k += 1
        b[i] = k
    return b


class StopMatcher:
    """For each stop sequence, the longest start of it that the text so far ends with, kept up to date as text
    arrives: amortised constant work per character and sequence, whatever their lengths (checking every
    prefix against the text again at every token grew with the square of a sequence's length)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self._borders = [_borders(s) for s in self.stops]
        self._matched = [0] * len(self.stops)

    def feed(self, text: str) -> int:
        """Take ``text`` (what was appended); return how many trailing characters of everything fed so far
        could still grow into a stop sequence (a complete one is ``find_stop``'s to cut)."""
        held = 0
        for j, (s, borders) in enumerate(zip(self.stops, self._borders)):
            k = self._matched[j]
            for ch in text:
                if k == len(s):
                    k = borders[k - 1]
                while k and s[k] != ch:
                    k = borders[k - 1]
                if s[k] == ch:
                    k += 1
            self._matched[j] = k
            held = max(held, k if k < len(s) else borders[k - 1])
        return held


def holdback(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of ``text`` could still grow into a stop sequence.

    Those characters must not be emitted yet: if the next token completes a stop, they are cut.
    """
    return StopMatcher(stops).feed(text)
