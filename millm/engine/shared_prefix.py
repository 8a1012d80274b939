"""Teacher-forced forwards whose rows start alike: the tokens every row starts with (a chat template's
header, a research measure's prompt) are run once and their keys and values shared by the rows, so a
batch of scored answers costs their own tokens, not the prompt again for each.

The logits are ``[rows, keep, vocab]`` at each row's last ``keep`` positions, as a cacheless forward of the
left-padded rows gives them (to float rounding)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

SHARED_MIN = 8  # tokens the rows must share before running them once is worth a second forward
SHARED_ROWS = 4  # rows with one prompt that get a batch of their own, sharing the whole prompt


def shareable(config: Any) -> bool:
    """Whether a model's rows can share their first tokens' keys and values here: not with sliding-window
    layers, whose masks count cache slots, so the padding between the shared tokens and a row's own would
    read as distance and hide shared tokens still inside the window."""
    from millm.engine.decode.kv import KVShape

    return KVShape.of(config).window is None


def common_prefix(rows: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every row has in common."""
    if not rows:
        return 0
    first, length = rows[0], min(len(r) for r in rows)
    for row in rows[1:]:
        length = next((i for i in range(length) if row[i] != first[i]), length)
    return length


def in_order(rows: int, size: int) -> list[list[int]]:
    """Row indices in batches of at most ``size``, as given."""
    return [list(range(k, min(k + size, rows))) for k in range(0, rows, size)]


def batches(rows: Sequence[Sequence[int]], heads: Sequence[int], size: int, share: bool = True) -> list[list[int]]:
    """Row indices in batches of at most ``size`` for a teacher-forced pass: in order when not ``share``; else
    rows sorted by their tokens, so those that start alike are neighbours, ``SHARED_ROWS`` or more whose first
    ``heads[i]`` tokens (their prompt) are the same in batches of their own (sharing the whole prompt), and
    the others filling batches together (sharing what they have in common)."""
    if not share:
        return in_order(len(rows), size)
    order = sorted(range(len(rows)), key=lambda i: list(rows[i]))
    runs: list[list[int]] = []
    for i in order:
        if runs and list(rows[runs[-1][0]][:heads[runs[-1][0]]]) == list(rows[i][:heads[i]]):
            runs[-1].append(i)
        else:
            runs.append([i])
    out: list[list[int]] = []
    loose: list[int] = []  # rows of short runs, batched together
    for run in runs:
        if len(run) >= SHARED_ROWS:
            out.extend(run[k:k + size] for k in range(0, len(run), size))
        else:
            loose.extend(run)
    out.extend(loose[k:k + size] for k in range(0, len(loose), size))
    return out


def shared_forward(model: Any, shared: Sequence[int], rest: dict[str, torch.Tensor], keep: int) -> torch.Tensor:
    """The logits (fp32, ``[rows, keep, vocab]``) of rows that all start with the tokens ``shared``, at each
    row's last ``keep`` positions (all after them): ``shared`` runs once, then the rest of each row, whose
    cacheless inputs (left-padded: ids, and the mask and positions when padded) ``rest`` holds, after it."""
    from transformers import DynamicCache

    ids = rest["input_ids"]
    rows, width = ids.shape
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([list(shared)], device=ids.device), cache=cache, use_cache=True, logits_to_keep=1)
    cache.batch_repeat_interleave(rows)
    own = rest.get("attention_mask", torch.ones_like(ids))
    positions = rest.get("position_ids", torch.arange(width, device=ids.device).expand(rows, width))
    mask = torch.cat([torch.ones(rows, len(shared), dtype=own.dtype, device=own.device), own], dim=1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions + len(shared), cache=cache,
                use_cache=True, logits_to_keep=keep)
    return out.logits[:, -keep:].float()
