"""The steering intensity λ: how strongly the current base (a loaded or active profile, a cluster, a
circuit, or the live values) steers the next answers.

The dial sends ``steering_intensity`` with each answer; the server resolves it against the base under
the intensity rules and echoes the λ it used, which the dial shows beside the value asked for.
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
from millm.steering.intensity import ENVELOPE, Dial, Symbol
from tui.controls import (
    LAMBDA_LARGE_STEP,
    LAMBDA_STEP,
    dial_fraction,
    edit_typed,
    parse_lambda,
    show_dial,
    step_lambda,
)
from tui.widgets.gauge import gauge

TYPED = frozenset("0123456789.")


class IntensityDial(Widget, can_focus=True):
    """λ from off to the envelope's top, or a symbol (min, max) the server resolves per base."""

    BINDINGS = [
        Binding("right,up", f"step({LAMBDA_STEP})", f"λ+{LAMBDA_STEP:g}"),
        Binding("left,down", f"step({-LAMBDA_STEP})", f"λ-{LAMBDA_STEP:g}"),
        Binding("shift+right,shift+up", f"step({LAMBDA_LARGE_STEP})", f"λ+{LAMBDA_LARGE_STEP:g}"),
        Binding("shift+left,shift+down", f"step({-LAMBDA_LARGE_STEP})", f"λ-{LAMBDA_LARGE_STEP:g}"),
        Binding("o", "set('off')", "off"),
        Binding("n", "set('min')", "min"),
        Binding("x", "set('max')", "max"),
        Binding("b", "set(None)", "base"),
    ]

    TYPING = "type a λ from 0 to 2 (0 is off) and Enter to set it; Esc drops it"

    dial: reactive[Dial] = reactive(None)
    typed: reactive[str] = reactive("")
    base: reactive[str] = reactive("live values")
    echoed: reactive[str | None] = reactive(None)
    rung: reactive[str | None] = reactive(None)

    class Changed(Message):
        """The dial for the next answers."""

        def __init__(self, dial: Dial) -> None:
            super().__init__()
            self.dial = dial

    class Refused(Message):
        def __init__(self, message: str) -> None:
            super().__init__()
            self.message = message

    def _echoed_lambda(self) -> float | None:
        try:
            return float(self.echoed) if self.echoed is not None else None
        except ValueError:
            return None

    def _change(self, dial: Dial) -> None:
        if dial != self.dial:
            self.echoed = None  # the echo was for the old dial
        self.dial = dial
        self.post_message(self.Changed(dial))

    def action_step(self, delta: float) -> None:
        self._change(step_lambda(self.dial, delta, self._echoed_lambda()))

    def action_set(self, word: str | None) -> None:
        self._change(Symbol(word) if word is not None else None)

    def answered(self, echoed: str | None, rung: str | None) -> None:
        """What the last answer's response said: the λ used (when a dial applied) and the circuit's rung."""
        self.echoed = echoed
        self.rung = rung

    def on_key(self, event: events.Key) -> None:
        """Digits type a λ; Enter sets it, Backspace edits it, Esc drops it."""
        edited = edit_typed(self.typed, event.key, event.character, TYPED)
        if edited is None:
            return
        self.typed, entered = edited
        if entered is not None:
            try:
                self._change(parse_lambda(entered))
            except InvalidParameter as exc:
                self.post_message(self.Refused(exc.message))
        event.stop()
        event.prevent_default()

    def render(self) -> RenderableType:
        width = self.content_size.width or 40
        low, high = ENVELOPE
        shown = show_dial(self.dial)
        head = Text.assemble(("λ ", "bold"), (shown, "bold magenta"), ("  scales ", "dim"), (self.base, ""),
                             overflow="ellipsis", no_wrap=True)
        if self.echoed is not None:
            head.append(f"  → λ {self.echoed}", style="magenta")
        track = width - len(f"{low:g}") - len(f"{high:g}") - 2
        bar = Text.assemble((f"{low:g} ", "dim"), gauge(dial_fraction(self.dial, self._echoed_lambda()), track,
                                                        style="bold magenta"), (f" {high:g}", "dim"))
        if self.typed:
            foot = Text.assemble(("λ: ", "bold"), (self.typed + "▏", "reverse"), ("  Enter sets, Esc drops", "dim"))
        elif self.rung is not None:
            foot = Text.assemble(("circuit: ", "dim"), (self.rung, "italic"))
        else:
            foot = Text("←→ step · o off · n min · x max · b base", style="dim")
        return Text("\n").join([head, bar, foot])
