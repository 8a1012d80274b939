"""The console's cost (issue 50): the static payload it ships, its first load on loopback, and decode speed with
the monitor page open and following its pushed statistics against closed. (The docs' screenshots are taken by
the browser tests: tests/console/test_screens.py.)

    python bench/console.py            # payload and first load (scripted engine, median of 9)
    python bench/console.py --decode   # + decode tokens/s, monitor page open vs closed (real model)

The browser is Debian's chromium driven by Playwright. First load is from navigation to the page having drawn
(its first section in place), in a fresh browser context each run (nothing cached), the server already up.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SAE, MUSIC = "smollm2-135m-res-L10", 2375


def payload() -> tuple[int, int, int]:
    """(files, bytes, gzip bytes) of what the console ships: index.html and static/."""
    from millm.console import ROOT

    files = [ROOT / "index.html", *sorted(p for p in (ROOT / "static").rglob("*") if p.is_file())]
    raw = sum(p.stat().st_size for p in files)
    packed = sum(len(gzip.compress(p.read_bytes(), 9)) for p in files)
    return len(files), raw, packed


def first_load(browser: Any, base: str, runs: int) -> list[float]:
    """Seconds from navigation to the dashboard drawn, one fresh context per run."""
    times = []
    for _ in range(runs):
        context = browser.new_context()
        page = context.new_page()
        started = time.perf_counter()
        page.goto(base + "/#/dashboard")
        page.wait_for_selector("#dash-model dd")
        times.append(time.perf_counter() - started)
        context.close()
    return times


def decode_rate(base: str, requests: int, tokens: int) -> float:
    """Completion tokens per second over ``requests`` sequential chats of ``tokens`` tokens each."""
    started, made = time.perf_counter(), 0
    for i in range(requests):
        body = {"model": "SmolLM2-135M-Instruct", "max_tokens": tokens, "temperature": 0,
                "messages": [{"role": "user", "content": f"Tell me a story, number {i}."}]}
        r = httpx.post(base + "/v1/chat/completions", json=body, timeout=300)
        r.raise_for_status()
        made += r.json()["usage"]["completion_tokens"]
    return made / (time.perf_counter() - started)


def decode_ratio(browser: Any, base: str, rounds: int, requests: int, tokens: int) -> tuple[float, float]:
    """Median tokens/s with the monitor page open (its event stream pushing after every request) and closed,
    alternating, same server."""
    httpx.post(f"{base}/api/saes/{SAE}/attach", json={}).raise_for_status()
    httpx.put(base + "/api/monitoring", json={"enabled": True, "sae": SAE, "features": [MUSIC, 17, 1604]})
    opened, closed = [], []
    try:
        for _ in range(rounds):
            closed.append(decode_rate(base, requests, tokens))
            context = browser.new_context()
            page = context.new_page()
            page.goto(base + "/#/monitor")
            page.wait_for_selector("#mon-stats")
            opened.append(decode_rate(base, requests, tokens))
            context.close()
    finally:
        httpx.put(base + "/api/monitoring", json={"enabled": False})
        httpx.post(f"{base}/api/saes/{SAE}/detach")
    return statistics.median(opened), statistics.median(closed)


def real_server() -> Any:
    """The bundled model on the transformers engine, served on loopback (a context manager yielding its URL)."""
    import os

    os.environ.setdefault("MILLM_HOME", tempfile.mkdtemp(prefix="millm-console-bench-"))
    # the dequantised model is derived data: the test suite's cache serves here too
    os.environ.setdefault("MILLM_CACHE", str(Path(tempfile.gettempdir()) / "millm-test-cache"))
    from millm.config import get_settings
    from millm.engine import load_engine
    from millm.registry import BUNDLED_ID, resolve
    from millm.server.app import create_app
    from tests.support.live import live_server

    settings = get_settings()
    return live_server(create_app(settings, load_engine(resolve(BUNDLED_ID, settings), settings)), ready_within=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9, help="first loads measured (median printed)")
    parser.add_argument("--decode", action="store_true", help="decode with the monitor page open vs closed")
    parser.add_argument("--rounds", type=int, default=3, help="alternating open/closed rounds for --decode")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from tests.support.app import make
    from tests.support.fakes import FakeEngine
    from tests.support.live import live_server

    files, raw, packed = payload()
    print(f"static payload: {files} files, {raw} bytes ({raw / 1024:.1f} KiB), {packed} bytes gzipped")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        app, _ = make(Path(tempfile.mkdtemp()), FakeEngine(steerable=True))
        with live_server(app) as base:
            loads = first_load(browser, base, args.runs)
        print(f"first load on loopback (scripted engine): median {statistics.median(loads) * 1000:.0f} ms over "
              f"{len(loads)} runs (min {min(loads) * 1000:.0f}, max {max(loads) * 1000:.0f})")
        if args.decode:
            with real_server() as base:
                opened, closed = decode_ratio(browser, base, args.rounds, requests=3, tokens=48)
                print(f"decode, monitor page open: {opened:.1f} tok/s; closed: {closed:.1f} tok/s; "
                      f"ratio {opened / closed:.3f}x (median of {args.rounds} alternating rounds)")
        browser.close()


if __name__ == "__main__":
    main()
