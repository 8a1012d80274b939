"""The example documents in profiles/ import as they are, and refuse an SAE they do not fit."""

import json
from pathlib import Path

import pytest

from millm.errors import InvalidFeatureIndex, InvalidParameter
from tests.support.saes import random_sae

EXAMPLES = [p for p in sorted((Path(__file__).parents[2] / "profiles").glob("*.json"))
            if "kind" not in json.loads(p.read_text())]  # cluster and circuit documents: test_documents_dir.py


def test_there_are_examples():
    assert EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_resolves_against_an_attached_sae(path, engine):
    from millm.steering.controller import Steering
    from millm.steering.profiles import parse_profile, resolve_entries

    doc = parse_profile(json.loads(path.read_text()))
    steering = Steering(engine.model)
    layers = {e.sae for e in doc.entries}
    try:
        for layer in layers:
            steering.attach(f"sae_l{layer}", random_sae(576, 4096, seed=layer), layer)  # the bundled SAEs' width
        values = resolve_entries(doc, steering, engine.model_id)
        assert sum(len(v) for v in values.values()) == len(doc.entries)
        steering.detach_all()
        for layer in layers:
            steering.attach(f"sae_l{layer}", random_sae(576, 4, seed=layer), layer)
        with pytest.raises(InvalidFeatureIndex, match="outside"):
            resolve_entries(doc, steering, engine.model_id)
        with pytest.raises(InvalidParameter, match="made for model"):
            resolve_entries(doc, steering, "another-model")
    finally:
        steering.detach_all()
