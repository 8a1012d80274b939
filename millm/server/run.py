"""Serving the app with Hypercorn."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config
from quart import Quart

from millm.server.auth import BIND_HOST, is_loopback

__all__ = ["hypercorn_config", "is_loopback", "run"]

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
