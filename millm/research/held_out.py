"""Verifying a chosen strength on prompts it was not chosen on.

Picking the lowest strength that reaches a target on a few draws picks the luckiest draw (the winner's curse):
the rate it was chosen by overstates what the next prompt gets. So a strength chosen on the calibration prompts
(``millm.research.prompt_sets``) is measured again on the held-out prompts, seeded and sampled as a request is,
and what is stored is that held-out rate with its 90% Wilson interval and the held-out fluency, relevance and
degeneration (``millm.sae.measured.HeldOut``); it is recommended only when that interval reaches the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from millm.research.interval import wilson
from millm.research.measure import TARGET_RATE, Case, Point
from millm.sae.measured import HeldOut


class Measuring(Protocol):
    """What verifying needs of a measure (``millm.research.measure.Measure``; tests script one)."""

    prompts: tuple[str, ...]
    seed: int
    tokens: int
    bound: float
    weights: str  # the numbers the answers come from (``millm.engine.base.numerics``)

    def points(self, cases: Sequence[Case]) -> list[Point]: ...


def held_out(point: Point, calibration_rate: float, measure: Measuring, prompt_set: str,
             target: float = TARGET_RATE, sweep: Sequence[Point] = ()) -> HeldOut:
    """A point measured on ``measure``'s held-out prompts as the stored record: its rate and the rate's interval
    (from the count of answers that mentioned the concept), fluency, relevance and degeneration; ``sweep``, the
    calibration points that chose it, kept beside them."""
    n = len(measure.prompts)
    low, high = wilson(round(point.rate * n), n)
    return HeldOut(prompt_set, point.strength, calibration_rate, point.rate, low, high, n, measure.tokens,
                   measure.seed, point.fluency, point.relevance, point.degenerate, target, measure.bound,
                   tuple((p.strength, p.rate, p.fluency, p.relevance) for p in sweep), measure.weights)


def verify(measure: Measuring, chosen: Sequence[tuple[Case, float]], prompt_set: str,
           target: float = TARGET_RATE, sweeps: Sequence[Sequence[Point]] | None = None) -> list[HeldOut]:
    """Each case (at the strength the calibration prompts chose, with the rate it was chosen by) measured on
    ``measure``'s held-out prompts, all in one job; ``sweeps``, each case's calibration points, are stored with
    it."""
    if not chosen:
        return []
    points = measure.points([case for case, _ in chosen])
    swept = sweeps if sweeps is not None else [()] * len(chosen)
    return [held_out(p, rate, measure, prompt_set, target, sweep)
            for p, (_, rate), sweep in zip(points, chosen, swept, strict=True)]


def unverified(prompt_set: str, weights: str) -> HeldOut:
    """The record of a feature whose calibration (on ``weights``) found no strength to verify."""
    return HeldOut(prompt_set, None, weights=weights)
