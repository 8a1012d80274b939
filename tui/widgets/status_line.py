"""One line that says how the next answer will be steered, and what the engine is doing."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from tui.client import SteeringState


@dataclass
class Status:
    """Everything the line shows."""

    state: SteeringState
    loaded_profile: str | None = None
    circuit: str | None = None
    compare: bool = False
    busy: str = ""


def notes(status: Status) -> list[tuple[str, str]]:
    """The line's parts after the live values, in order, as (text, style): each only where it applies."""
    s = status.state
    parts = [(bool(s.active_profile), f" · active profile {s.active_profile}", ""),
             (bool(status.circuit), f" · circuit {status.circuit}", ""),
             (bool(status.loaded_profile), f" · chats use profile {status.loaded_profile}", "bold"),
             (not s.live, " · a request's own steering runs now", "yellow"),
             (status.compare, " · COMPARE", "bold reverse"),
             (bool(status.busy), f" · {status.busy}", "italic")]
    return [(text, style) for shown, text, style in parts if shown]


def status_text(status: Status) -> Text:
    """Whether steering is on and how many features are live, then the notes."""
    s = status.state
    steered = sum(len(v) for v in s.values.values())
    on = ("on", "bold green") if s.enabled else ("OFF", "bold red")
    text = Text.assemble(("steering ", "dim"), on, (f" · {steered} feature{'s' if steered != 1 else ''} live", ""))
    for part, style in notes(status):
        text.append(part, style=style)
    return text


class StatusLine(Static):
    def show(self, status: Status) -> None:
        self.update(status_text(status))
