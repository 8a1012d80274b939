"""Streamed responses: a generation's events as SSE frames."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from millm.engine.events import Activations, Delta, Event, Finish, Usage, Verdicts
from millm.errors import MillmError
from millm.render import sse
from millm.render.shapes import CompletionShape, call_finish
from millm.structured.tools import Piece, ToolCallParser, ToolConstraint

log = logging.getLogger(__name__)


async def sse_events(shape: CompletionShape, events: AsyncIterator[Event], choices: int,
                     include_usage: bool = True) -> AsyncIterator[str]:
    """Stream frames: role openers (chat), deltas, finishes (the last one with usage unless
    ``stream_options.include_usage`` is false), then [DONE]."""
    try:
        stream = _Frames(shape, shape.tools, include_usage)
        for frame in stream.openers(choices):
            yield frame
        async for event in events:
            for frame in stream.frames(event):
                yield frame
        for frame in stream.end():
            yield frame
    except MillmError as exc:
        yield sse.error(exc.body())
    except Exception as exc:  # the status is already 200: report in-stream, never drop the stream silently
        log.exception("generation failed mid-stream")
        yield sse.error(MillmError(f"Generation failed: {exc}").body())
    yield sse.DONE


@dataclass
class _Frames:
    """One stream's frames, event by event. A finish is held back until the next one, or the usage, comes (the
    last finish carries the usage); with ``tools``, each row's text goes through its own call parser, and a row
    that called a tool finishes with "tool_calls"; the probe verdicts and the SAE readout, when they come, are sent
    last."""

    shape: CompletionShape
    tools: ToolConstraint | None
    include_usage: bool
    parsers: dict[int, ToolCallParser] = field(default_factory=dict)
    held: Finish | None = None
    readout: Activations | None = None
    verdicts: Verdicts | None = None

    def openers(self, choices: int) -> list[str]:
        """A chat's role openers, one a choice; none for a completion."""
        return [sse.data(self.shape.chunk(i, role=True)) for i in range(choices)] if self.shape.chat else []

    def frames(self, event: Event) -> list[str]:
        """The frames one event sends now."""
        if isinstance(event, Delta):
            return self._delta(event)
        if isinstance(event, Finish):
            return self._finish(event)
        if isinstance(event, Verdicts):
            self.verdicts = event
        elif isinstance(event, Activations):
            self.readout = event
        elif isinstance(event, Usage) and self.held is not None:
            usage = event if self.include_usage else None
            return [sse.data(self.shape.chunk(self.held.index, finish=self.held.reason, usage=usage))]
        return []

    def end(self) -> list[str]:
        """What follows the last event (the contract's order): the probe-verdict chunk, then the SAE readout's,
        each when one came."""
        frames = []
        if self.verdicts is not None:
            frames.append(sse.data(self.shape.extension({"probes": self.verdicts.body})))
        if self.readout is not None:
            frames.append(sse.data(self.shape.extension({"sae_activations":
                                                         self.shape.sae_activations(self.readout.body)})))
        return frames

    def _parser(self, index: int) -> ToolCallParser:
        assert self.tools is not None
        return self.parsers.setdefault(index, self.tools.parser())

    def _delta(self, event: Delta) -> list[str]:
        """A row's text: as it is, or as the pieces its call parser makes of it."""
        if self.tools is None:
            return [sse.data(self.shape.chunk(event.index, event.text))]
        parser = self._parser(event.index)
        return [sse.data(piece_chunk(self.shape, event.index, piece, parser)) for piece in parser.feed(event.text)]

    def _finish(self, event: Finish) -> list[str]:
        """A row's end: the text its call parser held back, then the finish held before it (this one is held)."""
        frames: list[str] = []
        if self.tools is not None:
            parser = self._parser(event.index)
            frames = [sse.data(piece_chunk(self.shape, event.index, piece, parser)) for piece in parser.close()]
            if parser.calls:
                event = Finish(event.index, call_finish(event.reason), event.completion_tokens)
        if self.held is not None:
            frames.append(sse.data(self.shape.chunk(self.held.index, finish=self.held.reason)))
        self.held = event
        return frames


def piece_chunk(shape: CompletionShape, index: int, piece: Piece, parser: ToolCallParser) -> dict[str, object]:
    """The chunk of one piece of a tools-constrained row: content, a call's opening (index, id, type and name;
    empty arguments) or a run of its arguments."""
    if piece.kind == "content":
        return shape.chunk(index, piece.text)
    if piece.kind == "call":
        call = parser.calls[piece.call]
        return shape.chunk(index, tool_call={"index": piece.call, "id": call.id, "type": "function",
                                             "function": {"name": call.name, "arguments": ""}})
    return shape.chunk(index, tool_call={"index": piece.call, "function": {"arguments": piece.text}})
