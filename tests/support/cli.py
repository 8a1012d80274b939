"""The ``millm`` CLI on the scripted engine: the engine factory the CLI takes (``cli.common.ENGINE_FACTORY``).

In process, the ``fake_cli`` fixture (tests/cli/conftest.py) sets it for a test. In a process of its own (a run a
test kills, ``millm serve``), ``python -m tests.support.cli ARGS`` is ``millm ARGS`` on the scripted engine;
MILLM_FAKE_PACE (seconds) slows each decode step and scored row so a test can stop it midway.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from millm.config import get_settings
from millm.registry import resolve
from tests.support.fakes import FakeEngine

if TYPE_CHECKING:
    from millm.engine.base import Engine


def fake_factory(steerable: bool = True, pace: float = 0.0) -> Callable[[str | None], Engine]:
    """A factory handing out one scripted engine per model: a name the registry does not know is refused as
    before (nothing is loaded), a known one gets a ``FakeEngine`` with its id and engine."""
    engines: dict[str, FakeEngine] = {}

    def factory(model: str | None) -> Engine:
        settings = get_settings()
        entry = resolve(model or settings.default_model, settings, paths=True)
        if entry.id not in engines:
            engines[entry.id] = FakeEngine(entry.id, engine_name=entry.engine, steerable=steerable, pace=pace)
        return engines[entry.id]  # type: ignore[return-value]

    return factory


def main() -> None:
    import cli.common
    from cli.main import app

    cli.common.ENGINE_FACTORY = fake_factory(pace=float(os.environ.get("MILLM_FAKE_PACE", "0")))
    app(prog_name="millm")


if __name__ == "__main__":
    main()
