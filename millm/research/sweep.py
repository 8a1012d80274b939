"""Strength sweeps: one feature (or any case) measured at a range of strengths, refined where fluency gives way,
and the strength to recommend.

- refinement (:func:`refine`): when no strength inside the fluency bound reaches the target, the sweep adds
  the strength halfway to the next one past the bound (twice, ``REFINE_ROUNDS``), where the best strength
  lies;
- the chosen strength (:func:`recommend`, on the calibration prompts): the lowest steering strength whose rate
  reaches ``TARGET_RATE`` inside the fluency bound, else the one with the highest (non-zero) rate inside the
  bound, else none;
- the recommended strength: the chosen one, when its measure on the held-out prompts
  (``millm.research.held_out``) has a 90% interval that reaches the target; else none.

The measures are ``millm.research.measure``'s: answers sampled and scored on the engine's request path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from millm.engine.base import Engine
from millm.errors import InvalidParameter
from millm.research.held_out import Measuring, verify
from millm.research.measure import (
    FLUENCY_BOUND,
    HELD_OUT_PROMPTS,
    MAX_NEW_TOKENS,
    NEUTRAL_PROMPTS,
    SEED,
    TARGET_RATE,
    Case,
    Measure,
    Point,
)
from millm.research.prompt_sets import PROMPT_SET
from millm.research.words import concept_rate, label_words
from millm.sae.measured import HeldOut

STRENGTHS = (0.0, 20.0, 40.0, 60.0, 80.0)
REFINE_ROUNDS = 2  # strengths a sweep adds at the fluency crossing (:func:`refine`): 40/60 gives 50, then 45 or 55
REFINE_CLOSEST = 5.0  # strengths closer than this are not told apart by a few prompts
MAX_TOKENS = 512  # tokens per sampled answer
MAX_STRENGTHS = 32  # strengths one sweep measures (each one more set of answers)


@dataclass
class SweepResult:
    sae: str
    layer: int
    feature: int
    label: str
    words: tuple[str, ...]
    prompts: int
    tokens: int
    seed: int
    unsteered_rate: float
    unsteered_logprob: float
    points: list[Point] = field(default_factory=list)
    bound: float = FLUENCY_BOUND
    target: float = TARGET_RATE
    held_out: HeldOut | None = None  # the chosen strength measured on the held-out prompts (None: none chosen)

    @property
    def chosen(self) -> float | None:
        """The strength the calibration prompts chose (:func:`recommend`)."""
        return recommend(self.points, self.target, self.bound)

    @property
    def recommended(self) -> float | None:
        """The chosen strength, when the held-out measure recommends it."""
        return self.held_out.recommended_strength if self.held_out is not None else None

    def point(self, strength: float | None) -> Point | None:
        return next((p for p in self.points if p.strength == strength), None)

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["words"] = list(self.words)
        body["chosen_strength"] = self.chosen
        body["recommended_strength"] = self.recommended
        body["held_out"] = self.held_out.to_json() if self.held_out is not None else None
        return body


def recommend(points: Sequence[Point], target: float = TARGET_RATE, bound: float = FLUENCY_BOUND) -> float | None:
    """The lowest strength (by size; 0 steers nothing and is never recommended) whose concept rate reaches
    ``target`` with fluency inside ``-bound``; else the strength with the highest non-zero rate inside the
    bound (the lower on a tie); else None."""
    steered = sorted((p for p in points if p.strength != 0 and p.fluency >= -bound), key=lambda p: abs(p.strength))
    reached = [p for p in steered if p.rate >= target]
    if reached:
        return reached[0].strength
    best = max(steered, key=lambda p: p.rate, default=None)  # max keeps the first (lowest) of equals
    return best.strength if best is not None and best.rate > 0 else None


def refine(points: Sequence[Point], target: float = TARGET_RATE, bound: float = FLUENCY_BOUND,
           closest: float = REFINE_CLOSEST) -> float | None:
    """The strength to measure next, when no strength inside the fluency bound reaches ``target``: halfway
    between the strongest one inside the bound and the next one past it (on one side of 0; positive
    first). The rate tends to rise with the strength until fluency gives way, so the best strength lies
    near that crossing, which a coarse grid (40 inside, 60 past) can step over. None when no side has such
    a crossing, or its two strengths are within ``2 * closest`` of each other, or the side never mentions
    the concept at all."""
    for sign in (1, -1):
        side = sorted((p for p in points if p.strength * sign > 0), key=lambda p: abs(p.strength))
        halfway = _halfway(side, target, bound, closest)
        if halfway is not None:
            return halfway
    return None


def _halfway(side: list[Point], target: float, bound: float, closest: float) -> float | None:
    """``refine`` on one side of 0 (``side``: its points by distance from 0)."""
    inside = [p for p in side if p.fluency >= -bound]
    if not _short_of(side, inside, target):
        return None
    below = inside[-1]
    past = next((p for p in side if abs(p.strength) > abs(below.strength)), None)
    if past is not None and abs(past.strength - below.strength) >= 2 * closest:
        return (below.strength + past.strength) / 2
    return None


def _short_of(side: list[Point], inside: list[Point], target: float) -> bool:
    """Whether a side has strengths inside the fluency bound, none reaching ``target``, and mentions the concept."""
    return bool(inside) and not any(p.rate >= target for p in inside) and any(p.rate > 0 for p in side)


def swept_points(measure: Measure, sweeps: Sequence[Callable[[float], Case]], strengths: Sequence[float],
                 rounds: int = REFINE_ROUNDS) -> list[list[Point]]:
    """Each sweep (its case at a strength) measured at every strength, all sampled together, then with up to
    ``rounds`` strengths added where :func:`refine` asks for one, every round's strengths sampled together;
    points in strength order."""
    points = measure.points([at(s) for at in sweeps for s in strengths])
    n = len(strengths)
    out = [sorted(points[i * n:(i + 1) * n], key=lambda p: p.strength) for i in range(len(sweeps))]
    for _ in range(rounds):
        asked = [(i, s) for i, mine in enumerate(out) if (s := refine(mine, bound=measure.bound)) is not None]
        if not asked:
            break
        for (i, _), point in zip(asked, measure.points([sweeps[i](s) for i, s in asked])):
            out[i] = sorted([*out[i], point], key=lambda p: p.strength)
    return out


def verdict(result: SweepResult) -> str:
    """What the held-out prompts said of the chosen strength, in one line: recommended, or why not, with the
    held-out figures (what ``millm steer sweep`` and the TUI's sweep print last)."""
    held, bound = result.held_out, result.bound
    if held is None or held.strength is None:
        return (f"recommended strength: none (no strength mentions the concept inside the fluency bound "
                f"-{bound:g} on the calibration prompts)")
    figures = (f"{held.describe()}; calibration {held.calibration_rate:.0%}; fluency {held.fluency:+.2f}, "
               f"relevance {held.relevance:+.2f}, degenerate {held.degeneration:.0%}")
    if held.recommended:
        return f"recommended strength: {held.strength:g} ({figures})"
    return (f"recommended strength: none: {held.strength:g} was chosen on the calibration prompts, but its held-out "
            f"interval misses the target {result.target:.0%} or the fluency bound -{bound:g} (best held-out point: "
            f"{figures})")


def need_words(feature: int, words: Sequence[str]) -> Sequence[str]:
    """``words``, or a refusal naming --concept when the feature's label gave none to look for."""
    if not words:
        raise InvalidParameter(f"Feature {feature} has no label words to look for; name them with --concept.",
                               param="concept")
    return words


def run_sweep(measure: Measure, held: Measuring, sae_id: str, layer: int, feature: int, label: str,
              words: Sequence[str], strengths: Sequence[float], prompt_set: str = PROMPT_SET) -> SweepResult:
    """``feature`` of ``sae_id`` (attached at ``layer`` on ``measure``'s steering) at each strength on the
    calibration prompts (``measure``), the strengths sampled together, then refined at the fluency crossing
    (:func:`swept_points`); the strength they choose is then measured on the held-out prompts (``held``)."""
    words = tuple(w.lower() for w in need_words(feature, words))
    [points] = swept_points(measure, [partial(Case.feature, sae_id, feature, words=words)], strengths)
    # the unsteered answers are read after the points: asked for first, they would be sampled in a job of their own
    result = SweepResult(sae_id, layer, feature, label, words, len(measure.prompts), measure.tokens, measure.seed,
                         concept_rate(measure.plain, words), measure.plain_logprob, points, bound=measure.bound)
    chosen = result.point(result.chosen)
    if chosen is not None:
        [result.held_out] = verify(held, [(Case.feature(sae_id, feature, chosen.strength, words), chosen.rate)],
                                   prompt_set, result.target, [points])
    return result


def check_sizes(prompts: int, tokens: int, held_out: int = len(HELD_OUT_PROMPTS)) -> None:
    """The calibration and held-out prompts and tokens per answer a sweep may ask for."""
    if not 1 <= prompts <= len(NEUTRAL_PROMPTS):
        raise InvalidParameter(f"--prompts must be 1-{len(NEUTRAL_PROMPTS)}.", param="prompts")
    if not 1 <= held_out <= len(HELD_OUT_PROMPTS):
        raise InvalidParameter(f"--held-out must be 1-{len(HELD_OUT_PROMPTS)}.", param="held_out")
    if not 1 <= tokens <= 512:
        raise InvalidParameter("--tokens must be 1-512.", param="tokens")


def sweep_feature(service: Any, engine: Engine, sae_id: str, feature: int, *, label: str = "",
                  words: Sequence[str] = (), strengths: Sequence[float] = STRENGTHS, prompts: int = 16,
                  held_out: int = len(HELD_OUT_PROMPTS), seed: int = SEED, tokens: int = MAX_NEW_TOKENS,
                  layer: int | None = None) -> SweepResult:
    """A sweep on a loaded engine (whose steering ``service``'s registry knows): ``sae_id`` is attached for the
    sweep only (``millm chat --sae``'s session: at ``layer``, default where it is attached, else its hint; an
    SAE on that layer set aside); live values steer none of the sweep's answers, and afterwards attachments,
    values and the active profile are as they were; nothing is persisted. ``words`` default to the label's
    (:func:`label_words`)."""
    from millm.research.measure import check_engine
    from millm.steering.session import chat_steering

    check_sizes(prompts, tokens, held_out)
    check_engine(engine)
    words = need_words(feature, tuple(words) or label_words(label))  # before anything is attached
    target = engine.steering_target()
    assert target is not None
    with chat_steering(service, target, sae_id, layer, {}, None):
        measure = Measure(engine, NEUTRAL_PROMPTS[:prompts], seed, tokens)
        held = Measure(engine, HELD_OUT_PROMPTS[:held_out], seed, tokens)
        layer_at = target.steering.attachments[sae_id].layer
        return run_sweep(measure, held, sae_id, layer_at, feature, label, words, strengths)


def parse_strengths(text: str) -> list[float]:
    """``"0,20,40"`` as strengths (each within ±200, no repeats)."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InvalidParameter(f"--strengths '{text}' is not a comma-separated list of numbers.",
                               param="strengths") from None
    return check_strengths(values, f"--strengths '{text}'")


def check_strengths(values: Sequence[float], shown: str, most: int = MAX_STRENGTHS) -> list[float]:
    """``values`` as a sweep's strengths: 1 to ``most`` distinct numbers within ±200 (the clamp), else refused
    naming ``shown`` (how the caller's field reads)."""
    if not values or len(values) > most or any(not -200 <= v <= 200 for v in values) \
            or len(set(values)) != len(values):
        raise InvalidParameter(f"{shown}: give 1 to {most} distinct numbers within -200..200.", param="strengths")
    return list(values)


