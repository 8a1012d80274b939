"""Running the real app under Hypercorn on a loopback port, for tests that drive it over HTTP."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from hypercorn.asyncio import serve
from quart import Quart

from millm.server.run import hypercorn_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def live_server(app: Quart) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 in a background thread; yields the base URL."""
    port = free_port()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def main() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(serve(app, hypercorn_config("127.0.0.1", port), shutdown_trigger=stop.wait))

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
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
