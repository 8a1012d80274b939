"""An app with a scripted registry, loader and preflight check: model swaps, loads and unloads in the fast tier."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from millm.config import Settings
from millm.errors import ModelLoadFailed, ModelNotFound, UnsupportedQuantization
from millm.registry import ModelEntry
from tests.support.fakes import FakeEngine

if TYPE_CHECKING:
    from millm.engine.base import Engine


def entry(model_id: str) -> ModelEntry:
    return ModelEntry(id=model_id, engine="transformers", source="path", path=Path(__file__))


class Lab:
    """An app with a scripted registry, loader and preflight check."""

    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        self.entries = {m: entry(m) for m in ("fake", "good", "refused", "broken", "slow")}
        self.loaded: list[str] = []
        self.release = threading.Event()
        self.release.set()
        self.old = FakeEngine()
        from millm.server.app import create_app  # torch: imported when a test runs, never at collection

        self.app = create_app(Settings(home=tmp_path, **settings), self.old, loader=self.load, registry=self.find)
        self.app.extensions["millm"].manager.preflight = self.check

    def find(self, name: str) -> ModelEntry:
        if name not in self.entries:
            raise ModelNotFound(name)
        return self.entries[name]

    def check(self, target: ModelEntry, current: ModelEntry | None) -> None:
        if target.id == "refused":
            raise UnsupportedQuantization("'refused' is quantised to 2 bits (hqq); transformers takes ...")

    def load(self, target: ModelEntry, settings: Settings) -> Engine:
        self.release.wait(10)
        if target.id == "broken":
            raise ModelLoadFailed("'broken': weights are corrupt")
        self.loaded.append(target.id)
        return FakeEngine(target.id)

    def run(self, scenario: Any) -> Any:
        async def main() -> Any:
            async with self.app.test_app():
                return await scenario(self.app.test_client())
        return asyncio.run(main())


def chat(model: str = "fake", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **extra}


async def answer(response: Any) -> tuple[int, Any]:
    return response.status_code, await response.get_json()
