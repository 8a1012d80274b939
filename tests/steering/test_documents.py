"""Cluster and circuit documents: refusals name the JSON pointer of the bad field; serving-mode decisions."""

from __future__ import annotations

import copy
import json

import pytest

from millm.errors import InvalidFeatureIndex, InvalidParameter
from millm.names import check_name
from millm.steering.documents import (
    CircuitDoc,
    ClusterDoc,
    Registered,
    ServingMode,
    parse_circuit,
    parse_cluster,
    parse_document,
    pointer,
    profile_for,
    serving_mode,
    stored_form,
    stored_serving_mode,
)
from tests.support.documents import CIRCUIT, CLUSTER, REG


def edited(doc: dict, edit) -> dict:
    out = copy.deepcopy(doc)
    edit(out)
    return out


def test_a_good_cluster_and_its_profile():
    cluster = parse_cluster(CLUSTER, REG)
    assert (cluster.name, cluster.declared, cluster.sae.id) == ("weather", (0.5, 1.5), "sae_a")
    assert profile_for(cluster) == {"name": "weather", "description": "rain words", "model": "SmolLM2-135M-Instruct",
                                    "entries": [{"sae": "sae_a", "feature": f, "strength": 10.0 * f}
                                                for f in (1, 2, 3, 4)]}
    again = parse_cluster(json.loads(json.dumps(stored_form(cluster))), REG)
    assert again == cluster and stored_form(cluster)["kind"] == "cluster"


def test_a_cluster_without_an_id_names_its_sae_by_layer():
    doc = edited(CLUSTER, lambda d: d.update(sae={"layer": 3, "d_sae": 512, "hint": "smollm2 res L3"}))
    assert {e["sae"] for e in profile_for(parse_cluster(doc, REG))["entries"]} == {3}
    # nothing attached at that layer: the width the document declares is the one checked
    far = edited(doc, lambda d: d["sae"].update(layer=20))
    assert parse_cluster(far, REG).sae.layer == 20


def test_a_good_circuit_and_its_profile():
    circuit = parse_circuit(CIRCUIT, REG)
    assert (circuit.evidence.rung, circuit.fallback_cluster, circuit.declared) == (2, "weather", (0.5, 1.5))
    assert stored_form(circuit)["evidence"] == {"rung": 2, "method": "activation patching"}
    assert [e["sae"] for e in profile_for(circuit)["entries"]] == ["sae_a", 3, 10]


def test_a_circuit_member_on_a_layer_with_no_sae_cannot_be_checked_yet():
    doc = edited(CIRCUIT, lambda d: d["members"].append({"layer": 7, "feature": 99999, "strength": 1.0}))
    assert parse_circuit(doc, REG).members[-1].layer == 7


