"""The research pages on the real bundled model (the session's ``millm serve``), a few tokens each:

- a sweep run from the Sweeps page draws its points as GET /api/sweeps/{id} has them (whose numbers the CLI's
  equal: tests/server/test_sweeps_api.py) and lists a point's answers on click;
- a feature page of the bundled L10 SAE shades each example token with the value GET /api/saes/{id}/features/{i}
  gives, and lists the tokens its direction promotes;
- a 4-way comparison streams four answers equal to four separate /v1 calls with the same seed; its copied curl,
  run, gives the same text; its link opened in a fresh browser context gives the same answers."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.console.browser import Watched

SAE = "smollm2-135m-res-L10"
MUSIC = 2375


@pytest.fixture
def real(browser: Any, server: str) -> Iterator[Watched]:
    """A watched page on the session's real server with the bundled L10 SAE attached, detached afterwards."""
    assert httpx.post(f"{server}/api/saes/{SAE}/attach", json={}).status_code == 200
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        watched = Watched(context.new_page(), server)
        yield watched
        watched.clean()
    finally:
        context.close()
        httpx.delete(f"{server}/api/steering")
        httpx.post(f"{server}/api/saes/{SAE}/detach")


def test_a_sweep_run_from_the_page_draws_the_jobs_points_and_lists_answers_on_click(real):
    page = real.page
    page.goto(f"{real.base}/#/sweeps?sae={SAE}&feature=music&strengths=0,40&prompts=2&held_out=2&tokens=6&seed=3")
    page.wait_for_selector("#page[data-page='sweeps'] section")
    page.click("#sweep-go")
    page.wait_for_selector("#sweep-job[data-status='succeeded']", timeout=300_000)
    job_id = page.locator("#sweep-job").text_content().split(":")[0]
    job = httpx.get(f"{real.base}/api/sweeps/{job_id}").json()
    points = job["result"]["points"]
    assert job["request"]["feature"] == MUSIC and [p["strength"] for p in points] == [0.0, 40.0]
    for series, key in (("concept rate", "rate"), ("fluency", "fluency"), ("relevance", "relevance")):
        dots = page.locator(f"#sweep-result circle[data-series='{series}']")
        assert dots.count() == len(points)
        drawn = [(float(dots.nth(i).get_attribute("data-x")), float(dots.nth(i).get_attribute("data-y")))
                 for i in range(len(points))]
        assert drawn == [(p["strength"], p[key]) for p in points]
    assert page.locator("#sweep-result line[data-line^='bound']").count() == 1
    page.locator("#sweep-result circle[data-series='concept rate']").nth(1).click()
    shown = page.locator("#sweep-answers ol[data-strength='40'] .answer")
    expected = next(a["answers"] for a in job["answers"] if a["strength"] == 40.0)
    assert shown.all_text_contents() == expected


def test_a_feature_page_shades_every_example_token_with_the_cards_value(real):
    page = real.page
    page.goto(f"{real.base}/#/features/{SAE}/{MUSIC}")
    page.wait_for_selector("#feature-examples .tok")
    card = httpx.get(f"{real.base}/api/saes/{SAE}/features/{MUSIC}").json()
    shown = [[[t.text_content(), float(t.get_attribute("data-value"))] for t in item.locator(".tok").all()]
             for item in page.locator("#feature-examples > li").all()]
    assert shown == [e["tokens"] for e in card["examples"]] and all(shown)
    assert page.locator("#feature-label").text_content() == card["label"]
    page.wait_for_selector("#feature-promotes tbody tr")
    assert page.locator("#feature-promotes tbody tr").count() == 10
    assert page.locator("#feature-nearest tbody tr").count() == 10
    page.wait_for_selector("#feature-firing", timeout=180_000)
    spread = httpx.get(f"{real.base}/api/saes/{SAE}/features/{MUSIC}/histogram", timeout=180).json()
    assert f"Fires on {spread['firing']} of {spread['tokens']} tokens" in page.locator("#feature-firing").text_content()
    assert page.locator("#feature-histogram rect").count() == (len(spread["bins"]) if spread["firing"] else 0)


