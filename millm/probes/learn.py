"""Learning a probe: a direction at one layer from examples, and its operating point cut on held-out ones.

The examples (the model's own answers about a concept, kept by mention, or texts from files: as ``millm vectors
learn`` takes them) are split into train and held-out (a seeded shuffle, a third held out). Each is read as an
assistant answer, unsteered, at ``layer``'s output, position by position. The direction comes from the training
examples' mean residuals: their difference in means (DiffMean, unit norm, centred between the two means) or a
logistic regression (L2-regularised, on standardised inputs, folded back to one weight and bias). Each held-out
example's score is the probe's aggregation of its positions' scores, as served (the answer's positions, read
as the response; a rolling mean's is the highest mean of a full window, so a held-out example shorter than its
window, which would never fire when served, has no score and is left out of the figures). The threshold is
the lowest score at which at most ``target_fpr`` of the held-out negatives score as high (above every negative
when there are too few to spare one); the held-out AUROC, the recall and the realised FPR at it are the evidence
stored beside it."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch

from millm.engine.base import Engine, StepControl
from millm.engine.params import TextPrompt
from millm.errors import InvalidParameter
from millm.probes.probe import DEFAULT_FPR, METHODS, Figures, Probe, check_fpr, identity
from millm.steering.probe import check_aggregation
from millm.steering.watching import aggregate as aggregate_one
from millm.steering.watching import rolling_means
from millm.vectors.learn import READ_SLICE, Examples, Runner, activations, inline, stopped

HELD_OUT = 1 / 3  # the share of each side's examples held out for the operating point
L2 = 1e-2  # the logistic regression's penalty on its (standardised) weights


@dataclass(frozen=True)
class Split:
    train: Examples
    held: Examples


def split(examples: Examples, seed: int) -> Split:
    """Each side shuffled (seeded) and a third of it held out; a side of fewer than 2 non-blank texts is a 400."""
    rng = random.Random(seed)
    parts: list[tuple[list[str], list[str]]] = []
    for side, texts in (("positive", examples.positive), ("negative", examples.negative)):
        kept = [t for t in texts if t.strip()]
        if len(kept) < 2:
            raise InvalidParameter(f"A probe needs at least 2 non-blank {side} examples (one to learn from, one "
                                   f"held out), got {len(kept)}.", param=side)
        rng.shuffle(kept)
        held = max(1, round(len(kept) * HELD_OUT))
        parts.append((kept[held:], kept[:held]))
    (pos_train, pos_held), (neg_train, neg_held) = parts
    return Split(Examples(pos_train, neg_train), Examples(pos_held, neg_held))


def read(engine: Engine, texts: Sequence[str], layer: int, run: Runner = inline,
         control: StepControl | None = None) -> list[torch.Tensor]:
    """Each text's residuals at ``layer``, ``[its answer tokens, d]``, read as an answer, in slices (each ``run``)."""
    lengths = [len(engine.tokenize(TextPrompt(t, add_special_tokens=False))) for t in texts]
    rows: list[torch.Tensor] = []
    for start in range(0, len(texts), READ_SLICE):
        rows.append(run(partial(activations, engine, texts[start:start + READ_SLICE], layer, "all")))
        stopped(control)
    return list(torch.cat(rows).split(lengths)) if rows else []


