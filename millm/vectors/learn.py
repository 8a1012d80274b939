"""Learning a steering vector from examples, on the engine's paths: the examples are the loaded model's own
answers (sampled as chat requests, seeded) or texts from files, read unsteered at each asked layer's output,
and a layer's direction is their difference in means (AxBench's DiffMean) or the first principal direction of
their paired differences (repeng's PCA), unit norm, signed so the positives project higher.

Generated negatives are, by default, the model's answers to the same requests about other topics (as
AxBench contrasts a concept with other concepts): what the positives share beyond them is the concept, not
"being asked to write about something". ``neutral`` negatives (answers to everyday prompts) are the other
choice.

Generated examples are kept by what they say: a positive that never names the concept (a word of it, singular or
plural, as the sweep's concept rate counts it) does not show it, and a negative that names it is not a negative.
On the bundled model about a quarter of the answers about "food" never say the word (they are about bread and
restaurants); a direction learned without them steers answers that name the concept more often
(docs/vectors.md#ten-concepts)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

import torch

from millm.engine.base import Engine, StepControl
from millm.engine.params import ChatPrompt, Forced, TextPrompt
from millm.errors import InvalidParameter, MillmError
from millm.research.answers import sample_answers
from millm.research.measure import NEUTRAL_PROMPTS
from millm.research.words import mentions
from millm.sae.files import read_capped
from millm.sae.vector_sets import METHODS, POSITIONS, VectorSet, parse_layer, set_name

CONTEXT = "Tell me something."  # the user turn every example is read after, positive and negative alike
CONCEPT_PROMPTS = ("Write a few sentences about {}.", "Tell me about {}.", "Describe {} in a short paragraph.",
                   "What do you think about {}?", "Write a short story about {}.", "Explain {} to a child.",
                   "Give me some facts about {}.", "Write a short note that mentions {}.")
EXAMPLE_TOKENS = 48
NEGATIVES = ("topics", "neutral")
OTHER_TOPICS = ("history", "mathematics", "computers", "music", "the ocean", "friendship", "space", "cooking",
                "medicine", "painting", "trains", "mountains")
# the default layer's share of the model's depth: 14 of the bundled model's 30 layers, where bench/steer_methods.py's
# DiffMean vectors reach the target for more of its ten concepts than at layer 10 (docs/vectors.md)
DEFAULT_DEPTH = 0.47
EXAMPLES_MAX_BYTES = 16 * 2**20  # an example file (the learn route's body holds at most 1024 texts of 8192 a side)
# the engine work is done in slices, each one engine job of bounded size, so a request waiting for the engine, or
# an unload, gets its turn between two (and the job can be stopped there). A writing slice's answers times their
# tokens are at most SLICE_TOKENS of its device, its answers at most SLICE_ANSWERS: on a CPU a decode step's fixed
# cost is about that of 18 rows, so fewer rows buy little latency for much throughput (slices of 8 rows took 2.4
# times as long as one batch of 64, bench/learn_swap.py); on a GPU rows batch nearly free. A reading slice's texts
# are at most READ_SLICE (a multiple of the engine's read batch, so sliced reads are the reads one job makes).
# Fixed by the request and the device, never by timing: a seeded learn writes the same examples on every run.
SLICE_TOKENS, SLICE_ANSWERS, READ_SLICE = {"cpu": 1024, "cuda": 4096}, {"cpu": 32, "cuda": 64}, 64
T = TypeVar("T")


class Runner(Protocol):
    """Runs one slice of engine work and returns its result: on this thread (``inline``: the CLI, benches), or
    as an engine job of the server's worker."""

    def __call__(self, work: Callable[[], T], /) -> T: ...


def inline(work: Callable[[], T]) -> T:
    return work()


def stopped(control: StepControl | None) -> None:
    """Raise why ``control`` was stopped (between two slices: the job ends there)."""
    if control is not None and control.cancel.is_set():
        raise control.reason or MillmError("The job was cancelled.")


