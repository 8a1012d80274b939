"""Every key, by where it works, read from the bindings themselves (so this list cannot go stale)."""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

Section = tuple[str, Iterable[BindingType]]


def _keys(binding: Binding) -> str:
    return " / ".join(k.strip().replace("shift+", "⇧").replace("ctrl+", "^") for k in binding.key.split(","))


def key_table(sections: list[Section], extra: list[tuple[str, str, str]]) -> Table:
    """A table of area, keys and what they do; then ``extra`` rows (where, keys, does) that are not
    bindings (the chat commands, typing on a dial)."""
    table = Table(box=None, show_header=True, header_style="bold", expand=True, padding=(0, 1))
    table.add_column("where", style="cyan", no_wrap=True)
    table.add_column("keys", style="bold", no_wrap=True)
    table.add_column("does")
    for area, bindings in sections:
        first = True
        for b in bindings:
            if not isinstance(b, Binding):
                continue
            table.add_row(area if first else "", _keys(b), b.description or b.action)
            first = False
    previous = ""
    for area, keys, does in extra:
        table.add_row(area if area != previous else "", keys, does)
        previous = area
    return table


class HelpScreen(ModalScreen[None]):
    """The key reference; Esc, F1 or q closes it."""

    BINDINGS = [Binding("escape,f1,q", "dismiss", "close")]

    def __init__(self, sections: list[Section], extra: list[tuple[str, str, str]]) -> None:
        super().__init__()
        self.sections = sections
        self.extra = extra

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(Text("miLLM keys", style="bold"))
            yield Static(key_table(self.sections, self.extra))

    def on_mount(self) -> None:
        self.query_one("#help-box").border_title = "help"
