"""The screens' behaviour over a scripted client (no model): what each key sends, and refusals."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.tui.fakes import SAE, ScriptedClient
from tests.tui.helpers import ask, drive, send, settle
from tui.widgets.compare_view import CompareView
from tui.widgets.message_box import MessageBox
from tui.widgets.steered_list import SteeredList


def test_keys_put_the_dial_and_a_loaded_profile_on_the_next_request():
    client = ScriptedClient()

    async def scenario(app, pilot) -> None:
        await pilot.press("f7")
        await ask(app, pilot, "Hi")
        assert client.bodies[-1]["steering_intensity"] == "max" and "profile" not in client.bodies[-1]
        await pilot.press("f2")
        await settle(pilot)
        await pilot.press("l", "escape")
        await settle(pilot)
        await pilot.press("f8")
        await ask(app, pilot, "Hi")
        assert client.bodies[-1]["profile"] == "calm" and "steering_intensity" not in client.bodies[-1]
        assert client.bodies[-1]["return_sae_activations"]["sae_id"] == SAE
        assert [m["role"] for m in client.bodies[-1]["messages"]] == ["user", "assistant", "user"]

    drive(client, scenario)


def test_a_second_enter_while_streaming_does_not_start_another_answer():
    client = ScriptedClient(delay=0.05)

    async def scenario(app, pilot) -> None:
        await send(app, pilot, "first")
        await send(app, pilot, "second")
        await settle(pilot)
        assert [m["content"] for b in client.bodies for m in b["messages"]] == ["first"]
        assert not any(b.has_class("stopped") for b in app.main.query(MessageBox))

    drive(client, scenario)


def test_refusals_show_on_the_answer_naming_the_field():
    client = ScriptedClient()

    async def scenario(app, pilot) -> None:
        await pilot.press("f3")
        await ask(app, pilot, "Hi")  # compare mode, with the seed the form holds
        box = app.main.query_one(CompareView).column("unsteered").query(MessageBox).last()
        assert box.has_class("stopped") and "'seed'" in box.text
        assert not app.main.busy and client.bodies == []

    drive(client, scenario, {"seed": "soon"})


def test_steering_toggle_clear_and_remove():
    client = ScriptedClient()

    async def scenario(app, pilot) -> Any:
        await pilot.press("f4")
        await settle(pilot)
        assert client.enabled is False
        steered = app.main.query_one(SteeredList)
        steered.focus()
        await pilot.press("delete")
        await settle(pilot)
        assert client.values[SAE] == {} and steered.rows_shown == []
        client.values[SAE] = {40: 10.0}
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert client.values[SAE] == {}

    drive(client, scenario)


def test_search_by_index_and_unknown_label():
    client = ScriptedClient()

    async def scenario(app, pilot) -> None:
        search = app.main.query_one("#search")
        for query, expected in (("#77", [(77, "happy, joy, smile")]), ("9999", []), ("zebra", [])):
            app.main.query_one("#search-input").value = query
            await asyncio.sleep(0.3)
            await settle(pilot)
            assert [(f.index, f.label) for f in search.features] == expected

    drive(client, scenario)
