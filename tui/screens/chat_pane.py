"""The main screen's right pane: the chat (or compare mode: one prompt answered unsteered, then steered, with
one seed), what the model computed, monitoring, sampling and the prompt.

Every call to miLLM runs in a Textual worker, so the screen redraws while an answer streams. The pane holds the
answer slot (``busy``): it takes it as Enter is pressed (at once: a second Enter must find it taken) and frees it
when the answer ends, telling the screen each time (``Busy``); a sweep takes it through the screen. A prompt goes
up to the screen (``Asked``), which holds the steering state and answers with how to steer it
(``ChatPane.answer``); what an answer computed goes up too (``Answered``), and comes back to show (``show_readout``).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ContentSwitcher, Input

from millm.errors import MillmError
from millm.steering.readout import SAE_ACTIVATIONS_MAX_ENTRIES
from tui.client import READOUT_TOP_K, ChatResult, Client, Done, Feature, ModelInfo
from tui.messages import Answered, Asked, Busy, PutOnSlider, SteerTyped
from tui.session import Conversation, SteeringFields, chat_body, compare_bodies, sampling_fields
from tui.steer import COMMAND as STEER
from tui.widgets.activation_strip import ActivationStrip
from tui.widgets.chat_log import ChatLog
from tui.widgets.compare_view import CompareView
from tui.widgets.message_box import MessageBox
from tui.widgets.monitor_panel import MonitorPanel
from tui.widgets.sampling_form import SamplingForm

MONITOR_POLL = 1.0  # seconds between reads of the monitoring history while an answer runs
CHAT_COMMANDS = {"Enter": "send the prompt (in compare mode: answer it unsteered and steered)",
                 "/reset": "forget this chat's history",
                 "/system TEXT": "set the system prompt (and forget the history)",
                 "/steer FEATURE[=S], …": "set features on the chosen SAE (an index or a label); a feature alone "
                                          "takes its recommended strength, and the notification says which"}


def readout_too_long(sampling: dict[str, object]) -> bool:
    """Whether an answer of the sampling's ``max_tokens`` could be too long for a read-out of every token."""
    max_tokens = sampling.get("max_tokens")
    return isinstance(max_tokens, int) and max_tokens * READOUT_TOP_K > SAE_ACTIVATIONS_MAX_ENTRIES


class ChatPane(Vertical):
    """The conversation and what each answer computed; the screen holds who steers it."""

    def __init__(self, client: Client, info: ModelInfo, conversation: Conversation, sampling: dict[str, str],
                 **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.client, self.info, self.conversation = client, info, conversation
        self.sampling_defaults = sampling
        self.busy = ""  # what holds the answer slot (an answer, a comparison, a sweep), or "" when it is free
        self.compare = False  # compare mode: each prompt answered unsteered, then steered
        self.watched: list[Feature] = []  # the features monitoring follows

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
        if self.busy and self.watched:
            self.poll_monitor()

    def show_compare(self, on: bool) -> None:
        self.compare = on
        self.query_one(ContentSwitcher).current = "compare" if on else "chat"

    def _take_slot(self, what: str) -> None:
        """The answer slot taken by ``what`` (or freed, ""), and the screen told."""
        self.busy = what
        self.post_message(Busy(what))

    def on_activation_strip_chosen(self, message: ActivationStrip.Chosen) -> None:
        message.stop()
        self.post_message(PutOnSlider(message.feature))

    # the prompt
    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "prompt":
            return
        event.stop()
        text = event.value.strip()
        if not text:
            return
        if text == STEER or text.startswith(STEER + " "):  # steering may change while an answer streams
            event.input.value = ""
            self.post_message(SteerTyped(text))
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
            self._take_slot("comparing" if self.compare else "generating")
            self.post_message(Asked(text))

    def answer(self, prompt: str, steering: SteeringFields) -> None:
        """Answer ``prompt`` steered by ``steering`` (the screen's reply to ``Asked``); in compare mode unsteered,
        then steered."""
        (self.run_compare if self.compare else self.run_answer)(prompt, steering)

    def body(self, messages: list[dict[str, object]], steering: SteeringFields) -> dict[str, object]:
        """The request body; the strip reads no SAE when the answer could be too long for a read-out of every
        token."""
        sampling = sampling_fields(self.query_one(SamplingForm).fields())
        if readout_too_long(sampling):
            steering = replace(steering, readout_sae=None)
        return chat_body(self.info.model_id, messages, sampling, steering)

    # answers
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
    async def run_answer(self, prompt: str, steering: SteeringFields) -> None:
        conversation = self.conversation
        try:
            body = self.body(conversation.messages(prompt), steering)
            log = self.query_one("#chat", ChatLog)
            log.add("you", prompt)
            result = await self.stream_into(body, log.add(self.info.model_id), log)
        finally:
            self._take_slot("")
        if result is not None:
            conversation.add(prompt, result.text)
            self.post_message(Answered(result))

    @work(exclusive=True, group="answer")
    async def run_compare(self, prompt: str, steering: SteeringFields) -> None:
        """The prompt alone (after the system prompt), unsteered then steered, with one seed."""
        try:
            off, on = compare_bodies(self.body(Conversation(self.conversation.system).messages(prompt), steering))
            view = self.query_one(CompareView)
            box_off, box_on = view.begin(prompt, on["seed"])
            self._take_slot("comparing: unsteered")
            unsteered = await self.stream_into(off, box_off, view.column("unsteered"))
            if unsteered is None:
                return
            self._take_slot("comparing: steered")
            steered = await self.stream_into(on, box_on, view.column("steered"))
        finally:
            self._take_slot("")
        if steered is not None:
            same = steered.text == unsteered.text
            box_on.border_title = f"model · {'same as' if same else 'differs from'} unsteered"
            self.post_message(Answered(steered))

    def show_readout(self, result: ChatResult, labels: dict[int, str]) -> None:
        """What the answer computed, in the strip, with the labels the screen knows of its SAE."""
        self.query_one(ActivationStrip).show(result.readout_sae, result.tokens, labels)

    # monitoring
    def show_watched(self, features: list[Feature]) -> None:
        self.watched = features
        self.query_one(MonitorPanel).watch_features(features)
        self.poll_monitor()

    @work(exclusive=True, group="monitor")
    async def poll_monitor(self) -> None:
        try:
            history = await self.client.monitor_history()
        except MillmError:
            return
        self.query_one(MonitorPanel).update_history(history)
