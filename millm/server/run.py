"""Serving the app with Hypercorn."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from hypercorn.asyncio import serve
from hypercorn.config import Config
from quart import Quart

from millm.server.auth import BIND_HOST, is_loopback

__all__ = ["hypercorn_config", "in_thread", "is_loopback", "run"]

log = logging.getLogger(__name__)


def hypercorn_config(host: str, port: int) -> Config:
    """Hypercorn's settings: the bind, no access log, a short graceful stop."""
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 3
    return config


def run(app: Quart, host: str, port: int) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM); the app learns the address it is bound to."""
    stop = asyncio.Event()
    app.config[BIND_HOST] = host

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        trigger: Any = stop.wait
        await serve(app, hypercorn_config(host, port), shutdown_trigger=trigger)

    asyncio.run(main())


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def in_thread(app: Quart, ready_within: float = 20) -> Iterator[str]:
    """Serve ``app`` on a free loopback port from a background thread of this process (tests and benchmarks
    drive it over real HTTP); yields its base URL once /api/health answers, stops it afterwards."""
    port = free_port()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def main() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(serve(app, hypercorn_config("127.0.0.1", port), shutdown_trigger=stop.wait))

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_within
    while True:
        try:
            httpx.get(base + "/api/health", timeout=1)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    try:
        yield base
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)
