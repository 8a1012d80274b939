"""The Monitor page's probes and sensing events on the real model: a stored probe listed, attached from the page,
and the fired verdict of the next answer (sent from outside the browser) pushed into the sensing table; a sensing
cluster's event pushed there too, its source and name in one column and no action."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from millm.registry import BUNDLED_ID
from tests.console.browser import Watched, row

NAME = "eager-console"


@pytest.fixture
def eager(engine, server: str) -> Iterator[str]:
    """A probe of the loaded model that fires on every answer (its threshold below any score), removed after."""
    from millm.probes.probe import Figures, Probe, identity

    model = identity(engine)
    probe = Probe(NAME, 10, "diffmean", [1.0] + [0.0] * (model.hidden_size - 1), 0.0, "max", "response", -1e9,
                  Figures(1.0, 1.0, 0.0, 0.01, {"positive": 1, "negative": 1}, {"positive": 1, "negative": 1}), model)
    assert httpx.post(server + "/api/probes/import", json=probe.document()).status_code == 201
    try:
        yield NAME
    finally:
        httpx.delete(f"{server}/api/probes/{NAME}")


def test_attach_a_probe_on_the_monitor_and_see_its_verdicts_pushed(browser: Any, server: str, eager: str):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        watched = Watched(context.new_page(), server)
        page = watched.open("monitor")
        row(page, "#mon-probe-table", NAME).locator("button.mon-probe-toggle").click()
        page.wait_for_selector(f"#mon-probe-table tr:has(td:text-is('{NAME}')) button:text-is('flag: detach')")
        answer = httpx.post(server + "/v1/chat/completions", timeout=120, json={
            "model": BUNDLED_ID, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 3, "temperature": 0})
        assert answer.json()["millm"]["probes"][0]["fired"]
        pushed = row(page, "#mon-sensing-table", answer.json()["id"])
        pushed.wait_for()
        assert NAME in pushed.text_content()
        row(page, "#mon-probe-table", NAME).locator("button.mon-probe-toggle").click()
        page.wait_for_selector(f"#mon-probe-table tr:has(td:text-is('{NAME}')) button:text-is('attach')")
        assert "millm" not in httpx.post(server + "/v1/chat/completions", timeout=120, json={
            "model": BUNDLED_ID, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2}).json()
        watched.clean()
    finally:
        context.close()
        httpx.post(f"{server}/api/probes/{NAME}/detach")


def test_a_sensing_clusters_event_is_pushed_into_the_monitors_table(browser: Any, server: str):
    sae = "smollm2-135m-res-L10"
    doc = {"kind": "cluster", "name": "sense-console", "model": BUNDLED_ID, "sae": {"id": sae, "layer": 10,
                                                                                   "d_sae": 4096},
           "members": [{"feature": f, "strength": 0.0, "threshold": 0.001} for f in (2327, 3617, 1679, 20)]}
    assert httpx.post(f"{server}/api/saes/{sae}/attach", json={}, timeout=60).status_code == 200
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        assert httpx.post(server + "/api/clusters/import?overwrite=true", json=doc, timeout=30).status_code == 201
        assert httpx.post(server + "/api/clusters/sense-console/sensing", json={}, timeout=30).status_code == 200
        watched = Watched(context.new_page(), server)
        page = watched.open("monitor")
        answer = httpx.post(server + "/v1/chat/completions", timeout=120, json={
            "model": BUNDLED_ID, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 8, "temperature": 0})
        pushed = row(page, "#mon-sensing-table", answer.json()["id"])
        pushed.wait_for()
        cells = [c.strip() for c in pushed.locator("td").all_text_contents()]
        assert cells[2] == "cluster sense-console" and cells[-1] == "–"  # source and name; a cluster takes no action
        watched.clean()
    finally:
        context.close()
        httpx.delete(server + "/api/clusters/sense-console", timeout=30)
        httpx.post(f"{server}/api/saes/{sae}/detach", timeout=60)
