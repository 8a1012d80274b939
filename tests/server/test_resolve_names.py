"""``POST /api/saes/{id}/resolve`` on the session's real server: names and ``--steer`` items resolved by the CLI's
one rule (``LabelIndex``), so the console and the TUI over ``--url`` recommend and refuse as ``millm chat`` does."""

from __future__ import annotations

import httpx

SAE = "smollm2-135m-res-L10"
MUSIC = 2375  # measured on held-out prompts, recommended a strength


def index():
    from millm.sae.bundled import bundled_saes  # imports torch: not at the fast tier's collection
    from millm.sae.labels import LabelIndex

    return LabelIndex.load(next(b.path for b in bundled_saes() if b.id == SAE), SAE)


def resolve(server: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server}/api/saes/{SAE}/resolve", json=body)


def test_names_and_steer_items_resolve_as_the_cli_resolves_them(server):
    own = index()
    unmeasured = next(i for i, label in own.labels.items() if i not in own.held and len(own.search(label)) == 1)
    r = resolve(server, {"names": ["music, melody", "#7", own.labels[unmeasured]]})
    assert r.status_code == 200, r.text
    assert [(f["index"], f["label"]) for f in r.json()["features"]] == [
        (own.resolve("music, melody"), own.labels[own.resolve("music, melody")]), (7, own.labels.get(7)),
        (unmeasured, own.labels[unmeasured])]
    said: list[str] = []
    expected = own.resolve_assignments([str(MUSIC), "7=-15"], "steer", said.append)
    r = resolve(server, {"steer": [str(MUSIC), "7=-15"]})
    assert r.status_code == 200, r.text
    assert r.json()["values"] == {str(i): v for i, v in expected.items()} and r.json()["said"] == said
    assert r.json()["values"][str(MUSIC)] == own.held[MUSIC].recommended_strength and len(said) == 1


def test_what_the_rule_refuses_is_a_400_naming_the_field(server):
    own = index()
    unmeasured = next(i for i in own.labels if i not in own.held)
    cases = [
        ({"steer": [str(unmeasured)]}, "steer", "has no recommended strength"),
        ({"steer": ["music="]}, "steer", "is not FEATURE=STRENGTH"),
        ({"names": ["no-such-label-anywhere"]}, "names", "matches no feature label"),
        ({"names": []}, "names", "1 to 256"),
        ({"names": ["music"], "steer": ["music"]}, "names", "exactly one of"),
        ({}, "names", "exactly one of"),
    ]
    for body, param, says in cases:
        r = resolve(server, body)
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert error["param"] == param and says in error["message"], (body, error)
    r = resolve(server, {"names": ["music"], "limit": 3})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unused_fields_refused"
    assert httpx.post(f"{server}/api/saes/no-such-sae/resolve", json={"names": ["music"]}).status_code == 404
