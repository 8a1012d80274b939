"""Small helpers for tests that drive the real engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from millm.engine.events import Delta, Event, Finish, Usage
from millm.engine.params import ChatPrompt, GenerationRequest, Prompt, TextPrompt
from millm.requests.validation import sampling_params

if TYPE_CHECKING:
    from millm.engine.transformers_engine import TransformersEngine


def events(engine: TransformersEngine, prompt: str | Prompt | list[dict[str, Any]], **fields: Any) -> list[Event]:
    if isinstance(prompt, str):
        prompt = ChatPrompt([{"role": "user", "content": prompt}])
    elif isinstance(prompt, list):
        prompt = ChatPrompt(prompt)
    return list(engine.generate(GenerationRequest([prompt], sampling_params(fields))))


def texts(evts: list[Event]) -> dict[int, str]:
    out: dict[int, str] = {}
    for e in evts:
        if isinstance(e, Delta):
            out[e.index] = out.get(e.index, "") + e.text
    return out


def finishes(evts: list[Event]) -> dict[int, str]:
    return {e.index: e.reason for e in evts if isinstance(e, Finish)}


def usage(evts: list[Event]) -> Usage:
    last = evts[-1]
    assert isinstance(last, Usage)
    return last


__all__ = ["events", "texts", "finishes", "usage", "TextPrompt", "ChatPrompt"]
