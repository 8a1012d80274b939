"""Bounded waits for tests that watch a live server: a wait that cannot end hangs the suite for the whole
pytest timeout, so every wait has a deadline and fails naming what it waited for."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import httpx

DEADLINE_S = 120.0


def wait_for(condition: Callable[[], bool], what: str, job: Future[Any] | None = None,
             timeout: float = DEADLINE_S, every: float = 0.01) -> None:
    """Poll ``condition`` until it holds. Fails after ``timeout`` seconds, or at once when ``job`` (the work
    that should bring the condition about) has ended without it, naming ``what`` and the job's outcome."""
    deadline = time.monotonic() + timeout
    while not condition():
        if job is not None and job.done():
            outcome = job.exception() or job.result()
            raise AssertionError(f"waited for {what}, but the job ended first: {_describe(outcome)}")
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(every)


def _describe(outcome: Any) -> str:
    if isinstance(outcome, httpx.Response):
        return f"{outcome.status_code} {outcome.text[:500]}"
    return repr(outcome)[:500]


def in_flight(base: str) -> int:
    """Requests the server at ``base`` is running now."""
    return int(httpx.get(base + "/api/health/inference", timeout=5).json()["in_flight"])


def wait_running(base: str, job: Future[Any] | None = None) -> None:
    """Until the server runs a request (``job``'s, which must not end first)."""
    wait_for(lambda: in_flight(base) > 0, "a request in flight", job)


def wait_idle(base: str) -> None:
    """Until the server runs no request."""
    wait_for(lambda: in_flight(base) == 0, "no request in flight", every=0.02)
