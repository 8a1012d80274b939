"""The feature card in the TUI (``i`` on a search result) and labels read by index in ``--url`` mode."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from millm.config import Settings
from tests.support.cards import ROWS, TABLE, measured
from tests.support.fakes import FakeEngine
from tests.support.saes import random_sae, write_saelens
from tests.tui.fakes import LABELS, SAE, ScriptedClient
from tests.tui.helpers import drive, settle
from tui.remote import RemoteClient
from tui.screens.card import CardScreen
from tui.widgets.activation_strip import ActivationStrip
from tui.widgets.feature_search import FeatureSearch
from tui.widgets.steered_list import SteeredList


def test_i_on_a_search_result_shows_its_card_and_escape_closes_it():
    client = ScriptedClient()

    async def scenario(app, pilot) -> None:
        app.main.query_one("#search-input").value = "storm"
        await asyncio.sleep(0.3)
        await settle(pilot)
        search = app.main.query_one(FeatureSearch)
        assert len(search.features) == 2
        app.main.query_one("#search-results").focus()
        await pilot.press("down", "i")
        await settle(pilot)
        assert isinstance(app.screen, CardScreen)
        assert client.cards_asked == [(SAE, search.features[1].index)]
        shown = str(app.screen.query_one("#card-text").render())
        assert LABELS[search.features[1].index] in shown and "the rain fell" in shown and '" storm"' in shown
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, CardScreen)
        app.main.query_one(SteeredList).focus()
        await pilot.press("i")
        await settle(pilot)
        assert isinstance(app.screen, CardScreen) and app.screen.card.index == 12  # the steered feature

    drive(client, scenario)


class UnlistedLabels(ScriptedClient):
    """A server that lists no labels (as ``--url`` mode sees only the first ones): labels come by index."""

    async def labels(self, sae_id: str) -> dict[int, str]:
        return {}

    async def search(self, sae_id: str, query: str) -> list[Any]:
        return []


def test_labels_missing_from_the_listing_are_read_by_index():
    client = UnlistedLabels()

    async def scenario(app, pilot) -> None:
        assert [f.label for f in app.main.query_one(SteeredList).rows_shown] == [LABELS[12]]
        app.main.query_one("#search-input").value = "#301"
        await asyncio.sleep(0.3)
        await settle(pilot)
        assert [(f.index, f.label) for f in app.main.query_one(FeatureSearch).features] == [(301, LABELS[301])]
        app.main.query_one("#prompt").value = "Hi"
        app.main.query_one("#prompt").focus()
        await pilot.press("enter")
        await settle(pilot)
        assert app.main.query_one(ActivationStrip).labels == {i: LABELS[i] for i in (12, 40, 77, 301)}
        assert sorted(set(client.cards_asked)) == sorted(client.cards_asked)  # each asked once

    drive(client, scenario)


def test_remote_client_reads_cards_and_ranked_search_from_the_server(tmp_path: Path):
    from millm.server.app import create_app

    folder = write_saelens(tmp_path / "sae", random_sae(16, 64, seed=2), layer=1)
    (folder / "labels.json").write_text(json.dumps({str(k): v for k, v in TABLE.items()}))
    (folder / "features.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS))
    app = create_app(Settings(home=tmp_path / "home"), FakeEngine())  # type: ignore[arg-type]

    async def main() -> Any:
        async with app.test_app():
            remote = RemoteClient("http://localhost", transport=httpx.ASGITransport(app=app))  # type: ignore[arg-type]
            sae_id = (await remote._call("POST", "/api/saes", {"path": str(folder)}))["id"]
            card = await remote.feature(sae_id, 3)
            found = await remote.search(sae_id, "rain")
            await remote.close()
            return card, found
    card, found = asyncio.run(main())
    assert (card.index, card.label, card.d_sae, card.max_activation) == (3, "rain, wet", 64, 17.5)
    assert card.examples[0].parts == ("then the", " rain", " fell") and card.promotes == [" umbrella", "wet"]
    assert [f.index for f in found] == [3, 5, 2, 1, 4, 6, 7]


def test_local_client_reads_cards_and_ranked_search_through_the_library(tmp_path: Path):
    from millm.steering.service import SteeringService
    from millm.store import Store
    from tui.local import LocalClient

    folder = write_saelens(tmp_path / "sae", random_sae(16, 64, seed=2), layer=1)
    (folder / "labels.json").write_text(json.dumps({str(k): v for k, v in TABLE.items()}))
    rows = ROWS + [{"index": 6, "label": "terrain, maps", **measured(40.0)}]
    (folder / "features.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    service = SteeringService(Store(tmp_path / "millm.db"))
    sae_id = service.register_sae(folder, name="local-sae")["id"]
    local = LocalClient(FakeEngine(), service)  # type: ignore[arg-type]

    async def main() -> Any:
        return await local.feature(sae_id, 3), await local.search(sae_id, "rain")
    card, found = asyncio.run(main())
    assert (card.sae, card.label, card.frequency) == ("local-sae", "rain, wet", 0.0125)
    assert [f.index for f in found] == [3, 5, 2, 6, 1, 4, 7]
