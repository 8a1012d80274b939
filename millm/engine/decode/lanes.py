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

from dataclasses import dataclass, field

import torch

from millm.engine.decode.jobs import BatchRow
from millm.engine.decode.kv import SlotCache


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
        """The rows still feeding their prompt, by slot (one waiting for its donor's shared start feeds the rest
        after it has that, ``millm.engine.shared_prefix``)."""
        return sorted((r for r in self.rows.values() if r.donor is None and r.filled < len(r.prompt)),
                      key=lambda r: r.slot)
