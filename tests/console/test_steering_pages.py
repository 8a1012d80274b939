"""The SAEs and Steering pages driven in a browser on the scripted engine: attach the bundled L10 SAE, find a
feature by label (with its firing rate and recommended strength) and its card, set strengths with the slider, the
number box (clamped to ±200) and batch add, turn steering off and on (the values kept), save a profile, clear;
each checked against what GET /api/steering then answers, and the playground's answer steered by them."""

from __future__ import annotations

import httpx

from tests.console.browser import row

SAE = "smollm2-135m-res-L10"
MUSIC = 2375  # "music, melody": the bundled SAE's measured music feature
WEATHER = 990  # "weather, local, geography": measured, and recommends no strength


def steering(base: str) -> dict:
    return httpx.get(base + "/api/steering").json()


def attach_from_the_page(console) -> None:
    page = console.open("saes")
    row(page, "#sae-table", SAE).locator("button[data-action='attach']").click()
    page.wait_for_selector(f"#sae-table tr:has(td:text-is('{SAE}')) button[data-action='detach']")
    assert "layer 10" in row(page, "#sae-table", SAE).text_content()


def test_attach_search_and_read_a_card(console):
    attach_from_the_page(console)
    page = console.page
    assert httpx.get(f"{console.base}/api/saes/{SAE}").json()["attached_layer"] == 10
    page.select_option("#search-sae", SAE)
    page.fill("#search-q", "music")
    page.click("#search-go")
    found = row(page, "#search-table", str(MUSIC))
    card = httpx.get(f"{console.base}/api/saes/{SAE}/features/{MUSIC}").json()
    assert found.locator("td").nth(1).text_content() == "music, melody"
    page.wait_for_function("() => !document.querySelector('#search-table').textContent.includes('…')")
    assert found.locator("td").nth(2).text_content() == f"{card['frequency']:.5f}"
    held = card["held_out"]  # re-measured in the shipped file (bench/remeasure.py --features 2375)
    assert held is not None and held["prompt_set"] == "neutral-v1"
    shown_rate = f"held-out {round(held['rate'] * 100)}% [{round(held['interval'][0] * 100)}%–"
    recommended = card["recommended_strength"]
    assert found.locator("td").nth(3).text_content().startswith(
        f"{recommended:g} · {shown_rate}" if recommended is not None else f"none · {shown_rate}")
    assert found.locator("td").nth(3).text_content().endswith("(neutral-v1, float32 weights)")  # how it was measured
    found.locator("button[data-action='card']").click()
    shown = page.locator("#feature-card")
    shown.wait_for()
    assert shown.locator(".label").text_content() == card["label"]
    first = card["examples"][0]["text"]
    marked = first.split("«")[1].split("»")[0]
    assert shown.locator("ol li").first.locator("mark").text_content() == marked  # the firing token highlighted
    assert shown.locator("ol li").first.locator(".example").text_content() == first.replace("«", "").replace("»", "")
    found.locator("button[data-action='steer']").click()
    assert recommended == 40  # re-measured: recommended, so the button takes it and says what it rests on
    console.notice().filter(has_text=f"Feature {MUSIC} set to its recommended strength 40 on {SAE} "
                                     f"({shown_rate}").wait_for()
    assert steering(console.base)["saes"][SAE]["values"] == {str(MUSIC): 40.0}
    # weather (990) is measured and recommends none: the button sets a starting point and says why, best point shown
    page.fill("#search-q", "weather")
    page.click("#search-go")
    weather = httpx.get(f"{console.base}/api/saes/{SAE}/features/{WEATHER}").json()
    assert weather["recommended_strength"] is None and not weather["held_out"]["recommended"]
    row(page, "#search-table", str(WEATHER)).locator("button[data-action='steer']").click()
    best = f"held-out {round(weather['held_out']['rate'] * 100)}% ["
    console.notice().filter(has_text=f"Feature {WEATHER} set to 20 on {SAE}, a starting point (none is "
                                     f"recommended: {best}").wait_for()
    assert steering(console.base)["saes"][SAE]["values"] == {str(MUSIC): 40.0, str(WEATHER): 20.0}


