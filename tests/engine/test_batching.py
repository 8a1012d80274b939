"""Continuous batching on the real model (fp32 CPU): every batched row decodes as it would alone.

The scheduler is driven step by step here, on this thread, exactly as the worker drives it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from millm.engine.base import StepControl
from millm.engine.decode.admission import BatchSettings, fallback_reason
from millm.engine.events import Delta, Usage
from millm.errors import InsufficientMemory, InvalidFeatureIndex, NonFiniteLogits
from tests.support.saes import attached_random, random_sae
from tests.support.scheduler import alone, drain, plan, submit

if TYPE_CHECKING:
    from millm.engine.decode.scheduler import Scheduler

SAE_ID = "sae_batch_test"


@pytest.fixture
def scheduler(engine) -> Iterator[Scheduler]:
    from millm.engine.decode.scheduler import Scheduler

    yield Scheduler(engine, BatchSettings(max_rows=4, max_tokens=4 * 256, prefill_chunk=64))


@pytest.fixture
def sae(engine) -> Iterator[str]:
    with attached_random(engine, SAE_ID, seed=3) as sae_id:
        yield sae_id


def test_greedy_batch_equals_each_alone(engine, scheduler):
    plans = [plan(engine, "The capital of France is", max_tokens=10),
             plan(engine, "Once upon a time, in a land far away, there lived a young", max_tokens=6),
             plan(engine, "Count with me: 1, 2, 3,", max_tokens=16, stop=[" 7"]),
             plan(engine, "Name a colour.", chat=True, max_tokens=12, frequency_penalty=1.5, presence_penalty=0.5)]
    expected = [alone(engine, p) for p in plans]
    consumers = [submit(scheduler, p) for p in plans]
    drain(scheduler)
    assert [(c.text, c.finishes) for c in consumers] == expected
    assert expected[2][1] == ["stop"] and expected[1][1] == ["length"]  # the stop and the budget were exercised
    for c, p in zip(consumers, plans):
        usage = c.events[-1]
        assert isinstance(usage, Usage) and usage.prompt_tokens == len(p.prompt_ids[0]) and c.ended and not c.error
    assert scheduler.active_rows == 0 and sorted(scheduler.free) == [0, 1, 2, 3]


def test_rows_join_while_others_decode_and_long_prompts_prefill_in_chunks(engine):
    from millm.engine.decode.scheduler import Scheduler

    scheduler = Scheduler(engine, BatchSettings(max_rows=2, max_tokens=2 * 512, prefill_chunk=16))
    first = plan(engine, "Tell me about the sea.", chat=True, max_tokens=20)
    long_text = "A list of fruits: " + ", ".join(["apple", "banana", "cherry", "grape", "melon"] * 12) + ", and"
    late = plan(engine, long_text, max_tokens=6)
    assert len(late.prompt_ids[0]) > 4 * 16  # several prefill chunks
    a = submit(scheduler, first)
    for _ in range(4):
        scheduler.step()
    decoded_before = len(a.events)
    b = submit(scheduler, late)
    scheduler.step()
    assert len(a.events) > decoded_before or a.ended  # the running row kept decoding while b prefilled
    drain(scheduler)
    assert (a.text, a.finishes) == alone(engine, first)
    assert (b.text, b.finishes) == alone(engine, late)


def test_waiting_requests_join_when_a_slot_frees(engine):
    from millm.engine.decode.scheduler import Scheduler

    scheduler = Scheduler(engine, BatchSettings(max_rows=2, max_tokens=2 * 128, prefill_chunk=64))
    plans = [plan(engine, f"Question {i}: what is {i} plus {i}?", chat=True, max_tokens=4 + 3 * i) for i in range(4)]
    consumers = [submit(scheduler, p) for p in plans]
    scheduler.step()
    assert scheduler.active_rows == 2 and scheduler.queued == 2
    drain(scheduler)
    assert [(c.text, c.finishes) for c in consumers] == [alone(engine, p) for p in plans]


def test_two_profiles_and_live_values_in_one_batch(engine, scheduler, sae):
    from millm.steering.controller import RequestSteering

    one = RequestSteering("one", {sae: {1: 40.0}})
    two = RequestSteering("two", {sae: {5: -30.0}})
    prompt = "My favourite hobby is"
    plans = [plan(engine, prompt, steering=one, max_tokens=8), plan(engine, prompt, steering=two, max_tokens=8),
             plan(engine, prompt, max_tokens=8)]
    expected = [alone(engine, p) for p in plans]
    assert len({text for text, _ in expected}) == 3  # each steering changes the text
    consumers = [submit(scheduler, p) for p in plans]
    drain(scheduler)
    assert [(c.text, c.finishes) for c in consumers] == expected


def test_operator_change_reaches_live_rows_only(engine, scheduler, sae):
    from millm.steering.controller import RequestSteering

    prompt = "My favourite hobby is"
    own = plan(engine, prompt, steering=RequestSteering("own", {sae: {1: 40.0}}), max_tokens=8)
    live = plan(engine, prompt, max_tokens=8)
    expected_own, unsteered = alone(engine, own), alone(engine, live)
    calls = []

    def operator_at_second_boundary() -> None:  # the serial loop's boundary where one batch step has run
        calls.append(1)
        if len(calls) == 2:
            engine.steering.set_values(sae, {5: -60.0}, merge=False)

    try:
        events = list(engine.run(live, StepControl(run_commands=operator_at_second_boundary)))
    finally:
        engine.steering.clear()
    expected_live = "".join(e.text for e in events if isinstance(e, Delta))
    a, b = submit(scheduler, own), submit(scheduler, live)
    scheduler.step()  # both prefilled and one token decoded, the live row unsteered so far
    engine.steering.set_values(sae, {5: -60.0}, merge=False)  # the operator steers between two steps
    try:
        drain(scheduler)
    finally:
        engine.steering.clear()
    assert (a.text, a.finishes) == expected_own  # its own profile stands: the operator's change is for the base
    assert b.text == expected_live != unsteered[0]  # the live row follows it mid-stream, as a serial one does


def test_cancel_retires_only_that_row(engine, scheduler):
    plans = [plan(engine, "Write a poem about rain.", chat=True, max_tokens=24) for _ in range(2)]
    a, b = submit(scheduler, plans[0]), submit(scheduler, plans[1])
    for _ in range(3):
        scheduler.step()
    a.control.cancel.set()
    scheduler.step()
    assert a.ended and a.error is None and scheduler.active_rows == 1
    seen = len(a.events)
    drain(scheduler)
    assert len(a.events) == seen
    assert (b.text, b.finishes) == alone(engine, plans[1])


def test_a_steering_error_fails_only_its_row(engine, scheduler):
    plans = [plan(engine, "Say hello.", chat=True, max_tokens=10) for _ in range(2)]
    broken = True

    def check() -> None:
        if broken:
            raise InvalidFeatureIndex("SAE sae_x was detached while the request was generating.")

    b = submit(scheduler, plans[1], check=check)  # first: prefilled and sampled in the step that admits it
    a = submit(scheduler, plans[0])
    drain(scheduler)
    assert isinstance(b.error, InvalidFeatureIndex) and b.events == []  # checked at admission: no text first
    assert (a.text, a.finishes) == alone(engine, plans[0]) and a.error is None


def test_a_request_whose_steering_cannot_be_bound_fails_alone(engine, scheduler, sae):
    from millm.steering.controller import RequestSteering

    keep = plan(engine, "Say hello.", chat=True, max_tokens=10)
    a = submit(scheduler, keep)
    scheduler.step()
    b = submit(scheduler, plan(engine, "Hi", steering=RequestSteering("bad", {sae: {999: 1.0}})))
    scheduler.step()  # binding b's row fails inside the step; the step itself goes on
    assert b.ended and b.error is not None and b.events == []
    assert scheduler.active_rows == 1 and sorted(scheduler.free) == [1, 2, 3]
    engine.steering.set_values(sae, {5: -60.0}, merge=False)  # no half-bound slot is left to break this
    engine.steering.clear()
    drain(scheduler)
    assert (a.text, a.finishes) == alone(engine, keep) and a.error is None


def test_an_sae_replaced_under_a_row_ends_that_row_and_the_change_stands(engine, scheduler, sae):
    from millm.steering.controller import RequestSteering

    own = plan(engine, "My favourite hobby is", steering=RequestSteering("own", {sae: {20: 40.0}}), max_tokens=12)
    live = plan(engine, "My favourite hobby is", max_tokens=12)
    a, b = submit(scheduler, own), submit(scheduler, live)
    scheduler.step()
    smaller = random_sae(engine.steering.d_model, 8, seed=4)
    engine.steering.attach(sae, smaller, 10)  # feature 20 of a's own values no longer exists
    assert engine.steering.attachments[sae].sae.d_sae == 8
    drain(scheduler)
    assert isinstance(a.error, InvalidFeatureIndex) and not any(isinstance(e, Usage) for e in a.events)
    assert (b.text, b.finishes) == alone(engine, live) and b.error is None


def test_an_operator_change_that_cannot_apply_changes_nothing(engine, scheduler, sae):
    import torch

    steering = engine.steering
    steering.set_values(sae, {1: 40.0}, merge=False)
    try:
        c = submit(scheduler, plan(engine, "Hi", max_tokens=30))
        scheduler.step()
        row = steering.attachments[sae].rows[0].clone()
        assert row.abs().sum() > 0  # the live row carries the base values
        with pytest.raises(IndexError):
            steering.activate("broken", {sae: {999: 1.0}})
        assert steering.active_profile is None and steering.attachments[sae].values == {1: 40.0}
        assert torch.equal(steering.attachments[sae].rows[0], row)
        steering.set_values(sae, {5: -60.0}, merge=False)  # later changes still apply
        assert not torch.equal(steering.attachments[sae].rows[0], row)
        c.control.cancel.set()
        drain(scheduler)
    finally:
        steering.clear()


def test_non_finite_logits_end_only_their_row(engine, scheduler, monkeypatch):
    plans = [plan(engine, "The sky is", max_tokens=8), plan(engine, "Once upon a", temperature=1.0, max_tokens=8),
             plan(engine, "Red, green,", max_tokens=8)]
    broken, sampled, greedy = (submit(scheduler, p) for p in plans)
    scheduler.step()
    forward = scheduler._forward

    def poisoned(lane, ids, first, positions, rows, mask_positions, phase):
        logits = forward(lane, ids, first, positions, rows, mask_positions, phase)
        if ids.shape[0] > 1:  # a decode step: slot 0's row gets NaN logits
            logits[0] = float("nan")
        return logits

    monkeypatch.setattr(scheduler, "_forward", poisoned)
    drain(scheduler)
    assert isinstance(broken.error, NonFiniteLogits)
    assert sampled.ended and sampled.error is None and isinstance(sampled.events[-1], Usage)
    assert (greedy.text, greedy.finishes) == alone(engine, plans[2]) and greedy.error is None


def test_a_cancelled_waiting_request_ends_without_waiting_for_a_slot(engine):
    from millm.engine.decode.scheduler import Scheduler

    scheduler = Scheduler(engine, BatchSettings(max_rows=1, max_tokens=256, prefill_chunk=64))
    busy = submit(scheduler, plan(engine, "Count:", max_tokens=40))
    gone = submit(scheduler, plan(engine, "Hi"))
    scheduler.step()
    gone.control.cancel.set()
    scheduler.step()
    assert gone.ended and gone.events == [] and scheduler.queued == 0 and not busy.ended
    busy.control.cancel.set()
    drain(scheduler)


def test_a_failed_prefill_runs_no_forward_for_its_other_rows(engine, scheduler, monkeypatch):
    c = submit(scheduler, plan(engine, "Red, green,"), plan(engine, "Monday, Tuesday,"))
    slots = []

    def failing(lane, ids, first, positions, rows, mask_positions, phase):
        slots.append(first)
        raise RuntimeError("this row's forward broke")

    monkeypatch.setattr(scheduler, "_forward", failing)
    scheduler.step()
    assert slots == [0] and isinstance(c.error, RuntimeError) and scheduler.active_rows == 0


def test_the_scheduler_is_made_on_the_engine_thread_and_out_of_memory_is_typed(engine, monkeypatch):
    from millm.engine.worker import EngineWorker

    made_on = []

    def out_of_memory(settings: BatchSettings | None) -> Scheduler:
        made_on.append(threading.current_thread().name)
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(engine, "batch_scheduler", out_of_memory)
    worker = EngineWorker(4, BatchSettings(max_rows=2, max_tokens=2 * 128))
    p = plan(engine, "Hi", max_tokens=4)

    async def ask() -> None:
        await worker.generate(engine, [p])

    try:
        with pytest.raises(InsufficientMemory):
            asyncio.run(ask())
    finally:
        worker.shutdown()
    assert len(made_on) == 1 and made_on[0].startswith("millm-engine") and worker.pending == 0


def test_several_prompts_of_one_request_share_the_batch(engine, scheduler):
    plans = [plan(engine, "Red, green,", max_tokens=5), plan(engine, "Monday, Tuesday,", max_tokens=7)]
    c = submit(scheduler, *plans)
    drain(scheduler)
    texts = {i: "".join(e.text for e in c.events if isinstance(e, Delta) and e.index == i) for i in (0, 1)}
    assert [texts[0], texts[1]] == [alone(engine, p)[0] for p in plans]
    usage = c.events[-1]
    assert isinstance(usage, Usage) and usage.completion_tokens == 12


def test_batched_monitoring_records_each_row_as_alone(engine, scheduler, sae):
    from millm.steering.monitor import MonitorConfig

    p = plan(engine, "Rivers flow to the", max_tokens=5)
    engine.monitor.configure(MonitorConfig(True, sae, [0, 1, 2]))
    try:
        alone(engine, p)
        serial = engine.monitor.history[-1]
        c = submit(scheduler, p)
        drain(scheduler)
        batched = engine.monitor.history[-1]
    finally:
        engine.monitor.configure(MonitorConfig())
    assert c.ended and batched["positions"] == serial["positions"] == len(p.prompt_ids[0]) + 4
    for f in ("0", "1", "2"):
        assert batched["features"][f]["max"] == pytest.approx(serial["features"][f]["max"], abs=1e-4)


def test_fallback_reasons(engine):
    settings = BatchSettings(max_rows=2, max_tokens=2 * 64)
    base = plan(engine, "Hi there", max_tokens=4)
    assert fallback_reason([base], settings, monitoring=False) is None
    assert fallback_reason([replace(base, params=replace(base.params, n=2))], settings, False) == "n"
    assert fallback_reason([replace(base, params=replace(base.params, seed=7))], settings, False) == "seed"
    assert fallback_reason([replace(base, prompt_ids=base.prompt_ids * 2)], settings, False) == "extra_messages"
    assert fallback_reason([replace(base, readout=object())], settings, False) == "return_sae_activations"
    assert fallback_reason([base], settings, monitoring=True) is None
    assert fallback_reason([base], replace(settings, monitoring="serial"), monitoring=True) == "monitoring"
    assert fallback_reason([replace(base, max_tokens=64)], settings, False) == "too_long"
    assert fallback_reason([base] * 3, settings, False) == "too_long"


def test_row_sampling_matches_the_single_request_rules():
    import torch

    from millm.engine.decode.sampling import apply_penalties, nucleus, sample_rows

    logits = torch.tensor([[1.0, 3.0, 2.0], [0.5, 0.1, 0.9]])
    counts = torch.tensor([[0, 2, 0], [1, 0, 0]], dtype=torch.int32)
    out = apply_penalties(logits, counts, torch.tensor([1.5, 0.0]), torch.tensor([0.5, 0.0]))
    assert torch.equal(out[0], apply_penalties(logits[:1], counts[:1], 1.5, 0.5)[0]) and torch.equal(out[1], logits[1])
    probs, ids = nucleus(logits, torch.tensor([1.0, 1.0]), torch.tensor([0.5, 1.0]))
    alone, alone_ids = nucleus(logits[:1], torch.tensor([1.0]), torch.tensor([0.5]))
    assert torch.equal(probs[0, :alone.shape[1]], alone[0]) and torch.equal(ids[0, :alone.shape[1]], alone_ids[0])
    assert not probs[0, alone.shape[1]:].any()  # padding past the row's own set, never drawn
    greedy = sample_rows(logits, torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]), torch.rand(2))
    assert greedy.tolist() == [1, 2]
    tiny_p = sample_rows(logits, torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1e-6]), torch.rand(2))
    assert tiny_p.tolist() == [1, 2]  # top_p that keeps one token keeps the most likely one


def test_only_sampled_rows_are_drawn_and_unsampleable_rows_are_found():
    import torch

    from millm.engine.decode.sampling import sample_rows, unsampleable

    logits = torch.tensor([[float("inf"), 0.0, 1.0], [0.5, 0.1, 0.9]])
    picks = sample_rows(logits, torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1e-6]), torch.rand(2))
    assert picks.tolist() == [0, 2]
    inf = float("inf")
    rows = torch.tensor([[0.0, float("nan")], [inf, 0.0], [-inf, -inf], [-inf, 1.0]])
    assert unsampleable(rows).tolist() == [True, True, True, False]


def test_kv_mask_and_span():
    import torch

    from millm.engine.decode.kv import attention_mask, span_for

    assert span_for(1, 256) == 32 and span_for(33, 256) == 64 and span_for(300, 256) == 256
    mask = attention_mask(torch.tensor([[2], [0]]), 4)
    assert mask.shape == (2, 1, 1, 4)
    assert mask[0, 0, 0].tolist() == [True, True, True, False] and mask[1, 0, 0].tolist() == [True, False, False, False]
