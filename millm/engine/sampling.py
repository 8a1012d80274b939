"""Sampling as pure functions over logits tensors of shape ``[rows, vocab]``."""

from __future__ import annotations

from collections.abc import Callable

import torch


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, frequency: float, presence: float) -> torch.Tensor:
    """OpenAI's additive penalties, exactly: ``logit -= frequency * count + presence * (count > 0)``.

    ``counts[r, t]`` is how often row ``r`` has generated token ``t`` so far (prompt tokens excluded,
    as in OpenAI's definition). This is not HF's multiplicative repetition penalty.
    """
    if frequency == 0.0 and presence == 0.0:
        return logits
    counts = counts.to(logits.dtype)
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def top_p_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability mass reaches ``top_p`` (always >= 1 token)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= top_p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample(logits: torch.Tensor, temperature: float, top_p: float,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick one token per row: greedy at temperature 0, else softmax(logits / T) restricted by top_p."""
    if temperature == 0.0:
        return torch.argmax(logits, dim=-1)
    scaled = top_p_mask(logits.float() / temperature, top_p)
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def update_counts(counts: torch.Tensor, tokens: torch.Tensor) -> None:
    """Record one newly generated token per row into ``counts`` in place."""
    counts.scatter_add_(1, tokens.view(-1, 1), torch.ones_like(tokens.view(-1, 1), dtype=counts.dtype))


LogitsProcessor = Callable[[torch.Tensor], torch.Tensor]
Sampler = Callable[[torch.Tensor], torch.Tensor]


def penalty_processor(counts: torch.Tensor, frequency: float, presence: float) -> LogitsProcessor:
    """OpenAI's additive penalties over the tokens each row generated so far (``counts``, updated by the loop)."""
    return lambda logits: apply_penalties(logits, counts, frequency, presence)


def make_sampler(temperature: float, top_p: float, generator: torch.Generator | None = None) -> Sampler:
    """Greedy at temperature 0, else softmax(logits / T) restricted by top_p."""
    return lambda logits: sample(logits, temperature, top_p, generator)


def row_penalties(logits: torch.Tensor, counts: torch.Tensor, frequency: torch.Tensor,
                  presence: torch.Tensor) -> torch.Tensor:
    """``apply_penalties`` with each row's own frequency and presence penalty (``[rows]`` each)."""
    if not bool((frequency != 0).any() or (presence != 0).any()):
        return logits
    counts = counts.to(logits.dtype)
    return logits - frequency.view(-1, 1) * counts - presence.view(-1, 1) * (counts > 0).to(logits.dtype)


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``sample`` with each row's own temperature and top_p (``[rows]`` each): greedy rows (temperature
    0) take the argmax, the others draw from softmax(logits / T) restricted by their own top_p."""
    greedy = temperature == 0
    chosen = torch.argmax(logits, dim=-1)
    if bool(greedy.all()):
        return chosen
    scaled = logits.float() / torch.where(greedy, 1.0, temperature).view(-1, 1)
    if bool((top_p < 1.0).any()):
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = (mass_before >= top_p.view(-1, 1)) & (top_p < 1.0).view(-1, 1)
        drop_sorted[..., 0] = False
        scaled = scaled.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
    drawn = torch.multinomial(torch.softmax(scaled, dim=-1), 1).squeeze(-1)
    return torch.where(greedy, chosen, drawn)
