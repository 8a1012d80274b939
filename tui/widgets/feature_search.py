"""Search an SAE's features by label as you type; pick one to put it on the strength slider."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, OptionList
from textual.widgets.option_list import Option

from tui.client import Feature


class FeatureResults(OptionList):
    """The matches of the search; Enter puts one on the strength slider, w watches it, i shows its card."""

    BINDINGS = [Binding("w", "watch", "watch"), Binding("i", "card", "feature card")]

    def action_watch(self) -> None:
        parent = self.parent
        if isinstance(parent, FeatureSearch) and (feature := parent.highlighted()) is not None:
            self.post_message(FeatureSearch.Watch(feature))

    def action_card(self) -> None:
        parent = self.parent
        if isinstance(parent, FeatureSearch) and (feature := parent.highlighted()) is not None:
            self.post_message(FeatureSearch.Card(feature))


class FeatureSearch(Vertical):
    """A search box over the chosen SAE's labels and the features it matches."""

    class Query(Message):
        """The search text changed."""

        def __init__(self, query: str) -> None:
            super().__init__()
            self.query = query

    class Chosen(Message):
        """A feature was picked for the strength slider."""

        def __init__(self, feature: Feature) -> None:
            super().__init__()
            self.feature = feature

    class Watch(Message):
        """Add (or remove) a feature among the monitored ones."""

        def __init__(self, feature: Feature) -> None:
            super().__init__()
            self.feature = feature

    class Card(Message):
        """Show a feature's card."""

        def __init__(self, feature: Feature) -> None:
            super().__init__()
            self.feature = feature

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.features: list[Feature] = []

    def compose(self) -> ComposeResult:
        yield Input(placeholder="search labels, or a feature index", id="search-input")
        yield FeatureResults(id="search-results")

    @property
    def query_text(self) -> str:
        return self.query_one("#search-input", Input).value

    def show(self, features: list[Feature], note: str = "") -> None:
        """The matches, best first (or a note when there are none)."""
        self.features = features
        results = self.query_one("#search-results", FeatureResults)
        if not features:
            results.set_options([Option(Text(note or "no match", style="dim"), disabled=True)])
            return
        results.set_options([Option(Text.assemble((f"#{f.index:<6}", "bold cyan"), f.label or "(no label)"))
                             for f in features])
        results.highlighted = 0

    def highlighted(self) -> Feature | None:
        index = self.query_one("#search-results", FeatureResults).highlighted
        return self.features[index] if index is not None and 0 <= index < len(self.features) else None

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Query(event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in the box picks the best match."""
        event.stop()
        if self.features:
            self.post_message(self.Chosen(self.features[0]))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if 0 <= event.option_index < len(self.features):
            self.post_message(self.Chosen(self.features[event.option_index]))
