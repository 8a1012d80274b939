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


NUCLEUS_CANDIDATES = 1024  # the likeliest tokens the top-p set is looked for among first (a full sort costs more)


def top_p_mask(logits: torch.Tensor, top_p: PerRow) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability mass reaches ``top_p`` (always >= 1 token); a row
    whose ``top_p`` is 1 keeps every token. The set is looked for among the ``NUCLEUS_CANDIDATES`` likeliest
    tokens, and among all of them only when those hold less than ``top_p`` of the mass."""
    restricted = top_p < 1.0
    if not _any(restricted):
        return logits
    k = min(NUCLEUS_CANDIDATES, logits.shape[-1])
    ranked, order = torch.topk(logits, k, dim=-1)
    probs = torch.exp(ranked - torch.logsumexp(logits, dim=-1, keepdim=True))
    mass_before = torch.cumsum(probs, dim=-1) - probs
    reached = (mass_before[..., -1] + probs[..., -1] >= top_p) | ~torch.as_tensor(restricted)
    if not bool(reached.all()):
        ranked, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(ranked, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
    keep_ranked = mass_before < _column(top_p)
    keep_ranked[..., 0] = True
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, keep_ranked)
    masked = logits.masked_fill(~keep, float("-inf"))
    return torch.where(restricted.view(-1, 1), masked, logits) if isinstance(restricted, torch.Tensor) else masked


def update_counts(counts: torch.Tensor, tokens: torch.Tensor) -> None:
    """Record one newly generated token per row into ``counts`` in place."""
    counts.scatter_add_(1, tokens.view(-1, 1), torch.ones_like(tokens.view(-1, 1), dtype=counts.dtype))


def unsampleable(logits: torch.Tensor) -> torch.Tensor:
    """Rows no token can be picked from (``[rows]`` bool): a NaN or +inf logit, or every logit -inf."""
    return torch.isnan(logits).any(-1) | torch.isposinf(logits).any(-1) | torch.isneginf(logits).all(-1)


FLOAT32_TEMPERATURE = 1e-3  # at or above it, (logits - max) / T stays well inside float32's range


def scaled(logits: torch.Tensor, temperature: PerRow) -> torch.Tensor:
    """``logits / T`` computed as ``(logits - max) / T``: the largest logit becomes 0 and the rest are at most
    0, so any T > 0, however small (5e-324 included), gives 0, negative values or -inf, never +inf or NaN. In
    float32 when every T is at least FLOAT32_TEMPERATURE, else in float64 (where a T of 1e-40 is not 0)."""
    shifted = logits.float() - logits.float().max(dim=-1, keepdim=True).values
    low = temperature.min() if isinstance(temperature, torch.Tensor) else temperature
    if float(low) >= FLOAT32_TEMPERATURE:
        t = temperature.float() if isinstance(temperature, torch.Tensor) else temperature
        return shifted / _column(t)
    t = temperature.double() if isinstance(temperature, torch.Tensor) else temperature
    return shifted.double() / _column(t)


def sampling_probs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The distribution each row draws from: softmax(logits / T) restricted by its top_p (rows with T > 0)."""
    return torch.softmax(top_p_mask(scaled(logits, temperature), top_p), dim=-1)


def nucleus(logits: torch.Tensor, temperature: torch.Tensor,
            top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The distribution each row draws from (rows with T > 0), as ``(probs, ids)``: when every row's top_p
    set lies among its ``NUCLEUS_CANDIDATES`` likeliest tokens, ``probs[r, j]`` is the chance of token
    ``ids[r, j]`` (a draw over a thousand candidates rather than the whole vocabulary); else ``ids`` is None
    and ``probs`` covers the vocabulary (:func:`sampling_probs`). The two are the same distribution."""
    k = min(NUCLEUS_CANDIDATES, logits.shape[-1])
    if bool((top_p < 1.0).all()) and k < logits.shape[-1]:
        values = scaled(logits, temperature)
        ranked, ids = torch.topk(values, k, dim=-1)
        probs = torch.exp(ranked - torch.logsumexp(values, dim=-1, keepdim=True))
        mass_before = torch.cumsum(probs, dim=-1) - probs
        if bool((mass_before[..., -1] + probs[..., -1] >= top_p).all()):
            keep = mass_before < top_p.view(-1, 1)
            keep[..., 0] = True
            kept = probs * keep
            return kept / kept.sum(dim=-1, keepdim=True), ids
    return sampling_probs(logits, temperature, top_p), None


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row with each row's own temperature and top_p (``[rows]`` each): greedy rows
    (temperature 0) take the argmax; only the others are drawn (from ``generator`` when given), from
    softmax(logits / T) restricted by their top_p."""
    chosen = torch.argmax(logits, dim=-1)
    drawn = torch.nonzero(temperature > 0).view(-1)
    if drawn.numel():
        probs = sampling_probs(logits[drawn], temperature[drawn], top_p[drawn])
        chosen[drawn] = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return chosen
