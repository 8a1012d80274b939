"""Sampling as pure functions over logits tensors of shape ``[rows, vocab]``.

A parameter is one float for every row (a single request) or a ``[rows]`` tensor, one value per row (the
continuous batch, whose rows each keep their own); the rule is written once for both.
"""

from __future__ import annotations

import torch

PerRow = float | torch.Tensor  # one value for every row, or a ``[rows]`` tensor of each row's own


def _column(value: PerRow) -> PerRow:
    """``value`` broadcast over ``[rows, vocab]``: a float as it is, a per-row tensor as a column."""
    return value.view(-1, 1) if isinstance(value, torch.Tensor) else value


def _any(flags: bool | torch.Tensor) -> bool:
    return bool(flags.any()) if isinstance(flags, torch.Tensor) else flags


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, frequency: PerRow, presence: PerRow) -> torch.Tensor:
    """OpenAI's additive penalties, exactly: ``logit -= frequency * count + presence * (count > 0)``.

    ``counts[r, t]`` is how often row ``r`` has generated token ``t`` so far (prompt tokens excluded,
    as in OpenAI's definition). This is not HF's multiplicative repetition penalty.
    """
    if not _any(frequency != 0.0) and not _any(presence != 0.0):
        return logits
    counts = counts.to(logits.dtype)
    return logits - _column(frequency) * counts - _column(presence) * (counts > 0).to(logits.dtype)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: PerRow) -> torch.Tensor:
    """The multiplicative repetition penalty (transformers' and vLLM's ``repetition_penalty``): for every token
    a row has seen (``seen[r, t]``: in its prompt or generated so far) a positive logit is divided by the
    penalty and a negative one multiplied by it, so above 1 a seen token is less likely; 1 changes nothing."""
    if not _any(penalty != 1.0):
        return logits
    p = _column(penalty.to(logits.dtype) if isinstance(penalty, torch.Tensor) else penalty)
    return torch.where(seen, torch.where(logits > 0, logits / p, logits * p), logits)


def top_p_mask(logits: torch.Tensor, top_p: PerRow) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability mass reaches ``top_p`` (always >= 1 token); a row
    whose ``top_p`` is 1 keeps every token."""
    restricted = top_p < 1.0
    if not _any(restricted):
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= _column(top_p)
    if isinstance(restricted, torch.Tensor):
        drop_sorted &= restricted.view(-1, 1)
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def update_counts(counts: torch.Tensor, tokens: torch.Tensor) -> None:
    """Record one newly generated token per row into ``counts`` in place."""
    counts.scatter_add_(1, tokens.view(-1, 1), torch.ones_like(tokens.view(-1, 1), dtype=counts.dtype))


def unsampleable(logits: torch.Tensor) -> torch.Tensor:
    """Rows no token can be picked from (``[rows]`` bool): a NaN or +inf logit, or every logit -inf."""
    return torch.isnan(logits).any(-1) | torch.isposinf(logits).any(-1) | torch.isneginf(logits).all(-1)


def scaled(logits: torch.Tensor, temperature: PerRow) -> torch.Tensor:
    """``logits / T`` computed as ``(logits - max) / T`` in float64: the largest logit becomes 0 and the rest
    are at most 0, so any T > 0, however small (5e-324 included), gives 0, negative values or -inf, never
    +inf or NaN."""
    shifted = (logits.float() - logits.float().max(dim=-1, keepdim=True).values).double()
    t = temperature.double() if isinstance(temperature, torch.Tensor) else temperature
    return shifted / _column(t)


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row with each row's own temperature and top_p (``[rows]`` each): greedy rows
    (temperature 0) take the argmax; only the others are drawn (from ``generator`` when given), from
    softmax(logits / T) restricted by their top_p."""
    chosen = torch.argmax(logits, dim=-1)
    drawn = torch.nonzero(temperature > 0).view(-1)
    if drawn.numel():
        probs = torch.softmax(top_p_mask(scaled(logits[drawn], temperature[drawn]), top_p[drawn]), dim=-1)
        chosen[drawn] = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return chosen
