"""Who may call what: the API keys for /v1 and /api, and the loopback rule for /api mutations.

The rules, written once here:

- ``/v1`` needs ``MILLM_API_KEY`` when it is set.
- ``/api`` reads need ``MILLM_API_KEY`` (or the admin key) when the API key is set; otherwise they are open.
- ``/api`` mutations need ``MILLM_ADMIN_KEY`` when it is set, else ``MILLM_API_KEY`` when that is set;
  with no key at all they are allowed only while the server is bound to loopback, and refused (403)
  when it is bound beyond it.

Keys are compared in constant time; the ``Bearer`` scheme is case-insensitive. Every 401 carries
``WWW-Authenticate: Bearer`` and every 405 an ``Allow`` header listing the methods the path takes.
"""

from __future__ import annotations

import hmac
import ipaddress

from quart import Quart, Response, current_app, request
from werkzeug.exceptions import MethodNotAllowed, NotFound

from millm.config import Settings
from millm.errors import ManagementForbidden, Unauthorized

BIND_HOST = "MILLM_BIND_HOST"  # app.config key: the address `millm serve` bound (absent: an in-process app)
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def bearer_matches(header: str, key: str) -> bool:
    """``Authorization: Bearer <key>`` (the scheme is case-insensitive), compared in constant time."""
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bound_to_loopback(app: Quart) -> bool:
    """Whether the app is reachable only from this machine (an app no server bound is, e.g. a test client)."""
    host = app.config.get(BIND_HOST)
    return host is None or is_loopback(host)


def require_api_key(settings: Settings, authorization: str) -> None:
    """/v1: the API key when one is set (401 otherwise)."""
    key = settings.api_key
    if key and not bearer_matches(authorization, key):
        raise Unauthorized("A valid API key is required: send 'Authorization: Bearer <MILLM_API_KEY>'.")


def _require_reader(api_key: str | None, admin_key: str | None, authorization: str) -> None:
    """A read: the API key or the admin key when an API key is set; anyone otherwise."""
    if api_key and not any(k and bearer_matches(authorization, k) for k in (api_key, admin_key)):
        raise Unauthorized("Reading the management API needs 'Authorization: Bearer <MILLM_API_KEY>' "
                           "(or the admin key).")


def _require_changer(api_key: str | None, admin_key: str | None, authorization: str, loopback: bool) -> None:
    """A mutation: the admin key when one is set, else the API key when one is set, else a loopback bind."""
    if admin_key:
        if not bearer_matches(authorization, admin_key):
            raise Unauthorized("Management changes need 'Authorization: Bearer <MILLM_ADMIN_KEY>'.")
        return
    if api_key:
        if not bearer_matches(authorization, api_key):
            raise Unauthorized("Management changes need 'Authorization: Bearer <MILLM_API_KEY>' "
                               "(no MILLM_ADMIN_KEY is set).")
        return
    if not loopback:
        raise ManagementForbidden("Management changes are refused: this server is bound beyond loopback and no "
                                  "key is set. Set MILLM_ADMIN_KEY (or MILLM_API_KEY) and send it as "
                                  "'Authorization: Bearer <key>', or bind 127.0.0.1.")


def require_management(settings: Settings, method: str, authorization: str, loopback: bool) -> None:
    """/api: reads need the API key when one is set; mutations the admin key, else the API key, else a
    loopback bind (401 for a missing or wrong key, 403 for a keyless server bound beyond loopback)."""
    if method in READ_METHODS:
        _require_reader(settings.api_key, settings.admin_key, authorization)
    else:
        _require_changer(settings.api_key, settings.admin_key, authorization, loopback)


async def guard_management() -> None:
    """before_request of every /api blueprint but health."""
    from millm.server.state import services

    require_management(services().settings, request.method, request.headers.get("Authorization", ""),
                       bound_to_loopback(current_app))


def allowed_methods(app: Quart, path: str, method: str) -> list[str]:
    """The methods ``path`` takes, as a 405's ``Allow`` header lists them."""
    adapter = app.url_map.bind("localhost")
    try:
        adapter.match(path, method=method)
    except MethodNotAllowed as exc:
        return sorted(exc.valid_methods or [])
    except NotFound:
        return []
    return []


async def auth_headers(response: Response) -> Response:
    """after_request: ``WWW-Authenticate: Bearer`` on every 401, ``Allow`` on every 405."""
    if response.status_code == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="millm"'
    elif response.status_code == 405 and "Allow" not in response.headers:
        response.headers["Allow"] = ", ".join(allowed_methods(current_app, request.path, request.method))
    return response


def install(app: Quart) -> None:
    """Add the 401 and 405 headers to ``app``'s responses."""
    app.after_request(auth_headers)
