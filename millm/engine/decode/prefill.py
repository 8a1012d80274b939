"""Merged prefill: which waiting prompt chunks share one forward, and that forward's input tensors.

A step prefills the prompt chunks of several rows in ONE forward over a contiguous run of KV slots
(``[first, first + count)``, the shape the slot cache and the steering row buffers index by). Every row
of the forward feeds ``width`` tokens: a prefilling row's real chunk is left-padded to that width, so
its last real token is the forward's last position (the one whose logits are kept); a slot in the run
that is not prefilling (a decoding row, or a free slot) is a filler row of padding only.

A padding or filler query writes its key at the slot's ``aside`` position (one no fed token ever
takes) and reads keys only up to a position its own row already holds, so no row sees another row's
tokens or any padding; its output is discarded. The per-step budget (``prefill_chunk``) bounds the
forward's whole size, ``count * width`` tokens, padding and fillers included: that is what a step costs.

Rows of one request whose prompts start alike feed the shared start once (``millm.engine.shared_prefix``):
a row waiting for its donor's keys and values is not prefilling until it has them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Merged:
    """One merged prefill forward: slots ``[first, first + count)``, ``width`` tokens each, and the
    tokens each prefilling slot feeds in it (``takes``: slot -> chunk length, in slot order)."""

    first: int
    count: int
    width: int
    takes: dict[int, int]


def choose(pending: list[tuple[int, int]], budget: int) -> Merged | None:
    """The prompt chunks the next forward feeds, from ``pending`` (slot, prompt tokens still to feed),
    sorted by slot, within ``budget`` tokens for the whole forward (``count * width``).

    Rows join in slot order from the lowest pending slot. A row that would widen the forward past the
    budget joins with a chunk of the current width instead (its prompt continues next step); the first
    row that cannot join even so ends the forward. None when nothing is pending.
    """
    if not pending or budget <= 0:
        return None
    first = pending[0][0]
    width = min(pending[0][1], budget)
    chosen = [pending[0]]
    for slot, left in pending[1:]:
        count = slot - first + 1
        wider = max(width, min(left, budget))
        if count * wider <= budget:
            width = wider
        elif count * width > budget:
            break
        chosen.append((slot, left))
    count = chosen[-1][0] - first + 1
    return Merged(first, count, width, {slot: min(left, width) for slot, left in chosen})


def inputs(merged: Merged, feeds: dict[int, tuple[int, list[int]]], pad_id: int,
           aside: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward's ``(ids, writes, reads)``, each ``[count, width]``: the tokens, the position each
    query's key is written at (its position id too), and the last key position it attends to.

    ``feeds`` gives each prefilling slot its first position and its chunk (``merged.takes`` long). Its
    real tokens sit at the end of its row, at positions ``start ...``; the padding before them writes at
    ``aside`` and reads up to the chunk's last position (keys its row holds once this forward has written).
    Filler rows write at ``aside`` and read key 0.
    """
    shape = (merged.count, merged.width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    writes = torch.full(shape, aside, dtype=torch.long)
    reads = torch.zeros(shape, dtype=torch.long)
    for slot, (start, chunk) in feeds.items():
        row, size = slot - merged.first, len(chunk)
        pad = merged.width - size
        ids[row, pad:] = torch.tensor(chunk, dtype=torch.long)
        writes[row, pad:] = reads[row, pad:] = torch.arange(start, start + size)
        reads[row, :pad] = start + size - 1
    return ids, writes, reads
