"""Sensing: every probe verdict that fired on a served generation (source ``probe``), and every sensing
cluster that fired on one (source ``cluster``: enough of its members over their thresholds,
``millm.steering.sensors``), is an event (time, request id, source, name, choice, score, threshold, position,
action) in a bounded log: ``GET /api/sensing/events?since=&source=&limit=`` reads it, ``GET /api/sensing/stream``
pushes each new event as it comes (the console's Monitor page), and ``millm_sensing_events_total`` counts them
by source. Only generation requests are watched or sensed, so scoring requests and embeddings never add one
(the contract: a judge's prompt isn't user traffic)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from prometheus_client import Counter
from quart import Blueprint, Quart, Response, current_app, request

from millm.engine.events import Sensed, Verdicts
from millm.errors import InvalidParameter
from millm.render import sse
from millm.server import metrics

bp = Blueprint("sensing", __name__, url_prefix="/api/sensing")
EXTENSION = "millm.sensing"
KEPT = 1000  # events the log keeps (the oldest go first)
SOURCES = ("probe", "cluster")
LIMIT = (1, 1000, 100)  # ?limit=: low, high, default
HEARTBEAT_S = 15.0
E = TypeVar("E")


class SensingLog:
    """The newest ``KEPT`` events, numbered from 1 in the order they came; listeners hear each new one."""

    def __init__(self, counter: Counter) -> None:
        self.events: deque[dict[str, Any]] = deque(maxlen=KEPT)
        self.counter = counter
        self.next_id = 1
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def record(self, source: str, name: str, request_id: str, fired: dict[str, Any]) -> None:
        """Add an event of ``source`` (a probe's fired verdict, a cluster's firing: a cluster takes no action,
        so its ``action`` is null)."""
        with self._lock:
            self.events.append({"id": self.next_id, "time": time.time(), "source": source, "name": name,
                                "request_id": request_id, "index": fired["index"], "score": fired["score"],
                                "threshold": fired["threshold"], "position": fired["position"],
                                "action": fired.get("action"), "acted": fired.get("acted", False)})
            self.next_id += 1
            listeners = list(self._listeners)
        self.counter.labels(source).inc()
        for wake in listeners:
            wake()

    def read(self, since: int = 0, source: str | None = None, limit: int = LIMIT[2]) -> list[dict[str, Any]]:
        """The events after id ``since`` (of ``source``), oldest first, at most ``limit``."""
        with self._lock:
            found = [e for e in self.events if e["id"] > since and (source is None or e["source"] == source)]
        return found[:limit]

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(wake)
        return lambda: self._listeners.remove(wake)


def install(app: Quart) -> None:
    counter = Counter("millm_sensing_events", "Sensing events recorded (fired probe verdicts, clusters whose "
                      "members exceeded their thresholds), by source.",
                      ["source"], registry=metrics.of(app).registry)
    app.extensions[EXTENSION] = SensingLog(counter)
    app.register_blueprint(bp)


def log() -> SensingLog:
    found: SensingLog = current_app.extensions[EXTENSION]
    return found


def sensed(events: AsyncIterator[E], request_id: str) -> AsyncIterator[E]:
    """``events`` passed on, each fired verdict among them recorded under ``request_id``, and each cluster
    firing recorded and taken out (no response carries one)."""
    return _sensed(events, request_id, log())


async def _sensed(events: AsyncIterator[E], request_id: str, found: SensingLog) -> AsyncIterator[E]:
    async for event in events:
        if isinstance(event, Sensed):
            for fired in event.body:
                found.record("cluster", fired["cluster"], request_id, fired)
            continue
        if isinstance(event, Verdicts):
            for verdict in event.body:
                if verdict["fired"]:
                    found.record("probe", verdict["probe"], request_id, verdict)
        yield event


def _query() -> tuple[int, str | None, int]:
    args = request.args
    try:
        since = int(args.get("since", "0"))
        limit = int(args.get("limit", str(LIMIT[2])))
    except ValueError:
        raise InvalidParameter("'since' and 'limit' must be integers.", param="since") from None
    if not LIMIT[0] <= limit <= LIMIT[1]:
        raise InvalidParameter(f"'limit' must be between {LIMIT[0]} and {LIMIT[1]}, got {limit}.", param="limit")
    source = args.get("source")
    if source is not None and source not in SOURCES:
        raise InvalidParameter(f"'source' must be one of {', '.join(SOURCES)}, got {source!r}.", param="source")
    return since, source, limit


@bp.get("/events")
async def sensing_events() -> Any:
    """The sensing events after ``since`` (an event id; default 0, every one kept), of ``source``, oldest first,
    at most ``limit``; ``last_id`` is where the next read starts."""
    since, source, limit = _query()
    found = log().read(since, source, limit)
    return {"object": "list", "data": found, "last_id": found[-1]["id"] if found else since}


@bp.get("/stream")
async def sensing_stream() -> Any:
    """Server-sent ``sensing`` events, one per new event (after ``since``), as they are recorded."""
    since, source, _ = _query()
    found, loop, changed = log(), asyncio.get_running_loop(), asyncio.Event()

    def wake() -> None:  # called on the thread that recorded the event
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(changed.set)

    async def events() -> AsyncIterator[str]:
        nonlocal since
        stop = found.listen(wake)
        try:
            while True:
                changed.clear()
                for event in found.read(since, source, LIMIT[1]):
                    since = event["id"]
                    yield sse.event("sensing", event)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), HEARTBEAT_S)
                if not changed.is_set():
                    yield sse.COMMENT
        finally:
            stop()

    response = Response(events(), mimetype="text/event-stream", headers={"Cache-Control": "no-store"})
    response.timeout = None
    return response
