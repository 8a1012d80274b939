"""This process's loaded engines and its steering service: what the CLI and the TUI share in-process.

Heavy modules are imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from millm.config import get_settings

if TYPE_CHECKING:
    from millm.engine.base import Engine
    from millm.steering.service import SteeringService

ENGINES: dict[str, Engine] = {}  # model id -> its engine, loaded once per process


def steering_service() -> SteeringService:
    """The SAE registry, profiles and persisted steering under MILLM_HOME."""
    from millm.steering.service import SteeringService
    from millm.store import Store

    return SteeringService(Store(get_settings().home / "millm.db"))


def engine_for(model: str | None,
               loading: Callable[[str], AbstractContextManager[object]] = lambda _: nullcontext()) -> Engine:
    """The engine for ``model`` (default: the configured default), loaded once per process (inside
    ``loading(model_id)``, a progress display), with the SAE attachments and steering values persisted for
    it re-applied."""
    from millm.engine import load_engine
    from millm.engine.manager import planned_weights
    from millm.registry import resolve

    settings = get_settings()
    entry = resolve(model or settings.default_model, settings, paths=True)
    wanted = planned_weights(entry, settings)  # refused here even when the model is loaded already
    if entry.id not in ENGINES or ENGINES[entry.id].weights != wanted:  # a load's settings are honoured, not
        with loading(entry.id):  # dropped because an engine loaded under others is at hand
            engine = load_engine(entry, settings)
            steering_service().restore(engine.steering_target())
            ENGINES[entry.id] = engine
    return ENGINES[entry.id]
