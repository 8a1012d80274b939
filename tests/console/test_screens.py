"""The docs' screenshots are taken by code, not by hand: the same function, on the scripted engine, writes one
viewport-sized PNG per page."""

from __future__ import annotations

import struct

from tests.console.browser import PAGES
from tests.console.screens import VIEWPORT, take


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
