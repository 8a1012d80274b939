"""A ``millm serve`` subprocess for the benchmarks that go through HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


@contextmanager
def millm_process(port: int, args: list[str] | None = None, env: dict[str, str] | None = None,
                  log: Path | None = None, ready_within: float = 300) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Start ``millm serve`` on loopback (extra ``args``, ``env`` over this process's), wait until it is ready,
    yield (base URL, process), stop it. Its stderr goes to ``log`` when given."""
    command = [sys.executable, "-m", "cli", "serve", "--port", str(port), *(args or [])]
    stderr = log.open("wb") if log else subprocess.DEVNULL
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, **(env or {})})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_within
        while True:
            try:
                if httpx.get(base + "/api/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("millm serve did not become ready" + (f" (log: {log})" if log else ""))
            time.sleep(0.2)
        yield base, server
    finally:
        server.terminate()
        server.wait(timeout=30)
        if log:
            stderr.close()  # type: ignore[union-attr]


@contextmanager
def millm_server(port: int, model: str | None = None) -> Iterator[str]:
    """Start ``millm serve`` on loopback, wait until it is ready, yield its base URL, stop it."""
    with millm_process(port, ["--model", model] if model else None, ready_within=120) as (base, _):
        yield base
