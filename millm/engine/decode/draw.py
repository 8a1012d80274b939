"""Drawing the next token of several rows at once, each by its own rules.

Per row: its repetition penalty over its prompt and what it generated, its penalties over what it generated
(``Lane.counts``), its constraint's mask, its temperature and top_p, and its random generator (a seeded plan
draws one uniform per step from its own, so its choices repeat byte for byte, whatever it is batched with). A
row that no token can be drawn for is returned as failed, with the error its request ends with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from millm.engine.decode.sampling import (
    apply_penalties,
    apply_repetition_penalty,
    sample_rows,
    unsampleable,
    update_counts,
)
from millm.errors import ConstrainedOutputInvalid, NonFiniteLogits

if TYPE_CHECKING:
    from millm.engine.decode.jobs import BatchRow


def draw(rows: list[BatchRow], logits: torch.Tensor, counts: torch.Tensor,
         prompted: torch.Tensor) -> tuple[list[tuple[BatchRow, int]], list[tuple[BatchRow, Exception]]]:
    """``(row, token)`` for every row a token was drawn for (its ``counts`` row updated), and ``(row, error)``
    for the others: logits holding a NaN or +inf, or only -inf (non_finite_logits), or a constraint that
    allows no token (constrained_output_invalid). ``prompted[slot]`` marks the tokens of a row's prompt (its
    repetition penalty counts them)."""
    logits = penalised(rows, logits, counts, prompted)
    failed = _unsampleable(rows, logits)
    gone = {id(r) for r, _ in failed}
    keep = [i for i, r in enumerate(rows) if id(r) not in gone]
    if not keep:
        return [], failed
    rows, logits = [rows[i] for i in keep], logits[keep]
    tokens = _sampled(rows, logits)
    update_counts(counts, torch.tensor([r.slot for r in rows], device=logits.device), tokens)
    return list(zip(rows, tokens.tolist())), failed


def penalised(rows: list[BatchRow], logits: torch.Tensor, counts: torch.Tensor, prompted: torch.Tensor) -> torch.Tensor:
    """The logits after each row's repetition penalty (over its prompt and what it generated), then its frequency
    and presence penalties (over what it generated); as they are when no row has any."""
    params = [r.row.params for r in rows]
    slots = [r.slot for r in rows]

    def each(name: str) -> torch.Tensor:
        return torch.tensor([getattr(p, name) for p in params], device=logits.device)

    if any(p.repetition_penalty != 1.0 for p in params):
        logits = apply_repetition_penalty(logits, (counts[slots] > 0) | prompted[slots], each("repetition_penalty"))
    if any(p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 for p in params):
        logits = apply_penalties(logits, counts[slots], each("frequency_penalty"), each("presence_penalty"))
    return logits


def _sampled(rows: list[BatchRow], logits: torch.Tensor) -> torch.Tensor:
    """Each row's token by its temperature and top_p, from its own random draw (``chances``)."""
    device = logits.device
    temperature = torch.tensor([r.row.params.temperature for r in rows], dtype=torch.float64,
                               device=device)  # float64: a temperature of 1e-40 is not 0
    top_p = torch.tensor([r.row.params.top_p for r in rows], device=device)
    return sample_rows(logits, temperature, top_p, chances(rows, device))


def _unsampleable(rows: list[BatchRow], logits: torch.Tensor) -> list[tuple[BatchRow, Exception]]:
    """The rows no token can be drawn for, each with its error; a constrained row's mask is applied here
    (in place), since it is what leaves a row without a token."""
    failed: list[tuple[BatchRow, Exception]] = []
    for i, (r, broken) in enumerate(zip(rows, unsampleable(logits).tolist())):
        if broken:
            failed.append((r, NonFiniteLogits("The model produced NaN or infinite logits for this request; no "
                                              "next token can be drawn.")))
            continue
        if r.guide is not None:
            r.guide.mask(logits[i:i + 1], [True])
            if bool(torch.isneginf(logits[i]).all()):
                failed.append((r, ConstrainedOutputInvalid("The constraint allows no next token here; the document "
                                                           "cannot be completed.")))
    return failed


def chances(rows: list[BatchRow], device: torch.device) -> torch.Tensor:
    """One uniform draw per sampled row (temperature > 0), from that row's own generator (else the
    process's); greedy rows draw nothing, so their generators are left as they were."""
    out = torch.zeros(len(rows), dtype=torch.float64, device=device)
    for generator, members in by_generator(rows).items():
        sampled = [m for m in members if rows[m].row.params.temperature > 0]
        if sampled:
            out[sampled] = torch.rand(len(sampled), generator=generator, dtype=torch.float64, device=device)
    return out


def by_generator(rows: list[BatchRow]) -> dict[torch.Generator | None, list[int]]:
    """Row positions grouped by the random generator they draw from (None: the process's)."""
    groups: dict[torch.Generator | None, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.generator, []).append(i)
    return groups
