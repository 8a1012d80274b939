"""The engine core every front end shares. Engines import lazily: nothing here loads torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from millm.engine.base import Capabilities, Engine, StepControl

if TYPE_CHECKING:
    from millm.config import Settings
    from millm.registry import ModelEntry


def load_engine(entry: ModelEntry, settings: Settings) -> Engine:
    """Load the engine that runs ``entry``: llama.cpp for GGUF ids, transformers otherwise. ``MILLM_WEIGHTS=int8``
    on llama.cpp is refused here (400 naming ``weights``), before anything loads."""
    if entry.engine == "llama.cpp":
        from millm.engine.dtypes import weights_mode

        weights_mode(settings.weights, entry.engine, settings.device, "file")
        from millm.engine.llama_engine import LlamaCppEngine

        return LlamaCppEngine.load(entry, settings)
    from millm.engine.transformers_engine import TransformersEngine

    return TransformersEngine.load(entry, settings)


__all__ = ["Capabilities", "Engine", "StepControl", "load_engine"]
