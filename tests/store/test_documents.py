"""Imported clusters and circuits in the store: each backs a profile, and an import lands whole or not at all."""

from __future__ import annotations

import copy

import pytest

from millm.errors import InvalidFeatureIndex, InvalidParameter, ProfileConflict
from millm.steering.documents import Registered
from millm.steering.imports import import_document, stored_cluster
from millm.store import Store
from tests.support.documents import CIRCUIT, CLUSTER, REG


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "millm.db")
    yield s
    s.close()


def snapshot(store: Store) -> tuple:
    """Everything the import paths write."""
    return (store.profiles(), store.documents("cluster"), store.documents("circuit"), store.active_circuit())


def dial(store: Store, name: str) -> float:
    row = store.document("cluster", name)
    assert row is not None
    return float(row["intensity"])


def test_importing_a_cluster_creates_its_profile(store):
    import_document(store, "cluster", CLUSTER, REG)
    row = store.document("cluster", "weather")
    assert row is not None and row["document"]["members"][0] == {"feature": 1, "strength": 10.0, "label": "f1"}
    assert row["intensity"] == 1.0
    profile = store.profile("weather")
    assert profile is not None and profile["entries"][0] == {"sae": "sae_a", "feature": 1, "strength": 10.0}
    assert store.backing("weather") == "cluster"
    assert [r["name"] for r in store.documents("cluster")] == ["weather"]
    stored = stored_cluster(store, "weather")
    assert stored is not None
    doc, dial = stored
    assert (doc.declared, dial) == ((0.5, 1.5), 1.0)
    assert stored_cluster(store, "nope") is None


def test_importing_a_circuit_creates_its_profile(store):
    import_document(store, "circuit", CIRCUIT, REG)
    assert store.backing("rain-circuit") == "circuit"
    assert [e["sae"] for e in store.profile("rain-circuit")["entries"]] == ["sae_a", 3, 10]
    assert "intensity" not in store.document("circuit", "rain-circuit")


@pytest.mark.parametrize("kind,doc,where", [
    ("cluster", {**CLUSTER, "members": [*CLUSTER["members"], {"feature": 9000, "strength": 1.0}]},
     "/members/4/feature"),
    ("cluster", {**CLUSTER, "intensity_range": [1.5, 0.5]}, "/intensity_range"),
    ("circuit", {**CIRCUIT, "evidence": {"rung": 5}}, "/evidence/rung"),
    ("circuit", CLUSTER, "/kind"),
])
def test_a_failing_document_leaves_nothing(store, kind, doc, where):
    import_document(store, "cluster", {**CLUSTER, "name": "other"}, REG)
    before = snapshot(store)
    with pytest.raises((InvalidParameter, InvalidFeatureIndex)) as exc:
        import_document(store, kind, doc, REG)
    assert exc.value.param == where
    assert snapshot(store) == before


def test_a_failing_write_rolls_back_the_whole_import(store):
    import_document(store, "cluster", CLUSTER, REG)
    before = snapshot(store)
    # the old cluster and its profile are dropped first in the transaction; the failing write must bring them back
    with pytest.raises(TypeError):
        store.import_document("cluster", copy.deepcopy(CLUSTER),
                              {"name": "weather", "entries": [object()]}, overwrite=True)
    assert snapshot(store) == before
    # a new name: the profile is written before the document, which fails; no profile is left behind
    with pytest.raises(TypeError):
        store.import_document("cluster", {**CLUSTER, "name": "fresh", "bad": object()},
                              {"name": "fresh", "entries": []}, overwrite=False)
    assert snapshot(store) == before and store.profile("fresh") is None


def test_a_taken_name_is_409_unless_overwritten(store):
    store.save_profile({"name": "weather", "description": "plain", "model": None, "entries": []}, overwrite=False)
    before = snapshot(store)
    with pytest.raises(ProfileConflict) as exc:
        import_document(store, "cluster", CLUSTER, REG)
    assert exc.value.status == 409 and snapshot(store) == before
    import_document(store, "cluster", CLUSTER, REG, overwrite=True)
    assert store.profile("weather")["description"] == "rain words" and store.backing("weather") == "cluster"
    # a circuit of the same name replaces the cluster only when asked to
    renamed = {**CIRCUIT, "name": "weather", "fallback_cluster": None}
    with pytest.raises(ProfileConflict):
        import_document(store, "circuit", renamed, REG)
    assert store.backing("weather") == "cluster"
    import_document(store, "circuit", renamed, REG, overwrite=True)
    assert store.backing("weather") == "circuit" and store.document("cluster", "weather") is None


def test_the_cluster_dial_persists(store, tmp_path):
    import_document(store, "cluster", CLUSTER, REG)
    assert store.set_cluster_intensity("weather", 0.25)
    assert not store.set_cluster_intensity("nope", 0.25)
    reopened = Store(tmp_path / "millm.db")
    assert dial(reopened, "weather") == 0.25
    reopened.close()
    import_document(store, "cluster", CLUSTER, REG, overwrite=True)  # a re-import starts from the default dial
    assert dial(store, "weather") == 1.0


def test_the_active_circuit(store):
    import_document(store, "circuit", CIRCUIT, REG)
    assert store.active_circuit() is None
    assert not store.set_active_circuit("nope") and store.active_circuit() is None
    assert store.set_active_circuit("rain-circuit") and store.active_circuit() == "rain-circuit"
    assert store.set_active_circuit(None) and store.active_circuit() is None
    store.set_active_circuit("rain-circuit")
    assert store.delete_document("circuit", "rain-circuit")
    assert store.active_circuit() is None and store.profile("rain-circuit") is None


def test_deleting_removes_the_document_and_its_profile(store):
    import_document(store, "cluster", CLUSTER, REG)
    import_document(store, "circuit", CIRCUIT, REG)
    store.set_active_circuit("rain-circuit")
    assert not store.delete_document("circuit", "weather")  # wrong kind: nothing happens
    assert store.backing("weather") == "cluster"
    assert store.delete_document("cluster", "weather")
    assert store.profile("weather") is None and store.backing("weather") is None
    assert not store.delete_document("cluster", "weather")
    assert store.active_circuit() == "rain-circuit"  # deleting a circuit's fallback cluster leaves the circuit be


def test_import_checks_against_what_is_registered(store):
    narrow = Registered(widths={"sae_a": 2}, attached={3: "sae_a"})
    with pytest.raises(InvalidParameter) as exc:
        import_document(store, "cluster", CLUSTER, narrow)
    assert exc.value.param == "/sae/d_sae" and store.profiles() == []
