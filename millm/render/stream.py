"""Streamed responses: a generation's events as SSE frames."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from millm.engine.events import Activations, Delta, Event, Finish, Usage
from millm.errors import MillmError
from millm.render import sse
from millm.render.shapes import CompletionShape

log = logging.getLogger(__name__)


async def sse_events(shape: CompletionShape, events: AsyncIterator[Event], choices: int,
                     include_usage: bool = True) -> AsyncIterator[str]:
    """Stream frames: role openers (chat), deltas, finishes (the last one with usage unless
    ``stream_options.include_usage`` is false), then [DONE]."""
    try:
        if shape.chat:
            for i in range(choices):
                yield sse.data(shape.chunk(i, role=True))
        held: Finish | None = None
        readout: Activations | None = None
        async for event in events:
            if isinstance(event, Delta):
                yield sse.data(shape.chunk(event.index, event.text))
            elif isinstance(event, Finish):
                if held is not None:
                    yield sse.data(shape.chunk(held.index, finish=held.reason))
                held = event
            elif isinstance(event, Activations):
                readout = event
            elif isinstance(event, Usage) and held is not None:
                yield sse.data(shape.chunk(held.index, finish=held.reason, usage=event if include_usage else None))
        if readout is not None:
            yield sse.data(shape.extension({"sae_activations": readout.body}))
    except MillmError as exc:
        yield sse.error(exc.body())
    except Exception as exc:  # the status is already 200: report in-stream, never drop the stream silently
        log.exception("generation failed mid-stream")
        yield sse.error(MillmError(f"Generation failed: {exc}").body())
    yield sse.DONE
