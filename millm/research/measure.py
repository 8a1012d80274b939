"""Measuring steered answers on the engine's request path: sampled as a chat request is, scored by the scoring
path.

- answers: one seeded answer per neutral prompt (``NEUTRAL_PROMPTS``, the shipped calibration set; a held-out
  measure answers ``HELD_OUT_PROMPTS``) and case, sampled as chat requests
  (``millm.research.answers``: prompt ``i`` seeded ``seed + i`` in every case, so two strengths differ by their
  steering, not their draw); every case's answers are one engine job, decoded as batched rows;
- concept rate: the share of answers that mention a concept word (``millm.research.words.mentions``) and are
  not degenerate;
- fluency: the steered answers' mean token log-probability under the unsteered model (the engine's scoring
  path: teacher forced, every SAE suppressed) with no prompt before them (an empty user turn), minus the
  unsteered answers' own scored the same way (nats/token); inside the bound when it is >= ``-FLUENCY_BOUND``.
  Scored after their prompt instead, a fluent answer on another topic than the question would count as lost
  fluency: that is relevance's to say;
- relevance: per token, an answer's log-probability after its prompt minus without it (how much of it still
  answers the question), the steered answers' minus the unsteered answers';
- degeneration: log-probabilities reward repetition ("dog dog dog" is likely text), so an answer whose share
  of distinct word bigrams is under half the unsteered answers' mean is degenerate: it never counts as a
  mention, and ``degenerate`` reports the share of them;
- ``prompted``: the fluency of earlier releases (scored after the prompt), for continuity.

An answer here is byte for byte what ``/v1/chat/completions`` returns for the same message, seed, sampling
fields (``millm.research.answers.SAMPLING``: temperature, top_p and repetition_penalty; ``max_tokens``) and
steering.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from millm.engine.base import Engine, numerics
from millm.engine.params import ChatPrompt, TextPrompt, TokenPrompt
from millm.engine.scoring import ScoreRequest, ScoreRow, ScoringParams
from millm.errors import InvalidParameter
from millm.research.answers import UNSTEERED, sample_answers
from millm.research.prompt_sets import prompt_set
from millm.research.words import concept_rate
from millm.steering.core import RequestSteering
from millm.steering.scope import ALL, Scope

NEUTRAL_PROMPTS = prompt_set().calibration  # the shipped calibration prompts (millm.research.prompt_sets)
HELD_OUT_PROMPTS = prompt_set().held_out
FLUENCY_BOUND = 1.5  # nats/token the steered answers may lose against the unsteered answers' own log-prob
TARGET_RATE = 0.6  # share of answers that should mention the concept
SEED = 0
MAX_NEW_TOKENS = 48
SCORE_BATCH = 16  # answers scored per forward


@dataclass(frozen=True)
class Point:
    """One strength of a sweep."""

    strength: float
    rate: float  # share of answers that mention the concept and are not degenerate
    logprob: float  # the answers' mean token log-prob under the unsteered model, with no prompt before them
    fluency: float  # logprob minus the unsteered answers' own (nats/token; 0 unsteered)
    inside: bool  # fluency >= -FLUENCY_BOUND
    example: str = ""  # the first answer
    relevance: float = 0.0  # (prompted - unprompted log-prob per token) minus the unsteered answers'
    degenerate: float = 0.0  # share of answers whose distinct-bigram share is under half the unsteered mean
    prompted: float = 0.0  # the fluency scored after the prompt (the earlier measure)


def bigram_share(text: str) -> float:
    """The share of an answer's word bigrams that are distinct (1.0 for fewer than two words)."""
    words = text.lower().split()
    pairs = list(zip(words, words[1:]))
    return len(set(pairs)) / len(pairs) if pairs else 1.0


@dataclass(frozen=True)
class Scored:
    """A set of answers' mean log-probability per token with and without their prompts, and their mean
    distinct-bigram share."""

    prompted: float
    unprompted: float
    bigrams: float


@dataclass(frozen=True)
class Case:
    """What steers one set of answers (per SAE, feature -> strength), the words that count as its concept,
    and the strength its point reports (a feature's strength, or a dial's λ)."""

    strength: float
    values: Mapping[str, Mapping[int, float]]
    words: tuple[str, ...]

    @classmethod
    def feature(cls, sae_id: str, feature: int, strength: float, words: Sequence[str]) -> Case:
        """One feature of one SAE alone at ``strength``."""
        return cls(strength, {sae_id: {feature: strength}} if strength else {}, tuple(words))

    @property
    def steering(self) -> RequestSteering:
        return RequestSteering("measure", {sae: dict(v) for sae, v in self.values.items()})


def check_engine(engine: Engine) -> None:
    """Measures sample steered answers and score them: an engine that cannot do both is refused, naming it."""
    caps = engine.capabilities
    if not (caps.steers and caps.scores):
        raise InvalidParameter(f"'{engine.model_id}' runs on {engine.engine_name}, which cannot both steer and score; "
                               "sweeps and screens need a transformers model.", param="model")


