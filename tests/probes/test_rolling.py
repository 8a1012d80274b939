"""A rolling mean over the response (aggregation ``rolling_mean``, ``window``): the rule, the windows' means on
hand-built score sequences, when an armed one fires (a full window first, each row on its own), its verdict, and
the document's round trip. No model: a one-dimensional read-out whose score is the residual itself."""

from __future__ import annotations

import pytest

from millm.errors import InvalidParameter
from millm.probes.probe import Figures, ModelIdentity, Probe, from_document
from millm.steering.probe import WINDOW, Watch, check_action, check_aggregation


def test_a_rolling_mean_takes_a_window_over_the_response_and_nothing_else_does():
    assert check_aggregation("rolling_mean", "response") == ("rolling_mean", "response", WINDOW[2])
    assert check_aggregation("rolling_mean", "response", 3) == ("rolling_mean", "response", 3)
    assert check_aggregation("max", "both") == ("max", "both", None)
    assert check_action("abort", None, "rolling_mean", "response") == "abort"


@pytest.mark.parametrize(("aggregation", "span", "window", "param"), [
    ("rolling_mean", "response", 0, "window"), ("rolling_mean", "response", WINDOW[1] + 1, "window"),
    ("rolling_mean", "response", "8", "window"), ("rolling_mean", "response", True, "window"),
    ("rolling_mean", "response", 2.0, "window"), ("max", "response", 4, "window"), ("mean", "both", 8, "window"),
    ("rolling_mean", "prompt", 4, "span"), ("rolling_mean", "both", None, "span")])
def test_a_bad_window_is_a_400_naming_the_field(aggregation, span, window, param):
    with pytest.raises(InvalidParameter) as caught:
        check_aggregation(aggregation, span, window)
    assert caught.value.param == param


def test_the_windows_means_on_a_hand_built_sequence():
    import torch

    from millm.probes.learn import aggregate
    from millm.steering.watching import rolling_means

    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0])
    assert rolling_means(values, 2).tolist() == [1.5, 2.5, 3.5, 2.0]
    assert rolling_means(values, 5).tolist() == [2.0]
    assert rolling_means(values, 6).tolist() == []
    assert rolling_means(values, 1).tolist() == values.tolist()
    assert aggregate([values, torch.tensor([9.0, -9.0, 0.0])], "rolling_mean", 2).tolist() == [3.5, 0.0]


def _watching(scores: list[list[float]], window: int, threshold: float, action: str = "abort"):
    """Each row's response scores fed one position a step (the read-out is the residual itself), checking the
    armed probe after each as the scheduler does; returns the watching and each row's firing steps."""
    import torch

    from millm.steering.probe import RESPONSE
    from millm.steering.watching import Watching

    watch = Watch("w", 0, [1.0], 0.0, "rolling_mean", "response", threshold, action, window=window)
    watching = Watching([watch], len(scores), max(map(len, scores)), torch.device("cpu"), torch.float32)
    fired: list[list[int]] = [[] for _ in scores]
    for step in range(max(map(len, scores))):
        for row, sequence in enumerate(scores):
            if step < len(sequence):
                watching.read(0, row, RESPONSE, torch.tensor([[[sequence[step]]]]))
                if watching.firing(row):
                    fired[row].append(step)
    return watching, fired


def test_an_armed_rolling_mean_fires_once_at_the_first_full_window_at_its_threshold_each_row_on_its_own():
    watching, fired = _watching([[0.0, 3.0, 3.0, 3.0, 3.0], [5.0, 0.0, 0.0, 0.0], [9.0, 9.0]], 3, 2.0)
    # row 0: the window ending at 2 holds 0, 3, 3 (mean 2); row 1 reaches 5 at once but no full window of it
    # does; row 2 never has a full window
    assert fired == [[2], [], []]
    first, second, short = watching.verdicts()
    assert first == {"probe": "w", "index": 0, "layer": 0, "aggregation": "rolling_mean", "span": "response",
                     "score": 3.0, "threshold": 2.0, "fired": True, "position": 2, "action": "abort",
                     "acted": True, "window": 3}
    assert (second["score"], second["fired"], second["position"], second["acted"]) == (
        pytest.approx(5 / 3, abs=1e-6), False, None, False)
    assert (short["score"], short["fired"], short["position"]) == (None, False, None)


def test_a_flag_rolling_mean_reports_where_its_first_window_reached_the_threshold():
    watching, fired = _watching([[1.0, 1.0, 4.0, 0.0, 8.0, 8.0]], 2, 4.0, action="flag")
    assert fired == [[]]  # a flag never acts
    [verdict] = watching.verdicts()
    # the means: 1, 2.5, 2, 4, 8: the first at 4 is the window ending at position 4
    assert (verdict["score"], verdict["fired"], verdict["position"], verdict["acted"]) == (8.0, True, 4, False)


def _probe(**changes) -> Probe:
    figures = Figures(0.9, 0.5, 0.0, 0.01, {"positive": 2, "negative": 2}, {"positive": 4, "negative": 4})
    probe = Probe("r", 0, "diffmean", [1.0, 0.0], 0.5, "rolling_mean", "response", 1.25, figures,
                  ModelIdentity("m", 2, 1, ""), window=5)
    return Probe(**{**probe.__dict__, **changes})


def test_a_rolling_probe_round_trips_its_window_and_serves_it():
    probe = _probe()
    again = from_document(probe.document())
    assert again == probe and again.document()["window"] == 5 and again.watch("abort").window == 5
    assert from_document({**probe.document(), "window": None}).window == WINDOW[2]  # the default
    assert from_document(_probe(aggregation="max", window=None).document()).window is None


@pytest.mark.parametrize(("changes", "param"), [({"window": 0}, "window"), ({"window": "5"}, "window"),
                                                 ({"aggregation": "max"}, "window"),
                                                 ({"span": "both"}, "span")])
def test_a_document_with_a_bad_window_is_refused_naming_it(changes, param):
    with pytest.raises(InvalidParameter) as caught:
        from_document({**_probe().document(), **changes})
    assert caught.value.param == param
