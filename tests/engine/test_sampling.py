from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch


def test_penalties_are_openai_additive():
    import torch

    from millm.engine.decode.sampling import apply_penalties

    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    counts = torch.tensor([[0, 1, 3, 0]], dtype=torch.int32)
    out = apply_penalties(logits, counts, frequency=0.5, presence=0.25)
    assert torch.equal(out, torch.tensor([[1.0, 2.0 - 0.5 - 0.25, 3.0 - 1.5 - 0.25, 4.0]]))


def test_negative_penalties_encourage_repeats():
    import torch

    from millm.engine.decode.sampling import apply_penalties

    out = apply_penalties(torch.zeros(1, 3), torch.tensor([[0, 2, 0]]), frequency=-1.0, presence=-1.0)
    assert out.tolist() == [[0.0, 3.0, 0.0]]


def test_zero_penalties_return_logits_untouched():
    import torch

    from millm.engine.decode.sampling import apply_penalties

    logits = torch.randn(2, 5)
    assert apply_penalties(logits, torch.ones(2, 5, dtype=torch.int32), 0.0, 0.0) is logits


def sample(logits: torch.Tensor, temperature: float, top_p: float,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Every row with the same temperature and top_p."""
    import torch

    from millm.engine.decode.sampling import sample_rows

    rows = logits.shape[0]
    temperatures = torch.full((rows,), temperature, dtype=torch.float64)
    chances = torch.rand(rows, generator=generator, dtype=torch.float64)
    return sample_rows(logits, temperatures, torch.full((rows,), top_p), chances)


def test_greedy_is_argmax():
    import torch

    logits = torch.tensor([[0.1, 5.0, 0.2], [3.0, 1.0, 2.0]])
    assert sample(logits, 0.0, 1.0).tolist() == [1, 0]


def kept(logits: torch.Tensor, top_p: float) -> list[set[int]]:
    """Each row's top-p set (temperature 1), as token ids."""
    import torch

    from millm.engine.decode.sampling import nucleus

    rows = logits.shape[0]
    probs, ids = nucleus(logits, torch.ones(rows, dtype=torch.float64), torch.full((rows,), top_p))
    return [set(ids[r][probs[r] > 0].tolist()) for r in range(rows)]


def test_top_p_keeps_smallest_set_reaching_mass():
    import torch

    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert kept(probs.log(), 0.75) == [{0, 1}]
    assert kept(probs.log(), 0.0) == [{0}]  # the top token survives even when top_p is tiny
    assert kept(probs.log(), 1.0) == [{0, 1, 2, 3}]


def test_top_p_respects_original_order():
    import torch

    assert kept(torch.tensor([[0.0, 10.0, 9.0, -5.0]]), 0.9) == [{1, 2}]


def test_top_p_past_the_candidates_sorts_the_row_and_matches_the_exact_set(monkeypatch):
    """A row whose top-p set is wider than every NUCLEUS_CANDIDATES gets its exact set, by a full sort; one wider
    than the first but within the second, by the wider search; a row batched with them keeps its own."""
    import torch

    from millm.engine.decode import sampling

    monkeypatch.setattr(sampling, "NUCLEUS_CANDIDATES", (2, 4))
    flat = torch.zeros(1, 10)  # ten equal tokens: top_p 0.75 needs 8 of them
    sharp = torch.tensor([[9.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    three = torch.tensor([[5.0, 5.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])  # top_p 0.75: all three, not 2
    assert kept(flat, 0.75) == [set(range(8))]
    assert kept(three, 0.75) == [{0, 1, 2}]
    both = kept(torch.cat([flat, sharp, three]), 0.75)
    assert both == [set(range(8)), {0}, {0, 1, 2}]


def test_a_rows_draws_do_not_depend_on_its_batch(monkeypatch):
    """The same logits, parameters and uniform draw the same token alone and beside rows that widen the
    candidate set or keep every token."""
    import torch

    from millm.engine.decode import sampling

    monkeypatch.setattr(sampling, "NUCLEUS_CANDIDATES", (4, 8))
    torch.manual_seed(0)
    row = torch.randn(1, 64) * 2
    others = torch.cat([torch.zeros(1, 64), torch.randn(1, 64)])
    alone, batched = [], []
    for step in range(30):
        chance = torch.rand(1, generator=torch.Generator().manual_seed(step), dtype=torch.float64)
        alone.append(sampling.sample_rows(row, torch.tensor([0.8]), torch.tensor([0.9]), chance).item())
        batch, chances = torch.cat([row, others]), torch.cat([chance, torch.rand(2, dtype=torch.float64)])
        batched.append(sampling.sample_rows(batch, torch.tensor([0.8, 1.0, 1.0]), torch.tensor([0.9, 0.5, 1.0]),
                                            chances)[0].item())
    assert alone == batched and len(set(alone)) > 1


def test_draws_follow_the_distribution():
    """Inverse transform sampling over the candidates draws each token about as often as its chance."""
    import torch

    from millm.engine.decode.sampling import sample_rows

    logits = torch.tensor([[0.5, 0.3, 0.2]]).log().repeat(20000, 1)
    chances = torch.rand(20000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    picks = sample_rows(logits, torch.ones(20000, dtype=torch.float64), torch.ones(20000), chances)
    share = torch.bincount(picks, minlength=3).float() / 20000
    assert torch.allclose(share, torch.tensor([0.5, 0.3, 0.2]), atol=0.02)


def test_seeded_sampling_reproducible():
    import torch

    logits = torch.randn(3, 50)
    a = [sample(logits, 1.0, 1.0, torch.Generator().manual_seed(7)).tolist() for _ in range(2)]
    assert a[0] == a[1]
    draws = {tuple(sample(logits, 1.5, 1.0, torch.Generator().manual_seed(s)).tolist()) for s in range(20)}
    assert len(draws) > 1


def test_sampling_never_picks_masked_tokens():
    import torch

    logits = torch.tensor([[0.0, 0.0, -float("inf")]]).repeat(200, 1)
    picks = sample(logits, 2.0, 1.0, torch.Generator().manual_seed(0))
    assert set(picks.tolist()) == {0, 1}


@pytest.mark.parametrize("temperature", [1e-40, 5e-324, 0.0005])
def test_tiny_temperatures_sample_safely_as_near_greedy(temperature):
    import torch

    from millm.engine.decode.sampling import scaled

    logits = torch.tensor([[0.0, 30.0, 29.5, -float("inf")], [80.0, -5.0, 79.0, 1.0]])
    values = scaled(logits, temperature)
    assert not torch.isnan(values).any() and not torch.isposinf(values).any()  # never +inf or NaN
    assert (values.max(-1).values == 0).all()
    picks = {tuple(sample(logits, temperature, 1.0, torch.Generator().manual_seed(s)).tolist()) for s in range(10)}
    assert picks == {(1, 0)}


def test_scaled_is_a_shifted_division():
    import torch

    from millm.engine.decode.sampling import scaled

    logits = torch.tensor([[1.0, 3.0, 2.0]])
    assert torch.allclose(torch.softmax(scaled(logits, 0.5), -1).float(), torch.softmax(logits / 0.5, -1))


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    import torch

    from millm.engine.decode.sampling import apply_repetition_penalty

    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0], [1.0, 1.0, -1.0, -1.0]])
    seen = torch.tensor([[True, True, False, False], [False, True, True, False]])
    out = apply_repetition_penalty(logits, seen, torch.tensor([2.0, 1.0]))
    assert out.tolist() == [[1.0, -4.0, 2.0, -2.0], [1.0, 1.0, -1.0, -1.0]]  # row 1: penalty 1 changes nothing
    assert apply_repetition_penalty(logits, seen, 1.0) is logits


def test_a_zero_chance_candidate_is_never_drawn_even_when_the_cumulative_sum_rises_there(monkeypatch):
    """A parallel cumulative sum (CUDA's) may add a rounding step at a zero-probability token; the draw holds
    the cumulative chance flat there, so a masked token in the middle of a top_p 1 row is never picked."""
    import torch

    from millm.engine.decode.sampling import pick

    real = torch.cumsum

    def tree_rounded(values, dim, **kw):
        out = real(values, dim=dim, **kw)
        if not out.is_floating_point():
            return out
        return out + 1e-6 * torch.arange(out.shape[-1], dtype=out.dtype)

    monkeypatch.setattr(torch, "cumsum", tree_rounded)
    probs, ids = torch.tensor([[0.5, 0.0, 0.5]]), torch.tensor([[10, 11, 12]])
    just_past_the_first = torch.tensor([0.5000004 / 1.000002])
    assert pick(probs, ids, just_past_the_first).tolist() == [12]


def test_a_row_is_unsampleable_with_a_nan_or_plus_infinity_or_nothing_but_minus_infinity():
    import torch

    from millm.engine.decode.sampling import unsampleable

    inf = float("inf")
    logits = torch.tensor([[1.0, 2.0, 3.0], [1.0, -inf, 3.0], [-inf, -inf, -inf], [1.0, float("nan"), 0.0],
                           [inf, 1.0, 0.0], [inf, -inf, 0.0], [3e38, 3e38, 0.0]])  # the last sums past float32
    assert unsampleable(logits).tolist() == [False, False, True, True, True, True, False]


def test_counts_record_one_token_for_each_row_named_and_no_other():
    import torch

    from millm.engine.decode.sampling import update_counts

    counts = torch.zeros(4, 5, dtype=torch.int32)
    update_counts(counts, torch.tensor([2, 0]), torch.tensor([3, 3]))
    update_counts(counts, torch.tensor([2]), torch.tensor([3]))
    assert counts.tolist() == [[0, 0, 0, 1, 0], [0] * 5, [0, 0, 0, 2, 0], [0] * 5]
