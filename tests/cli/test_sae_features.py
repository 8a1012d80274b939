"""``millm sae features SAE INDEX`` (a feature's card) and ``--search`` ranking, through Typer's CliRunner."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.support.cards import ROWS, TABLE, measured
from tests.support.saes import random_sae, write_saelens

runner = CliRunner()


def run(*args: object, code: int = 0) -> str:
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert result.exit_code == code, result.output
    return result.output


@pytest.fixture
def sae(tmp_path: Path) -> Path:
    """A 64-feature SAE folder with labels and a features.jsonl (feature 6 measured to steer)."""
    folder = write_saelens(tmp_path / "sae", random_sae(16, 64, seed=2), layer=1)
    (folder / "labels.json").write_text(json.dumps({str(k): v for k, v in TABLE.items()}))
    rows = ROWS + [{"index": 6, "label": "terrain, maps", **measured(40.0)}]
    (folder / "features.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return folder


def test_card_shows_label_rates_examples_and_promoted_tokens(sae: Path) -> None:
    out = run("sae", "features", sae, 3)
    assert "#3" in out and "rain, wet" in out and "64 features" in out  # labels.json names it
    assert "fires on 1.250% of labelling tokens" in out and "max activation 17.5" in out
    assert "rain 40.5" in out and "storm 12" in out
    assert "then the rain fell" in out and "17.50" in out  # the « » marks become highlighting
    assert '" umbrella" "wet"' in out


def test_measured_feature_says_so(sae: Path) -> None:
    assert "measured to steer: recommended strength 40" in run("sae", "features", sae, 6)


def test_index_out_of_range_is_refused_naming_index_and_width(sae: Path) -> None:
    out = run("sae", "features", sae, 64, code=1)
    assert "Feature 64 is outside" in out and "0-63" in out and "64 features" in out
    assert "Traceback" not in out


def test_sae_without_features_jsonl_shows_its_label_and_what_is_missing(sae: Path) -> None:
    (sae / "features.jsonl").unlink()
    out = run("sae", "features", sae, 2)
    assert "heavy rain, storm" in out and "not recorded" in out and "fires on" not in out


def test_search_ranks_whole_words_then_measured_then_substrings(sae: Path) -> None:
    out = run("sae", "features", sae, "--search", "rain")
    listed = [int(n) for n in re.findall(r"^│ (\d+)\s", out, re.M)]
    assert listed == [3, 5, 2, 6, 1, 4, 7]
    assert re.search(r"^│ 6 .*│ 40 \(50% \[30%-69%\]\)", out, re.M), out  # with the held-out rate it rests on


def test_bundled_sae_card_by_id() -> None:
    out = run("sae", "features", "smollm2-135m-res-L10", 1)
    assert "indicate" in out and "max-activating examples" in out and "4096 features" in out
    assert "Feature 4096 is outside" in run("sae", "features", "smollm2-135m-res-L10", 4096, code=1)


def test_a_registered_name_names_the_sae_and_its_registered_labels_are_the_ones_searched(sae: Path) -> None:
    sae_id = run("sae", "add", sae, "--name", "terrain-test").split()[0]
    assert sae_id != "terrain-test"  # a display name: the id comes from the path
    assert "rain, wet" in run("sae", "features", "terrain-test", 3)
    (sae / "labels.json").write_text(json.dumps({"3": "changed on disk"}))  # after registration
    by_name = run("sae", "features", "terrain-test", "--search", "rain")
    by_id = run("sae", "features", sae_id, "--search", "rain")
    # the registry's labels, as the server and the TUI search them: both refs give one list
    assert by_name == by_id.replace(sae_id, "terrain-test")
    assert [int(n) for n in re.findall(r"^│ (\d+)\s", by_name, re.M)] == [3, 5, 2, 6, 1, 4, 7]


def test_a_name_two_saes_share_is_refused_listing_their_ids(sae: Path, tmp_path: Path) -> None:
    other = write_saelens(tmp_path / "other", random_sae(16, 64, seed=3), layer=1)
    first = run("sae", "add", sae, "--name", "twin").split()[0]
    second = run("sae", "add", other, "--name", "twin").split()[0]
    out = run("sae", "features", "twin", 3, code=1)
    assert "'twin' names 2 SAEs" in out and first in out and second in out
    assert "No SAE has id or name 'nobody'" in run("sae", "features", "nobody", 3, code=1)