def diffmean(positive: torch.Tensor, negative: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The unit difference of the means, and the bias that puts 0 halfway between them."""
    high, low = positive.mean(0), negative.mean(0)
    direction = high - low
    norm = direction.norm()
    if not torch.isfinite(norm) or norm == 0:
        raise InvalidParameter("The positive and negative examples read alike: there is no direction between "
                               "them.", param="examples")
    direction = direction / norm
    return direction, float(-direction @ (high + low) / 2)


def logreg(positive: torch.Tensor, negative: torch.Tensor, steps: int = 200) -> tuple[torch.Tensor, float]:
    """An L2-regularised logistic regression (L-BFGS on standardised inputs), as one weight and bias on raw
    residuals: its score is the log-odds."""
    x = torch.cat([positive, negative]).double()
    y = torch.cat([torch.ones(len(positive)), torch.zeros(len(negative))]).double()
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    z = (x - mean) / std
    w = torch.zeros(x.shape[1], dtype=torch.double, requires_grad=True)
    b = torch.zeros((), dtype=torch.double, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        opt.zero_grad()
        value = torch.nn.functional.binary_cross_entropy_with_logits(z @ w + b, y) + L2 * (w @ w)
        value.backward()
        return value

    with torch.enable_grad():
        opt.step(loss)
    weight = (w / std).detach()
    return weight.float(), float(b.detach() - mean @ weight)


TRAINERS = {"diffmean": diffmean, "logreg": logreg}


def aggregate(scores: Sequence[torch.Tensor], aggregation: str, window: int | None = None) -> torch.Tensor:
    """Each text's positions' scores aggregated as served (``max``, ``mean``, ``last``; ``rolling_mean``: the
    highest mean of ``window`` consecutive scores, every text at least ``window`` long: ``long_enough``)."""
    if window is not None:
        scores = [rolling_means(s, window) for s in scores]
    return torch.stack([aggregate_one(s, aggregation) for s in scores])


def long_enough(spans: Sequence[torch.Tensor], texts: Sequence[str], window: int | None,
                side: str) -> tuple[list[torch.Tensor], list[str]]:
    """The held-out examples a rolling mean scores (at least ``window`` tokens: a shorter answer has no full
    window, so it never fires when served and has no score); a side left with none is a 400 naming ``window``."""
    kept = [(s, t) for s, t in zip(spans, texts) if window is None or len(s) >= window]
    if not kept:
        raise InvalidParameter(f"No held-out {side} example is {window} tokens long, the rolling mean's window; "
                               "give a smaller 'window' or longer examples.", param="window")
    return [s for s, _ in kept], [t for _, t in kept]


def auroc(positive: torch.Tensor, negative: torch.Tensor) -> float:
    """The probability that a positive outscores a negative (ties count half)."""
    diff = positive[:, None] - negative[None, :]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())


def operating_point(positive: torch.Tensor, negative: torch.Tensor, target_fpr: float) -> tuple[float, float, float]:
    """``(threshold, recall, realised FPR)``: the lowest threshold at which at most ``target_fpr`` of the
    negatives score at or above it."""
    ranked = negative.float().sort(descending=True).values  # float32: what a served score is compared in
    spare = int(target_fpr * len(ranked))  # negatives allowed at or above the threshold
    threshold = float(torch.nextafter(ranked[spare], torch.tensor(float("inf"))))  # just above the first one not
    cut = torch.tensor(threshold)
    return threshold, float((positive.float() >= cut).double().mean()), float((negative.float() >= cut).double().mean())


def score(weight: torch.Tensor, bias: float, spans: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [s.float() @ weight + bias for s in spans]


def check_options(method: str, aggregation: str, span: str, target_fpr: float, window: int | None = None) -> int | None:
    """Every learning option known (before any model work), or a 400 naming it; the window a rolling mean
    takes (its default when none is given; None for the other aggregations)."""
    if method not in METHODS:
        raise InvalidParameter(f"'method' must be one of {', '.join(METHODS)}, got {method!r}.", param="method")
    _, _, checked = check_aggregation(aggregation, span, window)
    check_fpr(target_fpr)
    return checked


def learn(engine: Engine, name: str, examples: Examples, layer: int, *, method: str = "diffmean",
          aggregation: str = "max", span: str = "response", target_fpr: float = DEFAULT_FPR, seed: int = 0,
          source: dict[str, object] | None = None, run: Runner = inline,
          control: StepControl | None = None, window: int | None = None) -> Probe:
    """A probe learned from ``examples`` at ``layer`` (see the module's docstring)."""
    window = check_options(method, aggregation, span, target_fpr, window)
    model = identity(engine)
    if not 0 <= layer < model.layers:
        raise InvalidParameter(f"'layer' must be between 0 and {model.layers - 1}, got {layer}.", param="layer")
    parts = split(examples, seed)
    texts = [*parts.train.positive, *parts.train.negative, *parts.held.positive, *parts.held.negative]
    spans = read(engine, texts, layer, run, control)
    sizes = [len(parts.train.positive), len(parts.train.negative), len(parts.held.positive), len(parts.held.negative)]
    if any(len(s) == 0 for s in spans):
        raise InvalidParameter("An example tokenises to nothing; every example must hold text.", param="examples")
    pos_train, neg_train, pos_held, neg_held = (spans[a:a + n] for a, n in zip(_starts(sizes), sizes))
    weight, bias = TRAINERS[method](torch.stack([s.mean(0) for s in pos_train]),
                                    torch.stack([s.mean(0) for s in neg_train]))
    pos_held, pos_texts = long_enough(pos_held, parts.held.positive, window, "positive")
    neg_held, neg_texts = long_enough(neg_held, parts.held.negative, window, "negative")
    positive = aggregate(score(weight, bias, pos_held), aggregation, window)
    negative = aggregate(score(weight, bias, neg_held), aggregation, window)
    threshold, recall, fpr = operating_point(positive, negative, target_fpr)
    figures = Figures(round(auroc(positive, negative), 6), round(recall, 6), round(fpr, 6), target_fpr,
                      {"positive": len(pos_held), "negative": len(neg_held)},
                      {"positive": len(pos_train), "negative": len(neg_train)})
    return Probe(name, layer, method, weight.tolist(), bias, aggregation, span, threshold, figures, model,
                 {**(source or {}), "seed": seed},
                 {"positive": positive.tolist(), "negative": negative.tolist()},
                 {"positive": pos_texts, "negative": neg_texts}, window=window)


def _starts(sizes: Sequence[int]) -> list[int]:
    return [sum(sizes[:i]) for i in range(len(sizes))]
