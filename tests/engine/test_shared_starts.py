"""Rows of one request whose prompts start alike, steered alike, feed the shared start once: the donor
prefills it, the others copy its keys and values and feed only the rest. The choice of donors is checked on
hand-built prompts; the decode on the real model, each row against the same request run alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.saes import attached_random
from tests.support.scheduler import alone, plan

SAE_ID = "sae_shared_starts_test"
HEAD = list(range(100, 112))  # twelve tokens every prompt starts with


def test_a_row_copies_the_start_it_shares_with_the_first_row_steered_alike():
    from millm.engine.shared_prefix import donors

    prompts = [HEAD + [1, 2], HEAD + [3], HEAD + [1, 2, 4], HEAD + [5]]
    assert donors(prompts, ["a", "a", "a", "b"], least=8) == [None, (0, 12), (0, 14), None]


def test_no_row_shares_its_last_token_a_start_too_short_or_another_steering():
    from millm.engine.shared_prefix import donors

    assert donors([HEAD, HEAD, HEAD + [7]], ["a"] * 3, least=8) == [None, (0, 11), (0, 12)]  # the last token is fed
    assert donors([[1, 2, 3, 9], [1, 2, 3, 8]], ["a", "a"], least=8) == [None, None]  # 3 shared tokens: too few
    assert donors([HEAD + [1], HEAD + [2]], [None, None], least=8) == [None, None]  # live values share with none
    assert donors([HEAD + [1], HEAD + [2]], ["a", "b"], least=8) == [None, None]
    assert donors([HEAD[:8], HEAD + [2]], ["a", "a"], least=8) == [None, (0, 8)]  # a short donor's whole prompt


def test_a_donor_never_waits_on_another_row():
    from millm.engine.shared_prefix import donors

    other = list(range(200, 212))
    found = donors([HEAD + [1], other + [1], HEAD + [2], other + [2], HEAD + [3]], ["a"] * 5, least=8)
    assert found == [None, None, (0, 12), (1, 12), (0, 12)]
    assert all(found[d] is None for d, _ in filter(None, found))


def test_the_prompt_steering_key_is_equal_where_the_prompts_kv_is():
    from millm.engine.params import SamplingParams
    from millm.engine.plan import Plan
    from millm.engine.shared_prefix import prompt_steering
    from millm.steering.target import RequestSteering

    def key(steering: RequestSteering | None, scope: str = "all") -> object:
        return prompt_steering(Plan([[1]], SamplingParams(), 4, steering, scope=scope))  # type: ignore[arg-type]

    rain, rain_too = RequestSteering("a", {"sae": {3: 40.0, 1: 2.0}}), RequestSteering("b", {"sae": {1: 2.0, 3: 40.0}})
    assert key(rain) == key(rain_too) == key(rain, "prompt")  # values decide, not the name or the order
    assert key(rain) != key(RequestSteering("c", {"sae": {3: 60.0}}))
    assert key(rain, "generated") == key(RequestSteering("off", {})) == key(None, "generated")  # an unsteered prompt
    assert key(None) is None  # the live values may move between two rows' prefills


@pytest.fixture
def sae(engine) -> Iterator[str]:
    with attached_random(engine, SAE_ID, seed=5) as sae_id:
        yield sae_id


def prompt_tokens_fed(engine, monkeypatch) -> list[int]:
    """Record the prompt tokens (padding included) each prefill forward of the engine's scheduler feeds."""
    from millm.steering.target import PROMPT_PHASE

    scheduler = engine.scheduler()
    fed: list[int] = []
    forward = scheduler._forward

    def counted(lane, ids, first, positions, rows, mask_positions, phase):
        if phase == PROMPT_PHASE:
            fed.append(ids.numel())
        return forward(lane, ids, first, positions, rows, mask_positions, phase)

    monkeypatch.setattr(scheduler, "_forward", counted)
    return fed


@pytest.mark.model
def test_rows_sharing_a_chat_start_feed_it_once_and_answer_as_alone(engine, sae, monkeypatch):
    from millm.engine.events import Delta
    from millm.engine.shared_prefix import common_prefix
    from millm.steering.target import RequestSteering

    steer = RequestSteering("steer", {sae: {3: 40.0}})
    prompts = ["Tell me about your day.", "Name a colour.", "What is a river?"]
    plans = [plan(engine, p, steering=o, chat=True, temperature=0.8, seed=7 + i, max_tokens=6, scope=scope)
             for o, scope in ((RequestSteering("off", {}), "all"), (steer, "all"), (steer, "generated"))
             for i, p in enumerate(prompts)]
    expected = [alone(engine, p)[0] for p in plans]
    fed = prompt_tokens_fed(engine, monkeypatch)
    texts = [""] * len(plans)
    for event in engine.run_all(plans):
        if isinstance(event, Delta):
            texts[event.index] += event.text
    assert texts == expected
    # two prompt steerings (the "off" and the "generated" rows' prompts are unsteered alike), so two donors: the
    # first prompt's rows of each feed it whole in one forward, every other row only what follows its start
    ids = [p.prompt_ids[0] for p in plans]
    donor = ids[0]
    rest = max(len(r) - min(common_prefix([donor, r]), len(r) - 1) for k, r in enumerate(ids) if k not in (0, 3))
    assert fed == [2 * len(donor), 7 * rest]
    assert rest < len(donor) // 2


@pytest.mark.model
def test_monitored_rows_share_no_start(engine, sae, monkeypatch):
    from millm.steering.monitor import MonitorConfig
    from millm.steering.target import RequestSteering

    plans = [plan(engine, p, chat=True, max_tokens=2, steering=RequestSteering("off", {}))
             for p in ("Name a colour.", "Name a fruit.")]
    engine.monitor.configure(MonitorConfig(True, sae, [0, 1]))
    try:
        fed = prompt_tokens_fed(engine, monkeypatch)
        list(engine.run_all(plans))
    finally:
        engine.monitor.configure(MonitorConfig())
    assert fed == [2 * max(len(p.prompt_ids[0]) for p in plans)]  # every row feeds its whole prompt in one forward
