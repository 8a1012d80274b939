"""The engine core every front end shares."""

from __future__ import annotations

from typing import Union

from millm.config import Settings
from millm.engine.llama_engine import LlamaCppEngine
from millm.engine.transformers_engine import TransformersEngine
from millm.registry import ModelEntry

Engine = Union[TransformersEngine, LlamaCppEngine]


def load_engine(entry: ModelEntry, settings: Settings) -> Engine:
    """Load the engine that runs ``entry``: llama.cpp for GGUF ids, transformers otherwise."""
    if entry.engine == "llama.cpp":
        return LlamaCppEngine.load(entry, settings)
    return TransformersEngine.load(entry, settings)


__all__ = ["Engine", "LlamaCppEngine", "TransformersEngine", "load_engine"]
