"""The Models page driven in a browser on the scripted engine: the registry with each model's state, lock and
unlock, and the server's refusals (a bundled model cannot be deleted, a path that is no model cannot be added)
shown as the server words them."""

from __future__ import annotations

import httpx

from tests.console.browser import row
from tests.support.hub import hub_at

BUNDLED = "SmolLM2-135M-Instruct"


def test_the_registry_lock_unlock_and_refusals_verbatim(console, tmp_path):
    page = console.open("models")
    models = httpx.get(console.base + "/api/models").json()["data"]
    assert page.locator("#models-table tbody tr").count() == len(models)
    for model in models:
        assert model["state"] in row(page, "#models-table", model["id"]).locator("td").nth(4).text_content()
    assert "LOADED" in row(page, "#models-table", "fake").text_content()

    row(page, "#models-table", BUNDLED).locator("button[data-action='lock']").click()
    row(page, "#models-table", BUNDLED).locator("button[data-action='unlock']").wait_for()
    assert httpx.get(f"{console.base}/api/models/{BUNDLED}").json()["locked"] is True
    assert "(locked)" in row(page, "#models-table", BUNDLED).text_content()
    row(page, "#models-table", BUNDLED).locator("button[data-action='unlock']").click()
    row(page, "#models-table", BUNDLED).locator("button[data-action='lock']").wait_for()
    assert httpx.get(f"{console.base}/api/models/{BUNDLED}").json()["locked"] is False

    row(page, "#models-table", "fake").locator("button[data-action='lock']").click()
    row(page, "#models-table", "fake").locator("button[data-action='unlock']").wait_for()
    row(page, "#models-table", BUNDLED).locator("button[data-action='load']").click()  # the lock refuses a swap
    console.notice().filter(has_text="409").wait_for()
    error = httpx.post(f"{console.base}/api/models/{BUNDLED}/load").json()["error"]
    assert error["code"] == "model_locked"
    assert console.notice().text_content() == f"409 {error['code']}: {error['message']}"
    assert httpx.get(console.base + "/api/health/inference").json()["model"] == "fake"  # still loaded
    row(page, "#models-table", "fake").locator("button[data-action='unlock']").click()
    row(page, "#models-table", "fake").locator("button[data-action='lock']").wait_for()

    row(page, "#models-table", BUNDLED).locator("button[data-action='delete']").click()
    console.notice().filter(has_text="400").wait_for()
    error = httpx.delete(f"{console.base}/api/models/{BUNDLED}").json()["error"]
    assert console.notice().text_content() == f"400 {error['code']}: {error['message']}"

    page.fill("#model-path", str(tmp_path / "no-model-here"))
    page.click("#model-add")
    console.notice().filter(has_text="'path'").wait_for()
    error = httpx.post(console.base + "/api/models", json={"path": str(tmp_path / "no-model-here")}).json()["error"]
    assert console.notice().text_content() == f"400 {error['code']}: {error['message']}"
    assert httpx.get(console.base + "/api/models").json()["data"] == models


def test_pull_a_model_from_the_page_its_bytes_followed_and_a_refusal_verbatim(console, monkeypatch):
    with hub_at(monkeypatch):
        page = console.open("models")
        page.fill("#pull-model", "acme/tiny-GGUF:Q8_0")
        page.click("#pull-go")
        page.wait_for_selector("#pull-job[data-status='succeeded']")
        job = httpx.get(console.base + "/api/pulls").json()["data"][0]
        assert page.locator("#pull-job").text_content() == (
            f"{job['id']} acme/tiny-GGUF:Q8_0: succeeded 2.5 of 2.5 MB as tiny:Q8_0 (1 file(s) downloaded)")
        assert "READY" in row(page, "#models-table", "tiny:Q8_0").text_content()  # the table read again

        page.fill("#pull-model", "acme/tiny-GGUF:Q2_K")
        page.click("#pull-go")
        page.wait_for_selector("#pull-job[data-status='failed']")
        error = httpx.get(console.base + "/api/pulls").json()["data"][0]["error"]
        assert page.locator("#pull-job").text_content().endswith(f" — {error['code']}: {error['message']}")
        assert "Q8_0" in error["message"]  # the quantizations the repo has, as `millm models pull` says
