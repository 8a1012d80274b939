"""The selected feature's strength: arrows step it, a typed number sets it, 0 removes it.

Values clamp at the engine's steering limit (``millm.steering.values``) as the hooks clamp them.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from millm.errors import InvalidParameter
from millm.steering.values import STRENGTH_LIMIT
from tui.client import Feature
from tui.controls import STRENGTH_LARGE_STEP, STRENGTH_STEP, edit_typed, large_step, parse_strength, step_strength
from tui.widgets.gauge import gauge

TYPED = frozenset("0123456789.-+")


class StrengthSlider(Widget, can_focus=True):
    """A slider over ±STRENGTH_LIMIT for one feature of one attached SAE."""

    BINDINGS = [
        Binding("right,up", f"step({STRENGTH_STEP})", f"+{STRENGTH_STEP:g}"),
        Binding("left,down", f"step({-STRENGTH_STEP})", f"-{STRENGTH_STEP:g}"),
        Binding("shift+right,shift+up", "step_large(1)", f"+{STRENGTH_LARGE_STEP:g}"),
        Binding("shift+left,shift+down", "step_large(-1)", f"-{STRENGTH_LARGE_STEP:g}"),
        Binding("delete,backspace", "remove", "remove"),
        Binding("s", "sweep", "sweep its strengths", show=False),
    ]
    TYPING = "type a number and Enter to set it (0 removes); Esc drops it"

    feature: reactive[Feature | None] = reactive(None)
    value: reactive[float] = reactive(0.0)
    typed: reactive[str] = reactive("")
    recommended: reactive[float | None] = reactive(None)  # the feature's measured strength, when known
    held_out: reactive[str] = reactive("")  # what that strength rests on: its held-out rate and interval

    class Set(Message):
        """Set ``feature``'s strength (0 removes it)."""

        def __init__(self, feature: Feature, strength: float) -> None:
            super().__init__()
            self.feature = feature
            self.strength = strength

    class Sweep(Message):
        """Sweep ``feature`` over strengths (``millm steer sweep``'s measures)."""

        def __init__(self, feature: Feature) -> None:
            super().__init__()
            self.feature = feature

    class Refused(Message):
        """A typed value that is not a strength."""

        def __init__(self, message: str) -> None:
            super().__init__()
            self.message = message

    def show(self, feature: Feature | None, value: float) -> None:
        """Put ``feature`` (at ``value``) on the slider."""
        self.feature = feature
        self.value = value
        self.typed = ""
        self.recommended = None
        self.held_out = ""

    def _set(self, strength: float) -> None:
        if self.feature is None:
            return
        self.value = strength
        self.post_message(self.Set(self.feature, strength))

    def action_step(self, delta: float) -> None:
        self._set(step_strength(self.value, delta))

    def action_step_large(self, sign: int) -> None:
        self._set(step_strength(self.value, sign * large_step(self.recommended)))

    def action_sweep(self) -> None:
        if self.feature is not None:
            self.post_message(self.Sweep(self.feature))

    def action_remove(self) -> None:
        self._set(0.0)

    def on_key(self, event: events.Key) -> None:
        """Digits start (and extend) a typed value; Enter sets it, Backspace edits it, Esc drops it."""
        if self.feature is None:
            return
        edited = edit_typed(self.typed, event.key, event.character, TYPED)
        if edited is None:
            return
        self.typed, entered = edited
        if entered is not None:
            try:
                self._set(parse_strength(entered))
            except InvalidParameter as exc:
                self.post_message(self.Refused(exc.message))
        event.stop()
        event.prevent_default()

    def render(self) -> RenderableType:
        width = self.content_size.width or 40
        if self.feature is None:
            return Text("search a feature, or Enter on a steered one", style="dim")
        f = self.feature
        head = Text.assemble((f"#{f.index} ", "bold cyan"), (f.label or "(no label)", ""),
                             overflow="ellipsis", no_wrap=True)
        limit = f"{STRENGTH_LIMIT:g}"
        value = f"{self.value:+.1f}"
        track = width - len(limit) * 2 - 4 - len(value) - 1
        style = "bold green" if self.value > 0 else "bold red" if self.value < 0 else "bold"
        bar = Text.assemble((f"-{limit} ", "dim"),
                            gauge((self.value + STRENGTH_LIMIT) / (2 * STRENGTH_LIMIT), track, 0.5, style),
                            (f" +{limit} ", "dim"), (value, style))
        if self.typed:
            foot = Text.assemble(("set: ", "bold"), (self.typed + "▏", "reverse"), ("  Enter sets, Esc drops", "dim"))
        elif self.recommended is not None:
            held = f", {self.held_out}" if self.held_out else ""
            foot = Text(f"←→ ±{STRENGTH_STEP:g}  ⇧ ±{large_step(self.recommended):g} (recommended "
                        f"{self.recommended:g}{held})  0-9 set  Del removes  s sweep", style="dim")
        else:
            foot = Text(f"←→ ±{STRENGTH_STEP:g}  ⇧ ±{STRENGTH_LARGE_STEP:g}  0-9 set  Del removes", style="dim")
        return Text("\n").join([head, bar, foot])
