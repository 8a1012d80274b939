"""Cluster sensing's mechanics without a model: a cluster's thresholds (given, or half the card's max
activation), ``min_members``'s rule, and a request's sensing on an SAE whose activations are the residual itself
(identity encoder, ReLU): where each cluster first fires, per row, and nothing started when no SAE senses."""

from __future__ import annotations

import pytest

from millm.errors import InvalidParameter
from millm.steering.documents import parse_shape
from millm.steering.sensors import ClusterSensor, check_min_members, sensor_for


def _cluster(*members: dict, name: str = "c"):
    return parse_shape("cluster", {"kind": "cluster", "name": name, "model": "m", "sae": {"layer": 0, "d_sae": 4},
                                   "members": [{"strength": 0.0, **m} for m in members]})


def test_thresholds_are_given_or_half_the_cards_max_activation():
    sensor = sensor_for(_cluster({"feature": 0, "threshold": 0.3}, {"feature": 2}), "s", {2: 5.0, 0: 9.0}, 2)
    assert (sensor.features, sensor.thresholds, sensor.from_card, sensor.min_members) == (
        (0, 2), (0.3, 2.5), (False, True), 2)
    assert sensor.describe()["members"][1] == {"feature": 2, "threshold": 2.5, "from_card": True}


@pytest.mark.parametrize("tops", [{}, {1: 0.0}])
def test_a_member_with_neither_threshold_nor_card_value_is_refused_naming_it(tops):
    with pytest.raises(InvalidParameter) as caught:
        sensor_for(_cluster({"feature": 0, "threshold": 1.0}, {"feature": 1}), "s", tops)
    assert caught.value.param == "/members/1/threshold"


@pytest.mark.parametrize("value", [0, 3, -1, True, "1", 1.0, None])
def test_min_members_is_an_integer_from_1_to_the_clusters_size(value):
    with pytest.raises(InvalidParameter) as caught:
        check_min_members(value, 2)
    assert caught.value.param == "min_members"
    assert check_min_members(2, 2) == 2


def _identity_sae():
    import torch

    from millm.sae.model import SAE

    eye = torch.eye(4)
    return SAE(W_enc=eye.clone(), b_enc=torch.zeros(4), W_dec=eye.clone(), b_dec=torch.zeros(4))


def test_a_request_fires_each_cluster_once_at_its_first_position_with_enough_members_over_per_row():
    import torch

    from millm.steering.sensing import sensing_for

    pair = ClusterSensor("pair", "s", (0, 1), (1.0, 1.0), (False, False), 2)
    single = ClusterSensor("single", "s", (3,), (0.5,), (False,), 1)
    sensing = sensing_for([("s", _identity_sae(), {"pair": pair, "single": single}), ("t", _identity_sae(), {})],
                          rows=2, length=8, device=torch.device("cpu"))
    assert sensing is not None and list(sensing.on) == ["s"]  # an SAE without sensors is not read
    rows = {0: [[2.0, 0.0, 0.0, 0.0], [2.0, 1.0, 0.0, 0.6], [2.0, 3.0, 0.0, 0.0], [2.0, 3.0, 0.0, 0.9]],
            1: [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.5]]}
    for row, positions in rows.items():
        for hidden in positions:  # one fed token a step, as decoding reads
            sensing.reader("s", row)(torch.tensor([[hidden]]))
    # row 0: at 1 feature 1 equals its threshold (not over) and feature 3 is over; both of pair's are over at 2;
    # row 1: feature 3 only reaches its threshold
    assert sensing.events() == [
        {"cluster": "pair", "sae": "s", "index": 0, "score": 2, "threshold": 2, "position": 2},
        {"cluster": "single", "sae": "s", "index": 0, "score": 1, "threshold": 1, "position": 1}]


def test_no_sensing_without_a_sensor():
    import torch

    from millm.steering.sensing import sensing_for

    assert sensing_for([("s", _identity_sae(), {})], 1, 4, torch.device("cpu")) is None
    assert sensing_for([], 1, 4, torch.device("cpu")) is None
