"""The SAEs shipped with the package: present, loadable, registered under stable ids, and they steer."""

from __future__ import annotations

import json

import pytest

from millm.store import Store
from tests.support.helpers import events, texts

IDS = ("smollm2-135m-res-L10", "smollm2-135m-res-L20")


def test_two_layers_ship_in_the_package_compactly() -> None:
    from millm.sae.bundled import BUNDLED_DIR, bundled_saes

    found = {b.id: b for b in bundled_saes()}
    assert tuple(found) == IDS
    assert [found[i].layer for i in IDS] == [10, 20]
    for b in found.values():
        assert b.path.parent == BUNDLED_DIR and b.model == "SmolLM2-135M-Instruct"
        weights = b.path / "sae_weights.safetensors"
        assert weights.stat().st_size < 12 * 2**20


def test_bundled_saes_load_as_topk_with_labels_for_live_features() -> None:
    from millm.sae.bundled import bundled_saes
    from millm.sae.formats import load_sae
    from millm.sae.labels import LabelIndex

    for b in bundled_saes():
        loaded = load_sae(b.path)
        assert (loaded.format, loaded.sae.architecture, loaded.sae.k, loaded.layer_hint) == ("saelens", "topk", 32,
                                                                                             b.layer)
        assert loaded.sae.d_in == 576
        labels = LabelIndex.load(b.path).labels
        features = [json.loads(line) for line in (b.path / "features.jsonl").read_text().splitlines()]
        assert len(labels) == len(features) >= 0.95 * loaded.sae.d_sae
        assert all(0 <= i < loaded.sae.d_sae and label for i, label in labels.items())


def test_registration_uses_stable_ids_once(tmp_path) -> None:
    from millm.sae.bundled import register_bundled

    store = Store(tmp_path / "millm.db")
    assert register_bundled(store) == list(IDS)
    assert register_bundled(store) == []
    record = store.sae(IDS[0])
    assert record is not None and record["layer_hint"] == 10 and record["d_in"] == 576
    assert record["model_hint"] == "SmolLM2-135M-Instruct"
    assert store.labels(IDS[0], limit=5)
    store.close()


@pytest.mark.slow
def test_a_strong_labelled_feature_changes_greedy_output_and_clearing_restores_it(engine) -> None:
    from millm.sae.bundled import bundled_saes
    from millm.sae.formats import load_sae
    from millm.sae.labels import LabelIndex

    bundled = bundled_saes()[0]
    index = LabelIndex.load(bundled.path, bundled.id)
    feature = index.resolve("music")
    steering = engine.steering_target().steering
    prompt = "Tell me about your day."
    before = texts(events(engine, prompt, temperature=0, max_tokens=24))[0]
    steering.attach(bundled.id, load_sae(bundled.path).sae, bundled.layer)
    try:
        steering.set_values(bundled.id, {feature: 80.0}, merge=False)
        steered = texts(events(engine, prompt, temperature=0, max_tokens=24))[0]
        steering.clear()
        after = texts(events(engine, prompt, temperature=0, max_tokens=24))[0]
    finally:
        steering.detach(bundled.id)
    assert steered != before
    assert after == before
