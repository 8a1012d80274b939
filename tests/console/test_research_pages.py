"""The research pages on the real bundled model (the session's ``millm serve``): a sweep run from the Sweeps page
draws its points as GET /api/sweeps/{id} has them (whose numbers the CLI's equal: tests/server/test_sweeps_api.py)
and lists a point's answers on click. A few tokens each."""

from __future__ import annotations

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
