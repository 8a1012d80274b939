"""What the engine's generate stream yields. Front ends render these; they never see tensors."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Steered:
    """What steers the request, read when its rows are bound (``none``, ``live`` or a profile's name): the
    truth for X-miLLM-Steering, where the label seen at prepare time may since have changed (an operator
    change while the request queued). Sent once, before any text."""

    label: str


@dataclass(frozen=True)
class Delta:
    """New final text for choice ``index``."""

    index: int
    text: str


@dataclass(frozen=True)
class Finish:
    """Choice ``index`` ended: ``reason`` is "stop" (EOS or stop sequence) or "length" (max_tokens)."""

    index: int
    reason: str
    completion_tokens: int


@dataclass(frozen=True)
class Usage:
    """Totals for the whole request, the last event of every stream."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Activations:
    """The request's SAE read-out (``return_sae_activations``), sent just before Usage."""

    body: dict[str, Any]


@dataclass(frozen=True)
class Verdicts:
    """The request's probe verdicts (``millm.steering.probe.Watching.verdicts``), one per row and probe, sent
    when its last row ends, before its read-out."""

    body: list[dict[str, Any]]


@dataclass(frozen=True)
class Sensed:
    """The request's cluster sensing firings (``millm.steering.sensing.ClusterSensing.events``), sent when its
    last row ends, only when a cluster fired: the server records them and no response carries them."""

    body: list[dict[str, Any]]


Event = Steered | Delta | Finish | Verdicts | Sensed | Activations | Usage


def steered_label(events: Iterable[Event]) -> str | None:
    """What steered a finished generation, from its ``Steered`` event (None when its engine sent none)."""
    return next((event.label for event in events if isinstance(event, Steered)), None)