CLUSTER_REFUSALS = [
    (lambda d: d["members"][3].update(feature=600), "/members/3/feature", "invalid_feature_index"),
    (lambda d: d["members"][3].update(feature=512), "/members/3/feature", "invalid_feature_index"),
    (lambda d: d["members"][1].update(feature="3"), "/members/1/feature", "invalid_parameter"),
    (lambda d: d["members"][1].update(feature=-1), "/members/1/feature", "invalid_parameter"),
    (lambda d: d["members"][1].update(feature=2.0), "/members/1/feature", "invalid_parameter"),
    (lambda d: d["members"][2].update(feature=1), "/members/2/feature", "invalid_parameter"),
    (lambda d: d["members"][0].update(strength=True), "/members/0/strength", "invalid_parameter"),
    (lambda d: d["members"][0].update(strength="40"), "/members/0/strength", "invalid_parameter"),
    (lambda d: d["members"][0].update(strength=float("nan")), "/members/0/strength", "invalid_parameter"),
    (lambda d: d["members"][0].pop("strength"), "/members/0/strength", "invalid_parameter"),
    (lambda d: d.update(members=[]), "/members", "invalid_parameter"),
    (lambda d: d.pop("members"), "/members", "invalid_parameter"),
    (lambda d: d.update(intensity_range=[0.5, 2.5]), "/intensity_range/1", "invalid_parameter"),
    (lambda d: d.update(intensity_range=[-0.1, 1.0]), "/intensity_range/0", "invalid_parameter"),
    (lambda d: d.update(intensity_range=[1.5, 0.5]), "/intensity_range", "invalid_parameter"),
    (lambda d: d.update(intensity_range=[0.5]), "/intensity_range", "invalid_parameter"),
    (lambda d: d.update(intensity_range=[0.5, 1.0, 1.5]), "/intensity_range", "invalid_parameter"),
    (lambda d: d.update(intensity_range="wide"), "/intensity_range", "invalid_parameter"),
    (lambda d: d.update(name="bad/name"), "/name", "invalid_parameter"),
    (lambda d: d.update(name=""), "/name", "invalid_parameter"),
    (lambda d: d.update(name="x" * 65), "/name", "invalid_parameter"),
    (lambda d: d.update(name=7), "/name", "invalid_parameter"),
    (lambda d: d.pop("model"), "/model", "invalid_parameter"),
    (lambda d: d.update(kind="circuit"), "/kind", "invalid_parameter"),
    (lambda d: d.pop("kind"), "/kind", "invalid_parameter"),
    (lambda d: d["sae"].update(id="sae_unregistered"), "/sae/id", "invalid_parameter"),
    (lambda d: d["sae"].update(d_sae=1024), "/sae/d_sae", "invalid_parameter"),
    (lambda d: d.update(sae={"layer": 10, "d_sae": 512}), "/sae/d_sae", "invalid_parameter"),  # sae_b is 256 wide
    (lambda d: d["sae"].pop("layer"), "/sae/layer", "invalid_parameter"),
    (lambda d: d["sae"].update(layer=True), "/sae/layer", "invalid_parameter"),
]


@pytest.mark.parametrize("edit,where,code", CLUSTER_REFUSALS)
def test_cluster_refusals_name_the_pointer(edit, where, code):
    with pytest.raises((InvalidParameter, InvalidFeatureIndex)) as exc:
        parse_cluster(edited(CLUSTER, edit), REG)
    assert (exc.value.status, exc.value.param, exc.value.code) == (400, where, code)
    assert f"at {where}:" in exc.value.message


CIRCUIT_REFUSALS = [
    (lambda d: d["evidence"].update(rung=4), "/evidence/rung", "invalid_parameter"),
    (lambda d: d["evidence"].update(rung=-1), "/evidence/rung", "invalid_parameter"),
    (lambda d: d["evidence"].update(rung="2"), "/evidence/rung", "invalid_parameter"),
    (lambda d: d["evidence"].pop("rung"), "/evidence/rung", "invalid_parameter"),
    (lambda d: d.pop("evidence"), "/evidence", "invalid_parameter"),
    (lambda d: d["members"][1].update(sae="sae_unregistered"), "/members/1/sae", "invalid_parameter"),
    (lambda d: d["members"][1].update(sae="sae_c"), "/members/1/sae", "invalid_parameter"),  # layer 3 is sae_a's
    (lambda d: d["members"][0].update(feature=512), "/members/0/feature", "invalid_feature_index"),
    (lambda d: d["members"][2].update(feature=256), "/members/2/feature", "invalid_feature_index"),
    (lambda d: d["members"].append({"layer": 7, "sae": "sae_c", "feature": 64, "strength": 1.0}),
     "/members/3/feature", "invalid_feature_index"),
    (lambda d: d["members"][1].update(feature=5), "/members/1/feature", "invalid_parameter"),
    (lambda d: d["members"][2].update(layer=-1), "/members/2/layer", "invalid_parameter"),
    (lambda d: d["members"][2].pop("layer"), "/members/2/layer", "invalid_parameter"),
    (lambda d: d.update(members=[]), "/members", "invalid_parameter"),
    (lambda d: d.update(fallback_cluster="../etc"), "/fallback_cluster", "invalid_parameter"),
    (lambda d: d.update(intensity_range=[1.0, 2.01]), "/intensity_range/1", "invalid_parameter"),
    (lambda d: d.update(kind="cluster"), "/kind", "invalid_parameter"),
]


