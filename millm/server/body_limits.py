"""What one request body may cost the server: its size (413 past MILLM_MAX_BODY_BYTES) and the time it may
take to arrive (408 past MILLM_BODY_TIMEOUT seconds), so neither a huge body nor a stalled client holds a
connection or memory for long."""

from __future__ import annotations

from typing import Any

from quart import Quart
from werkzeug.exceptions import RequestEntityTooLarge, RequestTimeout

from millm.config import Settings
from millm.errors import RequestTimeout as BodyTimeout
from millm.errors import RequestTooLarge


def install(app: Quart, settings: Settings) -> None:
    """Cap ``app``'s request bodies at ``settings.max_body_bytes`` and their arrival at ``settings.body_timeout``."""
    app.config.update(MAX_CONTENT_LENGTH=settings.max_body_bytes, BODY_TIMEOUT=settings.body_timeout)

    @app.errorhandler(RequestEntityTooLarge)
    async def too_large(_: RequestEntityTooLarge) -> Any:
        error = RequestTooLarge(f"The request body is larger than this server takes ({settings.max_body_bytes} "
                                "bytes, MILLM_MAX_BODY_BYTES).")
        return error.body(), error.status

    @app.errorhandler(RequestTimeout)
    async def too_slow(_: RequestTimeout) -> Any:
        error = BodyTimeout(f"The request body did not arrive within {settings.body_timeout:g} seconds "
                            "(MILLM_BODY_TIMEOUT).")
        return error.body(), error.status
