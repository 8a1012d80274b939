"""Where a request may come from: the name it addresses the server by, the web page that sent it, the type
of its body. These close what keys alone leave open on a keyless local server (the default), which trusts
whatever reaches loopback, and any web page the user visits can reach loopback.

The rules, written once here and applied to every route before anything else reads the request:

- **Host** (421 ``host_not_allowed``, every route): a server bound to loopback answers only to a loopback name
  (``localhost``, ``127.0.0.1``, ``[::1]``, any port) or one ``MILLM_ALLOWED_HOSTS`` lists. A page on
  ``evil.example`` whose name is rebound to 127.0.0.1 (DNS rebinding) sends ``Host: evil.example`` and so
  reads and writes nothing. A server bound beyond loopback is addressed by names it cannot know; keys guard it.
- **Origin** (403 ``cross_origin_forbidden``, every state-changing method): a browser names the page that sent
  a request in ``Origin``; a request that carries one other than the server's own (``null`` included) is a
  page of another site driving this server, and is refused whatever key it carries. Clients that are not
  browsers (the SDK, curl, the CLI, the TUI) send no ``Origin``; the console, served by this server, sends
  its own.
- **Content-Type** (415 ``unsupported_media_type``): a request that carries a body says it is
  ``application/json``. A page of another site can send ``text/plain``, form or multipart bodies without
  asking the browser's leave (a CORS "simple" request); it cannot send JSON that way.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from urllib.parse import urlsplit

from quart import Quart, current_app, request
from werkzeug.datastructures import Headers

from millm.errors import CrossOriginForbidden, HostNotAllowed, UnsupportedMediaType
from millm.server.auth import READ_METHODS, bound_to_loopback, is_loopback

DEFAULT_PORTS = {"http": 80, "https": 443}
ANY_HOST = "*"


def authority(value: str) -> tuple[str, int | None] | None:
    """A ``Host`` header's (or an origin's) name, lower-cased and unbracketed, and its port if it names one;
    None for anything that is not a bare ``name[:port]``."""
    if not value or any(c in value for c in "@/?#\\ \t"):
        return None
    try:
        parts = urlsplit("//" + value)
        name, port = parts.hostname, parts.port
    except ValueError:
        return None
    return (name, port) if name else None


def allowed_hosts(setting: str) -> tuple[str, ...]:
    """``MILLM_ALLOWED_HOSTS`` as names: comma-separated, ``.example.com`` for a domain and its subdomains,
    ``*`` for any name."""
    return tuple(name.strip().lower() for name in setting.split(",") if name.strip())


def host_allowed(host: str, allowed: Collection[str]) -> bool:
    """Whether a loopback-bound server answers a request addressed to ``host`` (its ``Host`` header)."""
    found = authority(host)
    if found is None:
        return False
    name = found[0]
    if is_loopback(name):
        return True
    return any(entry == ANY_HOST or name == entry or (entry.startswith(".") and (name.endswith(entry)
                                                                                  or name == entry[1:]))
               for entry in allowed)


def same_origin(origin: str, host: str) -> bool:
    """Whether the page ``origin`` (an ``Origin`` header) is the server's own, addressed as ``host``: the same
    name and port. A ``Host`` without a port was reached on a default port (behind a proxy that ends TLS the
    page's scheme is not the server's, so either default is its own)."""
    try:
        parts = urlsplit(origin)
        page = (parts.hostname, parts.port or DEFAULT_PORTS.get(parts.scheme))
    except ValueError:
        return False
    server = authority(host)
    if server is None or not page[0] or page[1] is None or parts.path or parts.query:
        return False
    name, port = server
    if port is None:
        return page[0] == name and page[1] in DEFAULT_PORTS.values()
    return page == (name, port)


def has_body(headers: Mapping[str, str] | Headers) -> bool:
    """Whether a request carries a body (a length over zero, or one sent in chunks)."""
    length = headers.get("Content-Length", "").strip()
    return bool(headers.get("Transfer-Encoding")) or (length not in ("", "0"))


def is_json(mimetype: str) -> bool:
    """``application/json``, or a JSON-based type (``application/merge-patch+json``)."""
    kind = mimetype.strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def check(method: str, headers: Mapping[str, str] | Headers, mimetype: str, *, loopback: bool,
          allowed: Collection[str]) -> None:
    """Refuse a request that breaks the Host, Origin or Content-Type rule, in that order."""
    host = headers.get("Host", "")
    if loopback and not host_allowed(host, allowed):
        raise HostNotAllowed(f"This server is bound to loopback and answers only to a loopback name "
                             f"(localhost, 127.0.0.1, [::1]), not {host!r}; an operator adds other names with "
                             "MILLM_ALLOWED_HOSTS.")
    origin = headers.get("Origin")
    if origin is not None and method not in READ_METHODS and not same_origin(origin, host):
        raise CrossOriginForbidden(f"A web page of another origin ({origin!r}) may not change this server: "
                                   "send the request from the server's own origin, or from a client that is "
                                   "not a browser.")
    check_body_type(mimetype, has_body(headers))


def check_body_type(mimetype: str, carries_body: bool) -> None:
    """A request that carries a body says it is JSON (415 otherwise). Checked at the door from the headers, and
    again where a body is read (an HTTP/2 body needs no length header)."""
    if carries_body and not is_json(mimetype):
        raise UnsupportedMediaType(f"Request bodies must be JSON, sent as 'Content-Type: application/json' "
                                   f"(this one is {mimetype or 'untyped'!r}).")


async def guard() -> None:
    """before_request of the whole app: the three rules, before any route, key or body is read."""
    from millm.server.state import services

    check(request.method, request.headers, request.mimetype, loopback=bound_to_loopback(current_app),
          allowed=allowed_hosts(services().settings.allowed_hosts))


def install(app: Quart) -> None:
    """Apply the rules to every request ``app`` answers."""
    app.before_request(guard)
