"""The Profiles, Clusters and Circuits pages driven in a browser (scripted engine named as the bundled model, so the
example documents in profiles/ fit): save a profile from the live values, export it (a download), delete it,
re-import the file (an upload) and activate it; import a cluster and turn its dial λ; import and activate a
circuit. Each checked against what the API then answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from tests.console.browser import row
from tests.support.fakes import FakeEngine

EXAMPLES = Path(__file__).resolve().parents[2] / "profiles"
L10, L20 = "smollm2-135m-res-L10", "smollm2-135m-res-L20"


def bundled_engine() -> FakeEngine:
    return FakeEngine(model_id="SmolLM2-135M-Instruct", steerable=True)


def test_save_export_reimport_and_activate_a_profile(open_console, tmp_path):
    with open_console(bundled_engine()) as console:
        base = console.base
        httpx.post(f"{base}/api/saes/{L10}/attach", json={}).raise_for_status()
        httpx.put(f"{base}/api/steering", json={"sae": L10, "values": {"2375": 40, "17": -8}}).raise_for_status()
        page = console.open("profiles")
        page.fill("#new-profile", "mine")
        page.fill("#new-profile-description", "made on the page")
        page.click("#profile-create")
        mine = row(page, "#profiles-table", "mine")
        mine.wait_for()
        assert mine.locator("td").nth(1).text_content() == "made on the page"
        assert mine.locator("td").nth(3).text_content() == "all"  # its steering_scope

        with page.expect_download() as download:
            mine.locator("button[data-action='export']").click()
        saved = tmp_path / "mine.json"
        download.value.save_as(saved)
        assert download.value.suggested_filename == "mine.json"
        assert json.loads(saved.read_text()) == httpx.get(f"{base}/api/profiles/mine/export").json()

        mine.locator("button[data-action='delete']").click()
        page.locator("#profile-list").filter(has_text="No profile saved").wait_for()
        assert httpx.get(f"{base}/api/profiles/mine").status_code == 404

        page.set_input_files("#profile-file", str(saved))
        page.click("#profile-import")
        row(page, "#profiles-table", "mine").wait_for()
        httpx.delete(f"{base}/api/steering").raise_for_status()
        row(page, "#profiles-table", "mine").locator("button[data-action='activate']").click()
        row(page, "#profiles-table", "mine").locator("button[data-action='deactivate']").wait_for()
        state = httpx.get(f"{base}/api/steering").json()
        assert state["active_profile"] == "mine"
        assert state["saes"][L10]["values"] == {"2375": 40.0, "17": -8.0}

        page.set_input_files("#profile-file", str(saved))
        page.click("#profile-import")  # the name is taken: the server's 409, shown as it words it
        console.notice().filter(has_text="409").wait_for()
        row(page, "#profiles-table", "mine").locator("button[data-action='deactivate']").click()
        row(page, "#profiles-table", "mine").locator("button[data-action='activate']").wait_for()
        assert httpx.get(f"{base}/api/profiles").json()["active"] is None

        httpx.put(f"{base}/api/steering", json={"sae": L10, "values": {"1604": 12}}).raise_for_status()
        row(page, "#profiles-table", "mine").locator("button[data-action='update']").click()
        console.notice().filter(has_text='Updated "mine"').wait_for()
        updated = httpx.get(f"{base}/api/profiles/mine").json()
        assert [(e["feature"], e["strength"]) for e in updated["entries"]] == [(1604, 12.0)]
        assert updated["description"] == "made on the page"
        console.clean()


def imported(page: Any, kind: str, path: Path) -> Any:
    """Import the document at ``path`` with the page's file picker; its row once listed."""
    page.set_input_files(f"#{kind}-file", str(path))
    page.click(f"#{kind}-import")
    listed = row(page, f"#{kind}s-table", json.loads(path.read_text())["name"])
    listed.wait_for()
    return listed


def test_import_a_cluster_and_turn_its_dial(open_console):
    with open_console(bundled_engine()) as console:
        base = console.base
        httpx.post(f"{base}/api/saes/{L20}/attach", json={}).raise_for_status()
        page = console.open("clusters")
        cluster = imported(page, "cluster", EXAMPLES / "weather-cluster.json")
        document = json.loads((EXAMPLES / "weather-cluster.json").read_text())
        assert cluster.locator("td").nth(1).text_content() == "20"
        assert cluster.locator("td").nth(2).text_content() == str(len(document["members"]))
        before = httpx.get(f"{base}/api/clusters/weather-cluster").json()["intensity"]
        dial = cluster.locator("input.dial")
        dial.focus()
        for _ in range(4):
            page.keyboard.press("ArrowRight")  # 0.05 a step
        expected = round(before + 0.2, 2)
        console.notice().filter(has_text=f"λ {expected:.2f}").wait_for()
        assert httpx.get(f"{base}/api/clusters/weather-cluster").json()["intensity"] == expected
        with page.expect_download() as download:
            row(page, "#clusters-table", "weather-cluster").locator("button[data-action='export']").click()
        exported = json.loads(Path(download.value.path()).read_text())
        assert exported == httpx.get(f"{base}/api/clusters/weather-cluster").json()["document"]
        assert exported["members"] == document["members"] and exported["kind"] == "cluster"
        row(page, "#clusters-table", "weather-cluster").locator("button[data-action='activate']").click()
        row(page, "#clusters-table", "weather-cluster").locator("button[data-action='deactivate']").wait_for()
        assert httpx.get(f"{base}/api/profiles").json()["active"] == "weather-cluster"
        console.clean()


def test_import_and_activate_a_circuit(open_console):
    with open_console(bundled_engine()) as console:
        base = console.base
        for sae in (L10, L20):
            httpx.post(f"{base}/api/saes/{sae}/attach", json={}).raise_for_status()
        page = console.open("circuits")
        circuit = imported(page, "circuit", EXAMPLES / "weather-circuit.json")
        served = httpx.get(f"{base}/api/circuits/weather-circuit").json()
        assert circuit.locator("td").nth(1).text_content() == "3"
        assert circuit.locator("td").nth(2).text_content() == str(served["document"]["evidence"]["rung"])
        assert circuit.locator("td").nth(3).text_content() == served["steering"]["mode"]
        with page.expect_download() as download:
            circuit.locator("button[data-action='export']").click()
        exported = json.loads(Path(download.value.path()).read_text())
        assert exported == json.loads((EXAMPLES / "weather-circuit.json").read_text())  # what was imported
        httpx.delete(f"{base}/api/circuits/weather-circuit").raise_for_status()
        page.reload()
        page.locator("#circuit-list").filter(has_text="No circuit imported").wait_for()
        circuit = imported(page, "circuit", Path(download.value.path()))  # the export imports back
        circuit.locator("button[data-action='activate']").click()
        row(page, "#circuits-table", "weather-circuit").locator("button[data-action='deactivate']").wait_for()
        assert httpx.get(f"{base}/api/profiles").json()["active"] == "weather-circuit"
        console.clean()
