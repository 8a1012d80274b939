"""``millm chat --steer-concept WORD``: learns and calibrates a vector for WORD once, stores it, and reuses it the
second time; refused on llama.cpp, saying why. ``vectors calibrate`` stores each vector's held-out measure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


@pytest.fixture
def small(monkeypatch):
    """Few, short examples and prompts: the mechanics, not the figure."""
    import cli.vectors

    monkeypatch.setattr(cli.vectors, "CONCEPT_SIZES", cli.vectors.ConceptSizes(
        examples=4, tokens=12, prompts=2, held_out=2, calibration_tokens=8))


def test_steer_concept_learns_and_calibrates_once_then_reuses_the_set(engine, small):
    from cli.common import steering_service
    from millm.sae.cards import held_out_measures

    first = run("chat", "Tell me about your day.", "--steer-concept", "dog", "--temperature", "0",
                "--max-tokens", "8")
    assert "no vector set concept-dog yet: learning one" in first.output, first.output
    try:
        record = steering_service().store.sae("concept-dog")
        assert record is not None and record["format"] == "vectors"
        [held] = held_out_measures(record["path"]).values()  # calibrated: its held-out measure stored
        assert held.prompt_set == "neutral-v1" and (held.strength is None or held.answers == 2)
        if held.recommended:  # answered, at the strength it says it used
            assert first.exit_code == 0 and f"at its recommended strength {held.strength:g}" in first.output
        else:  # refused, saying there is none and the best held-out point
            assert first.exit_code == 1 and "has no recommended strength" in first.output
        second = run("chat", "Tell me about your day.", "--steer-concept", "dog", "--temperature", "0",
                     "--max-tokens", "8")
        assert "learned before" in second.output and "learning one" not in second.output
        assert second.exit_code == first.exit_code
        # a set stored but never calibrated (a calibration interrupted) is calibrated, not reused as it is
        cards = Path(record["path"]) / "features.jsonl"
        cards.write_text("")
        third = run("chat", "Tell me about your day.", "--steer-concept", "dog", "--temperature", "0",
                    "--max-tokens", "8")
        assert "learned before but never calibrated: calibrating it now" in third.output, third.output
        assert "learning one" not in third.output and third.exit_code == first.exit_code
        assert list(held_out_measures(record["path"]).values()) == [held]  # the same seeded measure, stored again
        listed = [r["id"] for r in json.loads(run("vectors", "list", "--json").output)]
        assert listed.count("concept-dog") == 1
    finally:
        run("vectors", "rm", "concept-dog")


def test_steer_concept_beside_steer_is_refused(small):
    result = run("chat", "hi", "--steer-concept", "dog", "--steer", "music=40")
    assert result.exit_code == 1 and "--steer-concept picks its own vector set" in result.output


def test_steer_concept_on_llama_cpp_is_refused_naming_why(gguf_engine, small, monkeypatch):
    from millm import local

    monkeypatch.setitem(local.ENGINES, gguf_engine.model_id, gguf_engine)
    result = run("chat", "hi", "--model", gguf_engine.model_id, "--steer-concept", "dog")
    assert result.exit_code == 1 and "cannot read activations and score" in result.output, result.output
    assert "concept-dog" not in [r["id"] for r in json.loads(run("vectors", "list", "--json").output)]
