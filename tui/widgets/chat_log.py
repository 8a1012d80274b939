"""A scrolling list of turns (prompts and streamed answers)."""

from __future__ import annotations

from textual.containers import VerticalScroll

from tui.widgets.message_box import MessageBox


class ChatLog(VerticalScroll):
    """Turns in order; follows the newest while it streams."""

    def add(self, role: str, text: str = "") -> MessageBox:
        box = MessageBox(role, text)
        self.mount(box)
        self.scroll_end(animate=False)
        return box

    def append(self, box: MessageBox, piece: str) -> None:
        box.append(piece)
        self.scroll_end(animate=False)

    def clear(self) -> None:
        self.remove_children()

    def answers(self) -> list[str]:
        """The text of every answer so far (what tests and the compare view read)."""
        return [box.text for box in self.query(MessageBox) if box.role != "you"]
