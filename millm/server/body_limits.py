"""What one request body may cost the server: its size (413 past MILLM_MAX_BODY_BYTES) and the time it may
take to arrive (408 past MILLM_BODY_TIMEOUT seconds), so neither a huge body nor a stalled client holds a
connection or memory for long."""

from __future__ import annotations

from typing import Any

from quart import Quart
from werkzeug.exceptions import RequestEntityTooLarge, RequestTimeout

from millm.config import Settings


def error_body(message: str, code: str) -> dict[str, Any]:
    """An OpenAI-shaped error body for a refusal decided before the request is parsed."""
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


def install(app: Quart, settings: Settings) -> None:
    """Cap ``app``'s request bodies at ``settings.max_body_bytes`` and their arrival at ``settings.body_timeout``."""
    app.config.update(MAX_CONTENT_LENGTH=settings.max_body_bytes, BODY_TIMEOUT=settings.body_timeout)

    @app.errorhandler(RequestEntityTooLarge)
    async def too_large(_: RequestEntityTooLarge) -> Any:
        return error_body(f"The request body is larger than this server takes ({settings.max_body_bytes} bytes, "
                          "MILLM_MAX_BODY_BYTES).", "request_too_large"), 413

    @app.errorhandler(RequestTimeout)
    async def too_slow(_: RequestTimeout) -> Any:
        return error_body(f"The request body did not arrive within {settings.body_timeout:g} seconds "
                          "(MILLM_BODY_TIMEOUT).", "request_timeout"), 408
