"""Driving the console in a real Chromium (Debian's ``chromium``, through the Playwright pip package: a browser
download does not work here). A missing browser fails the test, never skips it: a skipped browser test would
let CI pass with the console untested.

:class:`Watched` is a page with listeners: uncaught errors, console errors, dialogs (a hostile label that ran as
markup would open one) and every request to a host other than the server's.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest

PAGES = [
    "dashboard", "models", "saes", "vectors", "steering", "monitor", "profiles", "clusters", "circuits", "playground",
    "compare", "sweeps", "features",
]
TIMEOUT_MS = 30_000  # how long an expectation waits (a loaded CI machine; nothing is measured by it)


def chromium_path() -> str:
    """The system Chromium, or a failed test saying how to install it."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("The console's browser tests need Chromium: `apt-get install -y chromium` (`.ci/run` and "
                    "`./install.sh test` install it when missing).", pytrace=False)
    return path


@contextmanager
def launched() -> Iterator[Any]:
    """A headless Chromium for the length of the block."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("The console's browser tests need the playwright package (in the test extras).", pytrace=False)
    path = chromium_path()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Watched:
    """A browser page on the console at ``base``, and what it did that a test checks afterwards."""

    page: Any
    base: str
    page_errors: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        own = urlsplit(self.base).netloc
        self.page.set_default_timeout(TIMEOUT_MS)
        self.page.on("pageerror", lambda err: self.page_errors.append(str(err)))
        self.page.on("console", lambda msg: self.console_errors.append(msg.text) if msg.type == "error" else None)

        def dialog(d: Any) -> None:
            self.dialogs.append(d.message)
            d.dismiss()

        def request(r: Any) -> None:
            self.urls.append(r.url)
            self.headers.append(r.headers)
            parts = urlsplit(r.url)
            if parts.scheme not in ("data", "blob") and parts.netloc != own:
                self.foreign.append(r.url)

        self.page.on("dialog", dialog)
        self.page.on("request", request)

    def open(self, name: str) -> Any:
        """Go to a page of the console and wait until it has drawn."""
        self.page.goto(f"{self.base}/#/{name}")
        self.page.wait_for_selector(f"#page[data-page='{name}'] section")
        return self.page

    def notice(self) -> Any:
        """The notice line (refusals and what an action did)."""
        return self.page.locator("#notice")

    def clean(self) -> None:
        """Nothing ran that should not: no uncaught error, no dialog, no request beyond the server."""
        assert self.page_errors == []
        assert self.dialogs == []
        assert self.foreign == []


def row(page: Any, selector: str, text: str) -> Any:
    """The table row under ``selector`` whose first cell is ``text``."""
    return page.locator(f"{selector} tr").filter(has=page.locator("td").first.filter(
        has_text=re.compile(rf"^{re.escape(text)}$")))
