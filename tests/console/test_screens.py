"""The docs' screenshots are taken by these tests, not by hand: one viewport-sized PNG per page, on the scripted
engine and on the real model with SAEs attached, steering, monitoring and documents in place.
``python -m pytest tests/console/test_screens.py --console-shots docs/console`` writes the real model's to the docs."""

from __future__ import annotations

import struct

import httpx

from tests.console.browser import PAGES
from tests.console.screens import MUSIC, SAE, VIEWPORT, depopulate, populate, take


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_one_screenshot_per_page(console, tmp_path):
    taken = take(console.page.context.browser, console.base, tmp_path / "shots", settle_ms=0)
    assert [p.stem for p in taken] == PAGES
    sizes = {png_size(p.read_bytes()) for p in taken}
    assert sizes == {(VIEWPORT["width"], VIEWPORT["height"])}
    assert len({p.read_bytes() for p in taken}) == len(PAGES)  # each page looks different


def test_the_docs_screenshots_on_the_real_model(browser, server, request, tmp_path):
    out = request.config.getoption("console_shots") or tmp_path
    try:
        taken = take(browser, server, out, before=populate(server))
        steering = httpx.get(server + "/api/steering").json()["saes"][SAE]["values"]
        shown = httpx.get(server + "/api/monitoring/stats").json()
    finally:
        depopulate(server)
    assert [p.stem for p in taken] == PAGES
    assert {png_size(p.read_bytes()) for p in taken} == {(VIEWPORT["width"], VIEWPORT["height"])}
    assert len({p.read_bytes() for p in taken}) == len(PAGES)
    assert steering[str(MUSIC)] == 40 and shown["requests_in_history"] >= 4  # populated: 3 chats and the playground's
    assert httpx.get(server + "/api/steering").json()["saes"] == {}  # and put back for the tests after it