def answer(base: str, body: dict[str, Any]) -> str:
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def test_a_four_way_comparison_equals_four_requests_its_curl_and_its_link(real, browser):
    conditions = ["off", "live", f"{SAE}#{MUSIC}=40", f"{SAE}#{MUSIC}=-40"]
    page = real.open("compare")
    page.fill("#cmp-prompts", "Tell me about your day.")
    page.fill("#cmp-conditions", "\n".join(conditions))
    page.fill("#cmp-seed", "7")
    page.fill("#cmp-max-tokens", "8")
    page.click("#cmp-run")
    page.wait_for_selector(".column[data-measured='yes']")
    columns = page.locator(".column")
    texts = [columns.nth(i).locator(".text").text_content() for i in range(4)]
    model = page.input_value("#cmp-model")
    base = {"model": model, "messages": [{"role": "user", "content": "Tell me about your day."}], "seed": 7,
            "temperature": 0.7, "max_tokens": 8}
    extras = [{"steering_intensity": "off"}, {}, {"profile": f"cmp.{SAE}.{MUSIC}.40"},
              {"profile": f"cmp.{SAE}.{MUSIC}.-40"}]
    assert texts == [answer(real.base, {**base, **extra}) for extra in extras]
    assert len(set(texts)) > 1  # the conditions steer
    curl = columns.nth(2).locator("details[data-form='curl'] pre").text_content()
    ran = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(ran.stdout)["choices"][0]["message"]["content"] == texts[2]

    link = page.locator("#cmp-link").get_attribute("href")
    fresh = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        again = fresh.new_page()
        again.goto(f"{real.base}/{link}")
        again.click("#cmp-run")
        again.wait_for_selector(".column[data-measured='yes']")
        assert [again.locator(".column .text").nth(i).text_content() for i in range(4)] == texts
    finally:
        fresh.close()


def test_a_token_opened_in_the_playground_lists_its_readout_and_the_link_gives_the_same_answer(real, browser):
    page = real.open("playground")
    page.fill("#pg-seed", "3")
    page.fill("#pg-max-tokens", "6")
    page.select_option("#pg-readout", SAE)
    page.fill("#prompt", "Tell me about your day.")
    page.click("#pg-send")
    done = page.locator(".msg.assistant[data-state^='done']")
    done.wait_for()
    text = done.locator(".text").text_content()
    page.locator(".readout .tok").nth(1).click()
    rows = page.locator(".readout-table tbody tr")
    rows.first.wait_for()
    shown = [(int(r.locator("td").nth(0).text_content()), r.locator("td").nth(1).text_content()) for r in rows.all()]
    messages = [{"role": "user", "content": "Tell me about your day."}]
    readout = {"sae_id": SAE, "top_k": 8, "positions": "completion", "token_text": True, "labels": True}
    body = {"model": page.input_value("#pg-model"), "messages": messages, "seed": 3, "temperature": 0.7,
            "max_tokens": 6, "return_sae_activations": readout}
    direct = httpx.post(real.base + "/v1/chat/completions", json=body, timeout=120).json()
    assert direct["choices"][0]["message"]["content"] == text
    position = direct["millm"]["sae_activations"]["positions"][1]
    assert shown == [(f["index"], f["label"] or "") for f in position["features"]]

    link = page.locator("#pg-link").get_attribute("href")
    fresh = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        again = fresh.new_page()
        again.goto(f"{real.base}/{link}")
        again.wait_for_selector("#page[data-page='playground'] section")
        assert again.input_value("#prompt") == "Tell me about your day."
        again.click("#pg-send")
        answer = again.locator(".msg.assistant[data-state^='done']")
        answer.wait_for()
        assert answer.locator(".text").text_content() == text
        assert again.locator(".readout .tok").count() == len(direct["millm"]["sae_activations"]["positions"])
    finally:
        fresh.close()
