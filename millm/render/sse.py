"""Server-sent events framing for streamed completions."""

from __future__ import annotations

import json
from typing import Any

DONE = "data: [DONE]\n\n"
COMMENT = ":\n\n"  # a line clients ignore: keeps a quiet stream's connection known to be open


def data(payload: dict[str, Any]) -> str:
    """One ``data:`` frame."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def error(body: dict[str, Any]) -> str:
    """An error event after the stream has started (the status is already 200 by then)."""
    return event("error", body)


def event(name: str, payload: dict[str, Any]) -> str:
    """One named event."""
    return f"event: {name}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"
