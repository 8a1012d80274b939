"""Running the real app under Hypercorn on a loopback port, for tests that drive it over HTTP."""

from __future__ import annotations

from millm.server.run import free_port, in_thread

live_server = in_thread

__all__ = ["free_port", "live_server"]
