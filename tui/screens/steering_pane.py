"""The main screen's left pane: the SAEs, the feature search, what is steered now, and the strength and
intensity dials.

Strength changes are sent one at a time in the order made (rapid key repeats coalesce to the latest value
per feature); each is an engine command applied between two decode steps, so a change made while an answer
streams steers the rest of that answer when it runs on the live values (the TUI is an operator: operator
wins). The screen hands the pane its client and label book and shows the live steering here (``show_state``);
what the pane learns of the live steering it posts to the screen (``tui.messages``).
"""

from __future__ import annotations

import asyncio

from textual import on, work
from textual.app import ComposeResult
from textual.containers import VerticalScroll

from millm.errors import MillmError
from millm.sae.cards import index_of
from tui.client import Client, Feature, SAEInfo, SteeringState
from tui.labels import LabelBook
from tui.messages import Refresh, SteeringRead, Watching
from tui.steer import items_of, resolve
from tui.widgets.feature_search import FeatureSearch
from tui.widgets.intensity_dial import IntensityDial
from tui.widgets.sae_list import SAEList
from tui.widgets.steered_list import SteeredList
from tui.widgets.strength_slider import StrengthSlider

SEARCH_DEBOUNCE = 0.15


class SteeringPane(VerticalScroll):
    """SAEs, features, the strength slider and the intensity dial; the screen holds the steering state they show and
    tells it here."""

    def __init__(self, client: Client, book: LabelBook, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.client, self.book = client, book
        self.state = SteeringState()  # the live steering as the screen last showed it
        self.watched: list[Feature] = []  # the features monitoring follows
        self.pending: dict[tuple[str, int], float] = {}  # strengths not sent yet, the latest per feature
        self._flushing = False

    def compose(self) -> ComposeResult:
        yield SAEList(id="saes")
        yield FeatureSearch(id="search")
        yield SteeredList(id="steered")
        yield StrengthSlider(id="strength")
        yield IntensityDial(id="intensity")

    # what the screen shows here
    def show_state(self, state: SteeringState) -> None:
        """The steered list and the strength slider's value (unless a newer one is on its way)."""
        self.state = state
        self.query_one(SteeredList).show(state, self.book.labels)
        slider = self.query_one(StrengthSlider)
        if slider.feature is not None and (slider.feature.sae_id, slider.feature.index) not in self.pending:
            slider.value = state.values.get(slider.feature.sae_id, {}).get(slider.feature.index, 0.0)

    def show_saes(self, saes: list[SAEInfo]) -> None:
        self.query_one(SAEList).show(saes)
        self.run_search(self.query_one(FeatureSearch).query_text)

    @property
    def chosen_sae(self) -> SAEInfo | None:
        return self.query_one(SAEList).selected

    # SAEs
    @on(SAEList.Chosen)
    def sae_chosen(self, message: SAEList.Chosen) -> None:
        self.run_search(self.query_one(FeatureSearch).query_text)

    @on(SAEList.Attach)
    def sae_attach(self, message: SAEList.Attach) -> None:
        self.change_attachment(message.sae, attach=True)

    @on(SAEList.Detach)
    def sae_detach(self, message: SAEList.Detach) -> None:
        self.change_attachment(message.sae, attach=False)

    @work(group="attach")
    async def change_attachment(self, sae: SAEInfo, attach: bool) -> None:
        self.notify(f"{'attaching' if attach else 'detaching'} {sae.name} …", timeout=2)
        client = self.client
        try:
            await (client.attach(sae.id) if attach else client.detach(sae.id))
        except MillmError as exc:
            self.notify(exc.message, severity="error", title="not attached" if attach else "not detached")
            return
        self.post_message(Refresh())

    # features
    def on_feature_search_query(self, message: FeatureSearch.Query) -> None:
        self.run_search(message.query)

    @work(exclusive=True, group="search")
    async def run_search(self, query: str) -> None:
        await asyncio.sleep(SEARCH_DEBOUNCE)  # a newer keystroke cancels this one first
        search = self.query_one(FeatureSearch)
        sae = self.chosen_sae
        if sae is None:
            search.show([], "register an SAE (millm sae add) to search its features")
            return
        text = query.strip().removeprefix("#")
        if (index := index_of(text)) is not None:
            found = [Feature(sae.id, index, await self.book.label_of(sae.id, index))] if 0 <= index < sae.d_sae else []
            search.show(found, f"{sae.name} has features 0-{sae.d_sae - 1}")
            return
        try:
            features = await self.client.search(sae.id, text)
        except MillmError as exc:
            search.show([], exc.message)
            return
        self.book.add(sae.id, {f.index: f.label for f in features})
        search.show(features, f"no label of {sae.name} contains {text!r}" if text else f"{sae.name} has no labels")

    def put_on_slider(self, feature: Feature) -> None:
        """Put ``feature`` on the strength slider, at its live strength."""
        value = self.state.values.get(feature.sae_id, {}).get(feature.index, 0.0)
        slider = self.query_one(StrengthSlider)
        slider.show(feature, value)
        slider.focus()
        self.recommended_step(feature)

    @work(exclusive=True, group="recommended")
    async def recommended_step(self, feature: Feature) -> None:
        """The slider's ⇧ step from the feature's recommended strength, when its card has one."""
        try:
            card = await self.client.feature(feature.sae_id, feature.index)
        except MillmError:
            return
        slider = self.query_one(StrengthSlider)
        if slider.feature == feature:
            slider.recommended = card.recommended_strength
            slider.held_out = card.held_out.describe() if card.held_out is not None else ""

    def on_feature_search_chosen(self, message: FeatureSearch.Chosen) -> None:
        self.put_on_slider(message.feature)

    def on_steered_list_chosen(self, message: SteeredList.Chosen) -> None:
        self.put_on_slider(message.feature)

    def on_steered_list_remove(self, message: SteeredList.Remove) -> None:
        self.set_strength(message.feature, 0.0)

    def on_strength_slider_set(self, message: StrengthSlider.Set) -> None:
        self.set_strength(message.feature, message.strength)

    def on_strength_slider_refused(self, message: StrengthSlider.Refused) -> None:
        self.notify(message.message, severity="error")

    @work(group="steer-typed")
    async def steer_typed(self, text: str) -> None:
        """``/steer ITEMS`` on the chosen SAE (``tui.steer``): every item resolved first, then each strength
        queued as the slider queues it; the notification says what was set and which recommended strength a
        feature named alone took, or why nothing was."""
        try:
            steer = await resolve(self.client, self.chosen_sae, items_of(text))
        except MillmError as exc:
            self.notify(exc.message, severity="error", title="not steered")
            return
        for index, strength in steer.values.items():
            self.set_strength(Feature(steer.sae.id, index), strength)
        self.notify(steer.summary(), title="steered")

    def set_strength(self, feature: Feature, strength: float) -> None:
        """Queue a strength; the sender applies queued strengths one by one, the latest per feature."""
        self.pending[(feature.sae_id, feature.index)] = strength
        if not self._flushing:
            self._flushing = True
            self._send_strengths()

    @work(group="steer")
    async def _send_strengths(self) -> None:
        client = self.client
        try:
            while self.pending:
                (sae_id, index), strength = next(iter(self.pending.items()))
                del self.pending[(sae_id, index)]
                try:
                    state = await client.set_strength(sae_id, index, strength)
                except MillmError as exc:
                    self.notify(exc.message, severity="error", title="not set")
                    try:
                        state = await client.steering()
                    except MillmError:
                        continue
                self.post_message(SteeringRead(state))
        finally:
            self._flushing = False

    # monitoring
    def on_feature_search_watch(self, message: FeatureSearch.Watch) -> None:
        self.toggle_watch(message.feature)

    def on_steered_list_watch(self, message: SteeredList.Watch) -> None:
        self.toggle_watch(message.feature)

    @work(group="watch")
    async def toggle_watch(self, feature: Feature) -> None:
        """Watch or stop watching a feature; monitoring follows one SAE, so another SAE's feature starts over."""
        same = [f for f in self.watched if f.sae_id == feature.sae_id]
        keys = [(f.sae_id, f.index) for f in same]
        watched = [f for f in same if f.index != feature.index] if (feature.sae_id, feature.index) in keys \
            else same + [feature]
        try:
            await self.client.watch(feature.sae_id, [f.index for f in watched])
        except MillmError as exc:
            self.notify(exc.message, severity="error", title="not watched")
            return
        self.watched = watched
        self.post_message(Watching(watched))

    # intensity
    def on_intensity_dial_refused(self, message: IntensityDial.Refused) -> None:
        self.notify(message.message, severity="error")
