"""Monitoring: chosen features of one SAE, recorded per generation request (pre_steering).

A bounded history of per-request summaries and running statistics over every position read.
Embeddings and scoring run with hooks suppressed, so they record nothing.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from millm.errors import InvalidParameter

if TYPE_CHECKING:
    from millm.steering.core import SteeringCore

MAX_FEATURES = 1024
DEFAULT_HISTORY = 100
MAX_HISTORY = 100_000
DIGITS = 6  # a history entry's rounding


@dataclass
class MonitorConfig:
    """What is monitored: chosen ``features`` of one SAE, or all ``width`` of them with the ``top_k`` reported."""

    enabled: bool = False
    sae: str | None = None
    features: list[int] = field(default_factory=list)
    history: int = DEFAULT_HISTORY
    top_k: int | None = None
    width: int = 0  # the SAE's feature count (what top-K mode reads)

    @property
    def tracked(self) -> list[int]:
        """The features read at each position: the chosen ones, or every feature in top-K mode."""
        return list(range(self.width)) if self.top_k is not None else self.features


def _count(value: Any, name: str, high: int) -> int:
    """An integer from 1 to ``high``, or an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InvalidParameter(f"'{name}' must be an integer from 1 to {high}.", param=name)
    return value


def _features(value: Any, width: int) -> list[int]:
    """1-MAX_FEATURES distinct feature indices below ``width``, or an error naming 'features'."""
    if not isinstance(value, list) or not value or len(value) > MAX_FEATURES or not all(
            isinstance(f, int) and not isinstance(f, bool) and 0 <= f < width for f in value):
        raise InvalidParameter(f"'features' must be 1-{MAX_FEATURES} feature indices below {width}.", param="features")
    return list(dict.fromkeys(value))


def parse_monitor_config(data: dict[str, Any], steering: SteeringCore, history_now: int) -> MonitorConfig:
    """A monitoring configuration checked against the attached SAEs; each problem names its field.

    Either ``features`` (chosen indices) or ``top_k`` (every feature read, the K strongest reported)."""
    enabled = data.get("enabled", True)
    if not isinstance(enabled, bool):
        raise InvalidParameter("'enabled' must be true or false.", param="enabled")
    history = _count(data.get("history", history_now), "history", MAX_HISTORY)
    if not enabled:
        return MonitorConfig(False, data.get("sae"), [], history)
    sae_id = data.get("sae")
    if sae_id is None and len(steering.attachments) == 1:
        sae_id = next(iter(steering.attachments))
    att = steering.resolve_sae(sae_id) if sae_id is not None else None
    if att is None:
        raise InvalidParameter("'sae' (an attached SAE) is required to monitor.", param="sae")
    width = att.sae.d_sae
    if data.get("top_k") is None:
        return MonitorConfig(True, att.sae_id, _features(data.get("features"), width), history, width=width)
    if data.get("features"):
        raise InvalidParameter("Give 'features' or 'top_k', not both.", param="top_k")
    return MonitorConfig(True, att.sae_id, [], history, _count(data["top_k"], "top_k", MAX_FEATURES), width)


