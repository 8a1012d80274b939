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


class StatusLine(Static):
    def show(self, status: Status) -> None:
        s = status.state
        steered = sum(len(v) for v in s.values.values())
        on = ("on", "bold green") if s.enabled else ("OFF", "bold red")
        text = Text.assemble(("steering ", "dim"), on,
                             (f" · {steered} feature{'s' if steered != 1 else ''} live", ""))
        if s.active_profile:
            text.append(f" · active profile {s.active_profile}")
        if status.circuit:
            text.append(f" · circuit {status.circuit}")
        if status.loaded_profile:
            text.append(f" · chats use profile {status.loaded_profile}", style="bold")
        if not s.live:
            text.append(" · a request's own steering runs now", style="yellow")
        if status.compare:
            text.append(" · COMPARE", style="bold reverse")
        if status.busy:
            text.append(f" · {status.busy}", style="italic")
        self.update(text)
