"""The steering screen: the steering pane on the left, the chat pane on the right (``steering_pane``,
``chat_pane``), and what they share: the live steering state, the labels seen, the loaded profile and the
status line. The panes tell the screen what they learn and ask (``tui.messages``); the screen hands them their
client at the start and tells them what to show, never the other way round. The dial and a loaded profile apply
from the next answer.
"""

from __future__ import annotations

from collections.abc import Awaitable

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer, Header

from millm.errors import MillmError
from millm.steering.intensity import Dial
from tui.client import Client, Feature, ModelInfo, SAEInfo, SteeringState
from tui.labels import LabelBook
from tui.messages import Answered, Asked, Busy, PutOnSlider, Refresh, SteeringRead, SteerTyped, Watching
from tui.screens.chat_pane import CHAT_COMMANDS, ChatPane
from tui.screens.features import FeatureActions
from tui.screens.profiles import ProfileActions
from tui.screens.steering_pane import SteeringPane
from tui.session import Conversation, SteeringFields
from tui.widgets.feature_search import FeatureSearch
from tui.widgets.intensity_dial import IntensityDial
from tui.widgets.status_line import Status, StatusLine

__all__ = ["CHAT_COMMANDS", "MainScreen"]
TITLES = (("#saes", "SAEs"), ("#search", "features"), ("#steered", "steered now"), ("#strength", "strength"),
          ("#intensity", "intensity"), ("#chat", "chat"), ("#strip", "what the model computed"),
          ("#monitor", "monitoring"), ("#sampling", "sampling"))


