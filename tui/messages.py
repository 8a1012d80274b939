"""What the main screen's panes tell it: a pane posts one of these, the screen (which holds the shared
steering state and the status line) acts on it. Panes never call each other."""

from __future__ import annotations

from textual.message import Message

from tui.client import ChatResult, Feature, SteeringState


class SteeringRead(Message):
    """The live steering as the server now has it (after a change, or re-read)."""

    def __init__(self, state: SteeringState) -> None:
        super().__init__()
        self.state = state


class Refresh(Message):
    """Read the SAEs, their labels, the live values and the active circuit again (an SAE was attached)."""


class Answered(Message):
    """An answer finished: what steered it, and what the model computed."""

    def __init__(self, result: ChatResult) -> None:
        super().__init__()
        self.result = result


class Watching(Message):
    """The features monitoring follows now."""

    def __init__(self, features: list[Feature]) -> None:
        super().__init__()
        self.features = features


class PutOnSlider(Message):
    """Show this feature on the strength slider (chosen in the activation strip, across panes)."""

    def __init__(self, feature: Feature) -> None:
        super().__init__()
        self.feature = feature


class Busy(Message):
    """The chat pane took the answer slot for ``what`` (an answer, a comparison, one of its halves), or freed it
    (""): the status line shows it."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what


class Asked(Message):
    """A prompt to answer (the answer slot is taken already): the screen replies with how to steer it
    (``ChatPane.answer``)."""

    def __init__(self, prompt: str) -> None:
        super().__init__()
        self.prompt = prompt


class SteerTyped(Message):
    """``/steer ITEMS`` typed in the chat input: set them on the chosen SAE (``tui.steer``)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
