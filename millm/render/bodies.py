"""Whole (non-streamed) response bodies: completions, scoring and embeddings.

The server answers with these, and ``millm batch`` writes the same bodies for its lines.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from millm.engine.events import Activations, Delta, Event, Finish, Usage, Verdicts
from millm.errors import MillmError
from millm.render import scoring
from millm.render.shapes import CompletionShape

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.engine.scoring import ScoreResult
    from millm.requests.builder import Built


def whole_body(shape: CompletionShape, events: Iterable[Event]) -> dict[str, Any]:
    """The non-streamed body of a generation's events."""
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    extension: dict[str, Any] = {}
    for event in events:
        if isinstance(event, Delta):
            texts[event.index] = texts.get(event.index, "") + event.text
        elif isinstance(event, Finish):
            finishes[event.index] = event.reason
        elif isinstance(event, Verdicts):
            extension["probes"] = event.body
        elif isinstance(event, Activations):
            extension["sae_activations"] = shape.sae_activations(event.body)
        elif isinstance(event, Usage):
            whole = shape.whole(texts, finishes, event)
            return {**whole, "millm": extension} if extension else whole
    raise MillmError("Generation ended without a result.")


def score_body(shape: CompletionShape, engine: Engine, built: Built, results: list[ScoreResult]) -> dict[str, Any]:
    """A scoring response's body (with the read-out a row carries)."""
    assert built.score is not None
    params = [row.params for row in built.score.rows]
    body = (scoring.chat_body(shape, engine, results, params) if shape.chat
            else scoring.completion_body(shape, engine, built.prompt_texts, results, params))
    readout = next((r.readout for r in results if r.readout is not None), None)
    if readout is not None:
        body["millm"] = {"sae_activations": shape.sae_activations(readout)}
    return body


def embeddings_body(built: Built, vectors: list[list[float]], tokens: int) -> dict[str, Any]:
    """An embeddings response's body (``float`` lists or little-endian float32 ``base64``)."""
    data = []
    for i, vector in enumerate(vectors):
        value: Any = vector
        if built.encoding == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {"object": "list", "data": data, "model": built.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
