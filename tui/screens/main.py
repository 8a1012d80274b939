"""The steering screen: features and dials on the left, the chat (or compare mode) on the right.

Every call to miLLM runs in a Textual worker, so the screen redraws while an answer streams or an SAE
loads. Strength changes are sent one at a time in the order made (rapid key repeats coalesce to the
latest value per feature); each is an engine command applied between two decode steps, so a change
made while an answer streams steers the rest of that answer when it runs on the live values (the TUI
is an operator: operator wins), and the dial and a loaded profile apply from the next answer.
"""

from __future__ import annotations

import asyncio

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import ContentSwitcher, Footer, Header, Input

from millm.errors import MillmError
from millm.sae.cards import index_of
from millm.steering.intensity import Dial
from millm.steering.readout import SAE_ACTIVATIONS_MAX_ENTRIES
from tui.client import READOUT_TOP_K, ChatResult, Client, Done, Feature, ModelInfo, SAEInfo, SteeringState
from tui.screens.features import FeatureActions
from tui.screens.profiles import ProfilesOutcome, ProfilesScreen
from tui.screens.prompt import TextPrompt
from tui.session import Conversation, Steer, chat_body, compare_bodies, sampling_fields
from tui.widgets.activation_strip import ActivationStrip
from tui.widgets.chat_log import ChatLog
from tui.widgets.compare_view import CompareView
from tui.widgets.feature_search import FeatureSearch
from tui.widgets.intensity_dial import IntensityDial
from tui.widgets.message_box import MessageBox
from tui.widgets.monitor_panel import MonitorPanel
from tui.widgets.sae_list import SAEList
from tui.widgets.sampling_form import SamplingForm
from tui.widgets.status_line import Status, StatusLine
from tui.widgets.steered_list import SteeredList
from tui.widgets.strength_dial import StrengthDial

SEARCH_DEBOUNCE = 0.15
MONITOR_POLL = 1.0
CHAT_COMMANDS = {"Enter": "send the prompt (in compare mode: answer it unsteered and steered)",
                 "/reset": "forget this chat's history",
                 "/system TEXT": "set the system prompt (and forget the history)"}


