"""Which generations share the batch: its bounds (``BatchSettings``) and the rule that sends a request to
be served alone instead (``fallback_reason``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from millm.config import Settings
    from millm.engine.plan import Plan


@dataclass(frozen=True)
class BatchSettings:
    """How big the batch may grow: rows, the KV token budget (split into equal slots), the tokens a
    step's merged prefill forward may hold (padding included), whether monitored requests are
    batched or served serially, and whether constrained ones (response_format, tools) are batched, per row, or
    refused as the spec's rule has it (MILLM_BATCHING_CONSTRAINTS)."""

    max_rows: int = 16
    max_tokens: int = 32768
    prefill_chunk: int = 256
    monitoring: Literal["batch", "serial"] = "batch"
    constraints: Literal["batch", "refuse"] = "batch"

    @property
    def slot_len(self) -> int:
        return self.max_tokens // self.max_rows

    @classmethod
    def of(cls, settings: Settings) -> BatchSettings:
        """The configured bounds, whether or not the server batches (``millm batch`` always may)."""
        return cls(settings.batch_max_rows, settings.batch_max_tokens, settings.batch_prefill_chunk,
                   settings.batching_monitoring, settings.batching_constraints)

    @classmethod
    def from_settings(cls, settings: Settings) -> BatchSettings | None:
        """The batch settings when continuous batching is enabled (MILLM_BATCHING), else None."""
        return cls.of(settings) if settings.batching else None


def rows_of(plans: list[Plan]) -> int:
    """Generated choices of a request: every plan's prompts x n."""
    return sum(len(p.prompt_ids) * p.params.n for p in plans)


def fallback_reason(plans: list[Plan], batch: BatchSettings, monitoring: bool) -> str | None:
    """Why a generation is served alone (the serial path) instead of in the batch (None: it is batched).

    n > 1, a seed (its text must not depend on other traffic), several conversations (extra_messages),
    a read-out (return_sae_activations), a constraint when MILLM_BATCHING_CONSTRAINTS=refuse (a row's
    constraint is its own matcher otherwise), active monitoring when MILLM_BATCHING_MONITORING=serial, and
    what cannot fit the batch: a row longer than a KV slot, or more rows than the batch has.
    """
    for plan in plans:
        reason = _own_reason(plan, batch)
        if reason is not None:
            return reason
    if monitoring and batch.monitoring == "serial":
        return "monitoring"
    if rows_of(plans) > batch.max_rows or any(len(ids) + p.max_tokens > batch.slot_len
                                              for p in plans for ids in p.prompt_ids):
        return "too_long"
    return None


def _own_reason(plan: Plan, batch: BatchSettings) -> str | None:
    """What in one plan's own fields serves its request alone (None: nothing)."""
    if plan.params.n > 1:
        return "n"
    if plan.params.seed is not None:
        return "seed"
    if len(plan.prompt_ids) > 1:
        return "extra_messages"
    if plan.readout is not None:
        return "return_sae_activations"
    if plan.constraint is not None and batch.constraints == "refuse":  # named by its field
        return plan.constraint.param
    return None
