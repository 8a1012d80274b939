"""Shared fixtures: one isolated MILLM_HOME and one loaded bundled model per test session.

Nothing here imports torch: the engines are loaded inside the fixtures, so ``pytest -m "not model"
--collect-only`` never loads it (tests/test_collection.py checks it).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

_HOME = Path(tempfile.mkdtemp(prefix="millm-test-home-"))
os.environ["MILLM_HOME"] = str(_HOME)
# the dequantised model is derived data: one cache serves every test session on this machine
os.environ.setdefault("MILLM_CACHE", str(Path(tempfile.gettempdir()) / "millm-test-cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from millm.config import Settings, get_settings  # noqa: E402  (after MILLM_HOME is set)
from millm.registry import BUNDLED_ID, resolve  # noqa: E402

if TYPE_CHECKING:
    from millm.engine.llama_engine import LlamaCppEngine
    from millm.engine.transformers_engine import TransformersEngine


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--console-shots", type=Path, default=None,
                     help="write the console's screenshots (one PNG per page, real model) here: docs/console")


@pytest.fixture(scope="session")
def settings() -> Settings:
    get_settings.cache_clear()
    return get_settings()


@pytest.fixture(scope="session")
def engine(settings: Settings) -> Iterator[TransformersEngine]:
    """The bundled SmolLM2-135M-Instruct on the transformers engine (dequantised once per session)."""
    import cli.common
    from millm.engine import load_engine
    from millm.engine.transformers_engine import TransformersEngine

    eng = load_engine(resolve(BUNDLED_ID, settings), settings)
    assert isinstance(eng, TransformersEngine)
    cli.common._engines[eng.model_id] = eng  # the CLI reuses the session's model
    yield eng


@pytest.fixture(scope="session")
def server(engine: TransformersEngine, settings: Settings) -> Iterator[str]:
    """The real app serving the session's model on a loopback port; yields its base URL."""
    from millm.server.app import create_app
    from tests.support.live import live_server

    with live_server(create_app(settings, engine)) as base:
        yield base


@pytest.fixture(scope="session")
def client(server: str):
    """The official OpenAI SDK pointed at the live server."""
    from openai import OpenAI

    return OpenAI(base_url=server + "/v1", api_key="not-needed", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def gguf_engine(settings: Settings):
    """The bundled GGUF file on llama.cpp."""
    from millm.engine import load_engine

    eng = load_engine(resolve("SmolLM2-135M-Instruct:Q4_1", settings), settings)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def gguf_server(gguf_engine, settings: Settings) -> Iterator[str]:
    from millm.server.app import create_app
    from tests.support.live import live_server

    with live_server(create_app(settings, gguf_engine)) as base:
        yield base


@pytest.fixture(scope="module")
def gguf_steerable(gguf_engine, settings: Settings) -> Iterator[LlamaCppEngine]:
    """The bundled GGUF file on an engine of its own with MILLM_GGUF_STEERING on (set on the session's settings
    while the module runs, so a server made from them honours it too): steered through control vectors,
    nothing attached."""
    from millm.engine.llama_engine import LlamaCppEngine

    settings.gguf_steering = True
    eng = LlamaCppEngine.load(gguf_engine.entry, settings)
    try:
        yield eng
    finally:
        settings.gguf_steering = False
        eng.close()


MODEL_FIXTURES = {"engine", "server", "client", "gguf_engine", "gguf_server", "gguf_steerable", "base"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that need a real model are marked ``model``; ``-m "not model"`` is the fast tier. Marked here by
    the fixtures they ask for; a test that reaches one through ``request.getfixturevalue`` is marked itself."""
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
