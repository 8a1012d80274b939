"""The console on the real bundled model (the session's ``millm serve``, marked ``model``): attach the bundled L10
SAE, find the music feature by its label, set it with the slider, and see ``X-miLLM-Steering: live`` on the next
playground answer and the slider's value in GET /api/steering; then monitor features while requests sent from the
OpenAI SDK run, the page's table changing with them and equal to GET /api/monitoring/stats. A few tokens each."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.console.browser import Watched, row

SAE = "smollm2-135m-res-L10"
MUSIC = 2375
TOKENS = 4


@pytest.fixture
def real(browser: Any, server: str) -> Iterator[Watched]:
    """A watched page on the session's real server, its steering and monitoring put back afterwards."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    try:
        watched = Watched(context.new_page(), server)
        yield watched
        watched.clean()
    finally:
        context.close()
        httpx.put(server + "/api/monitoring", json={"enabled": False})
        httpx.delete(server + "/api/steering")
        if httpx.get(f"{server}/api/saes/{SAE}").json()["attached_layer"] is not None:
            httpx.post(f"{server}/api/saes/{SAE}/detach")


def values(base: str) -> dict[str, float]:
    return httpx.get(base + "/api/steering").json()["saes"].get(SAE, {}).get("values", {})


def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_find_a_feature_set_it_with_the_slider_and_the_next_answer_is_steered(real):
    page = real.open("saes")
    row(page, "#sae-table", SAE).locator("button[data-action='attach']").click()
    page.wait_for_selector(f"#sae-table tr:has(td:text-is('{SAE}')) button[data-action='detach']")
    page.select_option("#search-sae", SAE)
    page.fill("#search-q", "music")
    page.click("#search-go")
    found = row(page, "#search-table", str(MUSIC))
    assert found.locator(".label").text_content() == "music, melody"
    found.locator("button[data-action='steer']").click()
    real.notice().filter(has_text=f"Feature {MUSIC} set to").wait_for()
    start = values(real.base)[str(MUSIC)]

    page = real.open("steering")
    slider = page.locator(f"tr[data-feature='{MUSIC}'] input.slider")
    slider.focus()
    for _ in range(3):
        page.keyboard.press("ArrowLeft")
    until(lambda: values(real.base).get(str(MUSIC)) == start - 3, "the slider's value reaches the server")
    assert page.locator(f"tr[data-feature='{MUSIC}'] input.strength").input_value() == str(int(start - 3))

    page = real.open("playground")
    page.fill("#pg-temperature", "0")
    page.fill("#pg-max-tokens", str(TOKENS))
    page.fill("#prompt", "Tell me about your day.")
    page.click("#pg-send")
    answer = page.locator(".msg.assistant[data-state^='done']")
    answer.wait_for()
    assert answer.locator(".text").text_content() != ""
    assert page.locator("#pg-steering").text_content() == "X-miLLM-Steering: live"
    assert values(real.base) == {str(MUSIC): start - 3}


def test_the_monitor_follows_requests_from_the_sdk_and_equals_the_stats(real, client):
    httpx.post(f"{real.base}/api/saes/{SAE}/attach", json={}).raise_for_status()
    page = real.open("monitor")
    page.select_option("#mon-sae", SAE)
    page.fill("#mon-features", "music, 17, 1604")  # a label resolves as batch add resolves it
    page.click("#mon-apply")
    real.notice().filter(has_text="Monitoring these features").wait_for()
    config = httpx.get(real.base + "/api/monitoring").json()
    assert config["enabled"] is True and config["features"] == [MUSIC, 17, 1604]
    page.locator("#mon-summary").filter(has_text="0 positions read").wait_for()

    shown = []
    for n in (1, 2):
        client.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=TOKENS, temperature=0,
                                       messages=[{"role": "user", "content": f"Sing me song number {n}."}])
        stats = httpx.get(real.base + "/api/monitoring/stats").json()
        page.locator("#mon-summary").filter(has_text=f"{stats['positions']} positions read").wait_for()
        page.locator("#mon-summary").filter(has_text=f"{n} requests in the history").wait_for()
        table = table_of(page)
        assert table == expected(stats)  # the page's table is the stats route's, to the digits it shows
        shown.append(table)
    assert shown[0] != shown[1]  # it changed as the second request ran, without a reload
    assert page.locator("#mon-chart rect.chart-bar").count() == 3
    page.fill("#mon-topk", "2")
    page.wait_for_function("() => document.querySelectorAll('#mon-chart rect.chart-bar').length === 2")
    means = {i: f["mean"] for i, f in httpx.get(real.base + "/api/monitoring/stats").json()["features"].items()}
    names = [r.get_attribute("data-name").split(" ")[0] for r in page.locator("#mon-chart rect.chart-bar").all()]
    assert [means[n] for n in names] == sorted(means.values(), reverse=True)[:2]  # the top two by mean, largest first
    assert page.locator("#mon-history tbody tr").count() == 2
    history = httpx.get(real.base + "/api/monitoring/history").json()["data"]
    lines = page.locator("#mon-trend-table tbody tr")
    assert lines.count() == 2  # the top two (the page's "top" box), each a line over the two requests
    for line in lines.all():
        index = line.locator("td").first.text_content()
        assert line.locator("circle.spark-dot").count() == len(history) == 2
        heights = [float(c.get_attribute("cy")) for c in line.locator("circle.spark-dot").all()]
        means = [q["features"][index]["mean"] for q in history]
        assert (heights[0] < heights[1]) == (means[0] > means[1]) or means[0] == means[1]  # higher mean, higher dot

    page.fill("#mon-features", "")  # no features named: the server reads every feature and keeps the top K
    page.fill("#mon-topk", "3")
    page.click("#mon-apply")
    page.locator("#mon-summary").filter(has_text="the top 3 of every feature: 0 positions read").wait_for()
    assert httpx.get(real.base + "/api/monitoring").json()["top_k"] == 3
    client.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=TOKENS, temperature=0,
                                   messages=[{"role": "user", "content": "Sing me one more."}])
    stats = httpx.get(real.base + "/api/monitoring/stats").json()
    page.locator("#mon-summary").filter(has_text=f"{stats['positions']} positions read").wait_for()
    assert table_of(page) == expected(stats) and len(stats["features"]) == 3
    assert not [u for u in real.urls if "/api/monitoring/stats" in u or "/api/monitoring/history" in u]  # pushed


