"""Fixtures of the CLI tests: the CLI on the scripted engine, in a MILLM_HOME of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from millm.config import get_settings
from tests.support.cli import fake_factory
from tests.support.fakes import FakeEngine


@pytest.fixture
def fake_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeEngine]:
    """Every ``millm`` command of this test runs on a steerable scripted engine (``tests.support.cli``), with a
    fresh MILLM_HOME (its store: SAEs, profiles, persisted steering); yields the default model's engine."""
    import cli.common

    monkeypatch.setenv("MILLM_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    factory = fake_factory()
    monkeypatch.setattr(cli.common, "ENGINE_FACTORY", factory)
    yield factory(None)  # type: ignore[misc]
    get_settings.cache_clear()
