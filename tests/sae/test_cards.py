"""Feature cards (``millm.sae.cards``) and search ranking (``millm.sae.labels.rank``) on hand-built files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from millm.errors import InvalidFeatureIndex
from millm.sae.cards import FeatureCard, example_parts, measured_features, parse_index, read_card
from tests.support.cards import ROWS, TABLE, measured


def write_sae(folder: Path, rows: list[dict] | None = ROWS, labels: dict[int, str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if rows is not None:
        (folder / "features.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    if labels is not None:
        (folder / "labels.json").write_text(json.dumps({str(k): v for k, v in labels.items()}))
    return folder


def test_card_reads_everything_features_jsonl_records(tmp_path: Path) -> None:
    card = read_card(write_sae(tmp_path / "sae"), 3, 64, name="test-sae")
    assert (card.sae, card.index, card.d_sae, card.label, card.recorded) == ("test-sae", 3, 64, "rain, storm, weather",
                                                                              True)
    assert (card.frequency, card.max_activation) == (0.0125, 17.5)
    assert card.top_tokens == [("rain", 40.5), ("storm", 12.0)]
    assert card.examples[0].parts == ("then the", " rain", " fell") and card.examples[0].activation == 17.5
    assert card.promotes == [" umbrella", "wet"]
    assert not card.measured and card.recommended_strength is None and card.note == ""
    measured = read_card(tmp_path / "sae", 8, 64, name="test-sae")
    assert measured.measured and measured.recommended_strength == 60.0


def test_card_json_round_trips(tmp_path: Path) -> None:
    card = read_card(write_sae(tmp_path / "sae"), 3, 64, name="test-sae")
    body = json.loads(json.dumps(card.to_json()))
    assert body["examples"][0] == {"text": "then the« rain» fell", "activation": 17.5}
    assert body["top_tokens"][0] == {"token": "rain", "weight": 40.5} and body["note"] is None
    assert FeatureCard.from_json(body) == card


def test_registered_labels_name_the_feature_before_the_row(tmp_path: Path) -> None:
    folder = write_sae(tmp_path / "sae", labels={3: "from labels.json"})
    assert read_card(folder, 3, 64, name="s").label == "from labels.json"
    assert read_card(folder, 3, 64, name="s", labels={3: "registered"}).label == "registered"
    assert read_card(folder, 3, 64, name="s", labels={}).label == "rain, storm, weather"


def test_index_out_of_range_names_the_index_and_the_width(tmp_path: Path) -> None:
    folder = write_sae(tmp_path / "sae")
    for index in (64, -1, 10_000):
        with pytest.raises(InvalidFeatureIndex) as exc:
            read_card(folder, index, 64, name="test-sae")
        assert f"Feature {index}" in exc.value.message and "0-63" in exc.value.message
        assert "64 features" in exc.value.message and exc.value.param == "index" and exc.value.status == 400


def test_parse_index_refuses_what_is_not_an_integer() -> None:
    assert parse_index("12", 64, "s") == 12 and parse_index("+5", 64, "s") == 5
    for text in ("abc", "1.5", "1_0", "", "²", "0x10"):
        with pytest.raises(InvalidFeatureIndex, match="is not a feature index; s has features 0-63"):
            parse_index(text, 64, "s")
    for text in ("-3", "64", "9" * 30, "9" * 5000):  # checked before anything (SQLite's integers included) sees it
        with pytest.raises(InvalidFeatureIndex, match="is outside s's 0-63"):
            parse_index(text, 64, "s")
    with pytest.raises(InvalidFeatureIndex) as exc:
        parse_index("x" * 5000, 64, "s")
    assert len(exc.value.message) < 120


def test_an_sae_without_features_jsonl_shows_its_label_and_says_the_rest_is_not_recorded(tmp_path: Path) -> None:
    folder = write_sae(tmp_path / "bare", rows=None, labels={5: "cats"})
    card = read_card(folder, 5, 16, name="bare")
    assert (card.label, card.recorded, card.frequency, card.examples, card.promotes) == ("cats", False, None, [], [])
    assert "no features.jsonl" in card.note and "not recorded" in card.note
    assert read_card(folder, 6, 16, name="bare").label == ""


def test_a_feature_without_a_row_never_fired(tmp_path: Path) -> None:
    card = read_card(write_sae(tmp_path / "sae"), 5, 64, name="test-sae")
    assert not card.recorded and "never fired" in card.note


def test_example_parts() -> None:
    assert example_parts("a« b» c") == ("a", " b", " c")
    assert example_parts("«x»") == ("", "x", "")
    assert example_parts("no marks") == ("no marks", "", "")
    assert example_parts("open« only") == ("open« only", "", "")


def test_rows_are_reread_when_the_file_changes(tmp_path: Path) -> None:
    folder = write_sae(tmp_path / "sae")
    assert measured_features(folder) == {8: 0.5}  # recommended, with its held-out rate
    unmeasured = {k: v for k, v in ROWS[1].items() if k not in ("recommended_strength", "held_out")}
    write_sae(folder, rows=[{**ROWS[0], **measured(30.0, 0.75)}, unmeasured])
    assert measured_features(folder) == {3: 0.75}
    # an older single-set strength, or a held-out measure that recommends nothing, is not recommended
    write_sae(folder, rows=[{**ROWS[0], "recommended_strength": 30.0, "concept_rate": 0.75},
                            {**unmeasured, **measured(40.0, 0.2, recommended=False)}])
    assert measured_features(folder) == {}
    assert read_card(folder, 3, 64, name="t").recommended_strength is None
    card = read_card(folder, 8, 64, name="t")
    assert card.measured and card.recommended_strength is None and card.concept_rate == 0.2


# ranking: whole-word matches, then features measured to steer, then other substring matches

def test_rank_puts_whole_words_first_then_measured_then_other_substrings() -> None:
    from millm.sae.labels import rank

    assert [m.index for m in rank(TABLE, "rain")] == [3, 5, 2, 1, 4, 6, 7]
    # measured 6 and 2: 2 leads the whole-word matches, 6 leads the substring ones
    assert [m.index for m in rank(TABLE, "rain", measured={6: 0.5, 2: 0.5})] == [2, 3, 5, 6, 1, 4, 7]
    assert [m.index for m in rank(TABLE, "RAIN ", measured={6: 0.5})][:4] == [3, 5, 2, 6]


def test_rank_puts_the_higher_measured_concept_rate_first() -> None:
    from millm.sae.labels import rank

    assert [m.index for m in rank(TABLE, "rain", measured={5: 0.9, 2: 0.4, 3: 0.0})][:4] == [5, 2, 3, 1]
    assert [m.index for m in rank(TABLE, "rain", measured={5: 0.4, 2: 0.9})][:3] == [2, 5, 3]


def test_rank_puts_a_term_starting_with_the_word_before_one_that_only_contains_it() -> None:
    from millm.sae.labels import rank

    table = {1: "transporting, drag", 2: "root, div, sporting", 3: "sport"}
    assert [m.index for m in rank(table, "sport")] == [3, 2, 1]


def test_rank_matches_case_insensitively_and_only_substrings() -> None:
    from millm.sae.labels import rank

    assert [m.index for m in rank(TABLE, "Storm")] == [2]
    assert [m.index for m in rank(TABLE, "heavy rain")] == [2]
    assert rank(TABLE, "volcano") == [] and rank(TABLE, "  ") == []


def test_label_index_searches_with_the_ranking_and_loads_measured_features(tmp_path: Path) -> None:
    from millm.sae.labels import LabelIndex

    folder = write_sae(tmp_path / "sae", rows=[{"index": 6, "label": "terrain, maps", **measured(40.0)}],
                       labels=TABLE)
    index = LabelIndex.load(folder, "test-sae")
    assert index.measured == {6: 0.5} and index.held[6].strength == 40.0
    assert [r["index"] for r in index.rows("rain", limit=4)] == [3, 5, 2, 6]
    assert [m.index for m in LabelIndex(TABLE).search("rain")] == [3, 5, 2, 1, 4, 6, 7]


def test_rendered_card_highlights_the_firing_token(tmp_path: Path) -> None:
    from millm.render.card import FIRING, card_text

    text = card_text(read_card(write_sae(tmp_path / "sae"), 3, 64, name="test-sae"))
    assert "«" not in text.plain and "then the rain fell" in text.plain
    firing = [text.plain[s.start:s.end] for s in text.spans if s.style == FIRING]
    assert firing == [" rain"]
    bare = card_text(read_card(write_sae(tmp_path / "bare", rows=None, labels={3: "[bold]x"}), 3, 64, name="b"))
    assert "[bold]x" in bare.plain and "not recorded" in bare.plain  # labels are text, never markup
