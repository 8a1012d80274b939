"""Every feature's histogram at once (``millm.sae.corpus_histogram.histograms``), checked by hand on a small table."""

from __future__ import annotations


def test_histograms_of_a_hand_built_table():
    import torch

    from millm.sae.corpus_histogram import histograms

    acts = torch.tensor([[0.0, 1.0, -2.0],
                         [4.0, 0.0, 2.0],
                         [2.0, 0.0, 0.0],
                         [1.0, 3.0, 0.0]])
    h = histograms(acts, bins=4)
    assert h.tokens == 4 and h.firing.tolist() == [3, 2, 2]
    assert h.low.tolist() == [0.0, 0.0, -2.0] and h.high.tolist() == [4.0, 3.0, 2.0]
    assert h.counts.tolist() == [[0, 1, 1, 1],  # 1, 2, 4 in [0,1) [1,2) [2,3) [3,4]: 1 -> bin 1, 2 -> 2, 4 -> 3
                                 [0, 1, 0, 1],  # 1 and 3 over [0, 3]: bins of 0.75
                                 [1, 0, 0, 1]]  # -2 and 2 over [-2, 2]
    one = h.of(2)
    assert one["firing"] == 2 and one["firing_fraction"] == 0.5
    assert [(b["low"], b["high"], b["count"]) for b in one["bins"]] == [(-2, -1, 1), (-1, 0, 0), (0, 1, 0), (1, 2, 1)]
