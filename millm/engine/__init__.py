"""The engine core every front end shares."""

from __future__ import annotations

from millm.config import Settings
from millm.engine.transformers_engine import TransformersEngine
from millm.registry import ModelEntry


def load_engine(entry: ModelEntry, settings: Settings) -> TransformersEngine:
    """Load the engine that runs ``entry``."""
    return TransformersEngine.load(entry, settings)


__all__ = ["TransformersEngine", "load_engine"]