def table_of(page: Any) -> list[list[str]]:
    """The page's statistics table, without its label column (labels arrive on their own)."""
    return [[c.text_content() for i, c in enumerate(r.locator("td").all()) if i != 1]
            for r in page.locator("#mon-stats tbody tr").all()]


def expected(stats: dict[str, Any]) -> list[list[str]]:
    """The rows the page draws from a stats body, strongest mean first: feature, count, mean, std, min, max,
    active fraction."""
    rows = sorted(stats["features"].items(), key=lambda kv: int(kv[0]))  # JS orders index keys, then sorts stably
    rows.sort(key=lambda kv: -kv[1]["mean"])
    return [[index, str(f["count"]), *(f"{f[k]:.4f}" for k in ("mean", "std", "min", "max", "active_fraction"))]
            for index, f in rows]


POSITIVE = ["I am so happy today!", "What a joyful, wonderful surprise.", "We laughed and celebrated all night.",
            "This is the best day of my life."]
NEGATIVE = ["I am so sad today.", "What a miserable, awful shock.", "We cried and mourned all night.",
            "This is the worst day of my life."]


def test_learn_a_vector_from_the_page_follow_its_job_and_attach_it(real):
    name = "console-joy"
    try:
        page = real.open("vectors")
        page.fill("#learn-name", name)
        page.fill("#learn-layer", "6")
        page.set_input_files("#learn-positive-file", files=[{  # a file picked, read by the server's file rule
            "name": "joy.jsonl", "mimeType": "text/plain",
            "buffer": "\n".join(json.dumps([{"role": "assistant", "content": t}]) for t in POSITIVE).encode()}])
        page.fill("#learn-negative", "\n".join(NEGATIVE))
        page.click("#learn-go")
        real.notice().filter(has_text=f"Learning {name}: job").wait_for()
        page.wait_for_selector("#learn-job[data-status='succeeded']", timeout=240_000)
        jobs = httpx.get(real.base + "/api/vectors/jobs").json()["data"]
        assert jobs[0]["name"] == name and jobs[0]["status"] == "succeeded"
        learned = httpx.get(f"{real.base}/api/vectors/{name}").json()
        assert learned["examples"] == {"positive": len(POSITIVE), "negative": len(NEGATIVE)}
        assert learned["source"]["files"] == ["joy.jsonl"]
        assert page.locator("#learn-job").text_content().startswith(f"{jobs[0]['id']} {name}: succeeded")
        listed = row(page, "#vectors-table", name)
        listed.wait_for()
        assert listed.locator("td").nth(1).text_content() == "6"
        listed.locator("button[data-action='attach']").click()
        row(page, "#vectors-table", name).locator("button[data-action='detach']").wait_for()
        assert httpx.get(f"{real.base}/api/vectors/{name}").json()["attached_layer"] == 6
        with page.expect_download() as download:
            row(page, "#vectors-table", name).locator("button[data-action='export']").click()
        assert download.value.suggested_filename == f"{name}.gguf"
        exported = Path(download.value.path()).read_bytes()
        assert exported[:4] == b"GGUF" and exported == httpx.get(f"{real.base}/api/vectors/{name}/export").content

        page = real.open("steering")  # an attached set steers like an SAE, its vectors for features
        page.select_option("#batch-sae", name)
        page.fill("#batch", "0=8")
        page.click("#batch-add")
        vector = httpx.get(f"{real.base}/api/vectors/{name}").json()["vectors"][0]["name"]
        page.locator(f"tr[data-sae='{name}'][data-feature='0'] .label").filter(has_text=f"vector {vector}").wait_for()
        assert httpx.get(real.base + "/api/steering").json()["saes"][name]["values"] == {"0": 8.0}
    finally:
        httpx.delete(f"{real.base}/api/vectors/{name}")
