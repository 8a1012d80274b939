"""The engine thread's busy time: an executor that adds up how long its tasks ran (for /metrics)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class TimedExecutor(ThreadPoolExecutor):
    """A ThreadPoolExecutor whose ``busy_seconds`` is the total time its tasks spent running."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._busy = 0.0
        self._busy_lock = threading.Lock()

    @property
    def busy_seconds(self) -> float:
        return self._busy

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        def timed() -> T:
            started = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._busy_lock:
                    self._busy += time.monotonic() - started
        return super().submit(timed)
