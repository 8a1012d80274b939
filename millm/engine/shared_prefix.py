"""Shared starts: rows whose prompts start alike feed that start once, and the others take its keys and values.

One rule, two places it runs:

- Decoding (the scheduler's lanes): of one request's rows, a row whose prompt starts as an earlier row's,
  steered alike, takes that row (its donor) and the positions they share; once the donor holds them, the
  row's slot gets their keys and values (``hand_on``) and it feeds only the rest. Another choice (n > 1) of the
  same prompt shares the whole prompt and draws its first token from its donor's logits (``share_starts``,
  ``donors``). A research measure's answers (one chat template and system prompt, one steering per case) cost
  their own tokens, not the template again for each.
- Teacher-forced passes (scoring): the tokens every row of a batch starts with (a chat template's header, a
  research measure's prompt) run once and their keys and values are shared by the rows (``batches``,
  ``shared_forward``). The logits are ``[rows, keep, vocab]`` at each row's last ``keep`` positions, as a
  cacheless forward of the left-padded rows gives them (to float rounding).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from millm.steering.target import PROMPT_PHASE, applies, own_values

if TYPE_CHECKING:
    from millm.engine.decode.jobs import BatchRow
    from millm.engine.plan import Plan

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


def donors(prompts: Sequence[Sequence[int]], keys: Sequence[Hashable | None],
           least: int = SHARED_MIN) -> list[tuple[int, int] | None]:
    """Per row: ``(donor, shared)``, the earlier row whose first ``shared`` prompt tokens' keys and values it
    copies instead of feeding them, or None when it prefills its whole prompt itself (and may be a donor).

    A row shares only with a row of an equal ``key`` (what steers the prompt; None: the row shares with
    none), at least ``least`` tokens, and never its last prompt token (whose logits draw its first token).
    Donors prefill their whole prompt, so a row never waits on a row that waits itself.
    """
    out: list[tuple[int, int] | None] = []
    first: dict[tuple[Hashable, tuple[int, ...]], int] = {}  # (key, first `least` tokens) -> the donor
    for i, (ids, key) in enumerate(zip(prompts, keys)):
        head = (key, tuple(ids[:least]))
        donor = first.get(head) if key is not None and len(ids) > least else None
        if donor is not None:  # they share the first `least` tokens at least
            out.append((donor, min(common_prefix([prompts[donor], ids]), len(ids) - 1)))
            continue
        out.append(None)
        if key is not None:
            first.setdefault(head, i)
    return out


def prompt_steering(plan: Plan) -> Hashable | None:
    """What steers a row's prompt, as a key that is equal for rows whose equal prompt tokens get equal keys and
    values: none where the scope leaves the prompt unsteered, else the plan's own values; None (shares with no row)
    for a row following the live values, which an operator change between two rows' prefills would move."""
    if not applies(plan.scope, PROMPT_PHASE):
        return ()
    own = own_values(plan.steering)
    if own is None:
        return None
    return tuple(sorted((sae, tuple(sorted(values.items()))) for sae, values in own.items()))


def share_starts(rows: list[BatchRow], starts: bool = True) -> list[BatchRow]:
    """Give one request's rows (choice by choice) their donors, and return them in the order they take slots
    (rows that feed their own prompt first, then those that wait on a donor: one run of slots prefills them).

    Another choice (n > 1) of a prompt shares the whole prompt with its first choice; with ``starts`` (not where
    a reader reads each row's prompt), a first choice whose prompt starts as an earlier one's, steered alike,
    shares that start (``donors``)."""
    firsts: dict[tuple[int, int], BatchRow] = {}
    for r in rows:
        head = firsts.setdefault((id(r.plan), id(r.prompt)), r)
        if head is not r:
            r.donor, r.shared = head, len(r.prompt)
    heads = list(firsts.values())
    if starts:
        for r, pick in zip(heads, donors([r.prompt for r in heads], [prompt_steering(r.plan) for r in heads])):
            if pick is not None:
                r.donor, r.shared = heads[pick[0]], pick[1]
    return sorted(rows, key=lambda r: 0 if r.donor is None else 1 if r.shared < len(r.prompt) else 2)


def hand_on(rows: Iterable[BatchRow], copy: Callable[[int, int, int], None]) -> list[tuple[BatchRow, BatchRow]]:
    """Each row waiting on a donor that now holds their shared start gets those positions' keys and values
    (``copy(from_slot, to_slot, positions)``); returns ``(row, donor)`` for the rows that took a whole prompt:
    each draws its first token from its donor's logits."""
    whole: list[tuple[BatchRow, BatchRow]] = []
    for r in rows:
        donor = r.donor
        if donor is not None and donor.filled >= r.shared:
            copy(donor.slot, r.slot, r.shared)
            if r.shared == len(r.prompt):
                whole.append((r, donor))
            r.filled, r.donor = r.shared, None
    return whole


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
