"""What the steering screen does with one feature beyond dialling it: its label read by index, its card,
its recommended strength as the dial's step, and a short sweep. ``MainScreen`` builds on this."""

from __future__ import annotations

from textual import work
from textual.screen import Screen

from millm.errors import MillmError
from tui.client import Client, Feature, SAEInfo, SteeringState
from tui.screens.card import CardScreen
from tui.screens.sweep import SweepScreen
from tui.widgets.activation_strip import ActivationStrip
from tui.widgets.feature_search import FeatureSearch
from tui.widgets.steered_list import SteeredList
from tui.widgets.strength_dial import StrengthDial


class FeatureActions(Screen[None]):
    """Labels by index, cards, the recommended step and sweeps, for a screen that holds these attributes."""

    client: Client
    state: SteeringState
    labels: dict[str, dict[int, str]]  # every label seen, per SAE
    _asked: set[tuple[str, int]]  # features whose label was asked for by index
    busy: str

    _labelled: set[str]  # SAEs whose labels were all read

    def set_busy(self, what: str) -> None:
        raise NotImplementedError

    async def read_labels(self, saes: list[SAEInfo]) -> None:
        """Every label of each attached SAE not read yet."""
        for sae in saes:
            if sae.attached_layer is not None and sae.id not in self._labelled:
                self.labels.setdefault(sae.id, {}).update(await self.client.labels(sae.id))
                self._labelled.add(sae.id)

    async def label_of(self, sae_id: str, index: int) -> str:
        """A feature's label: known already, or read from its card (a remote server lists only its first
        labels, so the others come by index from ``GET /api/saes/{id}/features/{index}``)."""
        known = self.labels.get(sae_id, {}).get(index)
        if known or (sae_id, index) in self._asked:
            return known or ""
        self._asked.add((sae_id, index))
        try:
            label = (await self.client.feature(sae_id, index)).label
        except MillmError:
            return ""
        if label:
            self.labels.setdefault(sae_id, {})[index] = label
        return label

    def fill_labels(self, features: list[tuple[str, int]]) -> None:
        """Look up the labels of ``features`` not known yet (once each), then redraw the lists that show them."""
        missing = [(sae, i) for sae, i in dict.fromkeys(features)
                   if not self.labels.get(sae, {}).get(i) and (sae, i) not in self._asked]
        if missing:
            self._fill_labels(missing)

    @work(group="labels")
    async def _fill_labels(self, missing: list[tuple[str, int]]) -> None:
        found = [await self.label_of(sae, i) for sae, i in missing]
        if any(found):
            self.query_one(SteeredList).show(self.state, self.labels)
            strip = self.query_one(ActivationStrip)
            if strip.sae_id is not None:
                strip.labels = self.labels.get(strip.sae_id, {})
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

    @work(exclusive=True, group="recommended")
    async def recommended_step(self, feature: Feature) -> None:
        """The dial's ⇧ step from the feature's recommended strength, when its card has one."""
        try:
            card = await self.client.feature(feature.sae_id, feature.index)
        except MillmError:
            return
        dial = self.query_one(StrengthDial)
        if dial.feature == feature:
            dial.recommended = card.recommended_strength

    def on_strength_dial_sweep(self, message: StrengthDial.Sweep) -> None:
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
