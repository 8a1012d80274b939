"""Learning a steering vector on the bundled model through ``millm vectors`` (few, short examples: the
mechanics, not the figure), then steering and reading with it as with an SAE feature, in the CLI and over
HTTP."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
NAME = "dogvec"


def run(*args: object, ok: bool = True):
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    if ok:
        assert result.exit_code == 0, result.output
    return result


def test_learn_steer_read_and_remove_a_vector(engine, server):
    learned = run("vectors", "learn", NAME, "--concept", "dog", "--examples", "6", "--tokens", "16", "--layer", "10",
                  "--no-calibrate")  # calibrating: tests/vectors/test_steer_concept.py
    # of the 6 answers about dogs, those that name a dog; of the 6 on other topics, those that do not
    kept = re.search(rf"vector set {NAME}: diffmean at layer 10 from (\d) \+ (\d) examples", learned.output)
    assert kept is not None, learned.output
    positive, negative = int(kept[1]), int(kept[2])
    assert 1 <= positive <= 6 and 1 <= negative <= 6
    [listed] = json.loads(run("vectors", "list", "--json").output)
    assert listed["id"] == NAME and listed["names"] == [NAME] and listed["layer"] == 10
    assert listed["examples"] == {"positive": positive, "negative": negative}
    assert listed["source"]["concepts"] == ["dog"]
    assert listed["source"]["negatives"] == "topics"
    assert "norm 1.000" in run("vectors", "show", NAME).output

    plain = run("chat", "Tell me about your day.", "--temperature", "0", "--max-tokens", "12").stdout
    steered = run("chat", "Tell me about your day.", "--temperature", "0", "--max-tokens", "12", "--sae", NAME,
                  "--steer", f"{NAME}=60").stdout
    assert steered != plain  # steered by name, as a feature label is

    again = run("vectors", "learn", NAME, "--concept", "cat", ok=False)  # taken: refused before any work
    assert again.exit_code == 1 and "already the id" in again.output

    assert httpx.post(server + f"/api/saes/{NAME}/attach", json={}, timeout=30).status_code == 200
    try:
        r = httpx.post(server + "/v1/chat/completions", timeout=120, json={
            "model": "SmolLM2-135M-Instruct", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "I walked my dog."}],
            "return_sae_activations": {"sae_id": NAME, "features": [0], "positions": "prompt", "labels": True,
                                       "token_text": True}})
        assert r.status_code == 200, r.text
        positions = r.json()["millm"]["sae_activations"]["positions"]
        assert {f["label"] for p in positions for f in p["features"]} == {NAME}
        value = {p["token"]: p["features"][0]["value"] for p in positions}
        assert value[" dog"] > value[" walked"]  # the projection reads the concept where it is
    finally:
        httpx.post(server + f"/api/saes/{NAME}/detach", timeout=30)
    run("vectors", "rm", NAME)
    assert json.loads(run("vectors", "list", "--json").output) == []


def test_bad_options_are_refused_before_any_example_is_written(engine, monkeypatch):
    import millm.vectors.learn as learn

    monkeypatch.setattr(learn, "sample_answers", lambda *a, **k: pytest.fail("examples were written"))
    for args, named in ((["--method", "lda"], "'method'"), (["--position", "first"], "'position'"),
                        (["--layer", "99"], "'layer' must be between 0 and 29"),
                        (["--layer", "12-10"], "runs backwards"), (["--negatives", "others"], "'negatives'"),
                        (["--positive", "/nonexistent.txt", "--negative", "/nonexistent.txt"], "/nonexistent.txt")):
        result = run("vectors", "learn", "badvec", *(["--concept", "dog"] if "--positive" not in args else []),
                     *args, ok=False)
        assert result.exit_code == 1 and named in result.output and "Traceback" not in result.output
    assert json.loads(run("vectors", "list", "--json").output) == []  # nothing stored


def test_a_range_of_layers_learns_one_set_per_layer_from_files(engine, tmp_path):
    positive, negative = tmp_path / "pos.txt", tmp_path / "neg.jsonl"
    positive.write_text("It rained all day.\nThe rain fell on the roof.\n")
    negative.write_text("\n".join(json.dumps({"messages": [{"role": "assistant", "content": t}]})
                                  for t in ("The sun was out.", "We went to the market.")))
    try:
        learned = run("vectors", "learn", "wet", "--positive", positive, "--negative", negative, "--layer", "8-9",
                      "--layer", "12")
        assert [line.split(":")[0] for line in learned.output.splitlines()] == [
            "vector set wet-L8", "vector set wet-L9", "vector set wet-L12", "not calibrated"]
        assert "wet-L8, wet-L9, wet-L12 learned from files name no concept" in learned.output
        rows = {r["id"]: r for r in json.loads(run("vectors", "list", "--json").output)}
        assert {name: r["layer"] for name, r in rows.items()} == {"wet-L8": 8, "wet-L9": 9, "wet-L12": 12}
        # a name any of the sets would take is refused before anything is stored
        again = run("vectors", "learn", "wet", "--positive", positive, "--negative", negative, "--layer", "11-12",
                    ok=False)
        assert again.exit_code == 1 and "'wet-L12' is already the id" in again.output
        assert "wet-L11" not in {r["id"] for r in json.loads(run("vectors", "list", "--json").output)}
    finally:
        for name in ("wet-L8", "wet-L9", "wet-L12"):
            run("vectors", "rm", name, ok=False)
