"""The main screen's right pane: the chat (or compare mode: one prompt answered unsteered, then steered, with
one seed), what the model computed, monitoring, sampling and the prompt.

Every call to miLLM runs in a Textual worker, so the screen redraws while an answer streams. The pane sets
the screen's busy state as it starts and ends an answer (at once: a second Enter must find it set), and posts
what an answer computed (``tui.messages``) to the screen, which holds the steering state.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ContentSwitcher, Input

from millm.errors import MillmError
from millm.steering.readout import SAE_ACTIVATIONS_MAX_ENTRIES
from tui.client import READOUT_TOP_K, ChatResult, Done, Feature
from tui.messages import Answered, Dial
from tui.session import Conversation, Steer, chat_body, compare_bodies, sampling_fields
from tui.widgets.activation_strip import ActivationStrip
from tui.widgets.chat_log import ChatLog
from tui.widgets.compare_view import CompareView
from tui.widgets.message_box import MessageBox
from tui.widgets.monitor_panel import MonitorPanel
from tui.widgets.sampling_form import SamplingForm

if TYPE_CHECKING:
    from tui.screens.main import MainScreen

MONITOR_POLL = 1.0  # seconds between reads of the monitoring history while an answer runs
CHAT_COMMANDS = {"Enter": "send the prompt (in compare mode: answer it unsteered and steered)",
                 "/reset": "forget this chat's history",
                 "/system TEXT": "set the system prompt (and forget the history)"}


class ChatPane(Vertical):
    """The conversation and what each answer computed; the screen holds who steers it."""

    def __init__(self, sampling: dict[str, str], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.sampling_defaults = sampling

    @property
    def main(self) -> MainScreen:
        return self.screen  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        with ContentSwitcher(initial="chat", id="answers"):
            yield ChatLog(id="chat")
            yield CompareView(id="compare")
        yield ActivationStrip(id="strip")
        yield MonitorPanel(id="monitor")
        yield SamplingForm(self.sampling_defaults, id="sampling")
        yield Input(placeholder="ask something · /reset forgets the history · F1 help", id="prompt")

    def on_mount(self) -> None:
        self.set_interval(MONITOR_POLL, self._poll_while_answering)

    def _poll_while_answering(self) -> None:
        if self.main.busy and self.main.watched:
            self.poll_monitor()

    def show_compare(self, on: bool) -> None:
        self.query_one(ContentSwitcher).current = "compare" if on else "chat"

    def on_activation_strip_chosen(self, message: ActivationStrip.Chosen) -> None:
        message.stop()
        self.post_message(Dial(message.feature))

    # the prompt
    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "prompt":
            return
        event.stop()
        text, main = event.value.strip(), self.main
        if not text:
            return
        if main.busy:
            self.notify("An answer is streaming; Esc cancels it.", severity="warning")
            return
        event.input.value = ""
        if text == "/reset":
            main.conversation.reset()
            self.query_one("#chat", ChatLog).clear()
            self.query_one(CompareView).clear()
            self.notify("history forgotten")
        elif text.startswith("/system"):
            main.conversation.system = text.removeprefix("/system").strip() or None
            main.conversation.reset()
            self.query_one("#chat", ChatLog).clear()
            self.notify(f"system prompt: {main.conversation.system or '(none)'}")
        else:  # busy from now, so a second Enter cannot start (and so cancel) another answer
            main.set_busy("comparing" if main.compare else "generating")
            (self.run_compare if main.compare else self.run_answer)(text)

    def readout_sae(self, sampling: dict[str, object]) -> str | None:
        """The SAE the strip reads: the chosen one if attached, else the first attached; none when the answer
        could be too long for a read-out of every token."""
        max_tokens = sampling.get("max_tokens")
        if isinstance(max_tokens, int) and max_tokens * READOUT_TOP_K > SAE_ACTIVATIONS_MAX_ENTRIES:
            return None
        chosen = self.main.chosen_sae()
        if chosen is not None and chosen.attached_layer is not None:
            return chosen.id
        attached = [s for s in self.main.saes if s.attached_layer is not None]
        return attached[0].id if attached else None

    def body(self, messages: list[dict[str, object]]) -> dict[str, object]:
        main = self.main
        sampling = sampling_fields(self.query_one(SamplingForm).fields())
        steerable = main.info.steerable
        steer = Steer(main.dial if steerable else None, main.loaded_profile if steerable else None,
                      self.readout_sae(sampling) if steerable else None)
        return chat_body(main.info.model_id, messages, sampling, steer)

    # answers
    async def stream_into(self, body: dict[str, object], box: MessageBox, log: ChatLog) -> ChatResult | None:
        """Stream one answer into ``box``; None when it was refused (cancelling raises, as cancelling does)."""
        result: ChatResult | None = None
        try:
            async for event in self.main.client.chat(body):
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
        conversation = self.main.conversation
        try:
            body = self.body(conversation.messages(prompt))
            log = self.query_one("#chat", ChatLog)
            log.add("you", prompt)
            result = await self.stream_into(body, log.add(self.main.info.model_id), log)
        finally:
            self.main.set_busy("")
        if result is not None:
            conversation.add(prompt, result.text)
            self.answered(result)

    @work(exclusive=True, group="answer")
    async def run_compare(self, prompt: str) -> None:
        """The prompt alone (after the system prompt), unsteered then steered, with one seed."""
        try:
            off, on = compare_bodies(self.body(Conversation(self.main.conversation.system).messages(prompt)))
            view = self.query_one(CompareView)
            box_off, box_on = view.begin(prompt, on["seed"])
            self.main.set_busy("comparing: unsteered")
            unsteered = await self.stream_into(off, box_off, view.column("unsteered"))
            if unsteered is None:
                return
            self.main.set_busy("comparing: steered")
            steered = await self.stream_into(on, box_on, view.column("steered"))
        finally:
            self.main.set_busy("")
        if steered is not None:
            same = steered.text == unsteered.text
            box_on.border_title = f"model · {'same as' if same else 'differs from'} unsteered"
            self.answered(steered)

    def answered(self, result: ChatResult) -> None:
        """Show what the answer computed; the screen re-reads how it was steered."""
        labels = self.main.labels.get(result.readout_sae, {}) if result.readout_sae else {}
        self.query_one(ActivationStrip).show(result.readout_sae, result.tokens, labels)
        self.post_message(Answered(result))

    # monitoring
    def show_watched(self, features: list[Feature]) -> None:
        self.query_one(MonitorPanel).watch_features(features)
        self.poll_monitor()

    @work(exclusive=True, group="monitor")
    async def poll_monitor(self) -> None:
        try:
            history = await self.main.client.monitor_history()
        except MillmError:
            return
        self.query_one(MonitorPanel).update_history(history)