class MainScreen(FeatureActions, ProfileActions):
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
        self.client, self.info = client, info
        self.sampling_defaults = sampling or {}
        self.conversation = Conversation()
        self.state = SteeringState()
        self.saes: list[SAEInfo] = []
        self.book = LabelBook(client)  # every label seen, per SAE
        self.loaded_profile: str | None = None
        self.circuit: str | None = None
        self.compare = False
        self.watched: list[Feature] = []

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            yield SteeringPane(self.client, self.book, id="features-pane")
            yield ChatPane(self.client, self.info, self.conversation, self.sampling_defaults, id="chat-pane")
        yield StatusLine(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "miLLM"
        self.sub_title = f"{self.info.model_id} · {self.info.engine} · {self.info.where}"
        for selector, title in TITLES:
            self.query_one(selector).border_title = title
        self.query_one(SteeringPane).disabled = not self.info.steerable
        self.query_one("#prompt").focus()
        self.show_status()
        self.refresh_all()

    # the shared state, shown
    def show_status(self) -> None:
        self.query_one(StatusLine).show(Status(self.state, self.loaded_profile, self.circuit, self.compare, self.busy))
        self.query_one(IntensityDial).base = (f"profile {self.loaded_profile}" if self.loaded_profile
                                              else f"active profile {self.state.active_profile}"
                                              if self.state.active_profile else "the live values")

    def show_state(self, state: SteeringState) -> None:
        """The steering pane's lists, slider and dial, the labels they need, and the status line."""
        self.state = state
        self.query_one(SteeringPane).show_state(state)
        self.fill_labels([(sae, index) for sae, values in state.values.items() for index in values])
        self.show_status()

    @property
    def busy(self) -> str:
        """What holds the answer slot (the chat pane's: an answer, a comparison, a sweep), or "" when it is free."""
        return self.query_one(ChatPane).busy

    def set_busy(self, what: str) -> None:
        """A sweep takes the answer slot (or frees it), so no answer starts meanwhile."""
        self.query_one(ChatPane).busy = what
        self.show_status()

    def profile_changed(self, loaded: str | None, values_changed: bool) -> None:
        """The profile loaded for chats (``ProfileActions``); the live state read again when it changed."""
        self.loaded_profile = loaded
        self.show_status()
        if values_changed:
            self.refresh_all()

    def readout_sae(self) -> str | None:
        """The SAE an answer's strip reads: the chosen one if attached, else the first attached."""
        chosen = self.query_one(SteeringPane).chosen_sae
        if chosen is not None and chosen.attached_layer is not None:
            return chosen.id
        attached = [s for s in self.saes if s.attached_layer is not None]
        return attached[0].id if attached else None

    def steering_fields(self) -> SteeringFields:
        """How the next answer is steered: the dial, the loaded profile, the SAE to read (none unsteerable)."""
        if not self.info.steerable:
            return SteeringFields()
        return SteeringFields(self.dial, self.loaded_profile, self.readout_sae())

    @property
    def dial(self) -> Dial:
        return self.query_one(IntensityDial).dial

    @work(exclusive=True, group="refresh")
    async def refresh_all(self) -> None:
        """Reload SAEs, labels of attached SAEs, live values and the active circuit."""
        if not self.info.steerable:
            self.query_one(FeatureSearch).show([], f"{self.info.engine} models cannot be steered")
            return
        try:
            self.saes = await self.client.saes()
            await self.book.read_attached(self.saes)
            state = await self.client.steering()
            self.circuit = await self.client.active_circuit()
        except MillmError as exc:
            self.notify(exc.message, severity="error")
            return
        self.query_one(SteeringPane).show_saes(self.saes)
        self.show_state(state)

    # what the panes tell
    def on_steering_read(self, message: SteeringRead) -> None:
        self.show_state(message.state)

    def on_refresh(self, message: Refresh) -> None:
        self.refresh_all()

    def on_put_on_slider(self, message: PutOnSlider) -> None:
        self.query_one(SteeringPane).put_on_slider(message.feature)

    def on_steer_typed(self, message: SteerTyped) -> None:
        if not self.info.steerable:
            self.notify(f"{self.info.engine} models cannot be steered.", severity="error", title="not steered")
            return
        self.query_one(SteeringPane).steer_typed(message.text)

    def on_watching(self, message: Watching) -> None:
        self.watched = message.features
        self.query_one(ChatPane).show_watched(message.features)

    def on_intensity_dial_changed(self, message: IntensityDial.Changed) -> None:
        self.show_status()

    def on_busy(self, message: Busy) -> None:
        self.show_status()

    def on_asked(self, message: Asked) -> None:
        self.query_one(ChatPane).answer(message.prompt, self.steering_fields())

    @work(group="answered")
    async def on_answered(self, message: Answered) -> None:
        """How the answer was steered, the labels its read-out shows, and the live state read again."""
        result = message.result
        self.query_one(ChatPane).show_readout(result, self.book.of(result.readout_sae))
        self.query_one(IntensityDial).answered(result.intensity, result.rung)
        if result.readout_sae:
            self.fill_labels([(result.readout_sae, index) for token in result.tokens for index, _ in token.features])
        if self.info.steerable:
            try:
                self.show_state(await self.client.steering())
            except MillmError as exc:
                self.notify(exc.message, severity="error")
        if self.watched:
            self.query_one(ChatPane).poll_monitor()

    # actions
    def action_dial(self, word: str | None) -> None:
        self.query_one(IntensityDial).action_set(word)

    def action_cancel(self) -> None:
        if self.busy:
            self.workers.cancel_group(self.query_one(ChatPane), "answer")

    def action_compare(self) -> None:
        self.compare = not self.compare
        self.query_one(ChatPane).show_compare(self.compare)
        self.show_status()

    @work(group="steer-all")
    async def action_toggle_steering(self) -> None:
        if self.info.steerable:
            await self._steering_call(self.client.set_enabled(not self.state.enabled))

    @work(group="steer-all")
    async def action_clear_values(self) -> None:
        if self.info.steerable and await self._steering_call(self.client.clear()):
            self.notify("live values cleared")

    async def _steering_call(self, call: Awaitable[SteeringState]) -> bool:
        try:
            self.show_state(await call)
        except MillmError as exc:
            self.notify(exc.message, severity="error")
            return False
        return True
