"""Monitoring's figures on hand-built activations: count, mean, std, min, max per feature; top-K mode;
the configuration's refusals; listeners told after every change."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from millm.errors import InvalidParameter

if TYPE_CHECKING:
    import torch

    from millm.steering.monitor import Monitor

# torch and the monitor (which imports it) are imported when a test runs, never at collection (the fast tier's rule)
ROWS = [[0.0, 2.0, 5.0],
        [1.0, 0.0, 5.0],
        [3.0, 4.0, 5.0],
        [0.0, 0.0, 1.0]]


@pytest.fixture
def acts() -> torch.Tensor:
    import torch

    return torch.tensor(ROWS, dtype=torch.float64)


def test_tally_figures_match_a_direct_computation(acts):
    from millm.steering.monitor import Tally

    tally = Tally(3)
    tally.add(acts[:1])
    tally.add(acts[1:])  # two requests' worth: the running figures equal one pass over all positions
    rows = tally.rows([7, 8, 9], None)
    assert list(rows) == ["7", "8", "9"]
    for column, key in enumerate(["7", "8", "9"]):
        values = acts[:, column]
        row = rows[key]
        assert row["count"] == int((values > 0).sum())
        assert row["mean"] == pytest.approx(float(values.mean()))
        assert row["std"] == pytest.approx(float(values.std(unbiased=False)))
        assert (row["min"], row["max"]) == (float(values.min()), float(values.max()))
        assert row["active_fraction"] == pytest.approx(row["count"] / 4)


def test_merging_two_tallies_equals_one_over_both(acts):
    from millm.steering.monitor import Tally

    one, two, both = Tally(3), Tally(3), Tally(3)
    one.add(acts[:2])
    two.add(acts[2:])
    both.add(acts)
    one.merge(two)
    merged, direct = one.rows([0, 1, 2], None), both.rows([0, 1, 2], None)
    assert all(merged[key] == pytest.approx(direct[key]) for key in direct)


def test_top_k_reports_the_k_highest_means_strongest_first(acts):
    from millm.steering.monitor import Tally

    tally = Tally(3)
    tally.add(acts)
    assert list(tally.rows([0, 1, 2], 2)) == ["2", "1"]  # means 4.0, 1.5 (feature 0's is 1.0)


def test_an_empty_tally_reports_zeros_not_infinities():
    from millm.steering.monitor import Tally

    row = Tally(2).rows([0, 1], None)["1"]
    assert row == {"count": 0, "mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0, "active_fraction": 0.0}
    assert all(math.isfinite(v) for v in row.values())


class _Steering:
    """The two things the configuration reads from steering: the attached SAEs and their lookup."""

    def __init__(self, width: int) -> None:
        self.att = SimpleNamespace(sae_id="l10", sae=SimpleNamespace(d_sae=width))
        self.attachments = {"l10": self.att}

    def resolve_sae(self, sae: Any) -> Any:
        return self.att if sae == "l10" else None


@pytest.mark.parametrize(("body", "param"), [
    ({"features": [1], "top_k": 3}, "top_k"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": True}, "top_k"),
    ({"top_k": 1025}, "top_k"),
    ({}, "features"),
    ({"features": [64]}, "features"),
    ({"features": [1], "history": 0}, "history"),
    ({"features": [1], "sae": "other"}, "sae"),
    ({"enabled": "yes"}, "enabled"),
])
def test_a_bad_configuration_names_its_field(body, param):
    from millm.steering.monitor import parse_monitor_config

    with pytest.raises(InvalidParameter) as err:
        parse_monitor_config(body, _Steering(64), 100)  # type: ignore[arg-type]
    assert err.value.param == param


def test_top_k_mode_reads_every_feature():
    from millm.steering.monitor import parse_monitor_config

    config = parse_monitor_config({"top_k": 5}, _Steering(64), 100)  # type: ignore[arg-type]
    assert (config.sae, config.top_k, config.features, config.tracked) == ("l10", 5, [], list(range(64)))
    chosen = parse_monitor_config({"features": [3, 3, 9]}, _Steering(64), 100)  # type: ignore[arg-type]
    assert (chosen.top_k, chosen.tracked) == (None, [3, 9])


class _Identity:
    """An SAE whose features are the residual's coordinates."""

    d_sae = 3

    def encode(self, x: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        return x if features is None else x[..., features]


def _record(monitor: Monitor, acts: torch.Tensor) -> None:
    session = monitor.session()
    session.sae = _Identity()
    session(acts.float().unsqueeze(0))
    monitor.commit(session, "m")


def test_a_request_lands_in_the_history_and_the_running_figures(acts):
    from millm.steering.monitor import Monitor, MonitorConfig

    monitor = Monitor()
    monitor.configure(MonitorConfig(True, "l10", [2, 0], 10, width=3))
    _record(monitor, acts)
    stats = monitor.stats()
    assert stats["positions"] == 4 and list(stats["features"]) == ["2", "0"]
    assert stats["features"]["2"]["mean"] == pytest.approx(4.0)
    assert monitor.history[-1]["features"] == {"2": {"max": 5.0, "mean": 4.0}, "0": {"max": 3.0, "mean": 1.0}}


def test_top_k_history_entries_hold_each_requests_own_top_features(acts):
    import torch

    from millm.steering.monitor import Monitor, MonitorConfig

    monitor = Monitor()
    monitor.configure(MonitorConfig(True, "l10", [], 10, top_k=1, width=3))
    _record(monitor, acts)
    _record(monitor, torch.tensor([[9.0, 0.0, 0.0]]))
    assert [list(entry["features"]) for entry in monitor.history] == [["2"], ["0"]]
    assert list(monitor.stats()["features"]) == ["2"]  # over both: feature 2's mean (16/5) beats 0's (13/5)


def test_a_request_from_an_older_configuration_is_dropped(acts):
    from millm.steering.monitor import Monitor, MonitorConfig

    monitor = Monitor()
    monitor.configure(MonitorConfig(True, "l10", [0], 10, width=3))
    session = monitor.session()
    session.sae = _Identity()
    session(acts.float().unsqueeze(0))
    monitor.configure(MonitorConfig(True, "l10", [1], 10, width=3))
    monitor.commit(session, "m")
    assert monitor.stats()["positions"] == 0 and not monitor.history


def test_listeners_hear_every_change_until_they_stop(acts):
    from millm.steering.monitor import Monitor, MonitorConfig

    monitor = Monitor()
    heard: list[int] = []
    stop = monitor.listen(lambda: heard.append(len(monitor.history)))
    monitor.configure(MonitorConfig(True, "l10", [0], 10, width=3))
    _record(monitor, acts)
    monitor.clear_history()
    assert heard == [0, 1, 0]
    stop()
    _record(monitor, acts)
    assert heard == [0, 1, 0]
