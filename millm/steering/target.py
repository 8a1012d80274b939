"""What steering needs of a loaded model: its id, its hook controller and its monitor.

``SteeringService`` is typed against this, so ``millm.steering`` never imports an engine. An engine
that can be steered hands one out (``Engine.steering_target()``); one that cannot returns None.
"""

from __future__ import annotations

from dataclasses import dataclass

from millm.steering.controller import Steering
from millm.steering.monitor import Monitor


@dataclass(frozen=True)
class SteeringTarget:
    """A steerable model: ``steering`` holds its hooks and values, ``monitor`` what it records."""

    model_id: str
    steering: Steering
    monitor: Monitor
