"""Screening every labelled feature of an SAE for steering: a cheap estimate for all, the sweep's own measure
for the promising ones, and a recommended strength for each feature that steers its label.

Sweeping thousands of features by sampling answers is hours on a CPU, so the screen has two stages:

- estimate (teacher forced, nothing sampled): the unsteered answers to a few neutral prompts are read
  again through the engine (``Engine.forced``), each read steered by one feature alone; at each answer
  position, the steered model's probability of starting one of the label's words (:func:`word_tokens`);
  an answer's chance of mentioning the concept is estimated as ``1 - prod(1 - p)``, averaged over the
  answers, and the feature's estimate is how much its delta raises that over the unsteered model's own;
- measure: a feature whose estimate rises by ``FLOOR`` or more is swept with ``millm.research.sweep`` on the
  calibration prompts (sampled answers, concept rate, fluency against the unsteered answers, refined at the
  fluency crossing), and the strength that sweep chooses (:func:`millm.research.sweep.recommend`, when some
  strength mentions the concept more often than the unsteered answers do) is measured on the held-out
  prompts (``millm.research.held_out``); it is recommended when the held-out interval reaches the target.

A feature the estimate passes over is not recorded: the screen says nothing about it, and ``millm steer
sweep`` measures it on demand.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from millm.engine.base import Engine
from millm.engine.params import ChatPrompt, Forced, TextPrompt
from millm.research.held_out import Measuring, unverified, verify
from millm.research.measure import HELD_OUT_PROMPTS, NEUTRAL_PROMPTS, SEED, Case, Measure, Point, check_engine
from millm.research.prompt_sets import PROMPT_SET
from millm.research.sweep import check_sizes, recommend, swept_points
from millm.research.words import concept_rate, label_words, word_forms
from millm.sae.measured import HeldOut
from millm.steering.core import RequestSteering

FLOOR = 0.2  # estimated rise in the chance of a mention that earns a feature the sampled sweep
ESTIMATE_STRENGTHS = (60.0,)
SWEEP_STRENGTHS = (20.0, 40.0, 60.0, 80.0)
ROWS_PER_BATCH = 96  # answers a batch of sweeps samples together (features x prompts x strengths)


@dataclass(frozen=True)
class Screened:
    """One feature the sampled sweep measured."""

    feature: int
    label: str
    estimate: float  # the estimated rise in the chance of a mention (the best over ESTIMATE_STRENGTHS)
    baseline: float  # the unsteered answers' concept rate (calibration prompts)
    points: list[Point]  # on the calibration prompts
    held_out: HeldOut  # the chosen strength on the held-out prompts (its strength None when none was chosen)

    @property
    def recommended(self) -> float | None:
        """The chosen strength, when its held-out measure recommends it."""
        return self.held_out.recommended_strength

    @property
    def rate(self) -> float:
        """The held-out concept rate at the chosen strength (0 when none was chosen)."""
        return self.held_out.rate


def chosen_point(points: Sequence[Point], baseline: float) -> Point | None:
    """The calibration sweep's chosen point (:func:`recommend`), when some strength mentions the concept more
    often than the unsteered answers do (a label's word the model says anyway is not steering)."""
    if not any(p.rate > baseline for p in points):
        return None
    strength = recommend(points)
    return next((p for p in points if p.strength == strength), None)


@dataclass
class Screen:
    """A screen's findings: every labelled feature's estimate, and the sampled sweeps of those it picked."""

    estimates: dict[int, float]
    swept: list[Screened]
    prompts: int
    tokens: int
    seed: int

    @property
    def steers(self) -> list[Screened]:
        """The swept features with a recommended strength."""
        return [s for s in self.swept if s.recommended is not None]


def word_tokens(engine: Engine, words: Sequence[str]) -> list[int]:
    """The tokens that start a mention of one of ``words``: each word's forms (``word_forms``), bare and after a space,
    lower case and capitalised, where that form is one token. A form the tokenizer splits is left out, since
    its first piece starts many other words too (" sport" is one token, "sport" starts with "s")."""
    ids = set()
    for word in words:
        for form in word_forms(word):
            for cased in (form, form.capitalize()):
                for text in (cased, " " + cased):
                    got = engine.tokenize(TextPrompt(text, add_special_tokens=False))
                    if len(got) == 1:
                        ids.add(int(got[0]))
    return sorted(ids)


def contexts(measure: Measure, count: int) -> list[tuple[int, ...]]:
    """The first ``count`` unsteered answers after their chat-templated prompts, as token ids, and where each
    answer starts (empty answers say nothing and are left out)."""
    out = []
    for prompt, answer in zip(measure.prompts[:count], measure.plain[:count]):
        if not answer:
            continue
        head = measure.engine.tokenize(ChatPrompt([{"role": "user", "content": prompt}]))
        body = measure.engine.tokenize(TextPrompt(answer, add_special_tokens=False))
        out.append((len(head), *head, *body))
    if not out:
        raise ValueError("The unsteered answers are empty: nothing to read steering against.")
    return out


def mention_chance(watched: Sequence[Sequence[float]]) -> float:
    """An answer's chance of mentioning the concept, from the probability at each position that the token there
    starts a mention: ``1 - prod(1 - p)``, averaged over the answers."""
    chances = []
    for row in watched:
        miss = 1.0
        for p in row:
            miss *= 1.0 - p
        chances.append(1.0 - miss)
    return sum(chances) / len(chances) if chances else 0.0


def estimate(engine: Engine, read: Sequence[tuple[int, ...]], sae_id: str,
             features: Sequence[tuple[int, Sequence[str]]], strengths: Sequence[float] = ESTIMATE_STRENGTHS,
             on_progress: Callable[[int, int], None] | None = None, batch: int = 256) -> dict[int, float]:
    """Per feature (with its concept words): how much steering it raises the estimated mention chance over the
    unsteered model's (the best over ``strengths``), from teacher-forced reads of the unsteered answers
    (``read``: each answer's start, then its ids) steered by the feature alone (``Engine.forced``)."""
    tokens = {f: tuple(word_tokens(engine, words)) for f, words in features}
    plain = engine.forced([Forced(tuple(c[1:]), c[0], None, tokens[f]) for f, _ in features for c in read])
    unsteered = {f: mention_chance(plain[k * len(read):(k + 1) * len(read)]) for k, (f, _) in enumerate(features)}
    cases = [(f, s) for f, _ in features for s in strengths]
    best: dict[int, float] = {}
    per = max(1, batch // len(read))
    for at in range(0, len(cases), per):
        chunk = cases[at:at + per]
        reads = [Forced(tuple(c[1:]), c[0], RequestSteering("estimate", {sae_id: {f: s}}), tokens[f])
                 for f, s in chunk for c in read]
        watched = engine.forced(reads)
        for k, (f, _) in enumerate(chunk):
            best[f] = max(best.get(f, 0.0), mention_chance(watched[k * len(read):(k + 1) * len(read)]))
        if on_progress is not None:
            on_progress(min(at + per, len(cases)), len(cases))
    return {f: chance - unsteered[f] for f, chance in best.items()}


def concept_words(labels: Mapping[int, str]) -> dict[int, tuple[str, ...]]:
    """The labelled features a screen can measure (their labels have words: :func:`label_words`), with the words."""
    return {f: w for f, label in sorted(labels.items()) if (w := label_words(label))}


def estimates(measure: Measure, sae_id: str, labels: Mapping[int, str], context_prompts: int = 2,
              on_progress: Callable[[str, int, int], None] | None = None) -> dict[int, float]:
    """The screen's first stage alone: every labelled feature with concept words estimated (:func:`estimate`) on
    the first ``context_prompts`` unsteered answers of ``measure`` (a long run keeps them, ``bench/remeasure.py``)."""
    words = concept_words(labels)
    if not words:
        return {}
    progress = (lambda done, total: on_progress("estimate", done, total)) if on_progress else None
    return estimate(measure.engine, contexts(measure, context_prompts), sae_id, list(words.items()),
                    on_progress=progress)


def screen(measure: Measure, held: Measuring, sae_id: str, labels: dict[int, str],
           context_prompts: int = 2, floor: float = FLOOR, limit: int | None = None,
           strengths: Sequence[float] = SWEEP_STRENGTHS, skip: Collection[int] = (),
           on_progress: Callable[[str, int, int], None] | None = None,
           on_swept: Callable[[list[Screened]], None] | None = None, prompt_set: str = PROMPT_SET,
           estimated: Mapping[int, float] | None = None) -> Screen:
    """Every feature of ``labels`` with concept words estimated; those whose estimate rises by ``floor`` or
    more, but for ``skip`` (the ``limit`` highest, if given), swept with ``measure`` (the calibration prompts;
    its engine has ``sae_id`` attached), highest estimate first, each chosen strength verified with ``held``
    (the held-out prompts); ``on_swept`` gets each batch of swept features as it is done (so a long screen
    can keep what it found). ``estimated``: the estimates of an earlier screen with the same measure (a resumed
    run), used instead of estimating again."""
    words = concept_words(labels)
    if estimated is not None:
        rises = {f: estimated[f] for f in words if f in estimated}
    else:
        rises = estimates(measure, sae_id, labels, context_prompts, on_progress)
    chosen = sorted((f for f in rises if rises[f] >= floor and f not in skip), key=lambda f: -rises[f])[:limit]
    swept = []
    per = max(1, ROWS_PER_BATCH // (len(measure.prompts) * len(strengths)))
    for at in range(0, len(chosen), per):
        batch = chosen[at:at + per]
        found = swept_points(measure, [partial(Case.feature, sae_id, f, words=words[f]) for f in batch], strengths)
        picked = {f: p for f, mine in zip(batch, found)
                  if (p := chosen_point(mine, concept_rate(measure.plain, words[f]))) is not None}
        verified = verify(held, [(Case.feature(sae_id, f, p.strength, words[f]), p.rate) for f, p in picked.items()],
                          prompt_set, sweeps=[mine for f, mine in zip(batch, found) if f in picked])
        held_out = dict(zip(picked, verified, strict=True))
        done = [Screened(f, labels[f], rises[f], concept_rate(measure.plain, words[f]), mine,
                         held_out.get(f) or unverified(prompt_set, measure.weights)) for f, mine in zip(batch, found)]
        swept += done
        if on_swept is not None:
            on_swept(done)
        if on_progress is not None:
            on_progress("sweep", min(at + per, len(chosen)), len(chosen))
    return Screen(rises, swept, len(measure.prompts), measure.tokens, measure.seed)


def screen_sae(service: Any, engine: Engine, sae_id: str, labels: dict[int, str], *, prompts: int = 16,
               held_out: int = len(HELD_OUT_PROMPTS), tokens: int = 24, seed: int = SEED, limit: int | None = None,
               floor: float = FLOOR, layer: int | None = None, skip: Collection[int] = (),
               on_progress: Callable[[str, int, int], None] | None = None,
               on_swept: Callable[[list[Screened]], None] | None = None) -> Screen:
    """A screen on a loaded engine, with ``sae_id`` attached for it only, as ``sweep_feature`` does."""
    from millm.steering.session import chat_steering

    check_sizes(prompts, tokens, held_out)
    check_engine(engine)
    target = engine.steering_target()
    assert target is not None
    with chat_steering(service, target, sae_id, layer, {}, None):
        measure = Measure(engine, NEUTRAL_PROMPTS[:prompts], seed, tokens)
        held = Measure(engine, HELD_OUT_PROMPTS[:held_out], seed, tokens)
        return screen(measure, held, sae_id, labels, floor=floor, limit=limit, skip=skip, on_progress=on_progress,
                      on_swept=on_swept)
