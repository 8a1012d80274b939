"""Fixtures of the TUI tests: a labelled random SAE on layer 12 of the bundled model."""

from __future__ import annotations

import json

import pytest

from tests.support.saes import random_sae, write_saelens

LABELS = {"5": "weather, storm, rain", "7": "ocean, sea", "9": "stormy seas"}


@pytest.fixture(scope="module")
def sae_id(engine, tmp_path_factory):
    """A random SAE on layer 12 with labels, registered (not attached); detached and cleared afterwards."""
    from cli.common import steering_service

    folder = write_saelens(tmp_path_factory.mktemp("tui-sae") / "l12", random_sae(576, 512, seed=11), layer=12)
    (folder / "labels.json").write_text(json.dumps(LABELS))
    service = steering_service()
    sid = service.register_sae(folder, name="tui-test")["id"]
    yield sid
    target = engine.steering_target()
    if sid in target.steering.attachments:
        service.detach(target, sid)
    service.clear(target)


@pytest.fixture
def attached(engine, sae_id):
    """The SAE attached with no values; detached and cleared after the test."""
    from cli.common import steering_service

    service, target = steering_service(), engine.steering_target()
    service.attach(target, sae_id)
    service.clear(target)
    yield sae_id
    service.clear(target)
    if sae_id in target.steering.attachments:
        service.detach(target, sae_id)
