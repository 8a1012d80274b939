"""Which model is loaded, and swapping it safely while requests are served."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable

from millm.config import Settings
from millm.engine import Engine, load_engine
from millm.engine.worker import EngineWorker
from millm.errors import MillmError, ModelBusy, ModelLoadFailed, ModelNotLoaded
from millm.registry import ModelEntry, list_models, resolve

Loader = Callable[[ModelEntry, Settings], Engine]
Registry = Callable[[str], ModelEntry]

log = logging.getLogger(__name__)

GRACEFUL_UNLOAD_TIMEOUT = 30.0


class ModelManager:
    """Holds the loaded engine; loads, unloads and swaps it on the engine worker.

    From the moment an unload or load begins, requests are refused with model_busy rather than run
    on a half-moved model; requests already running finish first (up to GRACEFUL_UNLOAD_TIMEOUT).
    """

    def __init__(self, settings: Settings, worker: EngineWorker, engine: Engine | None = None,
                 on_load: Callable[[Engine], None] | None = None, loader: Loader = load_engine,
                 registry: Registry | None = None) -> None:
        self.settings = settings
        self.on_load = on_load
        self.loader = loader
        self.resolve: Registry = registry or (lambda model: resolve(model, settings))
        self.worker = worker
        self.engine = engine
        self.state: str | None = None  # "LOADING" or "UNLOADING" while a swap runs
        self._target: str | None = None

    def entry(self, model: str) -> ModelEntry:
        """The registry entry a request names (404 model_not_found if none; model_busy during a swap)."""
        self.check_not_busy()
        if self.engine is not None and model == self.engine.model_id:
            return self.engine.entry
        return self.resolve(model)

    def entries(self) -> list[ModelEntry]:
        """Every model on disk, the loaded one included."""
        found = list_models(self.settings)
        if self.engine is not None and all(e.id != self.engine.model_id for e in found):
            found.append(self.engine.entry)
        return found

    def state_of(self, model_id: str) -> str:
        if self._target == model_id and self.state is not None:
            return self.state
        return "LOADED" if self.engine is not None and self.engine.model_id == model_id else "READY"

    def check_not_busy(self) -> None:
        if self.state is not None:
            raise ModelBusy(f"The model '{self._target}' is {self.state.lower()}; retry once it finishes.")

    async def engine_for(self, entry: ModelEntry) -> Engine:
        """The engine serving ``entry``, swapping the loaded model for it first if needed."""
        self.check_not_busy()
        if self.engine is None:
            raise ModelNotLoaded("No model is loaded; load one with `millm serve --model ID` or the management API.")
        if self.engine.model_id != entry.id:
            await self.load(entry)
        assert self.engine is not None
        return self.engine

    async def load(self, entry: ModelEntry) -> None:
        """Unload the current model once in-flight requests finish, then load ``entry``."""
        self.check_not_busy()
        self._target = entry.id
        try:
            if self.engine is not None:
                self.state = "UNLOADING"
                if not await self.worker.wait_idle(GRACEFUL_UNLOAD_TIMEOUT):
                    log.warning("unloading %s with requests still running after %.0f s",
                                self.engine.model_id, GRACEFUL_UNLOAD_TIMEOUT)
                await self.unload_now()
            self.state = "LOADING"
            try:
                self.engine = await self.worker.call(self._load, entry)
            except MillmError:
                raise
            except Exception as exc:  # any failure of the loader becomes one typed error
                raise ModelLoadFailed(f"Loading '{entry.id}' failed: {exc}") from exc
            log.info("loaded %s (%s)", entry.id, self.engine.fingerprint)
        finally:
            self.state = None
            self._target = None

    def _load(self, entry: ModelEntry) -> Engine:
        """On the engine thread: load, then re-apply what was persisted for the model (its hooks)."""
        engine = self.loader(entry, self.settings)
        if self.on_load is not None:
            self.on_load(engine)
        return engine

    async def unload_now(self) -> None:
        """Detach every SAE hook, drop the loaded engine and give its memory back."""
        if self.engine is not None:
            self.engine.close()
        self.engine = None
        gc.collect()
        import sys

        torch = sys.modules.get("torch")  # only an engine that used torch has memory to give back
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()
