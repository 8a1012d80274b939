"""What the decode loop holds: a request (``Job``) and one generated choice of it in a KV slot (``BatchRow``).

Both are plain records, imported by the scheduler, its lanes, its draw and the driver; this module imports none
of them, so the decode package has no import circles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from millm.engine.base import StepControl
    from millm.engine.decode.rows import Row
    from millm.engine.events import Event
    from millm.engine.plan import Plan
    from millm.steering.target import ClusterSensing, MonitorSession, ReadoutRecorder, Watching


@dataclass(eq=False)
class Job:
    """One request: its plans (choice indices following on, plan by plan), the consumer's cancellation,
    where its events go (``send``) and how it ends (``end``, with an error or None). ``alone``: served
    by itself, in a lane of its own."""

    plans: list[Plan]
    control: StepControl
    send: Callable[[Event], None]
    end: Callable[[BaseException | None], None]
    check: Callable[[], None] | None = None  # between steps: raises when an operator change invalidates it
    alone: bool = False
    rows_left: int = 0
    completion_tokens: int = 0
    session: MonitorSession | None = None
    monitored_sae: str | None = None
    recorder: ReadoutRecorder | None = None
    watching: Watching | None = None  # its probes' state (``probes`` of its plan)
    watched: bool = False  # whether its probes' layer hooks are on
    sensing: ClusterSensing | None = None  # its sensing clusters' state (None: no attached SAE has one)
    rows: list[BatchRow] = field(default_factory=list)

    @property
    def prompt_tokens(self) -> int:
        """Each prompt once, however many choices it feeds (OpenAI's usage)."""
        return sum(len(ids) for p in self.plans for ids in p.prompt_ids)

    @property
    def length(self) -> int:
        """The most positions one of its rows can take: its prompt and its whole budget."""
        return max(len(ids) + p.max_tokens for p in self.plans for ids in p.prompt_ids)


@dataclass(eq=False)
class BatchRow:
    """One generated choice in a slot: its prompt, how much of it is in the KV, the token sampled but not
    yet fed, and what is its own: its plan's random generator (a seed), its constraint's matcher.

    A row whose prompt starts as another row's of its request takes that start's keys and values from it
    (its ``donor``) instead of feeding them (``millm.engine.shared_prefix``): ``shared`` positions, the whole
    prompt for another choice (n > 1) of the same prompt, which then draws from its donor's logits."""

    job: Job
    row: Row
    plan: Plan
    prompt: list[int]
    slot: int = -1
    filled: int = 0
    next_token: int | None = None
    donor: BatchRow | None = None  # the row whose first `shared` positions' KV this one copies once it has them
    shared: int = 0
    generator: torch.Generator | None = None
    guide: Any = None  # a RowGuides of one matcher (response_format), advanced on every token

    @property
    def length(self) -> int:
        """Tokens in the slot's KV; the next fed token goes at this position."""
        return self.filled + self.row.output.tokens - (1 if self.next_token is not None else 0)