class Tally:
    """Running per-feature statistics over positions: count of firings, sum, sum of squares, min and max."""

    def __init__(self, n: int) -> None:
        self.positions = 0
        self.sums = torch.zeros(n, dtype=torch.float64)
        self.squares = torch.zeros(n, dtype=torch.float64)
        self.mins = torch.full((n,), math.inf, dtype=torch.float64)
        self.maxes = torch.full((n,), -math.inf, dtype=torch.float64)
        self.active = torch.zeros(n, dtype=torch.long)

    def add(self, acts: torch.Tensor) -> None:
        """Fold in ``[positions, n]`` activations."""
        self.positions += acts.shape[0]
        self.sums += acts.sum(0)
        self.squares += acts.square().sum(0)
        self.mins = torch.minimum(self.mins, acts.min(0).values)
        self.maxes = torch.maximum(self.maxes, acts.max(0).values)
        self.active += (acts > 0).sum(0)

    def merge(self, other: Tally) -> None:
        self.positions += other.positions
        self.sums += other.sums
        self.squares += other.squares
        self.mins = torch.minimum(self.mins, other.mins)
        self.maxes = torch.maximum(self.maxes, other.maxes)
        self.active += other.active

    def rows(self, features: list[int], top_k: int | None) -> dict[str, dict[str, float | int]]:
        """Each feature's figures; with ``top_k``, only the K with the highest mean, strongest first.

        ``count`` is the positions where the feature fired; ``std`` is over every position read."""
        n = max(self.positions, 1)
        means = self.sums / n
        order = torch.argsort(means, descending=True, stable=True)[:top_k] if top_k else range(len(features))
        std = (self.squares / n - means.square()).clamp_min(0).sqrt()
        seen = self.positions > 0  # before any position, min and max are the identities +-inf: shown as 0
        out: dict[str, dict[str, float | int]] = {}
        for i in [int(i) for i in order]:
            out[str(features[i])] = {
                "count": int(self.active[i]), "mean": float(means[i]), "std": float(std[i]),
                "min": float(self.mins[i]) if seen else 0.0, "max": float(self.maxes[i]) if seen else 0.0,
                "active_fraction": float(self.active[i]) / n}
        return out


Listener = Callable[[], None]


class Monitor:
    """Per-request activation summaries plus running statistics for the configured features.

    Listeners (the push route) are told after every change: a request committed, a new configuration, a
    cleared history. They are called on the thread that made the change and must only hand it on."""

    def __init__(self) -> None:
        self.config = MonitorConfig()
        self.history: deque[dict[str, Any]] = deque(maxlen=DEFAULT_HISTORY)
        self.tally = Tally(0)
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` after every change; returns the function that stops it."""
        with self._lock:
            self._listeners.append(listener)

        def stop() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)
        return stop

    def _changed(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    def configure(self, config: MonitorConfig) -> None:
        with self._lock:
            self.config = config
            self.history = deque(self.history, maxlen=config.history)
            self.tally = Tally(len(config.tracked))
        self._changed()

    def clear_history(self) -> None:
        with self._lock:
            self.history.clear()
        self._changed()

    def session(self) -> MonitorSession:
        return MonitorSession(self, torch.tensor(self.config.tracked, dtype=torch.long), self.config)

    def commit(self, session: MonitorSession, model: str) -> None:
        """Add a finished request; one that started under an older configuration is dropped, not misfiled."""
        if session.tally.positions == 0:
            return
        with self._lock:
            if session.config is not self.config:
                return
            self.tally.merge(session.tally)
            features = {f: {"max": round(row["max"], DIGITS), "mean": round(row["mean"], DIGITS)}
                        for f, row in session.tally.rows(self.config.tracked, self.config.top_k).items()}
            self.history.append({"id": "mon-" + uuid.uuid4().hex[:12], "time": time.time(), "model": model,
                                 "sae": self.config.sae, "positions": session.tally.positions, "features": features})
        self._changed()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            c = self.config
            return {"sae": c.sae, "positions": self.tally.positions, "requests_in_history": len(self.history),
                    "top_k": c.top_k, "features": self.tally.rows(c.tracked, c.top_k)}

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {"enabled": c.enabled, "sae": c.sae, "features": c.features, "top_k": c.top_k, "history": c.history}


@dataclass
class MonitorSession:
    """What one request contributes; filled by the SAE hook's pre-steering reader."""

    monitor: Monitor
    features: torch.Tensor
    config: MonitorConfig
    sae: Any = None
    tally: Tally = field(init=False)

    def __post_init__(self) -> None:
        self.tally = Tally(len(self.features))

    @property
    def positions(self) -> int:
        return self.tally.positions

    def __call__(self, hidden: torch.Tensor) -> None:
        selected = None if self.config.top_k is not None else self.features.to(hidden.device)
        acts = self.sae.encode(hidden.reshape(-1, hidden.shape[-1]), selected)
        self.tally.add(acts.double().cpu())