class MainScreen(FeatureActions):
    """Steer on the left, talk on the right."""

    BINDINGS = [
        Binding("escape", "cancel", "cancel answer"),
        Binding("f2", "profiles", "profiles"),
        Binding("f3", "compare", "compare mode"),
        Binding("f4", "toggle_steering", "steering on/off"),
        Binding("f5", "dial('off')", "λ off"),
        Binding("f6", "dial('min')", "λ min"),
        Binding("f7", "dial('max')", "λ max"),
        Binding("f8", "dial(None)", "λ base"),
        Binding("ctrl+f", "focus('#search-input')", "find a feature"),
        Binding("ctrl+t", "focus('#prompt')", "type a prompt"),
        Binding("ctrl+s", "save_profile", "save as profile"),
        Binding("ctrl+r", "clear_values", "clear live values"),
    ]

    def __init__(self, client: Client, info: ModelInfo, sampling: dict[str, str] | None = None) -> None:
        super().__init__()
        self.client = client
        self.info = info
        self.sampling_defaults = sampling or {}
        self.conversation = Conversation()
        self.state = SteeringState()
        self.saes: list[SAEInfo] = []
        self.labels: dict[str, dict[int, str]] = {}  # every label seen, per SAE
        self._labelled: set[str] = set()  # SAEs whose labels were all read
        self._asked: set[tuple[str, int]] = set()  # features whose label was asked for by index
        self.loaded_profile: str | None = None
        self.circuit: str | None = None
        self.compare = False
        self.busy = ""
        self.watched: list[Feature] = []
        self.pending: dict[tuple[str, int], float] = {}
        self._flushing = False

    # layout
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            with VerticalScroll(id="features-pane"):
                yield SAEList(id="saes")
                yield FeatureSearch(id="search")
                yield SteeredList(id="steered")
                yield StrengthDial(id="strength")
                yield IntensityDial(id="intensity")
            with Vertical(id="chat-pane"):
                with ContentSwitcher(initial="chat", id="answers"):
                    yield ChatLog(id="chat")
                    yield CompareView(id="compare")
                yield ActivationStrip(id="strip")
                yield MonitorPanel(id="monitor")
                yield SamplingForm(self.sampling_defaults, id="sampling")
                yield Input(placeholder="ask something · /reset forgets the history · F1 help", id="prompt")
        yield StatusLine(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "miLLM"
        self.sub_title = f"{self.info.model_id} · {self.info.engine} · {self.info.where}"
        for selector, title in (("#saes", "SAEs"), ("#search", "features"), ("#steered", "steered now"),
                                ("#strength", "strength"), ("#intensity", "intensity"), ("#chat", "chat"),
                                ("#strip", "what the model computed"), ("#monitor", "monitoring"),
                                ("#sampling", "sampling")):
            self.query_one(selector).border_title = title
        if not self.info.steerable:
            self.query_one("#features-pane").disabled = True
        self.query_one("#prompt", Input).focus()
        self.set_interval(MONITOR_POLL, self._poll_monitor)
        self.show_status()
        self.refresh_all()

    # reading state
    def show_status(self) -> None:
        self.query_one(StatusLine).show(Status(self.state, self.loaded_profile, self.circuit, self.compare, self.busy))
        intensity = self.query_one(IntensityDial)
        intensity.base = (f"profile {self.loaded_profile}" if self.loaded_profile
                          else f"active profile {self.state.active_profile}" if self.state.active_profile
                          else "the live values")

    def show_state(self, state: SteeringState) -> None:
        """The steered list, the dial's value (unless a newer one is on its way) and the status line."""
        self.state = state
        self.query_one(SteeredList).show(state, self.labels)
        self.fill_labels([(sae, index) for sae, values in state.values.items() for index in values])
        dial = self.query_one(StrengthDial)
        if dial.feature is not None and (dial.feature.sae_id, dial.feature.index) not in self.pending:
            dial.value = state.values.get(dial.feature.sae_id, {}).get(dial.feature.index, 0.0)
        self.show_status()

    @work(exclusive=True, group="refresh")
    async def refresh_all(self) -> None:
        """Reload SAEs, labels of attached SAEs, live values and the active circuit."""
        if not self.info.steerable:
            self.query_one(FeatureSearch).show([], f"{self.info.engine} models cannot be steered")
            return
        try:
            self.saes = await self.client.saes()
            for sae in self.saes:
                if sae.attached_layer is not None and sae.id not in self._labelled:
                    self.labels.setdefault(sae.id, {}).update(await self.client.labels(sae.id))
                    self._labelled.add(sae.id)
            state = await self.client.steering()
            self.circuit = await self.client.active_circuit()
        except MillmError as exc:
            self.notify(exc.message, severity="error")
            return
        self.query_one(SAEList).show(self.saes)
        self.show_state(state)
        self.run_search(self.query_one(FeatureSearch).query_text)

    def chosen_sae(self) -> SAEInfo | None:
        return self.query_one(SAEList).selected

    def readout_sae(self, sampling: dict[str, object]) -> str | None:
        """The SAE the strip reads: the chosen one if attached, else the first attached; none when the answer
        could be too long for a read-out of every token."""
        max_tokens = sampling.get("max_tokens")
        if isinstance(max_tokens, int) and max_tokens * READOUT_TOP_K > SAE_ACTIVATIONS_MAX_ENTRIES:
            return None
        chosen = self.chosen_sae()
        if chosen is not None and chosen.attached_layer is not None:
            return chosen.id
        attached = [s for s in self.saes if s.attached_layer is not None]
        return attached[0].id if attached else None

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
        try:
            await (self.client.attach(sae.id) if attach else self.client.detach(sae.id))
        except MillmError as exc:
            self.notify(exc.message, severity="error", title="not attached" if attach else "not detached")
            return
        self.refresh_all()

    # features
    def on_feature_search_query(self, message: FeatureSearch.Query) -> None:
        self.run_search(message.query)

    @work(exclusive=True, group="search")
    async def run_search(self, query: str) -> None:
        await asyncio.sleep(SEARCH_DEBOUNCE)  # a newer keystroke cancels this one first
        search = self.query_one(FeatureSearch)
        sae = self.chosen_sae()
        if sae is None:
            search.show([], "register an SAE (millm sae add) to search its features")
            return
        text = query.strip().removeprefix("#")
        if (index := index_of(text)) is not None:
            found = [Feature(sae.id, index, await self.label_of(sae.id, index))] if 0 <= index < sae.d_sae else []
            search.show(found, f"{sae.name} has features 0-{sae.d_sae - 1}")
            return
        try:
            features = await self.client.search(sae.id, text)
        except MillmError as exc:
            search.show([], exc.message)
            return
        self.labels.setdefault(sae.id, {}).update({f.index: f.label for f in features})
        search.show(features, f"no label of {sae.name} contains {text!r}" if text else f"{sae.name} has no labels")

    def _dial(self, feature: Feature) -> None:
        value = self.state.values.get(feature.sae_id, {}).get(feature.index, 0.0)
        dial = self.query_one(StrengthDial)
        dial.show(feature, value)
        dial.focus()
        self.recommended_step(feature)

    def on_feature_search_chosen(self, message: FeatureSearch.Chosen) -> None:
        self._dial(message.feature)

    def on_steered_list_chosen(self, message: SteeredList.Chosen) -> None:
        self._dial(message.feature)

    def on_activation_strip_chosen(self, message: ActivationStrip.Chosen) -> None:
        self._dial(message.feature)

    def on_steered_list_remove(self, message: SteeredList.Remove) -> None:
        self.set_strength(message.feature, 0.0)

    def on_strength_dial_set(self, message: StrengthDial.Set) -> None:
        self.set_strength(message.feature, message.strength)

    def on_strength_dial_refused(self, message: StrengthDial.Refused) -> None:
        self.notify(message.message, severity="error")

    def set_strength(self, feature: Feature, strength: float) -> None:
        """Queue a strength; the sender applies queued strengths one by one, the latest per feature."""
        self.pending[(feature.sae_id, feature.index)] = strength
        if not self._flushing:
            self._flushing = True
            self._send_strengths()

    @work(group="steer")
    async def _send_strengths(self) -> None:
        try:
            while self.pending:
                (sae_id, index), strength = next(iter(self.pending.items()))
                del self.pending[(sae_id, index)]
                try:
                    state = await self.client.set_strength(sae_id, index, strength)
                except MillmError as exc:
                    self.notify(exc.message, severity="error", title="not set")
                    try:
                        state = await self.client.steering()
                    except MillmError:
                        continue
                self.show_state(state)
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
        self.query_one(MonitorPanel).watch_features(watched)
        self.poll_monitor()

    def _poll_monitor(self) -> None:
        if self.busy and self.watched:
            self.poll_monitor()

    @work(exclusive=True, group="monitor")
    async def poll_monitor(self) -> None:
        try:
            history = await self.client.monitor_history()
        except MillmError:
            return
        self.query_one(MonitorPanel).update_history(history)

    # intensity
    def on_intensity_dial_changed(self, message: IntensityDial.Changed) -> None:
        self.show_status()

    def on_intensity_dial_refused(self, message: IntensityDial.Refused) -> None:
        self.notify(message.message, severity="error")

    def action_dial(self, word: str | None) -> None:
        self.query_one(IntensityDial).action_set(word)

    @property
    def dial(self) -> Dial:
        return self.query_one(IntensityDial).dial

    # chat
    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "prompt":
            return
        event.stop()
        text = event.value.strip()
        if not text:
            return
        if self.busy:
            self.notify("An answer is streaming; Esc cancels it.", severity="warning")
            return
        event.input.value = ""
        if text == "/reset":
            self.conversation.reset()
            self.query_one("#chat", ChatLog).clear()
            self.query_one(CompareView).clear()
            self.notify("history forgotten")
        elif text.startswith("/system"):
            self.conversation.system = text.removeprefix("/system").strip() or None
            self.conversation.reset()
            self.query_one("#chat", ChatLog).clear()
            self.notify(f"system prompt: {self.conversation.system or '(none)'}")
        else:  # busy from now, so a second Enter cannot start (and so cancel) another answer
            self._busy("comparing" if self.compare else "generating")
            (self.run_compare if self.compare else self.run_answer)(text)

    def body(self, messages: list[dict[str, object]]) -> dict[str, object]:
        sampling = sampling_fields(self.query_one(SamplingForm).fields())
        steerable = self.info.steerable
        steer = Steer(self.dial if steerable else None, self.loaded_profile if steerable else None,
                      self.readout_sae(sampling) if steerable else None)
        return chat_body(self.info.model_id, messages, sampling, steer)

    def _busy(self, what: str) -> None:
        self.busy = what
        self.show_status()

    async def stream_into(self, body: dict[str, object], box: MessageBox, log: ChatLog) -> ChatResult | None:
        """Stream one answer into ``box``; None when it was refused (cancelling raises, as cancelling does)."""
        result: ChatResult | None = None
        try:
            async for event in self.client.chat(body):
                if isinstance(event, Done):
                    result = event.result
                else:
                    log.append(box, event.text)
        except asyncio.CancelledError:
            box.stopped("cancelled")
            raise
        except MillmError as exc:
            box.stopped("refused")
            box.append(exc.message)
            self.notify(exc.message, severity="error", title="refused")
            return None
        if result is not None:
            box.finish(result)
        return result

    @work(exclusive=True, group="answer")
    async def run_answer(self, prompt: str) -> None:
        try:
            body = self.body(self.conversation.messages(prompt))
            log = self.query_one("#chat", ChatLog)
            log.add("you", prompt)
            result = await self.stream_into(body, log.add(self.info.model_id), log)
        finally:
            self._busy("")
        if result is not None:
            self.conversation.add(prompt, result.text)
            await self.after_answer(result)

    @work(exclusive=True, group="answer")
    async def run_compare(self, prompt: str) -> None:
        """The prompt alone (after the system prompt), unsteered then steered, with one seed."""
        try:
            off, on = compare_bodies(self.body(Conversation(self.conversation.system).messages(prompt)))
            view = self.query_one(CompareView)
            box_off, box_on = view.begin(prompt, on["seed"])
            self._busy("comparing: unsteered")
            unsteered = await self.stream_into(off, box_off, view.column("unsteered"))
            if unsteered is None:
                return
            self._busy("comparing: steered")
            steered = await self.stream_into(on, box_on, view.column("steered"))
        finally:
            self._busy("")
        if steered is not None:
            same = steered.text == unsteered.text
            box_on.border_title = f"model · {'same as' if same else 'differs from'} unsteered"
            await self.after_answer(steered)

    async def after_answer(self, result: ChatResult) -> None:
        """Show what the answer computed and how it was steered, and re-read the live state."""
        self.query_one(IntensityDial).answered(result.intensity, result.rung)
        labels = self.labels.get(result.readout_sae, {}) if result.readout_sae else {}
        self.query_one(ActivationStrip).show(result.readout_sae, result.tokens, labels)
        if result.readout_sae:
            self.fill_labels([(result.readout_sae, index) for token in result.tokens for index, _ in token.features])
        if self.info.steerable:
            try:
                self.show_state(await self.client.steering())
            except MillmError as exc:
                self.notify(exc.message, severity="error")
        if self.watched:
            self.poll_monitor()

    def action_cancel(self) -> None:
        if self.busy:
            self.workers.cancel_group(self, "answer")

    def action_compare(self) -> None:
        self.compare = not self.compare
        self.query_one(ContentSwitcher).current = "compare" if self.compare else "chat"
        self.show_status()

    # steering as a whole
    @work(group="steer-all")
    async def action_toggle_steering(self) -> None:
        if not self.info.steerable:
            return
        try:
            self.show_state(await self.client.set_enabled(not self.state.enabled))
        except MillmError as exc:
            self.notify(exc.message, severity="error")

    @work(group="steer-all")
    async def action_clear_values(self) -> None:
        if not self.info.steerable:
            return
        try:
            self.show_state(await self.client.clear())
        except MillmError as exc:
            self.notify(exc.message, severity="error")
        else:
            self.notify("live values cleared")

    def action_save_profile(self) -> None:
        self.app.push_screen(TextPrompt("Save the live values as a profile named:"), self._save_profile)

    def _save_profile(self, name: str | None) -> None:
        if name:
            self.save_profile(name)

    @work(group="profiles")
    async def save_profile(self, name: str) -> None:
        try:
            await self.client.save_profile(name)
        except MillmError as exc:
            self.notify(exc.message, severity="error", title="not saved")
            return
        self.notify(f"saved profile {name}")

    def action_profiles(self) -> None:
        self.app.push_screen(ProfilesScreen(self.client, self.loaded_profile), self._profiles_closed)

    def _profiles_closed(self, outcome: ProfilesOutcome | None) -> None:
        if outcome is None:
            return
        self.loaded_profile = outcome.loaded
        self.show_status()
        if outcome.changed:
            self.refresh_all()
