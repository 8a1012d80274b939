"""The Models page driven in a browser on the scripted engine: the registry with each model's state, lock and
unlock, and the server's refusals (a bundled model cannot be deleted, a path that is no model cannot be added)
shown as the server words them."""

from __future__ import annotations

import httpx

from tests.console.browser import row

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
