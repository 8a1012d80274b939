"""Every page of the console loads in a real browser: no uncaught error, no console error, nothing fetched from
any host but the server, each page at its own address and reachable from the sidebar."""

from __future__ import annotations

import re

from tests.console.browser import PAGES


def test_every_page_loads_clean_from_its_own_address(console):
    for name in PAGES:
        page = console.open(name)
        assert page.locator(f"#nav a[data-page='{name}']").get_attribute("class") == "active"
        assert page.url.endswith(f"/#/{name}")
        notice = console.notice()
        assert not (notice.is_visible() and notice.get_attribute("class") == "error"), (name, notice.text_content())
    page.wait_for_load_state("networkidle")
    assert console.console_errors == []
    assert console.urls and all(url.startswith(console.base) for url in console.urls)


def test_the_sidebar_reaches_every_page(console):
    page = console.open("dashboard")
    for name in reversed(PAGES):
        page.click(f"#nav a[data-page='{name}']")
        page.wait_for_selector(f"#page[data-page='{name}'] section")
        assert page.url.endswith(f"/#/{name}")
    assert console.console_errors == []


def test_the_dashboard_shows_the_model_and_the_servers_own_counts(console):
    page = console.open("dashboard")
    model = page.locator("#dash-model")
    assert model.locator("dd").first.text_content() == "fake"
    shown = dict(zip(model.locator("dt").all_text_contents(), model.locator("dd").all_text_contents(), strict=True))
    assert (shown["backend"], shown["dtype"], shown["context"]) == ("serial", "float32", "4096 tokens")
    page.request.post(console.base + "/v1/chat/completions", data={
        "model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    traffic = page.locator("#dash-traffic")
    # the completion counter the dashboard reads from /metrics reaches the three tokens just generated
    page.wait_for_function("() => Number(document.querySelectorAll('#dash-traffic dd')[2].textContent) >= 3")
    assert int(traffic.locator("dd").first.text_content()) >= 1  # the /v1 request just sent
    counts = dict(zip(traffic.locator("dt").all_text_contents(), traffic.locator("dd").all_text_contents(),
                      strict=True))
    assert re.fullmatch(r"[1-9]\d* MiB", counts["memory (RSS)"])  # this test process's, from /metrics
    assert not any(k.startswith("GPU memory") for k in counts)  # none on the CPU
    page.request.post(console.base + "/api/saes/smollm2-135m-res-L10/attach", data={})
    attached = page.locator("#dash-saes tbody tr")
    attached.first.wait_for()
    assert [c.text_content() for c in attached.first.locator("td").all()] == [
        "smollm2-135m-res-L10", "SAE (topk)", "10", "4096"]
