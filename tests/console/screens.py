"""Screenshots of every console page, as the docs show them: docs/console/*.png are written by
``python -m pytest tests/console/test_screens.py --console-shots docs/console`` (the real model, populated)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from tests.console.browser import PAGES

VIEWPORT = {"width": 1280, "height": 860}
SAE, MUSIC = "smollm2-135m-res-L10", 2375
SAES = (SAE, "smollm2-135m-res-L20")
DOCUMENTS = (("profile", "music-40"), ("cluster", "weather-cluster"), ("circuit", "weather-circuit"))


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
            page.wait_for_timeout(settle_ms)  # a page has drawn its next reading
            path = out / f"{name}.png"
            page.screenshot(path=str(path))
            taken.append(path)
    finally:
        context.close()
    return taken


def populate(base: str) -> dict[str, Any]:
    """Give the pages something to show: L10 attached, music steered, a vector set learned, monitoring on with a
    few requests run, the example documents imported. Returns what to do on pages before their picture."""
    examples = Path(__file__).resolve().parents[2] / "profiles"
    for sae in SAES:
        httpx.post(f"{base}/api/saes/{sae}/attach", json={}).raise_for_status()
    httpx.put(base + "/api/steering", json={"sae": SAE, "values": {str(MUSIC): 40, "1604": 12}}).raise_for_status()
    httpx.post(base + "/api/profiles", json={"name": "music-40", "description": "music at 40 on L10",
                                             "from_current": True})
    for kind, name in DOCUMENTS[1:]:
        httpx.post(f"{base}/api/{kind}s/import?overwrite=true", content=(examples / f"{name}.json").read_bytes(),
                   headers={"Content-Type": "application/json"})
    learn = httpx.post(base + "/api/vectors/learn", json={
        "name": "joy", "layer": 6,
        "positive": ["I am so happy today!", "What a joyful surprise.", "We laughed all night."],
        "negative": ["I am so sad today.", "What a miserable shock.", "We cried all night."]})
    learn.raise_for_status()
    while httpx.get(f"{base}/api/vectors/jobs/{learn.json()['id']}").json()["status"] in ("queued", "running"):
        time.sleep(0.5)
    httpx.put(base + "/api/monitoring", json={"enabled": True, "sae": SAE, "features": [MUSIC, 1604, 17, 3892, 5]})
    for prompt in ("Tell me about your day.", "What is your favourite song?", "Describe the weather."):
        httpx.post(base + "/v1/chat/completions", timeout=300, json={
            "model": "SmolLM2-135M-Instruct", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": prompt}]}).raise_for_status()

    def search(page: Any) -> None:
        page.select_option("#search-sae", SAE)
        page.fill("#search-q", "music")
        page.click("#search-go")
        page.wait_for_selector("#search-table")
        page.wait_for_function("() => !document.querySelector('#search-table').textContent.includes('…')")
        page.locator(f"#search-table tr:has(td:text-is('{MUSIC}')) button[data-action='card']").click()
        page.wait_for_selector("#feature-card")

    def chat(page: Any) -> None:
        page.fill("#pg-temperature", "0")
        page.fill("#pg-max-tokens", "24")
        page.fill("#prompt", "Tell me about your day.")
        page.click("#pg-send")
        page.wait_for_selector(".msg.assistant[data-state^='done']", timeout=120_000)

    return {"saes": search, "playground": chat}


def depopulate(base: str) -> None:
    """Undo :func:`populate` on a server other tests share."""
    httpx.put(base + "/api/monitoring", json={"enabled": False})
    httpx.delete(base + "/api/steering")
    for kind, name in DOCUMENTS:
        httpx.delete(f"{base}/api/{kind}s/{name}")
    httpx.delete(base + "/api/vectors/joy")
    for sae in SAES:
        httpx.post(f"{base}/api/saes/{sae}/detach")
