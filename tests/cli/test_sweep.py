"""``millm steer sweep`` on the bundled model with its bundled SAE smollm2-135m-res-L10 (short sweeps)."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from cli.main import app
from millm.sae.bundled import BUNDLED_DIR
from millm.sae.formats import load_sae

SAE = "smollm2-135m-res-L10"
LAYER = 10
MUSIC = 2375  # "music, melody"

runner = CliRunner()  # the millm command as installed: the command is reached through its group


def run(*args, ok=True):
    result = runner.invoke(app, ["steer", "sweep", *map(str, args)], env={"COLUMNS": "200"})
    if ok:
        assert result.exit_code == 0, result.output
    return result


def state(engine):
    steering = engine.steering
    hooks = [len(layer._forward_hooks) for layer in steering.layers]
    return (steering.snapshot(), hooks, steering._suppressed)


@pytest.fixture
def untouched(engine):
    """Nothing the sweep attached or set remains afterwards."""
    before = state(engine)
    yield
    assert state(engine) == before


def test_sweep_table_json_and_plot(engine, untouched, tmp_path):
    assert SAE not in engine.steering.attachments
    result = run("music", "--strengths", "0,40", "--prompts", 2, "--tokens", 8, "--json", "--out", tmp_path / "p.png")
    data = json.loads(result.stdout)
    assert data["sae"] == SAE and data["layer"] == LAYER and data["feature"] == MUSIC
    assert data["words"] == ["music", "melody"] and data["prompts"] == 2 and data["tokens"] == 8
    assert [p["strength"] for p in data["points"]] == [0.0, 40.0]
    zero = data["points"][0]
    assert zero["rate"] == data["unsteered_rate"] and zero["fluency"] == 0.0 and zero["inside"] is True
    assert set(data) >= {"recommended_strength", "unsteered_logprob"}
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert SAE not in engine.steering.attachments


def test_sweep_table_by_index(engine, untouched):
    result = run(MUSIC, "--strengths", "0,40", "--prompts", 2, "--tokens", 8, "--concept", "the")
    text = result.stdout
    assert f"feature {MUSIC} (music, melody)" in text and "recommended strength:" in text
    rows = [line for line in text.splitlines() if "│" in line and line.split("│")[0].strip() in {"0", "40"}]
    assert len(rows) == 2  # the text plot: a bar per strength
    assert "concept words: the" in text


def test_live_values_of_an_attached_sae_come_back(engine, untouched):
    steering = engine.steering
    steering.attach(SAE, load_sae(BUNDLED_DIR / SAE).sae, LAYER)
    try:
        steering.set_values(SAE, {5: 10.0}, merge=False)
        before = state(engine)
        data = json.loads(run("music", "--strengths", "30", "--prompts", 1, "--tokens", 4, "--json").stdout)
        assert data["sae"] == SAE and [p["strength"] for p in data["points"]] == [30.0]
        assert state(engine) == before and steering.attachments[SAE].values == {5: 10.0}
    finally:
        steering.detach(SAE)


def test_save_writes_the_recommended_strength_into_a_copy(engine, untouched, tmp_path):
    copy = tmp_path / "sae"
    shutil.copytree(BUNDLED_DIR / SAE, copy)
    # words nearly every answer has: the recommendation is then the one steered strength, well inside the bound
    result = run("music", "--sae", copy, "--strengths", "0,5", "--prompts", 2, "--tokens", 8, "--json", "--save",
                 *[f"--concept={w}" for w in ("the", "a", "i", "you", "to", "is", "and", "it")])
    assert json.loads(result.stdout)["recommended_strength"] == 5.0
    rows = {r["index"]: r for r in map(json.loads, (copy / "features.jsonl").read_text().splitlines())}
    assert rows[MUSIC]["recommended_strength"] == 5.0
    assert sum("recommended_strength" in r for r in rows.values()) == 1
    bundled = (BUNDLED_DIR / SAE / "features.jsonl").read_text()
    assert "recommended_strength" not in bundled  # the bundled SAE itself is left as it was
    run("music", "--sae", copy, "--strengths", "5", "--prompts", 1, "--tokens", 4, "--json")  # the folder again
    from cli.common import steering_service

    assert [r["path"] for r in steering_service().store.saes()].count(str(copy.resolve())) == 1  # registered once


def test_unknown_label_refused(engine, untouched):
    result = run("zzzzqq", "--strengths", "0,20", "--prompts", 1, "--tokens", 4, ok=False)
    assert result.exit_code == 1 and "matches no feature label" in result.output


def test_save_on_the_bundled_sae_is_refused_before_sweeping(engine, untouched):
    before = (BUNDLED_DIR / SAE / "features.jsonl").read_bytes()
    result = run("music", "--save", "--strengths", "0,20", "--prompts", 1, "--tokens", 4, ok=False)
    assert result.exit_code == 1 and "ships inside the package" in result.output
    assert (BUNDLED_DIR / SAE / "features.jsonl").read_bytes() == before
