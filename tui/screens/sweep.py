"""A feature's short strength sweep over the main screen: the table of ``millm steer sweep``, the text bars and
the recommended strength."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

if TYPE_CHECKING:
    from millm.research.sweep import SweepResult


def sweep_view(result: SweepResult) -> Group:
    """The sweep as the modal shows it: strength, concept rate, fluency Δ, inside the bound; bars; verdict."""
    from millm.research.plots import bar_lines
    from millm.research.sweep import verdict

    chosen = result.chosen
    table = Table("strength", "concept rate", "fluency Δ", "inside bound?", "relevance Δ", "e.g. (first answer)",
                  title=Text(f"{result.prompts} calibration prompts, {result.tokens} tokens, seed {result.seed}; "
                             f"concept words: {', '.join(result.words)}"))
    for p in result.points:
        table.add_row(f"{p.strength:g}" + (" ←" if p.strength == chosen else ""), f"{p.rate:.0%}",
                      f"{p.fluency:+.2f}", "yes" if p.inside else "no", f"{p.relevance:+.2f}",
                      Text(p.example.replace("\n", " "), no_wrap=True, overflow="ellipsis"))
    return Group(table, Text("\n".join(bar_lines(result.points, bound=result.bound))),
                 Text(f"unsteered: concept rate {result.unsteered_rate:.0%}"), Text(verdict(result), style="bold"))


class SweepScreen(ModalScreen[None]):
    """One feature's sweep; Esc, s or q closes it."""

    BINDINGS = [Binding("escape,s,q", "dismiss", "close")]

    def __init__(self, result: SweepResult) -> None:
        super().__init__()
        self.result = result

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="sweep-box"):
            yield Static(sweep_view(self.result), id="sweep-text")

    def on_mount(self) -> None:
        r = self.result
        self.query_one("#sweep-box").border_title = f"sweep: feature {r.feature} ({r.label or 'no label'}) on {r.sae}"
