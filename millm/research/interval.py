"""The interval a rate's few draws allow: Wilson's score interval. Pure."""

from __future__ import annotations

import math

Z90 = 1.6448536269514722  # the standard normal's 95th percentile: a two-sided 90% interval


def wilson(successes: int, n: int, z: float = Z90) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` in ``n`` draws (two-sided, 90% by default), as (low, high);
    ``(0, 1)`` when nothing was drawn. Unlike the normal approximation it stays inside [0, 1] and is not
    empty at 0 or n successes, which is where a few draws of a rate often land."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes of {n} draws")
    p, z2 = successes / n, z * z
    denominator = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)
