"""Snapshots of the main screens over a scripted client (fixed data, fixed size, no clock)."""

from __future__ import annotations

from typing import Any

from textual.pilot import Pilot
from textual.widgets import Input

from tests.tui.fakes import ScriptedClient
from tests.tui.helpers import SIZE, settle, type_text
from tui.app import MillmApp


def app(seed: str = "") -> MillmApp:
    return MillmApp(client=ScriptedClient(), sampling={"temperature": "0", "max_tokens": "64", "seed": seed})


def steady(run_before: Any) -> Any:
    """``run_before``, then every input's cursor held still: a blinking cursor is drawn or not depending on
    when the snapshot is taken."""
    async def run(pilot: Pilot[Any]) -> None:
        await run_before(pilot)
        for field in pilot.app.query(Input):
            field.cursor_blink = False
        await pilot.pause()
    return run


async def answered(pilot: Pilot[Any]) -> None:
    await settle(pilot)
    await type_text(pilot, "What is the weather like?")
    await pilot.press("enter")
    await settle(pilot)


def test_main_screen_after_an_answer(snap_compare):
    assert snap_compare(app(), terminal_size=SIZE, run_before=steady(answered))


def test_main_screen_with_a_feature_on_the_slider(snap_compare):
    async def on_slider(pilot: Pilot[Any]) -> None:
        await answered(pilot)
        await pilot.press("ctrl+f")
        await type_text(pilot, "storm")
        await settle(pilot)
        await pilot.press("enter", "right", "right")
        await settle(pilot)

    assert snap_compare(app(), terminal_size=SIZE, run_before=steady(on_slider))


def test_compare_mode(snap_compare):
    async def compared(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        await pilot.press("f3")
        await type_text(pilot, "What is the weather like?")
        await pilot.press("enter")
        await settle(pilot)

    assert snap_compare(app(seed="7"), terminal_size=SIZE, run_before=steady(compared))


def test_help_screen(snap_compare):
    async def helped(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        await pilot.press("f1")
        await settle(pilot)

    assert snap_compare(app(), terminal_size=SIZE, run_before=steady(helped))


def test_profiles_screen(snap_compare):
    async def profiles(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        await pilot.press("f2")
        await settle(pilot)

    assert snap_compare(app(), terminal_size=SIZE, run_before=steady(profiles))
