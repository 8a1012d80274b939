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
    rows, tokens = seen.nonzero(as_tuple=True)  # a row has seen a few dozen of the vocabulary's tokens
    p = penalty.to(logits.dtype)[rows] if isinstance(penalty, torch.Tensor) else penalty
    values = logits[rows, tokens]
    out = logits.clone()
    out[rows, tokens] = torch.where(values > 0, values / p, values * p)
    return out


# a row's top-p set is looked for among its 64 likeliest tokens, then its 1,024 likeliest (a wider search costs
# more for every row searched), then by a full sort
NUCLEUS_CANDIDATES = (64, 1024)


def update_counts(counts: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> None:
    """Record one newly generated token for each of ``rows`` (``tokens[i]`` for ``rows[i]``) into ``counts``
    in place."""
    counts.index_put_((rows, tokens), torch.ones_like(tokens, dtype=counts.dtype), accumulate=True)


def unsampleable(logits: torch.Tensor) -> torch.Tensor:
    """Rows no token can be picked from (``[rows]`` bool): a NaN or +inf logit, or every logit -inf. Only rows
    whose sum is not finite (what any NaN or infinity makes it) are looked at again."""
    broken = ~torch.isfinite(logits.sum(-1))
    if bool(broken.any()):
        rows = torch.nonzero(broken).view(-1)
        odd = logits[rows]
        broken[rows] = torch.isnan(odd).any(-1) | torch.isposinf(odd).any(-1) | torch.isneginf(odd).all(-1)
    return broken


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


def nucleus(logits: torch.Tensor, temperature: torch.Tensor,
            top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's top-p set of softmax(logits / T) as candidates, ``(probs, ids)`` of shape ``[rows, width]``:
    ``probs[r, j]`` is the (unnormalised) chance of token ``ids[r, j]``, zero past the row's set.

    A restricted row (top_p < 1) keeps the smallest set of its likeliest tokens whose mass reaches top_p (at
    least one), likeliest first: looked for among its likeliest (``NUCLEUS_CANDIDATES``: a few, then more), by
    a full sort only when those hold less. A row with top_p 1 keeps every token, in vocabulary order. So a row's
    candidates depend on its own logits and parameters alone, never on the rows batched with it."""
    values = scaled(logits, temperature)
    rows, vocab = values.shape
    free = top_p >= 1.0
    log_total = torch.logsumexp(values, dim=-1, keepdim=True)
    if bool(free.all()):  # OpenAI's default top_p: nothing to rank
        return torch.exp(values - log_total), torch.arange(vocab, device=values.device).expand(rows, vocab)
    k = min(NUCLEUS_CANDIDATES[0], vocab)
    ranked, ids = torch.topk(values, k, dim=-1)
    probs = torch.exp(ranked - log_total)
    for more in NUCLEUS_CANDIDATES[1:]:
        short = torch.nonzero(~free & (probs.sum(-1) < top_p)).view(-1)
        if not short.numel() or k >= vocab:
            break
        k = min(more, vocab)
        probs, ids = _widened(probs, k), _widened(ids, k)
        ranked, ids[short] = torch.topk(values[short], k, dim=-1)
        probs[short] = torch.exp(ranked - log_total[short])
    wide = free | (probs.sum(-1) < top_p)
    if bool(wide.any()):
        probs, ids = _widened(probs, vocab), _widened(ids, vocab)
        restricted = torch.nonzero(wide & ~free).view(-1)
        if restricted.numel():
            ranked, ids[restricted] = torch.sort(values[restricted], dim=-1, descending=True)
            probs[restricted] = torch.exp(ranked - log_total[restricted])
        everything = torch.nonzero(free).view(-1)
        if everything.numel():
            probs[everything] = torch.exp(values[everything] - log_total[everything])
            ids[everything] = torch.arange(vocab, device=ids.device)
    keep = (torch.cumsum(probs, dim=-1) - probs < top_p.view(-1, 1)) | free.view(-1, 1)
    keep[..., 0] = True
    width = int(keep.sum(-1).max())
    return (probs * keep)[:, :width], ids[:, :width]


def _widened(values: torch.Tensor, width: int) -> torch.Tensor:
    """``values`` (``[rows, w]``) with zeros after each row up to ``width`` columns."""
    return torch.cat([values, values.new_zeros(values.shape[0], width - values.shape[1])], dim=-1)


def pick(probs: torch.Tensor, ids: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row drawn from its candidates (:func:`nucleus`) by inverse transform sampling: the first
    candidate whose cumulative chance passes ``uniforms[r]`` (in [0, 1)) of the row's total. One uniform per
    row, whatever the width, so a seeded row's draws never depend on what it is batched with."""
    cdf = torch.cumsum(probs, dim=-1)  # a parallel cumsum (CUDA) may still rise at a zero: it is held flat there
    cdf = torch.where(probs > 0, cdf, torch.zeros_like(cdf)).cummax(dim=-1).values
    target = uniforms.to(cdf.dtype).view(-1, 1) * cdf[:, -1:]
    last = torch.cumsum(probs > 0, dim=-1).argmax(-1, keepdim=True)  # the row's last candidate (never passed)
    index = torch.minimum(torch.searchsorted(cdf, target, right=True), last)
    return ids.gather(1, index).view(-1)


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                chances: torch.Tensor) -> torch.Tensor:
    """One token per row with each row's own temperature and top_p (``[rows]`` each): greedy rows
    (temperature 0) take the argmax; the others are drawn with their own uniform ``chances[r]`` (in [0, 1))
    from softmax(logits / T) restricted by their top_p."""
    chosen = torch.argmax(logits, dim=-1)
    drawn = torch.nonzero(temperature > 0).view(-1)
    if drawn.numel():
        probs, ids = nucleus(logits[drawn], temperature[drawn], top_p[drawn])
        chosen[drawn] = pick(probs, ids, chances[drawn])
    return chosen
