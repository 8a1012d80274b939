"""Measuring steered answers on the engine's request path: sampled as a chat request is, scored by the scoring
path.

- answers: one seeded answer per neutral prompt (``NEUTRAL_PROMPTS``) and case, sampled as chat requests
  (``millm.research.answers``: prompt ``i`` seeded ``seed + i`` in every case, so two strengths differ by their
  steering, not their draw); every case's answers are one engine job, decoded as batched rows;
- concept rate: the share of answers that mention a concept word (``millm.research.words.mentions``);
- fluency: the steered answers' mean token log-probability under the unsteered model (the engine's scoring
  path: teacher forced, every SAE suppressed) after their prompt, minus the unsteered answers' own
  (nats/token); inside the bound when it is >= ``-FLUENCY_BOUND``.

An answer here is byte for byte what ``/v1/chat/completions`` returns for the same message, seed, sampling
fields (``millm.research.answers.SAMPLING``: temperature, top_p and repetition_penalty; ``max_tokens``) and
steering.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from millm.engine.base import Engine
from millm.engine.params import ChatPrompt, TextPrompt, TokenPrompt
from millm.engine.scoring import ScoreRequest, ScoreRow, ScoringParams
from millm.errors import InvalidParameter
from millm.research.answers import UNSTEERED, sample_answers
from millm.research.words import concept_rate
from millm.steering.core import Override

NEUTRAL_PROMPTS = (
    "Tell me about your day.", "What should I do this weekend?", "Write a short paragraph about anything you like.",
    "Give me some advice for tomorrow.", "Tell me a short story.", "What is your favourite thing?",
    "What did you learn today?", "Write a few sentences about life.", "What makes a good morning?",
    "Tell me something interesting.", "How do you relax?", "What would you do with a free afternoon?",
    "Write a short note to a friend.", "What are you thinking about?", "Describe an ordinary day.",
    "Tell me about a memory.", "What is something you like?", "Write about something that makes you smile.",
    "Plan a simple day for me.", "Say something nice.",
)
FLUENCY_BOUND = 1.5  # nats/token the steered answers may lose against the unsteered answers' own log-prob
TARGET_RATE = 0.6  # share of answers that should mention the concept
SEED = 0
MAX_NEW_TOKENS = 48
SCORE_BATCH = 16  # answers scored per forward


@dataclass(frozen=True)
class Point:
    """One strength of a sweep."""

    strength: float
    rate: float  # share of answers that mention the concept
    logprob: float  # the answers' mean token log-prob under the unsteered model
    fluency: float  # logprob minus the unsteered answers' own (nats/token; 0 unsteered)
    inside: bool  # fluency >= -FLUENCY_BOUND
    example: str = ""  # the first answer


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
    def override(self) -> Override:
        return Override("measure", {sae: dict(v) for sae, v in self.values.items()})


def check_engine(engine: Engine) -> None:
    """Measures sample steered answers and score them: an engine that cannot do both is refused, naming it."""
    caps = engine.capabilities
    if not (caps.steers and caps.scores):
        raise InvalidParameter(f"'{engine.model_id}' runs on {engine.engine_name}, which cannot both steer and score; "
                               "sweeps and screens need a transformers model.", param="model")


class Measure:
    """Answers to the first ``prompts`` neutral prompts under each case's steering alone, on ``engine`` (its
    steering must hold the SAEs the cases name), measured against the unsteered answers (sampled and scored
    once: beside the first cases measured, in their job, or alone when asked for first)."""

    def __init__(self, engine: Engine, prompts: Sequence[str] = NEUTRAL_PROMPTS, seed: int = SEED,
                 tokens: int = MAX_NEW_TOKENS, bound: float = FLUENCY_BOUND) -> None:
        check_engine(engine)
        self.engine = engine
        self.prompts, self.seed, self.tokens, self.bound = tuple(prompts), seed, tokens, bound
        self._plain: tuple[list[str], float] | None = None

    @property
    def plain(self) -> list[str]:
        """The unsteered answers."""
        return self._unsteered()[0]

    @property
    def plain_logprob(self) -> float:
        """The unsteered answers' mean token log-probability after their prompts."""
        return self._unsteered()[1]

    def _unsteered(self) -> tuple[list[str], float]:
        if self._plain is None:
            self.points([])
        assert self._plain is not None
        return self._plain

    def answers(self, overrides: Sequence[Override]) -> list[list[str]]:
        """Each override's answers to every prompt: one engine job of plans, decoded as batched rows."""
        return sample_answers(self.engine, self.prompts, self.seed, self.tokens, overrides)

    def logprobs(self, answers: Sequence[str]) -> list[tuple[float, int]]:
        """Per answer (to the prompt of its position, cycling): its tokens' summed log-probability after its
        chat-templated prompt, unsteered, and how many tokens it has; through the engine's scoring path."""
        rows, spans = [], []
        for k, answer in enumerate(answers):
            prompt = self.prompts[k % len(self.prompts)]
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
        overrides = [UNSTEERED] * first + [c.override for c in steered]
        answered = self.answers(overrides) if overrides else []
        scored = self.logprobs([a for answers in answered for a in answers]) if overrides else []
        per, measured = len(self.prompts), {}
        if first:
            self._plain = (answered[0], mean(scored[:per]))
            answered, scored = answered[1:], scored[per:]
        for n, (case, answers) in enumerate(zip(steered, answered)):
            measured[id(case)] = self._point(case, answers, mean(scored[n * per:(n + 1) * per]))
        return [measured[id(c)] if id(c) in measured else self._point(c, self.plain, self.plain_logprob)
                for c in cases]

    def at(self, sae_id: str, feature: int, strength: float, words: Sequence[str]) -> Point:
        """``feature`` alone steered at ``strength`` on ``sae_id``."""
        return self.points([Case.feature(sae_id, feature, strength, tuple(words))])[0]

    def _point(self, case: Case, answers: Sequence[str], logprob: float) -> Point:
        fluency = logprob - self.plain_logprob
        return Point(case.strength, concept_rate(answers, case.words), logprob, fluency, fluency >= -self.bound,
                     answers[0] if answers else "")


ECHO = ScoringParams(allowed=None, temperature=0.0, top_n=0, report=True, echo=True, next_token=False)


def mean(scored: Sequence[tuple[float, int]]) -> float:
    """Mean log-probability per token over scored answers ((sum, tokens) each)."""
    return sum(t for t, _ in scored) / max(1, sum(c for _, c in scored))
