"""One turn of a chat: the prompt, or an answer that grows as it streams."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.client import ChatResult


class MessageBox(Static):
    """A prompt (``role`` "you") or an answer whose text is appended piece by piece."""

    def __init__(self, role: str, text: str = "") -> None:
        super().__init__(Text(text), classes=f"message {role}", markup=False)
        self.role = role
        self.text = text
        self.border_title = role

    def append(self, piece: str) -> None:
        self.text += piece
        self.update(Text(self.text))

    def finish(self, result: ChatResult) -> None:
        """Caption the answer with how it ended and how it was steered."""
        parts = [f"{result.completion_tokens} tokens", "stopped at max tokens" if result.finish == "length" else "",
                 f"steering {result.steering}", f"λ {result.intensity}" if result.intensity is not None else "",
                 result.rung or ""]
        self.border_subtitle = " · ".join(p for p in parts if p)
        self.add_class("done")

    def stopped(self, why: str) -> None:
        """The answer ended early: cancelled, or refused with ``why``."""
        self.border_subtitle = why
        self.add_class("stopped")
