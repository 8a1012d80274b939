"""Merged prefill: several rows' prompt chunks in one forward, and no row seeing another's tokens.

The pure parts (which chunks share a forward, its input tensors, where the slot cache writes them) are
checked on hand-built values; the scheduler on the real model (fp32 CPU), each row against the same
request run alone on the serial engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from millm.engine.decode.admission import BatchSettings
from tests.support.saes import attached_random
from tests.support.scheduler import alone, drain, plan, submit

if TYPE_CHECKING:
    from millm.engine.decode.scheduler import Scheduler

SAE_ID = "sae_merged_prefill_test"


def test_short_prompts_share_one_forward_within_the_budget():
    from millm.engine.decode.prefill import Merged, choose

    merged = choose([(slot, 35) for slot in range(16)], 256)
    assert merged == Merged(0, 7, 35, {slot: 35 for slot in range(7)})  # 7 x 35 <= 256 < 8 x 35
    assert choose([(0, 10), (1, 30), (2, 20)], 256) == Merged(0, 3, 30, {0: 10, 1: 30, 2: 20})
    assert choose([], 256) is None


def test_a_long_prompt_is_chunked_and_fillers_count_against_the_budget():
    from millm.engine.decode.prefill import Merged, choose

    assert choose([(0, 1000), (1, 35)], 256) == Merged(0, 1, 256, {0: 256})  # a long first prompt goes alone
    # a long prompt after short ones joins with a chunk of their width and continues next step
    assert choose([(0, 35), (1, 1000), (2, 20)], 256) == Merged(0, 3, 35, {0: 35, 1: 35, 2: 20})
    # slots 1 and 2 are not prefilling: they are filler rows, and slot 7 would cost 8 x 30 > 128
    assert choose([(0, 30), (3, 30), (7, 30)], 128) == Merged(0, 4, 30, {0: 30, 3: 30})


def test_inputs_left_pad_each_chunk_and_fillers_write_aside():
    from millm.engine.decode.prefill import Merged, inputs

    merged = Merged(first=2, count=3, width=4, takes={2: 2, 4: 4})
    ids, writes, reads = inputs(merged, {2: (5, [11, 12]), 4: (0, [21, 22, 23, 24])}, pad_id=0, aside=99)
    assert ids.tolist() == [[0, 0, 11, 12], [0, 0, 0, 0], [21, 22, 23, 24]]
    assert writes.tolist() == [[99, 99, 5, 6], [99, 99, 99, 99], [0, 1, 2, 3]]
    assert reads.tolist() == [[6, 6, 5, 6], [0, 0, 0, 0], [0, 1, 2, 3]]


def test_a_merged_forward_writes_each_row_only_in_its_own_slot_and_positions():
    import torch

    from millm.engine.decode.kv import KVShape, SlotCache
    from millm.engine.decode.prefill import Merged, inputs

    cache = SlotCache(KVShape(layers=1, kv_heads=1, head_dim=1), slots=3, slot_len=8, dtype=torch.float32,
                      device=torch.device("cpu"))
    merged = Merged(first=0, count=3, width=3, takes={0: 1, 2: 3})
    _, writes, reads = inputs(merged, {0: (4, [7]), 2: (0, [7, 7, 7])}, pad_id=0, aside=cache.aside)
    mask = cache.bind(0, writes, reads)
    cache.keys[0][1].fill_(-1.0)  # slot 1 is a decoding row in the middle: only its aside position may change
    keys = (torch.arange(9, dtype=torch.float32) + 1).view(3, 1, 3, 1)  # [rows, heads, q, dim]
    seen, _ = cache.update(keys, keys.clone(), 0)
    stored = cache.keys[0][:, :, 0, 0]
    assert stored[0, 4] == 3 and stored[2, :3].tolist() == [7, 8, 9]  # the real tokens, at their positions
    assert stored[1, :cache.aside].tolist() == [-1.0] * 7  # the filler row touched nothing its row holds
    assert stored[0, :4].tolist() == [0.0] * 4 and stored[2, 3:cache.aside].tolist() == [0.0] * 4
    assert seen.shape == (3, 1, 8, 1)
    # each query sees its own row's keys up to its read position, never the aside position
    assert mask[0, 0].tolist() == [[True] * 5 + [False] * 3] * 3
    assert mask[2, 0, 0].tolist() == [True] + [False] * 7 and not mask[..., cache.aside].any()


@pytest.fixture
def sae(engine) -> Iterator[str]:
    with attached_random(engine, SAE_ID, seed=5) as sae_id:
        yield sae_id


def counting_forwards(scheduler: Scheduler) -> list[tuple[int, int, int]]:
    """Record every forward the scheduler runs: (first slot, rows, tokens per row)."""
    calls: list[tuple[int, int, int]] = []
    forward = scheduler._forward

    def counted(lane, ids, first, positions, rows, mask_positions, phase):
        calls.append((first, ids.shape[0], ids.shape[1]))
        return forward(lane, ids, first, positions, rows, mask_positions, phase)

    scheduler._forward = counted  # type: ignore[method-assign]
    return calls


def test_rows_of_different_lengths_and_steering_prefilled_together_decode_as_alone(engine, sae):
    from millm.engine.decode.scheduler import Scheduler
    from millm.steering.controller import RequestSteering

    scheduler = Scheduler(engine, BatchSettings(max_rows=4, max_tokens=4 * 256, prefill_chunk=256))
    one, two = RequestSteering("one", {sae: {1: 40.0}}), RequestSteering("two", {sae: {5: -30.0}})
    plans = [plan(engine, "My favourite hobby is", steering=one, max_tokens=8),
             plan(engine, "Write one sentence about the sea and the ships that sail on it.", chat=True,
                  max_tokens=8),
             plan(engine, "Red, green, blue, yellow,", steering=two, max_tokens=8),
             plan(engine, "Once upon a time, in a land far away, there lived a", max_tokens=8)]
    lengths = [len(p.prompt_ids[0]) for p in plans]
    assert len(set(lengths)) == 4  # every row but the longest is padded
    expected = [alone(engine, p) for p in plans]
    calls = counting_forwards(scheduler)
    consumers = [submit(scheduler, p) for p in plans]
    scheduler.step()
    assert calls[0] == (0, 4, max(lengths))  # the four prompts in one forward
    assert all(c.events for c in consumers)  # each sampled its first token from it
    drain(scheduler)
    assert [(c.text, c.finishes) for c in consumers] == expected


def test_a_merged_prefill_beside_a_decoding_row_leaves_it_untouched(engine, sae):
    from millm.engine.decode.scheduler import Scheduler
    from millm.steering.controller import RequestSteering

    scheduler = Scheduler(engine, BatchSettings(max_rows=4, max_tokens=4 * 128, prefill_chunk=128))
    first = [plan(engine, "Count with me: 1, 2, 3,", max_tokens=30),
             plan(engine, "Hi", max_tokens=2),
             plan(engine, "The capital of France is", steering=RequestSteering("own", {sae: {3: 30.0}}), max_tokens=30)]
    late = [plan(engine, "Name a colour.", chat=True, max_tokens=6), plan(engine, "Monday, Tuesday,", max_tokens=6)]
    expected = [alone(engine, p) for p in first + late]
    a, b, c = (submit(scheduler, p) for p in first)
    while not b.ended:
        scheduler.step()
    assert sorted(scheduler.free) == [1, 3]
    calls = counting_forwards(scheduler)
    d, e = (submit(scheduler, p) for p in late)
    scheduler.step()
    width = max(len(p.prompt_ids[0]) for p in late)
    assert calls[0] == (1, 3, width)  # slots 1 and 3 prefilled in one forward; slot 2 (decoding) a filler row
    assert not a.ended and not c.ended and d.events and e.events
    drain(scheduler)
    assert [(x.text, x.finishes) for x in (a, b, c, d, e)] == expected


def test_monitored_rows_read_only_their_own_real_positions(engine, sae):
    from millm.engine.decode.scheduler import Scheduler
    from millm.steering.monitor import MonitorConfig

    scheduler = Scheduler(engine, BatchSettings(max_rows=2, max_tokens=2 * 128, prefill_chunk=128))
    plans = [plan(engine, "Rivers flow to the", max_tokens=4),
             plan(engine, "A long list of the things rivers carry to the sea: sand,", max_tokens=4)]
    engine.monitor.configure(MonitorConfig(True, sae, [0, 1, 2]))
    try:
        serial = []
        for p in plans:
            alone(engine, p)
            serial.append(engine.monitor.history[-1])
        consumers = [submit(scheduler, p) for p in plans]
        drain(scheduler)
        batched = list(engine.monitor.history)[-2:]
    finally:
        engine.monitor.configure(MonitorConfig())
    assert all(c.ended and not c.error for c in consumers)
    for got, want, p in zip(batched, serial, plans):
        assert got["positions"] == want["positions"] == len(p.prompt_ids[0]) + 3
        for f in ("0", "1", "2"):
            assert got["features"][f]["max"] == pytest.approx(want["features"][f]["max"], abs=1e-4)
            assert got["features"][f]["mean"] == pytest.approx(want["features"][f]["mean"], abs=1e-4)


def test_a_failed_merged_prefill_ends_every_row_in_it(engine, monkeypatch):
    from millm.engine.decode.scheduler import Scheduler

    scheduler = Scheduler(engine, BatchSettings(max_rows=4, max_tokens=4 * 128, prefill_chunk=128))
    a, b = submit(scheduler, plan(engine, "Red, green,")), submit(scheduler, plan(engine, "Monday, Tuesday,"))

    def failing(lane, ids, first, positions, rows, mask_positions, phase):
        raise RuntimeError("the merged forward broke")

    monkeypatch.setattr(scheduler, "_forward", failing)
    scheduler.step()
    assert isinstance(a.error, RuntimeError) and isinstance(b.error, RuntimeError)
    assert scheduler.active_rows == 0 and sorted(scheduler.free) == [0, 1, 2, 3]
