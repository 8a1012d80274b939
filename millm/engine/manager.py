"""Which model is loaded, and swapping it safely while requests are served."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from millm.config import Settings
from millm.engine import Engine, load_engine, preflight
from millm.engine.decode.driver import wound_down
from millm.engine.dtypes import dtype_bytes, load_device, load_dtype, weights_mode
from millm.engine.worker import EngineWorker
from millm.errors import MillmError, ModelBusy, ModelLoadFailed, ModelLocked, ModelNotFound, ModelNotLoaded
from millm.registry import ModelEntry, list_models, resolve

Loader = Callable[[ModelEntry, Settings], Engine]
Registry = Callable[[str], ModelEntry]
Preflight = Callable[[ModelEntry, ModelEntry | None], None]  # raises when ``entry`` cannot replace the current

log = logging.getLogger(__name__)

PREFLIGHT_WORKERS = 2  # the checks' own threads: files that never answer hold these, never the shared pool


class ModelManager:
    """Holds the loaded engine; loads, unloads and swaps it on the engine worker.

    A load is checked first (files, quantization, memory) while the current model still serves, so a
    refusal changes nothing. From the moment an unload begins, requests are refused with model_busy
    rather than run on a half-moved model; requests already running finish first, up to
    MILLM_GRACEFUL_UNLOAD_TIMEOUT seconds, after which what is still running or queued is cancelled
    with a clean model_busy error. A load that fails after the unload leaves no model loaded, and the
    next request naming a model loads it.
    """

    def __init__(self, settings: Settings, worker: EngineWorker, engine: Engine | None = None,
                 on_load: Callable[[Engine], None] | None = None, loader: Loader = load_engine,
                 registry: Registry | None = None, preflight: Preflight | None = None) -> None:
        self.settings = settings
        self.on_load = on_load
        self.loader = loader
        self.resolve: Registry = registry or (lambda model: resolve(model, settings))
        self.preflight: Preflight = preflight or (
            lambda entry, current: default_preflight(entry, current, settings, self.resident()))
        self.worker = worker
        self.engine = engine
        self.state: str | None = None  # "LOADING" or "UNLOADING" while a swap runs
        self.locked: str | None = None  # a model locked for steering: the only one /v1 serves
        self.errors: dict[str, str] = {}  # model id -> why its last load failed (state ERROR)
        self._load_on_request = False  # after a failed swap (not after an operator's unload), a request loads
        self._target: str | None = None
        self._held: tuple[str, dict[str, int]] | None = None  # (model id, per-device bytes its load took)
        self._checks = ThreadPoolExecutor(PREFLIGHT_WORKERS, thread_name_prefix="millm-preflight")

    def named(self, model: str) -> ModelEntry:
        """The entry a model name means, by the one rule every route (/v1, /api/models, the lock) follows:
        the loaded model's id, else the registry's rule (an id, or a bare GGUF repo name while only one
        quantization of it exists), else the loaded GGUF model's bare repo name (404 when none)."""
        loaded = self.engine.entry if self.engine is not None else None
        if loaded is not None and model == loaded.id:
            return loaded
        try:
            return self.resolve(model)
        except ModelNotFound:
            if loaded is not None and loaded.engine == "llama.cpp" and loaded.repo == model:
                return loaded
            raise

    def check_lock(self, entry: ModelEntry) -> None:
        """model_locked (409) when another model than ``entry`` is locked."""
        if self.locked is not None and entry.id != self.locked:
            raise ModelLocked(f"The server is locked to '{self.locked}' for steering; '{entry.id}' is not served "
                              "until it is unlocked (POST /api/models/{id}/unlock).", param="model")

    def entry(self, model: str) -> ModelEntry:
        """The registry entry a request names (404 model_not_found if none; model_busy during a swap;
        model_locked while another model is locked)."""
        self.check_not_busy()
        found = self.named(model)
        self.check_lock(found)
        return found

    def entries(self) -> list[ModelEntry]:
        """Every model on disk, the loaded one included."""
        found = list_models(self.settings)
        if self.engine is not None and all(e.id != self.engine.model_id for e in found):
            found.append(self.engine.entry)
        return found

    def served(self) -> list[ModelEntry]:
        """What /v1/models lists: READY, LOADING and LOADED models; while locked, only the locked one."""
        found = [e for e in self.entries() if self.state_of(e.id) in ("READY", "LOADING", "LOADED")]
        return [e for e in found if e.id == self.locked] if self.locked is not None else found

    def state_of(self, model_id: str) -> str:
        """READY (on disk), LOADING, LOADED, UNLOADING or ERROR (its last load failed)."""
        loaded = self.engine is not None and self.engine.model_id == model_id
        if loaded and self.state == "UNLOADING":
            return "UNLOADING"
        if self._target == model_id and not loaded:
            return "LOADING"
        if loaded:
            return "LOADED"
        return "ERROR" if model_id in self.errors else "READY"

    def check_not_busy(self) -> None:
        """model_busy while a swap unloads or loads, naming the model that is doing so."""
        if self.state is not None:
            unloading = self.state == "UNLOADING" and self.engine is not None
            model = self.engine.model_id if unloading and self.engine is not None else self._target
            raise ModelBusy(f"The model '{model}' is {self.state.lower()}; retry once it finishes.")

    async def engine_for(self, entry: ModelEntry) -> Engine:
        """The engine serving ``entry``, loading it first (in place of the loaded model) if needed."""
        self.check_not_busy()
        if self.engine is None and not self._load_on_request:
            raise ModelNotLoaded("No model is loaded; load one with `millm serve --model ID` or "
                                 "POST /api/models/{id}/load.")
        if self.engine is None or self.engine.model_id != entry.id:
            await self.load(entry)
        assert self.engine is not None
        return self.engine

    async def load(self, entry: ModelEntry) -> None:
        """Check ``entry`` can load, unload the current model once in-flight requests finish, then load it.

        While the checks run the current model keeps serving; a second swap is refused (model_busy).
        """
        self.check_not_busy()
        if self._target is not None:
            raise ModelBusy(f"The model '{self._target}' is being loaded; retry once it finishes.")
        self.check_lock(entry)  # the management API's load too: a locked server serves only its model
        self._target = entry.id
        try:
            await self._check(entry)  # a refusal leaves the current model serving
            if self.engine is not None:
                await self._unload()
            self.state = "LOADING"
            try:
                self.engine = await self.worker.call(self._load, entry)
            except MillmError as exc:
                self._load_on_request = True
                self.errors[entry.id] = exc.message
                if isinstance(exc, ModelLoadFailed):
                    raise
                raise ModelLoadFailed(f"Loading '{entry.id}' failed after the previous model was unloaded: "
                                      f"{exc.message}") from exc
            except Exception as exc:  # any failure of the loader becomes one typed error
                self._load_on_request = True
                self.errors[entry.id] = str(exc)
                raise ModelLoadFailed(f"Loading '{entry.id}' failed: {exc}") from exc
            self.errors.pop(entry.id, None)
            log.info("loaded %s (%s)", entry.id, self.engine.fingerprint)
        finally:
            self.state = None
            self._target = None

    async def _check(self, entry: ModelEntry) -> None:
        """The preflight on its own threads, given MILLM_PREFLIGHT_TIMEOUT seconds: a model file on a mount that
        hangs fails this load, and holds neither the event loop nor the threads other requests run on."""
        current = self.engine.entry if self.engine is not None else None
        loop = asyncio.get_running_loop()
        timeout = self.settings.preflight_timeout
        try:
            await asyncio.wait_for(loop.run_in_executor(self._checks, self.preflight, entry, current), timeout)
        except TimeoutError:
            raise ModelLoadFailed(f"'{entry.id}': its files at {entry.path} did not answer within {timeout:g} s "
                                  "(MILLM_PREFLIGHT_TIMEOUT); nothing was unloaded.") from None

    def _load(self, entry: ModelEntry) -> Engine:
        """On the engine thread: load, then re-apply what was persisted for the model (its hooks).

        On CUDA the free memory of each card is read before and after, so a later swap knows what
        unloading this model gives back on each card."""
        cards = self.settings.device != "cpu" and _cuda_ready()
        before = preflight.free_memory("cuda") if cards else {}
        engine = self.loader(entry, self.settings)
        if cards:
            self._held = (entry.id, preflight.used_between(before, preflight.free_memory("cuda")))
        if self.on_load is not None:
            self.on_load(engine)
        return engine

    def resident(self) -> dict[str, int] | None:
        """What unloading the loaded model frees on each device: a torch model's own tensors, else what its
        load was measured to take; None when neither is known ({} when nothing is loaded)."""
        engine = self.engine
        if engine is None:
            return {}
        model = getattr(engine, "model", None)
        if model is not None and callable(getattr(model, "parameters", None)):
            return preflight.resident_bytes(model)
        if self._held is not None and self._held[0] == engine.model_id:
            return dict(self._held[1])
        return None

    async def unload(self) -> None:
        """Unload the loaded model (the management API's unload)."""
        self.check_not_busy()
        if self.engine is None:
            return
        self._target = self.engine.model_id
        try:
            await self._unload()
            self._load_on_request = False  # the operator chose no model: requests say so, they do not reload
        finally:
            self.state = None
            self._target = None

    async def _unload(self) -> None:
        """Let running requests finish (up to the graceful timeout), cancel the rest, then drop the engine."""
        assert self.engine is not None
        self.state = "UNLOADING"
        timeout, model_id = self.settings.graceful_unload_timeout, self.engine.model_id
        busy = ModelBusy(f"'{model_id}' was unloaded after {timeout:g} s while this request ran; retry it.")

        def stopping() -> None:
            log.warning("unloading %s: cancelling what still runs after %.0f s", model_id, timeout)

        async with wound_down(self.worker.admitted, timeout, busy, stopping):  # the driver's graceful wait
            engine, self.engine = self.engine, None
            engine.close()
        await asyncio.to_thread(_give_memory_back)


