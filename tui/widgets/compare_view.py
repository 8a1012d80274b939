"""Compare mode: each prompt answered twice with one seed, unsteered beside steered."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal

from tui.widgets.chat_log import ChatLog
from tui.widgets.message_box import MessageBox


class CompareView(Horizontal):
    """Two columns: the answer with steering off, and the answer as the dials have it."""

    def compose(self) -> ComposeResult:
        yield ChatLog(id="compare-unsteered")
        yield ChatLog(id="compare-steered")

    def on_mount(self) -> None:
        self.query_one("#compare-unsteered", ChatLog).border_title = "unsteered (λ off)"
        self.query_one("#compare-steered", ChatLog).border_title = "steered"

    def begin(self, prompt: str, seed: object) -> tuple[MessageBox, MessageBox]:
        """Show ``prompt`` in both columns; returns the two (empty) answers to stream into."""
        boxes = []
        for side in ("#compare-unsteered", "#compare-steered"):
            log = self.query_one(side, ChatLog)
            log.add("you", prompt).border_subtitle = f"seed {seed}"
            boxes.append(log.add("model"))
        return boxes[0], boxes[1]

    def column(self, side: str) -> ChatLog:
        return self.query_one(f"#compare-{side}", ChatLog)

    def clear(self) -> None:
        for side in ("#compare-unsteered", "#compare-steered"):
            self.query_one(side, ChatLog).clear()
