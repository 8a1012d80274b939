"""Figures drawn without a plotting library: a sweep's text plot for the terminal, and any research figure
(``millm.research.figures``, the description the console draws too) as a PNG."""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from millm.research.figures import THEMES
from millm.research.measure import FLUENCY_BOUND, Point


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

# a figure's geometry: the console's plot.js draws the same figure at the same sizes
WIDTH, PANEL, GAP, LEFT, RIGHT, TOP = 620, 150, 34, 56, 120, 16
Pixels = list[list[tuple[int, int, int]]]


def _range(panel: Mapping[str, Any]) -> tuple[float, float]:
    """The y range a panel shows: its own min/max where given, else its values and lines with 0, as plot.js."""
    values = [v for s in panel["series"] for v in s["values"] if math.isfinite(v)] + [ln["y"] for ln in panel["lines"]]
    lo = panel["min"] if panel.get("min") is not None else min([*values, 0.0])
    hi = panel["max"] if panel.get("max") is not None else max([*values, 0.0])
    return (lo - 1, hi + 1) if hi - lo < 1e-9 else (lo, hi)


def figure_pixels(figure: Mapping[str, Any], theme: str = "light") -> Pixels:
    """A figure (``millm.research.figures``) as pixels in ``theme``'s colours: per panel its grid, its reference
    lines dashed, the marked x dotted, each series a line with a dot per point; no text (the console and the
    terminal print the numbers)."""
    colours = THEMES[theme]
    xs = figure["xs"]
    height = TOP + len(figure["panels"]) * (PANEL + GAP) + 8
    img = [[colours["background"]] * WIDTH for _ in range(height)]
    xlo, xhi = min(xs), max(xs)

    def px(x: float) -> int:
        return round(LEFT + (x - xlo) / ((xhi - xlo) or 1) * (WIDTH - LEFT - RIGHT))

    def put(x: int, y: int, colour: tuple[int, int, int]) -> None:
        if 0 <= y < height and 0 <= x < WIDTH:
            img[y][x] = colour

    for k, panel in enumerate(figure["panels"]):
        y0 = TOP + k * (PANEL + GAP)
        lo, hi = _range(panel)

        def py(y: float, y0: int = y0, lo: float = lo, hi: float = hi) -> int:
            return round(y0 + PANEL - (y - lo) / (hi - lo) * PANEL)

        for tick in range(5):
            for x in range(LEFT, WIDTH - RIGHT):
                put(x, py(lo + tick * (hi - lo) / 4), colours["grid"])
        for line in panel["lines"]:
            for x in range(LEFT, WIDTH - RIGHT):
                if (x - LEFT) % 9 < 5:
                    put(x, py(line["y"]), colours[line["cls"]])
        if figure.get("mark") is not None:
            for y in range(y0, y0 + PANEL):
                if (y - y0) % 5 < 2:
                    put(px(figure["mark"]["x"]), y, colours["mark"])
        for series in panel["series"]:
            colour = colours[series["cls"]]
            dots = [(px(x), py(v)) for x, v in zip(xs, series["values"]) if math.isfinite(v)]
            for (xa, ya), (xb, yb) in zip(dots, dots[1:]):
                steps = max(abs(xb - xa), abs(yb - ya), 1)
                for i in range(steps + 1):
                    x, y = round(xa + (xb - xa) * i / steps), round(ya + (yb - ya) * i / steps)
                    put(x, y, colour)
                    put(x, y + 1, colour)
            for cx, cy in dots:
                for dy in range(-4, 5):
                    for dx in range(-4, 5):
                        if dx * dx + dy * dy <= 16:
                            put(cx + dx, cy + dy, colour)
    return img


def write_figure(path: str | Path, figure: Mapping[str, Any], theme: str = "light") -> Path:
    """``figure`` as a PNG at ``path``."""
    path = Path(path)
    path.write_bytes(png_bytes(figure_pixels(figure, theme)))
    return path