def test_slider_number_box_toggle_batch_profile_and_clear(console):
    attach_from_the_page(console)
    page = console.open("steering")
    page.fill("#batch", f"{MUSIC}=40, 17=-5")
    page.click("#batch-add")
    slider = page.locator(f"tr[data-feature='{MUSIC}'] input.slider")
    slider.wait_for()
    assert steering(console.base)["saes"][SAE]["values"] == {str(MUSIC): 40.0, "17": -5.0}

    slider.focus()
    for _ in range(5):
        page.keyboard.press("ArrowRight")  # each step is a change the page sends at once
    page.wait_for_function(f"() => document.querySelector(\"tr[data-feature='{MUSIC}'] input.strength\").value == '45'")
    _wait_value(console.base, MUSIC, 45.0)
    assert page.locator(f"tr[data-feature='{MUSIC}'] .label").text_content() == "music, melody"

    box = page.locator("tr[data-feature='17'] input.strength")
    box.fill("250")
    box.press("Enter")
    _wait_value(console.base, 17, 200.0)  # clamped to the ±200 the server applies
    assert page.locator("tr[data-feature='17'] input.strength").input_value() == "200"

    page.uncheck("#steering-enabled")
    page.locator("#steering-live").filter(has_text="Steering is off").wait_for()
    state = steering(console.base)
    assert state["enabled"] is False and state["saes"][SAE]["values"][str(MUSIC)] == 45.0  # values kept
    page.check("#steering-enabled")
    page.locator("#steering-live").filter(has_text="Live").wait_for()
    assert steering(console.base)["enabled"] is True

    page.fill("#profile-name", "from-the-page")
    page.click("#profile-save")
    console.notice().filter(has_text='Saved profile "from-the-page"').wait_for()
    profile = httpx.get(console.base + "/api/profiles/from-the-page").json()
    assert {(e["feature"], e["strength"]) for e in profile["entries"]} == {(MUSIC, 45.0), (17, 200.0)}

    page.locator("tr[data-feature='17'] button").click()  # remove: a strength of 0
    page.locator("tr[data-feature='17']").wait_for(state="detached")
    assert steering(console.base)["saes"][SAE]["values"] == {str(MUSIC): 45.0}
    page.click("#steering-clear")
    page.locator("#steering-rows").filter(has_text="No features set").wait_for()
    assert steering(console.base)["saes"][SAE]["values"] == {}


def test_a_name_in_batch_add_resolves_by_label_or_says_why_not(console):
    attach_from_the_page(console)
    page = console.open("steering")
    page.fill("#batch", "music=20")
    page.click("#batch-add")
    page.locator(f"tr[data-feature='{MUSIC}']").wait_for()
    assert steering(console.base)["saes"][SAE]["values"] == {str(MUSIC): 20.0}
    page.fill("#batch", "no-such-label-anywhere=3")
    page.click("#batch-add")
    console.notice().filter(has_text="matches no feature label").wait_for()
    page.fill("#batch", "music=")
    page.click("#batch-add")
    console.notice().filter(has_text="is not FEATURE=STRENGTH").wait_for()
    assert steering(console.base)["saes"][SAE]["values"] == {str(MUSIC): 20.0}
    # a name alone: its recommended strength, said; or, where there is none, why not and the best held-out point
    recommended = httpx.get(f"{console.base}/api/saes/{SAE}/features/{MUSIC}").json()["recommended_strength"]
    page.fill("#batch", "music")
    page.click("#batch-add")
    if recommended is None:
        console.notice().filter(has_text="has no recommended strength: the best held-out point").wait_for()
        assert steering(console.base)["saes"][SAE]["values"] == {str(MUSIC): 20.0}
    else:
        said = f"music: feature {MUSIC} of {SAE} at its recommended strength {recommended:g}"
        console.notice().filter(has_text=said).wait_for()
        assert steering(console.base)["saes"][SAE]["values"] == {str(MUSIC): float(recommended)}


