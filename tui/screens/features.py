"""What the steering screen does with one feature beyond putting it on the strength slider: its label read by index,
its card and a short sweep. ``MainScreen`` builds on this."""

from __future__ import annotations

from textual import work
from textual.screen import Screen

from millm.errors import MillmError
from tui.client import Client, Feature, SteeringState
from tui.labels import LabelBook
from tui.screens.card import CardScreen
from tui.screens.sweep import SweepScreen
from tui.widgets.activation_strip import ActivationStrip
from tui.widgets.feature_search import FeatureSearch
from tui.widgets.steered_list import SteeredList
from tui.widgets.strength_slider import StrengthSlider


class FeatureActions(Screen[None]):
    """Labels by index, cards and sweeps, for a screen that holds these attributes."""

    client: Client
    state: SteeringState
    book: LabelBook  # every label seen, per SAE

    @property
    def busy(self) -> str:
        """What holds the answer slot (an answer, a comparison, a sweep), or "" when it is free."""
        raise NotImplementedError

    def set_busy(self, what: str) -> None:
        raise NotImplementedError

    def fill_labels(self, features: list[tuple[str, int]]) -> None:
        """Look up the labels of ``features`` not known yet (once each), then redraw the lists that show them."""
        if missing := self.book.missing(features):
            self._fill_labels(missing)

    @work(group="labels")
    async def _fill_labels(self, missing: list[tuple[str, int]]) -> None:
        found = [await self.book.label_of(sae, i) for sae, i in missing]
        if any(found):
            self.query_one(SteeredList).show(self.state, self.book.labels)
            strip = self.query_one(ActivationStrip)
            if strip.sae_id is not None:
                strip.labels = self.book.of(strip.sae_id)
                strip.refresh(layout=True)

    def on_feature_search_card(self, message: FeatureSearch.Card) -> None:
        self.show_card(message.feature)

    def on_steered_list_card(self, message: SteeredList.Card) -> None:
        self.show_card(message.feature)

    @work(group="card")
    async def show_card(self, feature: Feature) -> None:
        try:
            card = await self.client.feature(feature.sae_id, feature.index)
        except MillmError as exc:
            self.notify(exc.message, severity="error", title="no card")
            return
        await self.app.push_screen(CardScreen(card))

    def on_strength_slider_sweep(self, message: StrengthSlider.Sweep) -> None:
        if self.busy:
            self.notify(f"wait until {self.busy} is done", severity="warning", title="not swept")
            return
        self.set_busy("sweeping")
        self.run_sweep(message.feature)

    @work(exclusive=True, group="answer")
    async def run_sweep(self, feature: Feature) -> None:
        """A short sweep of the feature (no answer runs meanwhile), shown in a modal."""
        self.notify(f"sweeping feature {feature.index} ...", title="sweep")
        try:
            result = await self.client.sweep(feature.sae_id, feature.index)
        except MillmError as exc:
            self.notify(exc.message, severity="error", title="not swept")
            return
        finally:
            self.set_busy("")
        await self.app.push_screen(SweepScreen(result))
