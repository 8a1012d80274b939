"""A ``millm serve`` subprocess for the benchmarks that go through HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx


@contextmanager
def millm_server(port: int, model: str | None = None) -> Iterator[str]:
    """Start ``millm serve`` on loopback, wait until it is ready, yield its base URL, stop it."""
    args = [sys.executable, "-m", "cli", "serve", "--port", str(port)] + (["--model", model] if model else [])
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(base + "/api/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("millm serve did not become ready")
            time.sleep(0.2)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)
