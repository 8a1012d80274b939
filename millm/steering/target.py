"""The typed seam between the engine and steering: what an engine needs of steering, and what steering needs
of a loaded model.

Steering never imports an engine: ``SteeringService`` and the rest of ``millm.steering`` are typed against
``SteeringTarget``, which an engine that can be steered hands out (``Engine.steering_target()``; one that
cannot returns None). The engine reaches steering only through this module: every name it uses is
re-exported here, and an import-linter contract (pyproject.toml) keeps any other path closed.
"""

from __future__ import annotations

from dataclasses import dataclass

from millm.steering.controller import RowView, Steering
from millm.steering.core import Reader, RequestSteering, SteeringCore, own_values
from millm.steering.cvec import ROW, ControlVector, ControlVectorSteering
from millm.steering.monitor import Monitor, MonitorSession
from millm.steering.probe import PROMPT as PROBE_PROMPT
from millm.steering.probe import RESPONSE as PROBE_RESPONSE
from millm.steering.probe import Watch, reader_key
from millm.steering.readout import UNSTEERED, ReadoutAsk, ReadoutRecorder, ReadoutSpec, bind_readout
from millm.steering.scope import GENERATED_PHASE, PROMPT_PHASE, Scope, applies
from millm.steering.sensing import ClusterSensing, sensing_for
from millm.steering.watching import Watching

__all__ = ["GENERATED_PHASE", "PROBE_PROMPT", "PROBE_RESPONSE", "PROMPT_PHASE", "ROW", "UNSTEERED", "ClusterSensing",
           "ControlVector", "ControlVectorSteering", "Monitor", "MonitorSession", "ReadoutAsk", "ReadoutRecorder",
           "ReadoutSpec", "Reader", "RequestSteering", "RowView", "Scope", "Steering", "SteeringCore", "SteeringTarget",
           "Watch", "Watching", "applies", "bind_readout", "own_values", "reader_key", "sensing_for"]


@dataclass(frozen=True)
class SteeringTarget:
    """A steerable model: ``steering`` holds its attachments and values (applied by hooks on a transformers
    model, by control vectors on llama.cpp), ``monitor`` what it records, ``reads`` whether its residual can
    be read there (monitoring, read-outs: the engine's capability record says so)."""

    model_id: str
    steering: SteeringCore
    monitor: Monitor
    reads: bool = True
