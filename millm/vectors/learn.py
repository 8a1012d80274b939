"""Learning a steering vector from examples, on the engine's paths: the examples are the loaded model's own
answers (sampled as chat requests, seeded) or texts from files, read unsteered at one layer's output, and the
direction is their difference in means (AxBench's DiffMean) or the first principal direction of their paired
differences (repeng's PCA), unit norm, signed so the positives project higher."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from millm.engine.base import Engine
from millm.engine.params import ChatPrompt, Forced, TextPrompt
from millm.errors import InvalidParameter
from millm.research.answers import sample_answers
from millm.research.measure import NEUTRAL_PROMPTS
from millm.vectors.files import METHODS, POSITIONS, VectorSet

CONTEXT = "Tell me something."  # the user turn every example is read after, positive and negative alike
CONCEPT_PROMPTS = ("Write a few sentences about {}.", "Tell me about {}.", "Describe {} in a short paragraph.",
                   "What do you think about {}?", "Write a short story about {}.", "Explain {} to a child.",
                   "Give me some facts about {}.", "Write a short note that mentions {}.")
EXAMPLE_TOKENS = 48


def diffmean(positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """The unit vector along mean(positive) - mean(negative) (``[n, d]`` and ``[m, d]``)."""
    direction = positive.float().mean(0) - negative.float().mean(0)
    norm = direction.norm()
    if not torch.isfinite(norm) or norm == 0:
        raise InvalidParameter("The positive and negative examples read alike: there is no direction between "
                               "them.", param="examples")
    return direction / norm


def pca(positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """The first right singular vector of the paired differences ``positive[i] - negative[i]`` (uncentred, so
    the direction they share is what it finds), unit norm, signed so the positives project higher on
    average."""
    pairs = min(len(positive), len(negative))
    if pairs < 2:
        raise InvalidParameter("PCA needs at least 2 positive and 2 negative examples.", param="examples")
    diffs = positive[:pairs].float() - negative[:pairs].float()
    direction = torch.linalg.svd(diffs, full_matrices=False).Vh[0]
    if (positive.float() @ direction).mean() < (negative.float() @ direction).mean():
        direction = -direction
    return direction / direction.norm()


DIRECTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"diffmean": diffmean, "pca": pca}


@dataclass(frozen=True)
class Examples:
    """Texts that show the concept and texts that do not, each read as an assistant answer."""

    positive: list[str]
    negative: list[str]

    def sha256(self) -> str:
        return hashlib.sha256(json.dumps([self.positive, self.negative]).encode()).hexdigest()


def generated(engine: Engine, concepts: Sequence[str], count: int, seed: int,
              tokens: int = EXAMPLE_TOKENS) -> Examples:
    """``count`` answers the model writes when asked about ``concepts`` (round robin over them and
    ``CONCEPT_PROMPTS``) and ``count`` it writes to neutral prompts, unsteered, in one engine job."""
    asked = [CONCEPT_PROMPTS[i % len(CONCEPT_PROMPTS)].format(concepts[i % len(concepts)]) for i in range(count)]
    neutral = [NEUTRAL_PROMPTS[i % len(NEUTRAL_PROMPTS)] for i in range(count)]
    [answers] = sample_answers(engine, asked + neutral, seed, tokens)
    return Examples(answers[:count], answers[count:])


def read_file(path: Path, param: str) -> list[str]:
    """Example texts: one per line, or JSONL lines of chat messages (``{"messages": [...]}`` or a list) whose
    last message is the answer read. A malformed file is a 400 naming it and the line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidParameter(f"{path}: cannot be read as UTF-8 text ({exc}).", param=param) from None
    texts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.lstrip()[:1] in "[{":
            try:
                value = json.loads(line)
                messages = value["messages"] if isinstance(value, dict) else value
                text = messages[-1]["content"]
            except (ValueError, KeyError, IndexError, TypeError):
                raise InvalidParameter(f"{path}, line {number}: a JSON line must be chat messages whose last one "
                                       "has a 'content' string.", param=param) from None
            if not isinstance(text, str):
                raise InvalidParameter(f"{path}, line {number}: the last message's 'content' must be a string.",
                                       param=param)
            texts.append(text)
        else:
            texts.append(line)
    if not texts:
        raise InvalidParameter(f"{path}: holds no example.", param=param)
    return texts


def activations(engine: Engine, texts: Sequence[str], layer: int, position: str) -> torch.Tensor:
    """``[len(texts), d_model]``: each text read as the answer to ``CONTEXT`` (its tokens after the templated
    prompt, as a generated answer's are), at ``layer``'s output."""
    context = engine.tokenize(ChatPrompt([{"role": "user", "content": CONTEXT}]))
    reads = []
    for text in texts:
        answer = engine.tokenize(TextPrompt(text, add_special_tokens=False))
        reads.append(Forced(tuple(context + answer), len(context)))
    return engine.residuals(reads, layer, position)


def check_choices(method: str, position: str) -> None:
    """A method and position ``learn`` knows, or a 400 naming the option (before any model work)."""
    if method not in METHODS:
        raise InvalidParameter(f"'method' must be one of {', '.join(METHODS)}, got {method!r}.", param="method")
    if position not in POSITIONS:
        raise InvalidParameter(f"'position' must be one of {', '.join(POSITIONS)}, got {position!r}.",
                               param="position")


def learn(engine: Engine, names: Sequence[str], layer: int, examples: Examples, *, method: str = "diffmean",
          position: str = "mean", source: dict[str, object] | None = None,
          progress: Callable[[str], None] = lambda _: None) -> VectorSet:
    """One vector named ``names[0]`` at ``layer`` from ``examples`` (checked: a method, position and layer the
    engine has)."""
    check_choices(method, position)
    kept = Examples([t for t in examples.positive if t.strip()], [t for t in examples.negative if t.strip()])
    if not kept.positive or not kept.negative:  # an answer may be empty (the model ended at once)
        raise InvalidParameter("Every positive or every negative example is empty.", param="examples")
    progress("reading the positive examples")
    positive = activations(engine, kept.positive, layer, position)
    progress("reading the negative examples")
    negative = activations(engine, kept.negative, layer, position)
    direction = DIRECTIONS[method](positive, negative)
    return VectorSet(tuple(names), direction[None, :], layer, engine.model_id, method, position,
                     {"positive": len(kept.positive), "negative": len(kept.negative)}, kept.sha256(),
                     dict(source or {}))