def answers_per_slice(tokens: int, device: str = "cpu") -> int:
    """How many answers of ``tokens`` tokens one writing slice samples on ``device``."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return max(1, min(SLICE_ANSWERS[kind], SLICE_TOKENS[kind] // tokens))


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


def generated(engine: Engine, concepts: Sequence[str], count: int, seed: int, tokens: int = EXAMPLE_TOKENS,
              negatives: str = "topics", finished: Callable[[int], None] = lambda _: None, *,
              run: Runner = inline, control: StepControl | None = None) -> Examples:
    """``count`` answers the model writes when asked about ``concepts`` (round robin over them and
    ``CONCEPT_PROMPTS``) and ``count`` negatives: the same requests about ``OTHER_TOPICS`` (those that name no
    concept word) for ``topics``, or answers to ``NEUTRAL_PROMPTS`` for ``neutral``; unsteered, prompt ``i``
    seeded ``seed + i``, in slices of ``answers_per_slice`` answers (each one ``run``, checking ``control``
    between decode steps and between slices), then kept by what they say (:func:`by_mention`).
    ``finished(n)`` hears each answer end (``n`` of ``2 * count`` so far)."""
    check_negatives(negatives)
    prompts = example_prompts(concepts, count, negatives)
    size = answers_per_slice(tokens, str(getattr(engine, "device", "cpu")))  # the scripted engine has none
    answers: list[str] = []
    for start in range(0, len(prompts), size):
        answers += run(partial(_write, engine, prompts[start:start + size], seed + start, tokens,
                               partial(_after, finished, start), control))
        stopped(control)
    return by_mention(Examples(answers[:count], answers[count:]), concepts)


def example_prompts(concepts: Sequence[str], count: int, negatives: str) -> list[str]:
    """The ``count`` requests for positives, then the ``count`` for negatives, that ``generated`` samples."""
    asked = [CONCEPT_PROMPTS[i % len(CONCEPT_PROMPTS)].format(concepts[i % len(concepts)]) for i in range(count)]
    if negatives == "neutral":
        return asked + [NEUTRAL_PROMPTS[i % len(NEUTRAL_PROMPTS)] for i in range(count)]
    topics = other_topics(concepts)
    return asked + [CONCEPT_PROMPTS[i % len(CONCEPT_PROMPTS)].format(topics[i % len(topics)]) for i in range(count)]


def _write(engine: Engine, prompts: Sequence[str], seed: int, tokens: int, finished: Callable[[int], None],
           control: StepControl | None) -> list[str]:
    """One writing slice: the answers to ``prompts``, the first seeded ``seed``."""
    [answers] = sample_answers(engine, prompts, seed, tokens, finished=finished, control=control)
    return answers


def _after(finished: Callable[[int], None], before: int, n: int) -> None:
    finished(before + n)


def by_mention(examples: Examples, concepts: Sequence[str]) -> Examples:
    """The positives that name a concept and the negatives that name none (``mentions``); a side left with
    nothing is a 400 naming the concepts."""
    kept = Examples([t for t in examples.positive if mentions(t, concepts)],
                    [t for t in examples.negative if not mentions(t, concepts)])
    if not kept.positive:
        raise InvalidParameter(f"None of the {len(examples.positive)} answers about {', '.join(concepts)} names it: "
                               "there is no positive example to learn from (give example texts of both sides, or "
                               "more examples).", param="concepts")
    if not kept.negative:
        raise InvalidParameter(f"Every negative answer names {', '.join(concepts)}: there is no negative example to "
                               "learn from.", param="concepts")
    return kept


def other_topics(concepts: Sequence[str]) -> list[str]:
    """``OTHER_TOPICS`` less any that shares a word with a concept (a "music" concept is not contrasted with
    music)."""
    words = {w for c in concepts for w in c.lower().split()}
    return [t for t in OTHER_TOPICS if not words & set(t.split())]


def check_negatives(negatives: str) -> None:
    if negatives not in NEGATIVES:
        raise InvalidParameter(f"'negatives' must be one of {', '.join(NEGATIVES)}, got {negatives!r}.",
                               param="negatives")


def default_layer(n_layers: int) -> int:
    """The layer ``learn`` uses when none is asked: ``DEFAULT_DEPTH`` of the model's depth."""
    return round(n_layers * DEFAULT_DEPTH)


def parse_layers(specs: Sequence[str | int], n_layers: int) -> list[int]:
    """The layers ``specs`` name, sorted and once each: ``10``, ``8-12`` (inclusive) or ``8,10,12``, as many as
    given; each must be a layer of the model. A bad spec is a 400 naming ``layer``."""
    layers: set[int] = set()
    for spec in specs:
        for part in str(spec).split(","):
            low, dash, high = part.strip().partition("-")
            first, last = parse_layer(low.strip()), parse_layer(high.strip() if dash else low.strip())
            if first is None or last is None:  # ASCII digits only: int() would take '٣', '５', '+3' and '1_0'
                raise InvalidParameter(f"'layer' takes a layer, a range like 8-12 or a list like 8,10; got "
                                       f"{spec!r}.", param="layer")
            if first > last:
                raise InvalidParameter(f"'layer' range {part.strip()!r} runs backwards.", param="layer")
            if first < 0 or last >= n_layers:
                raise InvalidParameter(f"'layer' must be between 0 and {n_layers - 1}, got {part.strip()!r}.",
                                       param="layer")
            layers.update(range(first, last + 1))
    if not layers:
        raise InvalidParameter("'layer' names no layer.", param="layer")
    return sorted(layers)


