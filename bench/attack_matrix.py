"""The attack matrix of issue 49: what a web page, a rebound DNS name and an ordinary client get from a server on
the bundled model, by route, Origin, Content-Type and key setting. Prints a Markdown table.

    python bench/attack_matrix.py

Every request is sent over real HTTP to Hypercorn on loopback; a request sends the key its route needs under
the setting (the admin key for /api changes, the API key otherwise) except in the "no key" column.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EVIL = "http://evil.example"
PLAIN, FORM = "text/plain;charset=UTF-8", "application/x-www-form-urlencoded"
SETTINGS = {"keyless": {}, "MILLM_API_KEY": {"api_key": "k"}, "both keys": {"api_key": "k", "admin_key": "boss"}}
# column -> (Origin, Content-Type, Host rebound, send the key)
COLUMNS = {
    "JSON": (None, "application/json", False, True),
    "text/plain": (None, PLAIN, False, True),
    "form": (None, FORM, False, True),
    "own Origin, JSON": ("own", "application/json", False, True),
    "other Origin, JSON": (EVIL, "application/json", False, True),
    "other Origin, text/plain": (EVIL, PLAIN, False, True),
    "null Origin": ("null", "application/json", False, True),
    "rebound Host": (None, "application/json", True, True),
    "no key": (None, "application/json", False, False),
}


def routes(model: str) -> list[tuple[str, str, dict[str, object] | None]]:
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    return [("POST", "/api/steering/disable", {}), ("POST", "/api/profiles", {"name": "m", "entries": []}),
            ("POST", "/v1/chat/completions", chat), ("GET", "/api/steering", None), ("GET", "/v1/models", None)]


def status(base: str, method: str, path: str, body: dict[str, object] | None, column: str,
           keys: dict[str, str]) -> int:
    origin, kind, rebound, with_key = COLUMNS[column]
    netloc = httpx.URL(base).netloc.decode()
    headers = {"Host": f"evil.example:{netloc.rsplit(':', 1)[1]}" if rebound else netloc}
    if origin:
        headers["Origin"] = base if origin == "own" else origin
    key = keys.get("admin_key") or keys.get("api_key") if method == "POST" and path.startswith("/api") \
        else keys.get("api_key")
    if key and with_key:
        headers["Authorization"] = f"Bearer {key}"
    content = None
    if body is not None:
        headers["Content-Type"] = kind
        content = json.dumps(body).encode()
    answer = httpx.request(method, base + path, headers=headers, content=content, timeout=120).status_code
    cleanup = {"Authorization": f"Bearer {keys.get('admin_key') or keys.get('api_key')}"} if keys else {}
    httpx.delete(base + "/api/profiles/m", headers=cleanup, timeout=30)
    httpx.post(base + "/api/steering/enable", headers=cleanup, timeout=30)
    return answer


def main() -> int:
    os.environ["MILLM_HOME"] = tempfile.mkdtemp(prefix="millm-attack-")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from millm.config import Settings
    from millm.engine import load_engine
    from millm.registry import BUNDLED_ID, resolve
    from millm.server.app import create_app
    from tests.support.live import live_server

    engine = load_engine(resolve(BUNDLED_ID, Settings()), Settings())
    print("| setting | route | " + " | ".join(COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for setting, keys in SETTINGS.items():
        settings = Settings(home=Path(tempfile.mkdtemp(prefix="millm-attack-")), **keys)
        with live_server(create_app(settings, engine)) as base:
            for method, path, body in routes(engine.model_id):
                cells = [str(status(base, method, path, body, column, keys)) for column in COLUMNS]
                print(f"| {setting} | {method} {path} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
