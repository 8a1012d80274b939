"""What the model computed: the last answer's tokens, each with its most active SAE features.

Move along the tokens with the arrows; the features of the token under the cursor are listed with
their labels and activations (``return_sae_activations``, read after this layer's steering).
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from tui.client import Feature, TokenFeatures

BAR = 12


def window(lengths: list[int], cursor: int, width: int) -> tuple[int, int]:
    """The tokens ``[start, end)`` shown around ``cursor`` in ``width`` columns: the cursor's (bracketed, 2 more
    columns), then one more on the right and one more on the left in turn (1 column each to part them), while
    they fit."""
    start, end, used = cursor, cursor + 1, lengths[cursor] + 2
    while True:
        grew = False
        if end < len(lengths) and used + lengths[end] + 1 <= width:
            used += lengths[end] + 1
            end += 1
            grew = True
        if start > 0 and used + lengths[start - 1] + 1 <= width:
            start -= 1
            used += lengths[start] + 1
            grew = True
        if not grew:
            return start, end


class ActivationStrip(Widget, can_focus=True):
    """A strip of tokens with a cursor, and the cursor token's top features."""

    BINDINGS = [
        Binding("right", "move(1)", "next token"),
        Binding("left", "move(-1)", "previous token"),
        Binding("home", "move_to(0)", "first"),
        Binding("end", "move_to(-1)", "last"),
        Binding("enter", "choose", "put its top feature on the slider"),
    ]

    cursor: reactive[int] = reactive(0)

    class Chosen(Message):
        """Put this feature (the cursor token's most active) on the strength slider."""

        def __init__(self, feature: Feature) -> None:
            super().__init__()
            self.feature = feature

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.tokens: list[TokenFeatures] = []
        self.sae_id: str | None = None
        self.labels: dict[int, str] = {}

    def show(self, sae_id: str | None, tokens: list[TokenFeatures], labels: dict[int, str]) -> None:
        self.sae_id, self.tokens, self.labels = sae_id, tokens, labels
        self.cursor = 0
        self.refresh(layout=True)

    def action_move(self, step: int) -> None:
        if self.tokens:
            self.cursor = max(0, min(len(self.tokens) - 1, self.cursor + step))

    def action_move_to(self, index: int) -> None:
        if self.tokens:
            self.cursor = index % len(self.tokens)

    def action_choose(self) -> None:
        if self.tokens and self.sae_id is not None and self.tokens[self.cursor].features:
            index = self.tokens[self.cursor].features[0][0]
            self.post_message(self.Chosen(Feature(self.sae_id, index, self.labels.get(index, ""))))

    @staticmethod
    def _token(text: str) -> str:
        return text.replace("\n", "⏎").replace(" ", "·") or "∅"

    def _strip(self, width: int) -> Text:
        """The tokens around the cursor, the cursor token highlighted, fitted to ``width``."""
        shown = [self._token(t.text) for t in self.tokens]
        start, end = window([len(s) for s in shown], self.cursor, width)
        text = Text()
        for i in range(start, end):
            text.append(f" {shown[i]}" if i != self.cursor else f"[{shown[i]}]",
                        style="reverse bold" if i == self.cursor else "")
        return text

    def render(self) -> RenderableType:
        if not self.tokens:
            return Text("After an answer (with an SAE attached), its tokens and their top features appear here.",
                        style="dim")
        width = self.content_size.width or 60
        token = self.tokens[self.cursor]
        head = Text.assemble((f"token {self.cursor + 1}/{len(self.tokens)} ", "dim"), self._strip(width - 14))
        top = max((v for _, v in token.features), default=0.0) or 1.0
        lines = [head]
        for index, value in token.features:
            filled = round(value / top * BAR)
            lines.append(Text.assemble((f"#{index:<6}", "cyan"), ("█" * filled + "·" * (BAR - filled), "magenta"),
                                       (f" {value:7.2f}  ", ""), (self.labels.get(index, ""), "dim"),
                                       overflow="ellipsis", no_wrap=True))
        if not token.features:
            lines.append(Text("no feature active on this token", style="dim"))
        return Text("\n").join(lines)
