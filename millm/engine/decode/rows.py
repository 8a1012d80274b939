"""One generated choice's state, and the one rule that turns a sampled token into events.

Both engines decode through ``emit``: the same stop, hold-back and length rules on every engine,
and the per-row shape a continuous-batching scheduler drives (rows join and leave independently).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from millm.engine.decode.output import ChoiceOutput
from millm.engine.events import Delta, Event, Finish
from millm.engine.params import SamplingParams


@dataclass
class Row:
    """One choice being generated: its text so far, its parameters and its token budget."""

    index: int
    output: ChoiceOutput
    params: SamplingParams
    max_tokens: int

    @property
    def done(self) -> bool:
        return self.output.finish_reason is not None


def emit(row: Row, token: int, closes: Callable[[int], bool] | None = None,
         complete: Callable[[str], bool] | None = None) -> list[Event]:
    """Feed one sampled token to ``row``: the text now safe to show, and its Finish when it ends.

    ``closes(token)`` is asked (only while the row is still open) whether the token completes a
    constrained document, which ends the row with "stop". Reaching ``max_tokens`` ends it with "length",
    unless ``complete(text)`` says the text is a complete answer all the same (tool calls whose arguments
    closed, with only blanks after the last): that ends with "stop", as if the model had ended it.
    """
    out = row.output
    piece = out.feed(token)
    if closes is not None and out.finish_reason is None and closes(token):
        piece += out.close("stop")
    piece += _at_budget(row, complete)
    events: list[Event] = [Delta(row.index, piece)] if piece else []
    if out.finish_reason is not None:
        events.append(Finish(row.index, out.finish_reason, out.tokens))
    return events


def _at_budget(row: Row, complete: Callable[[str], bool] | None) -> str:
    """An open row that reached ``max_tokens`` closes: "length", or "stop" where ``complete(text)`` says its text
    is a whole answer; the text closing it releases ("" while it is open or already closed)."""
    out = row.output
    if out.finish_reason is not None or out.tokens < row.max_tokens:
        return ""
    piece = out.close("length")
    if out.finish_reason == "length" and complete is not None and complete(out.text):
        out.finish_reason = "stop"
    return piece