@pytest.mark.parametrize("edit,where,code", CIRCUIT_REFUSALS)
def test_circuit_refusals_name_the_pointer(edit, where, code):
    with pytest.raises((InvalidParameter, InvalidFeatureIndex)) as exc:
        parse_circuit(edited(CIRCUIT, edit), REG)
    assert (exc.value.status, exc.value.param, exc.value.code) == (400, where, code)
    assert f"at {where}:" in exc.value.message


def test_documents_by_kind():
    assert isinstance(parse_document(CLUSTER, REG), ClusterDoc)
    assert isinstance(parse_document(CIRCUIT, REG), CircuitDoc)
    for doc in (edited(CLUSTER, lambda d: d.update(kind="profile")), ["not", "an", "object"]):
        with pytest.raises(InvalidParameter) as exc:
            parse_document(doc, REG)
        assert exc.value.param == "/kind"
    with pytest.raises(InvalidParameter) as exc:
        parse_cluster(["not", "an", "object"], REG)
    assert exc.value.param == "/"


def test_pointer_escapes_per_rfc6901():
    assert pointer(("members", 3, "feature")) == "/members/3/feature"
    assert pointer(("a/b", "c~d")) == "/a~1b/c~0d"


@pytest.mark.parametrize("name", ["a", "weather-example", "Rain circuit v1.2_b", "9" * 64])
def test_good_names(name):
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", " lead", "trail ", ".hidden", "-x", "a/b", "a\\b", "é", "x" * 65, "a\nb",
                                  None, 3])
def test_bad_names_are_400_naming_the_field(name):
    with pytest.raises(InvalidParameter) as exc:
        check_name(name, "profile")
    assert exc.value.param == "profile" and "'profile'" in exc.value.message


# (why, attached layers -> SAE, imported clusters, mode, reason fragment)
SERVING = [
    ("every member layer has its SAE", {3: "sae_a", 10: "sae_b"}, {"weather"}, ServingMode.NATIVE, "(3, 10)"),
    ("a layer without an SAE, the fallback cluster exists", {3: "sae_a"}, {"weather"}, ServingMode.SLICE_FALLBACK,
     "no SAE is attached at layer 10"),
    ("a layer without an SAE, the fallback is not imported", {3: "sae_a"}, set(), ServingMode.NONE,
     "'weather' is not imported"),
    ("no SAE on any member layer, fallback exists", {}, {"weather"}, ServingMode.SLICE_FALLBACK, "layer 3"),
    ("the member's named SAE is not the one attached", {3: "sae_c", 10: "sae_b"}, {"weather"},
     ServingMode.SLICE_FALLBACK, "carries SAE sae_c, not sae_a"),
    ("the attached SAE is too narrow for a member", {3: "sae_a", 10: "sae_c"}, set(), ServingMode.NONE,
     "past the width 64"),
]


@pytest.mark.parametrize("why,attached,clusters,mode,reason", SERVING, ids=[r[0] for r in SERVING])
def test_serving_mode(why, attached, clusters, mode, reason):
    circuit = parse_circuit(CIRCUIT, REG)
    serving = serving_mode(circuit, Registered(REG.widths, attached), clusters)
    assert serving.mode is mode and reason in serving.reason
    field = serving.steering_field()
    assert set(field) == {"mode", "rung", "language", "reason"} and field["mode"] == mode.value
    if mode is ServingMode.NATIVE:
        assert (field["rung"], field["language"]) == (2, "causally validated (edge)")
    else:  # only a circuit that itself steers carries evidence language
        assert (field["rung"], field["language"]) == (None, None)


def test_a_circuit_without_a_fallback_does_not_steer():
    circuit = parse_circuit(edited(CIRCUIT, lambda d: d.pop("fallback_cluster")), REG)
    serving = serving_mode(circuit, Registered(REG.widths, {3: "sae_a"}), {"weather"})
    assert serving.mode is ServingMode.NONE and "no fallback_cluster" in serving.reason


def test_an_unparseable_stored_definition_serves_none():
    assert stored_serving_mode(stored_form(parse_circuit(CIRCUIT, REG)), REG, set()).mode is ServingMode.NATIVE
    serving = stored_serving_mode({"kind": "circuit", "name": "x"}, REG, {"weather"})
    assert serving.mode is ServingMode.NONE and "does not parse" in serving.reason
