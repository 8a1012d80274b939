"""Driving the TUI in tests: run a scenario under Textual's Pilot and wait for its workers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from textual.pilot import Pilot
from textual.widgets import Input

from millm.engine.events import Delta
from millm.requests.builder import build_chat
from tui.app import MillmApp
from tui.client import Client
from tui.widgets.chat_log import ChatLog

T = TypeVar("T")
PROMPT = "Write one sentence about the weather."
SIZE = (140, 44)
GREEDY = {"temperature": "0", "max_tokens": "8"}


async def settle(pilot: Pilot[Any], timeout: float = 120.0) -> None:
    """Wait until every worker has finished and the screen has caught up."""
    app = pilot.app
    deadline = time.monotonic() + timeout
    while True:
        await pilot.pause()
        running = [w for w in app.workers if not w.is_finished]
        if not running:
            await pilot.pause()
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers still running: {running}")
        await asyncio.sleep(0.02)


async def until(pilot: Pilot[Any], ready: Callable[[], bool], timeout: float = 120.0) -> None:
    """Wait (redrawing) until ``ready()``."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await pilot.pause(0.01)


def drive(client: Client, scenario: Callable[[MillmApp, Pilot[Any]], Awaitable[T]],
          sampling: dict[str, str] | None = None) -> T:
    """Run ``scenario(app, pilot)`` on a fresh app over ``client``; returns what the scenario returns."""
    async def main() -> T:
        app = MillmApp(client=client, sampling=GREEDY if sampling is None else sampling)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            return await scenario(app, pilot)
    return asyncio.run(main())


async def type_text(pilot: Pilot[Any], text: str) -> None:
    """Type ``text`` into the focused widget, key by key."""
    keys = {" ": "space", "-": "minus", ".": "full_stop", "/": "slash", ",": "comma", "?": "question_mark",
            "+": "plus"}
    await pilot.press(*[keys.get(ch, ch) for ch in text])


async def send(app: MillmApp, pilot: Pilot[Any], prompt: str) -> None:
    """Put ``prompt`` in the chat input and press Enter (typing it key by key is slow while the engine is
    busy: Pilot waits for the process to go idle after every key)."""
    prompt_input = app.main.query_one("#prompt", Input)
    prompt_input.value = prompt
    prompt_input.focus()
    await pilot.press("enter")


async def ask(app: MillmApp, pilot: Pilot[Any], prompt: str) -> None:
    """Send ``prompt`` from the chat input and wait for the answer."""
    await send(app, pilot, prompt)
    await settle(pilot)


def greedy_answer(engine: Any, prompt: str = PROMPT, max_tokens: int = 8) -> str:
    """The answer the engine gives directly (as the steering stands now), greedily."""
    body = {"model": engine.model_id, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens}
    request = build_chat(body, lambda _: engine.engine_name).generations[0]
    return "".join(e.text for e in engine.generate(request) if isinstance(e, Delta))


def answers(app: MillmApp) -> list[str]:
    """Every answer in the chat pane."""
    return app.main.query_one("#chat", ChatLog).answers()
