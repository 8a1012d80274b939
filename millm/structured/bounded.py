"""Caches keyed by what requests send (schemas, tool sets), bounded by entries and by bytes.

A judge repeats its schema, so compiling or checking one once pays; but the keys are client-chosen, so an
unbounded cache is memory any client can fill (one distinct schema per request grew a server by about 1 GB
every 4 minutes). Every such cache is a ``BoundedCache``: least recently used entries go first, as soon as
either bound is passed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from functools import wraps
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """At most ``max_entries`` entries whose ``size(key, value)`` adds up to at most ``max_bytes``, least
    recently used out first. Safe to share between threads; a value larger than ``max_bytes`` is not kept."""

    def __init__(self, max_entries: int, max_bytes: int, size: Callable[[K, V], int]) -> None:
        self.max_entries, self.max_bytes, self._size = max_entries, max_bytes, size
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: K, value: V) -> None:
        nbytes = self._size(key, value)
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.nbytes -= old[1]
            if nbytes > self.max_bytes:
                return
            self._items[key] = (value, nbytes)
            self.nbytes += nbytes
            while len(self._items) > self.max_entries or self.nbytes > self.max_bytes:
                _, (_, gone) = self._items.popitem(last=False)
                self.nbytes -= gone

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.nbytes = 0


def bounded(max_entries: int, max_bytes: int) -> Callable[[Callable[[str], V]], Callable[[str], V]]:
    """Memoise a function of one string (a schema's or a grammar's text) in a ``BoundedCache`` whose entries
    are counted by their key's length: ``functools.lru_cache`` bounds entries alone, and these keys run to
    megabytes."""
    def wrap(fn: Callable[[str], V]) -> Callable[[str], V]:
        cache: BoundedCache[str, tuple[V]] = BoundedCache(max_entries, max_bytes, lambda key, _: len(key))

        @wraps(fn)
        def memoised(key: str) -> V:
            found = cache.get(key)
            if found is None:
                found = (fn(key),)
                cache.put(key, found)
            return found[0]

        memoised.cache = cache  # type: ignore[attr-defined]
        return memoised
    return wrap
