"""What the console must never do: run markup it was given (a hostile SAE label, example or model answer shows as
those characters and opens no dialog), write without the key the server asks for (the refusal is shown as the
server words it; the key never travels in a URL), or be driven by a page of another origin (its writes are
refused 403 or never sent, its reads blocked by the browser)."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

import millm.sae
from tests.console.browser import row
from tests.support.fakes import FakeEngine

HOSTILE = "<img src=x onerror=alert(1)>"
BUNDLED = Path(millm.sae.__file__).parent / "bundled" / "smollm2-135m-res-L10"
FEATURE = 7


def hostile_sae(folder: Path) -> Path:
    """The bundled L10 SAE with feature 7's label and first example made of markup."""
    folder.mkdir(parents=True)
    for name in ("cfg.json", "sae_weights.safetensors"):
        shutil.copy(BUNDLED / name, folder / name)
    (folder / "labels.json").write_text(json.dumps({str(FEATURE): HOSTILE, "8": "<script>alert(2)</script>"}))
    lines = (BUNDLED / "features.jsonl").read_text().splitlines()
    record = json.loads(lines[FEATURE])
    record["examples"][0]["text"] = f"before«{HOSTILE}»after"
    record["promotes"][0] = "<b onmouseover=alert(3)>"
    lines[FEATURE] = json.dumps(record)
    (folder / "features.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_hostile_labels_examples_and_answers_render_as_text(open_console, tmp_path):
    engine = FakeEngine(steerable=True, script=HOSTILE + " and <script>alert(4)</script>")
    with open_console(engine) as console:
        sae = httpx.post(console.base + "/api/saes", json={"path": str(hostile_sae(tmp_path / "evil")),
                                                           "name": "evil"}).json()["id"]
        page = console.open("saes")
        row(page, "#sae-table", sae).locator("button[data-action='attach']").click()
        page.wait_for_selector("button[data-action='detach']")
        page.select_option("#search-sae", sae)
        page.fill("#search-q", "onerror")
        page.click("#search-go")
        found = row(page, "#search-table", str(FEATURE))
        assert found.locator(".label").text_content() == HOSTILE
        found.locator("button[data-action='card']").click()
        card = page.locator("#feature-card")
        card.wait_for()
        assert card.locator(".label").text_content() == HOSTILE
        assert card.locator("ol li mark").first.text_content() == HOSTILE
        assert card.locator(".tokens code").first.text_content() == "<b onmouseover=alert(3)>"

        httpx.patch(console.base + "/api/steering", json={"sae": sae, "values": {str(FEATURE): 10, "8": 5}})
        page = console.open("steering")
        page.locator(f"tr[data-feature='{FEATURE}'] .label").filter(has_text=HOSTILE).wait_for()
        page.locator("tr[data-feature='8'] .label").filter(has_text="<script>alert(2)</script>").wait_for()
        assert page.locator("tr[data-feature='8'] .label").text_content() == "<script>alert(2)</script>"

        httpx.delete(console.base + "/api/steering").raise_for_status()  # unsteered: the engine's own (hostile) script
        page = console.open("playground")
        page.fill("#pg-max-tokens", "200")
        page.fill("#prompt", HOSTILE)
        page.click("#pg-send")
        answer = page.locator(".msg.assistant[data-state^='done'] .text")
        answer.wait_for()
        assert answer.text_content() == HOSTILE + " and <script>alert(4)</script>"
        assert page.locator(".msg.user .text").text_content() == HOSTILE
        assert page.locator("#page img, #page script, .msg .text *").count() == 0  # nothing became an element
        page.mouse.move(10, 10)
        console.clean()  # no dialog fired, nothing fetched from "x" or anywhere else


def test_with_an_admin_key_writes_without_it_show_the_refusal(open_console):
    key = "admin-key-for-the-console-test"
    with open_console(admin_key=key) as console:
        page = console.open("saes")
        row(page, "#sae-table", "smollm2-135m-res-L10").locator("button[data-action='attach']").click()
        notice = console.notice()
        notice.filter(has_text="401").wait_for()
        refusal = httpx.post(console.base + "/api/saes/smollm2-135m-res-L10/attach", json={"layer": 10})
        error = refusal.json()["error"]
        assert notice.text_content() == f"401 {error['code']}: {error['message']} (enter the key above)"  # verbatim
        assert notice.get_attribute("class") == "error"
        assert httpx.get(console.base + "/api/saes/smollm2-135m-res-L10").json()["attached_layer"] is None

        page.fill("#key", key)
        page.click("#key-use")
        page.wait_for_selector("#sae-table")
        row(page, "#sae-table", "smollm2-135m-res-L10").locator("button[data-action='attach']").click()
        page.wait_for_selector("button[data-action='detach']")
        assert httpx.get(console.base + "/api/saes/smollm2-135m-res-L10").json()["attached_layer"] == 10
        assert page.input_value("#key") == ""  # the field is emptied; the key lives in this tab's sessionStorage
        assert page.evaluate("() => sessionStorage.getItem('millm.key')") == key
        assert page.evaluate("() => Object.keys(localStorage).length") == 0 and page.context.cookies() == []
        assert all(key not in url for url in console.urls)  # never in a URL
        sent = [h.get("authorization") for h in console.headers if "authorization" in h]
        assert sent and set(sent) == {f"Bearer {key}"}

        page.click("#key-forget")
        assert page.evaluate("() => sessionStorage.getItem('millm.key')") is None
        console.clean()


def test_with_an_api_key_the_pages_say_a_key_is_needed(open_console):
    with open_console(api_key="the-api-key") as console:
        page = console.page
        page.goto(console.base + "/#/dashboard")
        console.notice().filter(has_text="401 ").wait_for()
        assert "enter the key above" in console.notice().text_content()
        assert page.evaluate("() => document.activeElement.id") == "key"  # the page asks for the key
        assert page.locator("#dash-model dd").count() == 0  # nothing read without the key
        page.fill("#key", "the-api-key")
        page.click("#key-use")
        page.locator("#dash-model dd").first.filter(has_text="fake").wait_for()
        page = console.open("monitor")  # the pushed stream carries the key in its header too (not EventSource)
        page.locator("#mon-summary").filter(has_text="Not monitoring: 0 positions read").wait_for()
        sent = zip(console.urls, console.headers, strict=True)
        streams = [h for u, h in sent if u.endswith("/api/monitoring/events")]
        assert streams and all(h.get("authorization") == "Bearer the-api-key" for h in streams)
        assert not any("the-api-key" in u for u in console.urls)
        console.clean()


ATTACK = """<!doctype html><title>hostile</title><body><script>
const target = %s;
async function attempt(name, init) {
  try { const r = await fetch(target + "/api/steering/disable", init); return name + ":" + r.type + ":" + r.status; }
  catch (e) { return name + ":blocked"; }
}
(async () => {
  const out = [];
  out.push(await attempt("json", {method: "POST", headers: {"Content-Type": "application/json"}, body: "{}"}));
  out.push(await attempt("text", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"},
                                  body: "{}"}));
  out.push(await attempt("form", {method: "POST", mode: "no-cors", body: new URLSearchParams({a: "1"})}));
  out.push(await attempt("bare", {method: "POST", mode: "no-cors"}));
  try { const r = await fetch(target + "/api/steering"); out.push("read:" + (await r.text()).slice(0, 10)); }
  catch (e) { out.push("read:blocked"); }
  document.body.dataset.done = out.join(",");
})();
</script></body>"""


@contextmanager
def hostile_site(target: str) -> Iterator[str]:
    """A second loopback server, on a port of its own, serving a page that tries to drive ``target``."""
    page = (ATTACK % json.dumps(target)).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_of_another_origin_cannot_drive_the_server(console):
    httpx.post(console.base + "/api/saes/smollm2-135m-res-L10/attach", json={}).raise_for_status()
    assert httpx.get(console.base + "/api/steering").json()["enabled"] is True
    with hostile_site(console.base) as site:
        page = console.page.context.new_page()
        statuses = []
        page.on("response", lambda r: statuses.append((r.request.method, r.status))
                if r.url.startswith(console.base) else None)
        page.goto(site + "/")
        page.wait_for_selector("body[data-done]", state="attached")
        results = page.evaluate("() => document.body.dataset.done").split(",")
    assert results[0] == "json:blocked"  # a JSON body needs the preflight, which grants nothing
    assert results[1:4] == ["text:opaque:0", "form:opaque:0", "bare:opaque:0"]  # sent blind, and refused:
    assert results[4] == "read:blocked"  # no CORS grant: the page reads nothing
    writes = [status for method, status in statuses if method == "POST"]
    assert writes and set(writes) <= {403, 415}
    assert 403 in writes
    assert httpx.get(console.base + "/api/steering").json()["enabled"] is True  # nothing changed
