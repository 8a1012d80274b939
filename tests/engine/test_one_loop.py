"""The scheduler is the one decode loop: what used to need a serial path of its own runs as rows of a job.

n > 1 (one prefill, the KV copied), several conversations, seeds (a generator per plan, a lane of its own),
response_format (a matcher per row), return_sae_activations (readers in the row view) and tiny temperatures,
each checked against a reference computed independently of the scheduler, or against the same request
served while other traffic shares the scheduler.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from millm.engine.decode.admission import BatchSettings
from millm.engine.events import Activations, Delta, Finish, Usage
from millm.engine.params import ChatPrompt, GenerationRequest, SamplingParams, TextPrompt
from millm.steering.readout import check_readout
from millm.structured.schema import JsonConstraint
from tests.support.saes import random_sae
from tests.support.scheduler import Consumer, alone, drain, plan, submit
from tests.support.tiny import tiny_engine

if TYPE_CHECKING:
    from millm.engine.decode.scheduler import Scheduler

SAE_ID = "sae_one_loop"


def submit_alone(scheduler: Scheduler, p) -> Consumer:
    from millm.engine.decode.scheduler import Job

    consumer = Consumer()
    scheduler.submit(Job([p], consumer.control, consumer.events.append, consumer.end, alone=True))
    return consumer


def reference_greedy(engine, ids: list[int], tokens: int) -> list[int]:
    """Greedy ids from plain full forwards (no cache, no scheduler): the independent reference."""
    import torch

    out = list(ids)
    with torch.inference_mode():
        for _ in range(tokens):
            logits = engine.model(input_ids=torch.tensor([out]), use_cache=False).logits[0, -1]
            out.append(int(logits.argmax()))
    return out[len(ids):]


def by_index(events) -> dict[int, str]:
    texts: dict[int, str] = {}
    for e in events:
        if isinstance(e, Delta):
            texts[e.index] = texts.get(e.index, "") + e.text
    return texts


def test_alone_greedy_equals_plain_forwards(engine):
    p = plan(engine, "The capital of France is", max_tokens=8)
    text, finishes = alone(engine, p)
    expected = engine.tokenizer.decode(reference_greedy(engine, p.prompt_ids[0], 8))
    assert finishes == ["length"] and text == expected


def test_n_choices_prefill_once_and_each_equals_one_choice(engine, monkeypatch):
    one = plan(engine, "Name three fruits:", max_tokens=6)
    expected, _ = alone(engine, one)
    fed: list[int] = []
    original = engine.model.forward

    def counting(*args, **kwargs):
        fed.append(int(kwargs["input_ids"].numel()))
        return original(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", counting)
    events = list(engine.run(replace(one, params=replace(one.params, n=3))))
    assert by_index(events) == {0: expected, 1: expected, 2: expected}
    prompt = len(one.prompt_ids[0])
    assert fed[0] == prompt  # one prefill of the prompt, not three
    assert all(n <= 3 for n in fed[1:])  # then one token per choice per step
    assert [e.index for e in events if isinstance(e, Finish)] == [0, 1, 2]
    usage = events[-1]
    assert isinstance(usage, Usage) and usage.prompt_tokens == prompt and usage.completion_tokens == 18


def test_seeded_choices_are_reproducible_and_differ_from_each_other(engine):
    p = plan(engine, "Write one word.", chat=True, max_tokens=8, temperature=1.5, seed=5, n=4)
    a, b = by_index(engine.run(p)), by_index(engine.run(p))
    assert a == b and len(set(a.values())) > 1


def test_a_seeded_request_does_not_depend_on_other_traffic(engine):
    """scope="request": the same seeded request gives the same text alone and while the batch is busy."""
    from millm.engine.decode.scheduler import Scheduler

    seeded = plan(engine, "Tell me about the sea.", chat=True, max_tokens=12, temperature=1.0, seed=3)
    expected = alone(engine, seeded)
    scheduler = Scheduler(engine, BatchSettings(max_rows=4, max_tokens=4 * 256, prefill_chunk=64))
    others = [submit(scheduler, plan(engine, prompt, max_tokens=16, temperature=1.0))
              for prompt in ("Once upon a time", "The weather today", "def main():")]
    scheduler.step()  # the others are in the batch before the seeded one arrives
    c = submit_alone(scheduler, seeded)
    scheduler.step()
    assert scheduler.active_rows == 4  # it decodes beside the batch, in its own lane
    drain(scheduler)
    assert all(o.ended and not o.error for o in others)
    assert (c.text, c.finishes) == expected


def test_several_conversations_are_rows_of_one_job(engine):
    prompts = [ChatPrompt([{"role": "user", "content": q}]) for q in ("Say hi.", "Name a colour.", "Count to 3.")]
    both = engine.prepare(GenerationRequest(prompts, SamplingParams(temperature=0.0, max_tokens=8, n=2)))
    texts = by_index(engine.run(both))
    for k, prompt in enumerate(prompts):
        single, _ = alone(engine, engine.prepare(GenerationRequest([prompt], SamplingParams(temperature=0.0,
                                                                                            max_tokens=8))))
        assert texts[2 * k] == texts[2 * k + 1] == single


def test_constrained_rows_decode_beside_free_rows(engine):
    from millm.engine.decode.scheduler import Scheduler

    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
              "required": ["colour"], "additionalProperties": False}
    constrained = replace(plan(engine, "Pick a colour as JSON.", chat=True, max_tokens=40),
                          constraint=JsonConstraint("json_schema", schema, "c"))
    free = plan(engine, "The capital of France is", max_tokens=10)
    expected_free = alone(engine, free)
    scheduler = Scheduler(engine, BatchSettings(max_rows=4, max_tokens=4 * 256, prefill_chunk=64))
    f = submit(scheduler, free)
    c = submit_alone(scheduler, constrained)
    drain(scheduler)
    assert (f.text, f.finishes) == expected_free
    assert c.finishes == ["stop"] and json.loads(c.text)["colour"] in {"red", "green", "blue"}


@pytest.fixture
def steered(engine):
    engine.steering.attach(SAE_ID, random_sae(engine.steering.d_model, 32, seed=9), 10)
    engine.steering.set_values(SAE_ID, {3: 20.0}, merge=False)
    try:
        yield SAE_ID
    finally:
        engine.steering.detach(SAE_ID)


def readout(engine, sae_id: str, point: str) -> tuple[dict, str]:
    ask = {"sae_id": sae_id, "features": [3, 5], "top_k": 2, "positions": "all", "read_point": point}
    p = engine.prepare(GenerationRequest([TextPrompt("Rivers flow to the")], SamplingParams(temperature=0.0,
                                                                                          max_tokens=4),
                                         readout=check_readout(ask)))
    events = list(engine.run(p))
    found = [e for e in events if isinstance(e, Activations)]
    assert len(found) == 1 and isinstance(events[-1], Usage)
    return found[0].body, by_index(events)[0]


def test_readout_reads_every_fed_position_before_or_after_this_layers_delta(engine, steered):
    post, text = readout(engine, steered, "post_steering")
    pre, same = readout(engine, steered, "pre_steering")
    assert text == same
    prompt = len(engine.tokenize(TextPrompt("Rivers flow to the")))
    assert [p["position"] for p in post["positions"]] == list(range(prompt + 3))  # the last token is never fed
    assert [p["position"] for p in pre["positions"]] == list(range(prompt + 3))

    def values(body: dict) -> list[dict[int, float]]:
        return [{f["index"]: f["value"] for f in p["features"]} for p in body["positions"]]

    assert values(pre) != values(post)  # this layer's own delta is what separates them
    engine.steering.set_values(steered, {}, merge=False)
    unsteered_post, _ = readout(engine, steered, "post_steering")
    unsteered_pre, _ = readout(engine, steered, "pre_steering")
    assert values(unsteered_post) == values(unsteered_pre)  # without a delta the two read points agree


def test_a_tiny_temperature_generates_as_greedy(engine):
    greedy = alone(engine, plan(engine, "The capital of France is", max_tokens=8))
    assert alone(engine, plan(engine, "The capital of France is", max_tokens=8, temperature=1e-40)) == greedy


def test_sliding_window_layers_attend_only_to_their_window(engine):
    window = {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}
    tiny = tiny_engine(engine, **window)
    assert tiny.model.config.layer_types == ["full_attention", "sliding_attention"]
    p = plan(tiny, "Once upon a time, in a village by the sea", max_tokens=16)
    events = list(tiny.run(p))
    text, used = by_index(events)[0], events[-1].completion_tokens
    expected = reference_greedy(tiny, p.prompt_ids[0], 16)
    assert used >= 8 and text == engine.tokenizer.decode(expected[:used])
    unwindowed = tiny_engine(engine)
    unwindowed.model.load_state_dict(tiny.model.state_dict())
    assert reference_greedy(unwindowed, p.prompt_ids[0], 16) != expected  # the window is what the loop honoured


def test_a_model_with_other_than_attention_layers_is_refused_by_name():
    from types import SimpleNamespace

    from millm.engine.decode.kv import KVShape
    from millm.errors import UnsupportedArchitecture

    config = SimpleNamespace(num_attention_heads=4, hidden_size=64, num_hidden_layers=2, num_key_value_heads=2,
                             layer_types=["conv", "full_attention"])
    with pytest.raises(UnsupportedArchitecture, match="conv"):
        KVShape.of(config)
