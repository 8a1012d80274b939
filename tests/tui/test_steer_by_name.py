"""``/steer NAME`` in the TUI's chat input, on the real bundled model in-process: a feature named alone takes its
recommended strength (its held-out measure's) and the notification says which; one without a recommendation
is refused with the best held-out point, and nothing changes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.cards import measured
from tests.support.saes import random_sae, write_saelens
from tests.tui.helpers import drive, send, settle
from tui.steer import items_of
from tui.widgets.sae_list import SAEList

LABELS = {"5": "weather, storm, rain", "7": "ocean, sea", "9": "stormy seas"}
ROWS = [{"index": 5, "label": LABELS["5"], **measured(60.0)},
        {"index": 7, "label": LABELS["7"], **measured(40.0, rate=0.4, recommended=False)}]


@pytest.fixture(scope="module")
def sae_id(engine, tmp_path_factory):
    """A labelled random SAE on layer 12 whose features.jsonl recommends 60 for feature 5 (weather) and no
    strength for feature 7 (ocean: its best held-out point misses the target), registered: the SAE this module's
    tests steer (conftest's ``attached`` attaches it, with no values, and detaches it after each)."""
    from cli.common import steering_service

    folder = write_saelens(tmp_path_factory.mktemp("tui-steer") / "l12", random_sae(576, 512, seed=13), layer=12)
    (folder / "labels.json").write_text(json.dumps(LABELS))
    (folder / "features.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return steering_service().register_sae(folder, name="tui-steer-test")["id"]


def notes(app: Any) -> list[tuple[str, str, str]]:
    """Every notification shown so far: (severity, title, message)."""
    return [(n.severity, n.title, n.message) for n in app._notifications]


async def choose(app: Any, pilot: Any, sae_id: str) -> None:
    saes = app.main.query_one(SAEList)
    saes.highlighted = [s.id for s in saes.saes].index(sae_id)
    await settle(pilot)


def test_a_name_alone_sets_its_recommended_strength_and_says_which(engine, attached):
    from tui.local import LocalClient

    target = engine.steering_target()

    async def scenario(app, pilot) -> None:
        await choose(app, pilot, attached)
        await send(app, pilot, "/steer weather, 9=-15")
        await settle(pilot)
        assert dict(target.steering.attachments[attached].values) == {5: 60.0, 9: -15.0}
        severity, title, message = notes(app)[-1]
        assert (severity, title) == ("information", "steered")
        assert message.startswith("tui-steer-test: 5=60, 9=-15; weather: feature 5 of ")
        assert "at its recommended strength 60 (held-out 50% [30%-69%] of 16 answers at 60" in message
        assert app.main.conversation.turns == []  # a command, not a prompt

    drive(LocalClient(engine), scenario)


def test_a_name_without_a_recommendation_is_refused_and_changes_nothing(engine, attached):
    from tui.local import LocalClient

    target = engine.steering_target()

    async def scenario(app, pilot) -> None:
        await choose(app, pilot, attached)
        await send(app, pilot, "/steer 9=20")
        await settle(pilot)
        await send(app, pilot, "/steer 9=40, ocean")  # all or nothing: 9 keeps its 20
        await settle(pilot)
        assert dict(target.steering.attachments[attached].values) == {9: 20.0}
        severity, title, message = notes(app)[-1]
        assert (severity, title) == ("error", "not steered")
        assert "'ocean' (feature 7 of " in message and "has no recommended strength" in message
        assert "held-out 40% [30%-50%] of 16 answers at 40" in message and "ocean=STRENGTH" in message
        await send(app, pilot, "/steer")
        await settle(pilot)
        assert notes(app)[-1][2].startswith("Nothing to steer: /steer FEATURE[=STRENGTH]")

    drive(LocalClient(engine), scenario)


def test_url_mode_resolves_names_as_in_process(engine, server, attached):
    """Over ``--url`` the names resolve on the server's search and cards, to the same values and words."""
    import httpx

    from tui.remote import RemoteClient

    async def scenario(app, pilot) -> None:
        await choose(app, pilot, attached)
        await send(app, pilot, "/steer weather, 9=-15")
        await settle(pilot)
        assert httpx.get(server + "/api/steering").json()["saes"][attached]["values"] == {"5": 60.0, "9": -15.0}
        assert "at its recommended strength 60 (held-out 50% [30%-69%]" in notes(app)[-1][2]
        await send(app, pilot, "/steer ocean")
        await settle(pilot)
        assert notes(app)[-1][:2] == ("error", "not steered")
        assert f"'ocean' (feature 7 of {attached}) has no recommended strength" in notes(app)[-1][2]
        assert httpx.get(server + "/api/steering").json()["saes"][attached]["values"] == {"5": 60.0, "9": -15.0}

    drive(RemoteClient(server), scenario)


def test_items_split_at_commas_and_keep_spaces():
    assert items_of("/steer weather,  stormy seas=20 ,,12") == ["weather", "stormy seas=20", "12"]
