"""Screenshots of every console page, as the docs show them (docs/console/*.png, written by
``python bench/console.py --screenshots docs/console``) and as a test checks they are taken."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.console.browser import PAGES

VIEWPORT = {"width": 1280, "height": 860}


def take(browser: Any, base: str, out: Path, settle_ms: int = 1500,
         before: dict[str, Any] | None = None) -> list[Path]:
    """One PNG per page of the console at ``base`` into ``out`` (``{page}.png``); ``before[page](page)`` may act on a
    page (type a search, send a chat) before its picture is taken."""
    out.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
    taken = []
    try:
        page = context.new_page()
        for name in PAGES:
            page.goto(f"{base}/#/{name}")
            page.wait_for_selector(f"#page[data-page='{name}'] section")
            if before and name in before:
                before[name](page)
            page.wait_for_timeout(settle_ms)  # a polled page has drawn its next reading
            path = out / f"{name}.png"
            page.screenshot(path=str(path))
            taken.append(path)
    finally:
        context.close()
    return taken
