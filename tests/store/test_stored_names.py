"""Stored documents whose names predate the name rule stay usable (as a profile's do), and an import
never deletes a cluster that a circuit serves through."""

from __future__ import annotations

import copy

import pytest

from millm.errors import ProfileConflict
from millm.names import name_problem
from millm.steering.documents import ServingMode
from millm.steering.imports import import_document, stored_cluster
from millm.steering.intensity import IntensitySettings
from millm.store import Store
from tests.support.documents import CIRCUIT, CLUSTER, REG

OLD = "weather: rain (v1)"  # a name the rule now refuses (':' and parentheses)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "millm.db")
    yield s
    s.close()


def stored_as_before(store: Store, kind: str, doc: dict, name: str) -> dict:
    """Write a document straight into the store under ``name``, as one stored before the rule was."""
    doc = {**copy.deepcopy(doc), "name": name}
    profile = {"name": name, "description": "", "model": doc["model"], "entries": []}
    assert store.import_document(kind, doc, profile, overwrite=False)  # type: ignore[arg-type]
    return doc


def test_a_cluster_stored_under_an_old_name_can_be_used(store, tmp_path):
    from millm.steering.service import SteeringService

    assert name_problem(OLD) is not None
    stored_as_before(store, "cluster", CLUSTER, OLD)
    found = stored_cluster(store, OLD)
    assert found is not None and found[0].name == OLD and found[1] == 1.0
    service = SteeringService(store, IntensitySettings(2.0, 0.5, 0.0))
    row = service.set_cluster_dial(None, OLD, 0.75)
    assert row["name"] == OLD and row["intensity"] == 0.75


def test_a_circuit_falling_back_to_an_old_named_cluster_serves_through_it(store):
    from millm.steering.bases import circuit_serving

    stored_as_before(store, "cluster", CLUSTER, OLD)
    stored_as_before(store, "circuit", {**CIRCUIT, "fallback_cluster": OLD}, "rain circuit (v1)")
    half = type(REG)(REG.widths, {3: "sae_a"})  # layer 10 has no SAE: the circuit needs its fallback
    serving = circuit_serving(store, "rain circuit (v1)", half)
    assert serving.mode is ServingMode.SLICE_FALLBACK, serving.reason


def test_new_documents_still_follow_the_rule(store):
    with pytest.raises(Exception, match="name"):
        import_document(store, "cluster", {**CLUSTER, "name": OLD}, REG)


def test_importing_a_circuit_over_a_fallback_cluster_is_refused(store):
    import_document(store, "cluster", CLUSTER, REG)
    import_document(store, "circuit", CIRCUIT, REG)  # falls back to the cluster "weather"
    before = (store.documents("cluster"), store.documents("circuit"), store.profiles())
    with pytest.raises(ProfileConflict) as info:
        import_document(store, "circuit", {**CIRCUIT, "name": "weather", "fallback_cluster": None}, REG,
                        overwrite=True)
    assert info.value.status == 409 and "rain-circuit" in info.value.message and info.value.param == "name"
    assert (store.documents("cluster"), store.documents("circuit"), store.profiles()) == before
    import_document(store, "cluster", {**CLUSTER, "description": "again"}, REG, overwrite=True)  # same kind: fine
    assert store.document("cluster", "weather")["document"]["description"] == "again"
    store.delete_document("circuit", "rain-circuit")
    import_document(store, "circuit", {**CIRCUIT, "name": "weather", "fallback_cluster": None}, REG, overwrite=True)
    assert store.backing("weather") == "circuit"
