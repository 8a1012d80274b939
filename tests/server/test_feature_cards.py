"""``GET /api/saes/{id}/features/{index}`` (a feature's card) and the ranking of ``?q=``. Fast tier: a scripted
engine behind Quart's test client."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from millm.config import Settings
from tests.support.cards import ROWS, TABLE, measured
from tests.support.fakes import FakeEngine
from tests.support.saes import random_sae, write_saelens


def scenario_results(tmp_path: Path, calls: list[str], extra: list[Any] = ()) -> tuple[str, list[tuple[int, Any]]]:
    """Register a 64-feature SAE with labels and features.jsonl (``extra`` rows after the usual ones), then GET
    each of ``calls`` (``{id}`` is replaced by its id); returns the id and (status, body) per call."""
    from millm.server.app import create_app

    folder = write_saelens(tmp_path / "sae", random_sae(16, 64, seed=2), layer=1)
    (folder / "labels.json").write_text(json.dumps({str(k): v for k, v in TABLE.items()}))
    rows = ROWS + [{"index": 6, "label": "terrain, maps", **measured(40.0)}, *extra]
    (folder / "features.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    app = create_app(Settings(home=tmp_path / "home"), FakeEngine())  # type: ignore[arg-type]

    async def main() -> tuple[str, list[tuple[int, Any]]]:
        async with app.test_app():
            client = app.test_client()
            added = await client.post("/api/saes", json={"path": str(folder)})
            assert added.status_code == 201
            sae_id = (await added.get_json())["id"]
            out = []
            for path in calls:
                r = await client.get(path.replace("{id}", sae_id))
                out.append((r.status_code, await r.get_json()))
            return sae_id, out
    return asyncio.run(main())


def test_card_route_returns_the_card(tmp_path: Path) -> None:
    sae_id, [(status, card), (_, measured), (_, dead)] = scenario_results(
        tmp_path, ["/api/saes/{id}/features/3", "/api/saes/{id}/features/6", "/api/saes/{id}/features/40"])
    assert status == 200
    assert card == {"sae": sae_id, "index": 3, "d_sae": 64, "label": "rain, wet", "recorded": True,
                    "frequency": 0.0125, "max_activation": 17.5,
                    "top_tokens": [{"token": "rain", "weight": 40.5}, {"token": "storm", "weight": 12.0}],
                    "examples": [{"text": "then the« rain» fell", "activation": 17.5},
                                 {"text": "no marks here", "activation": 2.0}],
                    "promotes": [" umbrella", "wet"], "measured": False, "recommended_strength": None,
                    "concept_rate": None, "held_out": None, "note": None}
    assert measured["measured"] is True and measured["recommended_strength"] == 40.0
    assert measured["concept_rate"] == 0.5 and measured["held_out"]["interval"] == [0.3, 0.69]
    assert dead["recorded"] is False and "never fired" in dead["note"] and dead["label"] == ""


def test_card_route_refusals_in_the_error_shape(tmp_path: Path) -> None:
    _, results = scenario_results(tmp_path, ["/api/saes/{id}/features/64", "/api/saes/{id}/features/-1",
                                             "/api/saes/{id}/features/abc", "/api/saes/{id}/features/1.5",
                                             "/api/saes/sae_000000000000/features/3",
                                             "/api/saes/{id}/features/" + "9" * 30])
    (s64, e64), (sneg, eneg), (sabc, eabc), (sfloat, _), (s404, e404), (shuge, ehuge) = results
    assert (s64, sneg, sabc, sfloat, s404, shuge) == (400, 400, 400, 400, 404, 400)
    assert "is outside" in ehuge["error"]["message"]
    for body in (e64, eneg, eabc, e404):
        assert set(body["error"]) == {"message", "type", "param", "code"}
    assert e64["error"]["code"] == "invalid_feature_index" and e64["error"]["param"] == "index"
    assert "Feature 64" in e64["error"]["message"] and "0-63" in e64["error"]["message"]
    assert "64 features" in e64["error"]["message"]
    assert '"abc" is not a feature index' in eabc["error"]["message"] and "0-63" in eabc["error"]["message"]
    assert e404["error"]["code"] == "sae_not_found"


def test_bundled_sae_card_and_the_openapi_document(tmp_path: Path) -> None:
    _, [(status, card), (_, doc)] = scenario_results(
        tmp_path, ["/api/saes/smollm2-135m-res-L10/features/1", "/openapi.json"])
    assert status == 200 and "indicate" in card["label"] and card["examples"] and card["promotes"]
    assert doc["paths"]["/api/saes/{sae_id}/features/{index}"]["get"]["parameters"][1]["name"] == "index"


def test_search_ranks_whole_words_then_measured_then_substrings(tmp_path: Path) -> None:
    _, [(status, body)] = scenario_results(tmp_path, ["/api/saes/{id}/features?q=rain"])
    assert status == 200 and [f["index"] for f in body["features"]] == [3, 5, 2, 6, 1, 4, 7]


def test_an_index_with_control_or_unicode_digits_is_refused_not_a_crash(tmp_path: Path) -> None:
    _, results = scenario_results(tmp_path, ["/api/saes/{id}/features/%1C5", "/api/saes/{id}/features/%1F5%20",
                                             "/api/saes/{id}/features/%C2%B2", "/api/saes/{id}/features/%20%203"])
    for status, body in results:
        assert status == 400 and body["error"]["code"] == "invalid_feature_index", body
        assert "is not a feature index" in body["error"]["message"]


@pytest.mark.parametrize("row,key", [
    ({"index": 9, "top_tokens": [["rain", "heavy"]]}, "top_tokens"),
    ({"index": 9, "top_tokens": "rain"}, "top_tokens"),
    ({"index": 9, "examples": [{"text": 3}]}, "examples"),
    ({"index": 9, "examples": {"text": "x"}}, "examples"),
    ({"index": 9, "frequency": "often"}, "frequency"),
    ({"index": 9, "promotes": [1, 2]}, "promotes"),
    ({"index": 9, "recommended_strength": [40]}, "recommended_strength"),
    ({"index": 9, "concept_rate": {"a": 1}}, "concept_rate"),
    ({"index": 9, "held_out": {"prompt_set": "neutral-v1", "strength": 40, "rate": "high"}}, "held_out"),
    ({"index": "9"}, "index"),
    ([9], "index"),
])
def test_a_malformed_features_row_is_a_400_naming_the_file_and_line(tmp_path: Path, row: Any, key: str) -> None:
    _, [(status, body), (list_status, _)] = scenario_results(
        tmp_path, ["/api/saes/{id}/features/3", "/api/saes/{id}/features?q=rain"], extra=[row])
    assert status == 400 and list_status == 400, body
    line = len(ROWS) + 2  # the usual rows, the measured one, then this
    message = body["error"]["message"]
    assert f"features.jsonl line {line}" in message and f"'{key}'" in message and body["error"]["param"] == "features"
