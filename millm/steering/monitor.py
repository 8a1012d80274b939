"""Monitoring: chosen features of one SAE, recorded per generation request (pre_steering).

A bounded history of per-request summaries and running statistics over every position read.
Embeddings and scoring run with hooks suppressed, so they record nothing.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from millm.errors import InvalidParameter

if TYPE_CHECKING:
    from millm.steering.core import SteeringCore

MAX_FEATURES = 1024
DEFAULT_HISTORY = 100
MAX_HISTORY = 100_000


@dataclass
class MonitorConfig:
    enabled: bool = False
    sae: str | None = None
    features: list[int] = field(default_factory=list)
    history: int = DEFAULT_HISTORY


def parse_monitor_config(data: dict[str, Any], steering: SteeringCore, history_now: int) -> MonitorConfig:
    """A monitoring configuration checked against the attached SAEs; each problem names its field."""
    enabled = data.get("enabled", True)
    if not isinstance(enabled, bool):
        raise InvalidParameter("'enabled' must be true or false.", param="enabled")
    sae_id = data.get("sae")
    features = data.get("features", [])
    history = data.get("history", history_now)
    if enabled:
        if sae_id is None and len(steering.attachments) == 1:
            sae_id = next(iter(steering.attachments))
        att = steering.resolve_sae(sae_id) if sae_id is not None else None
        if att is None:
            raise InvalidParameter("'sae' (an attached SAE) is required to monitor.", param="sae")
        sae_id = att.sae_id
        if not isinstance(features, list) or not features or len(features) > MAX_FEATURES or not all(
                isinstance(f, int) and not isinstance(f, bool) and 0 <= f < att.sae.d_sae for f in features):
            raise InvalidParameter(f"'features' must be 1-{MAX_FEATURES} feature indices below {att.sae.d_sae}.",
                                   param="features")
    if isinstance(history, bool) or not isinstance(history, int) or not 1 <= history <= MAX_HISTORY:
        raise InvalidParameter(f"'history' must be an integer from 1 to {MAX_HISTORY}.", param="history")
    return MonitorConfig(enabled, sae_id, list(dict.fromkeys(features)), history)


class Monitor:
    """Per-request activation summaries plus running statistics for the configured features."""

    def __init__(self) -> None:
        self.config = MonitorConfig()
        self.history: deque[dict[str, Any]] = deque(maxlen=DEFAULT_HISTORY)
        self._lock = threading.Lock()
        self._reset_stats()

    def _reset_stats(self) -> None:
        n = len(self.config.features)
        self.positions = 0
        self.sums = torch.zeros(n, dtype=torch.float64)
        self.maxes = torch.zeros(n, dtype=torch.float64)
        self.active = torch.zeros(n, dtype=torch.long)

    def configure(self, config: MonitorConfig) -> None:
        with self._lock:
            self.config = config
            self.history = deque(self.history, maxlen=config.history)
            self._reset_stats()

    def clear_history(self) -> None:
        with self._lock:
            self.history.clear()

    def session(self) -> MonitorSession:
        return MonitorSession(self, torch.tensor(self.config.features, dtype=torch.long), self.config)

    def commit(self, session: MonitorSession, model: str) -> None:
        """Add a finished request; one that started under an older configuration is dropped, not misfiled."""
        if session.positions == 0:
            return
        with self._lock:
            if session.config is not self.config:
                return
            self.positions += session.positions
            self.sums += session.sums
            self.maxes = torch.maximum(self.maxes, session.maxes)
            self.active += session.active
            feats = {str(f): {"max": round(float(mx), 6), "mean": round(float(s) / session.positions, 6)}
                     for f, s, mx in zip(self.config.features, session.sums.tolist(), session.maxes.tolist())}
            self.history.append({"id": "mon-" + uuid.uuid4().hex[:12], "time": time.time(), "model": model,
                                 "sae": self.config.sae, "positions": session.positions, "features": feats})

    def stats(self) -> dict[str, Any]:
        with self._lock:
            n = max(self.positions, 1)
            return {"sae": self.config.sae, "positions": self.positions, "requests_in_history": len(self.history),
                    "features": {str(f): {"mean": float(s) / n, "max": float(mx), "active_fraction": float(a) / n}
                                 for f, s, mx, a in zip(self.config.features, self.sums.tolist(), self.maxes.tolist(),
                                                        self.active.tolist())}}

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {"enabled": c.enabled, "sae": c.sae, "features": c.features, "history": c.history}


@dataclass
class MonitorSession:
    """What one request contributes; filled by the SAE hook's pre-steering reader."""

    monitor: Monitor
    features: torch.Tensor
    config: MonitorConfig
    positions: int = 0
    sums: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    maxes: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    active: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    sae: Any = None

    def __post_init__(self) -> None:
        n = len(self.features)
        self.sums = torch.zeros(n, dtype=torch.float64)
        self.maxes = torch.zeros(n, dtype=torch.float64)
        self.active = torch.zeros(n, dtype=torch.long)

    def __call__(self, hidden: torch.Tensor) -> None:
        acts = self.sae.encode(hidden.reshape(-1, hidden.shape[-1]), self.features.to(hidden.device))
        acts = acts.double().cpu()
        self.positions += acts.shape[0]
        self.sums += acts.sum(0)
        self.maxes = torch.maximum(self.maxes, acts.max(0).values)
        self.active += (acts > 0).sum(0)
