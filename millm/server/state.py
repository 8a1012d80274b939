"""What the server's routes share: settings, the engine worker and the model manager."""

from __future__ import annotations

from dataclasses import dataclass

from quart import current_app

from millm.config import Settings
from millm.engine.manager import ModelManager
from millm.engine.worker import EngineWorker
from millm.steering.service import SteeringService


@dataclass
class Services:
    settings: Settings
    worker: EngineWorker
    manager: ModelManager
    steering: SteeringService


def services() -> Services:
    """The current app's services."""
    return current_app.extensions["millm"]
