"""The docs' HTTP reference is rendered from docs/reference/openapi.json; it must be what the app serves (fast tier:
the scripted engine behind Quart's test client)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

CHECKED_IN = Path(__file__).resolve().parents[1] / "docs" / "reference" / "openapi.json"
REGENERATE = "python docs/hooks/reference.py --write-openapi"


def served_document(home: Path) -> Any:
    from millm.config import Settings
    from millm.server.app import create_app  # pulls torch: imported when the test runs, not at collection
    from tests.support.fakes import FakeEngine

    app = create_app(Settings(home=home), FakeEngine())

    async def main() -> Any:
        async with app.test_app():
            response = await app.test_client().get("/openapi.json")
            assert response.status_code == 200
            return await response.get_json()

    return asyncio.run(main())


def test_the_checked_in_openapi_document_is_the_one_the_app_serves(tmp_path: Path) -> None:
    checked_in = json.loads(CHECKED_IN.read_text(encoding="utf-8"))
    served = served_document(tmp_path)
    changed = sorted(set(served["paths"]) ^ set(checked_in["paths"]))
    assert served == checked_in, (
        f"docs/reference/openapi.json differs from GET /openapi.json (paths added or removed: {changed or 'none'}); "
        f"regenerate it with `{REGENERATE}` and commit it")
