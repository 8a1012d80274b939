"""A feature's card over the main screen: label, firing rate, max-activating examples, promoted tokens."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from millm.render.card import card_text
from millm.sae.cards import FeatureCard


class CardScreen(ModalScreen[None]):
    """One feature's card (``millm.sae.cards.read_card``); Esc, i or q closes it."""

    BINDINGS = [Binding("escape,i,q", "dismiss", "close")]

    def __init__(self, card: FeatureCard) -> None:
        super().__init__()
        self.card = card

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="card-box"):
            yield Static(card_text(self.card), id="card-text")

    def on_mount(self) -> None:
        self.query_one("#card-box").border_title = f"feature {self.card.index}"
