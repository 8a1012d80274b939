"""``millm sae read`` with the bundled, labelled SAE smollm2-135m-res-L10, on the steerable scripted engine
(``fake_cli``): its tokens are characters, and a token's residual is a fixed random vector, encoded by the SAE
through the engine's own ``ReadoutRecorder``. Which features fire on real text is the engine's
(tests/engine/test_one_loop.py, tests/server/test_readout_text_labels.py)."""

import json

import pytest
from typer.testing import CliRunner

from cli.main import app

SAE = "smollm2-135m-res-L10"
LAYER = 10
TEXT = "It was raining in Paris."
PARIS = 1833  # labelled "paris, rome, ctrl"

runner = CliRunner()  # the millm command as installed: the command is reached through its group


def run(*args, ok=True):
    result = runner.invoke(app, ["sae", "read", *map(str, args)], env={"COLUMNS": "200"})
    if ok:
        assert result.exit_code == 0, result.output
    return result


@pytest.fixture
def untouched(fake_cli):
    """The SAE is attached for the read only: no attachment or reader is left behind."""
    attachments = dict(fake_cli.steering.attachments)
    readers = lambda: {s: (len(a.pre_readers), len(a.post_readers), len(a.unsteered_readers))  # noqa: E731
                       for s, a in fake_cli.steering.attachments.items()}
    before = readers()
    assert SAE not in attachments
    yield
    assert fake_cli.steering.attachments == attachments and readers() == before


def largest_first(position: dict) -> bool:
    values = [f["value"] for f in position["features"]]
    return values == sorted(values, reverse=True)


@pytest.fixture(scope="module")
def labels():
    from millm.sae.bundled import BUNDLED_DIR

    lines = (BUNDLED_DIR / SAE / "features.jsonl").read_text().splitlines()
    return {item["index"]: item["label"] for item in map(json.loads, lines)}


def test_json_tokens_join_to_the_text_with_labels(untouched, labels):
    data = json.loads(run(SAE, TEXT, "--json", "--top-k", "3").stdout)
    assert data["sae_id"] == SAE and data["layer"] == LAYER and data["read_point"] == "unsteered"
    assert "".join(p["token"] for p in data["positions"]) == TEXT
    feats = [f for p in data["positions"] for f in p["features"]]
    assert all(len(p["features"]) <= 3 for p in data["positions"])
    assert feats and all(f["label"] == labels.get(f["index"]) for f in feats)
    assert all(largest_first(p) and all(f["value"] > 0 for f in p["features"]) for p in data["positions"])


def test_table_has_a_row_per_token_and_the_labels(untouched, labels):
    data = json.loads(run(SAE, TEXT, "--json").stdout)
    table = run(SAE, TEXT).stdout
    rows = [line for line in table.splitlines() if line.startswith("│") and line.split("│")[1].strip()]
    assert [r.split("│")[2].strip() for r in rows] == [json.dumps(p["token"]) for p in data["positions"]]
    assert [int(r.split("│")[1]) for r in rows] == [p["position"] for p in data["positions"]]
    shown = {(f["index"], f["label"]) for p in data["positions"] for f in p["features"]}
    assert all(str(index) in table and (label is None or label in table) for index, label in shown)


def test_features_restrict_by_index_or_label(untouched):
    data = json.loads(run(SAE, TEXT, "--json", "--features", "paris, rome, ctrl", "--features", "5,7").stdout)
    assert all(sorted(f["index"] for f in p["features"]) == [5, 7, PARIS] for p in data["positions"])
    assert all(largest_first(p) for p in data["positions"])  # the others are kept, at 0 where they do not fire
    ambiguous = run(SAE, TEXT, "--features", "paris", ok=False)
    assert ambiguous.exit_code == 1 and "ambiguous" in ambiguous.output and str(PARIS) in ambiguous.output


def test_an_attached_sae_is_read_where_it_is_and_stays(fake_cli):
    from millm.sae.bundled import BUNDLED_DIR
    from millm.sae.formats import load_sae

    att = fake_cli.steering.attach(SAE, load_sae(BUNDLED_DIR / SAE).sae, LAYER)
    try:
        data = json.loads(run(SAE, TEXT, "--json").stdout)
        assert "".join(p["token"] for p in data["positions"]) == TEXT
        assert fake_cli.steering.attachments[SAE] is att and not att.unsteered_readers
        wrong = run(SAE, TEXT, "--layer", "3", ok=False)
        assert wrong.exit_code == 1 and "attached at layer 10" in wrong.output
    finally:
        fake_cli.steering.detach(SAE)


def test_a_registered_sae_by_name_with_its_labels(untouched, tmp_path):
    from cli.common import steering_service
    from tests.support.saes import random_sae, write_saelens

    folder = write_saelens(tmp_path / "read-l12", random_sae(576, 256, seed=21), layer=12)
    (folder / "labels.json").write_text(json.dumps({str(i): f"even {i}" for i in range(0, 256, 2)}))
    record = steering_service().register_sae(folder, "sae-read-test")
    data = json.loads(run("sae-read-test", TEXT, "--json", "--top-k", "8").stdout)
    assert data["sae_id"] == record["id"] and data["layer"] == 12
    feats = [f for p in data["positions"] for f in p["features"]]
    assert all(f["label"] == (f"even {f['index']}" if f["index"] % 2 == 0 else None) for f in feats)
    assert {f["index"] % 2 for f in feats} == {0, 1}  # labelled features and unlabelled ones (null) both shown


def test_refusals(untouched, fake_cli):
    missing = run("no-such-sae", TEXT, ok=False)
    assert missing.exit_code == 1 and "no-such-sae" in missing.output
    too_many = run(SAE, TEXT, "--top-k", "65", ok=False)
    assert too_many.exit_code == 1 and "SAE_ACTIVATIONS_MAX_TOP_K" in too_many.output
