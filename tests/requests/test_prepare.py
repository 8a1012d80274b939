"""``millm.requests.generation.prepare``, the one request path every front end takes (the server, ``millm chat``,
the TUI, ``millm batch``), on the scripted engine: what it hands the engine, what it refuses, how a request's
steering is resolved, and what its X-miLLM-Steering label and between-steps check are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from millm.errors import ContextLengthExceeded, FieldNotHonoured, InvalidFeatureIndex, InvalidParameter, ProfileNotFound
from millm.render.headers import prepared_headers
from millm.requests.builder import build_chat, build_completion
from millm.requests.limits import Limits
from tests.support.fakes import FakeEngine
from tests.support.saes import random_sae

LIMITS = Limits(max_rows=16, max_prompts=8, max_embedding_inputs=8, max_prompt_tokens=10_000)
TRANSFORMERS = lambda _: "transformers"  # noqa: E731  (the builder's engine_of)
SAE_ID, LAYER = "sae_prepare", 10


def chat(**fields: Any):
    return build_chat({"model": "fake", "messages": [{"role": "user", "content": "hi"}], **fields}, TRANSFORMERS)


@pytest.fixture
def steerable() -> FakeEngine:
    """A steerable scripted engine with a random SAE attached at layer 10 and no live values."""
    engine = FakeEngine(steerable=True)
    engine.steering.attach(SAE_ID, random_sae(576, 32, seed=5), LAYER)
    return engine


@pytest.fixture
def service(tmp_path: Path, steerable: FakeEngine):
    """A steering service over a store of this test's own, holding the profile ``loud`` (feature 3 at 20 on the
    attached SAE) and ``scoped`` (the same, steering the generated tokens only)."""
    from millm.steering.service import SteeringService
    from millm.store import Store

    svc = SteeringService(Store(tmp_path / "prepare.db"))
    entries = [{"sae": SAE_ID, "feature": 3, "strength": 20.0}]
    svc.save_profile({"name": "loud", "model": steerable.model_id, "entries": entries}, overwrite=False)
    svc.save_profile({"name": "scoped", "model": steerable.model_id, "entries": entries,
                      "steering_scope": "generated"}, overwrite=False)
    return svc


# what the engine is handed
def test_each_generation_becomes_one_plan_with_the_fields_the_request_set():
    from millm.requests.generation import prepare

    engine = FakeEngine()
    built = chat(max_tokens=7, temperature=0.5, top_p=0.9, stop=["x"], n=2, seed=3)
    prepared = prepare(engine, built, LIMITS)
    [plan] = prepared.plans
    assert plan.max_tokens == 7 and plan.prompt_ids == [engine.tokenize(built.generations[0].prompts[0])]
    params = plan.params
    assert (params.temperature, params.top_p, params.stop, params.n, params.seed) == (0.5, 0.9, ("x",), 2, 3)
    assert engine.requests == built.generations  # prepared by the engine, one request per generation


def test_completions_prompts_are_one_plan_each_in_order():
    from millm.requests.generation import prepare

    engine = FakeEngine()
    built = build_completion({"model": "fake", "prompt": ["one", "two", "three"], "max_tokens": 2}, TRANSFORMERS)
    plans = prepare(engine, built, LIMITS).plans
    assert [[len(ids) for ids in plan.prompt_ids] for plan in plans] == [[3], [3], [5]]
    assert all(plan.max_tokens == 2 for plan in plans)


def test_an_unsteerable_engine_runs_unsteered_and_says_none():
    from millm.requests.generation import prepare

    prepared = prepare(FakeEngine(), chat(), LIMITS)
    assert prepared.label == "none" and prepared.check is None and prepared.scope == "all"
    assert prepared.steering.values is None and prepared.plans[0].steering is None
    assert prepared_headers(prepared, chat())["X-miLLM-Steering"] == "none"


# what it refuses
@pytest.mark.parametrize(("field", "value"), [("profile", "loud"), ("steering_intensity", 0.5),
                                              ("steering_scope", "generated")])
def test_steering_fields_on_an_engine_that_cannot_steer_are_refused_naming_the_field(field, value):
    from millm.requests.generation import prepare

    engine = FakeEngine()
    with pytest.raises(FieldNotHonoured) as refused:
        prepare(engine, chat(**{field: value}), LIMITS)
    assert refused.value.param == field and "transformers engine" in refused.value.message
    assert not engine.requests  # refused before anything was tokenised


def test_prompt_tokens_over_the_limit_are_refused_naming_what_carries_them():
    from millm.requests.generation import prepare

    tight = Limits(max_rows=16, max_prompts=8, max_embedding_inputs=8, max_prompt_tokens=5)
    assert prepare(FakeEngine(), chat(), tight).plans  # "hi": 2 tokens
    with pytest.raises(InvalidParameter) as chat_refused:
        prepare(FakeEngine(), chat(n=3), tight)  # each choice counts its prompt: 6 tokens
    assert chat_refused.value.param == "messages" and "MILLM_MAX_PROMPT_TOKENS" in chat_refused.value.message
    long = build_completion({"model": "fake", "prompt": "a longer prompt", "max_tokens": 1}, TRANSFORMERS)
    with pytest.raises(InvalidParameter) as completion_refused:
        prepare(FakeEngine(), long, tight)
    assert completion_refused.value.param == "prompt"


def test_a_request_the_engine_refuses_is_refused_before_it_runs():
    from millm.requests.generation import prepare

    engine = FakeEngine(context_window=8)
    with pytest.raises(ContextLengthExceeded):
        prepare(engine, chat(max_tokens=100), LIMITS)


# steering
def test_without_a_profile_or_dial_the_live_values_run_and_the_label_follows_them(steerable, service):
    from millm.requests.generation import prepare

    prepared = prepare(steerable, chat(), LIMITS, service)
    assert prepared.steering.values is None and prepared.label == "none" and prepared.check is None
    steerable.steering.set_values(SAE_ID, {3: 10.0}, merge=False)
    live = prepare(steerable, chat(), LIMITS, service)
    assert live.label == "live" and live.plans[0].steering is None


def test_a_profile_resolves_to_steering_on_every_plan_pinned_to_its_sae(steerable, service):
    from millm.requests.generation import prepare

    prepared = prepare(steerable, chat(profile="loud"), LIMITS, service)
    decided = prepared.steering
    assert decided.name == "loud" and decided.values == {SAE_ID: {3: 20.0}}
    assert all(plan.steering is decided for plan in prepared.plans)
    assert prepared.label == "loud" and prepared_headers(prepared, chat(profile="loud"))["X-miLLM-Steering"] == '"loud"'
    assert prepared.check is not None
    prepared.check()  # the SAE it steers through is still attached
    steerable.steering.detach(SAE_ID)
    with pytest.raises(InvalidFeatureIndex):
        prepared.check()  # detached under it: the request stops between steps


def test_a_dial_scales_the_profile(steerable, service):
    from millm.requests.generation import prepare

    prepared = prepare(steerable, chat(profile="loud", steering_intensity=0.5), LIMITS, service)
    assert prepared.steering.values == {SAE_ID: {3: 10.0}}
    assert prepared.steering.echo == "0.5"
    off = prepare(steerable, chat(profile="loud", steering_intensity="off"), LIMITS, service)
    assert off.label == "none" and off.steering.values == {}  # pinned unsteered


def test_the_request_scope_wins_over_the_profiles_and_every_plan_carries_it(steerable, service):
    from millm.requests.generation import prepare

    assert prepare(steerable, chat(profile="scoped"), LIMITS, service).scope == "generated"
    assert prepare(steerable, chat(profile="loud"), LIMITS, service).scope == "all"
    prepared = prepare(steerable, chat(profile="scoped", steering_scope="prompt"), LIMITS, service)
    assert prepared.scope == "prompt" and all(plan.scope == "prompt" for plan in prepared.plans)


def test_an_unknown_profile_is_refused(steerable, service):
    from millm.requests.generation import prepare

    with pytest.raises(ProfileNotFound):
        prepare(steerable, chat(profile="nope"), LIMITS, service)
    assert not steerable.requests


def test_steering_decided_by_the_front_end_is_used_as_it_is(steerable):
    """``millm chat`` decides its steering itself (``steering``): no service is asked, and it reaches the plans as
    given."""
    from millm.requests.generation import prepare
    from millm.steering.core import RequestSteering

    own = RequestSteering("live", {SAE_ID: {5: 8.0}}, scope="prompt")
    prepared = prepare(steerable, chat(), LIMITS, steering=own)
    assert prepared.steering is own and prepared.plans[0].steering is own
    assert prepared.label == "live" and prepared.scope == "prompt" and prepared.check is None  # nothing pinned


def test_the_steered_answer_is_what_the_plan_carries(steerable, service):
    """What prepare decides is what runs: the scripted engine answers steered exactly when the plan's row is."""
    from millm.requests.generation import prepare

    def answer(built: Any) -> str:
        from millm.engine.events import Delta

        return "".join(e.text for e in steerable.run_all(prepare(steerable, built, LIMITS, service).plans)
                       if isinstance(e, Delta))

    assert not answer(chat(max_tokens=8)).startswith("Steered")
    assert answer(chat(profile="loud", max_tokens=8)).startswith("Steered")
    assert not answer(chat(profile="loud", steering_intensity="off", max_tokens=8)).startswith("Steered")
