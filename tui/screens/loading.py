"""Shown while the client connects or the model loads: what is happening, and for how long."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.containers import Center, Middle
from textual.screen import Screen
from textual.widgets import Label, LoadingIndicator


class LoadingScreen(Screen[None]):
    """A spinner, the step under way, and the seconds it has taken; an error stays on screen."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what
        self.started = time.monotonic()

    def compose(self) -> ComposeResult:
        with Middle():
            with Center():
                yield Label(self.what, id="loading-what")
            with Center():
                yield LoadingIndicator(id="loading-spinner")
            with Center():
                yield Label("", id="loading-elapsed")

    def on_mount(self) -> None:
        self.timer = self.set_interval(0.5, self._tick)

    def _tick(self) -> None:
        seconds = time.monotonic() - self.started
        self.query_one("#loading-elapsed", Label).update(
            f"{seconds:.0f} s (a first load dequantises the model and takes longer)")

    def failed(self, message: str) -> None:
        """The load failed: say why, and how to leave."""
        self.timer.stop()
        self.query_one("#loading-spinner", LoadingIndicator).display = False
        self.query_one("#loading-what", Label).update(f"{self.what} failed:\n{message}")
        self.query_one("#loading-elapsed", Label).update("ctrl+q quits")
