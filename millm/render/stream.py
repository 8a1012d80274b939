"""Streamed responses: a generation's events as SSE frames."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from millm.engine.events import Activations, Delta, Event, Finish, Usage
from millm.errors import MillmError
from millm.render import sse
from millm.render.shapes import CompletionShape, call_finish
from millm.structured.tools import Piece, ToolCallParser

log = logging.getLogger(__name__)


async def sse_events(shape: CompletionShape, events: AsyncIterator[Event], choices: int,
                     include_usage: bool = True) -> AsyncIterator[str]:
    """Stream frames: role openers (chat), deltas, finishes (the last one with usage unless
    ``stream_options.include_usage`` is false), then [DONE]."""
    try:
        if shape.chat:
            for i in range(choices):
                yield sse.data(shape.chunk(i, role=True))
        tools = shape.tools
        parsers: dict[int, ToolCallParser] = {}

        def parser(index: int) -> ToolCallParser:
            assert tools is not None
            return parsers.setdefault(index, tools.parser())

        held: Finish | None = None
        readout: Activations | None = None
        async for event in events:
            if isinstance(event, Delta):
                if tools is None:
                    yield sse.data(shape.chunk(event.index, event.text))
                else:
                    for piece in parser(event.index).feed(event.text):
                        yield sse.data(piece_chunk(shape, event.index, piece, parser(event.index)))
            elif isinstance(event, Finish):
                if tools is not None:
                    rows = parser(event.index)
                    for piece in rows.close():
                        yield sse.data(piece_chunk(shape, event.index, piece, rows))
                    if rows.calls:
                        event = Finish(event.index, call_finish(event.reason), event.completion_tokens)
                if held is not None:
                    yield sse.data(shape.chunk(held.index, finish=held.reason))
                held = event
            elif isinstance(event, Activations):
                readout = event
            elif isinstance(event, Usage) and held is not None:
                yield sse.data(shape.chunk(held.index, finish=held.reason, usage=event if include_usage else None))
        if readout is not None:
            yield sse.data(shape.extension({"sae_activations": shape.sae_activations(readout.body)}))
    except MillmError as exc:
        yield sse.error(exc.body())
    except Exception as exc:  # the status is already 200: report in-stream, never drop the stream silently
        log.exception("generation failed mid-stream")
        yield sse.error(MillmError(f"Generation failed: {exc}").body())
    yield sse.DONE


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