def _give_memory_back() -> None:
    gc.collect()
    torch = sys.modules.get("torch")  # only an engine that used torch has memory to give back
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _cuda_ready() -> bool:
    """Whether torch is loaded here and sees a CUDA card (nothing imports torch just to ask)."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_available())


def priced(entry: ModelEntry, settings: Settings) -> tuple[str, int]:
    """The device a load of ``entry`` uses and the bytes a parameter takes there, by the loader's own rule
    (a GGUF file on llama.cpp is its own weights: no dtype decides anything, nor is torch asked)."""
    if entry.engine == "llama.cpp":
        return settings.device, 2
    device = load_device(settings.device)
    return device, dtype_bytes(load_dtype(settings.dtype, device))


def planned_weights(entry: ModelEntry, settings: Settings) -> str:
    """How a load of ``entry`` under ``settings`` keeps its linear weights (``int8`` or ``dtype``), by the
    loader's rule; a setting that cannot apply is refused (400 naming ``weights``)."""
    device, _ = priced(entry, settings)
    dtype = "file" if entry.engine == "llama.cpp" else load_dtype(settings.dtype, device)
    return weights_mode(settings.weights, entry.engine, device, dtype)


def default_preflight(entry: ModelEntry, current: ModelEntry | None, settings: Settings,
                      freed: Mapping[str, int] | None = None) -> None:
    """Files, quantization and memory, with what unloading ``current`` frees counted as free on the devices
    it occupies (``freed``, per device). Weights are priced in the dtype the loader will use.

    Without ``freed`` the current model's weights are estimated: on a single device they are counted there;
    across several cards, whose shares are unknown, only toward a split.
    """
    device, size = priced(entry, settings)
    planned_weights(entry, settings)  # int8 where it cannot apply: 400 naming weights
    need = preflight.footprint(entry, size)
    free = preflight.free_memory(device)
    unplaced = 0
    if freed is None:
        estimate = _estimated_weights(current, settings) if current is not None else 0
        freed = {next(iter(free)): estimate} if len(free) == 1 else {}
        unplaced = estimate if len(free) > 1 else 0
    preflight.check_memory(entry, need, free, freed, unplaced)


def _estimated_weights(current: ModelEntry, settings: Settings) -> int:
    """The loaded model's weights from its files; 0 (nothing counted as freed) when they can no longer be
    read, so a swap is judged on what is surely free rather than refused for the old model's files."""
    try:
        return preflight.weights_on_disk(current, priced(current, settings)[1])
    except MillmError as exc:
        log.info("cannot estimate what unloading %s frees: %s", current.id, exc.message)
        return 0
