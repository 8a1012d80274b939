"""``millm serve`` says where the console is, and ``--no-console`` (as ``MILLM_CONSOLE=false``) serves none: run in a
process of its own on the scripted engine (``python -m tests.support.cli``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from tests.support.live import free_port


def serve(*flags: str, **env: str) -> tuple[int, str]:
    """Start ``millm serve`` with ``flags``, GET / once it answers, stop it; (that status, its stderr)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.cli", "serve", "--port", str(port), *flags],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    return status, stderr.replace(str(port), "PORT")


def test_serve_prints_the_consoles_address_and_serves_it():
    status, stderr = serve()
    assert status == 200 and "console: http://127.0.0.1:PORT/" in stderr


def test_no_console_and_the_setting_turn_it_off():
    for flags, env in [(("--no-console",), {}), ((), {"MILLM_CONSOLE": "false"})]:
        status, stderr = serve(*flags, **env)
        assert status == 404 and "console:" not in stderr, (flags, env)
