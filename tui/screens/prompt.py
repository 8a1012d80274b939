"""A one-line question (a profile name, a file to export to): Enter answers, Esc cancels."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class TextPrompt(ModalScreen[str | None]):
    """Asks ``question``; dismisses with the text typed, or None."""

    BINDINGS = [Binding("escape", "dismiss(None)", "cancel")]

    def __init__(self, question: str, value: str = "") -> None:
        super().__init__()
        self.question = question
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt-box"):
            yield Label(self.question)
            yield Input(self.value, id="prompt-answer")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)
