"""Lanes: a KV cache and the rows decoding in it. Every forward covers one lane's rows, never two lanes'.

The scheduler has a shared lane (continuous batching: requests join and leave it, each in its own
slots) and a lane for the request served alone (the serial path: a seeded request, one too big for the
shared slots, or every request when batching is off). A request alone in its lane shares no forward with
other traffic, so its text depends only on its own body: that is what ``X-miLLM-Seed``'s
``scope="request"`` promises.

A lane's slot ``s`` steers with row ``first + s`` of the steering controller's row buffers, so the two
lanes never share a delta row.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from millm.engine.decode.kv import SlotCache
from millm.engine.decode.prefill import donors
from millm.engine.decode.rows import Row
from millm.steering.target import PROMPT_PHASE, applies

if TYPE_CHECKING:
    from millm.engine.decode.scheduler import Job
    from millm.engine.plan import Plan
    from millm.steering.target import Reader

Readers = dict[str, list[tuple[int, "Reader"]]]  # per SAE: (row offset in the forward, reader)


@dataclass(eq=False)
class BatchRow:
    """One generated choice in a slot: its prompt, how much of it is in the KV, the token sampled but not
    yet fed, and what is its own: its plan's random generator (a seed), its constraint's matcher."""

    job: Job
    row: Row
    plan: Plan
    prompt: list[int]
    slot: int = -1
    filled: int = 0
    next_token: int | None = None
    source: BatchRow | None = None  # n > 1: the row whose prompt KV this one copies instead of prefilling
    donor: BatchRow | None = None  # a row of its request whose prompt starts alike: it copies its first
    shared: int = 0  # `shared` positions' KV once the donor has them (millm.engine.decode.prefill.donors)
    generator: torch.Generator | None = None
    guide: Any = None  # a RowGuides of one matcher (response_format), advanced on every token

    @property
    def length(self) -> int:
        """Tokens in the slot's KV; the next fed token goes at this position."""
        return self.filled + self.row.output.tokens - (1 if self.next_token is not None else 0)


@dataclass(eq=False)
class Lane:
    """One slot cache, the rows in its slots, their free slots and each slot's generated-token counts."""

    cache: SlotCache
    first: int  # the steering row of slot 0
    prefill_budget: int  # tokens one merged prefill forward may hold, padding included
    vocab: int
    rows: dict[int, BatchRow] = field(default_factory=dict)
    free: list[int] = field(default_factory=list)
    counts: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    prompted: torch.Tensor = field(default_factory=lambda: torch.zeros(0))  # [slots, vocab]: the prompt's tokens

    def __post_init__(self) -> None:
        self.free = list(range(self.cache.slots))
        device = self.cache.keys[0].device if self.cache.keys else torch.device("cpu")
        self.counts = torch.zeros(self.cache.slots, self.vocab, dtype=torch.int32, device=device)
        self.prompted = torch.zeros(self.cache.slots, self.vocab, dtype=torch.bool, device=device)

    def fits(self, rows: int, length: int) -> bool:
        """Whether ``rows`` rows of up to ``length`` positions (prompt + max_tokens) fit the free slots now."""
        return rows <= len(self.free) and length <= self.cache.slot_len

    def take(self, r: BatchRow) -> None:
        """Put ``r`` in the lowest free slot, its counts zeroed and its prompt's tokens marked (only a row with a
        repetition penalty reads them)."""
        slot = min(self.free)
        self.free.remove(slot)
        r.slot = slot
        self.rows[slot] = r
        self.counts[slot].zero_()
        if r.row.params.repetition_penalty != 1.0:
            self.prompted[slot].zero_()
            self.prompted[slot, torch.tensor(r.prompt, device=self.prompted.device)] = True

    def release(self, r: BatchRow) -> None:
        del self.rows[r.slot]
        self.free.append(r.slot)

    def holds(self, r: BatchRow) -> bool:
        """Whether ``r`` is still in its slot (its request may have ended earlier in this step)."""
        return self.rows.get(r.slot) is r

    def prefilling(self) -> list[BatchRow]:
        """The rows still feeding their prompt, by slot (a row copying its prompt's KV never feeds it; one
        waiting for its donor's shared start feeds the rest after it has that)."""
        return sorted((r for r in self.rows.values()
                       if r.source is None and r.donor is None and r.filled < len(r.prompt)), key=lambda r: r.slot)

    def hand_on(self) -> None:
        """Each row waiting on a donor that now holds their shared start gets those positions' KV."""
        for r in self.rows.values():
            donor = r.donor
            if donor is not None and donor.filled >= r.shared:
                self.cache.copy_prefix(donor.slot, r.slot, r.shared)
                r.filled, r.donor = r.shared, None

    def clones(self, source: BatchRow) -> list[BatchRow]:
        return [r for r in self.rows.values() if r.source is source]


def prompt_steering(plan: Plan) -> Hashable | None:
    """What steers a row's prompt, as a key that is equal for rows whose equal prompt tokens get equal keys and
    values: none where the scope leaves the prompt unsteered, else the override's values; None (shares with no
    row) for a row following the live values, which an operator change between two rows' prefills would move."""
    if not applies(plan.scope, PROMPT_PHASE):
        return ()
    if plan.override is None:
        return None
    return tuple(sorted((sae, tuple(sorted(values.items()))) for sae, values in plan.override.values.items()))


def share_starts(rows: list[BatchRow]) -> None:
    """Give each of one request's rows whose prompt starts as an earlier one's, steered alike, that row as its
    donor (``millm.engine.decode.prefill.donors``)."""
    found = donors([r.prompt for r in rows], [prompt_steering(r.plan) for r in rows])
    for r, pick in zip(rows, found):
        if pick is not None:
            r.donor, r.shared = rows[pick[0]], pick[1]


def readers(rows: list[BatchRow], first: int, writes: torch.Tensor, aside: int) -> tuple[Readers, Readers]:
    """Each fed row's readers, per SAE, before and after its steering delta (monitoring; a read-out at its
    read point), reading only the row's real positions: a merged prefill's padding (queries writing at
    the cache's ``aside``) is left out. ``first`` is the forward's first slot."""
    pre: Readers = {}
    post: Readers = {}
    for r in rows:
        job = r.job
        wanted: list[tuple[Readers, str, Reader]] = []
        if job.session is not None and job.monitored_sae is not None:
            wanted.append((pre, job.monitored_sae, job.session))
        if job.recorder is not None:
            spec = job.recorder.spec
            wanted.append((pre if spec.read_point == "pre_steering" else post, spec.sae_id, job.recorder))
        if not wanted:
            continue
        offset = r.slot - first
        pad = int((writes[offset] == aside).sum())
        for found, sae_id, read in wanted:
            found.setdefault(sae_id, []).append((offset, read if pad == 0 else _trimmed(read, pad)))
    return pre, post


def _trimmed(read: Reader, pad: int) -> Reader:
    """``read`` of a row's residual without its ``pad`` leading padding positions."""
    return lambda hidden: read(hidden[:, pad:])
