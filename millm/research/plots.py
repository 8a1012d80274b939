"""A sweep drawn: a text plot for the terminal and a PNG bar chart, written without a plotting library."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

from millm.research.measure import FLUENCY_BOUND, TARGET_RATE, Point


def bar_lines(points: Sequence[Point], width: int = 30, bound: float = FLUENCY_BOUND) -> list[str]:
    """A text plot: one bar per strength, its length the concept rate."""
    shown = [f"{p.strength:g}" for p in points]
    pad = max((len(s) for s in shown), default=1)
    lines = []
    for s, p in zip(shown, points):
        bar = "█" * round(p.rate * width)
        mark = "inside" if p.inside else f"past -{bound:g}"
        lines.append(f"{s:>{pad}} │{bar:<{width}}│ {p.rate:4.0%}  fluency {p.fluency:+.2f} ({mark}), "
                     f"relevance {p.relevance:+.2f}")
    return lines


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(pixels: Sequence[Sequence[tuple[int, int, int]]]) -> bytes:
    """An 8-bit RGB PNG of ``pixels`` (rows of (r, g, b))."""
    height, width = len(pixels), len(pixels[0]) if pixels else 0
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


GREEN, RED, GREY, WHITE, BLUE = (46, 160, 67), (207, 34, 46), (200, 200, 200), (255, 255, 255), (9, 105, 218)


def bar_chart(points: Sequence[Point], target: float = TARGET_RATE, bar: int = 40, gap: int = 16,
              height: int = 200, margin: int = 20) -> list[list[tuple[int, int, int]]]:
    """Pixels of a bar chart: a bar per strength (in order), its height the concept rate, green inside the
    fluency bound and red past it; a grey line at 0% and 100%, a blue line at the target rate."""
    width = margin * 2 + len(points) * bar + max(0, len(points) - 1) * gap
    total = height + margin * 2
    img = [[WHITE] * width for _ in range(total)]
    floor, top = margin + height, margin

    def hline(y: int, colour: tuple[int, int, int]) -> None:
        for x in range(margin // 2, width - margin // 2):
            img[y][x] = colour

    hline(floor, GREY)
    hline(top, GREY)
    for i, p in enumerate(points):
        x0 = margin + i * (bar + gap)
        rise = round(max(0.0, min(1.0, p.rate)) * height)
        colour = GREEN if p.inside else RED
        for y in range(floor - rise, floor):
            for x in range(x0, x0 + bar):
                img[y][x] = colour
    hline(floor - round(target * height), BLUE)
    return img


def write_png(path: str | Path, points: Sequence[Point], target: float = TARGET_RATE) -> Path:
    path = Path(path)
    path.write_bytes(png_bytes(bar_chart(points, target)))
    return path
