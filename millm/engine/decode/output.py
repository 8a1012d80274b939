"""One choice's text as it is generated: detokenising, stop sequences, hold-back."""

from __future__ import annotations

from collections.abc import Sequence

from millm.engine.decode.detok import Decoder, IncrementalDetokenizer
from millm.engine.decode.stops import StopMatcher, find_stop


class ChoiceOutput:
    """Turns sampled token ids into emitted text for one choice, and says when it is finished.

    Text that could still become a stop sequence is held back; once a stop matches, the text is cut
    before it and nothing of the stop is ever emitted. With ``until`` (a tool call's marker), stop sequences
    apply to the free text before it only: a call, once begun, is never cut.
    """

    def __init__(self, tokenizer: Decoder, stops: Sequence[str], stop_ids: frozenset[int],
                 until: str | None = None) -> None:
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stops = tuple(stops)
        self.stop_ids = stop_ids
        self.until = until
        self.text = ""
        self.emitted = 0
        self.tokens = 0
        self.finish_reason: str | None = None
        self._longest_stop = max((len(s) for s in self.stops), default=0)
        self._matcher = StopMatcher(self.stops)
        self._free_end: int | None = None  # where the free text ends, once ``until`` is seen

    def _advance(self, new_text: str, final: bool) -> str:
        start = len(self.text)
        self.text += new_text
        held = 0
        if self.stops and self._free_end is None:
            if self.until is not None and (at := self.text.find(self.until, max(0, start - len(self.until) + 1))) >= 0:
                self._free_end = at
            free = self.text[:self._free_end]
            held = self._matcher.feed(free[start:])
            cut = find_stop(free, self.stops, max(0, self.emitted - self._longest_stop + 1))
            if cut is not None:
                self.text = self.text[:cut]
                self.finish_reason = "stop"
                final = True
            if self._free_end is not None:
                held = 0
        end = len(self.text) if final else len(self.text) - held
        piece = self.text[self.emitted:end]
        self.emitted = end
        return piece

    def feed(self, token_id: int) -> str:
        """Account for one sampled token; return the text that is now safe to emit."""
        self.tokens += 1
        if token_id in self.stop_ids:
            self.finish_reason = "stop"
            return self._advance(self.detok.flush(), final=True)
        return self._advance(self.detok.push(token_id), final=False)

    def close(self, reason: str) -> str:
        """End the choice (max_tokens reached): release what was held back, unless a stop matches."""
        self.finish_reason = reason
        return self._advance(self.detok.flush(), final=True)