def test_the_playground_streams_and_shows_the_steering_it_ran_under(console):
    page = console.open("playground")
    page.fill("#pg-max-tokens", "12")
    page.fill("#prompt", "Hello?")
    page.click("#pg-send")
    answer = page.locator(".msg.assistant[data-state^='done']")
    answer.wait_for()
    assert answer.locator(".text").text_content() == "Hello from t"  # the scripted answer, 12 tokens
    assert answer.get_attribute("data-state") == "done:length"
    assert page.locator("#pg-steering").text_content() == "X-miLLM-Steering: none"

    attach_from_the_page(console)
    httpx.patch(console.base + "/api/steering", json={"sae": SAE, "values": {str(MUSIC): 40}}).raise_for_status()
    page = console.open("playground")
    page.fill("#pg-max-tokens", "7")
    page.fill("#pg-seed", "11")
    page.select_option("#pg-scope", "generated")
    page.fill("#prompt", "Again?")
    with page.expect_request("**/v1/chat/completions") as sent:
        page.click("#pg-send")
    body = sent.value.post_data_json
    assert body["seed"] == 11 and body["steering_scope"] == "generated" and body["stream"] is True
    assert body["messages"] == [{"role": "user", "content": "Again?"}]
    answer = page.locator(".msg.assistant[data-state^='done']")
    answer.wait_for()
    assert answer.locator(".text").text_content() == "Steered"  # the scripted engine's steered answer
    assert page.locator("#pg-steering").text_content() == "X-miLLM-Steering: live;scope=generated"


def _wait_value(base: str, feature: int, value: float) -> None:
    """Until GET /api/steering holds ``value`` for ``feature`` (the page sends changes as they happen)."""
    import time

    deadline = time.monotonic() + 30
    while steering(base)["saes"][SAE]["values"].get(str(feature)) != value:
        assert time.monotonic() < deadline, steering(base)
        time.sleep(0.05)


def test_stop_ends_a_streaming_answer_and_keeps_what_came(open_console):
    from tests.support.fakes import SCRIPT, FakeEngine

    with open_console(FakeEngine(steerable=True, pace=0.05)) as console:
        page = console.open("playground")
        page.fill("#pg-max-tokens", "500")
        page.fill("#prompt", "Go on.")
        page.click("#pg-send")
        text = page.locator(".msg.assistant .text")
        page.wait_for_function("() => document.querySelector('.msg.assistant .text').textContent.length >= 5")
        page.click("#pg-stop")
        page.locator(".msg.assistant[data-state='stopped']").wait_for()
        kept = text.text_content()
        assert 5 <= len(kept) < len(SCRIPT) and SCRIPT.startswith(kept)
        assert page.locator("#pg-send").is_enabled() and page.locator("#pg-stop").is_disabled()
        console.clean()


def test_add_an_sae_by_path_and_delete_it(console, tmp_path):
    import shutil
    from pathlib import Path

    import millm.sae

    folder = tmp_path / "copy-of-l10"
    shutil.copytree(Path(millm.sae.__file__).parent / "bundled" / SAE, folder)
    page = console.open("saes")
    page.fill("#sae-path", str(tmp_path / "nothing-here"))
    page.click("#sae-add")
    console.notice().filter(has_text="400").wait_for()
    error = httpx.post(console.base + "/api/saes", json={"path": str(tmp_path / "nothing-here")}).json()["error"]
    assert console.notice().text_content() == f"400 {error['code']}: {error['message']}"

    page.fill("#sae-path", str(folder))
    page.click("#sae-add")
    console.notice().filter(has_text="Registered.").wait_for()
    added = [s for s in httpx.get(console.base + "/api/saes").json()["data"] if s["path"] == str(folder)]
    assert len(added) == 1 and added[0]["d_sae"] == 4096
    listed = row(page, "#sae-table", added[0]["id"])
    assert listed.locator("td").nth(4).text_content() == "10"  # its layer hint
    listed.locator("button[data-action='delete']").click()
    console.notice().filter(has_text=f"Deleted {added[0]['id']}.").wait_for()
    page.locator("#sae-table tr").filter(has_text=added[0]["id"]).wait_for(state="detached")  # re-drawn after
    assert httpx.get(f"{console.base}/api/saes/{added[0]['id']}").status_code == 404


def test_the_steering_page_follows_changes_made_by_other_clients(console):
    httpx.post(f"{console.base}/api/saes/{SAE}/attach", json={}).raise_for_status()
    page = console.open("steering")
    page.locator("#steering-rows").filter(has_text="No features set").wait_for()
    httpx.patch(console.base + "/api/steering", json={"sae": SAE, "values": {str(MUSIC): 33}}).raise_for_status()
    page.locator(f"tr[data-feature='{MUSIC}'] input.strength").wait_for()  # no reload: the page reads it again
    assert page.locator(f"tr[data-feature='{MUSIC}'] input.strength").input_value() == "33"
    httpx.post(console.base + "/api/steering/disable").raise_for_status()
    page.locator("#steering-live").filter(has_text="Steering is off").wait_for()
    assert not page.is_checked("#steering-enabled")
