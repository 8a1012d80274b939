"""The one path every route's JSON body takes: read, then decoded by ``millm.requests.jsonbody``'s rules."""

from __future__ import annotations

import asyncio
from typing import Any

from quart import request

from millm.requests.jsonbody import decode
from millm.server.origins import check_body_type


async def read_json(*, required: bool = True) -> Any:
    """The current request's JSON body, decoded off the event loop (a large body must not stall other
    routes). Without ``required`` an empty body is ``{}``; a /v1 body must be present."""
    raw = await request.get_data(as_text=False)  # get_data applies BODY_TIMEOUT (MILLM_BODY_TIMEOUT); .body does not
    assert isinstance(raw, bytes)
    check_body_type(request.mimetype, bool(raw))
    if not raw and not required:
        return {}
    return await asyncio.to_thread(decode, raw)
