"""Fixtures of the console tests: a headless Chromium per module, and the real app on the scripted engine served
by Hypercorn on a loopback port with a watched page on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.console.browser import Watched, launched
from tests.support.app import make
from tests.support.fakes import FakeEngine
from tests.support.live import live_server


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (a missing one fails the test)."""
    with launched() as b:
        yield b


@pytest.fixture
def open_console(browser: Any, tmp_path: Path) -> Iterator[Callable[..., AbstractContextManager[Watched]]]:
    """``with open_console(engine=..., **settings) as console:`` the app on ``engine`` (default: a steerable
    scripted one) served on loopback, and a fresh browser context's page watching it."""

    @contextmanager
    def opened(engine: Any = None, **settings: Any) -> Iterator[Watched]:
        app, _ = make(tmp_path, engine or FakeEngine(steerable=True), **settings)
        with live_server(app) as base:
            context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
            try:
                yield Watched(context.new_page(), base)
            finally:
                context.close()

    yield opened


@pytest.fixture
def console(open_console: Callable[..., AbstractContextManager[Watched]]) -> Iterator[Watched]:
    """The console on a steerable scripted engine, checked afterwards for errors, dialogs and foreign requests."""
    with open_console() as watched:
        yield watched
        watched.clean()
