"""The console's route: ``/`` serves the page, ``/console/static/...`` its modules and styles.

Only files are served here; the page reads and changes the server through the public ``/api`` and ``/v1`` routes
from the browser (the same rules, keys and refusals as any client). Every console response carries a strict
Content-Security-Policy: scripts, styles and requests from this server only, no inline script, no eval, no
frames, so text a model or an SAE file supplies cannot run even if it reached the page as markup.
Registered by :func:`millm.server.app.create_app` unless ``MILLM_CONSOLE=false`` (then ``/`` is a 404).
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, send_from_directory
from werkzeug.exceptions import NotFound

from millm.console import ROOT, STATIC

bp = Blueprint("console", __name__)

CSP = "; ".join([
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "connect-src 'self'",
    "img-src 'self' data:",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
])
"""The console's Content-Security-Policy: everything from this origin only, nothing inline."""
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",  # revalidate: an upgraded server's page never runs last version's modules
}
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml"}
"""The types the console's files are served as (an ES module must come as JavaScript, whatever the OS's
mimetypes table says)."""


def secured(response: Response) -> Response:
    """``response`` with the console's security headers and its file's type."""
    for name, value in HEADERS.items():
        response.headers[name] = value
    return response


async def _file(directory: Any, name: str) -> Response:
    """One of the console's files (a path outside ``directory`` or of an unknown type is a 404)."""
    kind = TYPES.get("." + name.rsplit(".", 1)[-1]) if "." in name else None
    if kind is None:
        raise NotFound()
    response = await send_from_directory(directory, name)
    response.headers["Content-Type"] = kind
    return secured(response)


@bp.get("/")
async def page() -> Response:
    """The console: one page whose sections are addressed by the URL's fragment (``/#/steering``)."""
    return await _file(ROOT, "index.html")


@bp.get("/console/static/<path:name>")
async def static_file(name: str) -> Response:
    """The console's modules, styles and images."""
    return await _file(STATIC, name)