class Measure:
    """Answers to the first ``prompts`` neutral prompts under each case's steering alone, on ``engine`` (its
    steering must hold the SAEs the cases name), measured against the unsteered answers (sampled and scored
    once: beside the first cases measured, in their job, or alone when asked for first). The steering applies
    where ``scope`` says (every case alike; the unsteered answers have none to apply)."""

    def __init__(self, engine: Engine, prompts: Sequence[str] = NEUTRAL_PROMPTS, seed: int = SEED,
                 tokens: int = MAX_NEW_TOKENS, bound: float = FLUENCY_BOUND, scope: Scope = ALL) -> None:
        check_engine(engine)
        self.engine, self.scope = engine, scope
        self.prompts, self.seed, self.tokens, self.bound = tuple(prompts), seed, tokens, bound
        self.weights = numerics(engine)
        self._plain: tuple[list[str], Scored] | None = None

    @property
    def plain(self) -> list[str]:
        """The unsteered answers."""
        return self._unsteered()[0]

    @property
    def plain_logprob(self) -> float:
        """The unsteered answers' mean token log-probability with no prompt before them."""
        return self._unsteered()[1].unprompted

    @property
    def plain_scored(self) -> Scored:
        return self._unsteered()[1]

    def _unsteered(self) -> tuple[list[str], Scored]:
        if self._plain is None:
            self.points([])
        assert self._plain is not None
        return self._plain

    def answers(self, steerings: Sequence[RequestSteering]) -> list[list[str]]:
        """Each steering's answers to every prompt: one engine job of plans, decoded as batched rows."""
        return sample_answers(self.engine, self.prompts, self.seed, self.tokens, steerings, scope=self.scope)

    def logprobs(self, answers: Sequence[str], prompted: bool = True) -> list[tuple[float, int]]:
        """Per answer (to the prompt of its position, cycling): its tokens' summed log-probability after its
        chat-templated prompt (``prompted`` false: after an empty user turn), unsteered, and how many tokens it
        has; through the engine's scoring path."""
        rows, spans = [], []
        for k, answer in enumerate(answers):
            prompt = self.prompts[k % len(self.prompts)] if prompted else ""
            head = self.engine.tokenize(ChatPrompt([{"role": "user", "content": prompt}]))
            body = self.engine.tokenize(TextPrompt(answer, add_special_tokens=False)) if answer else []
            rows.append(ScoreRow(TokenPrompt(tuple(head + body), f"answers[{k}]"), ECHO, echo_from=len(head)))
            spans.append((len(head), len(body)))
        results = self.engine.score(ScoreRequest(rows, batch_size=SCORE_BATCH))
        out = []
        for result, (start, count) in zip(results, spans):
            assert result.echo is not None
            out.append((sum(t.logprob or 0.0 for t in result.echo[start:]), count))
        return out

    def points(self, cases: Sequence[Case]) -> list[Point]:
        """Each case measured: its answers sampled beside every other case's (one job), then scored by the
        unsteered model. A case that steers nothing is the unsteered answers themselves."""
        steered = [c for c in cases if any(c.values.values())]
        first = self._plain is None  # the unsteered answers ride in the first job
        steerings = [UNSTEERED] * first + [c.steering for c in steered]
        answered = self.answers(steerings) if steerings else []
        flat = [a for answers in answered for a in answers]
        both = self.logprobs(flat, True) if steerings else []
        bare = self.logprobs(flat, False) if steerings else []
        per, measured = len(self.prompts), {}
        scores = [Scored(mean(both[n * per:(n + 1) * per]), mean(bare[n * per:(n + 1) * per]),
                         sum(bigram_share(a) for a in answers) / max(1, len(answers)))
                  for n, answers in enumerate(answered)]
        if first:
            self._plain = (answered[0], scores[0])
            answered, scores = answered[1:], scores[1:]
        for case, answers, score in zip(steered, answered, scores):
            measured[id(case)] = self._point(case, answers, score)
        return [measured[id(c)] if id(c) in measured else self._point(c, self.plain, self.plain_scored)
                for c in cases]

    def answers_with(self, system: str) -> list[str]:
        """Unsteered answers to the prompts after a ``system`` message (a prompting baseline)."""
        return sample_answers(self.engine, self.prompts, self.seed, self.tokens, (UNSTEERED,), system)[0]

    def judge(self, answers: Sequence[str], words: Sequence[str], strength: float = 0.0) -> Point:
        """Answers made some other way (a prompting baseline: the same prompts after a system message) measured
        as a case's are, against the unsteered answers."""
        both, bare = self.logprobs(answers, True), self.logprobs(answers, False)
        score = Scored(mean(both), mean(bare), sum(bigram_share(a) for a in answers) / max(1, len(answers)))
        return self._point(Case(strength, {}, tuple(words)), answers, score)

    def at(self, sae_id: str, feature: int, strength: float, words: Sequence[str]) -> Point:
        """``feature`` alone steered at ``strength`` on ``sae_id``."""
        return self.points([Case.feature(sae_id, feature, strength, tuple(words))])[0]

    def _point(self, case: Case, answers: Sequence[str], score: Scored) -> Point:
        plain = self.plain_scored
        fluency = score.unprompted - plain.unprompted
        floor = plain.bigrams / 2
        fluent = [a for a in answers if bigram_share(a) >= floor]
        rate = concept_rate(fluent, case.words) * len(fluent) / max(1, len(answers))
        relevance = (score.prompted - score.unprompted) - (plain.prompted - plain.unprompted)
        return Point(case.strength, rate, score.unprompted, fluency, fluency >= -self.bound,
                     answers[0] if answers else "", relevance, 1 - len(fluent) / max(1, len(answers)),
                     score.prompted - plain.prompted)


ECHO = ScoringParams(allowed=None, temperature=0.0, top_n=0, report=True, echo=True, next_token=False)


def mean(scored: Sequence[tuple[float, int]]) -> float:
    """Mean log-probability per token over scored answers ((sum, tokens) each)."""
    return sum(t for t, _ in scored) / max(1, sum(c for _, c in scored))
