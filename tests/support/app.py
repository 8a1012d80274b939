"""The real app on the scripted engine through Quart's test client: the fast tier's way to drive /v1 and /api."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from millm.config import Settings
from tests.support.fakes import FakeEngine

if TYPE_CHECKING:
    from millm.engine.base import Engine


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "fake", "messages": [{"role": "user", "content": "hi"}], **extra}


def frames(data: bytes) -> list[str]:
    return [f for f in data.decode().split("\n\n") if f]


def make(tmp_path: Path, engine: Engine | None = None, **kw: Any) -> tuple[Any, FakeEngine]:
    from millm.server.app import create_app  # torch: imported when a test runs, never at collection

    eng = engine or FakeEngine()
    settings = Settings(home=tmp_path, **kw)
    return create_app(settings, eng), eng  # type: ignore[return-value]


def run(app: Any, scenario: Callable[[Any], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with app.test_app():
            return await scenario(app.test_client())
    return asyncio.run(main())
