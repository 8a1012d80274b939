"""What one request body may cost the server: its size (413 past MILLM_MAX_BODY_BYTES) and the time it may
take to arrive (408 past MILLM_BODY_TIMEOUT seconds), so neither a huge body nor a stalled client holds a
connection or memory for long. A body the answer never read (a request refused before its route) is read
and dropped within the same bounds, so the client's keep-alive connection stays usable: left unread, the
server closed it after the answer, and the client's next request on it failed."""

from __future__ import annotations

from typing import Any

from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout

from millm.config import Settings
from millm.errors import RequestTimeout as BodyTimeout
from millm.errors import RequestTooLarge


def install(app: Quart, settings: Settings) -> None:
    """Cap ``app``'s request bodies at ``settings.max_body_bytes`` and their arrival at ``settings.body_timeout``."""
    app.config.update(MAX_CONTENT_LENGTH=settings.max_body_bytes, BODY_TIMEOUT=settings.body_timeout)

    app.after_request(drain)

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


async def drain(response: Response) -> Response:
    """after_request: read what is left of the request's body (cached when the route read it)."""
    try:
        await request.get_data(as_text=False)
    except HTTPException:
        pass  # past a bound: the server closes the connection, as it must
    return response