def read_file(path: Path, param: str, shown: str | Path | None = None) -> list[str]:
    """Example texts from a file (as :func:`parse_examples` reads them). Only a regular file of at most
    ``EXAMPLES_MAX_BYTES`` is read (as imports are: ``read_capped``), so ``/dev/zero`` or a FIFO is
    refused at once; a problem names the file as ``shown`` (the path as the user gave it; default ``path``)."""
    shown = path if shown is None else shown
    return parse_examples(read_capped(path, str(shown), EXAMPLES_MAX_BYTES, param), str(shown), param)


def parse_examples(data: bytes, shown: str, param: str) -> list[str]:
    """Example texts: one per line, or JSONL lines of chat messages (``{"messages": [...]}`` or a list) whose
    last message is the answer read. A malformed file is a 400 naming it (``shown``) and the line."""
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise InvalidParameter(f"{shown}: cannot be read as UTF-8 text (byte {exc.start} is not UTF-8).",
                               param=param) from None
    texts = [text for number, line in enumerate(lines, 1) if line.strip()
             for text in [_example(line, f"{shown}, line {number}", param)]]
    if not texts:
        raise InvalidParameter(f"{shown}: holds no example.", param=param)
    return texts


def _example(line: str, where: str, param: str) -> str:
    """One line's example: the line itself, or a JSON line's last chat message."""
    if line.lstrip()[:1] not in "[{":
        return line
    try:
        value = json.loads(line)
        messages = value["messages"] if isinstance(value, dict) else value
        text = messages[-1]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise InvalidParameter(f"{where}: a JSON line must be chat messages whose last one has a 'content' "
                               "string.", param=param) from None
    if not isinstance(text, str):
        raise InvalidParameter(f"{where}: the last message's 'content' must be a string.", param=param)
    return text


def check_concepts(concepts: Sequence[str], param: str = "concepts") -> list[str]:
    """The concept words, none blank (a blank word asks the model to write about nothing)."""
    if not all(c.strip() for c in concepts):
        raise InvalidParameter(f"'{param}' must not hold a blank word.", param=param)
    return list(concepts)


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


def learn(engine: Engine, name: str, layers: Sequence[int], examples: Examples, *, method: str = "diffmean",
          position: str = "mean", source: dict[str, object] | None = None,
          progress: Callable[[str], None] = lambda _: None, run: Runner = inline,
          control: StepControl | None = None) -> list[VectorSet]:
    """One set per layer from ``examples``, each one vector named ``set_name(name, layer, layers)``; the
    examples are read in slices (:func:`sliced_activations`), each one ``run``, ``control`` checked between
    them."""
    check_choices(method, position)
    kept = Examples([t for t in examples.positive if t.strip()], [t for t in examples.negative if t.strip()])
    if not kept.positive or not kept.negative:  # an answer may be empty (the model ended at once)
        raise InvalidParameter("Every positive or every negative example is empty.", param="examples")
    sets = []
    for layer in layers:
        at = f" at layer {layer}" if len(layers) > 1 else ""
        progress(f"reading the positive examples{at}")
        positive = sliced_activations(engine, kept.positive, layer, position, run, control)
        progress(f"reading the negative examples{at}")
        negative = sliced_activations(engine, kept.negative, layer, position, run, control)
        direction = DIRECTIONS[method](positive, negative)
        sets.append(VectorSet((set_name(name, layer, layers),), direction[None, :], layer, engine.model_id, method,
                              position, {"positive": len(kept.positive), "negative": len(kept.negative)},
                              kept.sha256(), dict(source or {})))
    return sets


def sliced_activations(engine: Engine, texts: Sequence[str], layer: int, position: str, run: Runner = inline,
                       control: StepControl | None = None) -> torch.Tensor:
    """:func:`activations` of ``texts`` in slices of ``READ_SLICE``, each one ``run``, ``control`` checked
    between them."""
    parts = []
    for start in range(0, len(texts), READ_SLICE):
        parts.append(run(partial(activations, engine, texts[start:start + READ_SLICE], layer, position)))
        stopped(control)
    return torch.cat(parts)
