"""Drawing a dial's scale: a horizontal track with a centre mark and a needle. Pure."""

from __future__ import annotations

from rich.text import Text


def gauge(fraction: float, width: int, centre: float | None = None, style: str = "bold") -> Text:
    """A ``width``-cell track with the needle at ``fraction`` (0-1) and a tick at ``centre`` (0-1)."""
    width = max(width, 3)
    needle = round(min(1.0, max(0.0, fraction)) * (width - 1))
    tick = None if centre is None else round(centre * (width - 1))
    text = Text()
    for i in range(width):
        if i == needle:
            text.append("●", style=style)
        elif i == tick:
            text.append("┼", style="dim")
        elif tick is not None and min(tick, needle) < i < max(tick, needle):
            text.append("━", style=style)
        else:
            text.append("─", style="dim")
    return text
