"""API keys: one comparison, in constant time, for /v1 and /api."""

from __future__ import annotations

import hmac


def bearer_matches(header: str, key: str) -> bool:
    """``Authorization: Bearer <key>`` (the scheme is case-insensitive), compared in constant time."""
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
