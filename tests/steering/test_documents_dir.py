"""The example cluster and circuit in profiles/ import as they are, serve as they say, and refuse SAEs they do
not fit."""

import json
from pathlib import Path

import pytest

from millm.errors import InvalidFeatureIndex, InvalidParameter
from millm.steering.documents import Registered, ServingMode, parse_circuit, parse_cluster, serving_mode
from millm.steering.imports import import_document
from millm.steering.intensity import IntensitySettings, Symbol
from millm.store import Store

PROFILES = Path(__file__).parents[2] / "profiles"
CLUSTER = json.loads((PROFILES / "weather-cluster.json").read_text())
CIRCUIT = json.loads((PROFILES / "weather-circuit.json").read_text())
WIDTH = 4096  # the bundled smollm2-135m-res-L10 and -L20
BOTH = Registered({"sae_l10": WIDTH, "sae_l20": WIDTH}, {10: "sae_l10", 20: "sae_l20"})


def test_the_examples_are_a_cluster_and_a_two_layer_circuit_backed_by_it():
    assert CLUSTER["kind"] == "cluster" and CIRCUIT["kind"] == "circuit"
    assert sorted({m["layer"] for m in CIRCUIT["members"]}) == [10, 20]
    assert CIRCUIT["fallback_cluster"] == CLUSTER["name"]


def test_they_import_against_sae_at_their_layers():
    cluster = parse_cluster(CLUSTER, BOTH)
    assert cluster.declared == (0.5, 2.0)
    circuit = parse_circuit(CIRCUIT, BOTH)
    assert serving_mode(circuit, BOTH, {cluster.name}).mode is ServingMode.NATIVE
    only_l20 = Registered({"sae_l20": WIDTH}, {20: "sae_l20"})
    assert serving_mode(circuit, only_l20, {cluster.name}).mode is ServingMode.SLICE_FALLBACK
    assert serving_mode(circuit, only_l20, set()).mode is ServingMode.NONE


def test_they_refuse_sae_they_do_not_fit():
    with pytest.raises(InvalidParameter) as exc:
        parse_cluster(CLUSTER, Registered({"sae_l20": 1024}, {20: "sae_l20"}))
    assert exc.value.param == "/sae/d_sae"
    with pytest.raises(InvalidFeatureIndex) as exc:
        parse_circuit(CIRCUIT, Registered({"sae_l10": WIDTH, "sae_l20": 2000}, {10: "sae_l10", 20: "sae_l20"}))
    assert exc.value.param == "/members/1/feature"


def test_they_import_and_steer_with_the_bundled_saes_attached(engine, tmp_path):
    from millm.sae.bundled import bundled_saes
    from millm.sae.formats import load_sae
    from millm.steering.bases import Bases
    from millm.steering.controller import Steering
    from millm.steering.monitor import Monitor
    from millm.steering.target import SteeringTarget

    bundled = {b.layer: b for b in bundled_saes()}
    assert {10, 20} <= set(bundled)
    steering = Steering(engine.model)
    try:
        for layer, sid in ((10, "sae_l10"), (20, "sae_l20")):
            steering.attach(sid, load_sae(bundled[layer].path).sae, layer)
        store = Store(tmp_path / "millm.db")
        registered = Registered({a.sae_id: a.sae.d_sae for a in steering.attachments.values()},
                                {10: "sae_l10", 20: "sae_l20"})
        import_document(store, "cluster", CLUSTER, registered)
        import_document(store, "circuit", CIRCUIT, registered)
        bases = Bases(store, SteeringTarget(engine.model_id, steering, Monitor()), IntensitySettings(2.0, 0.5, 0.0))
        native = bases.request("weather-circuit", 1.2)
        assert native.rung == 0 and native.echo == "1.2"
        assert native.values == {"sae_l10": {1604: 24.0}, "sae_l20": {3497: 36.0, 1806: 30.0}}
        assert bases.request("weather-cluster", Symbol.MIN).echo == "0.5"
        steering.detach("sae_l10")
        fallback = bases.request("weather-circuit", 1.2)
        assert fallback.rung is None and fallback.values == {"sae_l20": {3497: 36.0, 1806: 30.0, 3448: 24.0}}
    finally:
        steering.detach_all()
