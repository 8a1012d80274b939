"""Persistence in MILLM_HOME (SQLite; no server to start)."""

from millm.store.db import Store

__all__ = ["Store"]
