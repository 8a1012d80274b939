"""A probe's held-out scores drawn: a PNG histogram of the positives (blue, above the axis) and the negatives
(red, below it) in shared bins, with the threshold as a grey line; written without a plotting library."""

from __future__ import annotations

from pathlib import Path

from millm.probes.probe import Probe
from millm.research.plots import BLUE, GREY, RED, WHITE, png_bytes

BINS, BIN_W, HALF, PAD = 40, 12, 120, 10


def histogram_png(probe: Probe) -> bytes:
    """The histogram's PNG bytes (``BINS`` bins from the lowest to the highest held-out score)."""
    positive, negative = probe.scores.get("positive", []), probe.scores.get("negative", [])
    values = [*positive, *negative, probe.threshold]
    low, high = min(values), max(values)
    span = (high - low) or 1.0

    def counts(scores: list[float]) -> list[int]:
        found = [0] * BINS
        for s in scores:
            found[min(BINS - 1, int((s - low) / span * BINS))] += 1
        return found

    up, down = counts(positive), counts(negative)
    tallest = max([*up, *down, 1])
    width, height = BINS * BIN_W + 2 * PAD, 2 * HALF + 2 * PAD
    pixels = [[WHITE] * width for _ in range(height)]
    axis = PAD + HALF
    for b in range(BINS):
        for count, colour, sign in ((up[b], BLUE, -1), (down[b], RED, 1)):
            bar = round(count / tallest * HALF)
            for dy in range(bar):
                row = pixels[axis + sign * (dy + 1) - (1 if sign < 0 else 0)]
                for dx in range(1, BIN_W - 1):
                    row[PAD + b * BIN_W + dx] = colour
    cut = PAD + min(BINS * BIN_W - 1, round((probe.threshold - low) / span * BINS * BIN_W))
    for y in range(height):
        pixels[y][cut] = GREY
    for x in range(PAD, PAD + BINS * BIN_W):
        pixels[axis][x] = GREY
    return png_bytes(pixels)


def write_histogram(path: Path, probe: Probe) -> Path:
    path.write_bytes(histogram_png(probe))
    return path
