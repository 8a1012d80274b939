"""``millm tui --url``: the same screens driving a live ``millm serve`` on loopback over /v1 and /api."""

from __future__ import annotations

import httpx

from tests.tui.helpers import PROMPT, answers, ask, drive, greedy_answer, settle, type_text
from tui.remote import RemoteClient, RemoteError
from tui.widgets.activation_strip import ActivationStrip
from tui.widgets.sae_list import SAEList
from tui.widgets.strength_slider import StrengthSlider


def test_url_mode_steers_and_chats_through_the_server(engine, server, sae_id):
    plain = greedy_answer(engine)

    async def scenario(app, pilot) -> str:
        assert app.main.info.where == server and app.main.info.model_id == engine.model_id
        saes = app.main.query_one(SAEList)
        saes.highlighted = [s.id for s in saes.saes].index(sae_id)
        saes.focus()
        await pilot.press("a")
        await settle(pilot)
        await pilot.press("ctrl+f")
        await type_text(pilot, "weather")
        await settle(pilot)
        await pilot.press("enter")
        assert app.main.query_one(StrengthSlider).feature.index == 5
        await pilot.press("1", "5", "0", "enter")
        await settle(pilot)
        state = httpx.get(server + "/api/steering").json()
        assert state["saes"][sae_id] == {"layer": 12, "values": {"5": 150.0}}

        await ask(app, pilot, PROMPT)
        steered = answers(app)[-1]
        strip = app.main.query_one(ActivationStrip)
        assert strip.sae_id == sae_id and strip.tokens and all(t.features for t in strip.tokens)
        assert steered.startswith("".join(t.text for t in strip.tokens))  # each token's text, in order

        saes.focus()
        await pilot.press("d")
        await settle(pilot)
        assert sae_id not in httpx.get(server + "/api/steering").json()["saes"]
        return steered

    steered = drive(RemoteClient(server), scenario)
    assert steered != plain


def test_url_mode_reports_an_unreachable_server():
    import asyncio

    async def main() -> RemoteError:
        try:
            await RemoteClient.open("http://127.0.0.1:9", None)
        except RemoteError as exc:
            return exc
        raise AssertionError("connected to a closed port")

    exc = asyncio.run(main())
    assert "Cannot reach http://127.0.0.1:9" in exc.message
